"""Reading what a third-party tool wrote (its raw folder, what it printed) into a dump of the
contract, through its adapter's declarations (:class:`~audioparity.candidates.Adapter`)."""

from __future__ import annotations

import collections
import json
import logging
import math
import mmap
import re
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import DumpWriter, viewed_layout
from audioparity.candidates import f32json
from audioparity.candidates.adapter import Adapter, TensorMap
from audioparity.errors import AudioparityError
from audioparity.family import FamilySpec

log = logging.getLogger("audioparity")

#: The manifest's ``seconds`` key of a third-party tool's run: the wall time of all its
#: commands together, from the first one's start to the last one's exit.
RUN_WALL = "run_wall"


def read_tool_output(writer: DumpWriter, adapter: Adapter, spec: FamilySpec, raw: Path,
                     model: Path, options: Mapping[str, Any], *, crash: str | None,
                     commands: int) -> None:
    """The tool's files in ``raw`` (``f32json``, ``npy``) as the contract's stages, then, unless
    it died (``crash``: why; the dump is then ``crashed``, keeping what it wrote), the document
    it printed (:attr:`Adapter.printed`, :meth:`Adapter.parse` of ``raw/stdout.txt`` and
    ``raw/stderr.txt``) and the stages it does not expose; and its run's wall time on its last
    stage (:func:`wall_time`)."""
    if adapter.output in ("f32json", "npy"):
        files, unreadable = (f32json.read_readable(raw) if adapter.output == "f32json"
                             else npy_folder(raw))
        import_files(writer, adapter, spec, files, unreadable)
    if crash:
        writer.set_status("crashed", crash)
        log.warning("%s: %s; kept the %d tensor(s) it wrote", adapter.name, crash,
                    len(writer.manifest["tensors"]))
    else:
        if adapter.printed is not None:
            stage = adapter.printed.concrete(None)
            writer.add_json(stage, adapter.parse((raw / "stdout.txt").read_text(),
                                                 (raw / "stderr.txt").read_text(), model,
                                                 options=options))
            conventions(writer, adapter.printed, stage)
        not_exposed(writer, adapter, spec)
    wall_time(writer, spec, commands)


def wall_time(writer: DumpWriter, spec: FamilySpec, commands: int) -> None:
    """Show the run's wall time (:data:`RUN_WALL`) on the row of the last stage the tool wrote,
    in pipeline order (summary.csv's ``seconds`` reads the manifest's ``seconds`` by stage), and
    say so in a note: a third-party tool is timed as a whole, not stage by stage."""
    written = [*writer.manifest["tensors"], *writer.manifest["documents"]]
    seconds = writer.manifest["seconds"]
    if not written or RUN_WALL not in seconds:
        return
    last = max(written, key=spec.stage_key)
    seconds[last] = seconds[RUN_WALL]
    writer.note(f"seconds: {RUN_WALL} is the wall time of the tool's {commands} command(s) "
                f"as a whole (its model load included), shown on its last stage, {last}; the "
                "tool is not timed stage by stage")


def not_exposed(writer: DumpWriter, adapter: Adapter, spec: FamilySpec) -> None:
    """Record, under the manifest's ``not_exposed``, each stage of the contract the candidate
    wrote nothing for, with why (:meth:`Adapter.unavailable`, else "does not expose it"): the
    compare reports those stages ``unavailable``, not ``missing``. The stages of a head
    (:attr:`Stage.head`) the candidate wrote nothing of are another kind of model's, not
    unexposed ones (unless it wrote no head's stage at all)."""
    written = [*writer.manifest["tensors"], *writer.manifest["documents"]]
    stages = [found.stage for found in map(spec.locate, written) if found]
    found = {stage.name for stage in stages}
    heads = {stage.head for stage in stages if stage.head}
    writer.manifest["not_exposed"] = {
        stage.name: adapter.unavailable(stage.name) or f"{adapter.title} does not expose it"
        for stage in spec.stages
        if stage.name not in found and (not heads or stage.head in heads | {None})}


def npy_folder(folder: Path) -> tuple[dict[str, np.ndarray | dict], dict[str, str]]:
    """The ``<name>.npy`` tensors and ``<name>.json`` documents of a folder, by name, and for
    each file numpy or JSON cannot read, why, by name."""
    files: dict[str, np.ndarray | dict] = {}
    unreadable: dict[str, str] = {}
    for path in sorted(folder.iterdir()):
        try:
            if path.suffix == ".npy":
                files[path.stem] = np.load(path, allow_pickle=False)
            elif path.suffix == ".json":
                files[path.stem] = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            unreadable[path.stem] = f"{path}: unreadable ({' '.join(str(err).split())})"
    return files, unreadable


def import_files(writer: DumpWriter, adapter: Adapter, spec: FamilySpec,
                 files: dict[str, np.ndarray | dict], unreadable: dict[str, str]) -> None:
    """The candidate's files as the contract's stages (:class:`TensorMap`): tensors transposed
    to the stage's layout, extra frames dropped, stacked sources stacked; documents as they
    are; views, omitted fields and their reasons recorded under the manifest's
    ``conventions``. A file that cannot be read (``unreadable``: name -> why) leaves its stage
    out, with why under the manifest's ``unreadable``, and the other stages are compared."""
    for name, why in unreadable.items():
        found = adapter.tensor_map(name)
        stage = found[0].concrete(found[2]) if found else name
        writer.manifest.setdefault("unreadable", {})[stage] = why
        writer.note(f"{stage}: not compared, the candidate's file is unreadable: {why}")
    stacks: dict[str, dict[int, dict[int, np.ndarray]]] = collections.defaultdict(dict)
    unmapped, unknown = [], []
    for name, value in files.items():
        found = adapter.tensor_map(name)
        if found is None:
            (unmapped if adapter.declares_unmapped(name) else unknown).append(name)
            continue
        mapping, index, layer = found
        stage = mapping.concrete(layer)
        if isinstance(value, dict):
            writer.add_json(stage, value)
        elif len(mapping.sources()) > 1:
            stacks[mapping.stage].setdefault(layer or 0, {})[index] = value
            continue
        else:
            _add(writer, spec, mapping, stage, value)
        conventions(writer, mapping, stage)
    for stage, layers in stacks.items():
        mapping = next(m for m in adapter.tensors if m.stage == stage)
        rows = [np.stack([parts[k] for k in range(len(mapping.sources()))])
                for _, parts in sorted(layers.items())]
        _add(writer, spec, mapping, stage, np.stack(rows))
        conventions(writer, mapping, stage)
    if unmapped:
        writer.note(f"not compared (no stage of {spec.name} holds them): {', '.join(unmapped)}")
    if unknown:
        writer.note(f"not compared, and unknown to adapter {adapter.name!r}: "
                    f"{', '.join(unknown)}")


def conventions(writer: DumpWriter, mapping: TensorMap, stage: str) -> None:
    """Record what the compare must know of ``stage`` (:class:`TensorMap`'s ``view``,
    ``omits``, ``why``) under the manifest's ``conventions``."""
    entry = {key: value for key, value in (("view", [list(v) for v in mapping.view]),
                                          ("omits", list(mapping.omits)),
                                          ("why", mapping.why)) if value}
    if entry:
        writer.manifest.setdefault("conventions", {})[stage] = entry


def _add(writer: DumpWriter, spec: FamilySpec, mapping: TensorMap, stage: str,
         array: np.ndarray) -> None:
    """One tensor as its stage: transposed, frames dropped, its layout (a view's) recorded."""
    located = spec.locate(stage)
    layout = located.stage.layout if located else mapping.layout or "?"
    if mapping.layout:
        array = array.T
        writer.note(f"{stage}: the candidate's {mapping.layout} transposed to {layout}")
    if mapping.drop_frames:
        array = array[: array.shape[0] - mapping.drop_frames]
        writer.note(f"{stage}: its last {mapping.drop_frames} frame(s) dropped: {mapping.why}")
    if mapping.view:
        layout = viewed_layout(mapping.view, layout)
    writer.add_tensor(stage, array.astype(np.float32), layout)


# -- the weights of a port's own model file ---------------------------------------------------


@dataclass(frozen=True)
class StoredTensor:
    """A tensor of a port's model file: its name, its shape in numpy's order (rows last: ggml's
    ``ne`` reversed) and its ggml type's name (``q4_K``, as ``ggml_type_name`` writes it)."""

    name: str
    shape: tuple[int, ...]
    type: str

    @property
    def values(self) -> int:
        return math.prod(self.shape)


def ggml_name(quant_type: Any) -> str:
    """ggml's name of a ``gguf.GGMLQuantizationType`` (``Q4_K`` -> ``q4_K``, ``BF16`` ->
    ``bf16``, ``IQ4_NL`` -> ``iq4_nl``), the project's storage types' spelling."""
    name = quant_type.name.lower()
    return name[:-2] + "_K" if name.endswith("_k") else name


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
    """The tensors of a GGUF file, as ``gguf.GGUFReader`` reads them."""
    import gguf

    return [StoredTensor(tensor.name, tuple(int(n) for n in reversed(tensor.shape)),
                         ggml_name(tensor.tensor_type))
            for tensor in gguf.GGUFReader(str(path)).tensors]


#: The magic number of a legacy ggml model file (``ggml`` in hex, ``GGML_FILE_MAGIC``).
GGML_MAGIC = 0x67676D6C


def ggml_bin_tensors(path: Path, header: Sequence[tuple]) -> list[StoredTensor]:
    """The tensors of a legacy ggml model file (whisper.cpp's ``.bin``): its magic, then its
    ``header`` (below), then records of ``n_dims``, the name's length and the ggml type (int32
    each), the ``ne`` (int32 each), the name, the data, up to the end of the file.

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

    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return _ggml_bin_tensors(data, Path(path), header, gguf)


def _ggml_bin_tensors(data: mmap.mmap, path: Path, header: Sequence[tuple], gguf: Any
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
        name = data[offset:offset + length].decode("utf-8", "replace")
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
        offset += nbytes
        tensors.append(StoredTensor(name, tuple(reversed(ne)), ggml_name(quant)))
    return tensors


def storage_of(tensors: Sequence[StoredTensor], requested: Callable[[StoredTensor], str | None],
               tool: str) -> dict[str, Any]:
    """The ``storage`` field of a dump's manifest for a port's model file: ``bits_per_weight``
    over all its tensors (:func:`type_bits`), ``types`` (type -> how many tensors) and the
    ``fallbacks``: one line ``"<tensor> [shape]: <requested> -> <stored> (why)"`` for each matmul
    weight (``requested`` gives its type; None for a tensor the tool's quantizer leaves alone)
    stored as another type, whether its rows do not fill the requested type's blocks or the
    tool (``tool``, its title) chose otherwise. The same fields as our port's
    (:func:`audioparity.storage.storage_record`)."""
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


def unfilled(tensors: Sequence[StoredTensor]) -> list[str]:
    """One line for each type and row length of the tensors stored as a block type whose
    blocks their rows do not fill (a quantizer that wrote rows of 384 values as q4_K, blocks
    of 256, without a fallback), naming them: ggml cannot use them (a loader refuses their
    size, or a matmul aborts)."""
    groups: dict[tuple[str, int, int], list[str]] = {}
    for tensor in tensors:
        block, row = block_of(tensor.type)[0], tensor.shape[-1] if tensor.shape else 1
        if row % block:
            groups.setdefault((tensor.type, row, block), []).append(tensor.name)
    return [f"{len(names)} tensor(s) stored {kind} in rows of {row} values, which do not fill "
            f"its blocks of {block}, so ggml cannot use them: {', '.join(names)}"
            for (kind, row, block), names in groups.items()]


def model_storage(adapter: Adapter, model: Path, options: Mapping[str, Any],
                  weight_type: str) -> tuple[dict[str, Any], list[str]] | None:
    """The ``storage`` field of a cell of ``adapter`` at ``weight_type`` (:func:`storage_of`)
    from the model file its run reads (:meth:`Adapter.model_file` in the folder ``model`` its
    conversion wrote, read by :meth:`Adapter.model_tensors`), and the lines for the cell's
    notes of its tensors ggml cannot use (:func:`unfilled`); None for an adapter that names no
    such file, or when the file is not there (its run then fails, saying so)."""
    path = adapter.model_file(Path(model), options, weight_type)
    if path is None:
        return None
    if not Path(path).is_file():
        log.warning("%s: no %s to record the storage of", adapter.name, path)
        return None
    tensors = adapter.model_tensors(Path(path))
    return (storage_of(tensors, lambda tensor: adapter.requested_type(tensor, weight_type,
                                                                      options), adapter.title),
            unfilled(tensors))


def matches(patterns: Sequence[str], name: str) -> bool:
    """Whether one of the regular expressions ``patterns`` matches all of ``name``."""
    return any(re.fullmatch(pattern, name) for pattern in patterns)
