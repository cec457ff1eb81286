# Precision recipes (docs/quantization.md). A weight type <type>+<name> whose recipe the family's
# `recipes:` entry searches for (wide, targets) gets one per model: which matmul weights must
# stay wider than <type> for the targets to hold on the sweep's cases against the float32
# reference (`audioparity precision`: each weight's sensitivity on its own matmul, then
# bisection, on the quantization-aware reference; verified by our port). The reference job and
# every cell of that weight type read the recipe; a recipe given as a file skips this rule.


rule precision:
    input:
        model=JOBS.model_input,
        # names the sweep's cases, the recipe's measure
        plan=JOBS.reference_plan,
        code=JOBS.precision_code,
    output:
        paths.PRECISION,
    params:
        command=COMMANDS.precision_command,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("precision", "{family}/{model}/{weight_type}"),
    benchmark:
        paths.benchmark("precision", "{family}/{model}/{weight_type}")
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "{params.command} 2> {log}"
