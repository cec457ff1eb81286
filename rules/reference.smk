# Reference activations from the PyTorch/NeMo model: one job per model writes every case's dump
# (results/reference/<family>/<model>/<case>/), so the reference stack is imported and the model
# loaded once (NeMo takes ~30 s for a 0.6B model), then a content digest of each dump
# (<case>.sha256). It is a checkpoint: after it runs, Snakemake looks again at what depends on
# it and reruns only the jobs whose case digest changed (docs/design.md, "Reruns").


checkpoint reference_dump:
    input:
        model=model_input,
        cases=case_paths,
        code=family_code("reference"),
    output:
        directory("results/reference/{family}/{model}"),
    params:
        family=family_command,
        model=model_path,
        cases=reference_cases,
        dumps=reference_dumps,
        options=family_options("reference"),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/reference_dump/{family}/{model}.log",
    benchmark:
        "results/benchmarks/reference_dump/{family}/{model}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    shell:
        "audioparity reference {params.family} --model {params.model:q} {params.cases}"
        " --threads {threads} {params.options} 2> {log}"
        " && audioparity digest {params.dumps} 2>> {log}"
