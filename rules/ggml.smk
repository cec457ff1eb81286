# Each candidate's activations per backend and weight type (docs/candidates.md). The candidate
# `audioparity` is this project's ggml port; a third-party port runs through its adapter
# (src/audioparity/candidates/), which first converts the model with the port's own converter
# and quantizer, once per model and weight type. `audioparity guard` records a dump process that
# dies (abort, segfault, out of memory) as a `crashed` dump, so one bad cell never takes the
# sweep down.


rule candidate_model:
    input:
        model=model_input,
        port=port_files,
        code=candidate_code,
    output:
        directory("results/candidates/{family}/{model}/{candidate}/{weight_type}"),
    params:
        adapter=lambda wildcards: CANDIDATES[wildcards.family][wildcards.candidate]["adapter"],
        options=candidate_options,
        model=model_path,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/candidate_model/{family}/{model}/{candidate}/{weight_type}.log",
    threads: 1
    resources:
        mem_mb=memory_mb("convert"),
    shell:
        "audioparity candidate convert --adapter {params.adapter} --options {params.options}"
        " --model {params.model:q} --weight-type {wildcards.weight_type}"
        " --output-dir {output:q} 2> {log}"


# This project's port converts each model's weights once per weight type into a GGUF file
# (the bytes ggml holds, in their storage types), which every case's dump then memory-maps: a
# dump's load is near free, and the cases' jobs stay one per case, so adding a case runs only
# its own (docs/design.md, "Weights").
rule ggml_weights:
    input:
        model=model_input,
        code=family_code("weights"),
    output:
        "results/weights/{family}/{model}/{candidate}/{weight_type}.gguf",
    params:
        family=family_command,
        model=model_path,
        options=weights_options,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/ggml_weights/{family}/{model}/{candidate}/{weight_type}.log",
    benchmark:
        "results/benchmarks/ggml_weights/{family}/{model}/{candidate}/{weight_type}.tsv"
    threads: 1
    resources:
        mem_mb=memory_mb("ggml"),
    shell:
        "audioparity weights {params.family} --model {params.model:q}"
        " --weight-type {wildcards.weight_type} --output {output:q} {params.options} 2> {log}"


rule ggml_dump:
    input:
        unpack(ggml_inputs),
    output:
        directory("results/ggml/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}"),
    params:
        command=ggml_command,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/ggml_dump/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/ggml_dump/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=memory_mb("ggml"),
    shell:
        "audioparity guard --output-dir {output:q} --field backend={wildcards.backend}"
        " --field weight_type={wildcards.weight_type} -- {params.command} 2> {log}"
