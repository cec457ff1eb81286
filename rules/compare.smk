# One comparison per cell (family, model, case, backend, weight type), gated by the config.


rule compare_cell:
    input:
        reference="results/reference/{family}/{model}/{case}",
        candidate="results/ggml/{family}/{model}/{backend}/{weight_type}/{case}",
        code=code("compare"),
    output:
        "results/compare/{family}/{model}/{backend}/{weight_type}/{case}.json",
    params:
        gates=get_gates,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/compare_cell/{family}/{model}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/compare_cell/{family}/{model}/{backend}/{weight_type}/{case}.tsv"
    shell:
        "audioparity compare --reference {input.reference:q} --candidate {input.candidate:q}"
        " --gates {params.gates:q} --label family={wildcards.family} --label model={wildcards.model}"
        " --label case={wildcards.case} --label backend={wildcards.backend}"
        " --label weight_type={wildcards.weight_type} --output {output:q} 2> {log}"
