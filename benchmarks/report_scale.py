"""The report at scale: ``audioparity report summary`` and ``audioparity report html`` on
synthetic sweeps of 2,000, 20,000 and 100,000 cells, as a cluster's sweep writes them.

The cells are the synthetic sweep of tests/report/sweep.py grown by its cases
(``scaled_cells``: 86 cells a case, every candidate at 16 weight types, our port on Vulkan,
two other references against the primary; 7 to 9 stages a cell; in every case a crash and a
failing decode, and on every third one reference parting from the primary), written as the
compare writes them, one file a cell, and listed one a line as rule report_cells lists them.
Each command runs in a process of its own, as the workflow runs it (the summary from the list,
``--cells-from``; the page from the summary): its wall time, its peak RSS (``ru_maxrss`` from
``os.wait4``) and the size of what it wrote. Written to ``report_scale.json`` and printed as
the table of BENCHMARKS.md, "Reports at scale".

With ``--tiny`` (tests/test_benchmarks.py): 100 cells.

Usage::

    python benchmarks/report_scale.py
    python benchmarks/report_scale.py --cells 2000,20000 --work DIR --out DIR
    python benchmarks/report_scale.py --tiny --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

from tests.report.sweep import CELLS_PER_CASE, write_cells  # noqa: E402

#: The sweeps measured: 2,000 cells (past which the report's command lines overflowed), 20,000
#: and 100,000 (a cluster's sweep).
CELLS = (2000, 20_000, 100_000)
TINY = (100,)


def measured(argv: list[str], log: Path) -> dict:
    """Run ``argv`` (this checkout's code first on its path), stderr to ``log``; its wall time
    and peak RSS. It must exit 0."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH"))
                                        if p)
    start = time.perf_counter()
    with open(log, "w") as handle:
        child = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=env)
        _, status, usage = os.wait4(child.pid, 0)
    seconds = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status):
        raise SystemExit(f"{' '.join(argv[2:5])} exited {os.waitstatus_to_exitcode(status)}: "
                         f"{log.read_text().strip().splitlines()[-1:]}")
    return {"seconds": round(seconds, 2), "peak_rss_mib": round(usage.ru_maxrss / 1024)}


def report(cells: int, work: Path) -> dict:
    """The summary and the page of a sweep of ``cells`` cells, written under ``work``."""
    listed = write_cells(work / "cells", cells)
    summary, page = work / "summary.csv", work / "index.html"
    cli = [sys.executable, "-m", "audioparity.cli", "report"]
    merged = measured([*cli, "summary", "--cells-from", str(listed), "--output", str(summary)],
                      work / "summary.log")
    built = measured([*cli, "html", "--summary", str(summary), "--output", str(page)],
                     work / "html.log")
    with open(summary) as handle:
        rows = sum(1 for _ in handle) - 1
    return {"cells": cells, "cases": -(-cells // CELLS_PER_CASE), "rows": rows,
            "summary": {**merged, "mib": round(summary.stat().st_size / 2**20, 1)},
            "html": {**built, "mib": round(page.stat().st_size / 2**20, 1)}}


def table(results: list[dict]) -> list[str]:
    """The Markdown table of BENCHMARKS.md, "Reports at scale"."""
    lines = ["| cells | cases | rows | summary s | summary peak MiB | summary.csv MiB | page s | "
             "page peak MiB | index.html MiB |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['cells']:,} | {r['cases']:,} | {r['rows']:,} | {r['summary']['seconds']} | "
              f"{r['summary']['peak_rss_mib']:,} | {r['summary']['mib']} | "
              f"{r['html']['seconds']} | {r['html']['peak_rss_mib']:,} | {r['html']['mib']} |"
              for r in results]
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default=",".join(map(str, CELLS)),
                        help="the sweeps' sizes, in cells")
    parser.add_argument("--tiny", action="store_true", help=f"{TINY[0]} cells")
    parser.add_argument("--work", type=Path, help="where the cells and the report go (kept); "
                        "a temporary folder by default")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    sizes = TINY if args.tiny else tuple(int(n) for n in args.cells.split(",") if n)
    args.out.mkdir(parents=True, exist_ok=True)
    results, load = [], round(os.getloadavg()[0], 2)
    with tempfile.TemporaryDirectory(prefix="report_scale.") as scratch:
        for cells in sizes:
            work = (args.work or Path(scratch)) / f"{cells}"
            results.append(report(cells, work))
            if args.work is None:  # 100,000 cells are a GB
                shutil.rmtree(work)
            print(f"{cells} cells: summary {results[-1]['summary']['seconds']} s, page "
                  f"{results[-1]['html']['seconds']} s", file=sys.stderr)
    machine = {"cpus": os.cpu_count(), "load_1min_before": load,
               "load_1min_after": round(os.getloadavg()[0], 2),
               "python": platform.python_version()}
    (args.out / "report_scale.json").write_text(json.dumps(
        {"machine": machine, "sweeps": results}, indent=1) + "\n")
    print("\n".join(table(results)))


if __name__ == "__main__":
    main()
