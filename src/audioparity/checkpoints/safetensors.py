"""Safetensors checkpoints read without torch, for every model family: one file or the shards
of an index, each tensor as float32 beside its stored dtype.

Format (huggingface/safetensors): an 8-byte little-endian header size ``N``, an ``N``-byte JSON
header ``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``, then
the data, offsets counted from the end of the header. A sharded checkpoint lists its files in
``model.safetensors.index.json`` (``{"weight_map": {tensor name: file name}}``).

Not the ``safetensors`` package: its numpy loader knows bfloat16 only once ``ml_dtypes`` has been
imported (not a dependency of this project; without it, ``data type 'bfloat16' not
understood``). Here the headers are read first (nothing else), and each tensor, or a range of its
rows (:meth:`Entry.blocks`), is read on demand with a plain file read into its own array, and
bfloat16 widened exactly (its bits are the top half of a float32). No long-lived memory map: the
pages of a mapped file count in a process's resident set for as long as the map lives, so a map
of the checkpoint would double the peak memory of a process that keeps the weights elsewhere
(in a ggml buffer). The per-family parts (key names, expected shapes) stay in each family's
``checkpoint.py``; storage types are the driver's.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.floats import non_finite, raise_non_finite, to_float32
from audioparity.contract.errors import AudioparityError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
#: safetensors dtype -> (stored dtype as the ggml storage types name it, numpy dtype of its bytes).
DTYPES = {"F32": ("f32", "<f4"), "F16": ("f16", "<f2"), "BF16": ("bf16", "<u2")}


#: Largest block :meth:`Entry.blocks` reads at once (float32 bytes).
BLOCK_BYTES = 64 << 20


@dataclass(frozen=True, eq=False)
class Entry:
    """One tensor of a safetensors file, as its header describes it.

    Attributes:
        path: the file.
        name: the tensor's name in the file.
        dtype: its safetensors dtype (``F32``, ``BF16``, ``I64``, ...).
        shape: its numpy shape.
        offset: where its bytes start in the file; nbytes: how many there are.
    """

    path: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int

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

    def read(self, first: int = 0, stop: int | None = None) -> np.ndarray:
        """Rows ``first:stop`` of the tensor (all by default; rows = the first axis) as a new
        read-only float32 array ``[stop - first, *shape[1:]]`` (:func:`to_float32`), read from
        the file.

        Raises:
            AudioparityError: a dtype other than F32, F16, BF16, or a short read.
        """
        kind = self.kind
        dtype = np.dtype(DTYPES[self.dtype][1])
        rows = self.shape[0] if self.shape else 1
        stop = rows if stop is None else stop
        per_row = math.prod(self.shape[1:]) if self.shape else 1
        raw = np.empty((stop - first) * per_row, dtype=dtype)
        with open(self.path, "rb") as file:
            file.seek(self.offset + first * per_row * dtype.itemsize)
            read = file.readinto(memoryview(raw).cast("B"))
        if read != raw.nbytes:
            raise AudioparityError(f"{self.path}: tensor {self.name!r}: read {read} of "
                                   f"{raw.nbytes} bytes (file changed?)")
        shape = (stop - first, *self.shape[1:]) if self.shape else ()
        array = to_float32(raw.reshape(shape), kind)
        array.flags.writeable = False
        return array

    def blocks(self, where: Path | str, noun: str = "tensor",
               max_bytes: int = BLOCK_BYTES) -> Iterator[tuple[int, np.ndarray]]:
        """``(first row, float32 rows)`` of the whole tensor in blocks of at most ``max_bytes``
        (at least one row each), each checked finite as in :func:`check_finite`; the counts
        add up over the blocks and the error comes after the last one, naming the tensor and
        its whole shape.

        Raises:
            AudioparityError: see :meth:`read` and :func:`check_finite`.
        """
        rows = self.shape[0] if self.shape else 1
        row_bytes = 4 * (math.prod(self.shape[1:]) if self.shape else 1)
        step = max(1, max_bytes // max(row_bytes, 1))
        nan = infinite = 0
        for first in range(0, rows, step):
            block = self.read(first, min(first + step, rows))
            counts = non_finite(block)
            nan, infinite = nan + counts[0], infinite + counts[1]
            yield first, block
            del block
        raise_non_finite(self.name, self.shape, nan, infinite, where, noun)


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
        with open(path, "rb") as file:
            (header_size,) = struct.unpack("<Q", file.read(8))
            if 8 + header_size > size:
                raise AudioparityError(f"{path}: not a safetensors file (header of "
                                       f"{header_size} bytes in a file of {size})")
            text = file.read(header_size)
    except OSError as err:
        raise AudioparityError(f"{path}: cannot read ({err.strerror or err})") from None
    try:
        header = json.loads(text)
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
        entries[name] = Entry(path, name, dtype, shape, base + begin, end - begin)
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
