"""The MOSS-VoiceGenerator checkpoint's weights: names, expected shapes and checks, read
without torch or ggml (both sides run :func:`check_weights` first, so both refuse a bad
checkpoint with the same message).

Reads ``model.safetensors`` or the shards listed in ``model.safetensors.index.json``
(:mod:`audioparity.checkpoints.safetensors`; bfloat16 becomes float32 exactly), a block of rows
at a time. Names are the checkpoint's own (``MossTTSDelayModel`` state dict):
``language_model.embed_tokens.weight`` ``[vocab_size, H]``, ``language_model.layers.{i}.*``,
``language_model.norm.weight``,
``emb_ext.{k}.weight`` ``[audio_vocab_size+1, H]``, ``lm_heads.{j}.weight`` ``[out, H]``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

from audioparity.checkpoints.safetensors import Entry, checkpoint_entries
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.memory import reference_bytes, refuse_if_over
from audioparity.models.moss_voicegen import text_processor
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig


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


def checked_entries(model_dir: Path, config: MossTTSDelayConfig) -> dict[str, Entry]:
    """The checkpoint entry of every weight the backbone reads (:func:`expected_shapes` order),
    after the headers showed all present with the config's shapes; nothing else read.

    Raises:
        AudioparityError: a missing file or weight, or a shape other than the config implies.
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
    return {name: entries[name] for name in shapes}


def checked_blocks(model_dir: Path, entries: dict[str, Entry]
                    ) -> Iterator[tuple[str, int, np.ndarray]]:
    """``(name, first row, float32 rows)`` of every entry, a block at a time
    (:meth:`~audioparity.checkpoint.Entry.blocks`), each weight checked finite.

    Raises:
        AudioparityError: an unsupported dtype, a short read, or a weight holding NaN or
            infinity (named, with the counts).
    """
    for name, entry in entries.items():
        for first, block in entry.blocks(Path(model_dir), noun="weight"):
            yield name, first, block
            del block


def load_weights(model_dir: Path,
                 config: MossTTSDelayConfig) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The backbone's weights as float32 host arrays and their stored safetensors dtypes (for
    tests and analysis; the ggml dump streams them with :func:`checked_blocks`).

    Raises:
        AudioparityError: see :func:`check_weights`.
    """
    entries = checked_entries(model_dir, config)
    arrays = {name: np.empty(entry.shape, np.float32) for name, entry in entries.items()}
    for name, first, block in checked_blocks(model_dir, entries):
        arrays[name][first:first + len(block)] = block
    return arrays, {name: entry.dtype for name, entry in entries.items()}


def check_weights(model_dir: Path, config: MossTTSDelayConfig) -> None:
    """The checks the ggml side runs while its weights stream (:func:`checked_entries`,
    :func:`checked_blocks`), reading a block at a time and keeping none: the reference dump runs
    them before transformers loads the checkpoint, so both sides refuse a bad one with the same
    message.

    Raises:
        AudioparityError: a missing file or weight, a shape other than the config implies, an
            unsupported dtype, a truncated file, or a weight holding NaN or infinity (named,
            with the counts).
    """
    for _ in checked_blocks(model_dir, checked_entries(model_dir, config)):
        pass


def nonzero_pad_rows(arrays: Mapping[str, np.ndarray], config: MossTTSDelayConfig,
                     row: int | None = None) -> list[str]:
    """Names of the codebook embeddings (``emb_ext.{k}.weight`` among ``arrays``) whose pad row
    (``audio_pad_code``, or ``row`` of the given arrays) is not all zero.

    Upstream's ``nn.Embedding(..., padding_idx=None)`` does not force it: the pad row is data,
    and a port that skips pad codes is right only when this list is empty.
    """
    pad = config.audio_pad_code if row is None else row
    return [name for k in range(config.n_vq) if (name := f"emb_ext.{k}.weight") in arrays
            and np.any(arrays[name][pad] != 0)]


def check_memory(model: Path, config: MossTTSDelayConfig,
                 requests: Sequence[text_processor.Prompt], generate_rows: int,
                 emulates: bool) -> None:
    """Refuse, before torch is imported, a job that would not fit the memory free: the model
    as the reference holds it (:func:`~audioparity.dumping.memory.reference_bytes`: the stack, the
    float32 weights, their saved originals when it ``emulates`` a weight type) and the
    activations (:meth:`~.config.MossTTSDelayConfig.activation_bytes`) of the longest prompt
    and its generated rows. A prompt's rows are bounded without its tokenizer: byte-level BPE
    gives at most one token per byte of the rendered prompt, plus the ``audio_start`` row.

    Raises:
        AudioparityError: that exceeds :func:`~audioparity.dumping.memory.host_free_bytes`.
    """
    rows = max(len(text_processor.render(r).encode()) for r in requests) + 1 + generate_rows
    twice = ", twice: its quantization-aware passes keep the originals" if emulates else ""
    refuse_if_over(reference_bytes(model, emulates) + config.activation_bytes(rows),
                   f"{model}: the MOSS reference",
                   "give it more memory" + (" or fewer --emulate weight types" if emulates else ""),
                   f" (the float32 model{twice}; prompts of at most {rows} rows)")
