"""Compare one cell: a candidate dump (one backend, one weight type) against its reference dump,
its rows planned (:mod:`.plan`), each stage measured (:mod:`.stage`) and judged by the gates
(:mod:`.gates`, :mod:`.scaling`), written as the cell file (:func:`compare_cell`) that
:func:`read_cell` reads back.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.compare.documents import known_text_metrics
from audioparity.compare.gate_lists import check_resolved
from audioparity.compare.gates import Verdict, status
from audioparity.compare.plan import (
    REFERENCE,
    Cell,
    CellDumps,
    Planned,
    availability,
    open_cell,
)
from audioparity.compare.scaling import (
    CARRIED_NOISE,
    LENGTH_SCALING,
    carry_noise,
    for_length,
    noise_floor,
)
from audioparity.compare.stage import compare_stage, conventions, read_document, stage_kinds
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    MIXES,
    RECIPE_ROW,
    RECIPE_SEPARATOR,
    STORAGE,
    STORED_WEIGHTS,
    StageKind,
)
from audioparity.dumping.artifacts import (
    OPS_ON_CPU,
    Dump,
    write_text_atomic,
)

log = logging.getLogger(__name__)

#: Cell labels, in summary order (docs/design.md, "summary.csv"). ``against`` is what the
#: candidate is compared with: ``reference`` (the PyTorch/NeMo dump), or a backend (``cpu``):
#: the same candidate and weight type computed there.
LABEL_COLUMNS = ("family", "model", "case", "candidate", "backend", "weight_type", "against")
#: The columns that name a row: its cell's labels and its stage.
KEY_COLUMNS = (*LABEL_COLUMNS, "stage")
#: Metric columns, in summary order; None where a metric does not apply to a stage.
METRIC_COLUMNS = (
    "cosine", "std_ratio", "nmse", "median_row_nmse", "max_abs", "mean_abs", "max_rel",
    "non_finite", "argmax", "top1", "kl", "token_match", "first_divergence", "logit_gap", "wer",
    "wer_known", "ref_wer_known",
)
#: The cost of a weight type: the candidate measured against the float32 reference, where a
#: quantized cell's own reference is a quantization-aware one (``audioparity.dumping.storage``);
#: empty for a stage whose rows follow the reference's own decisions (``Stage.reference_path``), and
#: where the two do not line up. ``cost_<metric>`` is the metric ``<metric>`` of
#: :data:`METRIC_COLUMNS` measured there: NMSE and cosine of a tensor or logits stage, KL of a
#: logits stage, token match and WER of a document.
COST_COLUMNS = ("cost_nmse", "cost_cosine", "cost_token_match", "cost_kl", "cost_wer")
#: How the candidate stored its weights (its dump's manifest ``storage``; empty for a dump
#: without one, an older dump or a candidate that does not say): ``bits_per_weight`` over its
#: weight tensors, ``fallbacks`` how many tensors it stored as another type than the cell's
#: weight type (rows no multiple of the type's block), ``fallback_tensors`` their lines
#: (``<tensor> [shape]: q4_K -> q5_0``) joined by ``"; "``. The same on every row of a cell.
STORAGE_COLUMNS = ("bits_per_weight", "fallbacks", "fallback_tensors")
#: ``closer_to``: the other references (config ``references``) a float32 cell's stage is
#: measurably closer to than to the primary (:func:`closer`), the closest first, ``"; "``
#: joined, on every row compared where the cell has other references: the evidence a reference
#: disagreement is excused by (docs/references.md); empty elsewhere.
#: Every column of a cell row and of summary.csv; ``first_bad_op`` is filled by a drill-down
#: (:mod:`audioparity.compare.drilldown`) on the failing rows of a comparison with another backend,
#: ``culprit`` by the summary on every row of a cell that has one
#: (:mod:`audioparity.report.culprit`).
COLUMNS = (*LABEL_COLUMNS, "stage", "status", *METRIC_COLUMNS, *COST_COLUMNS, *STORAGE_COLUMNS,
           "gate", "reason", "closer_to", "seconds", "first_bad_op", "culprit")

def _cost(cell: Cell, row: Planned, measured: dict[str, Any] | None) -> dict[str, Any]:
    """:data:`COST_COLUMNS` of one row: the candidate against the float32 reference, for a
    compared row of a quantized cell; empty elsewhere, and where the two do not line up (a
    problem such as rows compared over a common prefix only)."""
    if (cell.cost is None or measured is None or row.against is not cell.reference
            or cell.family.on_reference_path(row.ref_stage)):
        return dict.fromkeys(COST_COLUMNS)
    cost, problems = compare_stage(cell.cost, cell.candidate, row.cand_stage, row.ref_stage,
                                   row.kind, row.ref_kind)
    if problems:
        return dict.fromkeys(COST_COLUMNS)
    return {column: cost.get(column.removeprefix("cost_")) for column in COST_COLUMNS}


#: The separator of the lines of ``fallback_tensors``.
FALLBACK_SEPARATOR = "; "


def _storage(cell: Cell) -> dict[str, Any]:
    """:data:`STORAGE_COLUMNS` of a cell from its candidate dump's manifest ``storage``
    (``{"bits_per_weight": float, "types": {type: tensors}, "fallbacks": [line, ...]}``); all
    None without a candidate dump or without that field."""
    storage = cell.candidate.manifest.get("storage") if cell.candidate is not None else None
    if not isinstance(storage, Mapping):
        return dict.fromkeys(STORAGE_COLUMNS)
    bits = storage.get("bits_per_weight")
    fallbacks = [str(line) for line in storage.get("fallbacks") or []]
    return {"bits_per_weight": float(bits) if isinstance(bits, int | float) else None,
            "fallbacks": len(fallbacks),
            "fallback_tensors": FALLBACK_SEPARATOR.join(fallbacks) or None}


def _reason(cell: Cell, row: Planned, verdict: Verdict, measured: dict[str, Any] | None) -> str:
    """The gate's reason, the logits rows whose top-1 differs (when the row does not pass),
    the stored weights that differ from the reference's (when it fails), the candidate's
    convention for the stage and the ops its backend ran on the CPU in it
    (:func:`ops_on_cpu`)."""
    parts = (measured or {}).get("top1_rows")
    part = (f"top-1 differs in row(s) {', '.join(map(str, parts))} of {row.stage}"
            if parts and verdict.status != "pass" else "")
    weights = cell.weights_differ if verdict.status == "fail" else None
    why = (conventions(cell.candidate, row.cand_stage).get("why")
           if cell.candidate is not None else None)
    on_cpu = ops_on_cpu(cell.candidate, row.cand_stage) if cell.candidate is not None else ""
    return "; ".join(filter(None, [verdict.reason, part, weights,
                                   why and f"compared as: {why}", on_cpu]))


def ops_on_cpu(dump: Dump, stage: str) -> str:
    """The ops of the graphs ``dump`` computed in ``stage`` that its backend does not support,
    which ggml's scheduler ran on the CPU (manifest
    :data:`~audioparity.dumping.artifacts.OPS_ON_CPU`), as a line: ``on the CPU, not cuda:
    FLASH_ATTN_EXT (4 nodes)``; empty where there were none."""
    ops = [f"{e['op']} ({e['count']} node{'s' if e['count'] != 1 else ''})"
           for e in dump.manifest.get(OPS_ON_CPU, []) if e.get("phase") == stage]
    return f"on the CPU, not {dump.manifest.get('backend')}: {', '.join(ops)}" if ops else ""


#: The fixed rule of each row that no gate list judges, by its stage: the row's ``gate``.
FIXED_RULES = {
    STORAGE: "the weight type asked, as the file stores it",
    STORED_WEIGHTS: "stored bytes: ggml's quantization of the checkpoint",
    RECIPE_ROW: "the recipe's targets, against the float32 reference",
}


def fixed_row(cell: Cell, labels: Mapping[str, str], gates: Mapping[str, Any], stage: str,
              problem: str | None, reason: str) -> dict[str, Any]:
    """A row no gate list judges (:data:`~audioparity.contract.vocabulary.STORAGE_ROWS`,
    :data:`~audioparity.contract.vocabulary.RECIPE_ROW`), by its stage's rule
    (:data:`FIXED_RULES`): ``fail`` with ``problem``, else ``pass`` with ``reason``; a declared
    expected failure applies as to any stage.

    Raises:
        KeyError: a stage with no fixed rule.
    """
    verdict = status(stage, gates, problems=(problem,) if problem else (),
                     rule=FIXED_RULES[stage])
    values = {key: labels.get(key) for key in LABEL_COLUMNS}
    values["against"] = labels.get("against", REFERENCE)
    values.update({key: value for key, value in labels.items() if key not in values})
    values.update(dict.fromkeys(COLUMNS[len(LABEL_COLUMNS) + 1:]))
    values.update(stage=stage, status=verdict.status, gate=verdict.gate,
                  reason=verdict.reason or reason, **_storage(cell))
    return {key: _json_value(value) for key, value in values.items()}


def _storage_rows(cell: Cell, labels: Mapping[str, str], gates: Mapping[str, Any]
                  ) -> list[dict[str, Any]]:
    """The rows of a quantized cell that judge the weights it computed with, where both dumps
    record them (docs/quantization.md): :data:`~audioparity.contract.vocabulary.STORAGE` (the file's
    types against the weight type asked: :func:`~audioparity.dumping.weight_files.storage_verdict`,
        the
    reference naming the model's matmul weights) and
    :data:`~audioparity.contract.vocabulary.STORED_WEIGHTS` (the bytes against ggml's quantization
    of
    the checkpoint, weight by weight: :func:`stored_weights_difference`). The stages are
    the third part, the arithmetic."""
    if cell.candidate is None or cell.same_stages or cell.candidate.status != "ok":
        return []
    from audioparity.dumping.storage import EMULATED_TYPES
    from audioparity.dumping.weight_files import storage_verdict

    stores = [dump.manifest.get("storage") or {} for dump in (cell.reference, cell.candidate)]
    rows = []
    matmul, types = stores[0].get("matmul_weights"), stores[1].get("tensor_types")
    weight_type = str(cell.candidate.manifest.get("weight_type") or labels.get("weight_type")
                      or "")
    base, _, recipe = weight_type.partition(RECIPE_SEPARATOR)
    if matmul and types is not None and MIXES.get(base, base) in EMULATED_TYPES:
        honoured, line = storage_verdict(
            MIXES.get(base, base), matmul, types, mix=base in MIXES,
            overrides=cell.candidate.manifest.get("recipe") if recipe else None,
            tool=str(cell.candidate.manifest.get("candidate_adapter") or "its quantizer"))
        rows.append(fixed_row(cell, labels, gates, STORAGE, None if honoured else line, line))
    hashes = [store.get("hashes") for store in stores]
    if all(hashes):
        common = sum(name in hashes[1] for name in hashes[0])
        differ = cell.weights_differ or (None if common else (
            "no weight the reference stored is named as the candidate names its own: nothing "
            "compared (a family's reference_prefix, or its adapter's weight map?)"))
        rows.append(fixed_row(cell, labels, gates, STORED_WEIGHTS, differ,
                              f"{common} weights stored as ggml's quantizer stores them"))
    return rows


def case_lengths(reference: Dump, gates: Mapping[str, Any]) -> dict[str, int] | None:
    """Each tensor stage's first axis in ``reference``, as the gates' ``length_scaling`` rule
    reads the case's length (None without a rule)."""
    if gates.get(LENGTH_SCALING) is None:
        return None
    return {name: int(entry["shape"][0])
            for name, entry in reference.manifest["tensors"].items() if entry.get("shape")}


def _json_value(value: Any) -> Any:
    """Row values as strict JSON: numpy scalars unwrapped, non-finite floats as text."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _add_known_text(cell: Cell, row: Planned, measured: dict[str, Any]) -> None:
    """Add a compared document row's ``wer_known`` and ``ref_wer_known`` to its metrics; for a
    case with no known text, mark ``wer_known`` not measured (a ``wer_known_max`` gate then
    passes it by)."""
    if cell.known_text is None:
        measured.setdefault("not_measured", {})["wer_known"] = "the case has no known text"
        return
    measured.update(known_text_metrics(read_document(cell.candidate, row.cand_stage),
                                       read_document(row.against, row.ref_stage), cell.known_text))


#: How much closer a candidate's stage must be to another reference than to the primary to
#: count as closer (:func:`closer`): a quarter of the NMSE, half the distance.
CLOSER = 4.0


def closer(to_other: Mapping[str, Any] | None, to_primary: Mapping[str, Any] | None,
           kind: str) -> bool:
    """Whether a stage is measurably closer to another reference than to the primary, from its
    metrics against each: a tensor's (or logits') NMSE :data:`CLOSER` times smaller, finite
    both; a document's token match higher. Never where either could not be measured (a frame
    count or a shape that differs)."""
    if to_other is None or to_primary is None:
        return False
    metric = "token_match" if kind == StageKind.DOCUMENT else "nmse"
    other, primary = to_other.get(metric), to_primary.get(metric)
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (other, primary)):
        return False
    return other > primary if kind == StageKind.DOCUMENT else other * CLOSER < primary


def _closer_to(cell: Cell, row: Planned, measured: Mapping[str, Any] | None) -> str | None:
    """The other references a compared row is measurably closer to than to what it was
    measured against (``measured``; :func:`closer`), the closest first, ``"; "``-joined, None
    where none is: its stage, an isolated form (our block on the primary's input) or a
    replayed one (the primary's block on the candidate's input) each measured against the
    other reference's stage."""
    stage, found = cell.family.reference_stage(row.stage), []
    for name, other in cell.others.items():
        if row.kind is None or not other.has(stage):
            continue
        against, problems = compare_stage(other, cell.candidate, row.cand_stage, stage,
                                          row.kind, stage_kinds(other, cell.family).get(stage))
        if not problems and closer(against, measured, row.kind):
            found.append((-against["token_match"] if row.kind == StageKind.DOCUMENT
                          else against["nmse"], name))
    return "; ".join(name for _, name in sorted(found)) or None


def _row(cell: Cell, row: Planned, gates: Mapping[str, Any], labels: Mapping[str, str]
         ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One row of the cell (:data:`COLUMNS`, labels first, extra labels after them), and the
    metrics it was judged on (None where not compared)."""
    measured = None
    state, problems = availability(cell, row)
    if state == "ok":
        measured, problems = compare_stage(row.against, cell.candidate, row.cand_stage,
                                           row.ref_stage, row.kind, row.ref_kind)
        if measured is not None and row.kind == StageKind.DOCUMENT:
            _add_known_text(cell, row, measured)
    verdict = status(row.stage, gates, availability=state, metrics=measured, problems=problems)
    values = {key: labels.get(key) for key in LABEL_COLUMNS}
    values["against"] = labels.get("against", REFERENCE)
    values.update({key: value for key, value in labels.items() if key not in values})
    values.update(stage=row.stage, status=verdict.status)
    values.update({key: (measured or {}).get(key) for key in METRIC_COLUMNS})
    values.update(_cost(cell, row, measured))
    values.update(_storage(cell))
    values.update(gate=verdict.gate, reason=_reason(cell, row, verdict, measured),
                  closer_to=(_closer_to(cell, row, measured)
                             if state == "ok" and not problems else None),
                  seconds=cell.seconds.get(row.stage), first_bad_op=None, culprit=None)
    return {key: _json_value(value) for key, value in values.items()}, measured


def _judged(cell: Cell, gates: Mapping[str, Any], labels: Mapping[str, str]
            ) -> list[dict[str, Any]]:
    """The rows of the cell's plan, in its order; the ``carried_noise`` rule's source stage
    judged first, the reference's noise floor then moving the bounds of the stages it names
    (:mod:`audioparity.compare.scaling`)."""
    source = (gates.get(CARRIED_NOISE) or {}).get("from")
    rows: list[dict[str, Any]] = [{} for _ in cell.plan]
    floor = None
    for i in sorted(range(len(cell.plan)), key=lambda i: cell.plan[i].stage != source):
        row = cell.plan[i]
        rows[i], measured = _row(cell, row, carry_noise(gates, row.stage, floor), labels)
        if row.stage in (floor or {}).get("moved", ()) and rows[i]["status"] != "pass":
            rows[i]["reason"] += (f"; the reference's own {row.stage} moves on its "
                                  f"{floor['from']} computed more exactly (undecided at "
                                  "float32 noise on this case)")
        floor = floor or noise_floor(gates, cell.reference.manifest, row.stage,
                                     rows[i]["status"], measured)
    return rows


def compare_cell(dumps: CellDumps, gates: Mapping[str, Any], labels: Mapping[str, str],
                 output: str | os.PathLike, known_text: str | None = None,
                 extra: Callable[[Cell, Mapping[str, str], Mapping[str, Any]],
                                 list[dict[str, Any]]] | None = None) -> None:
    """Compare a candidate dump with its reference dump and write the cell's rows as JSON.

    Args:
        dumps: the cell's dumps (:class:`~audioparity.compare.plan.CellDumps`). The candidate's
            absent: every reference stage is ``missing``; its manifest status ``unavailable`` /
            ``crashed``: every stage takes that status, with the manifest's message as the
            reason (:data:`RULES`). The replay of the candidate, where given: each candidate
            stage with a replayed form gets a row named by that form, the candidate's stage
            measured against the replay's; a form the replay could not write is ``missing``,
            with the replay's reason. The cost, where the reference is quantization-aware (the
            cell's weight type emulated): the float32 reference, against which each compared
            row gets :data:`COST_COLUMNS`. The other references: every compared row is measured
            against each too, and names those it is measurably closer to than to the primary
            (``closer_to``).
        gates: the cell's resolved gates (:func:`audioparity.compare.gate_lists.resolve_gates`).
        labels: copied into every row (``family``, ``model``, ``case``, ``candidate``,
            ``backend``, ``weight_type``); ``family`` also says which stage an isolated form
            compares against
            (:meth:`audioparity.contract.spec.FamilySpec.reference_stage`) and each stage's kind.
        output: the cell file: a JSON list of rows with the keys :data:`COLUMNS` (labels first;
            labels beyond :data:`LABEL_COLUMNS` are kept after them, summary.csv drops them),
            non-finite metrics written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
        known_text: what was said in the case's audio: each document row with a ``text`` gets
            ``wer_known`` and ``ref_wer_known``
            (:func:`~audioparity.compare.documents.known_text_metrics`).
        extra: rows the cell adds, from the cell, its labels and gates: for a cell of a
            precision recipe's weight type, the row of the recipe's targets
            (:func:`~audioparity.compare.targets.recipe_row`).

    With an ``against`` label other than ``reference`` (a backend's name), the reference dump is
    the same candidate's dump on that backend and every stage, an isolated form too, is
    compared with the stage of the same name there.

    Raises:
        AudioparityError: unreadable dumps, malformed gates, a stage with no gate or with a
            threshold that does not apply to it.
    """
    check_resolved(gates)
    cell = open_cell(dumps, labels, known_text)
    gates = for_length(gates, case_lengths(cell.reference, gates))
    rows = [*_storage_rows(cell, labels, gates), *_judged(cell, gates, labels)]
    if extra is not None:
        rows.extend(extra(cell, labels, gates))
    write_text_atomic(Path(output), json.dumps(rows, indent=1, allow_nan=False) + "\n")
    counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    log.info("compare %s vs %s: %s", cell.candidate_path, cell.reference.path, counts)


def read_cell(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of one cell file written by :func:`compare_cell`.

    Raises:
        AudioparityError: unreadable JSON, not a list of objects, or a row lacking a column or
            a label (names the file, the row and the key).
    """
    path = Path(path)
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AudioparityError(f"{path}: unreadable cell file ({err})") from err
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise AudioparityError(f"{path}: expected a JSON list of row objects")
    for i, row in enumerate(rows):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise AudioparityError(f"{path}: row {i} lacks column(s) {', '.join(missing)}")
        empty = [c for c in KEY_COLUMNS if not isinstance(row[c], str) or not row[c]]
        if empty:
            raise AudioparityError(
                f"{path}: row {i} has no value for {', '.join(empty)} "
                "(pass them to `audioparity compare --label KEY=VALUE`)"
            )
    return rows
