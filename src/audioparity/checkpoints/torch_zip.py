"""State dicts written by ``torch.save`` (zip format, torch >= 1.6) read without torch, as a
``.nemo``'s ``model_weights.ckpt`` holds them.

A pickle reader that accepts only what ``torch.save(state_dict)`` writes (the ``OrderedDict``,
``torch._utils._rebuild_tensor_v2``, storage classes) and maps each tensor onto its storage record
of the zip with numpy; anything else is an error. Nothing is read until a tensor is asked for.
"""

from __future__ import annotations

import collections
import contextlib
import pickle
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.checkpoints.floats import to_float32
from audioparity.checkpoints.nemo import FileWindow
from audioparity.contract.errors import AudioparityError

#: torch storage class (``torch.<name>``) -> (stored dtype, numpy dtype of its bytes).
_TORCH_STORAGES = {"FloatStorage": ("f32", "<f4"), "HalfStorage": ("f16", "<f2"),
                   "BFloat16Storage": ("bf16", "<u2")}
#: Storage classes whose tensors are read past (e.g. BatchNorm's int64 ``num_batches_tracked``).
_SKIPPED_TORCH_STORAGES = ("DoubleStorage", "LongStorage", "IntStorage", "ShortStorage",
                           "CharStorage", "ByteStorage", "BoolStorage")


@dataclass(frozen=True)
class _StorageRef:
    """A storage of a torch zip checkpoint: record ``data/<key>`` holding ``numel`` values of
    class ``torch.<kind>``."""

    kind: str
    key: str
    numel: int


@dataclass(frozen=True)
class TorchEntry:
    """One float tensor of a torch zip checkpoint, as its ``data.pkl`` describes it; nothing
    read yet.

    Attributes:
        path: the checkpoint file; where: how messages name it; record: its storage's zip
            record (``<prefix>data/<key>``); span: ``(offset, size)`` of the zip inside
            ``path`` when it is a member of an uncompressed tar (a ``.nemo``), else None.
        kind: the stored dtype ``f32|f16|bf16``; shape: numpy shape; offset, stride: in values
            of the storage (``torch._utils._rebuild_tensor_v2``).
    """

    path: Path
    where: str
    record: str
    kind: str
    shape: tuple[int, ...]
    offset: int
    stride: tuple[int, ...]
    span: tuple[int, int] | None = None

    def read(self) -> np.ndarray:
        """The tensor as a new float32 array (f16/bf16 widened exactly), read from its storage
        record alone (a zip member read; the other records stay on disk)."""
        with _open_zip(self.path, self.span) as archive:
            data = np.frombuffer(archive.read(self.record), dtype=_NUMPY_DTYPES[self.kind])
        view = np.lib.stride_tricks.as_strided(
            data[self.offset:], shape=self.shape,
            strides=[s * data.itemsize for s in self.stride], writeable=False)
        return to_float32(np.ascontiguousarray(view), self.kind)


#: stored dtype -> numpy dtype of its bytes.
_NUMPY_DTYPES = dict(_TORCH_STORAGES.values())


class _StateDictUnpickler(pickle.Unpickler):
    """Reads the ``data.pkl`` of a torch zip checkpoint holding a flat state dict.

    Allows only the globals ``torch.save(state_dict)`` writes (a subset of torch's
    ``_weights_only_unpickler`` allow-list): ``collections.OrderedDict``,
    ``torch._utils._rebuild_tensor_v2`` and the storage classes; storages are the persistent ids
    ``("storage", storage class, key, location, numel)`` (``torch.serialization._save``).
    Float tensors become :class:`TorchEntry` (each storage record's size checked against the
    zip directory; no data read), others None.
    """

    def __init__(self, stream, archive: zipfile.ZipFile, path: Path, prefix: str,
                 where: str, span: tuple[int, int] | None) -> None:
        super().__init__(stream)
        self._archive, self._path, self._prefix, self._where = archive, path, prefix, where
        self._span = span

    def find_class(self, module: str, name: str):
        if (module, name) == ("collections", "OrderedDict"):
            return collections.OrderedDict
        if (module, name) == ("torch._utils", "_rebuild_tensor_v2"):
            return self._rebuild_tensor_v2
        if module == "torch" and (name in _TORCH_STORAGES or name in _SKIPPED_TORCH_STORAGES):
            return name
        raise AudioparityError(f"{self._where}: unexpected {module}.{name} in data.pkl; only a "
                               "state dict of plain tensors is read")

    def persistent_load(self, pid):
        if (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], str) and isinstance(pid[4], int)):
            return _StorageRef(pid[1], str(pid[2]), pid[4])
        raise AudioparityError(f"{self._where}: unexpected persistent id {pid!r} in data.pkl")

    def _record(self, ref: _StorageRef) -> str:
        record = f"{self._prefix}data/{ref.key}"
        try:
            size = self._archive.getinfo(record).file_size
        except KeyError:
            raise AudioparityError(f"{self._where}: no record data/{ref.key}") from None
        itemsize = np.dtype(_TORCH_STORAGES[ref.kind][1]).itemsize
        if size != ref.numel * itemsize:
            raise AudioparityError(
                f"{self._where}: record data/{ref.key} holds {size} bytes, expected "
                f"{ref.numel} x {ref.kind} ({ref.numel * itemsize} bytes)")
        return record

    def _rebuild_tensor_v2(self, storage: _StorageRef, offset: int, size: tuple, stride: tuple,
                           *_: object) -> TorchEntry | None:
        """``torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride,
        requires_grad, backward_hooks[, metadata])``: the strided view of the storage."""
        if storage.kind not in _TORCH_STORAGES:
            return None
        record = self._record(storage)
        last = offset + sum((n - 1) * s for n, s in zip(size, stride, strict=True))
        if min(size, default=1) > 0 and (offset < 0 or min(stride, default=0) < 0
                                         or last >= storage.numel):
            raise AudioparityError(
                f"{self._where}: a tensor of size {list(size)}, stride {list(stride)} at offset "
                f"{offset} lies outside its storage data/{storage.key} ({storage.numel} values)")
        return TorchEntry(self._path, self._where, record, _TORCH_STORAGES[storage.kind][0],
                          tuple(size), offset, tuple(stride), self._span)


def _open_zip(path: Path, span: tuple[int, int] | None) -> zipfile.ZipFile:
    """The zip at ``path``, or the one at ``span`` (offset, size) inside it, read in place."""
    return zipfile.ZipFile(path if span is None else FileWindow(path, *span))


def torch_entries(path: Path, where: str | None = None,
                  span: tuple[int, int] | None = None) -> dict[str, TorchEntry]:
    """Float tensors of a state dict saved by ``torch.save`` (zip format), without torch and
    without reading their data (only ``data.pkl`` and the zip directory).

    Records (``torch.serialization``): ``<prefix>/data.pkl`` (the pickle),
    ``<prefix>/data/<key>`` (raw little-endian storage bytes), ``<prefix>/byteorder``.

    Args:
        path: the checkpoint file (e.g. a ``.nemo``'s ``model_weights.ckpt``).
        where: how messages name the file (default ``path``).
        span: ``(offset, size)`` of the checkpoint inside ``path`` (a member of an
            uncompressed ``.nemo`` tar, :func:`~.nemo.nemo_member_span`), read in place.

    Returns:
        name -> :class:`TorchEntry`; tensors of other types are left out.

    Raises:
        AudioparityError: not a torch zip checkpoint (e.g. the legacy pre-1.6 format), a
            big-endian one, anything in the pickle besides a flat dict of tensors, or a storage
            record that is missing or of the wrong size.
    """
    where = where or str(path)
    with contextlib.closing(FileWindow(path, *span)) if span else open(path, "rb") as handle:
        if not zipfile.is_zipfile(handle):
            raise AudioparityError(f"{where}: not a torch zip checkpoint (torch.save >= 1.6)")
    with _open_zip(path, span) as archive:
        pickles = [name for name in archive.namelist() if name.endswith("data.pkl")]
        if len(pickles) != 1:
            raise AudioparityError(f"{where}: expected one data.pkl record, found {len(pickles)}")
        prefix = pickles[0].removesuffix("data.pkl")
        if f"{prefix}byteorder" in archive.namelist() and \
                archive.read(f"{prefix}byteorder") != b"little":
            raise AudioparityError(f"{where}: big-endian checkpoint; expected little-endian")
        try:
            with archive.open(f"{prefix}data.pkl") as stream:
                state = _StateDictUnpickler(stream, archive, Path(path), prefix, where,
                                            span).load()
        except (pickle.UnpicklingError, EOFError, TypeError, ValueError) as err:
            raise AudioparityError(f"{where}: unreadable data.pkl ({err})") from None
    if not isinstance(state, dict):
        raise AudioparityError(f"{where}: holds a {type(state).__name__}, expected a state dict")
    entries = {}
    for name, value in state.items():
        if value is None:
            continue
        if not (isinstance(name, str) and isinstance(value, TorchEntry)):
            raise AudioparityError(f"{where}: entry {name!r} is not a tensor")
        entries[name] = value
    return entries


def read_torch_state_dict(path: Path, where: str | None = None) -> tuple[dict[str, np.ndarray],
                                                                          dict[str, str]]:
    """Every float tensor of :func:`torch_entries`, read: ``(arrays, native)``, name -> float32
    array (f16/bf16 widened exactly), and name -> stored dtype ``f32|f16|bf16``.

    Raises:
        AudioparityError: see :func:`torch_entries`.
    """
    entries = torch_entries(path, where)
    return ({name: entry.read() for name, entry in entries.items()},
            {name: entry.kind for name, entry in entries.items()})
