"""Named tensors in one backend buffer: :class:`Weights` (read-only, filled by streaming or
mapped from a GGUF file) and :class:`State` (zero-filled, written by graphs).

:class:`Weights` (from :meth:`Runtime.load <audioparity.ggml.runtime.Runtime.load>`, or
:meth:`~audioparity.ggml.runtime.Runtime.upload` for a dict of arrays) is one backend buffer
(usage ``WEIGHTS``) allocated from the weights' shapes and storage types
before any value is read, then filled one block (a tensor, or a range of its rows) at a time,
each host copy dropped before the next: a process holds its weights once, in their storage type.
Conversion uses ggml's own ``ggml_quantize_chunk`` (:func:`audioparity.dumping.storage.quantize`),
so the bytes are what a C++ converter would write. The storage type is a property of the tensor;
graph code is the same for every type. :meth:`Weights.save` writes those bytes as a GGUF file and
:meth:`Weights.mapped` maps one back (a CPU backend computes on the mapped pages in place).

:class:`State` holds persistent mutable tensors (a KV cache): one zero-filled backend buffer that
outlives graphs and is not marked as weights. Graphs write into it with ``ggml_cpy`` nodes added
by :meth:`Graph.expand <audioparity.ggml.graph.Graph.expand>`.
"""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.storage import quantize, storage_supported
from audioparity.dumping.weight_files import StoredTensor, write_stored
from audioparity.ggml.bindings import STORAGE_TYPES, _ne, _ptr, ggml, tensor_bytes, tensor_values

if TYPE_CHECKING:
    from audioparity.ggml.runtime import Runtime

_TYPE_NAMES = {v: k for k, v in STORAGE_TYPES.items()}


class MissingWeight(AudioparityError, KeyError):
    """``weights[name]`` (or ``state[name]``) for a name that was not allocated (a KeyError, so
    ``.get`` works)."""

    def __str__(self) -> str:
        return str(self.args[0])


class _Tensors(Mapping):
    """Named tensors in one buffer of the runtime's compute backend, each in its own storage
    type (the common part of :class:`Weights` and :class:`State`).

    ``tensors[name]`` is the ggml tensor (``ne`` = numpy shape reversed) to use in graphs.

    Raises:
        AudioparityError: a name without a storage type, an unknown type, a shape the type cannot
            hold (a block type needs the last axis to be a multiple of its block), or a failed
            allocation.
    """

    #: What a tensor of this kind is called in messages.
    _what = "tensor"

    def __init__(self, runtime: Runtime, shapes: Mapping[str, tuple[int, ...]],
                 storage: Mapping[str, str], host: tuple[int, int, dict[str, int]] | None = None
                 ) -> None:
        """``host``: ``(address, size, name -> address)`` of memory that already holds every
        tensor's bytes (a mapped file), used in place by a CPU runtime instead of a new
        buffer."""
        self._runtime = runtime
        self._storage: dict[str, str] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._tensors = {}
        for name, shape in shapes.items():
            kind = storage.get(name)
            if kind is None:
                raise AudioparityError(f"{self._what} {name!r} has no storage type")
            if not storage_supported(kind, shape):
                raise AudioparityError(
                    f"{self._what} {name!r} of shape {list(shape)} cannot be stored as {kind}: "
                    f"last axis must be a multiple of "
                    f"{ggml.ggml_blck_size(STORAGE_TYPES[kind])}"
                )
            self._storage[name] = kind
            self._shapes[name] = tuple(int(n) for n in shape)
        params = ggml.ggml_init_params(
            mem_size=ggml.ggml_tensor_overhead() * max(len(shapes), 1),
            mem_buffer=None, no_alloc=True,
        )
        self._ctx = ggml.ggml_init(params)
        for name, shape in self._shapes.items():
            tensor = ggml.ggml_new_tensor(self._ctx, STORAGE_TYPES[self._storage[name]],
                                          len(shape), _ne(shape))
            ggml.ggml_set_name(tensor, name.encode()[: ggml.GGML_MAX_NAME - 1])
            self._tensors[name] = tensor
        self._buffer = None
        if shapes and host is not None and runtime.backend_name == "cpu":
            start, size, addresses = host
            self._buffer = ggml.ggml_backend_cpu_buffer_from_ptr(ctypes.c_void_p(start), size)
            for name, tensor in self._tensors.items():
                ggml.ggml_backend_tensor_alloc(self._buffer, tensor,
                                               ctypes.c_void_p(addresses[name]))
        elif shapes:
            self._buffer = ggml.ggml_backend_alloc_ctx_tensors(self._ctx, runtime.backend)
            if not self._buffer:
                raise AudioparityError(f"could not allocate {len(shapes)} {self._what}s on "
                                       f"{runtime.backend_name}")
        self._finalizer = weakref.finalize(self, _free_tensors, self._ctx, self._buffer)

    def __getitem__(self, name: str):
        try:
            return self._tensors[name]
        except KeyError:
            raise MissingWeight(f"no {self._what} named {name!r}") from None

    def __iter__(self):
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def storage(self, name: str) -> str:
        """Storage type of tensor ``name`` (a storage type)."""
        return self._storage[name]

    def shape(self, name: str) -> tuple[int, ...]:
        """Numpy shape of tensor ``name`` (ggml ``ne`` reversed)."""
        return self._shapes[name]

    @property
    def nbytes(self) -> int:
        """Size of the backend buffer holding all tensors."""
        return ggml.ggml_backend_buffer_get_size(self._buffer) if self._buffer else 0

    def read(self, name: str) -> np.ndarray:
        """Tensor ``name`` read back from the backend and dequantized to float32 (ggml's own
        ``to_float``), in its numpy shape. For tests and diagnostics."""
        return tensor_values(self[name]).reshape(self._shapes[name])

    def close(self) -> None:
        """Free the buffer and context."""
        self._finalizer()


class Weights(_Tensors):
    """Named weight tensors in one backend buffer (usage ``WEIGHTS``), each in its own storage
    type, filled by streaming.

    ``weights[name]`` is the ggml tensor (``ne`` = numpy shape reversed) to use in graphs. The
    buffer is allocated from ``shapes`` and ``storage`` before any value is read; then each
    block of ``blocks`` is converted from float32 on the host with ggml's quantize functions
    (rows = last numpy axis; a block type's blocks never cross a row) and copied to its byte
    offset, and the host copy is dropped before the next block is drawn. So the host holds one
    block at a time beside the buffer; nothing is re-uploaded per graph.

    Args:
        runtime: the runtime whose compute backend holds the buffer.
        shapes: name -> numpy shape of every weight.
        storage: name -> storage type for every name in ``shapes``.
        blocks: ``(name, first row, array)``: ``array`` holds rows ``first row ...`` of the
            weight viewed as ``[rows, shape[-1]]`` (any float dtype, converted to float32 first,
            which is exact for f16/bf16/f32 sources; shape ``[n, *shape[1:]]`` or ``[n,
            shape[-1]]``). A whole weight is one block at row 0; together the blocks must cover
            every row of every weight exactly once.
        host: instead of ``blocks``, ``(address, size, name -> address)`` of host memory that
            holds every weight's bytes in its storage type already (:meth:`mapped`).

    Attributes:
        buffers: host-side arrays a dump reads that are no graph weights (a frontend's
            filterbank), name -> array; empty unless the dump driver sets them
            (:attr:`audioparity.contract.family.CheckpointWeights.buffers`).

    Raises:
        AudioparityError: a name without a storage type, an unknown type, or a shape the type
            cannot hold (the last axis a multiple of its block); a block of an unknown
            name, of the wrong row length, outside its weight or overlapping another; or a
            weight whose rows the blocks do not all cover.
    """

    _what = "weight"
    buffers: dict[str, np.ndarray]

    def __init__(self, runtime: Runtime, shapes: Mapping[str, tuple[int, ...]],
                 storage: Mapping[str, str],
                 blocks: Iterable[tuple[str, int, np.ndarray]] = (),
                 host: tuple[int, int, dict[str, int]] | None = None) -> None:
        super().__init__(runtime, shapes, storage, host)
        self.buffers = {}
        if self._buffer:
            ggml.ggml_backend_buffer_set_usage(self._buffer,
                                               ggml.GGML_BACKEND_BUFFER_USAGE_WEIGHTS)
        if host is not None:  # the bytes are there already: used in place, or copied once
            if runtime.backend_name != "cpu":
                for name, tensor in self._tensors.items():
                    ggml.ggml_backend_tensor_set(tensor, ctypes.c_void_p(host[2][name]), 0,
                                                 ggml.ggml_nbytes(tensor))
            return
        filled = dict.fromkeys(self._shapes, 0)
        for name, first, array in blocks:
            self._set_rows(name, first, array, filled)
            del array  # the host copy goes before the next block is read
        missing = [name for name, shape in self._shapes.items()
                   if filled[name] != _n_rows(shape)]
        if missing:
            raise AudioparityError(
                f"weight {missing[0]!r} {list(self._shapes[missing[0]])}: "
                f"{filled[missing[0]]} of {_n_rows(self._shapes[missing[0]])} rows uploaded")

    def _set_rows(self, name: str, first: int, array: np.ndarray, filled: dict[str, int]) -> None:
        """Convert one block and copy it to its rows of weight ``name``."""
        if name not in self._shapes:
            raise AudioparityError(f"weight {name!r} was not allocated")
        shape = self._shapes[name]
        rows = array.size // shape[-1] if array.ndim else 0
        if array.shape[-1:] != shape[-1:] or array.size != rows * shape[-1]:
            raise AudioparityError(f"weight {name!r}: block of shape {list(array.shape)}; "
                                   f"expected rows of {shape[-1]} values")
        if first != filled[name] or first + rows > _n_rows(shape):
            raise AudioparityError(f"weight {name!r}: block of rows {first}..{first + rows} "
                                   f"after {filled[name]} of {_n_rows(shape)} rows")
        tensor = self._tensors[name]
        data = quantize(array, self._storage[name])
        row_bytes = ggml.ggml_row_size(tensor.contents.type, shape[-1])
        if data.nbytes != rows * row_bytes:
            raise AudioparityError(f"weight {name!r}: {data.nbytes} bytes for {rows} rows of "
                                   f"{row_bytes} bytes")
        ggml.ggml_backend_tensor_set(tensor, _ptr(data), first * row_bytes, data.nbytes)
        filled[name] = first + rows

    @classmethod
    def mapped(cls, runtime: Runtime, path: Path, shapes: Mapping[str, tuple[int, ...]],
               storage: Mapping[str, str]) -> Weights:
        """The weights a GGUF file holds (:meth:`save`), memory-mapped read-only: a CPU runtime
        computes on the mapped bytes in place (nothing is read until a graph touches it, and
        processes mapping one file share its pages); another backend copies each tensor from
        the mapping once.

        Raises:
            AudioparityError: an unreadable file, or one that does not hold exactly ``shapes``
                (numpy order) in the ``storage`` types (one line naming the first tensor that
                differs).
        """
        import gguf

        try:
            reader = gguf.GGUFReader(path)
        except (OSError, ValueError) as err:
            raise AudioparityError(f"weights file {path}: unreadable ({err})") from None
        found = {t.name: t for t in reader.tensors}
        for name in sorted(set(shapes) | set(found)):
            tensor = found.get(name)
            want = (tuple(shapes[name]), storage[name]) if name in shapes else None
            have = None if tensor is None else (
                tuple(int(n) for n in reversed(tensor.shape)),
                _TYPE_NAMES.get(int(tensor.tensor_type), tensor.tensor_type.name))
            if have != want:
                raise AudioparityError(
                    f"weights file {path}: tensor {name!r} is "
                    f"{'absent' if have is None else f'{list(have[0])} {have[1]}'}; the model "
                    f"wants {'none' if want is None else f'{list(want[0])} {want[1]}'} "
                    "(convert it again)")
        base = reader.data.ctypes.data
        addresses = {name: base + found[name].data_offset for name in shapes}
        start = min(addresses.values(), default=base)
        end = max((addresses[n] + found[n].n_bytes for n in shapes), default=base)
        weights = cls(runtime, shapes, storage, host=(start, end - start, addresses))
        weights._mapping = reader.data  # the mapping lives as long as the weights
        return weights

    def save(self, path: Path, metadata: Mapping[str, str] | None = None) -> None:
        """Write the weights, each in its storage type (the bytes ggml holds), as a storage
        file (:func:`~audioparity.dumping.weight_files.write_stored`: a GGUF file, string
        ``metadata`` under ``audioparity.*``), atomically: a file at ``path`` is always complete."""
        write_stored(Path(path), (StoredTensor(name, self._shapes[name], self._storage[name],
                                               tensor_bytes(tensor))
                                  for name, tensor in self._tensors.items()), metadata)


def _n_rows(shape: tuple[int, ...]) -> int:
    """Rows of a weight of numpy ``shape`` (all axes but the last)."""
    return int(np.prod(shape[:-1], dtype=np.int64))


class State(_Tensors):
    """Persistent mutable tensors (e.g. a KV cache) in one zero-filled backend buffer.

    Unlike :class:`Weights` the buffer is not marked as weights (usage ``ANY``): graphs write
    into these tensors, through a ``ggml_cpy`` into a view added with :meth:`Graph.expand`, and
    what they write stays for the next graph. ``state[name]`` is the ggml tensor (``ne`` = numpy
    shape reversed); :meth:`read` reads it back.

    Args:
        runtime: the runtime whose compute backend holds the buffer.
        specs: name -> ``(numpy shape, storage type)``; the type is a storage type
            (a KV cache uses ``f32`` or ``f16``).

    Raises:
        AudioparityError: an unknown storage type, or a shape the type cannot hold.
    """

    _what = "state tensor"

    def __init__(self, runtime: Runtime,
                 specs: Mapping[str, tuple[tuple[int, ...], str]]) -> None:
        super().__init__(runtime, {name: shape for name, (shape, _) in specs.items()},
                         {name: kind for name, (_, kind) in specs.items()})
        if self._buffer:
            ggml.ggml_backend_buffer_clear(self._buffer, 0)


def _free_tensors(ctx, buffer) -> None:
    if buffer:
        ggml.ggml_backend_buffer_free(buffer)
    ggml.ggml_free(ctx)

