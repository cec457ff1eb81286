# One comparison per cell (family, model, candidate, backend, weight type, case), gated by the
# config; with the reference's replay of the candidate where it replays, a float32 cell's
# stages also measured against each other reference (closer_to), a quantized cell's cost
# against the float32 reference, and a recipe's targets on the cell (its row `recipe`).


rule compare_cell:
    input:
        unpack(compare_inputs),
    output:
        paths.COMPARE,
    params:
        reference=JOBS.reference_case,
        gates=COMMANDS.gates,
        replay=COMMANDS.replay_flag,
        cost=COMMANDS.cost_flag,
        known_text=COMMANDS.known_text_flag,
        others=COMMANDS.other_reference_flags,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("compare_cell", paths.CELL),
    benchmark:
        paths.benchmark("compare_cell", paths.CELL)
    shell:
        "audioparity compare --reference {params.reference:q} --candidate {input.candidate:q}"
        " --gates {params.gates:q} --label family={wildcards.family} --label model={wildcards.model}"
        " --label case={wildcards.case} --label candidate={wildcards.candidate}"
        " --label backend={wildcards.backend} --label weight_type={wildcards.weight_type}"
        " {params.replay} {params.cost} {params.known_text} {params.others}"
        " --output {output:q} 2> {log}"


# Another reference against the primary on one case, stage by stage, with the family's
# float32 gates and the reference's declared differences as expected failures: where the
# references themselves disagree, and by how much (docs/references.md).
rule compare_reference:
    input:
        unpack(reference_compare_inputs),
    output:
        paths.COMPARE_REFERENCE,
    params:
        reference=JOBS.f32_reference_case,
        gates=COMMANDS.reference_gates,
        primary=JOBS.primary_name,
        known_text=COMMANDS.known_text_flag,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("compare_reference", "{family}/{model}/{reference}/{case}"),
    shell:
        "audioparity compare --reference {params.reference:q}"
        " --candidate {input.other:q}/{wildcards.case} --gates {params.gates:q}"
        " --label family={wildcards.family} --label model={wildcards.model}"
        " --label case={wildcards.case} --label candidate={wildcards.reference}"
        f" --label backend={REFERENCE_BACKEND} --label weight_type={REFERENCE_WEIGHT_TYPE}"
        " --label against={params.primary} {params.known_text} --output {output:q} 2> {log}"


# Each backend other than the baseline (cpu) against the baseline, stage by stage, for the same
# candidate and weight type: "this backend computes it differently" apart from "the port is
# wrong". The gates are the cell's own; declared failures name `against: cpu`.
rule compare_backend:
    input:
        unpack(JOBS.backend_compare_inputs),
    output:
        paths.COMPARE_BACKEND,
    params:
        gates=COMMANDS.backend_gates,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("compare_backend", paths.CELL),
    shell:
        "audioparity compare --reference {input.baseline:q} --candidate {input.candidate:q}"
        " --gates {params.gates:q} --label family={wildcards.family} --label model={wildcards.model}"
        " --label case={wildcards.case} --label candidate={wildcards.candidate}"
        " --label backend={wildcards.backend} --label weight_type={wildcards.weight_type}"
        f" --label against={BASELINE_BACKEND} --output {{output:q}} 2> {{log}}"


# Fresh against reused: a candidate that runs several cases in one process (this project's
# port) runs the model's cases again in one job, reversed and then the first of those again
# (cases [A, B]: B, A, B), and each case's stages are compared with its fresh dump (the cell's
# ggml_dump, its own process): identical, or within the config's reuse_bounds. A KV cache, LSTM
# state or buffer kept from one case to the next fails there (docs/design.md, "Fresh against
# reused"). One job per candidate cell of a model, not per case: its folder holds <case>.json.
rule compare_fresh:
    input:
        unpack(JOBS.fresh_inputs),
    output:
        directory(paths.COMPARE_FRESH),
    params:
        command=COMMANDS.fresh_command,
        settings=COMMANDS.cell_settings,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("compare_fresh", "{family}/{model}/{candidate}/{backend}/{weight_type}"),
    benchmark:
        paths.benchmark("compare_fresh", "{family}/{model}/{candidate}/{backend}/{weight_type}")
    threads: 1
    resources:
        mem_mb=memory_mb("ggml"),
        **gpu_resources(),
    shell:
        "{params.command} 2> {log}"


# The family's own port on a cell that fails against the baseline: both dumps again with every
# ggml graph saved, each graph node by node on both backends, the first op that breaks named
# (drilldown.json, a repro/ folder, and the cell's rows with `first_bad_op`). A cell whose
# stages all agree writes that and nothing else.
rule drilldown:
    input:
        unpack(drilldown_inputs),
    output:
        cell=paths.DRILLDOWN,
        folder=directory(paths.DRILLDOWN_FOLDER),
    params:
        command=COMMANDS.drilldown_command,
        settings=COMMANDS.cell_settings,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("drilldown", paths.CELL),
    benchmark:
        paths.benchmark("drilldown", paths.CELL)
    threads: 1
    resources:
        mem_mb=memory_mb("ggml", copies=2),
        **gpu_resources(),
    shell:
        "{params.command} 2> {log}"
