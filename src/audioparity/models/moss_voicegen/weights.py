"""The MOSS backbone's weights in ggml: a storage type per weight, streamed from the checkpoint
(:mod:`.checkpoint`) into one ggml buffer: allocated from the headers, then filled a block of
rows at a time, so a process never holds a float32 copy of the weights beside the ggml one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.safetensors import DTYPES, Entry
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, Weights
from audioparity.models.moss_voicegen.checkpoint import (
    checked_blocks,
    checked_entries,
    nonzero_pad_rows,
)
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.vocabulary import WEIGHT_TYPES


@dataclass
class UploadedWeights:
    """The backbone's weights in ggml, and what the dump notes about them.

    Attributes:
        weights: the ggml weights (checkpoint names).
        storage: name -> ggml storage type; stored: name -> safetensors dtype.
        nonzero_pad_rows: :func:`nonzero_pad_rows` of the checkpoint.
    """

    weights: Weights
    storage: dict[str, str]
    stored: dict[str, str]
    nonzero_pad_rows: list[str]


def upload_weights(runtime: Runtime, model_dir: Path, config: MossTTSDelayConfig,
                   weight_type: str) -> UploadedWeights:
    """Stream the checked weights into ``runtime`` in their storage types
    (:func:`storage_types`): the buffer is allocated from the headers, then filled a block of
    rows at a time (:meth:`Runtime.load`), the pad rows checked on the way.

    Raises:
        AudioparityError: an unknown weight type, or see :func:`check_weights` (a bad weight is
            refused while the weights stream, before the dump computes anything).
    """
    entries = checked_entries(model_dir, config)
    storage = storage_types(entries, {name: entry.dtype for name, entry in entries.items()},
                            weight_type)
    nonzero: list[str] = []

    def blocks() -> Iterator[tuple[str, int, np.ndarray]]:
        for name, first, block in checked_blocks(model_dir, entries):
            pad = config.audio_pad_code - first
            if name.startswith("emb_ext.") and 0 <= pad < len(block):
                nonzero.extend(nonzero_pad_rows({name: block[pad:pad + 1]}, config, row=0))
            yield name, first, block
            del block

    weights = runtime.load({name: entry.shape for name, entry in entries.items()}, storage,
                           blocks())
    return UploadedWeights(weights, storage, {n: e.dtype for n, e in entries.items()}, nonzero)


def storage_types(tensors: Mapping[str, np.ndarray | Entry], stored: Mapping[str, str],
                  weight_type: str) -> dict[str, str]:
    """ggml storage type of every weight (``tensors``: arrays or checkpoint entries, only their
    shapes are read): matrices (embeddings, projections, heads) in ``weight_type``
    (``native``: the checkpoint's dtype), 1-D norm weights always ``f32`` (as llama.cpp's
    converters keep them).

    Raises:
        AudioparityError: an unknown weight type.
    """
    if weight_type not in WEIGHT_TYPES:
        raise AudioparityError(f"unknown weight type {weight_type!r}; "
                               f"valid: {', '.join(WEIGHT_TYPES)}")
    types = {}
    for name, tensor in tensors.items():
        if len(tensor.shape) == 1:
            types[name] = "f32"
        elif weight_type == "native":
            types[name] = DTYPES[stored[name]][0]
        else:
            types[name] = weight_type
    return types
