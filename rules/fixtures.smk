# Tiny seeded models, built locally, so the default sweep needs no download.


rule parakeet_fixture_build:
    input:
        code=code("parakeet_tdt_fixture"),
    output:
        "results/fixtures/{family}/{name}.nemo",
    wildcard_constraints:
        family="parakeet_tdt",
    params:
        options=get_fixture_options,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/parakeet_fixture_build/{family}/{name}.log",
    benchmark:
        "results/benchmarks/parakeet_fixture_build/{family}/{name}.tsv"
    shell:
        "audioparity fixture parakeet-tdt --output {output:q} {params.options} 2> {log}"


rule moss_fixture_build:
    input:
        code=code("moss_voicegen_fixture"),
    output:
        directory("results/fixtures/{family}/{name}"),
    wildcard_constraints:
        family="moss_voicegen",
    params:
        options=get_fixture_options,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/moss_fixture_build/{family}/{name}.log",
    benchmark:
        "results/benchmarks/moss_fixture_build/{family}/{name}.tsv"
    shell:
        "audioparity fixture moss-voicegen --output {output:q} {params.options} 2> {log}"
