"""Compare one cell: a candidate dump (one backend, one weight type) against its reference dump.

Stages are compared by their kind (:attr:`audioparity.family.Stage.kind`, through
:data:`COMPARE`), so every family uses the same code: a ``tensor`` by its float metrics, a
``logits`` tensor by those and its top-1 agreement and KL over the classes of its last axis, a
``document`` by its positions (:mod:`audioparity.compare.documents`). A stage's kind is its
family's spec's; a stage of a family this install does not know (a summary from elsewhere) is
compared as a tensor (a ``.npy``) or a document (a ``.json``).

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
belong to different sequences, and the logits they come from are gated as logits stages.
"""

from __future__ import annotations

import json
import logging
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from audioparity.artifacts import (
    CRASHED_IN,
    OPS_ON_CPU,
    Dump,
    base_layout,
    same_layout,
    write_text_atomic,
)
from audioparity.compare import metrics as m
from audioparity.compare.documents import document_metrics, known_text_metrics
from audioparity.compare.gates import Verdict, check_resolved, status
from audioparity.compare.scaling import (
    CARRIED_NOISE,
    LENGTH_SCALING,
    carry_noise,
    for_length,
    noise_floor,
)
from audioparity.errors import AudioparityError
from audioparity.families import (
    form_of,
    on_reference_path,
    reference_stage,
    registered,
    stage_key,
    stage_kind,
)
from audioparity.vocabulary import (
    MIXES,
    RECIPE_SEPARATOR,
    STORAGE,
    STORED_WEIGHTS,
    VIEWS,
)

log = logging.getLogger(__name__)

#: Cell labels, in summary order (docs/design.md, "summary.csv"). ``against`` is what the
#: candidate is compared with: ``reference`` (the PyTorch/NeMo dump), or a backend (``cpu``):
#: the same candidate and weight type computed there.
LABEL_COLUMNS = ("family", "model", "case", "candidate", "backend", "weight_type", "against")
#: The columns that name a row: its cell's labels and its stage.
KEY_COLUMNS = (*LABEL_COLUMNS, "stage")
#: The ``against`` label of a comparison with the reference dump.
REFERENCE = "reference"
#: Metric columns, in summary order; None where a metric does not apply to a stage.
METRIC_COLUMNS = (
    "cosine", "std_ratio", "nmse", "median_row_nmse", "max_abs", "mean_abs", "max_rel",
    "non_finite", "argmax", "top1", "kl", "token_match", "first_divergence", "logit_gap", "wer",
    "wer_known", "ref_wer_known",
)
#: The cost of a weight type: the candidate measured against the float32 reference, where a
#: quantized cell's own reference is a quantization-aware one (``audioparity.storage``); empty
#: for a stage whose rows follow the reference's own decisions (``Stage.reference_path``), and
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
#: (:mod:`audioparity.drilldown`) on the failing rows of a comparison with another backend,
#: ``culprit`` by the summary on every row of a cell that has one
#: (:mod:`audioparity.report.culprit`).
COLUMNS = (*LABEL_COLUMNS, "stage", "status", *METRIC_COLUMNS, *COST_COLUMNS, *STORAGE_COLUMNS,
           "gate", "reason", "closer_to", "seconds", "first_bad_op", "culprit")

#: A tensor named ``<document><MARGINS>`` is the document's auxiliary margins (module notes).
MARGINS = "_margins"

#: Metrics and why they were not computed, or None and the problems that stopped them.
Measured = tuple[dict[str, Any] | None, tuple[str, ...]]


def _margins_name(dump: Dump, document: str) -> str | None:
    """The name of ``document``'s auxiliary margins tensor in ``dump``, None if it has none."""
    name = document + MARGINS
    return name if dump.has(name) else None


def _array_kind(family: str | None, name: str) -> str:
    """The kind of a tensor a dump holds: ``logits`` where its family's spec says so, else
    ``tensor`` (a stage of a family this install does not know included)."""
    return "logits" if stage_kind(family, name) == "logits" else "tensor"


def _stages(dump: Dump, family: str | None) -> dict[str, str]:
    """Stage name -> kind for everything a dump lists, less the documents' auxiliary tensors
    (module notes): a JSON file is a ``document``, a ``.npy`` a ``tensor`` or ``logits``
    (:func:`_array_kind`)."""
    documents = list(dump.manifest.get("documents", {}))
    auxiliary = {document + MARGINS for document in documents}
    kinds = {name: _array_kind(family, name) for name in dump.tensor_names
             if name not in auxiliary}
    kinds.update({name: "document" for name in documents})
    return kinds


def _float_metrics(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()
                   ) -> dict[str, Any]:
    """The metrics of every compared array, plus ``ref_non_finite``; no class metrics (nor
    ``decisions``)."""
    return {
        "cosine": m.cosine(cand, ref),
        "std_ratio": m.std_ratio(cand, ref),
        "nmse": m.nmse(cand, ref),
        "median_row_nmse": m.median_row_nmse(cand, ref),
        "max_abs": m.max_abs(cand, ref),
        "mean_abs": m.mean_abs(cand, ref),
        "max_rel": m.max_rel(cand, ref),
        "non_finite": m.non_finite(cand, ref),
        "argmax": m.argmax(cand, ref),
        "top1": None,
        "kl": None,
        "ref_non_finite": m.non_finite(ref, cand),
        "top1_rows": [],
        # read only by a gate with spread keys (per-feature normalised stages: mel_features)
        "spread_nmse": m.spread_nmse(cand, ref),
        "spread_max_rel": m.spread_max_rel(cand, ref),
        "near_constant": m.near_constant_features(ref),
        "features": int(ref.shape[-1]) if ref.ndim else 1,
    }


def _logits_metrics(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()
                    ) -> dict[str, Any]:
    """:func:`_float_metrics`, and over the classes of the last axis ``top1``, ``kl``,
    ``logit_gap`` (:func:`~audioparity.compare.metrics.top1_gap`: the largest reference margin
    where the top-1 flips), ``top1_flips`` (each flipped row and that margin, which a
    ``logit_gap_max`` gate names) and the rows whose top-1 differs (of a 2-D array); the top-1
    of each of a row's ``decisions`` (:data:`DECISIONS`) apart."""
    agreement = m.top1_agreement(cand, ref, decisions)
    return {**_float_metrics(cand, ref), **agreement, "kl": m.kl(cand, ref),
            "top1_rows": [row for row, _ in agreement["top1_flips"]] if cand.ndim == 2 else []}


#: The metrics of a compared array, by its stage's kind.
ARRAY_METRICS: dict[str, Callable[[np.ndarray, np.ndarray, Sequence[int]], dict[str, Any]]] = {
    "tensor": _float_metrics,
    "logits": _logits_metrics,
}


#: Manifest key of a dump whose logits rows hold several decisions: ``{stage: [sizes]}``, the
#: runs of classes of the last axis each chosen apart (a TDT joint row's ``[V+1,
#: n_durations]``: its token and its duration), which top-1 and ``logit_gap`` judge apart.
DECISIONS = "decisions"


def tensor_metrics(kind: str, cand: np.ndarray, ref: np.ndarray,
                   decisions: Sequence[int] = ()) -> dict[str, Any]:
    """Every metric of ``cand`` against ``ref`` (equal shapes) for a stage of ``kind``
    (``tensor`` or ``logits``; a logits row's ``decisions`` as :data:`DECISIONS` gives them),
    plus ``ref_non_finite``; ``top1`` and ``kl`` None for a tensor, ``top1_rows`` empty.

    Raises:
        AudioparityError: ``decisions`` that do not split the last axis.
    """
    return ARRAY_METRICS[kind](cand, ref, decisions)


def _document(dump: Dump, name: str) -> Mapping[str, Any]:
    document = dump.json(name)
    if not isinstance(document, Mapping):
        raise AudioparityError(f"{dump.path / (name + '.json')}: expected a JSON object")
    return document


def _compare_documents(reference: Dump, candidate: Dump, stage: str, ref_stage: str,
                       kind: str) -> Measured:
    """:func:`~audioparity.compare.documents.document_metrics` of a document stage, with both
    sides' margins where the dumps hold them."""
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


def _compare_arrays(reference: Dump, candidate: Dump, stage: str, ref_stage: str,
                    kind: str) -> Measured:
    """:func:`tensor_metrics` of a tensor or logits stage, the candidate's view applied to the
    reference; a layout or frame count that differs is a problem (the metrics run over the
    common frames), a shape that differs stops them."""
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
    decisions = reference.manifest.get(DECISIONS, {}).get(ref_stage, ())
    return tensor_metrics(kind, cand, ref, decisions), tuple(problems)


#: How a stage is compared, by its kind (:data:`~audioparity.vocabulary.STAGE_KINDS`).
COMPARE: dict[str, Callable[[Dump, Dump, str, str, str], Measured]] = {
    "tensor": _compare_arrays,
    "logits": _compare_arrays,
    "document": _compare_documents,
}


def compare_stage(reference: Dump, candidate: Dump, stage: str, ref_stage: str, kind: str,
                  ref_kind: str) -> Measured:
    """Metrics of one candidate stage against its reference stage, and outright problems
    (:data:`COMPARE` by the stage's kind; stages of two kinds are not compared)."""
    if kind != ref_kind:
        return None, (f"candidate {stage!r} is a {kind}, reference {ref_stage!r} a {ref_kind}",)
    return COMPARE[kind](reference, candidate, stage, ref_stage, kind)


def conventions(dump: Dump, stage: str) -> dict[str, Any]:
    """What a candidate dump declares of how its ``stage`` was computed (manifest
    ``conventions``, written when an adapter imports a third-party candidate's files):
    ``view`` (:func:`apply_view`), ``omits`` (document fields it does not write, left out of
    the comparison), ``why`` (one line, added to the cell's reason)."""
    return dump.manifest.get("conventions", {}).get(stage, {})


def not_exposed(dump: Dump, family: str | None, stage: str) -> str | None:
    """Why a candidate dump has no ``stage``, when its adapter declared that the candidate does
    not expose it (manifest ``not_exposed``: ``{stage of the family's spec: why}``, e.g. a port
    that prints only its decode), or a reference implementation skipped it (manifest
    ``skipped``, :class:`~audioparity.family.Skipped`); None otherwise."""
    known = registered().get(family or "")
    located = known.spec.locate(stage) if known is not None else None
    name = located.stage.name if located is not None else stage
    return (dump.manifest.get("not_exposed", {}).get(name)
            or dump.manifest.get("skipped", {}).get(stage))


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


class Planned(NamedTuple):
    """One row of a cell, as :func:`_plan` lays it out.

    Attributes:
        stage: the row's stage (a replayed form's row is named by the form).
        cand_stage: the candidate's stage it measures.
        against: the dump it is measured against: the reference, or the replay.
        ref_stage: the stage there, None when that dump lacks it.
        kind: the candidate stage's kind, None when the candidate lacks it.
        ref_kind: the kind of the stage ``against`` holds (None when it lacks it).
    """

    stage: str
    cand_stage: str
    against: Dump
    ref_stage: str | None
    kind: str | None
    ref_kind: str | None


@dataclass
class Cell:
    """What every row of one cell reads: its dumps and what they say."""

    reference: Dump
    candidate: Dump | None
    candidate_path: Path
    replay: Dump | None
    cost: Dump | None
    family: str | None
    #: Each candidate stage against the stage of the same name (a comparison with another
    #: backend), rather than against its reference stage.
    same_stages: bool
    plan: list[Planned] = field(default_factory=list)
    #: The row stage a crashed dump died in (:func:`_crashed_stage`).
    crashed_in: str | None = None
    #: What was said in the case's audio, where the config gives it (``text`` of a case).
    known_text: str | None = None
    #: The other references' dumps of the case, by name (a float32 cell's).
    others: Mapping[str, Dump] = field(default_factory=dict)
    #: What ``reference`` is: ``reference``, or the backend it was computed on (the cell's
    #: ``against`` label).
    against: str = "reference"

    @cached_property
    def weights_differ(self) -> str | None:
        """Where the candidate's stored weights are not the reference's quantization of them
        (:func:`stored_weights_difference`), None where they are or cannot be told."""
        if self.candidate is None or self.same_stages:
            return None
        return stored_weights_difference(self.reference, self.candidate)

    @property
    def message(self) -> str:
        """The candidate's manifest message (or its status), "" without a candidate."""
        if self.candidate is None:
            return ""
        return self.candidate.manifest.get("message") or f"candidate {self.candidate.status}"

    @property
    def seconds(self) -> Mapping[str, float]:
        """The candidate's seconds per stage."""
        return self.candidate.manifest.get("seconds", {}) if self.candidate is not None else {}

    def wanted(self, stage: str) -> str:
        """The reference stage a candidate stage is compared with."""
        return stage if self.same_stages else reference_stage(self.family, stage)


def _plan(cell: Cell) -> list[Planned]:
    """The rows of a cell: every reference stage; then every candidate stage that is not a
    reference stage itself (an isolated form, compared with its stage as the family's spec
    says, or a stage the reference lacks; with ``same_stages``, the stage of the same name, as
    between two dumps of one candidate); then, with a replay, each candidate stage's replayed
    form (the candidate's stage against the replay's), in the order of the candidate's stages.
    A crashed dump of the family's own port also owes the isolated forms of the reference's
    stages. Two dumps of which neither holds a stage (each died before its first, or is
    unavailable) still owe one row: the stage a dump died in, else the family's first, so the
    cell never reads as empty.
    """
    reference, family = cell.reference, cell.family
    ref_kinds = _stages(reference, family)
    cand_kinds = _stages(cell.candidate, family) if cell.candidate is not None else {}
    plan = [Planned(name, name, reference, name, cand_kinds.get(name), kind)
            for name, kind in ref_kinds.items()]
    for name, kind in cand_kinds.items():
        if name not in ref_kinds:
            target = cell.wanted(name)
            known = target if target in ref_kinds else None
            plan.append(Planned(name, name, reference, known, kind, ref_kinds.get(target)))
    if cell.candidate is not None and _crashed_port(cell.candidate):
        for name in ref_kinds:
            form = form_of(family, name, "isolated")
            if form is not None and form not in cand_kinds and form not in ref_kinds:
                plan.append(Planned(form, form, reference, name, None, ref_kinds[name]))
    if not plan:
        stage = _first_owed(cell)
        if stage is not None:
            plan.append(Planned(stage, stage, reference, None, None, None))
    if cell.replay is not None:
        replay_kinds = _stages(cell.replay, family)
        for name, kind in cand_kinds.items():
            form = form_of(family, name, "replayed")
            if form is not None:
                plan.append(Planned(form, name, cell.replay,
                                    form if form in replay_kinds else None, kind,
                                    replay_kinds.get(form)))
    return plan


def _first_owed(cell: Cell) -> str | None:
    """The stage a cell without a stage on either side owes: the one the candidate's dump, or
    else the reference's, died in; else its family's first (None for a family not registered
    here)."""
    for dump in (cell.candidate, cell.reference):
        if dump is not None and dump.manifest.get(CRASHED_IN):
            return dump.manifest[CRASHED_IN]
    known = registered().get(cell.family or "")
    return known.spec.stages[0].name if known is not None else None


def _crashed_port(candidate: Dump) -> bool:
    """A crashed dump of the family's own ggml port (producer ``ggml``), whose isolated forms
    are stages it owed."""
    return candidate.status == "crashed" and candidate.manifest.get("producer") == "ggml"


def crashed_stage(family: str | None, lacking: Sequence[str], running: str | None
                  ) -> str | None:
    """The stage a dump that died was computing, of the stages it lacks: ``running`` (the
    stage its :class:`~audioparity.artifacts.DumpWriter` named as running, a family's
    :class:`~audioparity.family.Phase`) when it lacks it, else the first it lacks in pipeline
    order (a dump that names none: a third-party tool's); None when it lacks none. The
    crashed cell's rows (:data:`RULES`) and a run again that died
    (:func:`~audioparity.compare.fresh.fresh_rows`) both charge the crash to it."""
    if running in lacking:
        return running
    return min(lacking, key=lambda stage: stage_key(family or "", stage), default=None)


def _crashed_stage(cell: Cell) -> str | None:
    """The row stage a crashed dump died in (:func:`crashed_stage` of its manifest's
    ``crashed_in``, of the stages it lacks and does not say it never exposes); None for a
    dump that did not crash."""
    candidate, family = cell.candidate, cell.family
    if candidate is None or candidate.status != "crashed":
        return None
    lacking = [row.stage for row in cell.plan
               if row.kind is None and not not_exposed(candidate, family, row.stage)]
    return crashed_stage(family, lacking, candidate.manifest.get(CRASHED_IN))


class Rule(NamedTuple):
    """A row that is not compared: when ``when(cell, row)`` holds, its status and reason."""

    when: Callable[[Cell, Planned], Any]
    status: str
    why: Callable[[Cell, Planned], str]


def _lacks(cell: Cell, row: Planned) -> bool:
    """The candidate dump lacks the row's stage."""
    return row.kind is None


def _crashed(cell: Cell, row: Planned) -> bool:
    return _lacks(cell, row) and cell.candidate.status == "crashed"


def _unreadable(cell: Cell, row: Planned) -> str | None:
    return cell.candidate.manifest.get("unreadable", {}).get(row.stage)


def lacking_dump(side: str, dump: Dump) -> str:
    """Why a stage is not compared because the dump of ``side`` (``reference``, or the
    backend a cell is compared with: ``cpu``) did not finish: ``the cpu dump crashed in
    layer_1 (exit code -6: ...)``, ``the cpu dump is unavailable (...)``. A drill-down tells
    the side of a row not compared by it (:func:`lacked_by`)."""
    where = dump.manifest.get(CRASHED_IN)
    state = f"crashed in {where}" if dump.status == "crashed" and where else (
        "crashed" if dump.status == "crashed" else f"is {dump.status}")
    return f"the {side} dump {state} ({dump.manifest.get('message') or dump.status})"


def lacked_by(reason: str, side: str) -> bool:
    """Whether a row's ``reason`` says that the dump of ``side`` lacked its stage
    (:func:`lacking_dump`), rather than the candidate's."""
    return reason.startswith(f"the {side} dump ")


def _not_replayed(cell: Cell, row: Planned) -> str:
    why = cell.replay.manifest.get("skipped", {}).get(row.stage)
    return f"not replayed: {why or f'not in the replay dump {cell.replay.path}'}"


#: The rows that are not compared, tried in order: a crashed dump keeps the stages it finished;
#: the one it died in is crashed, the others it lacks were never computed, but for those it
#: never exposes (a third-party tool's, recorded as it died).
RULES = (
    Rule(lambda cell, row: cell.candidate is None, "missing",
         lambda cell, row: f"no candidate dump at {cell.candidate_path}"),
    Rule(lambda cell, row: cell.candidate.status == "unavailable", "unavailable",
         lambda cell, row: cell.message),
    Rule(lambda cell, row: _crashed(cell, row) and row.stage == cell.crashed_in, "crashed",
         lambda cell, row: cell.message),
    Rule(lambda cell, row: _lacks(cell, row) and not_exposed(cell.candidate, cell.family,
                                                             row.stage),
         "unavailable", lambda cell, row: not_exposed(cell.candidate, cell.family, row.stage)),
    Rule(_crashed, "missing",
         lambda cell, row: "not computed: the dump crashed in "
                           f"{cell.crashed_in or cell.candidate.manifest.get(CRASHED_IN)} "
                           f"({cell.message})"),
    Rule(lambda cell, row: _lacks(cell, row) and _unreadable(cell, row), "missing",
         lambda cell, row: f"the candidate's file is unreadable: {_unreadable(cell, row)}"),
    Rule(_lacks, "missing",
         lambda cell, row: f"not in the candidate dump {cell.candidate_path}"),
    Rule(lambda cell, row: row.ref_stage is None and row.against is cell.replay, "missing",
         _not_replayed),
    Rule(lambda cell, row: row.ref_stage is None and cell.reference.status != "ok", "missing",
         lambda cell, row: f"{lacking_dump(cell.against, cell.reference)}: it has no "
                           f"{cell.wanted(row.stage)!r}"),
    Rule(lambda cell, row: row.ref_stage is None, "missing",
         lambda cell, row: f"no reference stage {cell.wanted(row.stage)!r} in "
                           f"{cell.reference.path}"),
)


def availability(cell: Cell, row: Planned) -> tuple[str, tuple[str, ...]]:
    """``ok``, or the status of a row that is not compared and why (the first of
    :data:`RULES` that holds)."""
    for rule in RULES:
        if rule.when(cell, row):
            return rule.status, (rule.why(cell, row),)
    return "ok", ()


def _cost(cell: Cell, row: Planned, measured: dict[str, Any] | None) -> dict[str, Any]:
    """:data:`COST_COLUMNS` of one row: the candidate against the float32 reference, for a
    compared row of a quantized cell; empty elsewhere, and where the two do not line up (a
    problem such as rows compared over a common prefix only)."""
    if (cell.cost is None or measured is None or row.against is not cell.reference
            or on_reference_path(cell.family, row.ref_stage)):
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
    :data:`~audioparity.artifacts.OPS_ON_CPU`), as a line: ``on the CPU, not cuda:
    FLASH_ATTN_EXT (4 nodes)``; empty where there were none."""
    ops = [f"{e['op']} ({e['count']} node{'s' if e['count'] != 1 else ''})"
           for e in dump.manifest.get(OPS_ON_CPU, []) if e.get("phase") == stage]
    return f"on the CPU, not {dump.manifest.get('backend')}: {', '.join(ops)}" if ops else ""


def _fixed_row(cell: Cell, labels: Mapping[str, str], gates: Mapping[str, Any], stage: str,
               rule: str, problem: str | None, reason: str) -> dict[str, Any]:
    """A row no gate list judges (:data:`~audioparity.vocabulary.STORAGE_ROWS`,
    :data:`~audioparity.vocabulary.RECIPE_ROW`): ``fail`` with ``problem``, else ``pass`` with
    ``reason``; a declared expected failure applies as to any stage."""
    verdict = status(stage, gates, problems=(problem,) if problem else (), rule=rule)
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
    record them (docs/quantization.md): :data:`~audioparity.vocabulary.STORAGE` (the file's
    types against the weight type asked: :func:`~audioparity.storage.storage_verdict`, the
    reference naming the model's matmul weights) and
    :data:`~audioparity.vocabulary.STORED_WEIGHTS` (the bytes against ggml's quantization of
    the checkpoint, weight by weight: :func:`stored_weights_difference`). The stages are
    the third part, the arithmetic."""
    if cell.candidate is None or cell.same_stages or cell.candidate.status != "ok":
        return []
    from audioparity.storage import EMULATED_TYPES, storage_verdict

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
        rows.append(_fixed_row(cell, labels, gates, STORAGE,
                               "the weight type asked, as the file stores it",
                               None if honoured else line, line))
    hashes = [store.get("hashes") for store in stores]
    if all(hashes):
        common = sum(name in hashes[1] for name in hashes[0])
        differ = cell.weights_differ or (None if common else (
            "no weight the reference stored is named as the candidate names its own: nothing "
            "compared (a family's reference_prefix, or its adapter's weight map?)"))
        rows.append(_fixed_row(cell, labels, gates, STORED_WEIGHTS,
                               "stored bytes: ggml's quantization of the checkpoint", differ,
                               f"{common} weights stored as ggml's quantizer stores them"))
    return rows


def stored_weights_difference(reference: Dump, candidate: Dump) -> str | None:
    """The weights both dumps stored (manifest ``storage.hashes``, one per weight) whose bytes
    differ: the first one named with its first differing block (from each dump's
    :data:`~audioparity.storage.BLOCK_HASHES`), and how many differ; None when all agree, or a
    dump recorded none (a float32 reference, a third-party port).
    """
    from audioparity.storage import BLOCK_HASHES, BLOCK_SIZES

    stores = [dump.manifest.get("storage") or {} for dump in (reference, candidate)]
    hashes = [store.get("hashes") or {} for store in stores]
    common = [name for name in hashes[0] if name in hashes[1]]
    differ = [name for name in common if hashes[0][name] != hashes[1][name]]
    if not differ:
        return None
    name = differ[0]
    ref_type, cand_type = (store.get("tensor_types", {}).get(name) for store in stores)
    if ref_type != cand_type:
        where = f"stored as {cand_type}, the reference's as {ref_type}"
    else:
        with np.load(reference.path / BLOCK_HASHES) as ref, \
                np.load(candidate.path / BLOCK_HASHES) as cand:
            ref_blocks, cand_blocks = ref[name], cand[name]
        block = int(np.argmax(ref_blocks != cand_blocks)) if len(ref_blocks) == len(
            cand_blocks) else 0
        size = BLOCK_SIZES.get(cand_type or "", 1)
        where = (f"block {block} of {len(ref_blocks)} ({cand_type}, {size} values each) "
                 "differs from ggml's quantization of the checkpoint")
    more = f" ({len(differ)} of {len(common)} weights differ)" if len(differ) > 1 else ""
    return f"stored weight {name}: {where}{more}"


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
    measured.update(known_text_metrics(_document(cell.candidate, row.cand_stage),
                                       _document(row.against, row.ref_stage), cell.known_text))


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
    metric = "token_match" if kind == "document" else "nmse"
    other, primary = to_other.get(metric), to_primary.get(metric)
    if not all(isinstance(v, int | float) and math.isfinite(v) for v in (other, primary)):
        return False
    return other > primary if kind == "document" else other * CLOSER < primary


def _closer_to(cell: Cell, row: Planned, measured: Mapping[str, Any] | None) -> str | None:
    """The other references a compared row is measurably closer to than to what it was
    measured against (``measured``; :func:`closer`), the closest first, ``"; "``-joined, None
    where none is: its stage, an isolated form (our block on the primary's input) or a
    replayed one (the primary's block on the candidate's input) each measured against the
    other reference's stage."""
    stage, found = reference_stage(cell.family, row.stage), []
    for name, other in cell.others.items():
        if row.kind is None or not other.has(stage):
            continue
        against, problems = compare_stage(other, cell.candidate, row.cand_stage, stage,
                                          row.kind, _stages(other, cell.family).get(stage))
        if not problems and closer(against, measured, row.kind):
            found.append((-against["token_match"] if row.kind == "document"
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
        if measured is not None and row.kind == "document":
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


def open_cell(reference_dir: str | os.PathLike, candidate_dir: str | os.PathLike,
              labels: Mapping[str, str], replay_dir: str | os.PathLike | None = None,
              cost_dir: str | os.PathLike | None = None, known_text: str | None = None,
              others: Mapping[str, str | os.PathLike] | None = None) -> Cell:
    """The dumps of a cell read, and its rows planned (:func:`compare_cell`'s arguments).

    Raises:
        AudioparityError: an unreadable dump.
    """
    candidate_path = Path(candidate_dir)
    reference = Dump(reference_dir)
    cell = Cell(
        reference=reference,
        candidate=Dump(candidate_path) if candidate_path.exists() else None,
        candidate_path=candidate_path,
        replay=Dump(replay_dir) if replay_dir is not None else None,
        cost=Dump(cost_dir) if cost_dir is not None else None,
        family=labels.get("family") or reference.manifest.get("family"),
        same_stages=labels.get("against", REFERENCE) != REFERENCE,
        known_text=known_text,
        others={name: Dump(path) for name, path in (others or {}).items()},
        against=labels.get("against", REFERENCE),
    )
    cell.plan = _plan(cell)
    cell.crashed_in = _crashed_stage(cell)
    return cell


def compare_cell(
    reference_dir: str | os.PathLike,
    candidate_dir: str | os.PathLike,
    gates: Mapping[str, Any],
    labels: Mapping[str, str],
    output: str | os.PathLike,
    replay_dir: str | os.PathLike | None = None,
    cost_dir: str | os.PathLike | None = None,
    known_text: str | None = None,
    others: Mapping[str, str | os.PathLike] | None = None,
    extra: Callable[[Cell, Mapping[str, str], Mapping[str, Any]], list[dict[str, Any]]]
    | None = None,
) -> None:
    """Compare a candidate dump with its reference dump and write the cell's rows as JSON.

    Args:
        reference_dir: the reference dump (NeMo, torch).
        candidate_dir: the candidate dump (ggml, external). Absent: every reference stage is
            ``missing``. Manifest status ``unavailable`` / ``crashed``: every stage takes that
            status, with the manifest's message as the reason (:data:`RULES`).
        gates: the cell's resolved gates (:func:`audioparity.compare.gates.resolve_gates`).
        labels: copied into every row (``family``, ``model``, ``case``, ``candidate``,
            ``backend``, ``weight_type``); ``family`` also says which stage an isolated form
            compares against (:func:`audioparity.families.reference_stage`) and each stage's
            kind.
        output: the cell file: a JSON list of rows with the keys :data:`COLUMNS` (labels first;
            labels beyond :data:`LABEL_COLUMNS` are kept after them, summary.csv drops them),
            non-finite metrics written as the strings ``"nan"``, ``"inf"``, ``"-inf"``.
        replay_dir: the reference's replay of the candidate (the family's ``replay``): each
            candidate stage with a replayed form gets a row named by that form, the
            candidate's stage measured against the replay's; a form the replay could not write
            is ``missing``, with the replay's reason.
        cost_dir: where ``reference_dir`` is a quantization-aware reference (the cell's weight
            type emulated), the float32 reference: each compared row gets :data:`COST_COLUMNS`,
            the candidate's stage measured against its reference stage there (None elsewhere).
        known_text: what was said in the case's audio: each document row with a ``text`` gets
            ``wer_known`` and ``ref_wer_known``
            (:func:`~audioparity.compare.documents.known_text_metrics`).
        others: the other references' dumps of the case, by name: every compared row is
            measured against each too, and names those it is measurably closer to than to the
            primary (``closer_to``).
        extra: rows the cell adds, from the cell, its labels and gates: for a cell of a
            precision recipe's weight type, the row of the recipe's targets
            (:func:`~audioparity.compare.targets.recipe_row`).

    With an ``against`` label other than ``reference`` (a backend's name), ``reference_dir`` is
    the same candidate's dump on that backend and every stage, an isolated form too, is
    compared with the stage of the same name there.

    Raises:
        AudioparityError: unreadable dumps, malformed gates, a stage with no gate or with a
            threshold that does not apply to it.
    """
    check_resolved(gates)
    cell = open_cell(reference_dir, candidate_dir, labels, replay_dir, cost_dir, known_text,
                     others)
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
