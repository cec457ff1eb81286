# Reference activations from the PyTorch/NeMo model: one job per model writes every case's dump,
# so the reference stack is imported and the model loaded once (NeMo takes ~30 s for a 0.6B
# model). Adding or editing a case reruns that model's reference job for all of its cases.


if "parakeet_tdt" in FAMILIES:

    rule parakeet_reference_dump:
        input:
            model=family_model("parakeet_tdt"),
            cases=family_cases("parakeet_tdt"),
            code=code("parakeet_tdt_reference"),
        output:
            reference_dirs("parakeet_tdt"),
        params:
            cases=case_options("--audio"),
        conda:
            "../envs/audioparity.yaml"
        log:
            "logs/parakeet_reference_dump/parakeet_tdt/{model}.log",
        benchmark:
            "results/benchmarks/parakeet_reference_dump/parakeet_tdt/{model}.tsv"
        threads: 1
        resources:
            mem_mb=4000,
        shell:
            "audioparity reference parakeet-tdt --model {input.model:q} {params.cases}"
            " --threads {threads} 2> {log}"


if "moss_voicegen" in FAMILIES:

    rule moss_reference_dump:
        input:
            model=family_model("moss_voicegen"),
            cases=family_cases("moss_voicegen"),
            code=code("moss_voicegen_reference"),
        output:
            reference_dirs("moss_voicegen"),
        params:
            cases=case_options("--prompt"),
            generate_rows=FAMILIES["moss_voicegen"]["generate_rows"],
        conda:
            "../envs/audioparity.yaml"
        log:
            "logs/moss_reference_dump/moss_voicegen/{model}.log",
        benchmark:
            "results/benchmarks/moss_reference_dump/moss_voicegen/{model}.tsv"
        threads: 1
        resources:
            mem_mb=4000,
        shell:
            "audioparity reference moss-voicegen --model {input.model:q} {params.cases}"
            " --threads {threads} --generate-rows {params.generate_rows} 2> {log}"
