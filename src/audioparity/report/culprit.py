"""The culprits of a cell, and the check a CI runs on a summary.

A cell (family, model, case, candidate, backend, weight type, against) whose stages do not all
pass has culprits, named in data-flow order (each family's stages declare their ``inputs`` and
``parts``: :class:`audioparity.contract.spec.Stage`):

- a stage's local form that fails (``layer_3_isolated``: the candidate's block on the
  reference's input; ``layer_3_replayed``: the reference's block on the candidate's input):
  the block computes wrongly on its own, whatever its inputs were;
- a stage that fails while every input it is computed from passes: where its local form
  passes, only the end-to-end path differs (a mask or a table only that path builds); where it
  has none, it says so;
- a stage that crashed (the one the dump died in); the stages ``missing`` after it are what the
  crash left uncomputed (the isolated forms a crashed port owed included), never culprits;
- a precision recipe's row (:data:`~audioparity.contract.vocabulary.RECIPE_ROW`: its targets missed
on
  the cell's dump against the float32 reference) where no other row of the cell needs
  attention: the recipe itself, not the port, misses them; it is computed from every stage of
  the cell, so any other that fails, crashed or went missing is named instead (a declared
  failure does not excuse it: declare one for ``recipe`` itself).

A stage that fails with an input that differs (fails, declared or not) accumulated what is
named upstream, and is not named; a stage whose part (a piece of its own computation checked
on its own: the prediction network's state under the joint and the decode) differs is
explained by that part. Every culprit is named, not only the first.

Where the sweep has more than one reference (docs/references.md), the rows of each other
reference against the primary give the spread between references on each stage of a case, and
a float32 cell's rows name the other references its stage is measurably closer to than to the
primary (``closer_to``: a quarter of the NMSE, or more of a decode's tokens). A culprit is a
reference disagreement only by that evidence: the other reference parts from the primary on
that stage, the candidate is closer to it there, and on every stage feeding it where that
reference parts from the primary the candidate is closer to it too (a difference the other
reference inherits from upstream, which the candidate does not share, excuses nothing). A
block's own form (isolated, replayed) is excused only where that reference agrees with the
primary on every stage before it: its input is then the one the block took. A stage the
candidate does not expose cannot be measured, and is said so. A fault on a stage where the
references agree stays the port's, and so does one the candidate is not closer to another
reference on.

The rows of another reference against the primary are a cell too, its culprits named the
same way along that reference's own data flow
(:attr:`audioparity.contract.spec.Stage.reference_inputs`): a stage the candidate computes on the
primary's values, such as Parakeet's joint along the primary's greedy path, is computed by that
reference from its own, so a joint on another path (another frame count) is what its encoder's
difference upstream explains, not a culprit of its own.

A case run again in one process compared with its fresh run (``against fresh``,
:mod:`audioparity.compare.reuse`) is a cell of its own, its culprits named the same way: the first
stage that reads what a previous case left behind.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from audioparity.compare.gates import STALE
from audioparity.contract.vocabulary import FRESH, RECIPE_ROW
from audioparity.models.registry import spec_of

#: Statuses that make a cell need attention (a declared ``xfail`` does not).
FAILING = ("fail", "crashed", "missing")
#: The labels that make a cell.
CELL = ("family", "model", "case", "candidate", "backend", "weight_type", "against")


#: The ``backend`` label of a reference's comparison with the primary
#: (:data:`audioparity.workflow.plan.REFERENCE_BACKEND`).
REFERENCE_BACKEND = "torch"

#: The rows of the other references against the primary that part from it, by (family, model,
#: case, stage) (:func:`spreads`).
Spread = dict[tuple, list[Mapping[str, Any]]]


def _number(value: Any) -> float | None:
    """A metric of a row as a float (a summary's text too); None where it is empty."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(number) else number


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


def _names(value: Any) -> list[str]:
    """The names of a ``closer_to`` cell (``"; "``-joined), none where it is empty."""
    return [n for n in value.split("; ") if n] if isinstance(value, str) else []


def _upstream(stage: str, flow: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]]
              ) -> list[str]:
    """Every stage that feeds ``stage`` through its inputs, nearest first."""
    found: list[str] = []
    todo = list(flow.get(stage, ((), ()))[0])
    while todo:
        name = todo.pop(0)
        if name not in found:
            found.append(name)
            todo.extend(flow.get(name, ((), ()))[0])
    return found


def disagreement(pick: Mapping[str, Any], by_stage: Mapping[str, Mapping[str, Any]],
                 flow: Mapping[str, tuple[tuple[str, ...], tuple[str, ...]]],
                 spread: Spread) -> str:
    """Why a candidate's failing row ``pick`` (against the primary) is a reference disagreement
    (module docstring), or ``""``: a reference it is closer to (``closer_to``) that parts from
    the primary there, to which it is closer on every measured stage feeding it where that
    reference parts too; for a block's own form, one that agrees with the primary before it.
    ``by_stage`` holds the cell's rows by stage, ``flow`` its data flow."""
    family, base = pick["family"], spec_of(pick["family"]).reference_stage(pick["stage"])
    where = (family, pick["model"], pick["case"])

    def parts(name: str, stage: str) -> list[Mapping[str, Any]]:
        return [r for r in spread.get((*where, stage), []) if r["candidate"] == name]

    for name in _names(pick.get("closer_to")) if pick["status"] == "fail" else []:
        here = parts(name, base)
        shared = [u for u in _upstream(base, flow) if parts(name, u)]
        if not here or (shared and pick["stage"] != base):
            continue
        measured = [u for u in shared if u in by_stage
                    and by_stage[u]["status"] not in ("unavailable", "missing", "crashed")]
        if any(name not in _names(by_stage[u].get("closer_to")) for u in measured):
            continue
        upstream = (f" and on {', '.join(measured)}, where it parts too" if measured else "")
        unseen = [u for u in shared if u not in measured]
        blind = (f" ({', '.join(unseen)}, where it parts too, not exposed)" if unseen else "")
        return (f"reference disagreement: closer to {name} than to {here[0]['against']} here"
                f"{upstream}{blind}; {_parted(here[0], ('nmse', 'token_match'))}")
    return ""


def _parted(other: Mapping[str, Any], metrics: Sequence[str]) -> str:
    """How another reference's spread row parts from the primary: ``metrics``' figures, and
    its declared cause."""
    figures = ", ".join(f"{m} {_number(other.get(m)):.3g}" for m in metrics
                        if _number(other.get(m)) is not None)
    declared = f"; {other['reason']}" if other["status"] == "xfail" and other.get(
        "reason") else ""
    return f"{other['candidate']} parts from {other['against']} here" + (
        f" by {figures}" if figures else "") + declared


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


@functools.lru_cache(maxsize=1024)
def _flow(family: str, names: tuple[str, ...], reference: bool
          ) -> tuple[dict[str, tuple[tuple[str, ...], tuple[str, ...]]], dict[str, int]]:
    """:meth:`audioparity.contract.spec.FamilySpec.flow` of a cell's stage names and their
    :func:`_depths`, once for every cell of a sweep with the same stages (read only)."""
    flow = spec_of(family).flow(list(names), reference=reference)
    if RECIPE_ROW in flow:  # the recipe's targets are measured on the cell's own stages
        flow[RECIPE_ROW] = (tuple(n for n in names if n != RECIPE_ROW), ())
    return flow, _depths(flow)


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
        groups.setdefault(spec_of(family).reference_stage(row["stage"]), []).append(row)
    # another reference against the primary: its own pipeline's data flow
    flow, depth = _flow(family, tuple({**by_stage, **groups}),
                        rows[0]["backend"] == REFERENCE_BACKEND)
    found = []
    for stage, group in groups.items():
        forms = [row for row in group if row["stage"] != stage]
        inputs, parts = ([n for n in names if n in by_stage] for names in flow[stage])
        # what explains a stage: an input that differs; for the recipe's row, one that needs
        # attention (a declared failure elsewhere in the cell does not excuse a missed target)
        explained = ([n for n in inputs if failing(n)] if stage == RECIPE_ROW
                     else differs(inputs))
        crashed = [row for row in group if row["status"] == "crashed"]
        own = [row for row in forms if failing(row["stage"]) and row["status"] != "missing"]
        if crashed:
            pick, why = crashed[0], ""
        elif differs(parts):
            continue  # a piece of it, checked on its own, is named there
        elif own:
            pick, why = own[0], "its own error"
        elif failing(stage) and not explained:
            pick = by_stage[stage]
            passing = [row["stage"] for row in forms if row["status"] == "pass"]
            if (pick["status"] != "fail" or stage == RECIPE_ROW
                    or any(by_stage[n]["status"] != "pass" for n in inputs)):
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
            why = disagreement(pick, by_stage, flow, spread or {}) or why
        found.append((depth[stage], spec_of(family).stage_key(pick["stage"]), _text(pick, why)))
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
