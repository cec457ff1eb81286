# Each candidate's activations per backend and weight type (docs/candidates.md). The candidate
# `audioparity` is this project's ggml port; a third-party port runs through its adapter, which
# first converts the model with the port's own converter and quantizer, once per model and
# weight type. `audioparity guard` records a dump process that dies (abort, segfault, out of
# memory) as a `crashed` dump, so one bad cell never takes the sweep down.


rule candidate_model:
    input:
        model=JOBS.model_input,
        port=JOBS.port_files,
        code=JOBS.convert_code,
        # a recipe weight type's: written in the port's quantizer's syntax
        recipe=JOBS.recipe_file_or_none,
    output:
        directory(paths.CANDIDATE_MODEL),
    params:
        adapter=COMMANDS.adapter,
        options=COMMANDS.candidate_options,
        model=JOBS.model_path,
        recipe=COMMANDS.recipe_option,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("candidate_model", "{family}/{model}/{candidate}/{weight_type}"),
    threads: 1
    resources:
        mem_mb=memory_mb("convert"),
    shell:
        "audioparity candidate convert --adapter {params.adapter:q} --options {params.options}"
        " --model {params.model:q} --weight-type {wildcards.weight_type} {params.recipe}"
        " --output-dir {output:q} 2> {log}"


# This project's port converts each model's weights once per weight type into a GGUF file
# (the bytes ggml holds, in their storage types), which every case's dump then memory-maps: a
# dump's load is near free, and the cases' jobs stay one per case, so adding a case runs only
# its own (docs/design.md, "Weights").
rule ggml_weights:
    input:
        model=JOBS.model_input,
        code=side_code("weights"),
        recipe=JOBS.recipe_file_or_none,
    output:
        paths.WEIGHTS,
    params:
        family=COMMANDS.family_command,
        model=JOBS.model_path,
        options=COMMANDS.weights_options,
        recipe=COMMANDS.recipe_option,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("ggml_weights", "{family}/{model}/{candidate}/{weight_type}"),
    benchmark:
        paths.benchmark("ggml_weights", "{family}/{model}/{candidate}/{weight_type}")
    threads: 1
    resources:
        mem_mb=memory_mb("ggml"),
    shell:
        "audioparity weights {params.family} --model {params.model:q}"
        " --weight-type {wildcards.weight_type} {params.recipe} --output {output:q}"
        " {params.options} 2> {log}"


rule ggml_dump:
    input:
        unpack(ggml_inputs),
    output:
        directory(paths.GGML),
    params:
        command=COMMANDS.ggml_command,
        settings=COMMANDS.cell_settings,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("ggml_dump", paths.CELL),
    benchmark:
        paths.benchmark("ggml_dump", paths.CELL)
    threads: 1
    resources:
        mem_mb=memory_mb("ggml"),
        **gpu_resources(),
    shell:
        "audioparity guard --output-dir {output:q} --field backend={wildcards.backend}"
        " --field weight_type={wildcards.weight_type} -- {params.command} 2> {log}"
