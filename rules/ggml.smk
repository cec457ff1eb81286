# ggml activations per backend and weight type. The command is a template from the config
# (`ggml_command`), so an external dump tool with the same command line can replace ours.
# `audioparity guard` records a dump process that dies (abort, segfault, OOM) as a `crashed`
# dump, so one bad cell never takes the sweep down.


rule parakeet_ggml_dump:
    input:
        model=get_model,
        audio=get_case,
        reference="results/reference/{family}/{model}/{case}",
        code=code("parakeet_tdt_ggml"),
    output:
        directory("results/ggml/{family}/{model}/{backend}/{weight_type}/{case}"),
    wildcard_constraints:
        family="parakeet_tdt",
    params:
        conv_weight_type=family_setting("conv_weight_type"),
        flash_attention=family_setting("flash_attention"),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/parakeet_ggml_dump/{family}/{model}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/parakeet_ggml_dump/{family}/{model}/{backend}/{weight_type}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    shell:
        "audioparity guard --output-dir {output:q} --field backend={wildcards.backend}"
        " --field weight_type={wildcards.weight_type} -- "
        + config["parakeet_tdt"]["ggml_command"]
        + " 2> {log}"


rule moss_ggml_dump:
    input:
        model=get_model,
        prompt=get_case,
        code=code("moss_voicegen_ggml"),
    output:
        directory("results/ggml/{family}/{model}/{backend}/{weight_type}/{case}"),
    wildcard_constraints:
        family="moss_voicegen",
    params:
        kv_cache_type=family_setting("kv_cache_type"),
        generate_rows=family_setting("generate_rows"),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/moss_ggml_dump/{family}/{model}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/moss_ggml_dump/{family}/{model}/{backend}/{weight_type}/{case}.tsv"
    threads: 1
    resources:
        mem_mb=4000,
    shell:
        "audioparity guard --output-dir {output:q} --field backend={wildcards.backend}"
        " --field weight_type={wildcards.weight_type} -- "
        + config["moss_voicegen"]["ggml_command"]
        + " 2> {log}"
