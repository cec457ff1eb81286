"""ggml's CPU matmul with a stored weight, on every kernel it dispatches to, against float64 of
the rounding the quantization-aware reference emulates: the weight as ggml stores it
(``storage.stored``) times the input as the CPU backend rounds it (``storage.matmul_input``).

The activations' row counts straddle each kernel's threshold: one row runs ``vec_dot``, two or
more llamafile's tinyBLAS, eight or more (and weight rows a multiple of eight) the packed q8_0
kernel of ``setup/patches/ggml-python-cpu-gemm.patch``, twelve or more its packed f32 kernel
(AVX2 without AVX-512: thirteen rows end in a one-column tile, and 40 weight rows in an
eight-row one); 36 weight rows are no multiple of eight, so tinyBLAS takes the whole matmul.
K spans eight of the f32 kernel's blocks of 64 products. Two threads split the rows between
them.
What may differ is only the order of float32 additions, so each output is held to the
first-order bound on a float32 sum of n rounded terms (:func:`rounding_bound`). A row or column
read from the wrong place, a scale applied to the wrong block or a saturated 16-bit pair misses
it by orders of magnitude, and so does a scale rounded once more (to f16: 2^-11 of each term,
against 2^-24 times the number of terms). The build under test must have the patched kernel
where it compiles (AVX2 with F16C)."""

from __future__ import annotations

import ggml
import numpy as np
import pytest

from audioparity.dumping.storage import BLOCK_SIZES, matmul_input, stored
from audioparity.ggml import Runtime, build_info

K = 512  # 16 blocks of 32
RNG = np.random.default_rng(43)
X = RNG.standard_normal((64, K)).astype(np.float32)
WEIGHTS = {rows: RNG.standard_normal((rows, K)).astype(np.float32) for rows in (40, 36)}


#: float32's unit roundoff
UNIT_ROUNDOFF = 2.0 ** -24


def rounding_bound(x: np.ndarray, w: np.ndarray, weight_type: str) -> np.ndarray:
    """``[rows of x, rows of w]``: ``(n + 2) u sum |t|`` over the terms ``t`` a kernel rounds
    and adds in float32 (float64 ``x`` and ``w`` as computed with). A float type's kernels add
    single products; a quantized type's add exact integer sums of four products (ggml's
    ``vec_dot`` and tinyBLAS_Q0_AVX, one 32-bit lane each) or of a whole 32-value block (the
    patched kernel, whose terms are sums of these), each times its scale product, rounded once
    more: hence the 2."""
    group = 1 if BLOCK_SIZES[weight_type] == 1 else 4
    products = x[:, None, :] * w[None, :, :]
    terms = products.reshape(*products.shape[:2], K // group, group).sum(axis=-1)
    return (K // group + 2) * UNIT_ROUNDOFF * np.abs(terms).sum(axis=-1)


@pytest.fixture(scope="module")
def cpu():
    with Runtime("cpu", threads=2) as rt:
        yield rt


@pytest.mark.parametrize("weight_rows", sorted(WEIGHTS))
@pytest.mark.parametrize("input_rows", [1, 2, 7, 8, 13, 64])
@pytest.mark.parametrize("weight_type", ["f32", "f16", "bf16", "q8_0", "q4_0"])
def test_cpu_matmul_is_the_emulated_arithmetic(cpu, weight_type, weight_rows, input_rows):
    w, x = WEIGHTS[weight_rows], X[:input_rows]
    weights = cpu.upload({"w": w}, {"w": weight_type})
    with cpu.graph() as g:
        g.output("y", ggml.ggml_mul_mat(g.ctx, weights["w"], g.input("x", x)))
        y = g.compute()["y"].reshape(input_rows, weight_rows)
    stored_w = stored(w, weight_type).astype(np.float64)
    rounded_x = matmul_input(x, weight_type).astype(np.float64)
    truth = rounded_x @ stored_w.T
    bound = rounding_bound(rounded_x, stored_w, weight_type)
    excess = np.abs(y - truth) - bound
    assert np.all(excess <= 0), (
        f"{weight_type} ({weight_rows} x {K}) times {input_rows} rows: the worst element is "
        f"off by {np.abs(y - truth).flat[np.argmax(excess)]:.3g}, past its bound of "
        f"{bound.flat[np.argmax(excess)]:.3g}")


def test_the_build_reports_the_patched_kernels():
    """Every build applies setup/patches/ggml-python-cpu-gemm.patch (the Makefile), whose q8_0
    kernel is compiled for AVX2 with F16C and f32 kernel for AVX2 with FMA but no AVX-512
    (there tinyBLAS's 512-bit kernel runs); such a build lists them (``q8_0_r8``,
    ``f32_r16``), so a dump's ``ggml_build`` says which kernel summed its matmuls."""
    features = set(build_info()["cpu_features"])
    assert ("q8_0_r8" in features) == ({"avx2", "f16c", "llamafile"} <= features), features
    assert ("f32_r16" in features) == ({"avx2", "fma", "llamafile"} <= features
                                       and "avx512" not in features), features
