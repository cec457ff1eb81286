# Tiny seeded models, built locally, so the default sweep needs no download: one directory per
# config `fixtures` entry, the model inside where the family's spec says (e.g. model.nemo).


rule fixture_build:
    input:
        code=family_code("fixture"),
    output:
        directory("results/fixtures/{family}/{name}"),
    params:
        family=family_command,
        options=fixture_options,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/fixture_build/{family}/{name}.log",
    benchmark:
        "results/benchmarks/fixture_build/{family}/{name}.tsv"
    shell:
        "audioparity fixture {params.family} --output {output:q} {params.options} 2> {log}"
