# summary.csv from every cell, then the self-contained HTML report from summary.csv alone.


onsuccess:
    print_outcome("results/report/summary.csv", "results/report/index.html")


# The sweep's cells as the config names them, rewritten when they change: the summary's cells
# are known only after the reference checkpoints, so without this input a summary left by
# another config (the default sweep, then the ports one) would pass for up to date.
rule report_cells:
    output:
        "results/report/cells.json",
    params:
        cells=sweep_cells,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_cells/cells.log",
    shell:
        "printf '%s\\n' {params.cells:q} > {output:q} 2> {log}"


rule report_summary:
    input:
        plan="results/report/cells.json",
        cells=all_cells,
        code=report_code("report.summary"),
    output:
        report(
            "results/report/summary.csv",
            caption="../docs/report/summary.rst",
            category="Summary",
        ),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_summary/summary.log",
    benchmark:
        "results/benchmarks/report_summary/summary.tsv"
    shell:
        "audioparity report summary {input.cells:q} --output {output:q} 2> {log}"


rule report_html:
    input:
        summary=summary_input,
        code=report_code("report.html"),
    output:
        report(
            "results/report/index.html",
            caption="../docs/report/index.rst",
            category="Summary",
        ),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_html/index.log",
    benchmark:
        "results/benchmarks/report_html/index.tsv"
    shell:
        "audioparity report html --summary {input.summary:q} --output {output:q} 2> {log}"
