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
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    FLOAT_STORAGE_TYPES,
    FLOAT_TYPES,
    RECIPE_SEPARATOR,
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


@dataclass(frozen=True)
class Recipe:
    """A weight type that keeps some matmul weights wider: every matmul weight stored as
    ``base`` but those of ``overrides`` (weight name, as the checkpoint names it -> storage
    type). Its weight type is ``<base>+<name>`` (``q4_K+recipe``); ``audioparity precision``
    writes one (:mod:`audioparity.compare.precision`)."""

    name: str
    base: str
    overrides: Mapping[str, str]

    @property
    def weight_type(self) -> str:
        return f"{self.base}{RECIPE_SEPARATOR}{self.name}"

    def storage(self, weight: str) -> str:
        """The storage type ``weight`` asks for (before any fallback)."""
        return self.overrides.get(weight, self.base)

    @classmethod
    def uniform(cls, weight_type: str) -> Recipe:
        """Every matmul weight as ``weight_type``: no override."""
        return cls("", weight_type, {})


def type_name(weight_type: str | Recipe | FileStorage) -> str:
    """The name of a weight type, recipe or storage file's cell (``q4_K``, ``q4_K+recipe``)."""
    return weight_type if isinstance(weight_type, str) else weight_type.weight_type


def read_recipe_document(path: Path) -> dict[str, Any]:
    """The recipe document in the JSON file ``path`` (written by ``audioparity precision``, or
    a user's with at least ``{"base": type, "overrides": {weight: type}}``).

    Raises:
        AudioparityError: an unreadable file, a missing ``base`` or ``overrides``, or an
            override that is no storage type.
    """
    import json

    try:
        data = json.loads(Path(path).read_text())
        base, overrides = data["base"], dict(data["overrides"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AudioparityError(f"recipe {path}: unreadable ({err}); expected the JSON that "
                               "audioparity precision writes") from None
    wrong = {w: t for w, t in overrides.items() if t not in STORAGE_TYPES}
    if not isinstance(base, str) or wrong:
        weight, type_ = next(iter(wrong.items()), ("base", base))
        raise AudioparityError(f"recipe {path}: {weight} asks for {type_!r}; valid: "
                               f"{', '.join(STORAGE_TYPES)}")
    return data


def read_recipe(path: Path, weight_type: str) -> Recipe:
    """The recipe of ``weight_type`` (``<base>+<name>``) in the JSON file ``path``
    (:func:`read_recipe_document`).

    Raises:
        AudioparityError: an unreadable file, a base that is not the weight type's, or an
            override that is no storage type.
    """
    base, _, name = weight_type.partition(RECIPE_SEPARATOR)
    data = read_recipe_document(path)
    recipe = Recipe(name, data["base"], dict(data["overrides"]))
    if not name or recipe.base != base:
        raise AudioparityError(f"recipe {path}: its base is {recipe.base}, so its weight type is "
                               f"{recipe.base}{RECIPE_SEPARATOR}<name>, not {weight_type}")
    return recipe


#: The architecture of a storage file (:func:`write_stored`): our port's converted weights
#: (rule ggml_weights), and a third-party port's model file renamed to the checkpoint's names
#: (rule candidate_model), which a storage-matched reference computes with.
STORED_ARCHITECTURE = "audioparity-weights"


@dataclass(frozen=True)
class StoredTensor:
    """A tensor as a ggml model file stores it: its name, its shape in numpy's order (rows
    last: ggml's ``ne`` reversed), its ggml type's name (``q4_K``, as ``ggml_type_name``
    writes it) and, where it was read, its bytes (uint8, ``rows * ggml_row_size``)."""

    name: str
    shape: tuple[int, ...]
    type: str
    data: np.ndarray | None = field(default=None, repr=False, compare=False)

    @property
    def values(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))


def matrix_shape(shape: Sequence[int]) -> tuple[int, int]:
    """``(rows, row length)`` of a tensor of numpy ``shape`` as ggml stores it: its last axis
    is the row (trailing axes of 1 dropped first: a pointwise kernel ``[out, in, 1]`` is the
    matrix ``[out, in]``), every other axis counts rows."""
    axes = list(shape)
    while len(axes) > 1 and axes[-1] == 1:
        axes.pop()
    return int(np.prod(axes[:-1], dtype=np.int64)), int(axes[-1]) if axes else 1


def write_stored(path: Path, tensors: Iterable[StoredTensor],
                 metadata: Mapping[str, str] | None = None) -> None:
    """Write ``tensors`` (each with its bytes) as a GGUF file (architecture
    :data:`STORED_ARCHITECTURE`, string ``metadata`` under ``audioparity.*``), atomically: a file
    at ``path`` is always complete. A block type's trailing axes of 1 are dropped (a pointwise
    kernel ``[out, in, 1]`` in q8_0 is the matrix ``[out, in]``, as ggml can hold it).

    Raises:
        AudioparityError: a tensor without its bytes, or bytes of another size than its shape
            and type take.
    """
    import gguf

    path, tensors = Path(path), list(tensors)
    for tensor in tensors:
        if tensor.data is None or tensor.data.nbytes != stored_bytes(tensor.type, tensor.shape):
            raise AudioparityError(f"{path}: tensor {tensor.name} {list(tensor.shape)} "
                                   f"{tensor.type}: its bytes are not its shape's")
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(partial), arch=STORED_ARCHITECTURE)
    for key, value in (metadata or {}).items():
        writer.add_string(f"audioparity.{key}", value)
    for tensor in tensors:
        shape = list(tensor.shape) or [1]
        while BLOCK_SIZES[tensor.type] > 1 and len(shape) > 1 and shape[-1] == 1:
            shape.pop()  # a block type's rows are never 1 value long
        rows = int(np.prod(shape[:-1], dtype=np.int64))
        writer.add_tensor_info(tensor.name, (*shape[:-1], tensor.data.nbytes // rows),
                               np.dtype(np.uint8), tensor.data.nbytes,
                               raw_dtype=gguf.GGMLQuantizationType(ggml_type(tensor.type)))
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for tensor in tensors:
            writer.write_tensor_data(np.ascontiguousarray(tensor.data).reshape(-1))
        writer.close()
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)


def stored_bytes(type_name_: str, shape: Sequence[int]) -> int:
    """The bytes ggml stores for a tensor of numpy ``shape`` as ``type_name_``
    (``ggml_row_size`` of its rows)."""
    rows, k = matrix_shape(shape) if shape else (1, 1)
    return rows * _ggml().ggml_row_size(ggml_type(type_name_), k)


def read_stored(path: Path) -> dict[str, StoredTensor]:
    """The tensors of a GGUF file by name, each with its bytes (mapped read-only, not read).

    Raises:
        AudioparityError: not a GGUF file gguf can read.
    """
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (OSError, ValueError) as err:
        raise AudioparityError(f"{path}: not a GGUF file ({err})") from None
    return {tensor.name: StoredTensor(tensor.name, tuple(int(n) for n in reversed(tensor.shape)),
                                      ggml_name(tensor.tensor_type),
                                      np.asarray(tensor.data).reshape(-1).view(np.uint8))
            for tensor in reader.tensors}


def ggml_name(quant_type: Any) -> str:
    """ggml's name of a ``gguf.GGMLQuantizationType`` (``Q4_K`` -> ``q4_K``, ``BF16`` ->
    ``bf16``, ``IQ4_NL`` -> ``iq4_nl``), the project's storage types' spelling."""
    name = quant_type.name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


@dataclass(frozen=True)
class FileStorage:
    """The weights a candidate computes with, as its own model file stores them, by the
    checkpoint's names: a storage file (:func:`write_stored`; a third-party port's file renamed
    by its adapter's weight map, or our port's converted weights). A storage-matched reference
    (:func:`emulating`) computes with exactly these bytes, each weight's matmul input rounded as
    the CPU backend rounds it for the weight's type.

    Attributes:
        path: the storage file.
        tensors: its tensors by checkpoint name (:func:`read_stored`).
        digest: the sha256 of its bytes: what a storage-matched reference's dumps are kept by.
        weight_type: the weight type the candidate was asked for (its cells' ``weight_type``).
    """

    path: Path
    tensors: Mapping[str, StoredTensor]
    digest: str
    weight_type: str

    @classmethod
    def read(cls, path: Path, weight_type: str) -> FileStorage:
        """The storage file ``path`` of a cell of ``weight_type``.

        Raises:
            AudioparityError: not a GGUF file.
        """
        from audioparity.dumping.provenance import sha256_of

        return cls(Path(path), read_stored(Path(path)), sha256_of(Path(path)), weight_type)

    def held(self, name: str, shape: tuple[int, ...], notes: list[str]) -> StoredTensor | None:
        """The file's tensor of weight ``name``, whose checkpoint tensor has numpy ``shape``;
        None, with a note, where the file has no such weight, or holds it in another number of
        rows or another row length (:func:`matrix_shape`)."""
        tensor = self.tensors.get(name)
        if tensor is None:
            notes.append(f"{name}: not in the candidate's file {self.path.name}; computed "
                         "float32")
        elif matrix_shape(tensor.shape) != matrix_shape(shape):
            notes.append(f"{name}: the candidate's file holds it as {list(tensor.shape)}, not as "
                         f"the checkpoint's {list(shape)} (rows of {matrix_shape(shape)[1]}); "
                         "computed float32")
            tensor = None
        return tensor


def rows_of(tensor: StoredTensor, first: int, count: int) -> np.ndarray:
    """The bytes of rows ``first`` to ``first + count`` of a stored tensor."""
    row = stored_bytes(tensor.type, (1, matrix_shape(tensor.shape)[1]))
    return tensor.data[first * row:(first + count) * row]


def storage_verdict(asked: str, matmul: Mapping[str, Sequence[int]], stored: Mapping[str, str],
                    *, overrides: Mapping[str, str] | None = None, mix: bool = False,
                    tool: str = "its quantizer") -> tuple[bool, str]:
    """Whether a candidate's file honours the weight type its cell asked for, and one line
    saying how (the storage part of a quantized cell's verdict: docs/quantization.md).

    Each matmul weight (``matmul``: name -> ``[rows, row length]``, the reference's) is asked
    for ``asked`` (a recipe's ``overrides`` first) and stored as ``stored`` says (name ->
    type, the candidate's record). Where the asked type's blocks cannot hold its rows, any
    type is a fallback (listed). Where they can, a float type for a block type asked is a
    weight left unquantized, and fails the verdict; any other type fails it too, unless the
    cell's weight type is a ``mix`` (a tool's own per-tensor choice, as llama.cpp's
    ``Q4_K_M``), where it is listed. A weight the file lacks is listed (the reference computes
    it float32).

    Returns:
        ``(honoured, line)``: ``asked q4_K: 31 of 38 matmul weights q4_K; unquantized where
        q4_K fits: 4 f16 (a, b, c, ...); ...``.
    """
    groups: dict[str, dict[str, list[str]]] = {}
    wide = 0
    for name, (_, row) in matmul.items():
        want = (overrides or {}).get(name, asked)
        have = stored.get(name)
        if have == want:
            wide += 1
            continue
        if have is None:
            kind = "not in its file (the reference computes them float32)"
        elif not storage_supported(want, (row,)):
            kind = f"fallbacks, rows {want} cannot hold"
        elif have in FLOAT_TYPES and want not in FLOAT_TYPES:
            kind = f"unquantized where {want} fits"
        else:
            kind = f"{'its mix' if mix else tool + ' chose another type'} where {want} fits"
        groups.setdefault(kind, {}).setdefault(have or "-", []).append(name)
    failed = any(kind.startswith("unquantized") or (not mix and "chose" in kind)
                 for kind in groups)
    parts = [f"asked {asked}{' (a mix)' if mix else ''}{' with a recipe' if overrides else ''}: "
             f"{wide} of {len(matmul)} matmul weights as asked"]
    for kind, by_type in groups.items():
        listed = ", ".join(f"{len(names)} {have} ({_names(names)})" if have != "-"
                           else f"{len(names)} ({_names(names)})"
                           for have, names in sorted(by_type.items()))
        parts.append(f"{kind}: {listed}")
    return not failed, "; ".join(parts)


def _names(names: Sequence[str], shown: int = 3) -> str:
    return ", ".join(names[:shown]) + (f", ... {len(names) - shown} more"
                                       if len(names) > shown else "")


#: The NMSE past which a candidate's stored values are not a rounding of the checkpoint's: a
#: type's own rounding moves a weight by far less (q2_K by about 0.1), a transposed or permuted
#: layout by about 2.
_UNLIKE = 0.5

#: Rows of a weight rounded at a time by :func:`emulating`: the rounding's temporaries stay
#: small beside a 151936-row embedding (1.2 GB in float32 at the 1.7B shape).
_ROWS_AT_ONCE = 4096


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


@contextmanager
def emulating(model: Any, weight_type: str | Recipe | FileStorage, keep: Collection[str] = (),
              prefix: str = "") -> Iterator[StoredWeights]:
    """Within the block, the torch ``model`` computes as a ggml port on the CPU backend does with
    its matmul weights stored as ``weight_type`` (one of :data:`EMULATED_TYPES`, or a
    :class:`Recipe` giving each weight's), or with exactly the bytes a candidate's own file
    stores (a :class:`FileStorage`: the storage-matched reference); on leaving it, the model is
    float32 again (weights, hooks and forwards restored).

    The matmul weights are those of ``nn.Linear``, pointwise ``nn.Conv1d`` and ``nn.Conv2d``
    (kernel 1, one group; ggml runs them as matmuls over the channels), ``nn.Embedding`` (a
    lookup: rounded weights, the rows read as stored) and ``nn.LSTM`` (its input and recurrent
    matrices); each is stored as its type, or as its fallback where its rows are no multiple of
    the block size (:func:`storage_or_fallback`), and each matmul's input is rounded
    (:func:`matmul_input`) by a forward pre-hook, or for an LSTM by a step-by-step forward
    (torch's gate order ``i, f, g, o``). Other weights (norms, biases, conv kernels), and the
    modules named in ``keep`` (those a port keeps in float32), stay float32.
    A parameter shared by two modules (tied embeddings) is rounded once. A weight is named as
    the port names it: its parameter name less ``prefix``.

    With a :class:`FileStorage`, each matmul weight the file holds is its bytes, read by ggml's
    ``to_float``, in the file's type (no fallback is chosen: the file's is what the candidate
    computes with), and its input is rounded for that type; one the file lacks stays float32,
    noted. Any other parameter the file holds narrower than f32 (an f16 convolution kernel or
    bias) is its bytes too, and a convolution whose kernel the file holds as f16 has its input
    rounded to f16, as ggml's ``im2col`` in the kernel's type and the matmul after
    it compute (``ggml_conv_1d``, ``ggml_conv_2d``). The hashes it records are of ggml's own
    quantization of the checkpoint at each weight's type: what the candidate's bytes are
    measured against (``stored_weights``).

    Yields:
        What it stored (:class:`StoredWeights`): a note per weight stored as its fallback (the
        ggml dump's manifest notes them alike), each weight's type and block hashes.

    Raises:
        AudioparityError: ``weight_type`` is not emulated, a recipe override that names no
            matmul weight of the model, an LSTM with a projection, or a convolution kernel a
            file stores as a block type.
    """
    if isinstance(weight_type, FileStorage):
        recipe: Recipe | FileStorage = weight_type
    else:
        recipe = weight_type if isinstance(weight_type, Recipe) else Recipe.uniform(weight_type)
        if recipe.base not in EMULATED_TYPES:
            raise AudioparityError(f"no quantization-aware reference for weight type "
                                   f"{recipe.base!r}; emulated: {', '.join(EMULATED_TYPES)}")
    emulation = _Emulation(recipe, prefix)
    try:
        emulation.apply(model, keep)
        unused = (sorted(set(recipe.overrides) - set(emulation.stored.types))
                  if isinstance(recipe, Recipe) else [])
        if unused:
            raise AudioparityError(f"recipe {recipe.weight_type}: {unused[0]} is no matmul weight "
                                   f"of this model ({len(unused)} override(s) name none)")
        yield emulation.stored
    finally:
        emulation.restore()


def matmul_modules(model: Any, keep: Collection[str] = ()) -> Iterator[tuple[str, Any, str]]:
    """The modules of torch ``model`` whose weights a ggml port multiplies as matrices (but those
    named in ``keep``), as ``(name, module, kind)``: ``linear`` (``nn.Linear``), ``conv`` (a
    pointwise ``nn.Conv1d``/``nn.Conv2d``: kernel 1, one group), ``embedding`` (a lookup of
    stored rows) and ``lstm`` (its ``weight_ih_l*`` and ``weight_hh_l*``).

    Raises:
        AudioparityError: an LSTM with a projection (ggml ports have none to mirror).
    """
    import torch

    for name, module in model.named_modules():
        if name in keep:
            continue
        if isinstance(module, torch.nn.Linear):
            yield name, module, "linear"
        elif isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d) and module.groups == 1 \
                and set(module.kernel_size) == {1}:
            yield name, module, "conv"
        elif isinstance(module, torch.nn.Embedding):
            yield name, module, "embedding"
        elif isinstance(module, torch.nn.LSTM):
            if module.proj_size:
                raise AudioparityError(f"{name}: an LSTM with proj_size={module.proj_size} "
                                       "is not emulated")
            yield name, module, "lstm"


class _Emulation:
    """What :func:`emulating` changed in a model, to restore it: the weights rounded (each
    parameter once, with its float32 copy), the input hooks, the LSTMs stepped."""

    def __init__(self, policy: Recipe | FileStorage, prefix: str = "") -> None:
        self.policy, self.prefix = policy, prefix
        self.stored = StoredWeights()
        self.notes = self.stored.notes
        self.originals: dict[int, tuple[Any, Any]] = {}
        self.types: dict[int, str | None] = {}
        self.hooks: list[Any] = []
        self.lstms: list[Any] = []

    def store(self, name: str, param, shape: tuple[int, ...] | None = None) -> str | None:
        """Round parameter ``name`` in place as its storage holds it (viewed as the matrix
        ``shape``; without one, a matmul weight's first two axes: a pointwise kernel ``[out,
        in, 1(, 1)]`` is a matrix); its storage type, None where it stays float32 (a file that
        lacks it)."""
        if id(param) in self.types:  # a parameter of two modules (tied): stored once
            return self.types[id(param)]
        name = name.removeprefix(self.prefix)
        if shape is None:
            shape = tuple(param.shape[:2])
            self.stored.matmul[name] = list(shape)
        if isinstance(self.policy, FileStorage):  # the file's type: what the port computes with
            held = self.policy.held(name, tuple(param.shape), self.notes)
            storage = held.type if held is not None else None
        else:
            held = None
            storage = storage_or_fallback(name, self.policy.storage(name), shape, self.notes)
        self.types[id(param)] = storage
        if storage is None:
            return None
        self.originals[id(param)] = (param, param.detach().clone())
        matrix = param.detach().numpy().reshape(shape)  # the parameter's own memory
        hashes, moved, total = [], 0.0, 0.0
        for first in range(0, shape[0], _ROWS_AT_ONCE):  # rows are stored independently
            rows = matrix[first:first + _ROWS_AT_ONCE]
            quantized = quantize(rows, storage)  # ggml's quantization of the checkpoint
            raw = rows_of(held, first, len(rows)) if held is not None else quantized
            hashes.append(block_hashes(quantized, storage, rows.shape))
            with np.errstate(over="ignore", invalid="ignore"):
                values = dequantize(raw, storage, rows.shape)
                if held is not None:
                    moved += float(np.sum((values.astype(np.float64) - rows) ** 2))
                    total += float(np.sum(rows.astype(np.float64) ** 2))
            rows[...] = values
        if held is not None and not moved <= _UNLIKE * max(total, 1e-30):
            self.notes.append(f"{name}: the candidate's values are not the checkpoint's "
                              f"(NMSE {moved / max(total, 1e-30):.3g} as {storage}): another "
                              "layout than its adapter maps, or its quantizer's fault")
        self.stored.types[name] = storage
        self.stored.hashes[name] = np.concatenate(hashes)
        return storage

    def round_input(self, module, storage: str, channels_last: bool) -> None:
        """Round ``module``'s input for a weight stored as ``storage`` (a pre-hook), and for a
        weight with block minimums add the dot product's :func:`min_term` to its output (a
        forward hook on the input the pre-hook saw)."""
        if storage == "f32":
            return
        inputs = []

        def pre_hook(_, args):
            if VEC_DOT_TYPES[storage] == "q8_1":
                inputs[:] = [args[0]]
            return (_rounded(args[0], storage, channels_last), *args[1:])

        self.hooks.append(module.register_forward_pre_hook(pre_hook))
        if VEC_DOT_TYPES[storage] == "q8_1":
            self.hooks.append(module.register_forward_hook(
                lambda m, _, out: out + _min_term(inputs.pop(), m.weight, storage,
                                                  channels_last)))

    def apply(self, model: Any, keep: Collection[str]) -> None:
        """Every matmul weight of ``model`` (but the modules of ``keep``) stored, and its
        input rounded (:func:`emulating`); with a file, its other parameters stored narrower
        than f32 too.

        Raises:
            AudioparityError: an LSTM with a projection; a convolution kernel a file stores as
                a block type.
        """
        for name, module, kind in matmul_modules(model, keep):
            if kind == "embedding":
                self.store(f"{name}.weight", module.weight)
            elif kind == "lstm":
                types = {param: self.store(f"{name}.{param}", getattr(module, param)) or "f32"
                         for param, _ in module.named_parameters() if param.startswith("weight_")}
                module.forward = _LstmSteps(module, types)
                self.lstms.append(module)
            else:
                storage = self.store(f"{name}.weight", module.weight)
                if storage is not None:
                    self.round_input(module, storage, channels_last=kind == "linear")
        if isinstance(self.policy, FileStorage):
            self.apply_narrow(model, keep)
            names = {name.removeprefix(self.prefix) for name, _ in (
                *model.named_parameters(remove_duplicate=False), *model.named_buffers())}
            unused = sorted(set(self.policy.tensors) - names)
            if unused:
                self.notes.append(f"{len(unused)} tensor(s) of the candidate's file are no "
                                  f"weight of the reference model: {', '.join(unused)}")

    def apply_narrow(self, model: Any, keep: Collection[str]) -> None:
        """The parameters other than matmul weights that the file stores narrower than f32
        (:func:`emulating`), a convolution's input rounded for its kernel's type.

        Raises:
            AudioparityError: a convolution kernel stored as a block type.
        """
        import torch

        for module_name, module in model.named_modules():
            if module_name in keep:
                continue
            for param_name, param in module.named_parameters(recurse=False):
                full = f"{module_name}.{param_name}" if module_name else param_name
                found = self.policy.tensors.get(full.removeprefix(self.prefix))
                if id(param) in self.types or found is None or found.type == "f32":
                    continue
                conv = isinstance(module, torch.nn.Conv1d | torch.nn.Conv2d) \
                    and param_name == "weight"
                if conv and found.type not in FLOAT_STORAGE_TYPES:
                    raise AudioparityError(f"{full}: the candidate's file stores this "
                                           f"convolution kernel as {found.type}; ggml's im2col "
                                           f"takes {' or '.join(FLOAT_STORAGE_TYPES)} only")
                storage = self.store(full, param, matrix_shape(param.shape))
                if conv and storage is not None:
                    self.round_input(module, storage, channels_last=False)

    def restore(self) -> None:
        """The model float32 again: hooks removed, LSTMs' own forward, weights copied back."""
        import torch

        for hook in self.hooks:
            hook.remove()
        for module in self.lstms:
            del module.forward
        with torch.no_grad():
            for param, original in self.originals.values():
                param.copy_(original)


def _rounded(tensor, storage: str, channels_last: bool):
    """torch ``tensor`` through :func:`matmul_input`, along its last axis or (``channels_last``
    False, a conv input ``[N, C, T]`` or ``[N, C, H, W]``) along axis 1."""
    import torch

    array = tensor.detach().float().numpy()
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    out = matmul_input(array, storage)
    if not channels_last:
        out = np.moveaxis(out, -1, 1)
    return torch.from_numpy(np.ascontiguousarray(out)).to(tensor.dtype)


def _min_term(tensor, weight, storage: str, channels_last: bool):
    """torch ``tensor``'s :func:`min_term` for ``weight`` (as stored; a pointwise kernel's
    trailing axes dropped), laid out as the module's output (channels on axis 1 for a conv)."""
    import torch

    array = tensor.detach().float().numpy()
    if not channels_last:
        array = np.moveaxis(array, 1, -1)
    w = weight.detach().numpy()
    out = min_term(array, w.reshape(w.shape[0], -1), storage)
    if not channels_last:
        out = np.moveaxis(out, -1, 1)
    return torch.from_numpy(np.ascontiguousarray(out)).to(tensor.dtype)


def _product(tensor, weight, storage: str):
    """``tensor @ weight.T`` as ggml's CPU backend computes it with ``weight`` stored as
    ``storage`` (already rounded): the input rounded, plus the :func:`min_term`."""
    product = _rounded(tensor, storage, True) @ weight.T
    if VEC_DOT_TYPES[storage] == "q8_1":
        product = product + _min_term(tensor, weight, storage, True)
    return product


class _LstmSteps:
    """``nn.LSTM.forward`` one step at a time, each matmul's input (``x_t``, ``h_{t-1}``)
    rounded for its weight's storage: ``gates = W_ih x + b_ih + W_hh h + b_hh``, then
    ``c = sigmoid(f) c + sigmoid(i) tanh(g)``, ``h = sigmoid(o) tanh(c)`` (torch's equations)."""

    def __init__(self, lstm, types: dict[str, str]) -> None:
        self.lstm, self.types = lstm, types

    def __call__(self, input, hx=None):
        import torch

        lstm = self.lstm
        x = input.transpose(0, 1) if lstm.batch_first else input  # [T, N, in]
        n, hidden = x.shape[1], lstm.hidden_size
        if hx is None:
            zeros = x.new_zeros(lstm.num_layers, n, hidden)
            hx = (zeros, zeros)
        h_n, c_n = [], []
        for layer in range(lstm.num_layers):
            w_ih, w_hh = (getattr(lstm, f"{kind}_l{layer}") for kind in ("weight_ih", "weight_hh"))
            bias = (getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
                    if lstm.bias else 0)
            h, c, outputs = hx[0][layer], hx[1][layer], []
            for x_t in x:
                gates = (_product(x_t, w_ih, self.types[f"weight_ih_l{layer}"])
                         + _product(h, w_hh, self.types[f"weight_hh_l{layer}"]) + bias)
                i, f, g, o = gates.chunk(4, dim=-1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
                outputs.append(h)
            x = torch.stack(outputs)
            h_n.append(h)
            c_n.append(c)
        output = x.transpose(0, 1) if lstm.batch_first else x
        return output, (torch.stack(h_n), torch.stack(c_n))


#: Joins a case's dump directory and an emulated weight type: ``clip@q8_0`` is the reference
#: dump of case ``clip`` computed as ggml does with q8_0 weights (no case name holds it).
EMULATED_SEPARATOR = "@"


def emulated_dir(output_dir: Path, weight_type: str | None) -> Path:
    """The dump directory of ``output_dir``'s case emulating ``weight_type`` (``None``: the
    float32 reference, ``output_dir`` itself)."""
    output_dir = Path(output_dir)
    if weight_type is None:
        return output_dir
    return output_dir.with_name(f"{output_dir.name}{EMULATED_SEPARATOR}{weight_type}")


@dataclass
class Emulation:
    """One model a reference job dumps with: the float32 model (``weight_type`` None), the
    model computing as ggml's CPU backend does with its matmul weights in ``weight_type``, or
    with a candidate's own stored weights (``storage``: the storage-matched reference)."""

    weight_type: str | None
    model: Any
    stored: StoredWeights
    storage: FileStorage | None = None

    def dump_dir(self, output_dir: Path) -> Path:
        """Where this model dumps the case of ``output_dir`` (:func:`emulated_dir`; a
        storage-matched reference's dumps are its job's own directories)."""
        return Path(output_dir) if self.storage else emulated_dir(output_dir, self.weight_type)

    @property
    def fields(self) -> dict[str, Any]:
        """Manifest fields of its dumps: ``emulates`` (weight type, backend, fallback notes; a
        storage file and its digest)."""
        if self.weight_type is None:
            return {}
        file = ({"storage": str(self.storage.path), "storage_digest": self.storage.digest}
                if self.storage else {})
        return {"emulates": {"weight_type": self.weight_type, "backend": "cpu", **file,
                             "notes" if self.storage else "fallbacks": self.stored.notes}}


def emulations(model: Any, weight_types: Sequence[str | Recipe], keep: Collection[str] = (),
               prefix: str = "", storage: FileStorage | None = None) -> Iterator[Emulation]:
    """The float32 ``model``, then the same model computing as ggml does with each of
    ``weight_types`` (a type, or a :class:`Recipe`; :func:`emulating`, ``keep`` and ``prefix``
    passed on), one at a time: each is float32 again once the next is asked for (NeMo models
    cannot be deep-copied). With ``storage``, only the model computing with that candidate's
    stored weights (the storage-matched reference; ``weight_types`` must be empty).

    Raises:
        AudioparityError: a weight type that is not emulated (before any model is yielded).
    """
    if storage is not None:
        if weight_types:
            raise ValueError("emulations: a storage file or weight types, not both")
        with emulating(model, storage, keep, prefix) as stored_weights:
            yield Emulation(storage.weight_type, model, stored_weights, storage)
        return
    recipes = [t if isinstance(t, Recipe) else Recipe.uniform(t) for t in weight_types]
    unknown = [r.base for r in recipes if r.base not in EMULATED_TYPES]
    if unknown:
        raise AudioparityError(f"no quantization-aware reference for weight type(s) "
                               f"{', '.join(unknown)}; emulated: {', '.join(EMULATED_TYPES)}")
    yield Emulation(None, model, StoredWeights())
    for recipe in recipes:
        with emulating(model, recipe, keep, prefix) as stored_weights:
            yield Emulation(recipe.weight_type if recipe.name else recipe.base, model,
                            stored_weights)
