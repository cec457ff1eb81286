"""What the checkpoint readers share: stored values widened to float32 exactly, and the check
that weights are finite."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audioparity.contract.errors import AudioparityError


def to_float32(raw: np.ndarray, kind: str) -> np.ndarray:
    """Stored values as float32: ``bf16`` (raw ``uint16`` bits) widened exactly (bits << 16),
    ``f16`` cast (exact), ``f32`` as is (no copy). Same shape as ``raw``."""
    if kind == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


def non_finite(array: np.ndarray) -> tuple[int, int]:
    """``(NaN count, infinity count)`` of ``array``."""
    finite = np.isfinite(array)
    if finite.all():
        return 0, 0
    nan = int(np.isnan(array).sum())
    return nan, finite.size - int(finite.sum()) - nan


def check_finite(name: str, array: np.ndarray, where: Path | str, noun: str = "tensor") -> None:
    """Refuse a weight holding NaN or infinity (weights are not compared, so a bad one would
    show only as a far-off activation).

    Args:
        name: the weight's name; ``array`` its values (any shape).
        where: the checkpoint, as the message names it.
        noun: what the family's messages call a weight (``tensor``, ``weight``).

    Raises:
        AudioparityError: ``"<where>: <noun> '<name>' [shape] holds <n> NaN and <m> infinite
            values; expected finite weights"``.
    """
    raise_non_finite(name, array.shape, *non_finite(array), where, noun)


def raise_non_finite(name: str, shape: tuple[int, ...], nan: int, infinite: int,
                      where: Path | str, noun: str) -> None:
    if nan or infinite:
        raise AudioparityError(
            f"{where}: {noun} {name!r} {list(shape)} holds {nan} NaN and {infinite} infinite "
            "values; expected finite weights"
        )
