"""A third-party port's own model file: its tensors (a GGUF file, or the legacy ggml format of
whisper.cpp), what its quantizer stored (the cell's ``storage`` record), and the file renamed to
the checkpoint's weights (:data:`STORAGE_FILE`), which a storage-matched reference computes
with (:class:`audioparity.dumping.weight_files.FileStorage`; docs/quantization.md, "Judging the file
a port ships")."""

from __future__ import annotations

import collections
import logging
import math
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import MIXES
from audioparity.dumping.storage import block_hashes, matrix_shape, tensor_hash
from audioparity.dumping.weight_files import StoredTensor, ggml_name, read_stored, write_stored

if TYPE_CHECKING:  # the adapter reads model files through this module
    from audioparity.candidates.adapter import Adapter

log = logging.getLogger("audioparity")

#: The storage file a conversion leaves beside the port's own files: its model file's tensors
#: under the checkpoint's names, in the checkpoint's row order, bytes unchanged.
STORAGE_FILE = "audioparity-storage.gguf"


def block_of(name: str) -> tuple[int, int]:
    """``(values, bytes)`` of a block of ggml type ``name`` (``gguf.GGML_QUANT_SIZES``; q4_K:
    256 values in 144 bytes).

    Raises:
        AudioparityError: a type gguf does not know.
    """
    import gguf

    kind = next((k for k in gguf.GGMLQuantizationType if ggml_name(k) == name), None)
    if kind is None:
        raise AudioparityError(f"{name}: not a ggml type gguf knows")
    return gguf.GGML_QUANT_SIZES[kind]


def type_bits(name: str) -> float:
    """Bits per weight of ggml type ``name``: its block's bytes x 8 over its block's values
    (q4_K: 4.5)."""
    block, size = block_of(name)
    return size * 8 / block


def gguf_tensors(path: Path) -> list[StoredTensor]:
    """The tensors of a GGUF file, as ``gguf.GGUFReader`` reads them, each with its bytes."""
    return list(read_stored(Path(path)).values())


#: The magic number of a legacy ggml model file (``ggml`` in hex, ``GGML_FILE_MAGIC``).
GGML_MAGIC = 0x67676D6C


def ggml_bin_tensors(path: Path, header: Sequence[tuple]) -> list[StoredTensor]:
    """The tensors of a legacy ggml model file (whisper.cpp's ``.bin``), each with its bytes
    (mapped read-only): its magic, then its ``header`` (below), then records of ``n_dims``, the
    name's length and the ggml type (int32 each), the ``ne`` (int32 each), the name, the data,
    up to the end of the file.

    ``header`` is a list of steps, each reading a part of the file: ``("i32", n)``, n int32
    values (the header's values, in order); ``("f32", k)``, k int32 counts then as many float32
    as their product (a filter bank, a window); ``("u32", index)``, as many uint32 as the
    header's value number ``index`` (Parakeet's durations); ``("strings",)``, an int32 count
    then each an int32 length and its bytes (a vocabulary).

    Raises:
        AudioparityError: not such a file (its magic, a step, a record running past the end,
            a type gguf does not know).
    """
    import gguf

    data = np.memmap(path, dtype=np.uint8, mode="r")
    return _ggml_bin_tensors(data, Path(path), header, gguf)


def _ggml_bin_tensors(data: np.ndarray, path: Path, header: Sequence[tuple], gguf: Any
                      ) -> list[StoredTensor]:
    offset, values = 0, []

    def ints(count: int, kind: str = "i") -> tuple[int, ...]:
        nonlocal offset
        if count < 0 or offset + 4 * count > len(data):
            raise AudioparityError(f"{path}: not a ggml model file of this layout (a field runs "
                                   f"past the end at byte {offset})")
        found = struct.unpack_from(f"<{count}{kind}", data, offset)
        offset += 4 * count
        return found

    if ints(1, "I")[0] != GGML_MAGIC:
        raise AudioparityError(f"{path}: no ggml magic; expected a legacy ggml model file")
    for step in header:
        if step[0] == "i32":
            values.extend(ints(step[1]))
        elif step[0] == "f32":
            counts = ints(step[1])
            ints(int(np.prod(counts)))
        elif step[0] == "u32":
            ints(values[step[1]], "I")
        elif step[0] == "strings":
            for _ in range(ints(1)[0]):
                length = ints(1)[0]
                offset += length
        else:
            raise ValueError(f"ggml_bin_tensors: unknown header step {step!r}")
    tensors = []
    while offset < len(data):
        n_dims, length, kind = ints(3)
        if not 0 <= n_dims <= 4:
            raise AudioparityError(f"{path}: a tensor of {n_dims} dimensions at byte {offset}; "
                                   "expected a legacy ggml model file of this layout")
        ne = ints(n_dims)
        name = bytes(data[offset:offset + length]).decode("utf-8", "replace")
        offset += length
        if offset > len(data):
            raise AudioparityError(f"{path}: a tensor's name runs past the end; expected a "
                                   "legacy ggml model file of this layout")
        try:
            quant = gguf.GGMLQuantizationType(kind)
        except ValueError:
            raise AudioparityError(f"{path}: tensor {name!r} of ggml type {kind}, which gguf does "
                                   "not know; expected a legacy ggml model file") from None
        block, size = gguf.GGML_QUANT_SIZES[quant]
        row = ne[0] if ne else 1  # a scalar (no dimension) holds one value
        # as its quantizer writes a row (ggml_row_size), whether or not it fills the blocks
        nbytes = math.prod(ne[1:]) * (size * row // block)
        if offset + nbytes > len(data):
            raise AudioparityError(f"{path}: tensor {name!r} {list(ne)} runs past the end; "
                                   "expected a legacy ggml model file of this layout")
        tensors.append(StoredTensor(name, tuple(reversed(ne)), ggml_name(quant),
                                    data[offset:offset + nbytes]))
        offset += nbytes
    return tensors


def storage_of(tensors: Sequence[StoredTensor], requested: Callable[[StoredTensor], str | None],
               tool: str) -> dict[str, Any]:
    """The ``storage`` field of a dump's manifest for a port's model file: ``bits_per_weight``
    over all its tensors (:func:`type_bits`), ``types`` (type -> how many tensors) and the
    ``fallbacks``: one line ``"<tensor> [shape]: <requested> -> <stored> (why)"`` for each matmul
    weight (``requested`` gives its type; None for a tensor the tool's quantizer leaves alone)
    stored as another type, whether its rows do not fill the requested type's blocks or the
    tool (``tool``, its title) chose otherwise. The same fields as our port's
    (:func:`audioparity.dumping.storage.storage_record`)."""
    bits = sum(tensor.values * type_bits(tensor.type) for tensor in tensors)
    values = sum(tensor.values for tensor in tensors)
    types: dict[str, int] = collections.Counter(tensor.type for tensor in tensors)
    fallbacks = []
    for tensor in tensors:
        wanted = requested(tensor)
        if wanted is None or wanted == tensor.type:
            continue
        block, row = block_of(wanted)[0], tensor.shape[-1]
        why = (f"rows of {row} values, blocks of {block}" if row % block
               else f"its rows fit the blocks: {tool}'s choice")
        fallbacks.append(f"{tensor.name} {list(tensor.shape)}: {wanted} -> {tensor.type} ({why})")
    return {"bits_per_weight": round(bits / max(values, 1), 4),
            "types": dict(sorted(types.items())), "fallbacks": fallbacks}


def _fills_blocks(tensor: StoredTensor) -> bool:
    return (tensor.shape[-1] if tensor.shape else 1) % block_of(tensor.type)[0] == 0


def unfilled(tensors: Sequence[StoredTensor]) -> list[str]:
    """One line for each type and row length of the tensors stored as a block type whose
    blocks their rows do not fill (a quantizer that wrote rows of 384 values as q4_K, blocks
    of 256, without a fallback), naming them: ggml cannot use them (a loader refuses their
    size, or a matmul aborts)."""
    groups: dict[tuple[str, int, int], list[str]] = {}
    for tensor in tensors:
        if not _fills_blocks(tensor):
            block, row = block_of(tensor.type)[0], tensor.shape[-1] if tensor.shape else 1
            groups.setdefault((tensor.type, row, block), []).append(tensor.name)
    return [f"{len(names)} tensor(s) stored {kind} in rows of {row} values, which do not fill "
            f"its blocks of {block}, so ggml cannot use them: {', '.join(names)}"
            for (kind, row, block), names in groups.items()]


def write_storage(adapter: Adapter, folder: Path, options: Mapping[str, Any],
                  weight_type: str) -> Path | None:
    """The storage file (:data:`STORAGE_FILE`) of the model files the adapter's run reads at
    ``weight_type`` (:meth:`Adapter.model_files` in ``folder``, which its conversion wrote):
    each of their tensors as the checkpoint's weight it holds (:meth:`Adapter.checkpoint_tensor`:
    the checkpoint's name and row order), in the file's type and bytes; its path, or None for an
    adapter that names no model file. Tensors whose rows do not fill their type's blocks
    (:func:`unfilled`) are left out: ggml cannot compute with them.

    Raises:
        AudioparityError: a model file is not there, cannot be read, or two tensors map to one
            weight.
    """
    paths = adapter.model_files(Path(folder), options, weight_type)
    if not paths:
        return None
    mapped: dict[str, StoredTensor] = {}
    for tensor in _tensors(adapter, paths):
        if not _fills_blocks(tensor):
            continue
        found = adapter.checkpoint_tensor(tensor)
        if found.name in mapped:
            raise AudioparityError(f"{adapter.name}: its {tensor.name} maps to {found.name}, "
                                   "which another of its tensors maps to already")
        mapped[found.name] = found
    output = Path(folder) / STORAGE_FILE
    write_stored(output, mapped.values(), {
        "adapter": adapter.name, "weight_type": weight_type,
        "model_files": ", ".join(str(Path(p).relative_to(folder)) for p in paths)})
    log.info("%s: the %d tensor(s) of %s as the checkpoint's weights in %s", adapter.name,
             len(mapped), ", ".join(Path(p).name for p in paths), output)
    return output


def _tensors(adapter: Adapter, paths: Sequence[Path]) -> list[StoredTensor]:
    """The tensors of every model file (:meth:`Adapter.model_tensors`).

    Raises:
        AudioparityError: a file that is not there.
    """
    missing = [str(p) for p in paths if not Path(p).is_file()]
    if missing:
        raise AudioparityError(f"{adapter.name}: no {', '.join(missing)}; its conversion wrote "
                               "none")
    return [tensor for path in paths for tensor in adapter.model_tensors(Path(path))]


def model_storage(adapter: Adapter, model: Path, options: Mapping[str, Any],
                  weight_type: str) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                             list[str]] | None:
    """What a cell of ``adapter`` at ``weight_type`` computes with, from the model files its run
    reads (:meth:`Adapter.model_files` in the folder ``model`` its conversion wrote, read by
    :meth:`Adapter.model_tensors`): the manifest's ``storage`` field (:func:`storage_of`, and
    from its storage file (:func:`write_storage`) each mapped weight's type under its checkpoint
    name, ``tensor_types``, and the hash of its bytes, ``hashes``), each mapped weight's
    :func:`~audioparity.dumping.storage.block_hashes`, and the lines for the cell's notes (tensors
    ggml cannot use, :func:`unfilled`). None for an adapter that names no model file, or when one is
    not there (its run then fails, saying so)."""
    paths = adapter.model_files(Path(model), options, weight_type)
    if not paths:
        return None
    if not all(Path(p).is_file() for p in paths):
        log.warning("%s: no %s to record the storage of", adapter.name, ", ".join(map(str, paths)))
        return None
    tensors = _tensors(adapter, paths)
    asked = MIXES.get(weight_type, weight_type)  # a mix: the type most of its weights take
    record = storage_of(tensors, lambda tensor: adapter.requested_type(tensor, asked, options),
                        adapter.title)
    notes, hashes = unfilled(tensors), {}
    storage_file = Path(model) / STORAGE_FILE
    if storage_file.is_file():
        stored = read_stored(storage_file)
        hashes = {name: block_hashes(tensor.data, tensor.type,
                                           matrix_shape(tensor.shape))
                  for name, tensor in stored.items()}
        record.update(tensor_types={name: tensor.type for name, tensor in stored.items()},
                      hashes={name: tensor_hash(h) for name, h in hashes.items()})
    return record, hashes, notes


def matches(patterns: Sequence[str], name: str) -> bool:
    """Whether one of the regular expressions ``patterns`` matches all of ``name``."""
    return any(re.fullmatch(pattern, name) for pattern in patterns)

