"""A sweep's report at scale: 20,000 cells of the synthetic sweep grown by its cases
(tests/report/sweep.py, :func:`scaled_cells`), merged from the list of their files as rule
report_cells writes it, then the page. The command lines of a sweep this size once failed
(argument list too long), and parts of the report grew with the square of the cells or drew a
figure per case; BENCHMARKS.md, "Reports at scale", has the figures up to 100,000 cells."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from audioparity.cli import main
from audioparity.report.html import SHOWN_CASES, SHOWN_ROWS, write_html
from audioparity.report.plots import DRAWN_CASES
from audioparity.report.summary import read_summary
from tests.report.sweep import (
    CANDIDATES,
    CELLS_PER_CASE,
    CRASH,
    REFERENCE_STAGES,
    STAGES,
    WEIGHT_TYPES,
    write_cells,
)

CELLS = 20_000
#: What the summary and the page may take together here (about 30 s on 2 busy cores): a part
#: that grew with the square of the cells again would take hours.
BUDGET_S = 240

pytestmark = pytest.mark.slow


def test_the_report_of_a_sweep_of_20000_cells(tmp_path: Path):
    listed = write_cells(tmp_path / "cells", CELLS)
    summary, page = tmp_path / "summary.csv", tmp_path / "index.html"
    start = time.perf_counter()
    assert main(["report", "summary", "--cells-from", str(listed), "--output",
                 str(summary)]) == 0
    merged = time.perf_counter()
    write_html(summary, page)
    done = time.perf_counter()
    print(f"{CELLS} cells: summary {merged - start:.1f} s, page {done - merged:.1f} s, "
          f"{page.stat().st_size / 2**20:.1f} MiB")
    assert done - start < BUDGET_S

    frame = read_summary(summary)
    cells = frame.groupby(["case", "candidate", "backend", "weight_type", "against"])
    assert cells.ngroups == CELLS
    # the last case's cells stop before port_b's and the references'
    full, partial = divmod(CELLS, CELLS_PER_CASE)
    assert 0 < partial <= CANDIDATES.index("port_b") * len(WEIGHT_TYPES)
    cases = full + 1
    assert frame["case"].nunique() == cases
    # every case's crash is its cell's one culprit, on each of its rows
    crashed = frame[(frame["candidate"] == "port_b") & (frame["weight_type"] == "q2_K")]
    assert set(crashed["culprit"]) == {f"layer_0 (crashed): {CRASH}"}
    assert len(crashed) == full * len(STAGES)
    # the transformers reference parts at layer 1 on every third case, declared: what follows
    # (its joint on its own enc_out among them) is no culprit
    reference = frame[frame["candidate"] == "transformers"]
    assert (reference["status"] == "xfail").sum() == len(range(0, full, 3))
    assert (reference["culprit"] == "").all()
    assert len(reference) == full * len(REFERENCE_STAGES)

    text = page.read_text()
    assert page.stat().st_size < 40 * 2**20
    assert f"{cases - SHOWN_CASES} cases not shown: at most {SHOWN_CASES} of each model" in text
    assert f"{cases - DRAWN_CASES} cases not drawn: at most {DRAWN_CASES} of each model" in text
    assert f"the first {SHOWN_ROWS} rows, summary.csv holds every one" in text
    assert len(re.findall(r'<tr class="group">', text)) == 3 * SHOWN_CASES
    assert f"{len(frame[frame['against'] == 'reference'])} stages" in text
