"""ggml/ops.py against numpy float64: Conv2d through im2col, padded or not, for f32 and f16
kernels (NCHW, torch's Conv2d arithmetic, with groups 1 and no bias)."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.ggml import Runtime
from audioparity.ggml.ops import conv_2d

RNG = np.random.default_rng(7)


def conv2d_float64(x: np.ndarray, kernel: np.ndarray, stride: tuple[int, int],
                   padding: tuple[int, int]) -> np.ndarray:
    """torch.nn.functional.conv2d in float64 loops: x [N, IC, H, W], kernel [OC, IC, KH, KW]."""
    (s_h, s_w), (p_h, p_w) = stride, padding
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p_h, p_h), (p_w, p_w)))
    oc, _, kh, kw = kernel.shape
    oh = (x.shape[2] - kh) // s_h + 1
    ow = (x.shape[3] - kw) // s_w + 1
    out = np.zeros((x.shape[0], oc, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * s_h: i * s_h + kh, j * s_w: j * s_w + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, kernel.astype(np.float64))
    return out


@pytest.mark.parametrize("in_channels, storage", [(1, "f32"), (2, "f32"), (3, "f16")])
def test_conv_2d_matches_float64(in_channels: int, storage: str) -> None:
    """1 and 2 input channels: 9 and 18 values per im2col row, padded to 16 and 32 (llamafile's
    sgemm); f16 runs ggml_conv_2d, activations rounded to f16 as its im2col does."""
    x = RNG.standard_normal((1, in_channels, 11, 20)).astype(np.float32)
    kernel = RNG.standard_normal((5, in_channels, 3, 3)).astype(np.float32)
    with Runtime("cpu", threads=2) as runtime:
        weights = runtime.upload({"k": kernel}, {"k": storage})
        with runtime.graph() as g:
            g.output("y", conv_2d(g.ctx, weights["k"], g.input("x", x), (2, 2), (1, 1)), ndim=4)
            y = g.compute()["y"]
    if storage == "f16":
        x, kernel = x.astype(np.float16), kernel.astype(np.float16)
    expected = conv2d_float64(x, kernel, (2, 2), (1, 1))
    assert y.shape == expected.shape == (1, 5, 6, 10)
    np.testing.assert_allclose(y, expected, rtol=0, atol=1e-5 if storage == "f32" else 1e-3)
