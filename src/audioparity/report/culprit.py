"""The culprit of a cell, and the check a CI runs on a summary.

A cell (family, model, case, candidate, backend, weight type, against) whose stages do not all
pass has a culprit: the first stage, in pipeline order, that breaks while the stages feeding it
pass. Where that stage has a local form (``layer_3_isolated``: the candidate's block on the
reference's input; ``layer_3_replayed``: the reference's block on the candidate's input) and the
local form fails (or crashed) too, the local form is the culprit: the block itself computes
wrongly. Where its local form passes, the stage fails by what accumulated before it, and says
so (a local form that did not run says neither). A stage ``crashed`` or ``missing`` is a
culprit as it is (a dump that died there); in a cell with a crashed stage, the stages
``missing`` are what the crash left uncomputed (the isolated forms a crashed port owed
included), never the culprit themselves.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from audioparity.families import reference_stage, stage_key

#: Statuses that make a cell need attention (a declared ``xfail`` does not).
FAILING = ("fail", "crashed", "missing")
#: The labels that make a cell.
CELL = ("family", "model", "case", "candidate", "backend", "weight_type", "against")


def culprit(rows: Sequence[Mapping[str, Any]]) -> str:
    """One line naming the culprit of one cell's rows (module docstring), or ``""`` when no
    row is :data:`FAILING`: ``layer_1_isolated (fail, its own error): nmse 0.015 > 1e-11``."""
    if not rows:
        return ""
    family = rows[0]["family"]

    def base(row: Mapping[str, Any]) -> str:
        return reference_stage(family, row["stage"])

    ordered = sorted(rows, key=lambda row: (stage_key(family, base(row)),
                                            stage_key(family, row["stage"])))
    died = any(row["status"] == "crashed" for row in rows)
    for stage, group in itertools.groupby(ordered, key=base):
        group = list(group)
        failing = [row for row in group if row["status"] in FAILING
                   and not (died and row["status"] == "missing")]
        if not failing:
            continue
        local_passing = [row for row in group if row["stage"] != stage and row["status"] == "pass"]
        local_failing = [row for row in failing if row["stage"] != stage
                         and row["status"] != "missing"]
        if local_failing:
            pick, why = local_failing[0], "its own error"
        elif local_passing and failing[0]["status"] == "fail":
            pick, why = failing[0], (f"accumulated before it: {local_passing[0]['stage']} is "
                                     "pass")
        else:
            pick, why = failing[0], ""
        detail = f"{pick['status']}, {why}" if why else pick["status"]
        return f"{pick['stage']} ({detail}): {pick['reason']}" if pick["reason"] else (
            f"{pick['stage']} ({detail})")
    return ""


def culprits(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, str]:
    """{cell labels: its culprit} of every cell that has one."""
    by_cell: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(tuple(row[key] for key in CELL), []).append(row)
    found = {cell: culprit(group) for cell, group in by_cell.items()}
    return {cell: text for cell, text in found.items() if text}


def check(rows: Iterable[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """What ``audioparity report check`` says of a summary: ``(exit code, lines)``; 1 and one
    line per cell with a culprit when a comparison with the reference has a stage ``fail``,
    ``crashed`` or ``missing`` (a declared expected failure is ``xfail``, and passes this);
    comparisons between backends are diagnoses and are listed without failing the check."""
    rows = list(rows)
    found = culprits(rows)
    failing = {cell: text for cell, text in found.items() if cell[-1] == "reference"}
    lines = [f"{'/'.join(cell[:-1])}: {text}" for cell, text in failing.items()]
    lines += [f"{'/'.join(cell[:-1])} against {cell[-1]} (not failing the check): {text}"
              for cell, text in found.items() if cell[-1] != "reference"]
    total = len({tuple(row[key] for key in CELL) for row in rows
                 if row["against"] == "reference"})
    verdict = (f"{len(failing)} of {total} cells need attention" if failing else
               f"all {total} cells pass, or fail as declared, or are unavailable")
    return (1 if failing else 0), [*lines, f"audioparity check: {verdict}"]
