"""ggml operators whose choice depends on a tensor's storage type, kept out of model code.

Model code calls these like any ggml operator; the dispatch on the weight's type lives here, once,
so graph builders stay the same for every weight type (STYLE.md).
"""

from __future__ import annotations

import ggml

from audioparity.errors import AudioparityError
from audioparity.ggml.runtime import tensor_name


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
