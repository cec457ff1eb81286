"""What ggml-cuda computes a MUL_MAT with, and whether that is TF32: its dispatch mirrored from
the ggml-cuda source this project builds (ggml-python 0.0.45's vendored ggml,
``src/ggml-cuda/``), so a drill-down on a host without the GPU can name the kernel of a node
the CUDA backend computed.

``ggml_cuda_mul_mat`` (``ggml-cuda.cu``) picks, in this order, the first of: ``mmvf`` (a
vector kernel for a few columns of src1, float32 FMA), ``mmf`` (a tile kernel for up to 16
columns: ``mma`` in TF32 for an f32 src0, in f16/bf16 for those), ``mmvq`` and ``mmq``
(quantized src0: src1 rounded to q8_1 first), ``cuBLAS batched`` (several matrices of src1),
and ``cuBLAS`` otherwise. ggml-cuda puts its cuBLAS handles in TF32 math mode
(``common.cuh``: ``cublasSetMathMode(..., CUBLAS_TF32_TENSOR_OP_MATH)``), which cuBLAS
applies to the float32 products it computes (``cublasSgemm``, and ``cublasGemmBatchedEx`` with
``CUBLAS_COMPUTE_32F``). TF32 keeps 10 bits of mantissa: an f32 product on those paths differs
from the CPU's by about 1e-7 to 1e-6 in NMSE, above float32 noise.

The patch ``setup/patches/ggml-python-cuda.patch`` adds the environment switch
:data:`DISABLE_TF32`: set, cuBLAS stays in its default (float32) math mode and no f32 MUL_MAT
takes ``mmf``; the backend setting ``cuda-strict`` runs with it.

Mirrored for one device of NVIDIA compute capability ``cc`` (``100*major + 10*minor``, as
ggml-cuda encodes it) built for that architecture (ggml's ``ggml_cuda_highest_compiled_arch``
is the device's own: a native build); not mirrored: split buffers (several GPUs), AMD and
Moore Threads devices, the Hadamard hint, a quantized src0 in a padded compute buffer, and the
build flags ``GGML_CUDA_FORCE_MMQ``/``GGML_CUDA_FORCE_CUBLAS``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from audioparity.contract.vocabulary import FLOAT_TYPES

#: The environment variable that turns TF32 off in ggml-cuda (our patch): any value.
DISABLE_TF32 = "GGML_CUDA_DISABLE_TF32"

# ggml-cuda's compute capabilities (common.cuh, GGML_CUDA_CC_*)
PASCAL, DP4A, VOLTA, TURING, AMPERE = 600, 610, 700, 750, 800
#: common.cuh ``GGML_CUDA_CC_OFFSET_MTHREADS``: every NVIDIA ``cc`` is below it.
OFFSET_MTHREADS = 0x0100000
#: mmvq.cuh ``MMVQ_MAX_BATCH_SIZE``: the most src1 columns of the quantized vector kernel.
MMVQ_MAX_BATCH_SIZE = 8
#: mmq.cuh ``MMQ_DP4A_MAX_BATCH_SIZE``: the dp4a tile kernel's most columns where f16 tensor
#: cores are there.
MMQ_DP4A_MAX_BATCH_SIZE = 64
#: mmf.cuh ``MMF_ROWS_PER_BLOCK`` (NVIDIA): src0's rows must be a multiple for ``mmf``.
MMF_ROWS_PER_BLOCK = 32
#: A warp on NVIDIA.
WARP_SIZE = 32
#: ggml_type_size of the float types.
TYPE_SIZE = {"f32": 4, "f16": 2, "bf16": 2}
#: mmq.cu ``ggml_cuda_should_use_mmq``: the src0 types of the quantized tile kernel (of those
#: ggml-python 0.0.45 names; the others fall to cuBLAS).
MMQ_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "mxfp4", "q2_K", "q3_K", "q4_K", "q5_K",
             "q6_K", "iq2_xxs", "iq2_xs", "iq2_s", "iq3_xxs", "iq3_s", "iq1_s", "iq4_xs",
             "iq4_nl")


class Kernel(Enum):
    """A path of ``ggml_cuda_mul_mat``: its name (the value) and what it computes in."""

    MMVF = "mmvf"
    MMF = "mmf"
    MMVQ = "mmvq"
    MMQ = "mmq"
    CUBLAS_BATCHED = "cuBLAS batched"
    CUBLAS = "cuBLAS"


#: What each path computes an f32 src0 in, TF32 on (only MMF and the cuBLAS paths take one).
TF32_CAUSES = {
    Kernel.MMF: "mmf tile kernel, mma tf32 for <= 16 columns",
    Kernel.CUBLAS: "cuBLAS in TF32 math mode",
    Kernel.CUBLAS_BATCHED: "cuBLAS batched, in TF32 math mode",
}


@dataclass(frozen=True)
class MulMat:
    """One MUL_MAT node as ggml-cuda's dispatch reads it: ggml type names (``f32``,
    ``q4_K``), ``ne`` (elements per axis, ggml order) and ``nb`` (bytes per step)."""

    src0_type: str
    src0_ne: Sequence[int]
    src0_nb: Sequence[int]
    src1_type: str
    src1_ne: Sequence[int]
    src1_nb: Sequence[int]
    dst_type: str = "f32"

    @classmethod
    def of_graph(cls, description: Mapping, position: int) -> MulMat:
        """The node at ``position`` (compute order) of a saved graph's ``graph.json``
        (:func:`audioparity.ggml.graphs.save_graph`).

        Raises:
            ValueError: that node is no MUL_MAT.
        """
        tensors = description["tensors"]
        node = tensors[description["nodes"][position]]
        if node["op_name"] != "MUL_MAT":
            raise ValueError(f"node {position} is a {node['op_name']}, not a MUL_MAT")
        src0, src1 = (tensors[i] for i in node["src"][:2])
        return cls(src0["type_name"], src0["ne"], src0["nb"], src1["type_name"], src1["ne"],
                   src1["nb"], node["type_name"])

    @property
    def quantized(self) -> bool:
        """src0 is a block type (ggml_is_quantized: a MUL_MAT's src0 is a float or one)."""
        return self.src0_type not in FLOAT_TYPES


def _aligned(mm: MulMat, size: int) -> bool:
    """src0 rows contiguous and every stride a multiple of 2 values (mmf.cu / mmvf.cu:
    "Pointers not aligned to the size of half2/nv_bfloat162/float2 would result in a crash")."""
    return mm.src0_nb[0] == size and all(nb % (2 * size) == 0 for nb in mm.src0_nb[1:4])


def should_use_mmvf(mm: MulMat, cc: int) -> bool:
    """mmvf.cu ``ggml_cuda_should_use_mmvf`` on an NVIDIA device."""
    size = TYPE_SIZE[mm.src0_type]
    if mm.src0_ne[0] % 2 != 0 or not _aligned(mm, size):
        return False
    ne11 = mm.src1_ne[1]
    if mm.src0_type == "f32":
        if cc >= AMPERE:
            return ne11 <= 3
        return ne11 <= 4 if cc >= TURING else ne11 <= 3
    small = mm.src0_ne[1] <= 512 or mm.src0_ne[2] * mm.src0_ne[3] == 1
    tensor_cores = VOLTA if mm.src0_type == "f16" else AMPERE  # fp16_/bf16_mma_hardware
    if cc >= AMPERE:  # its next branch, cc >= GGML_CUDA_CC_ADA_LOVELACE, is this one natively
        return small and ne11 == 1
    if cc >= tensor_cores:
        return small and ne11 <= 3
    return ne11 <= 8


def should_use_mmf(mm: MulMat, cc: int, tf32: bool) -> bool:
    """mmf.cu ``ggml_cuda_should_use_mmf`` (not for MUL_MAT_ID) on an NVIDIA device; with our
    patch an f32 src0 takes it only with ``tf32``."""
    if mm.quantized:
        return False
    size = TYPE_SIZE[mm.src0_type]
    if mm.src0_ne[0] % (WARP_SIZE * (4 // size)) != 0 or not _aligned(mm, size):
        return False
    if mm.src0_ne[1] % MMF_ROWS_PER_BLOCK != 0 or mm.src1_ne[1] > 16:
        return False
    if mm.src0_type == "f32":
        return cc >= AMPERE and tf32  # ampere_mma_available
    if mm.src0_type == "f16":
        return cc == VOLTA or cc >= TURING  # volta_mma_available || turing_mma_available
    return cc >= AMPERE


def should_use_mmq(mm: MulMat, cc: int) -> bool:
    """mmq.cu ``ggml_cuda_should_use_mmq`` on an NVIDIA device."""
    if mm.src0_type not in MMQ_TYPES:
        return False
    if cc >= TURING:
        return True
    if cc < DP4A:
        return False
    return not cc >= VOLTA or mm.src1_ne[1] < MMQ_DP4A_MAX_BATCH_SIZE


def mul_mat_kernel(mm: MulMat, cc: int, *, tf32: bool = True) -> Kernel:
    """The path ``ggml_cuda_mul_mat`` (ggml-cuda.cu) computes ``mm`` with on one NVIDIA
    device of compute capability ``cc`` (module docstring), ``tf32`` False where
    :data:`DISABLE_TF32` is set.

    Raises:
        ValueError: ``cc`` is not an NVIDIA compute capability.
    """
    if not 0 < cc < OFFSET_MTHREADS:
        raise ValueError(f"compute capability {cc}: not an NVIDIA device's, as ggml-cuda "
                         "encodes it (100*major + 10*minor)")
    f32_io = mm.src1_type == "f32" and mm.dst_type == "f32"
    if not mm.quantized and f32_io and should_use_mmvf(mm, cc):
        return Kernel.MMVF
    if not mm.quantized and f32_io and should_use_mmf(mm, cc, tf32):
        return Kernel.MMF
    if mm.quantized and f32_io and mm.src1_ne[1] <= MMVQ_MAX_BATCH_SIZE:
        return Kernel.MMVQ  # ggml_cuda_should_use_mmvq: ne11 <= MMVQ_MAX_BATCH_SIZE on NVIDIA
    if mm.quantized and f32_io and should_use_mmq(mm, cc):
        return Kernel.MMQ
    batched = (mm.src0_type == "f32"
               or (mm.src0_type == "f16" and (mm.src1_type == "f16" or cc >= PASCAL
                                              and cc != DP4A))
               or (mm.src0_type == "bf16" and cc >= AMPERE))
    transposed = mm.src0_nb[0] > mm.src0_nb[1] or mm.src1_nb[0] > mm.src1_nb[1]
    if batched and not transposed and mm.src1_ne[2] * mm.src1_ne[3] > 1:
        return Kernel.CUBLAS_BATCHED
    return Kernel.CUBLAS


def tf32_cause(mm: MulMat, cc: int, env: Mapping[str, str]) -> str | None:
    """Why ``mm`` computed in TF32 on that device under the backend environment ``env``
    (a dump's ``backend_env``): ``TF32 (cuBLAS in TF32 math mode; GGML_CUDA_DISABLE_TF32
    (cuda-strict) computes it in float32)``; None where it computed in float32 (an f32 src0 on
    ``mmvf``, :data:`DISABLE_TF32` set) or took no f32 path at all (f16, bf16, quantized).

    Raises:
        ValueError: ``cc`` is not an NVIDIA compute capability.
    """
    tf32 = DISABLE_TF32 not in env
    if mm.src0_type != "f32" or not tf32:
        return None
    kernel = mul_mat_kernel(mm, cc, tf32=tf32)
    if kernel not in TF32_CAUSES:
        return None
    return (f"TF32 ({TF32_CAUSES[kernel]}; {DISABLE_TF32}=1 (cuda-strict) computes it in "
            "float32)")


def compute_capability(properties: Mapping[str, str]) -> int | None:
    """A CUDA device's ``cc`` as ggml-cuda encodes it, from what a dump recorded of it
    (``device_properties``, :func:`audioparity.ggml.backends.device_properties`:
    ``compute capability: "9.0"`` gives 900); None where it is not recorded."""
    major, _, minor = str(properties.get("compute capability", "")).partition(".")
    if not (major.isdigit() and minor.isdigit()):
        return None
    return 100 * int(major) + 10 * int(minor)


def node_cause(description: Mapping, position: int, manifest: Mapping) -> str | None:
    """Why the node at ``position`` of a saved graph (its ``graph.json``) differs from the CPU,
    where ggml-cuda's kernel says: :func:`tf32_cause` of a MUL_MAT in a dump (its
    ``manifest``) computed on the ``cuda`` backend, under that dump's ``backend_env`` and on
    its device's recorded compute capability (``device_properties``); None for another op or
    backend, or a dump that recorded no compute capability.
    """
    tensors, nodes = description["tensors"], description["nodes"]
    if manifest.get("backend") != "cuda" or tensors[nodes[position]]["op_name"] != "MUL_MAT":
        return None
    cc = compute_capability(manifest.get("device_properties") or {})
    if cc is None:
        return None
    return tf32_cause(MulMat.of_graph(description, position), cc,
                      manifest.get("backend_env") or {})
