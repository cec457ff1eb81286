"""Safetensors checkpoints read without torch, for every model family: one file or the shards
of an index, each tensor as float32 beside its stored dtype, and the finite check of weights.

Format (huggingface/safetensors): an 8-byte little-endian header size ``N``, an ``N``-byte JSON
header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
the data, offsets counted from the end of the header. A sharded checkpoint lists its files in
``model.safetensors.index.json`` (``{"weight_map": {tensor name: file name}}``).

Not the ``safetensors`` package: its numpy loader knows bfloat16 only once ``ml_dtypes`` has been
imported (not a dependency of this project; without it, ``data type 'bfloat16' not
understood``), and it copies every tensor out of its map. Here the file is memory-mapped, a
float32 tensor is a read-only view of it, and bfloat16 is widened exactly (its bits are the top
half of a float32). The per-family parts (key names, expected shapes, storage types) stay in each
family's ``weights.py``.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.errors import AudioparityError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype -> (stored dtype as the ggml storage types name it, numpy dtype of its bytes).
DTYPES = {"F32": ("f32", "<f4"), "F16": ("f16", "<f2"), "BF16": ("bf16", "<u2")}


def to_float32(raw: np.ndarray, kind: str) -> np.ndarray:
    """Stored values as float32: ``bf16`` (raw ``uint16`` bits) widened exactly (bits << 16),
    ``f16`` cast (exact), ``f32`` as is (no copy). Same shape as ``raw``."""
    if kind == "bf16":
        return (raw.astype(np.uint32) << 16).view(np.float32)
    return raw.astype(np.float32, copy=False)


@dataclass(frozen=True, eq=False)
class Entry:
    """One tensor of a safetensors file, as its header describes it.

    Attributes:
        path: the file.
        name: the tensor's name in the file.
        dtype: its safetensors dtype (``F32``, ``BF16``, ``I64``, ...).
        shape: its numpy shape.
        data: its bytes, a ``uint8`` slice of the file's memory map (nothing read yet).
    """

    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray

    @property
    def kind(self) -> str:
        """The stored dtype as a storage type name: ``f32|f16|bf16``.

        Raises:
            AudioparityError: a dtype other than F32, F16, BF16.
        """
        if self.dtype not in DTYPES:
            raise AudioparityError(f"{self.path}: tensor {self.name!r} has dtype {self.dtype}; "
                                   f"expected one of {', '.join(DTYPES)}")
        return DTYPES[self.dtype][0]

    def read(self) -> np.ndarray:
        """The tensor as float32 ``[shape]`` (:func:`to_float32`; an F32 tensor is a read-only
        view of the memory map).

        Raises:
            AudioparityError: a dtype other than F32, F16, BF16.
        """
        kind = self.kind
        raw = np.frombuffer(self.data, dtype=DTYPES[self.dtype][1]).reshape(self.shape)
        return to_float32(raw, kind)


def file_entries(path: Path) -> dict[str, Entry]:
    """Every tensor of one safetensors file, from its header; no tensor data is read.

    Each entry is checked: dtype a string, shape and ``data_offsets`` non-negative integers with
    ``begin <= end``, the bytes inside the file, and for F32/F16/BF16 exactly the bytes the shape
    needs.

    Raises:
        AudioparityError: a missing or unreadable file, one too short or with a header that is
            not a JSON object, or an entry failing a check (the message names the tensor).
    """
    path = Path(path)
    if not path.is_file():
        raise AudioparityError(f"{path}: no such safetensors file")
    size = path.stat().st_size
    if size < 8:
        raise AudioparityError(f"{path}: not a safetensors file ({size} bytes)")
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except OSError as err:
        raise AudioparityError(f"{path}: cannot read ({err.strerror or err})") from None
    (header_size,) = struct.unpack("<Q", data[:8].tobytes())
    if 8 + header_size > size:
        raise AudioparityError(f"{path}: not a safetensors file (header of {header_size} bytes "
                               f"in a file of {size})")
    try:
        header = json.loads(data[8 : 8 + header_size].tobytes())
    except (ValueError, RecursionError) as err:
        raise AudioparityError(f"{path}: not a safetensors file (bad JSON header: {err})") from None
    if not isinstance(header, dict):
        raise AudioparityError(f"{path}: not a safetensors file (header is not a JSON object)")
    base = 8 + header_size
    entries = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
            if not (isinstance(dtype, str) and begin <= end
                    and all(type(n) is int and n >= 0 for n in (*shape, begin, end))):
                raise ValueError
        except (TypeError, KeyError, ValueError):
            raise AudioparityError(f"{path}: tensor {name!r} has a malformed header entry; "
                                   "expected a dtype, a shape and data_offsets [begin, end] of "
                                   "non-negative integers") from None
        if base + end > size:
            raise AudioparityError(f"{path}: tensor {name!r} has data bytes {begin}..{end} of "
                                   f"{size - base}; expected them inside the file (truncated?)")
        if dtype in DTYPES:
            nbytes = math.prod(shape) * np.dtype(DTYPES[dtype][1]).itemsize
            if end - begin != nbytes:
                raise AudioparityError(f"{path}: tensor {name!r} {list(shape)} {dtype} has "
                                       f"{end - begin} data bytes; expected {nbytes}")
        entries[name] = Entry(path, name, dtype, shape, data[base + begin : base + end])
    return entries


def shard_files(directory: Path) -> list[Path]:
    """The safetensors files of a checkpoint directory: those the ``weight_map`` of
    :data:`INDEX_FILE` names (sorted), else :data:`SINGLE_FILE`.

    Raises:
        AudioparityError: an unreadable index, a ``weight_map`` that is not tensor -> file name
            (a path is refused), or neither file present.
    """
    directory = Path(directory)
    index = directory / INDEX_FILE
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            files = sorted(set(weight_map.values()))
        except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as err:
            raise AudioparityError(f"{index}: unreadable shard index ({err!r})") from None
        if not all(isinstance(name, str) and Path(name).name == name for name in files):
            raise AudioparityError(f"{index}: expected a 'weight_map' of tensor -> file name")
        return [directory / name for name in files]
    if not (directory / SINGLE_FILE).is_file():
        raise AudioparityError(f"{directory}: neither {SINGLE_FILE} nor {INDEX_FILE}")
    return [directory / SINGLE_FILE]


def checkpoint_entries(directory: Path) -> dict[str, Entry]:
    """Every tensor of a checkpoint directory's safetensors files (:func:`shard_files`), by
    name, from the headers alone (:func:`file_entries`).

    Raises:
        AudioparityError: see :func:`shard_files` and :func:`file_entries`.
    """
    entries: dict[str, Entry] = {}
    for path in shard_files(directory):
        entries.update(file_entries(path))
    return entries


def check_finite(name: str, array: np.ndarray, where: Path | str, noun: str = "tensor") -> None:
    """Refuse a weight holding NaN or infinity (weights are not compared, so a bad one would
    show only as a far-off activation).

    Args:
        name: the weight's name; ``array`` its values (any shape).
        where: the checkpoint, as the message names it.
        noun: what the family's messages call a weight (``tensor``, ``weight``).

    Raises:
        AudioparityError: ``"<where>: <noun> '<name>' [shape] holds <n> NaN and <m> infinite
            values; expected finite weights"``.
    """
    finite = np.isfinite(array)
    if not finite.all():
        nan = int(np.isnan(array).sum())
        raise AudioparityError(
            f"{where}: {noun} {name!r} {list(array.shape)} holds {nan} NaN and "
            f"{finite.size - int(finite.sum()) - nan} infinite values; expected finite weights"
        )
