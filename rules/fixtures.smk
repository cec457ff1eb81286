# Tiny seeded models, built locally, so the default sweep needs no download.


rule parakeet_fixture_build:
    input:
        code=code("parakeet_tdt_fixture"),
    output:
        "results/fixtures/{family}/{name}.nemo",
    wildcard_constraints:
        family="parakeet_tdt",
    params:
        seed=get_fixture_seed,
    log:
        "logs/parakeet_fixture_build/{family}/{name}.log",
    benchmark:
        "results/benchmarks/parakeet_fixture_build/{family}/{name}.tsv"
    shell:
        "audioparity fixture parakeet-tdt --output {output} --seed {params.seed} 2> {log}"
