"""Checkpoint weights for the ggml backbone: safetensors reading, names, storage types, checks.

Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json`` without
torch (bfloat16 becomes float32 exactly: its bits are the top half of a float32). Names are the
checkpoint's own (``MossTTSDelayModel`` state dict): ``language_model.embed_tokens.weight``
``[vocab_size, H]``, ``language_model.layers.{i}.*``, ``language_model.norm.weight``,
``emb_ext.{k}.weight`` ``[audio_vocab_size+1, H]``, ``lm_heads.{j}.weight`` ``[out, H]``.
"""

from __future__ import annotations

import json
import struct
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
            weight_map = json.loads(index.read_text())["weight_map"]
        except (OSError, json.JSONDecodeError, KeyError) as err:
            raise AudioparityError(f"{index}: unreadable shard index ({err})") from err
        return [model_dir / name for name in sorted(set(weight_map.values()))]
    single = model_dir / SINGLE_FILE
    if not single.is_file():
        raise AudioparityError(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE}")
    return [single]


def _read_shard(path: Path, names: set[str]) -> dict[str, tuple[np.ndarray, str]]:
    """The tensors of one safetensors file whose names are in ``names``, as float32 arrays
    with their stored dtype (``F32``, ``F16``, ``BF16``)."""
    out = {}
    try:
        with open(path, "rb") as handle:
            (header_size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(header_size))
    except (OSError, struct.error, json.JSONDecodeError) as err:
        raise AudioparityError(f"{path}: not a safetensors file ({err})") from err
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_size)
    for name, entry in header.items():
        if name not in names:
            continue
        dtype = entry["dtype"]
        if dtype not in DTYPES:
            raise AudioparityError(f"{path}: tensor {name!r} has dtype {dtype}; "
                                   f"expected one of {', '.join(DTYPES)}")
        begin, end = entry["data_offsets"]
        raw = np.frombuffer(data[begin:end], dtype=DTYPES[dtype][0]).reshape(entry["shape"])
        if dtype == "BF16":
            array = (raw.astype(np.uint32) << 16).view(np.float32)
        else:
            array = raw.astype(np.float32)
        out[name] = (array, dtype)
    return out


def load_weights(model_dir: Path,
                 config: MossTTSDelayConfig) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The backbone's weights as float32 arrays and their stored safetensors dtypes.

    Raises:
        AudioparityError: a missing file or weight, a shape other than the config implies, or an
            unsupported dtype.
    """
    model_dir = Path(model_dir)
    shapes = expected_shapes(config)
    found: dict[str, tuple[np.ndarray, str]] = {}
    for shard in _shards(model_dir):
        found.update(_read_shard(shard, set(shapes)))
    missing = sorted(set(shapes) - set(found))
    if missing:
        raise AudioparityError(f"{model_dir}: missing weights {missing[:5]}"
                               f"{' ...' if len(missing) > 5 else ''}")
    for name, shape in shapes.items():
        if found[name][0].shape != shape:
            raise AudioparityError(f"{model_dir}: weight {name!r} has shape "
                                   f"{list(found[name][0].shape)}, expected {list(shape)}")
    return ({name: array for name, (array, _) in found.items()},
            {name: dtype for name, (_, dtype) in found.items()})


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
