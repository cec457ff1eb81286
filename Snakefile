# audioparity: does a ggml port compute what the PyTorch/NeMo reference computes?
# Wiring only; the logic lives in the audioparity package (src/audioparity/workflow/), which
# rules/common.smk ties to the rules.
from snakemake.utils import min_version

min_version("9.0")


# The default sweep, found beside this file also when running with --directory elsewhere.
configfile: f"{workflow.basedir}/config/config.yaml"


report: "docs/report/workflow.rst"


include: "rules/common.smk"
include: "rules/fixtures.smk"
include: "rules/precision.smk"
include: "rules/reference.smk"
include: "rules/ggml.smk"
include: "rules/compare.smk"
include: "rules/report.smk"


# Seconds of work over many small files: on a cluster they run where Snakemake runs.
localrules:
    all,
    report_cells,
    report_summary,
    report_html,


rule all:
    default_target: True
    input:
        paths.SUMMARY,
        paths.HTML,
        # named too, since the summary's cells are known only once these have run: a summary
        # left by another config would otherwise pass for up to date
        reference_dirs,
        # started at once, beside the reference jobs
        weights_files,
