"""The culprits of a cell, and the check a CI runs on a summary.

A cell (family, model, case, candidate, backend, weight type, against) whose stages do not all
pass has culprits, named in data-flow order (each family's stages declare their ``inputs`` and
``parts``: :class:`audioparity.family.Stage`):

- a stage's local form that fails (``layer_3_isolated``: the candidate's block on the
  reference's input; ``layer_3_replayed``: the reference's block on the candidate's input):
  the block computes wrongly on its own, whatever its inputs were;
- a stage that fails while every input it is computed from passes: where its local form
  passes, only the end-to-end path differs (a mask or a table only that path builds); where it
  has none, it says so;
- a stage that crashed (the one the dump died in); the stages ``missing`` after it are what the
  crash left uncomputed (the isolated forms a crashed port owed included), never culprits.

A stage that fails with an input that differs (fails, declared or not) accumulated what is
named upstream, and is not named; a stage whose part (a piece of its own computation checked
on its own: the prediction network's state under the joint and the decode) differs is
explained by that part. Every culprit is named, not only the first.

Where the sweep has more than one reference (docs/references.md), the rows of each other
reference against the primary give the spread between references on each stage of a case. A
culprit whose error against the primary lies within that spread is a reference disagreement,
and is named as one: the references themselves part there by more than the gate, and the
candidate is no farther from the primary than the other reference is plus the gate (by the
triangle inequality: NMSE in square roots, max_abs and max_rel added), so it may be computing
what the other reference computes; or, stronger, the candidate's stage passes against another
reference under the same gate (``passes_against``, which the compare measures for a float32
cell). A block's own form (isolated, replayed) is excused only by
a spread that is the block's own: where the references agree on every stage before it. A fault
on a stage where the references agree stays the port's.

A case run again in one process compared with its fresh run (``against fresh``,
:mod:`audioparity.reuse`) is a cell of its own, its culprits named the same way: the first
stage that reads what a previous case left behind.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from audioparity import families
from audioparity.compare.gates import STALE
from audioparity.families import reference_stage, stage_key
from audioparity.vocabulary import FRESH

#: Statuses that make a cell need attention (a declared ``xfail`` does not).
FAILING = ("fail", "crashed", "missing")
#: The labels that make a cell.
CELL = ("family", "model", "case", "candidate", "backend", "weight_type", "against")


#: The ``backend`` label of a reference's comparison with the primary
#: (:data:`audioparity.workflow.plan.REFERENCE_BACKEND`).
REFERENCE_BACKEND = "torch"
#: The distances the spread between references can explain: how each adds up along a
#: triangle (NMSE and 1 - cosine are squared norms: their square roots add).
_DISTANCES = {"nmse": "sqrt", "max_abs": "add", "max_rel": "add", "cosine": "sqrt"}
#: A bound of the ``gate`` column (:func:`audioparity.compare.gates.gate_text`).
_BOUND = re.compile(r"\b([a-z0-9_]+)(<=|>=)([-+0-9.e]+|inf)")


def _number(value: Any) -> float | None:
    """A metric of a row as a float (a summary's text too); None where it is empty."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


def _distance(metric: str, value: float) -> float:
    """A metric as a distance that grows with the error (``cosine`` as ``1 - cosine``)."""
    return 1.0 - value if metric == "cosine" else value


Spread = dict[tuple, list[Mapping[str, Any]]]


def spreads(rows: Iterable[Mapping[str, Any]]) -> Spread:
    """{(family, model, case, stage): rows of the other references against the primary that
    fail (or fail as declared) there}: where the references themselves disagree; a declared
    difference that passed (a stale declaration) is no disagreement."""
    found: Spread = {}
    for row in rows:
        if (row["backend"] == REFERENCE_BACKEND and row["status"] in ("fail", "xfail")
                and not str(row.get("reason") or "").startswith(STALE)):
            key = (row["family"], row["model"], row["case"], row["stage"])
            found.setdefault(key, []).append(row)
    return found


def _accumulated(other: Mapping[str, Any], spread: Spread) -> bool:
    """Whether reference ``other`` already parts from the primary before the stage of its
    spread row ``other`` on that case: its spread there then holds what accumulated before it,
    not only what the block computes differently, and cannot excuse a block's own (isolated
    or replayed) error."""
    where = (other["family"], other["model"], other["case"])
    start = stage_key(other["family"], other["stage"])
    return any(key[:3] == where and stage_key(other["family"], key[3]) < start
               and any(r["candidate"] == other["candidate"] for r in rows)
               for key, rows in spread.items())


def disagreement(row: Mapping[str, Any], spread: Spread) -> str:
    """Why a candidate's failing ``row`` (against the primary) is a reference disagreement
    (module docstring), or ``""``: every gate bound it misses is one the triangle explains,
    and it lies within the bound for some reference that fails there; for a block's own
    (isolated or replayed) form, only where the references agree on every stage before it."""
    base = reference_stage(row["family"], row["stage"])
    others = [other for other in spread.get((row["family"], row["model"], row["case"], base), [])
              if row["stage"] == base or not _accumulated(other, spread)]
    bounds = {m: (op, float(limit)) for m, op, limit in _BOUND.findall(row.get("gate") or "")}
    missed = {m: value for m, (op, limit) in bounds.items()
              if (value := _number(row.get(m))) is not None
              and not (value <= limit if op == "<=" else value >= limit)}
    if not missed or row["status"] != "fail" or not set(missed) <= set(_DISTANCES):
        return ""
    missed = {m: _distance(m, value) for m, value in missed.items()}
    for other in others:
        within = True
        for metric, value in missed.items():
            apart = _number(other.get(metric))
            if apart is None:
                within = False
                break
            apart, gate = _distance(metric, apart), _distance(metric, bounds[metric][1])
            if _DISTANCES[metric] == "sqrt":
                limit = (math.sqrt(max(apart, 0.0)) + math.sqrt(max(gate, 0.0))) ** 2
            else:
                limit = apart + gate
            within = within and value <= limit
        if within:
            metrics = [m for m in _DISTANCES if m in missed]
            return f"reference disagreement: {_parted(other, metrics)}"
    return ""


def _parted(other: Mapping[str, Any], metrics: Sequence[str]) -> str:
    """How another reference's spread row parts from the primary: ``metrics``' figures, and
    its declared cause."""
    figures = ", ".join(f"{m} {_number(other.get(m)):.{6 if m == 'cosine' else 3}g}"
                        for m in metrics if _number(other.get(m)) is not None)
    declared = f"; {other['reason']}" if other["status"] == "xfail" and other.get(
        "reason") else ""
    return f"{other['candidate']} parts from {other['against']} here" + (
        f" by {figures}" if figures else "") + declared


def agreement(group: Sequence[Mapping[str, Any]], spread: Spread) -> str:
    """Why a stage that fails against the primary is a reference disagreement because the
    candidate passes against another reference there under the same gate (the rows'
    ``passes_against``), or ``""``."""
    for row in group:
        names = row.get("passes_against") or ""
        if row["status"] != "fail" or not isinstance(names, str) or not names:
            continue
        key = (row["family"], row["model"], row["case"], row["stage"])
        parted = [other for other in spread.get(key, []) if other["candidate"] in
                  names.split("; ")]
        how = f"; {_parted(parted[0], ('nmse', 'token_match'))}" if parted else ""
        return f"reference disagreement: {row['stage']} passes against {names}{how}"
    return ""


#: What joins a cell's culprits in the ``culprit`` column.
SEPARATOR = " || "
#: Statuses of a stage that differs from the reference (an input or part that explains the
#: stages it feeds): a failure, declared or not.
DIFFERS = (*FAILING, "xfail")


def _depths(flow: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]) -> dict[str, int]:
    """Each name's depth in the data flow: 0 for a stage fed by nothing, else one more than
    its deepest input or part (a form: its stage's)."""
    depth: dict[str, int] = {}

    def of(name: str, seen: frozenset = frozenset()) -> int:
        if name not in depth:
            inputs, parts = flow.get(name, ((), ()))
            feeding = [n for n in (*inputs, *parts) if n in flow and n not in seen]
            depth[name] = 1 + max((of(n, seen | {name}) for n in feeding), default=-1)
        return depth[name]

    for name in flow:
        of(name)
    return depth


def _text(pick: Mapping[str, Any], why: str) -> str:
    detail = f"{pick['status']}, {why}" if why else pick["status"]
    return f"{pick['stage']} ({detail}): {pick['reason']}" if pick["reason"] else (
        f"{pick['stage']} ({detail})")


def culprit(rows: Sequence[Mapping[str, Any]], spread: Spread | None = None) -> str:
    """The culprits of one cell's rows (module docstring) in data-flow order, joined by
    :data:`SEPARATOR`, or ``""`` when no row is :data:`FAILING`:
    ``layer_1_isolated (fail, its own error): nmse 0.015 > 1e-11``;
    ``pre_encode (fail, reference disagreement: nemo-2.4.1 parts from nemo here by nmse
    0.00034; ...): ...`` where ``spread`` (:func:`spreads`) explains it."""
    if not rows:
        return ""
    family = rows[0]["family"]
    by_stage = {row["stage"]: row for row in rows}
    died = any(row["status"] == "crashed" for row in rows)

    def failing(name: str) -> bool:
        row = by_stage.get(name)
        return row is not None and row["status"] in FAILING and not (
            died and row["status"] == "missing")

    def differs(names: Iterable[str]) -> list[str]:
        return [n for n in names if n in by_stage and by_stage[n]["status"] in DIFFERS]

    groups: dict[str, list[Mapping[str, Any]]] = {}
    for row in rows:
        groups.setdefault(reference_stage(family, row["stage"]), []).append(row)
    flow = families.flow(family, list({**by_stage, **groups}))
    depth = _depths(flow)
    found = []
    for stage, group in groups.items():
        forms = [row for row in group if row["stage"] != stage]
        inputs, parts = ([n for n in names if n in by_stage] for names in flow[stage])
        crashed = [row for row in group if row["status"] == "crashed"]
        own = [row for row in forms if failing(row["stage"]) and row["status"] != "missing"]
        if crashed:
            pick, why = crashed[0], ""
        elif differs(parts):
            continue  # a piece of it, checked on its own, is named there
        elif own:
            pick, why = own[0], "its own error"
        elif failing(stage) and not differs(inputs):
            pick = by_stage[stage]
            passing = [row["stage"] for row in forms if row["status"] == "pass"]
            if pick["status"] != "fail" or any(by_stage[n]["status"] != "pass" for n in inputs):
                why = ""  # an input unavailable (not exposed) cannot tell
            elif passing:
                why = (f"end to end only: its inputs pass and {passing[0]} passes"
                       if inputs else f"end to end only: {passing[0]} passes")
            elif inputs:
                why = "its inputs pass; no isolated form to tell its own error"
            else:
                why = ""
        elif failing(stage):
            continue  # an input differs: what it computes from is named upstream
        elif missing := [row for row in forms if failing(row["stage"])]:
            pick, why = missing[0], ""
        else:
            continue
        if rows[0]["against"] == "reference":
            why = agreement(group, spread or {}) or disagreement(pick, spread or {}) or why
        found.append((depth[stage], stage_key(family, pick["stage"]), _text(pick, why)))
    return SEPARATOR.join(text for *_, text in sorted(found))


def culprits(rows: Iterable[Mapping[str, Any]]) -> dict[tuple, str]:
    """{cell labels: its culprit} of every cell that has one, a cell against the primary
    reference read beside the spread between references (:func:`spreads`)."""
    rows = list(rows)
    spread = spreads(rows)
    by_cell: dict[tuple, list[Mapping[str, Any]]] = {}
    for row in rows:
        by_cell.setdefault(tuple(row[key] for key in CELL), []).append(row)
    found = {cell: culprit(group, spread) for cell, group in by_cell.items()}
    return {cell: text for cell, text in found.items() if text}


#: The ``against`` labels whose failures fail the check: the reference, and a case run again
#: in one process against its fresh run (a port that keeps state between cases is wrong).
CHECKED = ("reference", FRESH)


def check(rows: Iterable[Mapping[str, Any]]) -> tuple[int, list[str]]:
    """What ``audioparity report check`` says of a summary: ``(exit code, lines)``; 1 and one
    line per cell with a culprit when a comparison with the reference, or of a case run again
    with its fresh run (``against fresh``), has a stage ``fail``, ``crashed`` or ``missing``
    (a declared expected failure is ``xfail``, and passes this); comparisons between backends
    are diagnoses and are listed without failing the check."""
    rows = list(rows)
    found = culprits(rows)
    failing = {cell: text for cell, text in found.items() if cell[-1] in CHECKED}
    lines = [f"{'/'.join(cell[:-1])}{'' if cell[-1] == 'reference' else ' against ' + cell[-1]}"
             f": {one}" for cell, text in failing.items() for one in text.split(SEPARATOR)]
    lines += [f"{'/'.join(cell[:-1])} against {cell[-1]} (not failing the check): {one}"
              for cell, text in found.items() if cell[-1] not in CHECKED
              for one in text.split(SEPARATOR)]
    total = len({tuple(row[key] for key in CELL) for row in rows
                 if row["against"] in CHECKED})
    verdict = (f"{len(failing)} of {total} cells need attention" if failing else
               f"all {total} cells pass, or fail as declared, or are unavailable")
    return (1 if failing else 0), [*lines, f"audioparity check: {verdict}"]
