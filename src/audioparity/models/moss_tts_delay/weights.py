"""Checkpoint weights for the ggml backbone: names, expected shapes, storage types, checks.

Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json`` without
torch (:mod:`audioparity.checkpoint`; bfloat16 becomes float32 exactly). Names are the
checkpoint's own (``MossTTSDelayModel`` state dict): ``language_model.embed_tokens.weight``
``[vocab_size, H]``, ``language_model.layers.{i}.*``, ``language_model.norm.weight``,
``emb_ext.{k}.weight`` ``[audio_vocab_size+1, H]``, ``lm_heads.{j}.weight`` ``[out, H]``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np

from audioparity.checkpoint import DTYPES, check_finite, checkpoint_entries
from audioparity.errors import AudioparityError
from audioparity.models.moss_tts_delay.config import MossTTSDelayConfig

#: Weight types a dump may ask for; ``native`` keeps each matrix's checkpoint dtype.
WEIGHT_TYPES = ("native", "f32", "f16", "bf16", "q8_0")


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
    entries = checkpoint_entries(model_dir)
    missing = sorted(set(shapes) - set(entries))
    if missing:
        raise AudioparityError(f"{model_dir}: missing weights {missing[:5]}"
                               f"{' ...' if len(missing) > 5 else ''}")
    for name, shape in shapes.items():
        if entries[name].shape != shape:
            raise AudioparityError(f"{model_dir}: weight {name!r} has shape "
                                   f"{list(entries[name].shape)}, expected {list(shape)}")
    for name in shapes:
        array = entries[name].read()
        check_finite(name, array, model_dir, noun="weight")
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
            types[name] = DTYPES[stored[name]][0]
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
