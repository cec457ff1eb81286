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
from collections.abc import Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.errors import AudioparityError
from audioparity.vocabulary import RECIPE_SEPARATOR, STORAGE_TYPES

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
    ``vec_dot_type`` (:data:`VEC_DOT_TYPES`: f32, f16, bf16, q8_0, q8_1 or q8_K) and read back
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
    writes one (:mod:`audioparity.precision`)."""

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


def type_name(weight_type: str | Recipe) -> str:
    """The name of a weight type or recipe (``q4_K``, ``q4_K+recipe``)."""
    return weight_type.weight_type if isinstance(weight_type, Recipe) else weight_type


def read_recipe(path: Path, weight_type: str) -> Recipe:
    """The recipe of ``weight_type`` (``<base>+<name>``) in the JSON file ``path`` (written by
    ``audioparity precision``: ``{"base": ..., "overrides": {weight: type}, ...}``).

    Raises:
        AudioparityError: an unreadable file, a base that is not the weight type's, or an
            override that is no storage type.
    """
    import json

    base, _, name = weight_type.partition(RECIPE_SEPARATOR)
    try:
        data = json.loads(Path(path).read_text())
        recipe = Recipe(name, data["base"], dict(data["overrides"]))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise AudioparityError(f"recipe {path}: unreadable ({err}); expected the JSON that "
                               "audioparity precision writes") from None
    if not name or recipe.base != base:
        raise AudioparityError(f"recipe {path}: its base is {recipe.base}, so its weight type is "
                               f"{recipe.base}{RECIPE_SEPARATOR}<name>, not {weight_type}")
    wrong = {w: t for w, t in recipe.overrides.items() if t not in STORAGE_TYPES}
    if wrong:
        weight, type_ = next(iter(wrong.items()))
        raise AudioparityError(f"recipe {path}: {weight} asks for {type_!r}; valid: "
                               f"{', '.join(STORAGE_TYPES)}")
    return recipe


#: Rows of a weight rounded at a time by :func:`emulating`: the rounding's temporaries stay
#: small beside a 151936-row embedding (1.2 GB in float32 at the 1.7B shape).
_ROWS_AT_ONCE = 4096


@dataclass
class StoredWeights:
    """What a port (or an emulation) stored: a note per weight stored as its fallback, and each
    weight's storage type and :func:`block_hashes`; a dump records it
    (:meth:`~audioparity.artifacts.DumpWriter.add_storage`)."""

    notes: list[str] = field(default_factory=list)
    types: dict[str, str] = field(default_factory=dict)
    hashes: dict[str, np.ndarray] = field(default_factory=dict)

    def record(self) -> dict[str, Any]:
        """The manifest's part: ``tensor_types`` (weight -> storage type) and one hash per
        weight (``hashes``, :func:`tensor_hash`)."""
        return {"tensor_types": dict(self.types),
                "hashes": {name: tensor_hash(h) for name, h in self.hashes.items()}}


@contextmanager
def emulating(model: Any, weight_type: str | Recipe, keep: Collection[str] = (),
              prefix: str = "") -> Iterator[StoredWeights]:
    """Within the block, the torch ``model`` computes as a ggml port on the CPU backend does with
    its matmul weights stored as ``weight_type`` (one of :data:`EMULATED_TYPES`, or a
    :class:`Recipe` giving each weight's); on leaving it, the model is float32 again (weights,
    hooks and forwards restored).

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

    Yields:
        What it stored (:class:`StoredWeights`): a note per weight stored as its fallback (the
        ggml dump's manifest notes them alike), each weight's type and block hashes.

    Raises:
        AudioparityError: ``weight_type`` is not emulated, a recipe override that names no
            matmul weight of the model, or an LSTM with a projection.
    """
    recipe = weight_type if isinstance(weight_type, Recipe) else Recipe.uniform(weight_type)
    if recipe.base not in EMULATED_TYPES:
        raise AudioparityError(f"no quantization-aware reference for weight type "
                               f"{recipe.base!r}; emulated: {', '.join(EMULATED_TYPES)}")
    emulation = _Emulation(recipe, prefix)
    try:
        emulation.apply(model, keep)
        unused = sorted(set(recipe.overrides) - set(emulation.stored.types))
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

    def __init__(self, recipe: Recipe, prefix: str = "") -> None:
        self.recipe, self.prefix = recipe, prefix
        self.stored = StoredWeights()
        self.notes = self.stored.notes
        self.originals: dict[int, tuple[Any, Any]] = {}
        self.hooks: list[Any] = []
        self.lstms: list[Any] = []

    def store(self, name: str, param) -> str:
        """Round parameter ``name`` in place as its storage type holds it; that type."""
        name = name.removeprefix(self.prefix)
        shape = tuple(param.shape[:2])  # a pointwise kernel [out, in, 1(, 1)] is a matrix
        storage = storage_or_fallback(name, self.recipe.storage(name), shape, self.notes)
        if id(param) not in self.originals:
            self.originals[id(param)] = (param, param.detach().clone())
            matrix = param.detach().numpy().reshape(shape)  # the parameter's own memory
            hashes = []
            for first in range(0, shape[0], _ROWS_AT_ONCE):  # rows are stored independently
                rows = matrix[first:first + _ROWS_AT_ONCE]
                raw = quantize(rows, storage)
                hashes.append(block_hashes(raw, storage, rows.shape))
                with np.errstate(over="ignore"):
                    rows[...] = dequantize(raw, storage, rows.shape)
            self.stored.types[name] = storage
            self.stored.hashes[name] = np.concatenate(hashes)
        return storage

    def round_input(self, module, storage: str, channels_last: bool) -> None:
        """Round ``module``'s input for a weight stored as ``storage`` (a pre-hook), and for a
        weight with block minimums add the dot product's :func:`min_term` to its output (a
        forward hook on the input the pre-hook saw)."""
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
        input rounded (:func:`emulating`).

        Raises:
            AudioparityError: an LSTM with a projection.
        """
        for name, module, kind in matmul_modules(model, keep):
            if kind == "embedding":
                self.store(f"{name}.weight", module.weight)
            elif kind == "lstm":
                types = {param: self.store(f"{name}.{param}", getattr(module, param))
                         for param, _ in module.named_parameters() if param.startswith("weight_")}
                module.forward = _LstmSteps(module, types)
                self.lstms.append(module)
            else:
                self.round_input(module, self.store(f"{name}.weight", module.weight),
                                 channels_last=kind == "linear")

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
    """One model a reference job dumps with: the float32 model (``weight_type`` None) or the
    model computing as ggml's CPU backend does with its matmul weights in ``weight_type``."""

    weight_type: str | None
    model: Any
    stored: StoredWeights

    def dump_dir(self, output_dir: Path) -> Path:
        """Where this model dumps the case of ``output_dir`` (:func:`emulated_dir`)."""
        return emulated_dir(output_dir, self.weight_type)

    @property
    def fields(self) -> dict[str, Any]:
        """Manifest fields of its dumps: ``emulates`` (weight type, backend, fallback notes)."""
        if self.weight_type is None:
            return {}
        return {"emulates": {"weight_type": self.weight_type, "backend": "cpu",
                             "fallbacks": self.stored.notes}}


def emulations(model: Any, weight_types: Sequence[str | Recipe], keep: Collection[str] = (),
               prefix: str = "") -> Iterator[Emulation]:
    """The float32 ``model``, then the same model computing as ggml does with each of
    ``weight_types`` (a type, or a :class:`Recipe`; :func:`emulating`, ``keep`` and ``prefix``
    passed on), one
    at a time: each is float32 again once the next is asked for (NeMo models cannot be
    deep-copied).

    Raises:
        AudioparityError: a weight type that is not emulated (before any model is yielded).
    """
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
