"""Checkpoint readers that need no torch, one module per format: :mod:`.safetensors` (Hugging
Face), :mod:`.torch_zip` (``torch.save``'s zip format, inside a NeMo ``.nemo``), :mod:`.nemo`
(the ``.nemo`` tar), :mod:`.ctranslate2` (CTranslate2's ``model.bin``; its Whisper written out
as a transformers checkpoint by :mod:`.ctranslate2_whisper`). Each tensor is read on demand and
widened to float32 exactly; this module holds what they share: the widening and the finite check
of weights. The per-family parts (key names, expected shapes, storage types) stay in each
family's package.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from audioparity.errors import AudioparityError


def float_entries(model: Path, where: str | None = None) -> dict | None:
    """The float tensors of a checkpoint, name -> entry (``.shape``, ``.read()``), from its
    headers alone: a Hugging Face directory's F32, F16 and BF16 safetensors tensors
    (:func:`.safetensors.checkpoint_entries`, their Hugging Face names), or the tensors of an
    uncompressed ``.nemo``'s ``model_weights.ckpt``, read in place (:func:`.torch_zip.
    torch_entries`). None for a ``.nemo`` whose tar is compressed: its zip must be extracted
    before it can be read by random access.

    Raises:
        AudioparityError: an unreadable checkpoint (named as ``where``, default the model).
    """
    from audioparity.checkpoints.nemo import nemo_member_span
    from audioparity.checkpoints.safetensors import DTYPES, checkpoint_entries
    from audioparity.checkpoints.torch_zip import torch_entries

    model = Path(model)
    if model.is_dir():
        return {name: entry for name, entry in checkpoint_entries(model).items()
                if entry.dtype in DTYPES}
    span = nemo_member_span(model, "model_weights.ckpt")
    if span is None:
        return None
    return torch_entries(model, where=where or f"{model}: model_weights.ckpt", span=span)


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
