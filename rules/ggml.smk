# Each candidate's activations per backend and weight type. The candidate `audioparity` is this
# project's ggml port; another candidate's `command` (config) runs a dump tool of its own with
# the same command line. `audioparity guard` records a dump process that dies (abort, segfault,
# out of memory) as a `crashed` dump, so one bad cell never takes the sweep down.


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
        mem_mb=4000,
    shell:
        "audioparity guard --output-dir {output:q} --field backend={wildcards.backend}"
        " --field weight_type={wildcards.weight_type} -- {params.command} 2> {log}"
