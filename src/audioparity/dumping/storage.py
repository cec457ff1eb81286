"""How ggml stores a weight and how its CPU backend rounds a matmul's input, as float32 values.

Both sides use it: the ggml ports pick each weight's storage type with
:func:`storage_or_fallback` and convert it with :func:`quantize`, and a quantization-aware
reference (:func:`emulating`) computes in torch with the weights as ggml stores them
(:func:`stored`) and every matmul input rounded as ggml's CPU backend rounds it
(:func:`matmul_input`). Every conversion is ggml's own (the ``ggml`` library, imported on first
use; torch only once :func:`emulating` runs): ``ggml_quantize_chunk`` and the type's
``to_float`` for weights, the CPU backend's ``from_float`` of the type's ``vec_dot_type`` for
matmul inputs (``ggml-cpu.c``, ``type_traits_cpu``). The fallbacks of a block type that cannot
hold a weight's rows are llama.cpp's (``tensor_type_fallback`` of ``llama-quant.cpp``).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    STORAGE_TYPES,
)

#: Values per block of each storage type (ggml ``ggml_blck_size``): a block type's rows (the
#: last numpy axis, ggml ``ne[0]``) are a multiple of it.
BLOCK_SIZES = {"f32": 1, "f16": 1, "bf16": 1, "q8_0": 32, "q6_K": 256, "q5_1": 32, "q5_0": 32,
               "q5_K": 256, "q4_1": 32, "q4_0": 32, "q4_K": 256, "iq4_nl": 32, "mxfp4": 32,
               "q3_K": 256, "q2_K": 256}

#: Bits each value takes in a storage type, scales included (ggml ``type_size * 8 /
#: blck_size``).
BITS_PER_WEIGHT = {"f32": 32.0, "f16": 16.0, "bf16": 16.0, "q8_0": 8.5, "q6_K": 6.5625,
                   "q5_1": 6.0, "q5_0": 5.5, "q5_K": 5.5, "q4_1": 5.0, "q4_0": 4.5, "q4_K": 4.5,
                   "iq4_nl": 4.5, "mxfp4": 4.25, "q3_K": 3.4375, "q2_K": 2.625}

#: The type the CPU backend converts a matmul's input to before multiplying it with a weight of
#: each storage type (``type_traits_cpu[type].vec_dot_type``).
VEC_DOT_TYPES = {"f32": "f32", "f16": "f16", "bf16": "bf16", "q8_0": "q8_0", "q6_K": "q8_K",
                 "q5_1": "q8_1", "q5_0": "q8_0", "q5_K": "q8_K", "q4_1": "q8_1", "q4_0": "q8_0",
                 "q4_K": "q8_K", "iq4_nl": "q8_0", "mxfp4": "q8_0", "q3_K": "q8_K",
                 "q2_K": "q8_K"}

#: What a 256-value k-quant falls back to for a weight whose rows it cannot hold
#: (llama.cpp's ``tensor_type_fallback``); a 32-value type that cannot hold them either falls
#: back to :data:`FALLBACK_STORAGE`.
BLOCK_FALLBACKS = {"q2_K": "q4_0", "q3_K": "q4_0", "q4_K": "q5_0", "q5_K": "q5_1",
                   "q6_K": "q8_0"}

#: Storage a weight falls back to when no block type of :data:`BLOCK_FALLBACKS` holds its rows.
FALLBACK_STORAGE = "f16"

#: Weight types whose ggml cells are compared with a quantization-aware reference: what ggml
#: computes at f32 is what torch computes, so f32 (and native) cells need none.
EMULATED_TYPES = tuple(t for t in STORAGE_TYPES if t != "f32")


def storage_supported(storage: str, shape: tuple[int, ...]) -> bool:
    """Whether an array of numpy ``shape`` can be stored as ``storage``.

    Raises:
        AudioparityError: an unknown storage type.
    """
    if storage not in STORAGE_TYPES:
        raise AudioparityError(
            f"unknown storage type {storage!r}; valid: {', '.join(STORAGE_TYPES)}"
        )
    return shape[-1] % BLOCK_SIZES[storage] == 0


def storage_or_fallback(name: str, wanted: str, shape: tuple[int, ...],
                        notes: list[str]) -> str:
    """``wanted`` when it can hold weight ``name`` of numpy ``shape`` (:func:`storage_supported`),
    else its fallback (:data:`BLOCK_FALLBACKS`, then :data:`FALLBACK_STORAGE`), with a line
    ``"<name> [shape]: <wanted> -> <stored>"`` appended to ``notes`` (the dump's manifest)."""
    if storage_supported(wanted, shape):
        return wanted
    fallback = BLOCK_FALLBACKS.get(wanted, FALLBACK_STORAGE)
    if not storage_supported(fallback, shape):
        fallback = FALLBACK_STORAGE
    notes.append(f"{name} {list(shape)}: {wanted} -> {fallback} (rows of {shape[-1]} values, "
                 f"blocks of {BLOCK_SIZES[wanted]})")
    return fallback


def storage_record(shapes: Mapping[str, tuple[int, ...]], storage: Mapping[str, str],
                   fallbacks: Sequence[str]) -> dict[str, Any]:
    """The ``storage`` field of a dump's manifest: ``bits_per_weight`` over every weight of
    ``shapes`` stored as ``storage`` (name -> type; :data:`BITS_PER_WEIGHT`), ``types`` (type
    -> how many tensors) and the ``fallbacks`` lines (:func:`storage_or_fallback`)."""
    values = {name: int(np.prod(shape, dtype=np.int64)) for name, shape in shapes.items()}
    bits = sum(values[name] * BITS_PER_WEIGHT[storage[name]] for name in values)
    types: dict[str, int] = {}
    for name in shapes:
        types[storage[name]] = types.get(storage[name], 0) + 1
    return {"bits_per_weight": round(bits / max(sum(values.values()), 1), 4),
            "types": dict(sorted(types.items())), "fallbacks": list(fallbacks)}


@cache
def _ggml():
    """The ggml library, its CPU backend's tables initialized."""
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    import ggml

    ggml.ggml_cpu_init()
    return ggml


def ggml_type(name: str) -> int:
    """The ggml type number of storage or input type ``name`` (``q4_K`` -> ``GGML_TYPE_Q4_K``)."""
    return getattr(_ggml(), f"GGML_TYPE_{name.upper()}")


def _rows(values: np.ndarray, name: str) -> tuple[np.ndarray, int, int]:
    """``values`` as contiguous float32 rows of the last axis, checked against ``name``'s block
    size; the array, its row count and row length."""
    x = np.ascontiguousarray(values, dtype=np.float32)
    block = _ggml().ggml_blck_size(ggml_type(name))
    if x.ndim == 0 or x.shape[-1] % block:
        raise AudioparityError(f"{name} cannot store rows of {x.shape[-1] if x.ndim else 1} "
                               f"values (blocks of {block})")
    return x, x.size // x.shape[-1], x.shape[-1]


def _f32_pointer(x: np.ndarray):
    return x.ctypes.data_as(ctypes.POINTER(ctypes.c_float))


def quantize(values: np.ndarray, storage: str) -> np.ndarray:
    """The bytes ggml stores for float32 ``values`` ``[..., K]`` as ``storage`` (rows along the
    last axis; ``ggml_quantize_chunk``, which also rounds f16 and bf16): uint8, ``rows *
    ggml_row_size(K)`` long; float32 values are their own bytes.

    Raises:
        AudioparityError: an unknown type, or rows the block type cannot hold.
    """
    storage_supported(storage, np.shape(values) or (1,))
    x, rows, k = _rows(values, storage)
    if storage == "f32":
        return x.reshape(-1).view(np.uint8)
    ggml, type_ = _ggml(), ggml_type(storage)
    raw = np.empty(ggml.ggml_row_size(type_, k) * rows, dtype=np.uint8)
    written = ggml.ggml_quantize_chunk(type_, _f32_pointer(x), raw.ctypes.data_as(ctypes.c_void_p),
                                       0, rows, k, None)
    if written != raw.nbytes:
        raise AudioparityError(f"ggml_quantize_chunk wrote {written} bytes, expected {raw.nbytes}")
    return raw


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...]) -> np.ndarray:
    """float32 values of numpy ``shape`` from the bytes ``raw`` of ``type_name`` (a storage
    type, or an input type ``q8_1``/``q8_K``): ggml's ``to_float``, or for the input types,
    which have none, ``q * d`` of each block (``block_q8_1``: f16 ``d``, f16 ``s``, 32 int8;
    ``block_q8_K``: float32 ``d``, 256 int8, 16 int16 sums).
    """
    n = int(np.prod(shape, dtype=np.int64))
    if type_name == "f32":
        return raw.view(np.float32).reshape(shape).copy()
    if type_name in ("q8_1", "q8_K"):
        scale_dtype, extra, block = ((np.float16, 2, 32) if type_name == "q8_1"
                                     else (np.float32, 32, 256))
        head = np.dtype(scale_dtype).itemsize + (2 if type_name == "q8_1" else 0)
        blocks = raw.reshape(-1, head + block + (0 if type_name == "q8_1" else extra))
        d = blocks[:, :np.dtype(scale_dtype).itemsize].copy().view(scale_dtype).astype(np.float32)
        q = blocks[:, head:head + block].copy().view(np.int8).astype(np.float32)
        return (q * d).reshape(shape)
    ggml = _ggml()
    out = np.empty(n, dtype=np.float32)
    traits = ggml.ggml_get_type_traits(ggml_type(type_name)).contents
    traits.to_float(raw.ctypes.data_as(ctypes.c_void_p), _f32_pointer(out), n)
    return out.reshape(shape)


def stored(values: np.ndarray, storage: str) -> np.ndarray:
    """``values`` ``[..., K]`` as ggml stores them as ``storage`` (:func:`quantize`), read back
    as float32 by ggml's ``to_float``: bit for bit what a ggml port computes with.

    Raises:
        AudioparityError: an unknown storage type, or rows the block type cannot hold.
    """
    x = np.ascontiguousarray(values, dtype=np.float32)
    with np.errstate(over="ignore"):
        return dequantize(quantize(x, storage), storage, x.shape)


def _input_bytes(values: np.ndarray, weight_storage: str) -> tuple[np.ndarray, np.ndarray, str]:
    """A matmul's input as float32 rows, the bytes the CPU's ``from_float`` converts them to for
    a weight of ``weight_storage``, and their type (:data:`VEC_DOT_TYPES`)."""
    storage_supported(weight_storage, (1,))
    input_type = VEC_DOT_TYPES[weight_storage]
    x, rows, k = _rows(values, input_type)
    if input_type == "f32":
        return x, x.reshape(-1).view(np.uint8), input_type
    ggml, type_ = _ggml(), ggml_type(input_type)
    raw = np.zeros(ggml.ggml_row_size(type_, k) * rows, dtype=np.uint8)  # q8_K skips sums of 0
    from_float = ggml.ggml_get_type_traits_cpu(type_).contents.from_float
    # blocks never cross a row (K is a multiple of the block): all rows in one call
    from_float(_f32_pointer(x), raw.ctypes.data_as(ctypes.c_void_p), x.size)
    return x, raw, input_type


def matmul_input(values: np.ndarray, weight_storage: str) -> np.ndarray:
    """A matmul's input ``[..., K]`` as ggml's CPU backend rounds it before multiplying it with
    a weight stored as ``weight_storage``: converted by the CPU's ``from_float`` to that type's
    ``vec_dot_type`` (one of :data:`VEC_DOT_TYPES`) and read back
    as float32 (:func:`dequantize`). The products are then summed in float32; for a q8_1 input,
    add :func:`min_term`.

    Raises:
        AudioparityError: an unknown storage type, or a K the input type's blocks cannot hold.
    """
    x, raw, input_type = _input_bytes(values, weight_storage)
    if input_type == "f32":
        return x.copy()
    with np.errstate(invalid="ignore", over="ignore"):  # an inf scale gives inf and NaN, kept
        return dequantize(raw, input_type, x.shape)


def min_term(values: np.ndarray, weight: np.ndarray, weight_storage: str) -> np.ndarray | None:
    """What ggml's CPU dot product adds to ``matmul_input(values) @ weight.T`` for a weight type
    with a block minimum (q4_1, q5_1): it multiplies each weight block's minimum ``m`` by the
    input block's ``s = d * sum(q)`` stored as f16 (``block_q8_1.s``, ``vec_dot_q4_1_q8_1``),
    where the rounded input's product carries the exact sum; the difference, ``sum_b m[o, b] *
    (s[b] - sum_i x[b, i])``, shape ``[..., out]``. None for any other weight type.

    Args:
        values: the matmul's input ``[..., K]`` (float32, before rounding).
        weight: the weight as stored (:func:`stored`), ``[out, K]``; a block's minimum is its
            smallest stored value (the block's ``m``: its smallest value quantizes to 0).
    """
    if VEC_DOT_TYPES.get(weight_storage) != "q8_1":
        return None
    x, raw, _ = _input_bytes(values, weight_storage)
    blocks = raw.reshape(-1, 36)
    s = blocks[:, 2:4].copy().view(np.float16).astype(np.float64).reshape(*x.shape[:-1], -1)
    rounded = dequantize(raw, "q8_1", x.shape).astype(np.float64)
    exact = rounded.reshape(*x.shape[:-1], -1, 32).sum(axis=-1)
    mins = np.asarray(weight, np.float64).reshape(weight.shape[0], -1, 32).min(axis=-1)
    return ((s - exact) @ mins.T).astype(np.float32)


#: File in a dump holding, for each weight it stored, one hash per block of its bytes
#: (:func:`block_hashes`); the manifest's ``storage.hashes`` has one per weight.
BLOCK_HASHES = "storage_blocks.npz"

_HASH_WORDS = np.random.default_rng(0x9E3779B9).integers(1, 2**63, 64, dtype=np.uint64) | 1


def block_hashes(raw: np.ndarray, storage: str, shape: tuple[int, ...]) -> np.ndarray:
    """A 64-bit hash of each block of a weight's stored bytes ``raw`` (:func:`quantize` of an
    array of numpy ``shape``): for a block type, of each ggml block (``ggml_type_size``
    bytes), in row order; for a float type, of each row. Not cryptographic: it tells two
    quantizations of one weight apart and says which block differs.
    """
    rows = int(np.prod(shape[:-1], dtype=np.int64))
    per_row = shape[-1] // BLOCK_SIZES[storage] if BLOCK_SIZES[storage] > 1 else 1
    blocks = raw.reshape(rows * per_row, -1)
    pad = (-blocks.shape[1]) % 8
    if pad:
        blocks = np.concatenate([blocks, np.zeros((len(blocks), pad), np.uint8)], axis=1)
    words = blocks.view("<u8")
    weights = np.resize(_HASH_WORDS, words.shape[1])
    with np.errstate(over="ignore"):
        mixed = (words * weights).sum(axis=1, dtype=np.uint64)
        return mixed ^ (mixed >> np.uint64(29))


def tensor_hash(hashes: np.ndarray) -> str:
    """One hex digest of a weight's :func:`block_hashes`."""
    import hashlib

    return hashlib.sha256(np.ascontiguousarray(hashes).tobytes()).hexdigest()[:16]



@dataclass
class StoredWeights:
    """What a port (or an emulation) stored: a note per weight stored as its fallback, and each
    weight's storage type and :func:`block_hashes`; a dump records it
    (:meth:`~audioparity.dumping.artifacts.DumpWriter.add_storage`)."""

    notes: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, np.ndarray] = field(default_factory=dict)
    #: The model's matmul weights, each as ``[rows, row length]`` (an emulation's: those a
    #: storage verdict asks the weight type of, :func:`storage_verdict`).
    matmul: dict[str, list[int]] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The manifest's part: ``tensor_types`` (weight -> storage type), one hash per
        weight (``hashes``, :func:`tensor_hash`) and, from an emulation, ``matmul_weights``
        (weight -> ``[rows, row length]``)."""
        return {"tensor_types": dict(self.types),
                "hashes": {name: tensor_hash(h) for name, h in self.hashes.items()},
                **({"matmul_weights": dict(self.matmul)} if self.matmul else {})}


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """``(rows, row length)`` of a tensor of numpy ``shape`` as ggml stores it: its last axis
    is the row (trailing axes of 1 dropped first: a pointwise kernel ``[out, in, 1]`` is the
    matrix ``[out, in]``), every other axis counts rows."""
    axes = list(shape)
    while len(axes) > 1 and axes[-1] == 1:
        axes.pop()
    return int(np.prod(axes[:-1], dtype=np.int64)), int(axes[-1]) if axes else 1


def stored_bytes(type_name_: str, shape: Sequence[int]) -> int:
    """The bytes ggml stores for a tensor of numpy ``shape`` as ``type_name_``
    (``ggml_row_size`` of its rows)."""
    rows, k = matrix_shape(shape) if shape else (1, 1)
    return rows * _ggml().ggml_row_size(ggml_type(type_name_), k)
