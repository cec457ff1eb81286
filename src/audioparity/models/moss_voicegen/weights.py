"""The MOSS backbone's weights in ggml: a storage type per weight, streamed from the checkpoint
(:mod:`.checkpoint`) into one ggml buffer: allocated from the headers, then filled a block of
rows at a time, so a process never holds a float32 copy of the weights beside the ggml one.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.artifacts import model_record
from audioparity.checkpoints.safetensors import DTYPES, Entry
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, Weights
from audioparity.models.moss_voicegen.checkpoint import (
    checked_blocks,
    checked_entries,
    nonzero_pad_rows,
)
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig, load_config
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
                   weight_type: str, weights_file: Path | None = None) -> UploadedWeights:
    """Stream the checked weights into ``runtime`` in their storage types
    (:func:`storage_types`): the buffer is allocated from the headers, then filled a block of
    rows at a time (:meth:`Runtime.load`), the pad rows checked on the way. With
    ``weights_file`` (:func:`save_weights` of the same checkpoint and type, whose weights were
    checked when it was written) they are mapped from it instead (:meth:`Runtime.map`), and the
    pad rows checked as stored.

    Raises:
        AudioparityError: an unknown weight type, or see :func:`check_weights` (a bad weight is
            refused while the weights stream, before the dump computes anything), or a weights
            file that does not hold these shapes and types.
    """
    entries = checked_entries(model_dir, config)
    stored = {name: entry.dtype for name, entry in entries.items()}
    storage = storage_types(entries, stored, weight_type)
    shapes = {name: entry.shape for name, entry in entries.items()}
    pad = config.audio_pad_code
    if weights_file is not None:
        weights = runtime.map(weights_file, shapes, storage)
        nonzero = [name for name in shapes if name.startswith("emb_ext.") and nonzero_pad_rows(
            {name: weights.read(name)[pad:pad + 1]}, config, row=0)]
        return UploadedWeights(weights, storage, stored, nonzero)
    nonzero: list[str] = []

    def blocks() -> Iterator[tuple[str, int, np.ndarray]]:
        for name, first, block in checked_blocks(model_dir, entries):
            if name.startswith("emb_ext.") and 0 <= pad - first < len(block):
                nonzero.extend(nonzero_pad_rows({name: block[pad - first:pad - first + 1]},
                                                config, row=0))
            yield name, first, block
            del block

    weights = runtime.load(shapes, storage, blocks())
    return UploadedWeights(weights, storage, stored, nonzero)


def save_weights(model_dir: Path, output: Path, weight_type: str = "native") -> None:
    """The checkpoint's weights at ``weight_type``, checked and converted once, written to the
    GGUF file ``output`` (:meth:`Weights.save`) for dumps to map (:func:`upload_weights`).

    Raises:
        AudioparityError: as :func:`upload_weights` streaming them.
    """
    with Runtime("cpu") as runtime:
        upload_weights(runtime, model_dir, load_config(model_dir), weight_type).weights.save(
            output, model_record(model_dir))


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
