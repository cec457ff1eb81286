"""The MOSS backbone in ggml: codebook embeddings, Qwen3 decoder layers with a KV cache, heads.

Mirrors ``MossTTSDelayModel`` (OpenMOSS ``modeling_moss_tts.py``) over transformers'
``Qwen3Model`` (``modeling_qwen3.py``), one function per module, in the same order:
:func:`compute_input_embeddings` (``_compute_input_embeddings``), :func:`rms_norm`
(``Qwen3RMSNorm``), :func:`apply_rotary_pos_emb`, :func:`attention` (``Qwen3Attention``),
:func:`mlp` (``Qwen3MLP``), :func:`decoder_layer` (``Qwen3DecoderLayer``), :func:`lm_heads`.

Shapes are given in the reference's numpy order (``[S, H]``); the ggml tensors have ``ne``
reversed (``ne = [H, S]``). RoPE is NEOX style (rotate halves) with cos/sin precomputed on the
host in float64 from the absolute positions (exact; ggml's rope drifts at long positions).

KV cache: per layer, ``K`` and ``V`` tensors of numpy shape ``[max_context, kv_heads*head_dim]``
in a :class:`~audioparity.ggml.State` buffer (type ``f32`` or ``f16``, zero-filled), persistent
across graphs. A forward of ``n`` rows starting at cache position ``start`` copies its keys/values
into rows ``start..start+n-1`` (``ggml_cpy``, converting to the cache type) and attends to rows
``0..start+n-1`` read from the cache, so every read sees what the cache holds, as in llama.cpp.
The read is a view of the cache, with no data dependency on the copy: the copy is added to the
graph (:meth:`~audioparity.ggml.Graph.expand`) before the attention that reads it, and ggml runs
nodes in graph order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import ggml
import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import FLOAT_STORAGE_TYPES
from audioparity.ggml import STORAGE_TYPES, Graph, GraphCache, Runtime, State, Weights
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.models.moss_voicegen.spec import Names
from audioparity.models.moss_voicegen.stages import Forward

F32_ROW = ggml.GGML_TYPE_F32
I32 = ggml.GGML_TYPE_I32


def rope_tables(positions: np.ndarray, head_dim: int,
                theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Host cos/sin for ``apply_rotary_pos_emb`` (``Qwen3RotaryEmbedding``, default type).

    Returns ``cos`` and ``sin_signed``, float32 ``[n, 1, head_dim]`` (broadcast over heads):
    ``emb = cat(freqs, freqs)`` with ``freqs = position * theta^(-2j/head_dim)``, computed in
    float64; ``sin_signed`` carries rotate_half's sign (``-sin`` on the first half), so that
    ``x * cos + cat(x2, x1) * sin_signed == x * cos + rotate_half(x) * sin`` exactly.
    """
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    freqs = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    sign = np.concatenate([-np.ones(head_dim // 2), np.ones(head_dim // 2)])
    return (np.cos(emb)[:, None, :].astype(np.float32),
            (np.sin(emb) * sign)[:, None, :].astype(np.float32))


def causal_mask(start: int, n: int) -> np.ndarray:
    """Additive mask ``[n, start+n]`` float32: row ``i`` (position ``start+i``) sees keys
    ``0..start+i`` (0) and not the later ones (``-inf``)."""
    keys = np.arange(start + n)[None, :]
    queries = start + np.arange(n)[:, None]
    return np.where(keys <= queries, 0.0, -np.inf).astype(np.float32)


def compute_input_embeddings(ctx, w: Weights, config: MossTTSDelayConfig, ids: list):
    """``_compute_input_embeddings``: ``embed_tokens(text) + sum_k emb_ext[k](codes_k)``.

    Args:
        ids: ``1 + n_vq`` int32 tensors ``[S]``: text ids, then codebook ``k``'s codes.

    Returns:
        ``[S, H]`` (ne ``[H, S]``), summed in codebook order as upstream.
    """
    x = ggml.ggml_get_rows(ctx, w["language_model.embed_tokens.weight"], ids[0])
    for k in range(config.n_vq):
        x = ggml.ggml_add(ctx, x, ggml.ggml_get_rows(ctx, w[f"emb_ext.{k}.weight"], ids[k + 1]))
    return x


def rms_norm(ctx, x, weight, eps: float):
    """``Qwen3RMSNorm``: ``weight * x / sqrt(mean(x^2) + eps)`` over the last numpy axis."""
    return ggml.ggml_mul(ctx, ggml.ggml_rms_norm(ctx, x, eps), weight)


def apply_rotary_pos_emb(ctx, x, cos, sin_signed):
    """``apply_rotary_pos_emb`` for one of q/k: ``x * cos + rotate_half(x) * sin``.

    ``x`` ``[n, heads, head_dim]`` (ne ``[head_dim, heads, n]``, contiguous; the sizes are read
    from it); ``cos`` and ``sin_signed`` ``[n, 1, head_dim]`` from :func:`rope_tables`.
    """
    head_dim, heads, n = x.contents.ne[:3]
    half = head_dim // 2
    nb1 = ggml.ggml_row_size(F32_ROW, head_dim)
    nb2 = ggml.ggml_row_size(F32_ROW, head_dim * heads)
    x1 = ggml.ggml_view_3d(ctx, x, half, heads, n, nb1, nb2, 0)
    x2 = ggml.ggml_view_3d(ctx, x, half, heads, n, nb1, nb2, ggml.ggml_row_size(F32_ROW, half))
    rotated = ggml.ggml_concat(ctx, x2, x1, 0)
    return ggml.ggml_add(ctx, ggml.ggml_mul(ctx, x, cos), ggml.ggml_mul(ctx, rotated, sin_signed))


@dataclass
class KVCache:
    """Per-layer K/V tensors ``[max_context, kv_dim]`` (ne ``[kv_dim, max_context]``) in a
    zero-filled :class:`~audioparity.ggml.State` buffer, named ``cache.{k,v}.{layer}``."""

    tensors: State
    storage: str
    kv_dim: int
    max_context: int

    @classmethod
    def allocate(cls, runtime: Runtime, config: MossTTSDelayConfig, storage: str,
                 max_context: int) -> KVCache:
        """A cache of ``max_context`` rows per layer, stored as ``storage`` (``f32|f16``)."""
        lang = config.language_config
        kv_dim = lang.num_key_value_heads * lang.head_dim
        tensors = runtime.state({f"cache.{kind}.{i}": ((max_context, kv_dim), storage)
                                 for i in range(lang.num_hidden_layers) for kind in "kv"})
        return cls(tensors, storage, kv_dim, max_context)

    def rows(self, ctx, kind: str, layer: int, start: int, n: int):
        """View of rows ``start..start+n-1`` of layer ``layer``'s ``kind`` (``k``/``v``) cache."""
        nb1 = ggml.ggml_row_size(STORAGE_TYPES[self.storage], self.kv_dim)
        return ggml.ggml_view_2d(ctx, self.tensors[f"cache.{kind}.{layer}"], self.kv_dim, n,
                                 nb1, start * nb1)

    def store_and_read(self, g: Graph, kind: str, layer: int, current, start: int, n: int):
        """Write ``current`` ``[n, kv_dim]`` (f32) into rows ``start..start+n-1``, expanded into
        ``g`` now so it runs before the read; return rows ``0..start+n-1`` ``[start+n, kv_dim]``
        as the cache holds them (cache type)."""
        g.expand(ggml.ggml_cpy(g.ctx, current, self.rows(g.ctx, kind, layer, start, n)))
        return self.rows(g.ctx, kind, layer, 0, start + n)


@dataclass(frozen=True)
class Window:
    """The rows one forward computes, as every layer sees them (transformers' position
    embeddings, attention mask, cache position and past key values): ``n`` rows at cache
    positions ``start..start+n-1``, after the ``start`` rows ``cache`` holds.

    Attributes:
        cache: the layers' KV cache, written at rows ``start..start+n-1``.
        start: the first row's cache position.
        n: the rows computed.
        cos: graph input ``[n, 1, head_dim]`` (ne ``[head_dim, 1, n]``), from
            :func:`rope_tables` at the rows' positions.
        sin_signed: the same, with rotate_half's sign.
        mask: graph input ``[n, start+n]`` (ne ``[start+n, n]``), :func:`causal_mask`; None
            where every row sees every key (one row after the cache).
    """

    cache: KVCache
    start: int
    n: int
    cos: Any
    sin_signed: Any
    mask: Any


def attention(g: Graph, w: Weights, config: MossTTSDelayConfig, layer: int, x, window: Window):
    """``Qwen3Attention`` on ``x`` ``[n, H]`` (normed), the rows of ``window``.

    q/k/v projections; per-head RMSNorm of q and k (``q_norm``, ``k_norm``) before RoPE; keys and
    values written to the cache (expanded into ``g``) and read back from it; GQA (query head
    ``h`` reads key/value head ``h // (heads / kv_heads)``, as ``repeat_kv``);
    ``softmax(q k^T / sqrt(head_dim) + mask) v``; ``o_proj``. Returns ``[n, H]``.
    """
    ctx = g.ctx
    lang = config.language_config
    cache, start, n = window.cache, window.start, window.n
    p = f"language_model.layers.{layer}.self_attn."
    hd, heads, kv_heads = lang.head_dim, lang.num_attention_heads, lang.num_key_value_heads
    q = ggml.ggml_reshape_3d(ctx, ggml.ggml_mul_mat(ctx, w[p + "q_proj.weight"], x), hd, heads, n)
    k = ggml.ggml_reshape_3d(ctx, ggml.ggml_mul_mat(ctx, w[p + "k_proj.weight"], x),
                             hd, kv_heads, n)
    v = ggml.ggml_mul_mat(ctx, w[p + "v_proj.weight"], x)
    q = rms_norm(ctx, q, w[p + "q_norm.weight"], lang.rms_norm_eps)
    k = rms_norm(ctx, k, w[p + "k_norm.weight"], lang.rms_norm_eps)
    q = apply_rotary_pos_emb(ctx, q, window.cos, window.sin_signed)
    k = apply_rotary_pos_emb(ctx, k, window.cos, window.sin_signed)
    keys = cache.store_and_read(g, "k", layer, ggml.ggml_reshape_2d(ctx, k, hd * kv_heads, n),
                                start, n)
    values = cache.store_and_read(g, "v", layer, v, start, n)
    total = start + n
    # contiguous keys keep q k^T in f32 on Vulkan (ggml-vulkan converts a strided left-hand
    # side to f16 first)
    keys = ggml.ggml_cont(ctx, ggml.ggml_permute(
        ctx, ggml.ggml_reshape_3d(ctx, keys, hd, kv_heads, total), 0, 2, 1, 3))
    values = ggml.ggml_cont(ctx, ggml.ggml_permute(
        ctx, ggml.ggml_reshape_3d(ctx, values, hd, kv_heads, total), 1, 2, 0, 3))
    # a contiguous q keeps q k^T in llamafile's sgemm (a strided one runs a dot product at a time)
    queries = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, q, 0, 2, 1, 3))
    scores = ggml.ggml_mul_mat(ctx, keys, queries)
    probs = ggml.ggml_soft_max_ext(ctx, scores, window.mask, hd**-0.5, 0.0)
    out = ggml.ggml_permute(ctx, ggml.ggml_mul_mat(ctx, values, probs), 0, 2, 1, 3)
    out = ggml.ggml_reshape_2d(ctx, ggml.ggml_cont(ctx, out), hd * heads, n)
    return ggml.ggml_mul_mat(ctx, w[p + "o_proj.weight"], out)


def mlp(ctx, w: Weights, layer: int, x):
    """``Qwen3MLP``: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, ``[n, H]`` -> ``[n, H]``."""
    p = f"language_model.layers.{layer}.mlp."
    gate = ggml.ggml_silu(ctx, ggml.ggml_mul_mat(ctx, w[p + "gate_proj.weight"], x))
    up = ggml.ggml_mul_mat(ctx, w[p + "up_proj.weight"], x)
    return ggml.ggml_mul_mat(ctx, w[p + "down_proj.weight"], ggml.ggml_mul(ctx, gate, up))


def decoder_layer(g: Graph, w: Weights, config: MossTTSDelayConfig, layer: int, x,
                  window: Window):
    """``Qwen3DecoderLayer``: pre-norm attention and MLP, each with a residual; ``x`` ``[n, H]``
    (ne ``[H, n]``), the rows of ``window``, -> ``[n, H]``."""
    ctx = g.ctx
    eps = config.language_config.rms_norm_eps
    p = f"language_model.layers.{layer}."
    attn = attention(g, w, config, layer, rms_norm(ctx, x, w[p + "input_layernorm.weight"], eps),
                     window)
    x = ggml.ggml_add(ctx, x, attn)
    return ggml.ggml_add(ctx, x, mlp(ctx, w, layer, rms_norm(
        ctx, x, w[p + "post_attention_layernorm.weight"], eps)))


def lm_heads(ctx, w: Weights, config: MossTTSDelayConfig, hidden) -> list:
    """``lm_heads``: text head ``[vocab_size]`` then ``n_vq`` audio heads
    ``[audio_vocab_size+1]`` on one hidden state ``[H]`` (pad logits are set on the host)."""
    return [ggml.ggml_mul_mat(ctx, w[f"lm_heads.{j}.weight"], hidden)
            for j in range(config.n_vq + 1)]


class Backbone:
    """The ggml MOSS backbone with its KV cache: :meth:`prefill` then :meth:`step`.

    A forward's graph is built once per first cache position and row count and kept
    (:class:`~audioparity.ggml.GraphCache`), since its cache views depend on them: the
    teacher-forced pass and the last step run the positions of the prefill and the generation
    again.

    Args:
        runtime: backend and threads.
        weights: the checkpoint's weights uploaded in their storage types (names as in
            :func:`audioparity.models.moss_voicegen.checkpoint.expected_shapes`).
        config: the checkpoint config.
        kv_cache_type: ``f32`` or ``f16``.
        max_context: rows the cache holds (prompt plus generated rows).
    """

    def __init__(self, runtime: Runtime, weights: Weights, config: MossTTSDelayConfig,
                 kv_cache_type: str = "f32", max_context: int = 4096) -> None:
        if kv_cache_type not in FLOAT_STORAGE_TYPES:
            raise AudioparityError(f"KV cache type {kv_cache_type!r}; expected f32 or f16")
        self.runtime = runtime
        self.weights = weights
        self.config = config
        self.cache = KVCache.allocate(runtime, config, kv_cache_type, max_context)
        self.n_past = 0
        self._graphs = GraphCache(runtime)

    def prefill(self, rows: np.ndarray) -> Forward:
        """Empty the cache and run ``rows`` ``[S, 1+n_vq]`` (causal) from position 0."""
        self.n_past = 0
        return self._forward(rows, positions=np.arange(len(rows)), causal=True)

    def step(self, row: np.ndarray) -> Forward:
        """Run one row ``[1+n_vq]`` at the next position, attending to the cache."""
        return self._forward(np.asarray(row)[None], positions=np.array([self.n_past]),
                             causal=False)

    def _forward(self, rows: np.ndarray, positions: np.ndarray, causal: bool) -> Forward:
        config, lang = self.config, self.config.language_config
        start, n = self.n_past, len(rows)
        if start + n > self.cache.max_context:
            raise AudioparityError(f"KV cache holds {self.cache.max_context} rows; "
                                   f"{start} cached + {n} new do not fit")
        by_column = np.ascontiguousarray(np.asarray(rows, dtype=np.int32).T)  # [1+n_vq, n]
        cos, sin_signed = rope_tables(positions, lang.head_dim, lang.rope_theta)
        inputs = {"ids": by_column, "cos": cos, "sin_signed": sin_signed}
        if causal:
            inputs["mask"] = causal_mask(start, n)

        def build(g: Graph, t: dict) -> None:
            ctx = g.ctx
            column = ggml.ggml_row_size(I32, n)
            columns = [ggml.ggml_view_1d(ctx, t["ids"], n, column * c)
                       for c in range(config.n_vq + 1)]
            window = Window(self.cache, start, n, t["cos"], t["sin_signed"], t.get("mask"))
            x = g.output(Names.INPUT_EMBEDDINGS,
                         compute_input_embeddings(ctx, self.weights, config, columns), ndim=2)
            last = ggml.ggml_row_size(F32_ROW, lang.hidden_size) * (n - 1)
            for layer in range(lang.num_hidden_layers):
                x = decoder_layer(g, self.weights, config, layer, x, window)
                g.output(Names.LAYER.at(layer), x, ndim=2)
            hidden = rms_norm(ctx, x, self.weights["language_model.norm.weight"],
                              lang.rms_norm_eps)
            g.output("hidden", hidden, ndim=2)
            heads = lm_heads(ctx, self.weights, config,
                             ggml.ggml_view_1d(ctx, hidden, lang.hidden_size, last))
            for j, head in enumerate(heads):
                g.output(f"head_{j}", head, ndim=1)

        out = self._graphs.compute(start, inputs, build)
        self.n_past = start + n
        audio = np.stack([out[f"head_{j}"] for j in range(1, config.n_vq + 1)])
        audio[:, -1] = -np.inf
        return Forward(
            embeddings=out[Names.INPUT_EMBEDDINGS],
            hidden=out["hidden"],
            layers=np.stack([out[Names.LAYER.at(i)] for i in range(lang.num_hidden_layers)]),
            text_logits=out["head_0"],
            audio_logits=audio,
        )
