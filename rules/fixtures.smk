# Tiny seeded models, built locally, so the default sweep needs no download: one directory per
# config `fixtures` entry, the model inside where the family's spec says (e.g. model.nemo).


rule fixture_build:
    input:
        code=side_code("fixture"),
    output:
        directory(paths.FIXTURE),
    params:
        family=COMMANDS.family_command,
        options=COMMANDS.fixture_options,
    conda:
        "../envs/audioparity.yaml"
    log:
        paths.log("fixture_build", "{family}/{name}"),
    benchmark:
        paths.benchmark("fixture_build", "{family}/{name}")
    shell:
        "audioparity fixture {params.family} --output {output:q} {params.options} 2> {log}"
