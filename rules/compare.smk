# One comparison per cell (family, model, candidate, backend, weight type, case), gated by the
# config; with the reference's replay of the candidate where it replays.


rule compare_cell:
    input:
        unpack(compare_inputs),
    output:
        "results/compare/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.json",
    params:
        reference=reference_case,
        gates=get_gates,
        replay=replay_flag,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/compare_cell/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.log",
    benchmark:
        "results/benchmarks/compare_cell/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.tsv"
    shell:
        "audioparity compare --reference {params.reference:q} --candidate {input.candidate:q}"
        " --gates {params.gates:q} --label family={wildcards.family} --label model={wildcards.model}"
        " --label case={wildcards.case} --label candidate={wildcards.candidate}"
        " --label backend={wildcards.backend} --label weight_type={wildcards.weight_type}"
        " {params.replay} --output {output:q} 2> {log}"
