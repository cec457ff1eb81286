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


# The list of the sweep's cell files as the config names them, one a line, rewritten when
# the cells change (params: their digest): the summary's cells are known only after the
# reference checkpoints, so without this input a summary left by another config (the default
# sweep, then the ports one) would pass for up to date. Written from Python, in Snakemake's
# process (a localrule): a sweep's cells are too many for a command line.
rule report_cells:
    output:
        cells=paths.REPORT_CELLS,
    params:
        digest=COMMANDS.sweep_cells,
    log:
        "logs/report_cells/cells.log",
    run:
        write_cell_files(output.cells, log[0])


# The cells are read from the list (--cells-from), each still an input of the job.
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
        "audioparity report summary --cells-from {input.plan:q} --output {output:q} 2> {log}"


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
