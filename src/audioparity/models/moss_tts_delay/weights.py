"""Checkpoint weights for the ggml backbone: safetensors reading, names, storage types, checks.

Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json`` without
torch (bfloat16 becomes float32 exactly: its bits are the top half of a float32). Names are the
checkpoint's own (``MossTTSDelayModel`` state dict): ``language_model.embed_tokens.weight``
``[vocab_size, H]``, ``language_model.layers.{i}.*``, ``language_model.norm.weight``,
``emb_ext.{k}.weight`` ``[audio_vocab_size+1, H]``, ``lm_heads.{j}.weight`` ``[out, H]``.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.errors import AudioparityError
from audioparity.models.moss_tts_delay.config import MossTTSDelayConfig

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype -> (numpy dtype of the stored bits, storage type name for ``native``).
DTYPES = {"F32": (np.float32, "f32"), "F16": (np.float16, "f16"), "BF16": (np.uint16, "bf16")}
#: Weight types a dump may ask for; ``native`` keeps each matrix's checkpoint dtype.
WEIGHT_TYPES = ("native", "f32", "f16", "bf16", "q8_0")

LAYER_KEYS = (
    "input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
    "self_attn.v_proj.weight", "self_attn.o_proj.weight", "self_attn.q_norm.weight",
    "self_attn.k_norm.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
    "mlp.up_proj.weight", "mlp.down_proj.weight",
)


def expected_shapes(config: MossTTSDelayConfig) -> dict[str, tuple[int, ...]]:
    """Every weight the backbone reads, with its numpy shape (``nn.Linear``: ``[out, in]``)."""
    lang = config.language_config
    hidden, hd = lang.hidden_size, lang.head_dim
    q_dim, kv_dim = lang.num_attention_heads * hd, lang.num_key_value_heads * hd
    layer = {
        "input_layernorm.weight": (hidden,),
        "self_attn.q_proj.weight": (q_dim, hidden),
        "self_attn.k_proj.weight": (kv_dim, hidden),
        "self_attn.v_proj.weight": (kv_dim, hidden),
        "self_attn.o_proj.weight": (hidden, q_dim),
        "self_attn.q_norm.weight": (hd,),
        "self_attn.k_norm.weight": (hd,),
        "post_attention_layernorm.weight": (hidden,),
        "mlp.gate_proj.weight": (lang.intermediate_size, hidden),
        "mlp.up_proj.weight": (lang.intermediate_size, hidden),
        "mlp.down_proj.weight": (hidden, lang.intermediate_size),
    }
    shapes = {"language_model.embed_tokens.weight": (lang.vocab_size, hidden),
              "language_model.norm.weight": (hidden,),
              "lm_heads.0.weight": (lang.vocab_size, hidden)}
    for i in range(lang.num_hidden_layers):
        shapes.update({f"language_model.layers.{i}.{key}": shape for key, shape in layer.items()})
    for k in range(config.n_vq):
        shapes[f"emb_ext.{k}.weight"] = (config.audio_vocab_size + 1, hidden)
        shapes[f"lm_heads.{k + 1}.weight"] = (config.audio_vocab_size + 1, hidden)
    return shapes


def _shards(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as err:
            raise AudioparityError(f"{index}: unreadable shard index ({err!r})") from err
        if not all(isinstance(name, str) and Path(name).name == name for name in files):
            raise AudioparityError(f"{index}: weight_map values must be file names")
        return [model_dir / name for name in files]
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise AudioparityError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE}")
    return [single]


@dataclass(frozen=True)
class _Entry:
    """Where one tensor lies: its shard, the byte range of its data in the file, its
    safetensors dtype and its shape."""

    shard: Path
    begin: int
    end: int
    dtype: str
    shape: tuple[int, ...]


def _entries(shard: Path, names: set[str]) -> dict[str, _Entry]:
    """Header entries of one safetensors file for the tensors named in ``names``.

    Raises:
        AudioparityError: not a safetensors file, or an entry that is malformed, of an
            unsupported dtype, of a byte size other than its shape needs, or past the file end.
    """
    try:
        size = shard.stat().st_size
        with open(shard, "rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            if 8 + header_size > size:
                raise ValueError(f"header of {header_size} bytes in a file of {size}")
            header = json.loads(handle.read(header_size))
    except (OSError, struct.error, ValueError, RecursionError) as err:
        raise AudioparityError(f"{shard}: not a safetensors file ({err})") from err
    if not isinstance(header, dict):
        raise AudioparityError(f"{shard}: not a safetensors file (header is not an object)")
    out = {}
    for name in names & set(header):
        entry = header[name]
        try:
            dtype, shape = entry["dtype"], tuple(entry["shape"])
            begin, end = entry["data_offsets"]
            if not all(type(n) is int and n >= 0 for n in (*shape, begin, end)):
                raise ValueError("negative or non-integer shape or offsets")
        except (TypeError, KeyError, ValueError) as err:
            raise AudioparityError(f"{shard}: malformed entry for {name!r} ({err})") from err
        if dtype not in DTYPES:
            raise AudioparityError(f"{shard}: tensor {name!r} has dtype {dtype}; "
                                   f"expected one of {', '.join(DTYPES)}")
        nbytes = math.prod(shape) * np.dtype(DTYPES[dtype][0]).itemsize
        if end - begin != nbytes or 8 + header_size + end > size:
            raise AudioparityError(f"{shard}: tensor {name!r} {list(shape)} {dtype} has data "
                                   f"bytes {begin}..{end} of {size - 8 - header_size}; expected "
                                   f"{nbytes} inside the file (truncated?)")
        out[name] = _Entry(shard, 8 + header_size + begin, 8 + header_size + end, dtype, shape)
    return out


def _read(entry: _Entry) -> np.ndarray:
    """One tensor as float32 (bf16 widened exactly: its bits are a float32's top half)."""
    with open(entry.shard, "rb") as handle:
        handle.seek(entry.begin)
        raw = np.frombuffer(handle.read(entry.end - entry.begin), dtype=DTYPES[entry.dtype][0])
    raw = raw.reshape(entry.shape)
    if entry.dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32)


def _checked_tensors(model_dir: Path,
                     config: MossTTSDelayConfig) -> Iterator[tuple[str, np.ndarray, str]]:
    """``(name, float32 array, safetensors dtype)`` of every weight the backbone reads, one at
    a time, after the headers showed all present with the config's shapes; each checked
    finite.

    Raises:
        AudioparityError: a missing file or weight, a shape other than the config implies, an
            unsupported dtype, a truncated file, or a weight holding NaN or infinity.
    """
    model_dir = Path(model_dir)
    shapes = expected_shapes(config)
    entries: dict[str, _Entry] = {}
    for shard in _shards(model_dir):
        entries.update(_entries(shard, set(shapes)))
    missing = sorted(set(shapes) - set(entries))
    if missing:
        raise AudioparityError(f"{model_dir}: missing weights {missing[:5]}"
                               f"{' ...' if len(missing) > 5 else ''}")
    for name, shape in shapes.items():
        if entries[name].shape != shape:
            raise AudioparityError(f"{model_dir}: weight {name!r} has shape "
                                   f"{list(entries[name].shape)}, expected {list(shape)}")
    for name in shapes:
        array = _read(entries[name])
        finite = np.isfinite(array)
        if not finite.all():
            nan = int(np.isnan(array).sum())
            raise AudioparityError(
                f"{model_dir}: weight {name!r} {list(array.shape)} holds {nan} NaN and "
                f"{finite.size - int(finite.sum()) - nan} infinite values; expected finite "
                "weights"
            )
        yield name, array, entries[name].dtype


def load_weights(model_dir: Path,
                 config: MossTTSDelayConfig) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The backbone's weights as float32 arrays and their stored safetensors dtypes.

    Raises:
        AudioparityError: see :func:`check_weights`.
    """
    arrays, stored = {}, {}
    for name, array, dtype in _checked_tensors(model_dir, config):
        arrays[name], stored[name] = array, dtype
    return arrays, stored


def check_weights(model_dir: Path, config: MossTTSDelayConfig) -> None:
    """The checks of :func:`load_weights`, reading one tensor at a time and keeping none: the
    reference dump runs them before transformers loads the checkpoint, so both sides refuse a
    bad one with the same message.

    Raises:
        AudioparityError: a missing file or weight, a shape other than the config implies, an
            unsupported dtype, a truncated file, or a weight holding NaN or infinity (named,
            with the counts).
    """
    for _ in _checked_tensors(model_dir, config):
        pass


def storage_types(arrays: dict[str, np.ndarray], stored: dict[str, str],
                  weight_type: str) -> dict[str, str]:
    """ggml storage type of every weight: matrices (embeddings, projections, heads) in
    ``weight_type`` (``native``: the checkpoint's dtype), 1-D norm weights always ``f32`` (as
    llama.cpp's converters keep them).

    Raises:
        AudioparityError: an unknown weight type.
    """
    if weight_type not in WEIGHT_TYPES:
        raise AudioparityError(f"unknown weight type {weight_type!r}; "
                               f"valid: {', '.join(WEIGHT_TYPES)}")
    types = {}
    for name, array in arrays.items():
        if array.ndim == 1:
            types[name] = "f32"
        elif weight_type == "native":
            types[name] = DTYPES[stored[name]][1]
        else:
            types[name] = weight_type
    return types


def nonzero_pad_rows(arrays: dict[str, np.ndarray], config: MossTTSDelayConfig) -> list[str]:
    """Names of the codebook embeddings whose pad row (``audio_pad_code``) is not all zero.

    Upstream's ``nn.Embedding(..., padding_idx=None)`` does not force it: the pad row is data,
    and a port that skips pad codes is right only when this list is empty.
    """
    return [f"emb_ext.{k}.weight" for k in range(config.n_vq)
            if np.any(arrays[f"emb_ext.{k}.weight"][config.audio_pad_code] != 0)]
