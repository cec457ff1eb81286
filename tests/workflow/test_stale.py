"""A summary that does not describe the workflow's last run is refused (audioparity.workflow.
outcome.stale, `audioparity report check`, exit 2), whatever folder the check runs from."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from audioparity.compare.cell import COLUMNS
from audioparity.workflow.outcome import record_run, stale


def layout(root: Path) -> tuple[Path, Path]:
    """A finished run's summary, its list of cells and one cell, as the workflow lays them."""
    cell = root / "results/compare/f/m/a/cpu/f32/c.json"
    cell.parent.mkdir(parents=True)
    cell.write_text("[]\n")
    summary = root / "results/report/summary.csv"
    summary.parent.mkdir(parents=True)
    (summary.parent / "cells.txt").write_text("results/compare/f/m/a/cpu/f32/c.json\n")
    summary.write_text("family\n")
    record_run(summary, "running")
    record_run(summary, "finished", "log.txt")
    os.utime(cell, (1_000_000, 1_000_000))
    return summary, cell


def test_a_finished_runs_summary_is_current_and_a_newer_or_lost_cell_makes_it_stale(tmp_path):
    summary, cell = layout(tmp_path)
    assert stale(summary) is None
    os.utime(cell)  # rewritten after the summary: a run that did not finish merging
    os.utime(summary, (2_000_000, 2_000_000))
    listed = cell.relative_to(tmp_path)  # as the list names it, from the run's folder
    assert stale(summary) == (f"{summary} is older than its cell {listed}: run the workflow "
                              "again")
    cell.unlink()
    assert stale(summary) == f"{summary}'s cell {listed} is gone: run the workflow again"


def test_a_run_that_did_not_finish_leaves_a_stale_summary_refused_in_one_line(tmp_path):
    summary, _ = layout(tmp_path)
    record_run(summary, "running")
    assert stale(summary).startswith("the last run did not finish: started ")
    record_run(summary, "failed", "snakemake.log")
    assert not summary.exists() and (summary.parent / "stale-summary.csv").exists()
    why = stale(summary)
    assert why.startswith("the last run did not finish: it stopped on an error at ")
    assert why.endswith("; its log: snakemake.log; "
                        f"{summary} is set aside as stale-summary.csv")
    done = subprocess.run([sys.executable, "-m", "audioparity.cli", "report", "check",
                           str(summary)], capture_output=True, text=True, cwd="/")
    assert done.returncode == 2
    assert done.stdout == "" and done.stderr.splitlines() == [f"audioparity: error: {why}"]


def test_an_unreadable_run_state_or_an_empty_summary_is_refused_never_read_as_current(tmp_path):
    summary, _ = layout(tmp_path)
    run = summary.parent / "run.json"
    for text, why in (("{", "Expecting property name"), ("{}", "'state'"),
                      ('{"state": "bogus"}', "state 'bogus'")):
        run.write_text(text)
        line = stale(summary)
        assert line.startswith(f"{run}: unreadable run state (") and why in line, line
    record_run(summary, "failed")  # an unreadable state is replaced, the hook does not crash
    assert stale(summary).startswith("the last run did not finish: it stopped on an error")
    record_run(summary, "running")
    record_run(summary, "finished")
    for text, why in (("family\n", "columns"), (",".join(COLUMNS) + "\n", "has no cells")):
        (summary.parent / "stale-summary.csv").unlink(missing_ok=True)
        summary.write_text(text)
        done = subprocess.run([sys.executable, "-m", "audioparity.cli", "report", "check",
                               str(summary)], capture_output=True, text=True)
        assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
        assert done.stderr.startswith("audioparity: error: ") and why in done.stderr
