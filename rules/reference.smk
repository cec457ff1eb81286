# Reference activations from the PyTorch/NeMo model: one job per model writes every case's dump
# (results/reference/<family>/<model>/<case>/), and for each quantized weight type of the sweep
# a quantization-aware one (<case>@<weight type>/: torch computing with the weights as ggml
# stores them and each matmul input as its CPU backend rounds it, src/audioparity/storage.py),
# so the reference stack is imported and the model loaded once (NeMo takes ~30 s for a 0.6B
# model), then a content digest of each dump (<case>.sha256). Each dump is also kept in
# results/cache/reference/<family>/<model>/, by a key of its code, model, input and settings: a
# job run again for a new case restores the others from there and computes only the new one
# (docs/design.md, "Reruns"). It is a checkpoint: after it runs, Snakemake looks again at what
# depends on it and reruns only the jobs whose case digest changed.


checkpoint reference_dump:
    input:
        model=model_input,
        cases=case_paths,
        plan=reference_plan,
        code=family_code("reference"),
    output:
        directory("results/reference/{family}/{model}"),
    params:
        family=family_command,
        model=model_path,
        cases=reference_cases,
        dumps=reference_dumps,
        options=family_options("reference"),
        cache=reference_cache,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/reference_dump/{family}/{model}.log",
    benchmark:
        "results/benchmarks/reference_dump/{family}/{model}.tsv"
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "audioparity reference {params.family} --model {params.model:q} {params.cases}"
        " --threads {threads} {params.options} {params.cache} 2> {log}"
        " && audioparity digest {params.dumps} 2>> {log}"


# The reference's replay of a candidate that has no teacher-forced stages (a third-party port):
# NeMo runs each block on the candidate's own input to it, so a fault in one block shows as one
# spike of `layer_i_replayed` (docs/candidates.md, "Replay").
rule reference_replay:
    input:
        model=model_input,
        case=case_path,
        candidate=candidate_dump,
        code=family_code("replay"),
    output:
        directory("results/replay/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}"),
    params:
        family=family_command,
        model=model_path,
        flag=lambda wildcards: SPECS[wildcards.family].input_flag,
        emulate=emulate_flag,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/reference_replay/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/reference_replay/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "audioparity replay {params.family} --model {params.model:q} {params.flag} {input.case:q}"
        " --candidate-dir {input.candidate:q} --output-dir {output:q} --threads {threads}"
        " {params.emulate} 2> {log}"
