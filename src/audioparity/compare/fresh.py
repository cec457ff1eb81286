"""A case run again in one process (after another case, or a second time) against the same
candidate's fresh run of it (its own process, the cell's ggml dump), stage by stage.

A port that keeps state between cases (a KV cache, an LSTM state, a graph or compute buffer not
reset) gives a fresh run right and a reused one wrong, which no comparison with the reference
sees: the workflow's cells are each dumped in a fresh process. Here every stage must be
identical: the same shape and dtype, and the same value at every position, a NaN equal to a
NaN at the same place (``max_abs`` 0). A bound the config states for a candidate, backend,
weight type and stage (``reuse_bounds``: a ``max_abs`` and its reason) allows that much between
finite values instead; a NaN or an infinity must still be where the fresh run has it, and a
document's fields identical (its margins within the bound).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.compare.cell import COLUMNS
from audioparity.compare.plan import crashed_stage
from audioparity.compare.stage import MARGINS
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import FRESH
from audioparity.dumping.artifacts import RUNNING, Dump
from audioparity.models.registry import spec_of

#: The gate of a stage without a stated bound.
IDENTICAL = "identical"


def array_difference(reused: np.ndarray, fresh: np.ndarray, bound: float = 0.0
                     ) -> tuple[dict[str, Any], str]:
    """How ``reused`` differs from ``fresh`` (arrays of any shape): ``({"max_abs", "non_finite",
    "argmax"}, why)``, ``why`` empty when they agree within ``bound``.

    ``max_abs`` is the largest ``|reused - fresh|`` over the positions finite in both (0.0
    when there are none); ``non_finite`` counts the positions where one holds a NaN or an
    infinity the other does not hold there; ``argmax`` is the first position that differs
    (``"row,col"``), None where none does. Another shape or dtype is a difference of its own
    (metrics None).
    """
    if reused.shape != fresh.shape or reused.dtype != fresh.dtype:
        return ({"max_abs": None, "non_finite": None, "argmax": None},
                f"shape {list(reused.shape)} {reused.dtype} where the fresh run has "
                f"{list(fresh.shape)} {fresh.dtype}")
    if not np.issubdtype(fresh.dtype, np.inexact):
        differs = reused != fresh
        finite = np.ones(fresh.shape, bool)
        placed = np.zeros(fresh.shape, bool)
    else:
        finite = np.isfinite(reused) & np.isfinite(fresh)
        same_nan = np.isnan(reused) & np.isnan(fresh)
        placed = ~finite & ~same_nan & (reused != fresh)  # a NaN or inf against anything else
        differs = placed | (finite & (reused != fresh))
    gaps = np.abs(reused[finite].astype(np.float64) - fresh[finite].astype(np.float64))
    max_abs = float(gaps.max()) if gaps.size else 0.0
    first = np.flatnonzero(differs)
    where = (",".join(str(int(i)) for i in np.unravel_index(int(first[0]), fresh.shape))
             if first.size and fresh.ndim else None)
    metrics = {"max_abs": max_abs, "non_finite": int(placed.sum()), "argmax": where}
    if placed.any():
        return metrics, (f"{int(placed.sum())} NaN or infinite value(s) where the fresh run "
                         f"has another value (first at [{where}])")
    if max_abs > bound:
        return metrics, f"max_abs {max_abs!r} > {bound!r} (first difference at [{where}])"
    return metrics, ""


def bound_for(stage: str, bounds: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The first of ``bounds`` (``{"stage": pattern, "max_abs": value, "reason": text}``, the
    config's ``reuse_bounds`` that match the cell) whose pattern matches ``stage``; None: the
    stage must be identical."""
    return next((entry for entry in bounds if fnmatchcase(stage, entry["stage"])), None)


def _stages(dump: Dump) -> list[str]:
    """The stages a dump holds: its tensors but the documents' margins, then its documents."""
    documents = list(dump.manifest.get("documents", {}))
    margins = {name + MARGINS for name in documents}
    return [*(n for n in dump.tensor_names if n not in margins), *documents]


def _compare(reused: Dump, fresh: Dump, stage: str, bound: float) -> tuple[dict[str, Any], str]:
    """The metrics and the difference (``""``: none) of one stage held by both dumps."""
    if stage in fresh.manifest["tensors"]:
        if stage not in reused.manifest["tensors"]:
            return {}, "the run again holds no such tensor"
        return array_difference(reused.tensor(stage), fresh.tensor(stage), bound)
    if not reused.has(stage):
        return {}, "the run again holds no such document"
    document, expected = reused.json(stage), fresh.json(stage)
    fields = sorted(k for k in {*document, *expected} if document.get(k) != expected.get(k))
    metrics: dict[str, Any] = {}
    why = [f"field(s) {', '.join(fields)} differ"] if fields else []
    if fresh.has(stage + MARGINS) and reused.has(stage + MARGINS):
        metrics, margins = array_difference(reused.tensor(stage + MARGINS),
                                            fresh.tensor(stage + MARGINS), bound)
        why += [f"margins: {margins}"] if margins else []
    return metrics, "; ".join(why)


def _partial(run: Path) -> tuple[Dump | None, str | None]:
    """What a run that did not finish left: the dump of its finished stages (its
    ``.partial`` folder; None when it never started) and the stage it was computing (its
    phase, :class:`~audioparity.contract.family.Phase`)."""
    partial = run.with_name(run.name + ".partial")
    try:
        dump = Dump(partial)
    except AudioparityError:
        return None, None
    return dump, dump.manifest.get(RUNNING)


def fresh_rows(fresh_dir: str | os.PathLike, run_dir: str | os.PathLike,
               labels: Mapping[str, str], bounds: Sequence[Mapping[str, Any]] = (),
               died: str | None = None) -> list[dict[str, Any]]:
    """One summary row (:data:`~audioparity.compare.cell.COLUMNS`, ``against`` ``fresh``) per
    stage of the fresh dump: ``pass`` where the run again holds it identical (or within its
    bound, :func:`bound_for`), ``fail`` saying how it differs; where the run did not finish
    (the process running the cases died: ``died`` says how), its finished stages compared,
    ``crashed`` for the stage it was computing (:func:`~audioparity.compare.cell.
    crashed_stage`), ``missing`` for the others it lacks (every stage ``missing`` for a run
    the process never started).

    Args:
        fresh_dir: the cell's own dump of the case (``ok``).
        run_dir: the dump of the case run again in one process after another.
        labels: the cell's labels (family, model, case, candidate, backend, weight_type).
        bounds: the config's ``reuse_bounds`` that match the cell.
        died: the process's exit (``"signal SIGABRT (6): <stderr's last line>"``), or None.

    Raises:
        AudioparityError: an unreadable dump, or a fresh dump without stages.
    """
    fresh, run = Dump(fresh_dir), Path(run_dir)
    finished = run.is_dir()
    reused, phase = (Dump(run), None) if finished else _partial(run)
    stages = _stages(fresh)
    died_in = None if finished or reused is None else crashed_stage(
        spec_of(labels.get("family")), [stage for stage in stages if not reused.has(stage)], phase)
    rows = []
    for stage in stages:
        entry = bound_for(stage, bounds)
        bound = float(entry["max_abs"]) if entry else 0.0
        metrics: dict[str, Any] = {}
        if reused is not None and reused.has(stage):
            metrics, why = _compare(reused, fresh, stage, bound)
            status = "fail" if why else "pass"
        elif finished:
            status, why = "fail", "the run again holds no such stage"
        elif stage == died_in:
            status, why = "crashed", f"the run again died here: {died}"
        else:
            status = "missing"
            why = (f"not computed: the run again died in {died_in} ({died})"
                   if reused is not None else f"not run: the process died before ({died})")
        row = dict.fromkeys(COLUMNS)
        row.update({key: value for key, value in labels.items() if key in row})
        row.update(against=FRESH, stage=stage, status=status, reason=why,
                   gate=f"max_abs<={bound!r} ({entry['reason']})" if entry else IDENTICAL,
                   seconds=reused.manifest.get("seconds", {}).get(stage) if reused else None,
                   **{key: _finite(metrics.get(key))
                      for key in ("max_abs", "non_finite", "argmax")})
        rows.append(row)
    if not rows:
        raise AudioparityError(f"{fresh.path}: the fresh dump holds no stage to compare")
    return rows


def _finite(value: Any) -> Any:
    """A metric as strict JSON: a non-finite float as text."""
    return repr(value) if isinstance(value, float) and not math.isfinite(value) else value
