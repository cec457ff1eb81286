# Tiny seeded models, built locally, so the default sweep needs no download: one directory per
# config `fixtures` entry, the model inside where the family's spec says (e.g. model.nemo). A
# fixture the same code, seed, options and libraries built before, in any checkout of this
# machine, is copied from the shared cache (~/.cache/audioparity/fixtures, AUDIOPARITY_FIXTURES).


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
        "audioparity fixture {params.family} --output {output:q} --code {input.code:q}"
        " {params.options} 2> {log}"
