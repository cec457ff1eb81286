"""The Parakeet-TDT (FastConformer) encoder as ggml graphs, block by block as in NeMo.

Read beside NeMo's ``ConformerEncoder.forward_internal``: :mod:`.subsampling`
(``ConvSubsampling``, dw_striding or striding),
``rel_pos_encoding`` (``RelPositionalEncoding``), then per
``ConformerLayer``: ``feed_forward`` (``ConformerFeedForward``), ``rel_pos_attention``
(``RelPositionMultiHeadAttention``), ``conv_module`` (``ConformerConvolution``), assembled by
``conformer_layer``; ``rel_pos_local_attn`` (``RelPositionMultiHeadAttentionLongformer``,
``LocalAttRelPositionalEncoding``) is the same attention on a band. Weight names are NeMo's
(see :mod:`.layout`: pointwise kernels squeezed to matrices, BatchNorm folded into the
depthwise conv).

Shapes in docstrings are NeMo's, batch dropped: ``[T, D]`` is time-major. ggml's ``ne`` is the
reverse, so a ``[T, D]`` activation is a ggml tensor with ``ne = [D, T]``; 4-D conv activations
``[C, H=T, W=F]`` are ``ne = [F, T, C]``. Only the valid frames are computed: with zero-padded
convolutions this equals NeMo's masked convolutions on those frames, and attention needs no
mask (batch size 1) but the band of local attention (``rel_pos_local_attn``).

Every weight's storage type (any of :data:`~audioparity.contract.vocabulary.STORAGE_TYPES`) is
carried by
the tensor itself: the same graph builders serve every weight type and backend.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import ggml
import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Graph, GraphCache, Runtime, Weights
from audioparity.ggml.ops import SGEMM_INNER_MULTIPLE, depthwise_conv_2d, layer_norm, linear
from audioparity.ggml.runtime import DEFAULT_GRAPH_SIZE
from audioparity.models.parakeet_tdt.config import EncoderConfig, ParakeetTDTConfig
from audioparity.models.parakeet_tdt.positions import (
    band_mask,
    local_positions_on_full_grid,
    local_rel_pos_encoding,
    rel_pos_encoding,
)
from audioparity.models.parakeet_tdt.spec import Names
from audioparity.models.parakeet_tdt.subsampling import conv_subsampling, pre_encode_chunks

log = logging.getLogger("audioparity")

#: A layer that takes at least this long (seconds) logs a progress line (:meth:`Encoder.layer`):
#: a long clip's encoder runs for an hour, a short one's stays quiet.
PROGRESS_SECONDS = 10.0
#: The graph input of local attention's :func:`band_mask`.
BAND_MASK = "band_mask"


def feed_forward(ctx, w: Weights, prefix: str, x):
    """``ConformerFeedForward``: Linear(D->d_ff), SiLU (Swish), Linear(d_ff->D). x ``[T, D]``."""
    h = ggml.ggml_silu(ctx, linear(ctx, w, prefix + "linear1", x))
    return linear(ctx, w, prefix + "linear2", h)


def rel_shift(ctx, bd, n_keys: int):
    """``RelPositionMultiHeadAttention.rel_shift`` followed by ``[..., :T]``, as a strided view.

    bd ``[H, r, T+r-1]`` (ne ``[T+r-1, r, H]``): the scores of r consecutive queries against the
    T+r-1 relative positions they reach, column c being position ``i_0+r-1-c`` for the chunk's
    first query ``i_0`` (the whole clip: r = T, ``[H, T, 2T-1]``, column c is position
    ``T-1-c``). Returns ``[H, r, T]`` with ``out[h, i, j] = bd[h, i, r-1-i+j]`` (the score of
    query ``i_0+i`` for key j at relative position ``i_0+i-j``): a view with row stride
    ``T+r-2`` elements, offset ``r-1``.
    """
    es = ggml.ggml_element_size(bd)
    n_rows = bd.contents.ne[1]
    return ggml.ggml_view_3d(ctx, bd, n_keys, n_rows, bd.contents.ne[2],
                             (n_keys + n_rows - 2) * es, bd.contents.nb[2], (n_rows - 1) * es)


#: The most chunks of query rows one attention is split in: each chunk adds about 17 nodes
#: (its views, products, softmax and its join) to its layer's graph (:meth:`Encoder.layer`),
#: which holds :data:`audioparity.ggml.runtime.DEFAULT_GRAPH_SIZE` nodes.
MAX_ATTENTION_CHUNKS = DEFAULT_GRAPH_SIZE // 32


def attention_row_bytes(cfg: EncoderConfig, n_frames: int) -> int:
    """The bytes :func:`rel_pos_attention` holds per query row of a chunk, every head: the
    positional scores (``T+r-1``), the content scores, their sum and softmax, the zero-padded
    weights (about ``T`` each), counted as ``5 H T`` float32."""
    return 5 * cfg.n_heads * n_frames * 4


def attention_chunk_rows(cfg: EncoderConfig, n_frames: int) -> int:
    """Query rows per chunk of :func:`rel_pos_attention` over ``n_frames`` frames: as many as
    fit :data:`audioparity.dumping.memory.ATTENTION_CHUNK_BYTES` (:func:`attention_row_bytes`), in
    at most :data:`MAX_ATTENTION_CHUNKS` chunks."""
    from audioparity.dumping.memory import attention_chunk_rows as rows

    return rows(n_frames, attention_row_bytes(cfg, n_frames), MAX_ATTENTION_CHUNKS)


@dataclass(frozen=True)
class AttentionInputs:
    """What every layer's attention of one encoder graph receives alike, built once per graph
    (:meth:`Encoder.layer`): the tensors NeMo's ``ConformerLayer.forward`` passes its
    ``self_attn`` besides ``x`` (``pos_emb``, ``att_mask``) and how the port computes with them.

    Attributes:
        pos_emb: the relative positions ``[2T-1, D]`` (ne ``[D, 2T-1]``); with local attention
            the window's positions on that full grid (:func:`local_positions_on_full_grid`).
        mask: None (full context) or ``[T_q, T_k]`` f32 (ne ``[T_k, T_q]``), 0 or ``-inf``
            (:func:`band_mask`).
        flash_attention: the content part in ``ggml_flash_attn_ext`` (:func:`rel_pos_attention`).
        chunk_rows: query rows per chunk; None: :func:`attention_chunk_rows`.
    """

    pos_emb: Any
    mask: Any = None
    flash_attention: bool = False
    chunk_rows: int | None = None


def rel_pos_attention(ctx, w: Weights, prefix: str, cfg: EncoderConfig, x,
                      inputs: AttentionInputs):
    """``RelPositionMultiHeadAttention.forward(x, x, x, mask, pos_emb)`` (Transformer-XL
    relative attention), and with ``inputs.mask`` ``RelPositionMultiHeadAttentionLongformer``
    (``rel_pos_local_attn``, no global tokens).

    ``q, k, v = linear_q/k/v(x)``, ``p = linear_pos(pos_emb)``, split in H heads of ``d_k``;
    ``ac = (q + pos_bias_u) k^T``, ``bd = rel_shift((q + pos_bias_v) p^T)``;
    ``out = linear_out(softmax((ac + bd) / sqrt(d_k) + mask) v)``. Local attention is the
    full score matrix restricted to the window by :func:`band_mask`, with the window's
    positions on the full grid (:func:`local_positions_on_full_grid`): the scores NeMo
    computes on its diagonals, the same softmax over the same keys.

    The scores are computed in chunks of ``inputs.chunk_rows`` query rows (default
    :func:`attention_chunk_rows`): for the queries ``a ... b-1``, views of those rows of q and
    of the ``T+r-1`` positions they reach (rows ``T-b ... 2T-2-a`` of p), the chunk's
    ``[H, r, T]`` scores taken to its ``[r, D]`` output, and the outputs joined in row order.
    ggml's allocator reuses one chunk's memory for the next, so the peak grows as T, not T^2.
    A clip within the budget is one chunk: the graph of the whole matrix.

    With ``inputs.flash_attention`` the content part runs in ``ggml_flash_attn_ext`` with the
    scaled positional term ``bd / sqrt(d_k)`` as its additive mask (F16, as flash attention
    requires) — NeMo's ``use_pytorch_sdpa`` formulation; the mask's rounding to f16 is part of
    what this path measures.

    Args:
        prefix: the attention's weight names' prefix (``encoder.layers.{i}.self_attn.``).
        x: ``[T, D]`` (after ``norm_self_att``).
        inputs: the positions, mask and settings every layer's attention shares.

    Returns:
        ``[T, D]``.
    """
    n_head, d_k = cfg.n_heads, cfg.d_k
    n_frames = x.contents.ne[1]
    scale = 1.0 / math.sqrt(d_k)
    rows = min(inputs.chunk_rows or attention_chunk_rows(cfg, n_frames), n_frames)
    mask = inputs.mask

    def heads(t, n):  # [n, D] -> ne [d_k, H, n]
        return ggml.ggml_reshape_3d(ctx, t, d_k, n_head, n)

    def per_head(t, first, n):  # rows first ... first+n-1 of ne [d_k, H, *] -> ne [d_k, n, H]
        return ggml.ggml_cont(ctx, _per_head(ctx, _rows(ctx, t, first, n, axis=2)))

    q = heads(linear(ctx, w, prefix + "linear_q", x), n_frames)
    k = heads(linear(ctx, w, prefix + "linear_k", x), n_frames)
    v = heads(linear(ctx, w, prefix + "linear_v", x), n_frames)
    p = heads(linear(ctx, w, prefix + "linear_pos", inputs.pos_emb), 2 * n_frames - 1)

    # Contiguous queries keep the q k^T and q p^T products in llamafile's sgemm (the CPU backend
    # computes a strided right-hand side one dot product at a time, far slower: BENCHMARKS.md);
    # contiguous keys and positions keep them in f32 on Vulkan (ggml-vulkan converts a strided
    # left-hand side to f16 first).
    q_u = ggml.ggml_add(ctx, q, w[prefix + "pos_bias_u"])  # ne [d_k, H, T]
    q_v = ggml.ggml_add(ctx, q, w[prefix + "pos_bias_v"])
    k_heads = per_head(k, 0, n_frames)  # ne [d_k, T, H]
    if inputs.flash_attention:
        attend, values = _flash_attention, _per_head(ctx, v)  # ne [d_k, T, H]
    else:
        attend, values = _softmax_attention, _padded_values(ctx, v)
    chunks = []
    for first in range(0, n_frames, rows):
        n_rows = min(rows, n_frames - first)
        # the positions T-1-i+j that the queries i reach: p rows T-first-r ... 2T-2-first
        p_rows = per_head(p, n_frames - first - n_rows, n_frames + n_rows - 1)
        bd = ggml.ggml_mul_mat(ctx, p_rows, per_head(q_v, first, n_rows))  # ne [T+r-1, r, H]
        bd = rel_shift(ctx, bd, n_frames)  # [H, r, T]
        mask_rows = None if mask is None else _rows(ctx, mask, first, n_rows, axis=1)
        chunks.append(attend(ctx, per_head(q_u, first, n_rows), k_heads, values, bd,
                             mask_rows, scale))  # ne [d_k, H, r]
    out = _join_rows(ctx, chunks)  # ne [d_k, H, T]
    out = ggml.ggml_reshape_2d(ctx, out, n_head * d_k, n_frames)
    return linear(ctx, w, prefix + "linear_out", out)


def _rows(ctx, t, first: int, n: int, axis: int):
    """Rows ``first ... first+n-1`` of ``t`` along ne axis ``axis`` (1: of a 2-D ``t``, 2: of
    a 3-D one), a view; ``t`` itself when they are all of it."""
    ne, nb = t.contents.ne, t.contents.nb
    if first == 0 and n == ne[axis]:
        return t
    if axis == 1:
        return ggml.ggml_view_2d(ctx, t, ne[0], n, nb[1], first * nb[1])
    return ggml.ggml_view_3d(ctx, t, ne[0], ne[1], n, nb[1], nb[2], first * nb[2])


def _join_rows(ctx, chunks: list):
    """The chunks' outputs (ne ``[d_k, H, r]`` each, in row order) as one ne ``[d_k, H, T]``,
    joined pairwise (each row is copied about ``log2`` of the chunk count times)."""
    while len(chunks) > 1:
        pairs = [ggml.ggml_concat(ctx, chunks[i], chunks[i + 1], 2)
                 for i in range(0, len(chunks) - 1, 2)]
        chunks = pairs + chunks[len(pairs) * 2:]
    return chunks[0]


def _per_head(ctx, t):
    """ne ``[d_k, H, rows]`` -> ne ``[d_k, rows, H]`` (a view)."""
    return ggml.ggml_permute(ctx, t, 0, 2, 1, 3)


def _flash_attention(ctx, q_u, k, v, bd, mask, scale: float):
    """The attention of :func:`rel_pos_attention` in ``ggml_flash_attn_ext``: the content
    scores of ``q_u`` (ne ``[d_k, r, H]``: r query rows) and ``k`` (ne ``[d_k, T, H]``), the
    scaled positional term ``bd`` (``[H, r, T]``) plus ``mask`` (ne ``[T, r]``) as its additive
    f16 mask, ``v`` ne ``[d_k, T, H]``; returns ne ``[d_k, H, r]`` (heads then time)."""
    positional = ggml.ggml_scale(ctx, ggml.ggml_cont(ctx, bd), scale)
    if mask is not None:
        positional = ggml.ggml_add(ctx, positional, mask)
    return ggml.ggml_flash_attn_ext(ctx, q_u, k, v,
                                    ggml.ggml_cast(ctx, positional, ggml.GGML_TYPE_F16),
                                    scale, 0.0, 0.0)


def _padded_values(ctx, v):
    """v ne ``[d_k, H, T]`` as the left-hand side of :func:`_softmax_attention`'s weighted sum:
    ne ``[T + pad, d_k, H]``, T zero-padded to the inner length llamafile's sgemm takes (exact
    zeros in each sum)."""
    pad = -v.contents.ne[2] % SGEMM_INNER_MULTIPLE
    return ggml.ggml_pad(ctx, ggml.ggml_permute(ctx, v, 1, 2, 0, 3), pad, 0, 0, 0)


def _softmax_attention(ctx, q_u, k, v_t, bd, mask, scale: float):
    """The attention of :func:`rel_pos_attention` as matmuls: ``softmax((q_u k^T + bd) *
    scale + mask) v`` with ``q_u`` ne ``[d_k, r, H]`` (r query rows), ``k`` ne ``[d_k, T,
    H]``, ``v_t`` ne ``[T + pad, d_k, H]`` (:func:`_padded_values`), ``bd`` ``[H, r, T]``,
    ``mask`` ne ``[T, r]``; returns ne ``[d_k, H, r]``."""
    ac = ggml.ggml_mul_mat(ctx, k, q_u)  # ne [T_k, r, H]
    attn = ggml.ggml_soft_max_ext(ctx, ggml.ggml_add(ctx, ac, bd), mask, scale, 0.0)
    attn = ggml.ggml_pad(ctx, attn, v_t.contents.ne[0] - k.contents.ne[1], 0, 0, 0)
    out = ggml.ggml_mul_mat(ctx, v_t, attn)  # [H, r, d_k] (ne [d_k, r, H])
    return ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, out, 0, 2, 1, 3))  # ne [d_k, H, r]


def conv_module(ctx, w: Weights, prefix: str, cfg: EncoderConfig, x):
    """``ConformerConvolution``: pointwise_conv1 (D->2D), GLU over channels (first half times
    sigmoid of the second), depthwise Conv1d (k, pad (k-1)/2 each side) with the BatchNorm
    folded in, SiLU, pointwise_conv2 (D->D).

    The depthwise conv runs as a depthwise Conv2d on a height-1 image (:func:`depthwise_conv_2d`:
    exact f32 for f32 kernels, whereas ``ggml_conv_1d_dw`` would round activations to f16).

    Args:
        x: ``[T, D]`` (after ``norm_conv``).

    Returns:
        ``[T, D]``.
    """
    d_model, n_frames = cfg.d_model, x.contents.ne[1]
    h = linear(ctx, w, prefix + "pointwise_conv1", x)
    es, row = ggml.ggml_element_size(h), h.contents.nb[1]
    value = ggml.ggml_view_2d(ctx, h, d_model, n_frames, row, 0)
    gate = ggml.ggml_view_2d(ctx, h, d_model, n_frames, row, d_model * es)
    h = ggml.ggml_mul(ctx, value, ggml.ggml_sigmoid(ctx, gate))  # [T, D]
    h = ggml.ggml_cont(ctx, ggml.ggml_transpose(ctx, h))  # [D, T] (ne [T, D])
    h = ggml.ggml_reshape_4d(ctx, h, n_frames, 1, d_model, 1)  # NCHW [1, D, 1, T]
    h = depthwise_conv_2d(ctx, w[prefix + "depthwise_conv.weight"], h,
                          (1, 1), (0, (cfg.conv_kernel_size - 1) // 2))
    h = ggml.ggml_reshape_2d(ctx, h, n_frames, d_model)
    h = ggml.ggml_cont(ctx, ggml.ggml_transpose(ctx, h))  # [T, D]
    h = ggml.ggml_silu(ctx, ggml.ggml_add(ctx, h, w[prefix + "depthwise_conv.bias"]))
    return linear(ctx, w, prefix + "pointwise_conv2", h)


def conformer_layer(ctx, w: Weights, index: int, cfg: EncoderConfig, x,
                    inputs: AttentionInputs):
    """``ConformerLayer.forward(x, att_mask, pos_emb)`` (macaron): ``x += FF1(LN x) / 2;
    x += MHA(LN x); x += Conv(LN x); x += FF2(LN x) / 2; return LN_out(x)``.

    Args:
        index: the layer (weights ``encoder.layers.{index}.*``).
        x: ``[T, D]``.
        inputs: what its attention receives besides ``x`` (:class:`AttentionInputs`).

    Returns:
        ``[T, D]``.
    """
    p = f"encoder.layers.{index}."
    eps = cfg.layer_norm_eps

    def norm(name, t):
        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], eps)

    h = feed_forward(ctx, w, p + "feed_forward1.", norm("norm_feed_forward1", x))
    x = ggml.ggml_add(ctx, x, ggml.ggml_scale(ctx, h, 0.5))
    h = rel_pos_attention(ctx, w, p + "self_attn.", cfg, norm("norm_self_att", x), inputs)
    x = ggml.ggml_add(ctx, x, h)
    x = ggml.ggml_add(ctx, x, conv_module(ctx, w, p + "conv.", cfg, norm("norm_conv", x)))
    h = feed_forward(ctx, w, p + "feed_forward2.", norm("norm_feed_forward2", x))
    x = ggml.ggml_add(ctx, x, ggml.ggml_scale(ctx, h, 0.5))
    return norm("norm_out", x)


class Encoder:
    """The NeMo ``ConformerEncoder`` of a Parakeet-TDT model on a ggml runtime.

    Args:
        weights: uploaded weights (:func:`audioparity.dumping.driver.upload_weights`), NeMo names
            in the graph layout (:mod:`.layout`).
        config: the model config (its ``encoder`` part is used).
        runtime: the runtime the weights live on.
        flash_attention: compute attention with ``ggml_flash_attn_ext`` (see
            :func:`rel_pos_attention`).
        chunk_rows: the attention's query rows per chunk; None: as many as fit the budget
            (:func:`attention_chunk_rows`).

    Each layer's graph and the subsampling's are built once per input shape and kept
    (:class:`~audioparity.ggml.GraphCache`): the isolated pass computes the end-to-end pass's
    layer graphs again on other inputs, and a long clip's subsampling chunks share one graph.

    Example::

        config = load_config(model)
        with Runtime("cpu", threads=4) as rt:
            weights, _ = upload_weights(ParakeetTdt(), rt, model, config,
                                        RunSettings("f32", "cpu", {"conv_weight_type": "f32"}))
            taps = Encoder(weights, config, rt).forward(mel)   # mel [T, n_mels]
            taps["enc_out"]                                    # [T', D]
    """

    def __init__(self, weights: Weights, config: ParakeetTDTConfig, runtime: Runtime,
                 flash_attention: bool = False, chunk_rows: int | None = None) -> None:
        self.weights = weights
        self.chunk_rows = chunk_rows
        self.cfg = config.encoder
        self.runtime = runtime
        self.flash_attention = flash_attention
        self._graphs = GraphCache(runtime)

    def positions(self, n_mel_frames: int) -> np.ndarray:
        """The relative positional table the layers read, host-computed as NeMo's
        ``RelPositionalEncoding`` (``[2T'-1, D]``) or ``LocalAttRelPositionalEncoding``
        (``[2w+1, D]``) builds it, float32, for ``n_mel_frames`` mel frames.

        Raises:
            AudioparityError: too few mel frames for one encoder frame.
        """
        cfg = self.cfg
        n_out = cfg.subsampled_length(n_mel_frames)
        if n_out < 1:
            raise AudioparityError(f"{n_mel_frames} mel frames give no encoder frame")
        return (rel_pos_encoding(n_out, cfg.d_model) if cfg.local_context is None
                else local_rel_pos_encoding(cfg.local_context, cfg.d_model))

    def forward(self, mel: np.ndarray, pos_emb: np.ndarray | None = None
                ) -> dict[str, np.ndarray]:
        """The whole encoder, with every tap: ``pre_encode`` in one graph, then each layer in
        its own (:meth:`layer`) on the previous one's output, so the memory is one layer's
        whatever the number of layers (a float32 tap read back and fed on is the same values).

        Args:
            mel: ``[T, n_mels]`` float32, valid frames only.
            pos_emb: the positional table (:meth:`positions`), computed here when None.

        Returns:
            ``pre_encode`` ``[T', D]``, ``pos_emb`` (host-computed, as NeMo feeds it to the
            layers: ``[2T'-1, D]``, or ``[2w+1, D]`` with local attention), ``layer_{i}``
            ``[T', D]`` for every layer, and ``enc_out`` ``[T', D]`` (the last layer's output:
            this architecture has no output projection), all float32.

        Raises:
            AudioparityError: mel is not ``[T, feat_in]`` or too short for one output frame.
        """
        mel = self._mel(mel)
        if pos_emb is None:
            pos_emb = self.positions(mel.shape[0])
        taps = {Names.PRE_ENCODE: self.pre_encode(mel)}
        for i, x in enumerate(self.layers(taps[Names.PRE_ENCODE], pos_emb)):
            taps[Names.LAYER.at(i)] = x
        taps[Names.POS_EMB] = pos_emb
        taps[Names.ENC_OUT] = taps[Names.LAYER.at(self.cfg.n_layers - 1)].copy()
        return taps

    def _mel(self, mel: np.ndarray) -> np.ndarray:
        """``mel`` as float32, checked ``[T, feat_in]``.

        Raises:
            AudioparityError: it is not.
        """
        mel = np.asarray(mel, dtype=np.float32)
        if mel.ndim != 2 or mel.shape[1] != self.cfg.feat_in:
            raise AudioparityError(f"mel_features has shape {list(mel.shape)}; expected "
                                   f"[T, {self.cfg.feat_in}]")
        return mel

    def pre_encode(self, mel: np.ndarray) -> np.ndarray:
        """The subsampling of :meth:`forward` alone: ``pre_encode`` ``[T', D]`` float32 of
        ``mel`` ``[T, n_mels]``, one graph a chunk of output frames
        (:func:`~.subsampling.pre_encode_chunks`; one graph for a clip within the budget).

        Raises:
            AudioparityError: mel is not ``[T, feat_in]``.
        """
        mel = self._mel(mel)

        def build(g: Graph, t: dict) -> None:
            g.output(Names.PRE_ENCODE,
                     conv_subsampling(g.ctx, self.weights, self.cfg, t[Names.MEL_FEATURES]),
                     ndim=2)

        chunks = [self._graphs.compute(Names.PRE_ENCODE, {Names.MEL_FEATURES: mel[frames]},
                                       build)[Names.PRE_ENCODE][kept]
                  for frames, kept in pre_encode_chunks(self.cfg, *mel.shape)]
        return chunks[0] if len(chunks) == 1 else np.concatenate(chunks)

    def layers(self, pre_encode: np.ndarray, pos_emb: np.ndarray) -> Iterator[np.ndarray]:
        """The layers of :meth:`forward` end to end, each in its own graph (:meth:`layer`) on
        the one before's output, layer 0 on ``pre_encode`` times ``xscale``: each layer's
        ``[T', D]`` float32 output as it is computed (a dump names each layer's phase)."""
        x = self._scaled(pre_encode)
        for i in range(self.cfg.n_layers):
            x = self.layer(i, x, pos_emb)
            yield x

    def _scaled(self, pre_encode: np.ndarray) -> np.ndarray:
        """Layer 0's input: ``pre_encode`` times ``xscale`` in float32, as NeMo's ``pos_enc``
        scales it when ``xscaling`` (else unchanged)."""
        x = np.asarray(pre_encode, dtype=np.float32)
        return x if self.cfg.xscale is None else x * np.float32(self.cfg.xscale)

    def _attention_arrays(self, pos_emb: np.ndarray, n_frames: int) -> dict[str, np.ndarray]:
        """The graph inputs the layers' attention reads: the positional encoding on the full
        ``[2T-1, D]`` grid and, with local attention, the :func:`band_mask`."""
        context = self.cfg.local_context
        if context is None:
            return {Names.POS_EMB: pos_emb}
        return {Names.POS_EMB: local_positions_on_full_grid(pos_emb, n_frames),
                BAND_MASK: band_mask(n_frames, context)}

    def _attention_inputs(self, t: dict) -> AttentionInputs:
        """:meth:`_attention_arrays` as the graph's input tensors ``t``, with the encoder's
        flash-attention and chunking settings."""
        return AttentionInputs(t[Names.POS_EMB], t.get(BAND_MASK),
                               flash_attention=self.flash_attention, chunk_rows=self.chunk_rows)

    def layers_isolated(self, inputs: Sequence[np.ndarray],
                        pos_emb: np.ndarray) -> Iterator[np.ndarray]:
        """Every layer alone on the tap that feeds it (e.g. the reference's), each in its own
        graph (:meth:`layer`), so the memory is one layer's, however many layers there are.

        Args:
            inputs: ``[pre_encode, layer_0, ..., layer_{N-2}]``, each ``[T', D]``: layer 0 gets
                ``pre_encode`` times ``xscale`` (as NeMo's ``pos_enc`` scales it, when
                ``xscaling``), layer i > 0 gets the output of layer i-1.
            pos_emb: as :meth:`forward` returns it (``[2T'-1, D]``, local: ``[2w+1, D]``).

        Yields:
            one ``[T', D]`` float32 array per layer, in layer order.

        Raises:
            AudioparityError: not one input per layer (before any layer runs), or an input of
                another shape (:meth:`layer`).
        """
        cfg = self.cfg
        if len(inputs) != cfg.n_layers:
            raise AudioparityError(f"{len(inputs)} layer inputs for {cfg.n_layers} layers")
        for index, x in enumerate(inputs):
            yield self.layer(index, self._scaled(x) if index == 0 else x, pos_emb)

    def layer(self, index: int, x: np.ndarray, pos_emb: np.ndarray) -> np.ndarray:
        """Layer ``index`` alone on its input x ``[T', D]`` (already scaled for layer 0), with
        pos_emb as :meth:`forward` returns it; returns ``[T', D]`` float32. A layer that takes
        :data:`PROGRESS_SECONDS` or more logs its time.

        Raises:
            AudioparityError: ``index`` out of range, or x not ``[T', D]`` with pos_emb of the
                rows :meth:`positions` gives for ``T'``.
        """
        cfg = self.cfg
        if not 0 <= index < cfg.n_layers:
            raise AudioparityError(f"layer {index} out of range (n_layers={cfg.n_layers})")
        x, pos_emb = np.asarray(x, dtype=np.float32), np.asarray(pos_emb, dtype=np.float32)
        if x.ndim != 2 or x.shape[1] != cfg.d_model or pos_emb.shape != (
            cfg.pos_emb_rows(x.shape[0]), cfg.d_model
        ):
            rows = "2T-1" if cfg.local_context is None else str(2 * cfg.local_context + 1)
            raise AudioparityError(
                f"layer {index}: input {list(x.shape)} and pos_emb {list(pos_emb.shape)}; "
                f"expected [T, {cfg.d_model}] and [{rows}, {cfg.d_model}]"
            )
        started = time.monotonic()
        name = f"input_{index}"

        def build(g: Graph, t: dict) -> None:
            h = conformer_layer(g.ctx, self.weights, index, cfg, t[name], self._attention_inputs(t))
            g.output(Names.LAYER.at(index), h, ndim=2)

        out = self._graphs.compute(
            (Names.LAYER.at(index), self.flash_attention, self.chunk_rows),
            {name: x, **self._attention_arrays(pos_emb, x.shape[0])}, build,
        )[Names.LAYER.at(index)]
        seconds = time.monotonic() - started
        if seconds >= PROGRESS_SECONDS:
            log.info("parakeet encoder: layer_%d of %d layers (T'=%d) in %.0f s", index,
                     cfg.n_layers, x.shape[0], seconds)
        return out
