"""benchmarks/planning.py on a tiny shape, so that the benchmark cannot fall behind the
workflow: it plans every cell with the reference done, and counts and times the jobs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests import REPO

pytestmark = pytest.mark.slow


def test_the_planning_benchmark_plans_every_cell_with_the_reference_present(
        parakeet_model, tmp_path):
    out = tmp_path / "out"
    result = subprocess.run([sys.executable, str(REPO / "benchmarks/planning.py"), "--jobs", "40",
                             "--fixture", str(parakeet_model), "--out", str(out), "--profile"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    (size,) = json.loads((out / "planning.json").read_text())["sizes"]
    assert size["cases"] == 4
    # compare_fresh: one per weight type (the default config runs the fresh-against-reused
    # check), over the four cases
    assert size["rules"] == {"ggml_dump": 20, "compare_cell": 20, "ggml_weights": 5,
                             "compare_fresh": 5, "report_cells": 1, "report_summary": 1,
                             "report_html": 1, "all": 1, "total": 54}
    assert 0 < size["cpu_s"] and size["ms_per_job"] == pytest.approx(
        1000 * size["cpu_s"] / 54, rel=0.01)
    table = (out / "planning.md").read_text()
    assert "| 4 | 54 |" in table and "Profile, 4 cases, by cumulative" in table
    assert not (out / "planning-work" / "cases-4").exists()  # scratch copies go
