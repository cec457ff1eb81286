# Reference activations from the PyTorch/NeMo model: one job per model writes every case's dump
# (results/reference/<family>/<model>/<case>/), and for each quantized weight type of the sweep
# a quantization-aware one (<case>@<weight type>/: torch computing with the weights as ggml
# stores them and each matmul input as its CPU backend rounds it, src/audioparity/dumping/storage.py),
# so the reference stack is imported and the model loaded once, then a content digest of each
# dump (<case>.sha256). Each dump is also kept in results/cache/reference/<family>/<model>/, by
# a key of its code, model, input and settings: a job run again for a new case restores the
# others from there and computes only the new one (docs/design.md, "Reruns"). It is a
# checkpoint: after it runs, Snakemake looks again at what depends on it and reruns only the
# jobs whose case digest changed.


checkpoint reference_dump:
    input:
        model=JOBS.model_input,
        # names each case's file and its content's digest
        plan=JOBS.reference_plan,
        code=side_code("reference"),
        # the precision recipes of the weight types it emulates
        recipes=JOBS.reference_recipes,
    output:
        directory(paths.REFERENCE),
    params:
        family=COMMANDS.family_command,
        model=JOBS.model_path,
        cases=COMMANDS.reference_cases,
        dumps=COMMANDS.reference_dumps,
        options=family_options("reference"),
        cache=COMMANDS.reference_cache,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("reference_dump", "{family}/{model}"),
    benchmark:
        paths.benchmark("reference_dump", "{family}/{model}")
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "audioparity reference {params.family} --model {params.model:q} {params.cases}"
        " --threads {threads} {params.options} {params.cache} 2> {log}"
        " && audioparity digest {params.dumps} 2>> {log}"


# The storage-matched reference of a third-party port's quantized cells: every case computed as
# ggml's CPU backend computes with the weights the port's own model file stores (its conversion's
# storage file: its bytes under the checkpoint's names), so a choice of its quantizer is judged
# apart from its arithmetic (docs/quantization.md). Kept by the file's digest: a candidate that
# stores the same bytes restores them, and a rebuilt port that writes the same file computes
# nothing.
rule reference_storage:
    input:
        unpack(JOBS.storage_reference_inputs),
    output:
        directory(paths.REFERENCE_STORAGE),
    params:
        command=COMMANDS.storage_reference_command,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("reference_storage", "{family}/{model}/{candidate}/{weight_type}"),
    benchmark:
        paths.benchmark("reference_storage", "{family}/{model}/{candidate}/{weight_type}")
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "{params.command} 2> {log}"


# The reference's replay of a candidate that has no teacher-forced stages (a third-party port):
# the reference runs each block on the candidate's own input to it, so a fault in one block
# shows as one spike of `layer_i_replayed` (docs/candidates.md, "Replay").
rule reference_replay:
    input:
        model=JOBS.model_input,
        case=JOBS.case_path,
        candidate=JOBS.candidate_dump,
        code=side_code("replay"),
        recipe=JOBS.recipe_file_or_none,
    output:
        directory(paths.REPLAY),
    params:
        family=COMMANDS.family_command,
        model=JOBS.model_path,
        flag=COMMANDS.input_flag,
        emulate=COMMANDS.emulate_flag,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("reference_replay", paths.CELL),
    benchmark:
        paths.benchmark("reference_replay", paths.CELL)
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "audioparity replay {params.family} --model {params.model:q} {params.flag} {input.case:q}"
        " --candidate-dir {input.candidate:q} --output-dir {output:q} --threads {threads}"
        " {params.emulate} 2> {log}"


# Every other reference of a model (config references, after the primary), on every case, in
# float32: the family's implementation it names, run by its environment's interpreter where it
# names one (make environments; docs/references.md). Each case's dump is compared with the
# primary's, stage by stage (rule compare_reference): the spread between references.
rule reference_other:
    input:
        unpack(JOBS.other_reference_inputs),
    output:
        directory(paths.OTHER_REFERENCE),
    params:
        command=COMMANDS.other_reference_command,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("reference_other", "{family}/{model}/{reference}"),
    benchmark:
        paths.benchmark("reference_other", "{family}/{model}/{reference}")
    threads: 1
    resources:
        mem_mb=memory_mb("reference"),
    shell:
        "{params.command} 2> {log}"
