"""Compare one cell: a candidate dump (one backend, one weight type) against its reference dump.

Tensors and documents are compared generically, by name, so every family uses the same code:
Parakeet-TDT's ``mel_features`` ... ``joint_logits`` and ``decode``, MOSS's ``last_hidden``,
``probe_hidden``, head logits, ``generation`` and ``prompt`` alike.

Auxiliary tensors: a tensor ``<doc>_margins`` in a dump that also holds the document ``<doc>``
belongs to that document and is not a stage of its own (no row, no gate). It holds one decision
margin per position of the document (``[positions]``) or per value of a position
(``[positions, values]``, e.g. MOSS's ``generation_margins`` ``[rows, 1+n_vq]``): the chosen
logit minus the runner-up, ``+inf`` where the value was forced, NaN where the logits were not
finite. The reference's margins give the document row its ``logit_gap``
(:func:`audioparity.compare.metrics.logit_gap` at the first divergence); the candidate's give
its ``non_finite`` (decisions taken on non-finite logits, which fail the stage as any NaN does).
Comparing the margins themselves as a tensor would be ill-posed: they are differences of nearly
equal logits (cancellation amplifies their relative error), after the first divergence they
belong to different sequences, and the logits they come from are gated as ``*_logits`` stages.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import CRASHED_IN, Dump, base_layout, same_layout, write_text_atomic
from audioparity.compare import metrics as m
from audioparity.compare.gates import check_resolved, status
from audioparity.errors import AudioparityError
from audioparity.families import (
    isolated_form,
    on_reference_path,
    reference_stage,
    registered,
    replayed_form,
    stage_key,
)
from audioparity.vocabulary import VIEWS

log = logging.getLogger(__name__)

#: Cell labels, in summary order (docs/design.md, "summary.csv"). ``against`` is what the
#: candidate is compared with: ``reference`` (the PyTorch/NeMo dump), or a backend (``cpu``):
#: the same candidate and weight type computed there.
LABEL_COLUMNS = ("family", "model", "case", "candidate", "backend", "weight_type", "against")
#: The ``against`` label of a comparison with the reference dump.
REFERENCE = "reference"
#: Metric columns, in summary order; None where a metric does not apply to a stage.
METRIC_COLUMNS = (
    "cosine", "std_ratio", "nmse", "max_abs", "mean_abs", "max_rel", "non_finite", "argmax",
    "top1", "kl", "token_match", "first_divergence", "logit_gap", "wer",
)
#: The cost of a weight type: the candidate measured against the float32 reference, where a
#: quantized cell's own reference is a quantization-aware one (``audioparity.storage``); empty
#: for a stage whose rows follow the reference's own decisions (``Stage.reference_path``), and
#: where the two do not line up.
COST_COLUMNS = ("cost_nmse", "cost_cosine", "cost_token_match")
#: Every column of a cell row and of summary.csv; ``first_bad_op`` is filled by a drill-down
#: (:mod:`audioparity.drilldown`) on the failing rows of a comparison with another backend,
#: ``culprit`` by the summary on every row of a cell that has one
#: (:mod:`audioparity.report.culprit`).
COLUMNS = (*LABEL_COLUMNS, "stage", "status", *METRIC_COLUMNS, *COST_COLUMNS, "gate", "reason",
           "seconds", "first_bad_op", "culprit")

#: A tensor named ``<document><MARGINS>`` is the document's auxiliary margins (module notes).
MARGINS = "_margins"


def _margins_name(dump: Dump, document: str) -> str | None:
    """The name of ``document``'s auxiliary margins tensor in ``dump``, None if it has none."""
    name = document + MARGINS
    return name if dump.has(name) else None


def _stages(dump: Dump) -> dict[str, str]:
    """Stage name -> ``tensor`` or ``document`` for everything a dump lists, less the
    documents' auxiliary tensors (module notes)."""
    documents = list(dump.manifest.get("documents", {}))
    auxiliary = {document + MARGINS for document in documents}
    kinds = {name: "tensor" for name in dump.tensor_names if name not in auxiliary}
    kinds.update({name: "document" for name in documents})
    return kinds


def tensor_metrics(stage: str, cand: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """Every tensor metric of ``cand`` against ``ref`` (equal shapes), plus ``ref_non_finite``.

    ``top1`` and ``kl`` only for logits (a stage name containing ``logits``; last axis =
    classes), None otherwise.
    """
    logits = "logits" in stage
    return {
        "cosine": m.cosine(cand, ref),
        "std_ratio": m.std_ratio(cand, ref),
        "nmse": m.nmse(cand, ref),
        "max_abs": m.max_abs(cand, ref),
        "mean_abs": m.mean_abs(cand, ref),
        "max_rel": m.max_rel(cand, ref),
        "non_finite": m.non_finite(cand, ref),
        "argmax": m.argmax(cand, ref),
        "top1": m.top1(cand, ref) if logits else None,
        "kl": m.kl(cand, ref) if logits else None,
        "ref_non_finite": m.non_finite(ref, cand),
        "top1_rows": m.top1_differing(cand, ref) if logits and cand.ndim == 2 else [],
    }


_ABSENT = object()


def _aligned(cand: tuple, ref: tuple) -> tuple[list, list]:
    """The values of a candidate and a reference position, list fields spread out, aligned to
    the reference's (a value the candidate lacks is a placeholder equal to nothing)."""
    cand_values, ref_values = [], []
    for c, r in zip(cand, ref, strict=True):
        r = r if isinstance(r, list) else [r]
        c = c if isinstance(c, list) else [c]
        ref_values.extend(r)
        cand_values.extend(c[i] if i < len(c) else _ABSENT for i in range(len(r)))
    return cand_values, ref_values


def _check_margins(margins: np.ndarray, positions: list[tuple]) -> None:
    """Raise unless ``margins`` is ``[positions]`` or ``[positions, values per position]``."""
    widths = {sum(len(v) if isinstance(v, list) else 1 for v in p) for p in positions}
    fits = margins.ndim == 1 or (margins.ndim == 2 and widths <= {margins.shape[1]})
    if margins.shape[:1] != (len(positions),) or not fits:
        per = "/".join(str(w) for w in sorted(widths)) or "0"
        raise AudioparityError(
            f"margins of shape {list(margins.shape)} do not fit the document's "
            f"{len(positions)} positions of {per} values ([positions] or [positions, values])"
        )


#: The document fields each document metric reads, where it reads no others: a candidate that
#: omits them all leaves the metric not measured (the sequence metrics run over whichever list
#: fields are left).
METRIC_FIELDS = {"wer": ("text",)}


def document_metrics(
    cand: Mapping[str, Any],
    ref: Mapping[str, Any],
    *,
    omits: Sequence[str] = (),
    ref_margins: np.ndarray | None = None,
    cand_margins: np.ndarray | None = None,
) -> dict[str, Any]:
    """Token metrics of a candidate document against the reference document.

    Positions: the reference's list-valued fields (``ids``, ``frames``, ``durations``; MOSS's
    ``rows``, one generated or prompt row ``[text, code_0, ...]`` each) taken together, one
    tuple per position, so a token matches only if its id, frame and duration all match (a
    MOSS row only if every column does). ``token_match`` and ``first_divergence`` run over
    those tuples (None when the reference has no list field); ``wer`` over the ``text`` fields
    when both are strings. ``exact``: every field of the reference is identical in the
    candidate (extra candidate fields are ignored); ``differing`` names the fields that are not.

    Args:
        cand, ref: the two documents.
        omits: fields of the reference the candidate does not write (its adapter's
            ``omits``): left out of every metric; ``not_measured`` (``{metric: why}``) names
            each metric whose fields (:data:`METRIC_FIELDS`) are all left out.
        ref_margins: the reference's auxiliary margins (module notes), ``[positions]`` or
            ``[positions, values]``: ``logit_gap`` is :func:`~audioparity.compare.metrics.
            logit_gap` at the first divergence (None when there is none, or when the
            reference has no position there).
        cand_margins: the candidate's: ``non_finite`` counts its NaN (and ``-inf``) margins,
            ``argmax`` locates the first; ``+inf`` marks a forced value and is not counted.
            ``ref_non_finite`` counts the same in ``ref_margins``.

    Raises:
        AudioparityError: ``ref_margins`` does not fit the reference's positions.
    """
    ref = {key: value for key, value in ref.items() if key not in omits}
    sequence_keys = sorted(k for k, v in ref.items() if isinstance(v, list))

    def positions(doc: Mapping[str, Any]) -> list[tuple]:
        columns = [doc.get(k) if isinstance(doc.get(k), list) else [] for k in sequence_keys]
        length = max((len(c) for c in columns), default=0)
        return [tuple(c[i] if i < len(c) else _ABSENT for c in columns) for i in range(length)]

    cand_pos, ref_pos = positions(cand), positions(ref)
    texts = (cand.get("text"), ref.get("text"))
    differing = [k for k in ref if cand.get(k, _ABSENT) != ref[k]]
    divergence = m.first_divergence(cand_pos, ref_pos) if sequence_keys else None
    gap = None
    if ref_margins is not None:
        ref_margins = np.asarray(ref_margins)
        _check_margins(ref_margins, ref_pos)
        if divergence is not None and divergence < len(ref_pos):
            cand_at = (cand_pos[divergence] if divergence < len(cand_pos)
                       else (_ABSENT,) * len(sequence_keys))
            gap = m.logit_gap(*_aligned(cand_at, ref_pos[divergence]), ref_margins[divergence])
    metrics = {
        "token_match": m.token_match(cand_pos, ref_pos) if sequence_keys else None,
        "first_divergence": divergence,
        "logit_gap": gap,
        "wer": m.wer(*texts) if all(isinstance(t, str) for t in texts) else None,
        "exact": not differing,
        "differing": differing,
    }
    not_measured = {metric: f"the candidate writes no {' or '.join(fields)}"
                    for metric, fields in METRIC_FIELDS.items() if set(fields) <= set(omits)}
    if not_measured:
        metrics["not_measured"] = not_measured
    if ref_margins is not None:
        metrics["ref_non_finite"] = int(_undecided(ref_margins).sum())
    if cand_margins is not None:
        bad = _undecided(cand_margins)
        metrics["non_finite"] = int(bad.sum())
        if bad.any() and bad.ndim:
            first = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
            metrics["argmax"] = ",".join(str(int(i)) for i in first)
    return metrics


def _undecided(margins: np.ndarray) -> np.ndarray:
    """Mask of the margins that are neither finite nor ``+inf`` (forced): decisions taken on
    non-finite logits."""
    margins = np.asarray(margins, dtype=np.float64)
    return np.isnan(margins) | np.isneginf(margins)


def _document(dump: Dump, name: str) -> Mapping[str, Any]:
    document = dump.json(name)
    if not isinstance(document, Mapping):
        raise AudioparityError(f"{dump.path / (name + '.json')}: expected a JSON object")
    return document


def _compare_stage(
    reference: Dump, candidate: Dump, stage: str, ref_stage: str, kind: str, ref_kind: str
) -> tuple[dict[str, Any] | None, tuple[str, ...]]:
    """Metrics of one candidate stage against its reference stage, and outright problems."""
    if kind != ref_kind:
        return None, (f"candidate {stage!r} is a {kind}, reference {ref_stage!r} a {ref_kind}",)
    if kind == "document":
        margins = {}
        for key, dump, name in (("ref_margins", reference, ref_stage),
                                ("cand_margins", candidate, stage)):
            tensor = _margins_name(dump, name)
            if tensor is not None:
                margins[key] = dump.tensor(tensor)
        try:
            metrics = document_metrics(_document(candidate, stage), _document(reference, ref_stage),
                                       omits=conventions(candidate, stage).get("omits", []),
                                       **margins)
        except AudioparityError as err:
            raise AudioparityError(f"{reference.path}: {ref_stage}{MARGINS}: {err}") from err
        return metrics, ()
    cand, ref = candidate.tensor(stage), reference.tensor(ref_stage)
    problems = []
    cand_layout, ref_layout = candidate.layout(stage), reference.layout(ref_stage)
    view = conventions(candidate, stage).get("view")
    if view and view != conventions(reference, ref_stage).get("view"):
        # the candidate holds a view of the stage; a reference that holds the same view (the
        # same candidate on another backend) is compared as it is
        ref = apply_view(ref, view)
        cand_layout = base_layout(cand_layout)
    if not same_layout(cand_layout, ref_layout):
        problems.append(f"layout {cand_layout} (candidate) != {ref_layout} (reference)")
    if cand.shape[1:] == ref.shape[1:] and cand.ndim and cand.shape[0] != ref.shape[0]:
        common = min(cand.shape[0], ref.shape[0])
        problems.append(f"frames: {cand.shape[0]} (candidate) != {ref.shape[0]} (reference); "
                        f"the metrics are over the first {common}")
        cand, ref = cand[:common], ref[:common]
    if cand.shape != ref.shape:
        problems.append(f"shape {list(cand.shape)} (candidate) != {list(ref.shape)} (reference)")
        return None, tuple(problems)
    return tensor_metrics(stage, cand, ref), tuple(problems)


def conventions(dump: Dump, stage: str) -> dict[str, Any]:
    """What a candidate dump declares of how its ``stage`` was computed (manifest
    ``conventions``, written when an adapter imports a third-party candidate's files):
    ``view`` (:func:`apply_view`), ``omits`` (document fields it does not write, left out of
    the comparison), ``why`` (one line, added to the cell's reason)."""
    return dump.manifest.get("conventions", {}).get(stage, {})


def not_exposed(dump: Dump, family: str | None, stage: str) -> str | None:
    """Why a candidate dump has no ``stage``, when its adapter declared that the candidate does
    not expose it (manifest ``not_exposed``: ``{stage of the family's spec: why}``, e.g. a port
    that prints only its decode); None otherwise."""
    found = registered().get(family or "")
    located = found.locate(stage) if found is not None else None
    name = located[1].name if located else stage
    return dump.manifest.get("not_exposed", {}).get(name)




def apply_view(ref: np.ndarray, view: list) -> np.ndarray:
    """The reference tensor as the candidate's holds it: each step of ``view`` in turn,
    ``["row", k]`` (row k of the first axis) or ``["log_softmax"]`` (over the last axis, every
    class together, in float64).

    Raises:
        AudioparityError: an unknown step, or a row the reference does not have.
    """
    for step in view:
        if not isinstance(step, list) or not step or step[0] not in VIEWS:
            raise AudioparityError(f"view step {step!r}: expected one of {', '.join(VIEWS)}")
        if step[0] == "row":
            if len(step) != 2 or type(step[1]) is not int or not 0 <= step[1] < len(ref):
                raise AudioparityError(f"view {step!r} of a reference of shape "
                                       f"{list(ref.shape)}")
            ref = ref[step[1]]
        else:
            rows = np.asarray(ref, dtype=np.float64).reshape(-1, ref.shape[-1])
            ref = m.log_softmax(rows).reshape(ref.shape)
    return ref


def _plan(reference: Dump, candidate: Dump | None, family: str | None,
          replay: Dump | None, same_stages: bool = False,
          ) -> list[tuple[str, str, Dump, str | None, str | None, str | None]]:
    """(row stage, candidate stage, reference-side dump, its stage or None, candidate kind or
    None, reference-side kind) per row.

    Every reference stage, then every candidate stage that is not a reference stage itself
    (an isolated form, compared with its stage as the family's spec says, or a stage the
    reference lacks; with ``same_stages``, the stage of the same name, as between two dumps of
    one candidate), then with ``replay`` each candidate stage's replayed form (the candidate's
    stage against the replay's), in the order of the candidate's stages.
    """
    ref_kinds = _stages(reference)
    cand_kinds = _stages(candidate) if candidate is not None else {}
    plan = [(name, name, reference, name, cand_kinds.get(name), kind)
            for name, kind in ref_kinds.items()]
    for name, kind in cand_kinds.items():
        if name not in ref_kinds:
            target = name if same_stages else reference_stage(family, name)
            known = target if target in ref_kinds else None
            plan.append((name, name, reference, known, kind, ref_kinds.get(target)))
    if candidate is not None and _crashed_port(candidate):
        # a crashed dump of the family's own port owes the isolated forms too
        for name in ref_kinds:
            form = isolated_form(family, name)
            if form is not None and form not in cand_kinds:
                plan.append((form, form, reference, name, None, ref_kinds[name]))
    if replay is not None:
        replay_kinds = _stages(replay)
        for name, kind in cand_kinds.items():
            form = replayed_form(family, name)
            if form is not None:
                plan.append((form, name, replay, form if form in replay_kinds else None, kind,
                             replay_kinds.get(form)))
    return plan


def _crashed_port(candidate: Dump) -> bool:
    """A crashed dump of the family's own ggml port (producer ``ggml``), whose isolated forms
    are stages it owed."""
    return candidate.status == "crashed" and candidate.manifest.get("producer") == "ggml"


def _crashed_stage(candidate: Dump | None, family: str | None, plan: list) -> str | None:
    """The row stage a crashed dump died in: the stage its manifest says it was timing
    (``crashed_in``) when that is a stage it lacks, else the first stage it lacks in pipeline
    order; None for a dump that did not crash."""
    if candidate is None or candidate.status != "crashed":
        return None
    lacking = [stage for stage, _, _, _, kind, _ in plan
               if kind is None and not not_exposed(candidate, family, stage)]
    running = candidate.manifest.get(CRASHED_IN)
    if running in lacking:
        return running
    return min(lacking, key=lambda stage: stage_key(family or "", stage), default=None)


def _cost(cost: Dump, candidate: Dump, cand_stage: str, ref_stage: str, kind: str,
          ref_kind: str) -> dict[str, Any]:
    """:data:`COST_COLUMNS` of one stage: the candidate against the float32 reference; empty
    where the two do not line up (a problem such as rows compared over a common prefix only)."""
    measured, problems = _compare_stage(cost, candidate, cand_stage, ref_stage, kind, ref_kind)
    if problems:
        return dict.fromkeys(COST_COLUMNS)
    return {f"cost_{key}": measured.get(key) for key in ("nmse", "cosine", "token_match")}


def _json_value(value: Any) -> Any:
    """Row values as strict JSON: numpy scalars unwrapped, non-finite floats as text."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def compare_cell(
    reference_dir: str | os.PathLike,
    candidate_dir: str | os.PathLike,
    gates: Mapping[str, Any],
    labels: Mapping[str, str],
    output: str | os.PathLike,
    replay_dir: str | os.PathLike | None = None,
    cost_dir: str | os.PathLike | None = None,
) -> None:
    """Compare a candidate dump with its reference dump and write the cell's rows as JSON.

    Args:
        reference_dir: the reference dump (NeMo, torch).
        candidate_dir: the candidate dump (ggml, external). Absent: every reference stage is
            ``missing``. Manifest status ``unavailable`` / ``crashed``: every stage takes that
            status, with the manifest's message as the reason.
        gates: the cell's resolved gates (:func:`audioparity.compare.gates.resolve_gates`).
        labels: copied into every row (``family``, ``model``, ``case``, ``candidate``,
            ``backend``, ``weight_type``); ``family`` also says which stage an isolated form
            compares against (:func:`audioparity.families.reference_stage`).
        output: the cell file: a JSON list of rows with the keys :data:`COLUMNS` (labels first;
            labels beyond :data:`LABEL_COLUMNS` are kept after them, summary.csv drops them),
            non-finite metrics written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
        replay_dir: the reference's replay of the candidate (the family's ``replay`` entry
            point): each candidate stage with a replayed form gets a row ``<form>``
            (``layer_3_replayed``), the candidate's stage measured against the replay's; a form
            the replay could not write is ``missing``, with the replay's reason.
        cost_dir: where ``reference_dir`` is a quantization-aware reference (the cell's weight
            type emulated), the float32 reference: each compared row gets :data:`COST_COLUMNS`,
            the candidate's stage measured against its reference stage there (None elsewhere).

    With an ``against`` label other than ``reference`` (a backend's name), ``reference_dir`` is
    the same candidate's dump on that backend and every stage, an isolated form too, is
    compared with the stage of the same name there.

    Raises:
        AudioparityError: unreadable dumps, malformed gates, a stage with no gate or with a
            threshold that does not apply to it.
    """
    check_resolved(gates)
    reference = Dump(reference_dir)
    candidate_path = Path(candidate_dir)
    candidate = Dump(candidate_path) if candidate_path.exists() else None
    replay = Dump(replay_dir) if replay_dir is not None else None
    cost = Dump(cost_dir) if cost_dir is not None else None
    seconds = candidate.manifest.get("seconds", {}) if candidate is not None else {}
    rows = []
    family = labels.get("family")
    same_stages = labels.get("against", REFERENCE) != REFERENCE
    plan = _plan(reference, candidate, family, replay, same_stages)
    crashed_in = _crashed_stage(candidate, family, plan)
    for stage, cand_stage, ref_dump, ref_stage, kind, ref_kind in plan:
        measured: dict[str, Any] | None = None
        problems: tuple[str, ...] = ()
        message = (candidate.manifest.get("message") or f"candidate {candidate.status}"
                   if candidate is not None else "")
        if candidate is None:
            availability, problems = "missing", (f"no candidate dump at {candidate_path}",)
        elif candidate.status == "unavailable":
            availability, problems = "unavailable", (message,)
        elif candidate.status == "crashed" and kind is None:
            # a crashed dump keeps the stages it finished; the one it died in is crashed, the
            # ones after it were never computed
            where = candidate.manifest.get(CRASHED_IN) or crashed_in
            availability, problems = ("crashed", (message,)) if stage == crashed_in else (
                "missing", (f"not computed: the dump crashed in {where} ({message})",))
        elif kind is None and not_exposed(candidate, family, stage):
            availability, problems = "unavailable", (not_exposed(candidate, family, stage),)
        elif kind is None and candidate.manifest.get("unreadable", {}).get(stage):
            availability = "missing"
            problems = ("the candidate's file is unreadable: "
                        f"{candidate.manifest['unreadable'][stage]}",)
        elif kind is None:
            availability, problems = "missing", (f"not in the candidate dump {candidate_path}",)
        elif ref_stage is None and ref_dump is replay:
            why = replay.manifest.get("skipped", {}).get(stage)
            availability = "missing"
            problems = (f"not replayed: {why or f'not in the replay dump {replay.path}'}",)
        elif ref_stage is None:
            availability = "missing"
            wanted = stage if same_stages else reference_stage(family, stage)
            problems = (f"no reference stage {wanted!r} in "
                        f"{reference.path}",)
        else:
            availability = "ok"
            measured, problems = _compare_stage(
                ref_dump, candidate, cand_stage, ref_stage, kind, ref_kind
            )
        verdict = status(
            stage, gates, availability=availability, metrics=measured, problems=problems
        )
        why = conventions(candidate, cand_stage).get("why") if candidate is not None else None
        row = {key: labels.get(key) for key in LABEL_COLUMNS}
        row["against"] = labels.get("against", REFERENCE)
        row.update({key: value for key, value in labels.items() if key not in row})
        row.update(stage=stage, status=verdict.status)
        row.update({key: (measured or {}).get(key) for key in METRIC_COLUMNS})
        row.update(_cost(cost, candidate, cand_stage, ref_stage, kind, ref_kind)
                   if cost is not None and measured is not None and ref_dump is reference
                   and not on_reference_path(family, ref_stage)
                   else dict.fromkeys(COST_COLUMNS))
        parts = (measured or {}).get("top1_rows")
        part = (f"top-1 differs in row(s) {', '.join(map(str, parts))} of {stage}"
                if parts and verdict.status != "pass" else "")
        reason = "; ".join(filter(None, [verdict.reason, part, why and f"compared as: {why}"]))
        row.update(gate=verdict.gate, reason=reason, seconds=seconds.get(stage),
                   first_bad_op=None, culprit=None)
        rows.append({key: _json_value(value) for key, value in row.items()})
    write_text_atomic(Path(output), json.dumps(rows, indent=1, allow_nan=False) + "\n")
    counts = {s: sum(r["status"] == s for r in rows) for s in sorted({r["status"] for r in rows})}
    log.info("compare %s vs %s: %s", candidate_path, reference.path, counts)
