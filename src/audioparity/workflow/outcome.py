"""What a run leaves beside its report: its state (:func:`record_run`: running, finished,
failed), so a summary no run finished is never read as current (:func:`stale`); and what a
finished run prints: the stages per status, where the report is, and every cause that needs
attention, with how many cells it covers, across every comparison (with the reference,
another backend, a fresh run, another reference)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import write_text_atomic

#: The last run's state, beside the summary: ``{"state", "started", "ended", "log"}``.
RUN_FILE = "run.json"
#: What a run that stopped on an error renames the report it did not rewrite to.
STALE_PREFIX = "stale-"


def _now() -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S %Z")


#: The states a run records (:func:`record_run`).
RUN_STATES = ("running", "finished", "failed")


def _read_run(path: Path) -> dict:
    """The run state in ``path`` (:data:`RUN_FILE`), ``{}`` where there is none.

    Raises:
        AudioparityError: it is unreadable, or names no state of :data:`RUN_STATES`.
    """
    if not path.exists():
        return {}
    try:
        state = json.loads(path.read_text())
        if state["state"] not in RUN_STATES:
            raise ValueError(f"state {state['state']!r}")
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AudioparityError(f"{path}: unreadable run state ({err}); expected "
                               f"{{\"state\": {' | '.join(RUN_STATES)}, ...}}") from None
    return state


def record_run(summary: str | Path, state: str, log: str | None = None) -> None:
    """Record the state of the run that writes ``summary``: ``running`` when it starts (its
    start time), then ``finished`` or ``failed`` (its end time, Snakemake's log), in
    :data:`RUN_FILE` beside it (an unreadable one is replaced); a ``failed`` run also renames
    the summary and the report beside it (``index.html``) to ``stale-<name>``: they describe
    an earlier run. A run whose scheduler itself raised calls no hook: it stays ``running``,
    which :func:`stale` reads as a run that did not finish."""
    folder = Path(summary).parent
    path = folder / RUN_FILE
    started = _now()
    if state != "running":
        try:
            started = _read_run(path).get("started", started)
        except AudioparityError:
            pass  # the start is unknown; the state written now is what counts
    document = {"state": state, "started": started,
                "ended": None if state == "running" else _now(), "log": log}
    write_text_atomic(path, json.dumps(document, indent=1) + "\n")
    if state == "failed":
        for name in (Path(summary).name, "index.html"):
            if (folder / name).exists():
                os.replace(folder / name, folder / f"{STALE_PREFIX}{name}")


def stale(summary: str | Path) -> str | None:
    """Why ``summary`` does not describe the workflow's last run, in one line, or None: that
    run did not finish (still running, killed, or stopped on an error: :data:`RUN_FILE`
    beside it; unreadable), or a cell file it is merged from is missing or newer than it (the
    list beside it that rule report_cells writes, its paths relative to the run's folder, the
    one holding ``results/``). A summary with neither beside it (written by hand) is
    current."""
    from audioparity.report.summary import read_cell_list
    from audioparity.workflow.paths import REPORT_CELLS

    summary, path = Path(summary), Path(summary).absolute()  # shown as given; resolved here
    try:
        state = _read_run(summary.parent / RUN_FILE)
    except AudioparityError as err:
        return str(err)
    log = f"; its log: {state['log']}" if state.get("log") else ""
    if state.get("state") == "running":
        return (f"the last run did not finish: started {state.get('started')}, it is still "
                f"running or was killed{log}")
    if state.get("state") == "failed":
        return (f"the last run did not finish: it stopped on an error at {state.get('ended')}"
                f"{log}; {summary} is set aside as {STALE_PREFIX}{summary.name}")
    if not summary.exists():
        return f"no summary at {summary}: run the workflow (make run)"
    listed = summary.parent / Path(REPORT_CELLS).name
    if not listed.exists():
        return None
    depth = len(Path(REPORT_CELLS).parts) - 1  # results/report/ under the run's folder
    if len(path.parents) <= depth:
        return f"{listed}: not in a run's results/report/ folder, so its cells cannot be found"
    root = path.parents[depth]
    written = summary.stat().st_mtime
    for cell in read_cell_list(listed):
        if not (root / cell).exists():
            return f"{summary}'s cell {cell} is gone: run the workflow again"
        if (root / cell).stat().st_mtime > written:
            return f"{summary} is older than its cell {cell}: run the workflow again"
    return None


def outcome(summary: str | Path, report: str | Path) -> list[str]:
    """The lines a successful run ends with: the stages per status (against the reference,
    then per other ``against``), the report's path, and each cause of the rows that need
    attention (:func:`audioparity.report.attention.causes`: each cell's culprits one by one,
    their measured values left out) with the cells it covers, per ``against``, the cause of
    most cells first; none without a summary."""
    if not os.path.exists(summary):
        return []
    import pandas as pd

    from audioparity.report.attention import causes

    rows = pd.read_csv(summary, dtype=str, keep_default_na=False)
    parts = []
    for against, group in rows.groupby("against", sort=False):
        counts = ", ".join(f"{count} {status}"
                           for status, count in group["status"].value_counts().items())
        parts.append(counts if against == "reference" else f"against {against}: {counts}")
    lines = [f"audioparity: {'; '.join(parts)}; report: {os.path.abspath(report)}"]
    for against, group in rows.groupby("against", sort=False):
        found = causes(group.to_dict("records"))
        if not found:
            continue
        cells = {(c.labels.get("family"), c.labels.get("model"), case, c.labels.get("candidate"),
                  c.labels.get("backend"), c.labels.get("weight_type"))
                 for cause in found for c in cause.covered for case in c.cases}
        lines.append(f"audioparity: against {against}: {len(found)} cause(s) in "
                     f"{len(cells)} cell(s)")
        for cause in sorted(found, key=lambda c: -sum(len(line.cases) for line in c.covered)):
            covered = ["/".join(c.labels[key] for key in ("model", "candidate", "backend",
                                                          "weight_type"))
                       + f" ({', '.join(c.cases)})" for c in cause.covered]
            count = sum(len(c.cases) for c in cause.covered)
            lines.append(f"audioparity:   {count} cell(s): {cause.text} [{'; '.join(covered)}]")
    return lines
