"""NeMo's ``ConvSubsampling`` (``subsampling.py``, dw_striding or striding) as a ggml graph:
``pre_encode``, and the chunks over time it runs in, so that a long clip's subsampling holds a
bounded part of its feature maps at once (:func:`pre_encode_chunks`).

Every convolution has kernel 3, stride 2 and padding 1 in time, so an output frame ``t`` of
``log2(f)`` stages (factor ``f``) reads the mel frames ``f t - (f - 1) ... f t + (f - 1)``, and
the ``k``-th stage's frame ``u`` reads the stage before's ``2u - 1 ... 2u + 1``. A chunk of output
frames ``a ... b-1`` is computed on the mel frames ``f (a - 1) ... f b - 1`` (from 0 for the
first chunk, to the last frame for the last): starting on a multiple of ``f`` keeps every stage's
stride in phase with the whole clip's, and a window's zero padding reaches only each stage's
first frame of it, frame ``a - 1`` at the end, which is dropped. Every kept frame is computed
from the same values by the same operations as in one graph of the whole clip; a chunk's
matmuls block its frames otherwise, so it equals the whole clip's within float32 summation
noise. A clip within the budget is one chunk: that graph, bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import ggml

from audioparity.ggml import Weights
from audioparity.ggml.ops import conv_2d, depthwise_conv_2d, linear
from audioparity.models.parakeet_tdt.config import EncoderConfig


def conv_subsampling(ctx, w: Weights, cfg: EncoderConfig, mel):
    """``ConvSubsampling`` (``dw_striding`` or ``striding``): ``pre_encode`` of NeMo.

    Conv2d(1->C, 3x3, stride 2, pad 1) + ReLU, then ``log2(factor) - 1`` stages: for
    ``dw_striding`` [depthwise Conv2d(C, 3x3, stride 2, pad 1, groups=C) -> pointwise 1x1
    Conv2d(C->C) -> ReLU] (``conv.{2+3i}``, ``conv.{3+3i}``), for ``striding`` [Conv2d(C->C, 3x3,
    stride 2, pad 1) -> ReLU] (``conv.{2+2i}``). Then the ``[C, T', F']`` map is flattened
    channel-major per frame (feature ``c * F' + f``) and projected by ``out`` (Linear
    ``C * F' -> D``). At x2 there are no stages: the first conv's map is flattened.

    Args:
        mel: ``[T, n_mels]`` (ne ``[n_mels, T]``), valid frames only.

    Returns:
        ``[T', D]`` with ``T' = calc_length(T)`` (``log2(factor)`` times ``(t + 2 - 3) // 2 + 1``).
    """
    p = "encoder.pre_encode."
    n_freq, n_time = mel.contents.ne[0], mel.contents.ne[1]
    x = ggml.ggml_reshape_4d(ctx, mel, n_freq, n_time, 1, 1)  # NCHW [1, 1, T, F]
    x = conv_2d(ctx, w[p + "conv.0.weight"], x, (2, 2), (1, 1))  # ne [F, T, C]
    x = ggml.ggml_relu(ctx, add_channel_bias(ctx, x, w[p + "conv.0.bias"]))
    n_stages = int(math.log2(cfg.subsampling_factor)) - 1
    channel_last = False  # x is ne [F, T, C]; after a dw_striding stage ne [C, F, T]
    for stage in range(n_stages):
        if cfg.subsampling == "striding":
            conv = f"{p}conv.{2 + 2 * stage}"
            x = conv_2d(ctx, w[conv + ".weight"], x, (2, 2), (1, 1))
            x = ggml.ggml_relu(ctx, add_channel_bias(ctx, x, w[conv + ".bias"]))
            continue
        dw, pw = 2 + 3 * stage, 3 + 3 * stage
        if channel_last:  # back to ne [F, T, C] for the depthwise conv
            x = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, x, 2, 0, 1, 3))
        x = depthwise_conv_2d(ctx, w[f"{p}conv.{dw}.weight"], x, (2, 2), (1, 1))
        x = add_channel_bias(ctx, x, w[f"{p}conv.{dw}.bias"])
        x = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, x, 1, 2, 0, 3))  # ne [C, F, T]
        x = ggml.ggml_relu(ctx, linear(ctx, w, f"{p}conv.{pw}", x))
        channel_last = True
    # ne [C, F', T'] or [F', T', C] -> [F', C, T'] -> [F' * C, T']: feature index c * F' + f,
    # as NeMo flattens.
    order = (1, 0, 2, 3) if channel_last else (0, 2, 1, 3)
    x = ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, x, *order))
    x = ggml.ggml_reshape_2d(ctx, x, x.contents.ne[0] * x.contents.ne[1], x.contents.ne[2])
    return linear(ctx, w, p + "out", x)


def add_channel_bias(ctx, x, bias):
    """x ne ``[W, H, C]`` + a per-channel bias ``[C]`` (NCHW conv bias)."""
    return ggml.ggml_add(ctx, x, ggml.ggml_reshape_3d(ctx, bias, 1, 1, bias.contents.ne[0]))


def row_bytes(cfg: EncoderConfig, n_mels: int) -> int:
    """The bytes the subsampling graph holds per output frame: the first convolution's map
    (``C`` channels, ``f / 2`` frames of ``ceil(n_mels / 2)`` bins, float32), the largest of
    its feature maps, counted thrice (its im2col, the map and its activation)."""
    return 3 * cfg.subsampling_conv_channels * (cfg.subsampling_factor // 2) * (
        (n_mels + 1) // 2) * 4


def pre_encode_chunks(cfg: EncoderConfig, n_mel_frames: int, n_mels: int
                      ) -> Iterator[tuple[slice, slice]]:
    """The chunks :meth:`~.encoder.Encoder.pre_encode` computes ``pre_encode`` in (module
    docstring): for each, the mel frames its graph reads and which of that graph's output frames
    it keeps, in order; as many output frames a chunk as fit
    :data:`audioparity.dumping.memory.SUBSAMPLING_CHUNK_BYTES` (:func:`row_bytes`). A clip within
    the budget is one chunk: the graph of the whole clip, every frame kept."""
    from audioparity.dumping.memory import SUBSAMPLING_CHUNK_BYTES

    factor, n_out = cfg.subsampling_factor, cfg.subsampled_length(n_mel_frames)
    rows = max(1, SUBSAMPLING_CHUNK_BYTES // row_bytes(cfg, n_mels))
    for first in range(0, n_out, rows):
        start, count = max(0, first - 1), min(rows, n_out - first)
        yield (slice(factor * start, min(n_mel_frames, factor * (first + count))),
               slice(first - start, first - start + count))
