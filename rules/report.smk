# summary.csv from every cell, then the self-contained HTML report from summary.csv alone.


onsuccess:
    print_outcome("results/report/summary.csv", "results/report/index.html")


rule report_summary:
    input:
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
