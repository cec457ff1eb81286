"""Building blocks every ggml port here uses: ``torch.nn`` layers as ggml operators.

Model code calls these like any ggml operator. Where ggml's arrangement depends on a weight's
storage type (convolutions), the dispatch lives here, once, so graph builders stay the same for
every weight type (docs/design.md, "Model ports").
"""

from __future__ import annotations

import ggml

from audioparity.contract.errors import AudioparityError
from audioparity.ggml.bindings import tensor_name
from audioparity.ggml.tensors import Weights


def linear(ctx, w: Weights, name: str, x):
    """``torch.nn.Linear`` (or a 1x1 conv) named ``name``: ``x W^T + b``, the bias only if the
    checkpoint has one. x ``[T, in]`` (ne ``[in, T]``; more leading axes broadcast),
    ``{name}.weight`` ``[out, in]``, ``{name}.bias`` ``[out]``; returns ``[T, out]``."""
    y = ggml.ggml_mul_mat(ctx, w[name + ".weight"], x)
    bias = w.get(name + ".bias")
    return y if bias is None else ggml.ggml_add(ctx, y, bias)


def layer_norm(ctx, x, weight, bias, eps: float):
    """``torch.nn.LayerNorm`` over the last axis of x ``[T, D]`` (ggml ``ne[0]``)."""
    return ggml.ggml_add(ctx, ggml.ggml_mul(ctx, ggml.ggml_norm(ctx, x, eps), weight), bias)


def depthwise_conv_2d(ctx, kernel, x, stride: tuple[int, int], padding: tuple[int, int]):
    """Depthwise ``Conv2d`` (``groups = channels``, no bias, dilation 1) in NCHW layout.

    Args:
        kernel: ``[C, 1, KH, KW]`` (ggml ne ``[KW, KH, 1, C]``), f32 or f16.
        x: ``[N, C, H, W]`` (ne ``[W, H, C, N]``), f32, contiguous.
        stride, padding: ``(height, width)``, as torch orders them.

    Returns:
        ``[N, C, OH, OW]`` (ne ``[OW, OH, C, N]``), f32.

    f32 kernels run ``ggml_conv_2d_dw_direct`` (f32 accumulation). f16 kernels run
    ``ggml_conv_2d_dw`` (im2col to F16, then mul_mat: activations rounded to f16, what a C++ ggml
    port with f16 conv weights computes), because ggml-python 0.0.45's CPU
    ``conv_2d_dw_direct`` reads F16 kernels as F32 (max error ~1e1 on unit-scale data, measured).

    Raises:
        AudioparityError: a kernel type other than f32/f16.
    """
    (s_h, s_w), (p_h, p_w) = stride, padding
    kind = kernel.contents.type
    if kind == ggml.GGML_TYPE_F32:
        return ggml.ggml_conv_2d_dw_direct(ctx, kernel, x, s_w, s_h, p_w, p_h, 1, 1)
    if kind == ggml.GGML_TYPE_F16:
        return ggml.ggml_conv_2d_dw(ctx, kernel, x, s_w, s_h, p_w, p_h, 1, 1)
    raise AudioparityError(
        f"depthwise conv kernel {tensor_name(kernel)!r} has ggml type {kind}; expected f32 or f16"
    )


#: Inner length (values per dot product) llamafile's f32 sgemm needs a multiple of (AVX-512).
SGEMM_INNER_MULTIPLE = 16


def conv_2d(ctx, kernel, x, stride: tuple[int, int], padding: tuple[int, int]):
    """``Conv2d`` (``groups = 1``, no bias, dilation 1) in NCHW layout, computed as
    ``ggml_conv_2d`` computes it (im2col, then one matmul).

    Args:
        kernel: ``[OC, IC, KH, KW]`` (ggml ne ``[KW, KH, IC, OC]``), f32 or f16.
        x: ``[N, IC, H, W]`` (ne ``[W, H, IC, N]``), f32.
        stride, padding: ``(height, width)``, as torch orders them.

    Returns:
        ``[N, OC, OH, OW]`` (ne ``[OW, OH, OC, N]``), f32.

    For f32 kernels the im2col rows and the kernel rows (``IC * KH * KW`` values) are
    zero-padded to a multiple of :data:`SGEMM_INNER_MULTIPLE`, so the matmul runs in llamafile's
    sgemm instead of one dot product at a time; the zeros add nothing to the sums. Parakeet's
    first subsampling conv (one input channel, 3x3: 9 values) took 30-44 ms of the v3 encoder
    without it. f16 kernels give an f16 im2col, which ``ggml_pad`` does not take: they run
    ``ggml_conv_2d`` unchanged.
    """
    (s_h, s_w), (p_h, p_w) = stride, padding
    if kernel.contents.type != ggml.GGML_TYPE_F32:
        return ggml.ggml_conv_2d(ctx, kernel, x, s_w, s_h, p_w, p_h, 1, 1)
    kw, kh, ic, oc = (kernel.contents.ne[i] for i in range(4))
    columns = ggml.ggml_im2col(ctx, kernel, x, s_w, s_h, p_w, p_h, 1, 1, True,
                               ggml.GGML_TYPE_F32)  # ne [IC*KH*KW, OW, OH, N]
    ow, oh, n = (columns.contents.ne[i] for i in (1, 2, 3))
    inner = ic * kh * kw
    pad = -inner % SGEMM_INNER_MULTIPLE
    columns = ggml.ggml_pad(ctx, ggml.ggml_reshape_2d(ctx, columns, inner, ow * oh * n),
                            pad, 0, 0, 0)
    weights = ggml.ggml_pad(ctx, ggml.ggml_reshape_2d(ctx, kernel, inner, oc), pad, 0, 0, 0)
    out = ggml.ggml_mul_mat(ctx, columns, weights)  # ne [OW*OH*N, OC]
    out = ggml.ggml_reshape_4d(ctx, out, ow, oh, n, oc)
    return ggml.ggml_cont(ctx, ggml.ggml_permute(ctx, out, 0, 1, 3, 2))  # ne [OW, OH, OC, N]
