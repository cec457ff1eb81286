"""The weight types a cell names besides a storage type: a recipe (:class:`Recipe`, a JSON file
that keeps some matmul weights wider, written by ``audioparity precision``) and the weights a
port's quantizer stored (:class:`FileStorage`, a GGUF file: ``write_stored``, ``read_stored``),
with the storage verdict that holds a candidate's stored types against the weight type asked
(:func:`storage_verdict`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    FLOAT_TYPES,
    RECIPE_SEPARATOR,
    STORAGE_TYPES,
)
from audioparity.dumping.storage import (
    BLOCK_SIZES,
    ggml_type,
    matrix_shape,
    storage_supported,
    stored_bytes,
)


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
