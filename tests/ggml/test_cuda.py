"""ggml-cuda's MUL_MAT dispatch, mirrored (audioparity.ggml.cuda), against cases read off the
source it mirrors (ggml-python 0.0.45's vendored ggml-cuda, with our TF32 patch): each case
quotes the line that decides it."""

from __future__ import annotations

import pytest

from audioparity.ggml.cuda import (
    DISABLE_TF32,
    Kernel,
    MulMat,
    compute_capability,
    mul_mat_kernel,
    tf32_cause,
)

SIZE = {"f32": 4, "f16": 2, "bf16": 2, "q4_K": 144 / 256, "q8_0": 34 / 32}
H200, A100, T4, V100, P100, P40 = 900, 800, 750, 700, 600, 610


def matmul(src0: str = "f32", ne0: int = 256, rows: int = 512, cols: int = 1, batch: int = 1,
           src1: str = "f32", transposed: bool = False) -> MulMat:
    """src0 ``[ne0, rows]`` (contiguous, or its transpose's strides), src1 ``[ne0, cols,
    batch]`` contiguous."""
    nb0 = SIZE[src0]
    src0_nb = [int(nb0 * ne0), int(nb0), int(nb0 * ne0 * rows), int(nb0 * ne0 * rows)] if (
        transposed) else [int(nb0), int(nb0 * ne0), int(nb0 * ne0 * rows), int(nb0 * ne0 * rows)]
    size = SIZE[src1]
    return MulMat(src0, [ne0, rows, 1, 1], src0_nb, src1, [ne0, cols, batch, 1],
                  [size, size * ne0, size * ne0 * cols, size * ne0 * cols * batch])


CASES = [
    # mmvf.cu: if (ampere_mma_available(cc)) { return ne11 <= 3; }
    (matmul(cols=3), H200, Kernel.MMVF),
    # mmf.cu: case GGML_TYPE_F32: return ampere_mma_available(cc) || ...; (4 <= 16 columns)
    (matmul(cols=4), H200, Kernel.MMF),
    # mmf.cu: } else if (src1_ncols > 16) { return false; }  -> cuBLAS
    (matmul(cols=17), H200, Kernel.CUBLAS),
    # mmvf.cu: if (cc >= GGML_CUDA_CC_TURING) { return ne11 <= 4; }
    (matmul(cols=4), T4, Kernel.MMVF),
    # mmf.cu: an f32 src0 needs ampere_mma_available(cc): a Turing takes cuBLAS
    (matmul(cols=5), T4, Kernel.CUBLAS),
    # mmf.cu: if (src0_ne[0] % (warp_size * (4/ts)) != 0) { return false; }  (48 % 32)
    (matmul(ne0=48, cols=4), H200, Kernel.CUBLAS),
    # mmf.cu: if (src0_ne[1] % mmf_get_rows_per_block(cc) != 0) { return false; }  (40 % 32)
    (matmul(rows=40, cols=4), H200, Kernel.CUBLAS),
    # ggml-cuda.cu: ... && !ggml_is_transposed(src0) && !ggml_is_transposed(src1)
    #     && src1->ne[2]*src1->ne[3] > 1) { ggml_cuda_mul_mat_batched_cublas(...)
    (matmul(cols=20, batch=4), H200, Kernel.CUBLAS_BATCHED),
    # ... but a few columns take the vector kernel first, batched or not
    (matmul(cols=2, batch=4), H200, Kernel.MMVF),
    # mmvf.cu / mmf.cu: if (src0_nb[0] != ts) { return false; }, and a transposed src0 is no
    # batched GEMM: the plain cuBLAS path
    (matmul(cols=20, batch=4, transposed=True), H200, Kernel.CUBLAS),
    # mmvf.cu (F16): if (ampere_mma_available(cc)) { return src0_small && ne11 == 1; }
    (matmul("f16", cols=1), H200, Kernel.MMVF),
    # ... src0_small = (src0_ne[1] <= 512 || src0_ne[2]*src0_ne[3] == 1): 2 columns take mmf,
    # case GGML_TYPE_F16: return volta_mma_available(cc) || turing_mma_available(cc) || ...
    (matmul("f16", cols=2), H200, Kernel.MMF),
    # mmvf.cu (F16): if (fp16_mma_hardware_available(cc)) { return src0_small && ne11 <= 3; }
    (matmul("f16", cols=3), V100, Kernel.MMVF),
    # mmf.cu (BF16): return ampere_mma_available(cc) || ...: a Volta has none; bf16 batched
    # cuBLAS needs bf16_mma_hardware_available(cc) too: the plain cuBLAS path
    (matmul("bf16", cols=9, batch=2), V100, Kernel.CUBLAS),
    # ggml-cuda.cu: use_mul_mat_vec_q = ggml_is_quantized(src0->type) && ...
    #     && src1->ne[1] <= MMVQ_MAX_BATCH_SIZE;  (8)
    (matmul("q4_K", cols=8), H200, Kernel.MMVQ),
    # mmq.cu: if (turing_mma_available(cc)) { return true; }
    (matmul("q4_K", cols=9), H200, Kernel.MMQ),
    # mmq.cu: return !fp16_mma_hardware_available(cc) || ne11 < MMQ_DP4A_MAX_BATCH_SIZE;
    (matmul("q4_K", cols=63), V100, Kernel.MMQ),
    (matmul("q4_K", cols=64), V100, Kernel.CUBLAS),
    # mmq.cu: if (ggml_cuda_highest_compiled_arch(cc) < GGML_CUDA_CC_DP4A) { return false; }
    (matmul("q8_0", ne0=256, cols=9), P100, Kernel.CUBLAS),
    (matmul("q8_0", ne0=256, cols=9), P40, Kernel.MMQ),
]


@pytest.mark.parametrize(("mm", "cc", "kernel"), CASES)
def test_the_kernel_is_the_one_ggml_cuda_mul_mat_picks(mm, cc, kernel):
    assert mul_mat_kernel(mm, cc) is kernel


def test_with_tf32_disabled_an_f32_matmul_leaves_the_tile_kernel():
    # the patch: case GGML_TYPE_F32: return (ampere_mma_available(cc) || ...)
    #     && !ggml_cuda_tf32_disabled();  -> the next path, cuBLAS (in float32 math mode)
    assert mul_mat_kernel(matmul(cols=4), H200, tf32=False) is Kernel.CUBLAS
    assert mul_mat_kernel(matmul("f16", cols=2), H200, tf32=False) is Kernel.MMF


def test_tf32_is_named_on_the_f32_paths_that_take_it_and_only_there():
    assert tf32_cause(matmul(cols=4), H200, {}) == (
        "TF32 (mmf tile kernel, mma tf32 for <= 16 columns; GGML_CUDA_DISABLE_TF32=1 "
        "(cuda-strict) computes it in float32)")
    assert tf32_cause(matmul(cols=17), H200, {}).startswith("TF32 (cuBLAS in TF32 math mode;")
    assert tf32_cause(matmul(cols=20, batch=4), H200, {}).startswith("TF32 (cuBLAS batched")
    assert tf32_cause(matmul(cols=1), H200, {}) is None  # mmvf: float32 FMA
    assert tf32_cause(matmul("f16", cols=17), H200, {}) is None  # an f16 GEMM, no TF32
    assert tf32_cause(matmul("q4_K", cols=17), H200, {}) is None
    for mm in (matmul(cols=4), matmul(cols=17), matmul(cols=20, batch=4)):
        assert tf32_cause(mm, H200, {DISABLE_TF32: "1"}) is None


def test_a_compute_capability_is_read_as_ggml_cuda_encodes_it():
    # ggml-cuda.cu: info.devices[id].cc = 100*prop.major + 10*prop.minor;
    assert compute_capability({"compute capability": "9.0"}) == 900
    assert compute_capability({"compute capability": "8.6"}) == 860
    assert compute_capability({"name": "llvmpipe"}) is None
    with pytest.raises(ValueError, match="not an NVIDIA"):
        mul_mat_kernel(matmul(), 0x1000000 + 0x1100)  # an AMD device's


def test_a_cuda_device_line_gives_its_compute_capability():
    from audioparity.ggml.backends import parse_device_lines

    # ggml-cuda.cu: GGML_LOG_INFO("  Device %d: %s, compute capability %d.%d, VMM: %s,
    #     VRAM: %zu MiB\n", ...)
    found = parse_device_lines("ggml_cuda_init: found 1 CUDA devices (Total VRAM: 143167 MiB):\n"
                               "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes, "
                               "VRAM: 143167 MiB\n")
    assert found == {"CUDA0": {"name": "NVIDIA H200", "compute capability": "9.0", "VMM": "yes",
                               "VRAM": "143167 MiB"}}
    assert compute_capability(found["CUDA0"]) == H200
