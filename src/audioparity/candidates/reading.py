"""Reading what a third-party tool wrote (its raw folder, what it printed) into a dump of the
contract, through its adapter's declarations (:class:`~audioparity.candidates.Adapter`)."""

from __future__ import annotations

import collections
import json
import logging
from pathlib import Path

import numpy as np

from audioparity.candidates import f32json
from audioparity.candidates.adapter import Adapter, TensorMap, ToolCall
from audioparity.contract.spec import FamilySpec
from audioparity.dumping.artifacts import DumpWriter, viewed_layout

log = logging.getLogger("audioparity")

#: The manifest's ``seconds`` key of a third-party tool's run: the wall time of all its
#: commands together, from the first one's start to the last one's exit.
RUN_WALL = "run_wall"


def read_tool_output(writer: DumpWriter, adapter: Adapter, call: ToolCall, raw: Path, *,
                     crash: str | None, commands: int) -> None:
    """The tool's files in ``raw`` (``f32json``, ``npy``), written for ``call`` (its family's
    table, model and options), as the contract's stages, then, unless
    it died (``crash``: why; the dump is then ``crashed``, keeping what it wrote, and the
    stages it never writes are recorded as not exposed, so the compare charges the crash to
    the first it would have written), the document it printed (:attr:`Adapter.printed`,
    :meth:`Adapter.parse` of ``raw/stdout.txt`` and ``raw/stderr.txt``) and the stages it does
    not expose; and its run's wall time on its last stage (:func:`wall_time`)."""
    spec = call.spec
    if adapter.output in ("f32json", "npy"):
        files, unreadable = (f32json.read_readable(raw) if adapter.output == "f32json"
                             else npy_folder(raw))
        import_files(writer, adapter, spec, files, unreadable)
    if crash:
        writer.set_status("crashed", crash)
        not_exposed(writer, adapter, spec, crashed=True)
        log.warning("%s: %s; kept the %d tensor(s) it wrote", adapter.name, crash,
                    len(writer.manifest["tensors"]))
    else:
        if adapter.printed is not None:
            stage = adapter.printed.concrete(None)
            writer.add_json(stage, adapter.parse((raw / "stdout.txt").read_text(),
                                                 (raw / "stderr.txt").read_text(), call.model,
                                                 options=call.options))
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


def not_exposed(writer: DumpWriter, adapter: Adapter, spec: FamilySpec,
                crashed: bool = False) -> None:
    """Record, under the manifest's ``not_exposed``, each stage of the contract the candidate
    wrote nothing for, with why (:meth:`Adapter.unavailable`, else "does not expose it"): the
    compare reports those stages ``unavailable``, not ``missing``. The stages of a head
    (:attr:`Stage.head`) the candidate wrote nothing of are another kind of model's, not
    unexposed ones (unless it wrote no head's stage at all). For a tool that died
    (``crashed``), only the stages none of its files or printed document maps onto: those it
    never writes, not those it died before writing."""
    maps = (*adapter.tensors, *([adapter.printed] if adapter.printed else ())) if crashed else ()
    written = [*writer.manifest["tensors"], *writer.manifest["documents"],
               *(m.concrete(0) for m in maps)]
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
