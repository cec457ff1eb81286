# Reference activations from the PyTorch/NeMo model: one job per model and case.


rule parakeet_reference_dump:
    input:
        model=get_model,
        audio=get_case,
        code=code("parakeet_tdt_reference"),
    output:
        directory("results/reference/{family}/{model}/{case}"),
    wildcard_constraints:
        family="parakeet_tdt",
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/parakeet_reference_dump/{family}/{model}/{case}.log",
    benchmark:
        "results/benchmarks/parakeet_reference_dump/{family}/{model}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    shell:
        "audioparity reference parakeet-tdt --model {input.model:q} --audio {input.audio:q}"
        " --output-dir {output:q} --threads {threads} 2> {log}"


rule moss_reference_dump:
    input:
        model=get_model,
        prompt=get_case,
        code=code("moss_voicegen_reference"),
    output:
        directory("results/reference/{family}/{model}/{case}"),
    wildcard_constraints:
        family="moss_voicegen",
    params:
        generate_rows=family_setting("generate_rows"),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/moss_reference_dump/{family}/{model}/{case}.log",
    benchmark:
        "results/benchmarks/moss_reference_dump/{family}/{model}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    shell:
        "audioparity reference moss-voicegen --model {input.model:q} --prompt {input.prompt:q}"
        " --output-dir {output:q} --threads {threads} --generate-rows {params.generate_rows} 2> {log}"
