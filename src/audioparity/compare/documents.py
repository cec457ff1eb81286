"""A candidate's JSON document against the reference's, position by position
(:func:`document_metrics`), with the reference's decision margins where the two part.

A document's auxiliary margins (the tensor ``<document>_margins``, module notes of
:mod:`audioparity.compare.cell`) hold one decision margin per position (``[positions]``) or per
value of a position (``[positions, values]``): the chosen logit minus the runner-up, ``+inf``
where the value was forced, NaN where the logits were not finite.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from audioparity.compare import sequences
from audioparity.contract.errors import AudioparityError

_ABSENT = object()

#: The document fields each document metric reads, where it reads no others: a candidate that
#: omits them all leaves the metric not measured (the sequence metrics run over whichever list
#: fields are left).
METRIC_FIELDS = {"wer": ("text",)}


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


def _positions(document: Mapping[str, Any], keys: Sequence[str]) -> list[tuple]:
    """One tuple per position of the list fields ``keys`` taken together (a field shorter than
    the longest, or absent, holds a placeholder equal to nothing there)."""
    columns = [document.get(k) if isinstance(document.get(k), list) else [] for k in keys]
    length = max((len(c) for c in columns), default=0)
    return [tuple(c[i] if i < len(c) else _ABSENT for c in columns) for i in range(length)]


def _gap(cand_pos: list[tuple], ref_pos: list[tuple], divergence: int | None,
         ref_margins: np.ndarray | None) -> float | None:
    """:func:`~audioparity.compare.sequences.logit_gap` at the first divergence; None without
    margins, without a divergence, or where the reference has no position there.

    Raises:
        AudioparityError: ``ref_margins`` does not fit the reference's positions.
    """
    if ref_margins is None:
        return None
    ref_margins = np.asarray(ref_margins)
    _check_margins(ref_margins, ref_pos)
    if divergence is None or divergence >= len(ref_pos):
        return None
    cand_at = (cand_pos[divergence] if divergence < len(cand_pos)
               else (_ABSENT,) * len(ref_pos[divergence]))
    return sequences.logit_gap(*_aligned(cand_at, ref_pos[divergence]), ref_margins[divergence])


def _undecided(margins: np.ndarray) -> np.ndarray:
    """Mask of the margins that are neither finite nor ``+inf`` (forced): decisions taken on
    non-finite logits."""
    margins = np.asarray(margins, dtype=np.float64)
    return np.isnan(margins) | np.isneginf(margins)


def _margin_counts(ref_margins: np.ndarray | None, cand_margins: np.ndarray | None
                   ) -> dict[str, Any]:
    """``ref_non_finite`` and ``non_finite``: the undecided margins of each side, and
    ``argmax``, where the candidate's first one is."""
    counts: dict[str, Any] = {}
    if ref_margins is not None:
        counts["ref_non_finite"] = int(_undecided(ref_margins).sum())
    if cand_margins is not None:
        bad = _undecided(cand_margins)
        counts["non_finite"] = int(bad.sum())
        if bad.any() and bad.ndim:
            first = np.unravel_index(int(np.flatnonzero(bad)[0]), bad.shape)
            counts["argmax"] = ",".join(str(int(i)) for i in first)
    return counts


def document_metrics(
    cand: Mapping[str, Any],
    ref: Mapping[str, Any],
    *,
    omits: Sequence[str] = (),
    ref_margins: np.ndarray | None = None,
    cand_margins: np.ndarray | None = None,
) -> dict[str, Any]:
    """Token metrics of a candidate document against the reference document.

    Positions: the reference's list-valued fields (a decode's ``ids``, ``frames``,
    ``durations``; a generation's ``rows``, one row ``[text, code_0, ...]`` each) taken
    together, one tuple per position, so a token matches only if every field matches there.
    ``token_match`` and ``first_divergence`` run over those tuples (None when the reference
    has no list field); ``wer`` over the ``text`` fields when both are strings. ``exact``:
    every field of the reference is identical in the candidate (extra candidate fields are
    ignored); ``differing`` names the fields that are not.

    Args:
        cand, ref: the two documents.
        omits: fields of the reference the candidate does not write (its adapter's
            ``omits``): left out of every metric; ``not_measured`` (``{metric: why}``) names
            each metric whose fields (:data:`METRIC_FIELDS`) are all left out.
        ref_margins: the reference's auxiliary margins (module notes), ``[positions]`` or
            ``[positions, values]``: ``logit_gap`` is the reference's margin at the first
            divergence (None when there is none, or the reference has no position there).
        cand_margins: the candidate's: ``non_finite`` counts its NaN (and ``-inf``) margins,
            ``argmax`` locates the first; ``+inf`` marks a forced value and is not counted.
            ``ref_non_finite`` counts the same in ``ref_margins``.

    Raises:
        AudioparityError: ``ref_margins`` does not fit the reference's positions.
    """
    ref = {key: value for key, value in ref.items() if key not in omits}
    keys = sorted(k for k, v in ref.items() if isinstance(v, list))
    cand_pos, ref_pos = _positions(cand, keys), _positions(ref, keys)
    texts = (cand.get("text"), ref.get("text"))
    differing = [k for k in ref if cand.get(k, _ABSENT) != ref[k]]
    divergence = sequences.first_divergence(cand_pos, ref_pos) if keys else None
    metrics = {
        "token_match": sequences.token_match(cand_pos, ref_pos) if keys else None,
        "first_divergence": divergence,
        "logit_gap": _gap(cand_pos, ref_pos, divergence, ref_margins),
        "wer": sequences.wer(*texts) if all(isinstance(t, str) for t in texts) else None,
        "exact": not differing,
        "differing": differing,
    }
    not_measured = {metric: f"the candidate writes no {' or '.join(fields)}"
                    for metric, fields in METRIC_FIELDS.items() if set(fields) <= set(omits)}
    if not_measured:
        metrics["not_measured"] = not_measured
    return {**metrics, **_margin_counts(ref_margins, cand_margins)}


def known_text_metrics(cand: Mapping[str, Any], ref: Mapping[str, Any], known: str
                       ) -> dict[str, float | None]:
    """Both documents' ``text`` against the known text of the case (what was said):
    ``wer_known`` the candidate's, ``ref_wer_known`` the reference's
    (:func:`~audioparity.compare.sequences.wer_known`, case and punctuation aside); None for a
    side whose document has no ``text`` string. Beside ``wer`` (candidate against reference),
    they tell a port that departs from a reference that is itself right from one that departs
    from a reference that is wrong too.

    Raises:
        AudioparityError: ``known`` holds no word.
    """
    return {key: sequences.wer_known(document["text"], known)
            if isinstance(document.get("text"), str) else None
            for key, document in (("wer_known", cand), ("ref_wer_known", ref))}
