"""One stage of two dumps measured: each stage by its kind
(:attr:`audioparity.contract.spec.Stage.kind`, through :data:`COMPARE`), so every family uses the
same code: a ``tensor`` by its float metrics, a ``logits`` tensor by those and its top-1 agreement
and KL over the classes of its last axis, a ``document`` by its positions
(:mod:`audioparity.compare.documents`). A stage's kind is its family's spec's; a stage of a family
this install does not know (a summary from elsewhere) is compared as a tensor (a ``.npy``) or a
document (a ``.json``).

Auxiliary tensors: a tensor ``<doc>_margins`` in a dump that also holds the document ``<doc>``
belongs to that document and is not a stage of its own (no row, no gate). It holds one decision
margin per position of the document (``[positions]``) or per value of a position
(``[positions, values]``, e.g. MOSS's ``generation_margins`` ``[rows, 1+n_vq]``): the chosen
logit minus the runner-up, ``+inf`` where the value was forced, NaN where the logits were not
finite. The reference's margins give the document row its ``logit_gap``
(:func:`audioparity.compare.sequences.logit_gap` at the first divergence); the candidate's give
its ``non_finite`` (decisions taken on non-finite logits, which fail the stage as any NaN does).
Comparing the margins themselves as a tensor would be ill-posed: they are differences of nearly
equal logits (cancellation amplifies their relative error), after the first divergence they
belong to different sequences, and the logits they come from are gated as logits stages.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from audioparity.compare import metrics as m
from audioparity.compare.documents import document_metrics
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import AnySpec
from audioparity.contract.vocabulary import VIEWS, StageKind
from audioparity.dumping.artifacts import (
    Dump,
    base_layout,
    same_layout,
)

#: A tensor named ``<document><MARGINS>`` is the document's auxiliary margins (module notes).
MARGINS = "_margins"

#: Metrics and why they were not computed, or None and the problems that stopped them.
Measured = tuple[dict[str, Any] | None, tuple[str, ...]]


def _margins_name(dump: Dump, document: str) -> str | None:
    """The name of ``document``'s auxiliary margins tensor in ``dump``, None if it has none."""
    name = document + MARGINS
    return name if dump.has(name) else None


def _array_kind(family: AnySpec, name: str) -> str:
    """The kind of a tensor a dump holds: ``logits`` where its family's spec says so, else
    ``tensor`` (a stage of a family this install does not know included)."""
    return StageKind.LOGITS if family.stage_kind(name) == StageKind.LOGITS else StageKind.TENSOR


def stage_kinds(dump: Dump, family: AnySpec) -> dict[str, str]:
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


def read_document(dump: Dump, name: str) -> Mapping[str, Any]:
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
        metrics = document_metrics(read_document(candidate, stage),
                                   read_document(reference, ref_stage),
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


#: How a stage is compared, by its kind (:data:`~audioparity.contract.vocabulary.STAGE_KINDS`).
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


def not_exposed(dump: Dump, family: AnySpec, stage: str) -> str | None:
    """Why a candidate dump has no ``stage``, when its adapter declared that the candidate does
    not expose it (manifest ``not_exposed``: ``{stage of the family's spec: why}``, e.g. a port
    that prints only its decode), or a reference implementation skipped it (manifest
    ``skipped``, :class:`~audioparity.contract.family.Skipped`); None otherwise."""
    located = family.locate(stage)
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


def stored_weights_difference(reference: Dump, candidate: Dump) -> str | None:
    """The weights both dumps stored (manifest ``storage.hashes``, one per weight) whose bytes
    differ: the first one named with its first differing block (from each dump's
    :data:`~audioparity.dumping.storage.BLOCK_HASHES`), and how many differ; None when all agree, or
    a dump recorded none (a float32 reference, a third-party port).
    """
    from audioparity.dumping.storage import BLOCK_HASHES, BLOCK_SIZES

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
