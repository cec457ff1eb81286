# summary.csv from every cell, then the self-contained HTML report from summary.csv alone.


# The run's state beside the summary (results/report/run.json): `audioparity report check`
# refuses a summary that no run finished. A run that stops on an error sets the report it did
# not rewrite aside (stale-summary.csv, stale-index.html).
onstart:
    record_run(paths.SUMMARY, "running", log)


onsuccess:
    record_run(paths.SUMMARY, "finished", log)
    print_outcome(paths.SUMMARY, paths.HTML)


onerror:
    record_run(paths.SUMMARY, "failed", log)


# The sweep's cells as the config names them, rewritten when they change: the summary's cells
# are known only after the reference checkpoints, so without this input a summary left by
# another config (the default sweep, then the ports one) would pass for up to date.
rule report_cells:
    output:
        paths.REPORT_CELLS,
    params:
        cells=COMMANDS.sweep_cells,
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_cells/cells.log",
    shell:
        "printf '%s\\n' {params.cells:q} > {output:q} 2> {log}"


rule report_summary:
    input:
        plan=paths.REPORT_CELLS,
        cells=all_cells,
        code=report_code("audioparity.report.summary"),
    output:
        report(
            paths.SUMMARY,
            caption="../docs/report/summary.rst",
            category="Summary",
        ),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_summary/summary.log",
    benchmark:
        paths.benchmark("report_summary", "summary")
    shell:
        "audioparity report summary {input.cells:q} --output {output:q} 2> {log}"


rule report_html:
    input:
        summary=summary_input,
        code=report_code("audioparity.report.html"),
    output:
        report(
            paths.HTML,
            caption="../docs/report/index.rst",
            category="Summary",
        ),
    conda:
        "../envs/audioparity.yaml"
    log:
        "logs/report_html/index.log",
    benchmark:
        paths.benchmark("report_html", "index")
    shell:
        "audioparity report html --summary {input.summary:q} --output {output:q} 2> {log}"
