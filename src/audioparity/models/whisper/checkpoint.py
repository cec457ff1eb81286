"""The Whisper encoder's tensors in a Hugging Face checkpoint: names, expected shapes and checks,
read without torch or ggml (both sides run :func:`check_weights` first, so both refuse a bad
checkpoint with the same message).

Reads ``model.safetensors`` or the shards of ``model.safetensors.index.json``
(:mod:`audioparity.checkpoints.safetensors`; f16 and bf16 widened to float32 exactly), a block of
rows at a time. Names here are ``WhisperEncoder``'s own ``state_dict`` keys (``conv1.weight``,
``layers.{i}.self_attn.q_proj.weight``, ...); in the checkpoint they carry the prefix of the
class that saved it: ``model.encoder.`` (``WhisperForConditionalGeneration``) or ``encoder.``
(``WhisperModel``). Only the encoder's tensors are read; the decoder's are left alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.safetensors import Entry, checkpoint_entries
from audioparity.errors import AudioparityError
from audioparity.models.whisper.config import WhisperEncoderConfig

#: Key prefixes of the encoder, by the class that saves it, tried in this order.
PREFIXES = {"model.encoder.": "WhisperForConditionalGeneration", "encoder.": "WhisperModel"}


def expected_shapes(config: WhisperEncoderConfig) -> dict[str, tuple[int, ...]]:
    """``WhisperEncoder`` parameter name -> numpy shape, from the config, in the module's order.

    ``conv1``/``conv2``: ``Conv1d`` kernels ``[out, in, 3]`` and biases; ``embed_positions``
    ``[max_source_positions, D]``; per ``WhisperEncoderLayer``: ``self_attn`` ``q_proj``,
    ``v_proj``, ``out_proj`` with biases and ``k_proj`` without one (``bias=False`` in
    ``WhisperAttention``), the two LayerNorms, ``fc1`` ``[ffn, D]``, ``fc2`` ``[D, ffn]``; the
    final ``layer_norm``.
    """
    enc = config.encoder
    d, ffn = enc.d_model, enc.encoder_ffn_dim
    shapes: dict[str, tuple[int, ...]] = {
        "conv1.weight": (d, enc.num_mel_bins, 3),
        "conv1.bias": (d,),
        "conv2.weight": (d, d, 3),
        "conv2.bias": (d,),
        "embed_positions.weight": (enc.max_source_positions, d),
    }
    for i in range(enc.encoder_layers):
        p = f"layers.{i}."
        shapes.update({
            p + "self_attn.k_proj.weight": (d, d),
            p + "self_attn.v_proj.weight": (d, d),
            p + "self_attn.v_proj.bias": (d,),
            p + "self_attn.q_proj.weight": (d, d),
            p + "self_attn.q_proj.bias": (d,),
            p + "self_attn.out_proj.weight": (d, d),
            p + "self_attn.out_proj.bias": (d,),
            p + "self_attn_layer_norm.weight": (d,),
            p + "self_attn_layer_norm.bias": (d,),
            p + "fc1.weight": (ffn, d),
            p + "fc1.bias": (ffn,),
            p + "fc2.weight": (d, ffn),
            p + "fc2.bias": (d,),
            p + "final_layer_norm.weight": (d,),
            p + "final_layer_norm.bias": (d,),
        })
    shapes["layer_norm.weight"] = (d,)
    shapes["layer_norm.bias"] = (d,)
    return shapes


@dataclass(frozen=True)
class EncoderTensors:
    """The checkpoint entries of every encoder tensor, checked present and shaped.

    Attributes:
        model: the checkpoint directory.
        prefix: the key prefix of the encoder in the checkpoint (:data:`PREFIXES`).
        entries: ``WhisperEncoder`` name -> safetensors entry, in :func:`expected_shapes` order.
    """

    model: Path
    prefix: str
    entries: dict[str, Entry]

    @property
    def native(self) -> dict[str, str]:
        """Name -> stored dtype ``f32|f16|bf16``.

        Raises:
            AudioparityError: a dtype other than F32, F16, BF16.
        """
        return {name: entry.kind for name, entry in self.entries.items()}

    def blocks(self) -> Iterator[tuple[str, int, np.ndarray]]:
        """``(name, first row, float32 rows)`` of every tensor, a block at a time
        (:meth:`~audioparity.checkpoints.safetensors.Entry.blocks`), each checked finite.

        Raises:
            AudioparityError: an unsupported dtype, a short read, or a tensor holding NaN or
                infinity (named with its checkpoint key and the counts).
        """
        for name, entry in self.entries.items():
            for first, block in entry.blocks(self.model):
                yield name, first, block
                del block


def encoder_prefix(model_dir: Path, keys) -> str:
    """The prefix under which ``keys`` (a checkpoint's tensor names) hold the encoder: the one
    of :data:`PREFIXES` whose ``conv1.weight`` is present.

    Raises:
        AudioparityError: no prefix holds ``conv1.weight``, or both do.
    """
    found = [prefix for prefix in PREFIXES if prefix + "conv1.weight" in keys]
    if len(found) != 1:
        expected = " or ".join(f"'{prefix}conv1.weight' ({cls})" for prefix, cls in
                               PREFIXES.items())
        what = "both" if found else "neither"
        raise AudioparityError(f"{model_dir}: holds {what} of {expected}; expected the tensors "
                               "of one Whisper encoder")
    return found[0]


def checked_entries(model_dir: Path, config: WhisperEncoderConfig) -> EncoderTensors:
    """The encoder's tensors of ``model_dir`` after the headers showed every one present with
    the config's shape; no tensor data is read.

    Raises:
        AudioparityError: unreadable safetensors files (see
            :func:`~audioparity.checkpoints.safetensors.checkpoint_entries`), no encoder, a
            missing tensor or one of another shape (naming the checkpoint key and the shapes).
    """
    model_dir = Path(model_dir)
    entries = checkpoint_entries(model_dir)
    prefix = encoder_prefix(model_dir, entries)
    shapes = expected_shapes(config)
    missing = [name for name in shapes if prefix + name not in entries]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise AudioparityError(f"{model_dir}: missing tensor {prefix + missing[0]!r}{more}; "
                               f"expected shape {list(shapes[missing[0]])}")
    for name, shape in shapes.items():
        if entries[prefix + name].shape != shape:
            raise AudioparityError(f"{model_dir}: tensor {prefix + name!r} has shape "
                                   f"{list(entries[prefix + name].shape)}, expected "
                                   f"{list(shape)}")
    return EncoderTensors(model_dir, prefix, {name: entries[prefix + name] for name in shapes})


def read_weights(model_dir: Path, config: WhisperEncoderConfig) -> dict[str, np.ndarray]:
    """Every encoder tensor as a float32 array, ``WhisperEncoder`` names (for tests and
    analysis; the dump streams them into ggml, :mod:`.weights`).

    Raises:
        AudioparityError: see :func:`check_weights`.
    """
    tensors = checked_entries(model_dir, config)
    arrays = {name: np.empty(entry.shape, np.float32) for name, entry in tensors.entries.items()}
    for name, first, block in tensors.blocks():
        arrays[name][first:first + len(block)] = block
    return arrays


def check_weights(model_dir: Path, config: WhisperEncoderConfig) -> None:
    """The checks of the ggml upload, reading a block at a time and keeping none: every
    encoder tensor present with the config's shape, of a float dtype, finite. The reference
    dump runs them before transformers loads the checkpoint, so both sides refuse a bad one
    with the same message.

    Raises:
        AudioparityError: see :func:`checked_entries` and :meth:`EncoderTensors.blocks`.
    """
    for _ in checked_entries(model_dir, config).blocks():
        pass
