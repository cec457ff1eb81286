"""Whisper's tensors in a Hugging Face checkpoint: names, expected shapes and checks, read
without torch or ggml (both sides run :func:`check_weights` first, so both refuse a bad
checkpoint with the same message).

Reads ``model.safetensors`` or the shards of ``model.safetensors.index.json``
(:mod:`audioparity.checkpoints.safetensors`; f16 and bf16 widened to float32 exactly), a block of
rows at a time. Names here are ``WhisperModel``'s own ``state_dict`` keys
(``encoder.conv1.weight``, ``decoder.layers.{i}.encoder_attn.k_proj.weight``, ...); in the
checkpoint they carry the prefix of the class that saved it: ``model.``
(``WhisperForConditionalGeneration``) or none (``WhisperModel``). ``proj_out.weight`` is tied to
``decoder.embed_tokens.weight`` (the config refuses an untied model) and is not read.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.safetensors import Entry, checkpoint_entries
from audioparity.contract.errors import AudioparityError
from audioparity.models.whisper.config import WhisperModelConfig

#: Key prefixes of ``WhisperModel``'s tensors, by the class that saves them, tried in this order.
PREFIXES = {"model.": "WhisperForConditionalGeneration", "": "WhisperModel"}


def _attention_shapes(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    """A ``WhisperAttention`` named ``prefix``: ``k_proj`` without a bias (``bias=False``),
    ``v_proj``, ``q_proj``, ``out_proj`` ``[D, D]`` with biases."""
    return {prefix + "k_proj.weight": (d, d),
            prefix + "v_proj.weight": (d, d), prefix + "v_proj.bias": (d,),
            prefix + "q_proj.weight": (d, d), prefix + "q_proj.bias": (d,),
            prefix + "out_proj.weight": (d, d), prefix + "out_proj.bias": (d,)}


def _norm_shapes(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    """A ``LayerNorm`` named ``prefix``: weight and bias ``[D]``."""
    return {prefix + "weight": (d,), prefix + "bias": (d,)}


def _feed_forward_shapes(prefix: str, d: int, ffn: int) -> dict[str, tuple[int, ...]]:
    """``fc1`` ``[ffn, D]`` and ``fc2`` ``[D, ffn]`` with biases."""
    return {prefix + "fc1.weight": (ffn, d), prefix + "fc1.bias": (ffn,),
            prefix + "fc2.weight": (d, ffn), prefix + "fc2.bias": (d,)}


def expected_shapes(config: WhisperModelConfig) -> dict[str, tuple[int, ...]]:
    """``WhisperModel`` parameter name -> numpy shape, from the config, in the module's order.

    Encoder: ``conv1``/``conv2`` ``Conv1d`` kernels ``[out, in, 3]`` and biases;
    ``embed_positions`` ``[max_source_positions, D]``; per ``WhisperEncoderLayer`` its
    ``self_attn``, the two LayerNorms and the feed-forward; the final ``layer_norm``.
    Decoder: ``embed_tokens`` ``[vocab_size, D]`` (also the tied ``proj_out``),
    ``embed_positions`` ``[max_target_positions, D]``; per ``WhisperDecoderLayer`` its
    ``self_attn``, ``self_attn_layer_norm``, ``encoder_attn``, ``encoder_attn_layer_norm``, the
    feed-forward and ``final_layer_norm``; the final ``layer_norm``.
    """
    enc, dec = config.encoder, config.decoder
    d = enc.d_model
    shapes: dict[str, tuple[int, ...]] = {
        "encoder.conv1.weight": (d, enc.num_mel_bins, 3),
        "encoder.conv1.bias": (d,),
        "encoder.conv2.weight": (d, d, 3),
        "encoder.conv2.bias": (d,),
        "encoder.embed_positions.weight": (enc.max_source_positions, d),
    }
    for i in range(enc.encoder_layers):
        p = f"encoder.layers.{i}."
        shapes.update({**_attention_shapes(p + "self_attn.", d),
                       **_norm_shapes(p + "self_attn_layer_norm.", d),
                       **_feed_forward_shapes(p, d, enc.encoder_ffn_dim),
                       **_norm_shapes(p + "final_layer_norm.", d)})
    shapes.update(_norm_shapes("encoder.layer_norm.", d))
    shapes["decoder.embed_tokens.weight"] = (dec.vocab_size, d)
    shapes["decoder.embed_positions.weight"] = (dec.max_target_positions, d)
    for i in range(dec.decoder_layers):
        p = f"decoder.layers.{i}."
        shapes.update({**_attention_shapes(p + "self_attn.", d),
                       **_norm_shapes(p + "self_attn_layer_norm.", d),
                       **_attention_shapes(p + "encoder_attn.", d),
                       **_norm_shapes(p + "encoder_attn_layer_norm.", d),
                       **_feed_forward_shapes(p, d, dec.decoder_ffn_dim),
                       **_norm_shapes(p + "final_layer_norm.", d)})
    shapes.update(_norm_shapes("decoder.layer_norm.", d))
    return shapes


@dataclass(frozen=True)
class WhisperTensors:
    """The checkpoint entries of every tensor of ``WhisperModel``, checked present and shaped.

    Attributes:
        model: the checkpoint directory.
        prefix: the key prefix of ``WhisperModel`` in the checkpoint (:data:`PREFIXES`).
        entries: ``WhisperModel`` name -> safetensors entry, in :func:`expected_shapes` order.
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


def model_prefix(model_dir: Path, keys) -> str:
    """The prefix under which ``keys`` (a checkpoint's tensor names) hold ``WhisperModel``: the
    one of :data:`PREFIXES` whose ``encoder.conv1.weight`` is present.

    Raises:
        AudioparityError: no prefix holds ``encoder.conv1.weight``, or both do.
    """
    found = [prefix for prefix in PREFIXES if prefix + "encoder.conv1.weight" in keys]
    if len(found) != 1:
        expected = " or ".join(f"'{prefix}encoder.conv1.weight' ({cls})" for prefix, cls in
                               PREFIXES.items())
        what = "both" if found else "neither"
        raise AudioparityError(f"{model_dir}: holds {what} of {expected}; expected the tensors "
                               "of one Whisper model")
    return found[0]


def checked_entries(model_dir: Path, config: WhisperModelConfig) -> WhisperTensors:
    """The encoder's tensors of ``model_dir`` after the headers showed every one present with
    the config's shape; no tensor data is read.

    Raises:
        AudioparityError: unreadable safetensors files (see
            :func:`~audioparity.checkpoints.safetensors.checkpoint_entries`), no encoder, a
            missing tensor or one of another shape (naming the checkpoint key and the shapes).
    """
    model_dir = Path(model_dir)
    entries = checkpoint_entries(model_dir)
    prefix = model_prefix(model_dir, entries)
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
    return WhisperTensors(model_dir, prefix, {name: entries[prefix + name] for name in shapes})


def read_weights(model_dir: Path, config: WhisperModelConfig) -> dict[str, np.ndarray]:
    """Every tensor as a float32 array, ``WhisperModel`` names (for tests and analysis; the
    dump streams them into ggml, :meth:`~audioparity.dumping.driver.upload_weights`).

    Raises:
        AudioparityError: see :func:`check_weights`.
    """
    tensors = checked_entries(model_dir, config)
    arrays = {name: np.empty(entry.shape, np.float32) for name, entry in tensors.entries.items()}
    for name, first, block in tensors.blocks():
        arrays[name][first:first + len(block)] = block
    return arrays


def check_weights(model_dir: Path, config: WhisperModelConfig) -> None:
    """The checks of the ggml upload, reading a block at a time and keeping none: every
    tensor present with the config's shape, of a float dtype, finite. The reference
    dump runs them before transformers loads the checkpoint, so both sides refuse a bad one
    with the same message.

    Raises:
        AudioparityError: see :func:`checked_entries` and :meth:`WhisperTensors.blocks`.
    """
    for _ in checked_entries(model_dir, config).blocks():
        pass
