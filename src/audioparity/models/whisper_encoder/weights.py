"""Whisper encoder weights for the ggml port: the storage type of every tensor, streamed into a
ggml buffer once (:meth:`~audioparity.ggml.Runtime.load`).

Every tensor keeps its checkpoint shape (``WhisperEncoder`` names, :mod:`.checkpoint`): a
``Conv1d`` kernel ``[out, in, 3]`` is ggml ``ne [3, in, out]``, the layout ``ggml_im2col``
takes. Storage types (a property of each tensor; the graph code has no per-type branches):

- matmul weights, ``self_attn.{q,k,v,out}_proj.weight``, ``fc1.weight``, ``fc2.weight``: the
  weight type; ``native`` means the checkpoint's own dtype;
- conv kernels (``conv1``, ``conv2``): f32 (an f32 im2col and matmul, :func:`.encoder.conv1d`);
- norms, biases, ``embed_positions``: f32.

A block type that cannot hold a tensor (q8_0 needs rows of a multiple of 32 values) falls back to
f16 for that tensor, and :attr:`WhisperWeights.notes` says so.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from audioparity.artifacts import model_record
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, Weights, storage_or_fallback
from audioparity.models.whisper_encoder.checkpoint import EncoderTensors, checked_entries
from audioparity.models.whisper_encoder.config import WhisperEncoderConfig, load_config
from audioparity.vocabulary import WEIGHT_TYPES

#: The weights that enter a matmul as its first operand (``nn.Linear`` of the layers).
MATMUL = re.compile(r"\.(self_attn\.[qkv]_proj|self_attn\.out_proj|fc1|fc2)\.weight$")


def storage_types(shapes: Mapping[str, tuple[int, ...]], native: Mapping[str, str],
                  weight_type: str) -> tuple[dict[str, str], list[str]]:
    """Storage type of every weight (module docstring), and one note per fallback.

    Args:
        shapes: name -> numpy shape; native: name -> the checkpoint's dtype ``f32|f16|bf16``.
        weight_type: ``native|f32|f16|bf16|q8_0``.

    Raises:
        AudioparityError: an unknown weight type.
    """
    if weight_type not in WEIGHT_TYPES:
        raise AudioparityError(f"unknown weight type {weight_type!r}; valid: "
                               f"{', '.join(WEIGHT_TYPES)}")
    storage, notes = {}, []
    for name, shape in shapes.items():
        wanted = "f32"
        if MATMUL.search(name):
            wanted = native[name] if weight_type == "native" else weight_type
        storage[name] = storage_or_fallback(name, wanted, shape, notes)
    return storage, notes


@dataclass
class WhisperWeights:
    """The encoder's weights planned for ggml: shapes and storage types, and the checkpoint
    entries :meth:`upload` reads them from.

    Attributes:
        shapes: ``WhisperEncoder`` name -> numpy shape (the checkpoint's).
        storage: name -> ``f32|f16|bf16|q8_0``.
        native: name -> the checkpoint's dtype ``f32|f16|bf16``.
        notes: one line per storage fallback.
        tensors: the checked checkpoint entries.
    """

    shapes: dict[str, tuple[int, ...]]
    storage: dict[str, str]
    native: dict[str, str]
    tensors: EncoderTensors
    notes: list[str] = field(default_factory=list)

    def upload(self, runtime: Runtime, weights_file: Path | None = None) -> Weights:
        """Stream every weight once into ``runtime``'s backend, each in its storage type: the
        buffer is allocated from :attr:`shapes`, then each block of rows is read, checked finite,
        converted and copied before the next is read. With ``weights_file`` (:func:`save_weights`
        of the same checkpoint and type, checked when it was written) they are mapped from it
        instead (:meth:`Runtime.map`).

        Raises:
            AudioparityError: a tensor holding NaN or infinity, or a short read (see
                :func:`~.checkpoint.check_weights`), or a weights file that does not hold these
                shapes and types.
        """
        if weights_file is not None:
            return runtime.map(weights_file, self.shapes, self.storage)
        return runtime.load(self.shapes, self.storage, self.tensors.blocks())


def load_weights(model: Path, config: WhisperEncoderConfig,
                 weight_type: str = "native") -> WhisperWeights:
    """Check the encoder's tensors of checkpoint directory ``model`` from the headers and plan
    their storage; the values are read by :meth:`WhisperWeights.upload`.

    Args:
        model: the checkpoint directory.
        config: its config (the shapes are checked against it).
        weight_type: ``native|f32|f16|bf16|q8_0`` for the matmul weights.

    Raises:
        AudioparityError: an unknown weight type, an unreadable checkpoint, a missing tensor or
            one of another shape than the config's, or a dtype other than F32/F16/BF16.
    """
    tensors = checked_entries(model, config)
    shapes = {name: entry.shape for name, entry in tensors.entries.items()}
    native = tensors.native
    storage, notes = storage_types(shapes, native, weight_type)
    return WhisperWeights(shapes=shapes, storage=storage, native=native, tensors=tensors,
                          notes=notes)


def save_weights(model: Path, output: Path, weight_type: str = "native") -> None:
    """The encoder's weights at ``weight_type``, checked and converted once, written to the
    GGUF file ``output`` (:meth:`Weights.save`) for dumps to map (:meth:`WhisperWeights.upload`).

    Raises:
        AudioparityError: as :func:`load_weights` and :meth:`WhisperWeights.upload`.
    """
    with Runtime("cpu") as runtime:
        weights = load_weights(model, load_config(model), weight_type).upload(runtime)
        weights.save(output, model_record(model))
