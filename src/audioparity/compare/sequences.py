"""Sequence metrics: decode ids, per-token tuples of ids/frames/durations and generated rows
compared position by position (:func:`token_match`, :func:`first_divergence`), the reference's
decision margin where they part (:func:`logit_gap`), and texts (WER with jiwer, :func:`wer`,
:func:`wer_known`). The tensor metrics are :mod:`.metrics`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import jiwer
import numpy as np

from audioparity.contract.errors import AudioparityError


def token_match(cand: Sequence[Any], ref: Sequence[Any]) -> float:
    """Fraction of positions whose items are equal, over the longer of the two lengths.

    Items are compared with ``==`` (ints, or tuples such as ``(id, frame, duration)``). Positions
    past the end of the shorter sequence count as unequal. Both empty: 1.
    """
    longer = max(len(cand), len(ref))
    if longer == 0:
        return 1.0
    return sum(x == y for x, y in zip(cand, ref, strict=False)) / longer


def first_divergence(cand: Sequence[Any], ref: Sequence[Any]) -> int | None:
    """Index of the first position where the sequences differ, None if they are equal.

    When one is a strict prefix of the other, the first divergence is the shorter one's length.
    """
    for i, (x, y) in enumerate(zip(cand, ref, strict=False)):
        if x != y:
            return i
    return None if len(cand) == len(ref) else min(len(cand), len(ref))


def logit_gap(cand: Sequence[Any], ref: Sequence[Any], margins: np.ndarray) -> float | None:
    """How close the reference's own decision was where the candidate decided otherwise.

    Args:
        cand, ref: the values of one position (e.g. a generated row ``[text, code_0, ...]``),
            usually the first divergent one; a value the candidate lacks counts as differing.
        margins: the reference's margin per value of ``ref`` (its chosen logit minus the
            runner-up, after any masks; ``+inf`` where the value was forced, not chosen), shape
            ``[len(ref)]``, or ``[1]`` for one margin covering the whole position.

    Returns:
        The smallest reference margin over the values that differ (the nearest tie the
        candidate broke the other way: a gap of a few ulps of the logits is rounding, a large
        one a real error); ``inf`` when only forced values differ; NaN when a margin involved is
        NaN (the reference decided on non-finite logits); None when nothing differs.

    Raises:
        AudioparityError: ``margins`` has neither one value nor one per value of ``ref``.
    """
    margins = np.asarray(margins, dtype=np.float64).reshape(-1)
    if margins.size not in (1, len(ref)):
        raise AudioparityError(
            f"logit_gap: {margins.size} margins for a position of {len(ref)} values"
        )
    differing = [i for i, value in enumerate(ref) if i >= len(cand) or cand[i] != value]
    if not differing:
        return None
    return float(np.min(margins[differing] if margins.size == len(ref) else margins))


def wer(cand: str, ref: str) -> float:
    """Word error rate of the candidate text against the reference text (``jiwer.wer``).

    Words are whitespace-separated, case and punctuation kept (both sides come from the same
    tokenizer, so any difference is a real one). Empty reference (jiwer 4's definition, made
    explicit because jiwer 3 raises): the number of candidate words (0 when both are empty).
    """
    if not ref.split():
        return float(len(cand.split()))
    if not cand.split():
        return 1.0
    return float(jiwer.wer(ref, cand))


#: What :func:`wer_known` does to both texts before counting words: a known text is written by
#: a person, with the case and punctuation a model may not produce.
_KNOWN_TEXT = jiwer.Compose([jiwer.ToLowerCase(), jiwer.RemovePunctuation(),
                             jiwer.RemoveMultipleSpaces(), jiwer.Strip()])


def wer_known(text: str, known: str) -> float:
    """Word error rate of a decoded ``text`` against the ``known`` text of the audio (what was
    said, from a transcript), both lower-cased and stripped of punctuation first
    (``jiwer.ToLowerCase``, ``jiwer.RemovePunctuation``); then :func:`wer`.

    Raises:
        AudioparityError: ``known`` holds no word (a known text must say something).
    """
    if not _KNOWN_TEXT(known).split():
        raise AudioparityError(f"known text {known!r}: no word left once lower-cased and "
                               "stripped of punctuation")
    return wer(_KNOWN_TEXT(text), _KNOWN_TEXT(known))
