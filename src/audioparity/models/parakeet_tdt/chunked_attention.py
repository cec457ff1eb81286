"""NeMo's full-context relative-position attention computed in chunks of query rows, each row as
NeMo computes it, so the reference holds long audio in bounded memory
(:func:`chunked_attention`, patched in by :func:`~.references.nemo.encoder`). Importing this
module imports neither torch, NeMo nor ggml.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

#: NeMo's ``multi_head_attention.INF_VAL``: the score a masked key gets before the softmax.
INF_VAL = 10000.0


def attention_row_bytes(n_heads: int, n_frames: int) -> int:
    """The bytes :class:`ChunkedRelPosAttention` holds per query row of a chunk, every head:
    :data:`~audioparity.dumping.memory.REFERENCE_SCORE_COPIES` float32 rows of ``T`` (padded
    frames)."""
    from audioparity.dumping.memory import REFERENCE_SCORE_COPIES

    return REFERENCE_SCORE_COPIES * n_heads * n_frames * 4


def attention_chunk_rows(n_heads: int, n_frames: int) -> int:
    """Query rows per chunk of :class:`ChunkedRelPosAttention` over ``n_frames`` (padded)
    frames: as many as fit :data:`audioparity.dumping.memory.ATTENTION_CHUNK_BYTES`
    (:func:`attention_row_bytes`); all of them for a clip within it."""
    from audioparity.dumping.memory import attention_chunk_rows as rows

    return rows(n_frames, attention_row_bytes(n_heads, n_frames))


@dataclass(frozen=True, eq=False)
class ChunkedRelPosAttention:
    """NeMo's ``RelPositionMultiHeadAttention.forward`` (``multi_head_attention.py``) of
    ``module``, with the scores computed for ``chunk_rows`` query rows at a time: an instance
    is that module's ``forward`` (:func:`chunked_attention`), called as NeMo calls it.

    NeMo's arithmetic, step by step: ``q, k, v = forward_qkv(query, key, value)``, ``p =
    linear_pos(pos_emb)``; then for the query rows ``a ... b-1`` (r of them) ``matrix_bd =
    rel_shift((q + pos_bias_v) p^T)`` on the rows ``T-b ... 2T-2-a`` of p (the ``T+r-1``
    positions they reach: NeMo's ``rel_shift`` of the chunk picks, for query i and key j,
    the column of position ``i-j``, as it does on the whole ``[H, T, 2T-1]``); without
    ``use_pytorch_sdpa`` ``matrix_ac = (q + pos_bias_u) k^T``, ``scores = (matrix_ac +
    matrix_bd) / sqrt(d_k)`` and NeMo's own ``forward_attention`` (masked_fill ``-INF_VAL``,
    softmax, masked_fill 0, ``@ v``, ``linear_out``) on the chunk's rows of the mask; with it
    ``scaled_dot_product_attention`` with ``matrix_bd / sqrt(d_k)``, masked, as its
    ``attn_mask``, then ``linear_out``. The rows' outputs are joined in order.

    Every row is computed as in NeMo's unchunked forward, so it equals it within float32
    summation noise (the matmuls' blocking differs with the row count); with one chunk
    (``chunk_rows >= T``) the calls are NeMo's own on the same tensors, bit for bit.

    Attributes:
        module: a ``RelPositionMultiHeadAttention`` (not the Longformer subclass).
        chunk_rows: query rows per chunk; None: :func:`attention_chunk_rows`.
        chunks: when given, ``(T, chunk rows)`` of each call is appended to it.

    Call arguments, NeMo's:
        query, key, value: ``[B, T, D]``; mask: ``[B, T, T]`` bool (True: masked) or None;
            pos_emb: ``[B, 2T-1, D]``; cache: NeMo's streaming cache (passed through
            ``update_cache``).

    Returns:
        ``[B, T, D]`` (and the cache when one is given), as NeMo's forward.
    """

    module: Any
    chunk_rows: int | None = None
    chunks: list[tuple[int, int]] | None = None

    def __call__(self, query: Any, key: Any, value: Any, mask: Any, pos_emb: Any,
                 cache: Any = None) -> Any:
        """NeMo's ``forward(query, key, value, mask, pos_emb, cache=None)``, in chunks."""
        module, chunk_rows, chunks = self.module, self.chunk_rows, self.chunks
        import torch
        from nemo.utils import avoid_float16_autocast_context

        key, value, query, cache = module.update_cache(key=key, value=value, query=query,
                                                       cache=cache)
        if torch.is_autocast_enabled():
            query, key, value = (t.to(torch.float32) for t in (query, key, value))
        with avoid_float16_autocast_context():
            q, k, v = module.forward_qkv(query, key, value)
            q = q.transpose(1, 2)  # (batch, time1, head, d_k)
            n_batch_pos = pos_emb.size(0)
            p = module.linear_pos(pos_emb).view(n_batch_pos, -1, module.h, module.d_k)
            p = p.transpose(1, 2)  # (batch, head, 2*time1-1, d_k)
            q_with_bias_u = (q + module.pos_bias_u).transpose(1, 2)  # (batch, head, time1, d_k)
            q_with_bias_v = (q + module.pos_bias_v).transpose(1, 2)
            n_rows = q_with_bias_u.size(-2)
            rows = min(chunk_rows or attention_chunk_rows(module.h, n_rows), n_rows)
            if chunks is not None:
                chunks.append((n_rows, rows))
            out = torch.cat([
                _attention_rows(module, q_with_bias_u[:, :, a : a + rows],
                                q_with_bias_v[:, :, a : a + rows], k, v,
                                p[:, :, max(n_rows - a - rows, 0) : 2 * n_rows - 1 - a],
                                None if mask is None else mask[:, a : a + rows])
                for a in range(0, n_rows, rows)
            ], dim=1) if rows < n_rows else _attention_rows(module, q_with_bias_u, q_with_bias_v,
                                                             k, v, p, mask)
        return out if cache is None else (out, cache)


def _attention_rows(module: Any, q_with_bias_u: Any, q_with_bias_v: Any, k: Any, v: Any,
                    p: Any, mask: Any) -> Any:
    """The rest of NeMo's ``RelPositionMultiHeadAttention.forward`` for r query rows: ``q_with
    _bias_u``, ``q_with_bias_v`` ``[B, H, r, d_k]``, ``k``, ``v`` ``[B, H, T, d_k]``, ``p`` the
    ``[B, H, T+r-1, d_k]`` positions the rows reach, ``mask`` the rows' ``[B, r, T]`` or None;
    returns the rows' ``[B, r, D]`` (after ``linear_out``)."""
    import torch

    matrix_bd = torch.matmul(q_with_bias_v, p.transpose(-2, -1))
    matrix_bd = module.rel_shift(matrix_bd)
    if module.use_pytorch_sdpa:
        scale_factor = 1 / math.sqrt(q_with_bias_u.size(-1))
        matrix_bd = matrix_bd[:, :, :, : k.size(-2)] * scale_factor
        if mask is not None:
            mask = mask.unsqueeze(1)
            matrix_bd.masked_fill_(mask, -INF_VAL)
        dropout_rate = module.dropout_rate if module.training else 0
        if module.use_pytorch_sdpa_backends:
            with torch.nn.attention.sdpa_kernel(module.use_pytorch_sdpa_backends):
                out = torch.nn.functional.scaled_dot_product_attention(
                    q_with_bias_u, k, v, attn_mask=matrix_bd, dropout_p=dropout_rate)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                q_with_bias_u, k, v, attn_mask=matrix_bd, dropout_p=dropout_rate)
        if mask is not None:
            all_masked_rows = torch.all(mask, dim=-1)
            all_masked_rows.unsqueeze_(-1)
            all_masked_rows = all_masked_rows.expand(-1, out.size(1), -1, out.size(-1))
            out = out.masked_fill(all_masked_rows, 0.0)
        out = out.transpose(1, 2).reshape(out.size(0), -1, module.h * module.d_k)
        return module.linear_out(out)
    matrix_ac = torch.matmul(q_with_bias_u, k.transpose(-2, -1))
    matrix_bd = matrix_bd[:, :, :, : matrix_ac.size(-1)]
    scores = (matrix_ac + matrix_bd) / module.s_d_k  # (batch, head, rows, time2)
    return module.forward_attention(v, scores, mask)


@contextmanager
def chunked_attention(encoder: Any, chunk_rows: int | None = None) -> Iterator[list]:
    """Within the block, every full-context ``RelPositionMultiHeadAttention`` of NeMo's
    ``encoder`` (``ConformerEncoder``) computes as :class:`ChunkedRelPosAttention` (its
    instance's ``forward`` replaced; hooks still fire); local attention
    (``RelPositionMultiHeadAttentionLongformer``) is left as it is, already linear in T.

    Yields:
        a list that collects ``(T, chunk rows)`` of every call.
    """
    from nemo.collections.asr.parts.submodules.multi_head_attention import (
        RelPositionMultiHeadAttention,
    )

    calls: list[tuple[int, int]] = []
    modules = [m for m in encoder.modules() if type(m) is RelPositionMultiHeadAttention]
    for module in modules:
        module.forward = ChunkedRelPosAttention(module, chunk_rows, calls)
    try:
        yield calls
    finally:
        for module in modules:
            del module.forward


def chunk_note(calls: Sequence[tuple[int, int]]) -> str | None:
    """The manifest's note of the chunks :func:`chunked_attention` recorded, or None when
    every attention was one chunk."""
    chunked = sorted({(n, rows) for n, rows in calls if rows < n})
    if not chunked:
        return None
    n_frames, rows = chunked[-1]
    return (f"attention: NeMo's RelPositionMultiHeadAttention computed in chunks of {rows} "
            f"query rows ({-(-n_frames // rows)} chunks over T={n_frames}), each row as NeMo "
            "computes it (chunked_attention.ChunkedRelPosAttention)")
