"""Checkpoint readers that need no torch, one module per format: :mod:`.safetensors` (Hugging
Face), :mod:`.torch_zip` (``torch.save``'s zip format, inside a NeMo ``.nemo``), :mod:`.nemo`
(the ``.nemo`` tar), :mod:`.ctranslate2` (CTranslate2's ``model.bin``; its Whisper written out
as a transformers checkpoint by :mod:`.ctranslate2_whisper`). Each tensor is read on demand and
widened to float32 exactly (:mod:`.floats`: the widening and the finite check of weights, which
they share); this module finds a checkpoint's reader. The per-family parts (key names, expected
shapes, storage types) stay in each family's package; :mod:`.renames` holds the tables between
two libraries' names.
"""

from __future__ import annotations

from pathlib import Path


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
