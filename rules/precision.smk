# Precision recipes (docs/quantization.md). A weight type <type>+<name> whose recipe the family's
# `recipes:` entry searches for (wide, targets, calibration) gets one per model: which matmul
# weights must stay wider than <type> for the targets to hold against the float32 reference on
# the recipe's calibration cases (`audioparity precision --no-verify`: each weight's
# sensitivity on its own matmul, then bisection, on the quantization-aware reference). It runs
# no port's code, so a port edit never reruns it nor the reference dumps that read the recipe.
# Targets no recipe meets are a result: the file says so, and so does every cell of the weight
# type, whose row `recipe` also verifies the recipe on its own dump (every case, candidate and
# backend). A recipe given as a file skips this rule.


rule precision:
    input:
        unpack(JOBS.precision_inputs),
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
        "{params.command} > {log} 2>&1"
