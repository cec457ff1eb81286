"""A precision recipe's targets (docs/quantization.md): the stages a weight type with a recipe
promises to keep, each judged against the float32 reference by the recipe's own gate entries.

The search (:mod:`audioparity.compare.precision`) measures each trial with them; every cell of a
recipe's weight type carries their verdict on its own dump in its row
:data:`~audioparity.contract.vocabulary.RECIPE_ROW`: the recipe verified on every case, candidate
and backend of the sweep, by the compare that judges the cell's stages.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from typing import Any

import numpy as np

from audioparity.compare.cell import fixed_row
from audioparity.compare.gate_lists import check_resolved
from audioparity.compare.gates import status
from audioparity.compare.plan import Cell
from audioparity.compare.stage import compare_stage, stage_kinds
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import AnySpec
from audioparity.contract.vocabulary import RECIPE_ROW
from audioparity.dumping.artifacts import Dump

#: The metrics a target's row records (JSON-safe numbers).
TARGET_METRICS = ("nmse", "max_rel", "cosine", "kl", "top1", "token_match", "wer", "exact")


def target_gates(targets: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The resolved gates (:func:`~audioparity.compare.gate_lists.resolve_gates`' form) that judge
    a recipe's ``targets`` (gate entries), no expected failure excusing any.

    Raises:
        AudioparityError: a malformed entry.
    """
    gates = {"gates": [{**t, "from": "target"} for t in targets], "expected_failures": []}
    check_resolved(gates)
    return gates


def target_rows(reference: Dump, candidate: Dump, targets: Sequence[Mapping[str, Any]],
                family: AnySpec, case: str) -> list[dict[str, Any]]:
    """Each stage of ``reference`` (the float32 reference's dump of ``case``) that a target's
    ``stage`` pattern names, ``candidate``'s against it under the targets: one row each,
    ``{case, stage, status, gate, reason, <metric>...}``; a stage the candidate lacks is
    ``missing``.

    Raises:
        AudioparityError: no stage of the reference matches a target.
    """
    gates = target_gates(targets)
    kinds, found = stage_kinds(reference, family), stage_kinds(candidate, family)
    rows: list[dict[str, Any]] = []
    for target in targets:
        for stage in sorted(s for s in kinds if fnmatchcase(s, target["stage"])):
            if any(r["stage"] == stage for r in rows):
                continue
            if stage in found:
                metrics, problems = compare_stage(reference, candidate, stage, stage,
                                                  found[stage], kinds[stage])
                verdict = status(stage, gates, metrics=metrics, problems=problems)
            else:
                metrics, verdict = None, status(stage, gates, availability="missing",
                                                problems=("the candidate does not dump it",))
            rows.append({"case": case, "stage": stage, "status": verdict.status,
                         "gate": verdict.gate, "reason": verdict.reason,
                         **_numbers(metrics)})
    if not rows:
        raise AudioparityError(f"{reference.path}: no stage matches the recipe's targets "
                               f"({', '.join(t['stage'] for t in targets)})")
    return rows


def _numbers(metrics: Mapping[str, Any] | None) -> dict[str, Any]:
    out = {}
    for key in TARGET_METRICS:
        value = (metrics or {}).get(key)
        if isinstance(value, float | int | bool | np.floating):
            out[key] = value if isinstance(value, bool) else float(value)
    return out


def unmet(rows: Sequence[Mapping[str, Any]]) -> str | None:
    """The targets ``rows`` (:func:`target_rows`) that do not pass, as one line
    (``decode of clip: wer 0.12 > 0``), None when every one passes."""
    failed = [f"{r['stage']} of {r['case']}: {r['reason'] or r['status']}"
              for r in rows if r["status"] != "pass"]
    return "; ".join(failed) or None


def recipe_row(cell: Cell, labels: Mapping[str, str], gates: Mapping[str, Any],
               recipe: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The row :data:`~audioparity.contract.vocabulary.RECIPE_ROW` of a cell of a recipe's weight
    type (``recipe``: the document ``audioparity precision`` writes): ``fail`` where the search
    found no recipe that meets its targets, or where the cell's own dump misses them against the
    float32 reference (``cell.cost``), naming each stage and case; else ``pass``. A cell whose
    candidate did not run (crashed, unavailable) has none, its own rows saying why; nor does a
    recipe of the user's that names no targets.

    Raises:
        AudioparityError: the cell has no float32 reference to judge the targets against.
    """
    targets = recipe.get("targets")
    if (not targets or cell.candidate is None or cell.same_stages
            or cell.candidate.status != "ok"):
        return []
    if cell.cost is None:
        raise AudioparityError(f"{cell.candidate_path}: the recipe's targets are judged against "
                               "the float32 reference: give it (--cost-reference)")
    overrides = recipe["overrides"]
    kept = f"{len(overrides)} weight(s) kept {'/'.join(sorted(set(overrides.values()))) or 'wide'}"
    search = recipe.get("search") or {}
    if search.get("met", True):
        rows = target_rows(cell.cost, cell.candidate, targets, cell.family,
                           labels.get("case") or cell.candidate_path.name)
        missed = unmet(rows)
        problem = f"not verified: {missed}" if missed else None
    else:
        problem = ("its search met no recipe on its calibration cases"
                   + (f": {search['unmet']}" if search.get("unmet") else ""))
    names = ", ".join(t["stage"] for t in targets)
    return [fixed_row(cell, labels, gates, RECIPE_ROW, problem,
                      f"{kept}; its targets ({names}) met against the float32 reference")]
