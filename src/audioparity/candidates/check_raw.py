"""``audioparity check-dump --adapter``: a tool's raw output folder (``f32json`` pairs, ``npy``
files) read through its adapter's declarations and checked against the family's dump contract
as :mod:`.check` checks a dump; every problem one line."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from audioparity.candidates import f32json
from audioparity.candidates.adapter import Adapter, TensorMap
from audioparity.candidates.dump_checks import (
    FLOAT,
    RUNNER_FILES,
    Checked,
    Shaped,
    document_problems,
    layers_text,
    missing_layers,
    shape_problems,
    value_problems,
)
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import LAYER, FamilySpec, Stage, concrete
from audioparity.contract.vocabulary import StageKind
from audioparity.dumping.artifacts import MANIFEST, _one_line, _read_npy_header


@dataclass
class _ToolFiles:
    """What :func:`check_tool_folder` found of a tool's files, as it reads them."""

    problems: list[str] = field(default_factory=list)
    shaped: list[Shaped] = field(default_factory=list)
    unmapped: int = 0  # files it declares unmapped: read, not mapped
    #: map -> layer -> source index -> (where, shape; () when unreadable)
    found: dict[TensorMap, dict] = field(
        default_factory=lambda: defaultdict(lambda: defaultdict(dict)))
    stages: set[str] = field(default_factory=set)


def check_tool_folder(folder: Path, spec: FamilySpec, adapter: Adapter) -> Checked:
    """The problems of the raw folder of ``adapter``'s tool against ``spec``'s contract
    (:func:`audioparity.candidates.check.check_dump` says which), and what was checked."""
    if (folder / MANIFEST).is_file():
        return Checked([f"{folder / MANIFEST}: a dump of the contract; expected adapter "
                        f"{adapter.name!r}'s raw output (check a dump without --adapter)"], "")
    suffixes = (f32json.DATA, f32json.SIDECAR) if adapter.output == "f32json" else (
        ".npy", ".json")
    seen = _ToolFiles()
    items, files = _tool_items(folder, adapter, suffixes, seen.problems)
    for (name, suffix), file in items.items():
        _tool_file(folder, name, suffix, file, spec, adapter, suffixes, seen)
    layers: set[int] = set()
    for mapping in adapter.tensors:
        seen.problems += _mapping_problems(folder, mapping, spec, adapter, seen, layers)
    if adapter.printed is not None:
        seen.problems += _parsed_problems(folder, adapter)
    problems = seen.problems + shape_problems(seen.shaped, spec)
    declared = (f" ({seen.unmapped} of them declared unmapped, not compared)" if seen.unmapped
                else "")
    checked = (f"{files} file(s) of adapter {adapter.name!r}{declared} onto {len(seen.stages)} "
               f"stage(s) of {spec.name}{layers_text(layers)}")
    return Checked(problems, checked)


def _tool_items(folder: Path, adapter: Adapter, suffixes: tuple[str, str],
                problems: list[str]) -> tuple[dict[tuple[str, str], Path], int]:
    """``{(name, suffix): file}``, one per tensor or document of the folder (an ``f32json``
    pair as its ``.f32``), and how many files; an unknown file is a problem."""
    items: dict[tuple[str, str], Path] = {}
    files = 0
    for item in sorted(folder.iterdir()):
        if item.name in RUNNER_FILES:
            continue
        suffix = next((s for s in suffixes if item.name.endswith(s) and item.is_file()), None)
        if suffix is None:
            kind = "folder" if item.is_dir() else "file"
            problems.append(f"{item}: unknown {kind}; expected {' or '.join(suffixes)} files of "
                            f"adapter {adapter.name!r}")
            continue
        files += 1
        key = (item.name.removesuffix(suffix), "" if adapter.output == "f32json" else suffix)
        if key not in items or suffix == f32json.DATA:
            items[key] = item
    return items, files


def _tool_file(folder: Path, name: str, suffix: str, file: Path, spec: FamilySpec,
               adapter: Adapter, suffixes: tuple[str, str], seen: _ToolFiles) -> None:
    """One tensor or document of the tool's folder: mapped onto a stage of the family (or
    declared unmapped, and readable), then read and checked as that stage."""
    located = adapter.tensor_map(name)
    if located is None and adapter.declares_unmapped(name):
        seen.unmapped += sum((folder / f"{name}{s}").is_file() for s in suffixes) if (
            adapter.output == "f32json") else 1
        seen.problems += _unmapped_problems(folder, name, file, suffix, adapter)
        return
    if located is None:
        sources = ", ".join(s for mapping in adapter.tensors for s in mapping.sources())
        if adapter.unmapped:
            sources += f", or a file it declares unmapped ({', '.join(adapter.unmapped)})"
        seen.problems.append(f"{file}: maps to no stage of {spec.name} through adapter "
                             f"{adapter.name!r}; expected one of {sources}")
        return
    mapping, index, layer = located
    stage_name = concrete(mapping.stage, layer)
    where = f"{file} ({stage_name})"
    stage_found = spec.locate(stage_name)
    if stage_found is None:
        seen.problems.append(f"{where}: adapter {adapter.name!r} maps it to {stage_name!r}, no "
                             f"stage of {spec.name}")
        return
    stage = stage_found.stage
    seen.stages.add(stage_name)
    seen.found[mapping][layer][index] = (where, ())
    if stage.kind == StageKind.DOCUMENT or suffix == ".json":
        if stage.kind != StageKind.DOCUMENT or suffix != ".json":
            seen.problems.append(f"{where}: a {suffix} file for a {stage.kind} stage; expected "
                                 f"{'.json' if stage.kind == 'document' else '.npy'}")
        else:
            seen.problems.extend(document_problems(file, stage, list(mapping.omits)))
        return
    read = _tool_tensor(folder, name, file, where, adapter, seen.problems)
    if read is None:
        return
    shape, array = read
    seen.problems.extend(value_problems(where, array, stage.kind))
    seen.found[mapping][layer][index] = (where, shape)
    if len(mapping.sources()) == 1:
        seen.shaped.append(_mapped_shape(mapping, stage, stage_name, file, shape))


def _tool_tensor(folder: Path, name: str, file: Path, where: str, adapter: Adapter,
                 problems: list[str]) -> tuple[tuple[int, ...], np.ndarray] | None:
    """A tensor of the tool's (an ``f32json`` pair or a ``.npy``): its shape and values, or
    None when it cannot be read (its problems added to ``problems``)."""
    if adapter.output == "f32json":
        shape, pair = f32json.check_pair(folder, name)
        problems += pair
        if shape is None:
            return None
        return shape, np.fromfile(folder / f"{name}{f32json.DATA}", dtype="<f4").reshape(shape)
    try:
        shape, dtype, _ = _read_npy_header(file)
    except AudioparityError as err:
        problems.append(str(err))
        return None
    if str(dtype) != FLOAT:
        problems.append(f"{where}: dtype {dtype}; expected {FLOAT}")
    return tuple(shape), np.load(file, allow_pickle=False)


def _mapping_problems(folder: Path, mapping: TensorMap, spec: FamilySpec, adapter: Adapter,
                      seen: _ToolFiles, layers: set[int]) -> list[str]:
    """What a map of the adapter lacks in the folder: its file, each of its layers without
    gaps (the layers found are added to ``layers``), each source of a stacked map."""
    by_layer = seen.found.get(mapping, {})
    stage_found = spec.locate(concrete(mapping.stage, 0))
    document = stage_found is not None and stage_found.stage.kind == StageKind.DOCUMENT
    suffix = f32json.DATA if adapter.output == "f32json" else ".json" if document else ".npy"
    if any(LAYER in source for source in mapping.sources()):
        present = {k for k in by_layer if k is not None}
        layers |= present
        wanted: list[int | None] = sorted(present | set(missing_layers(present)))
        expected = f"layers 0..{max(present)} without gaps" if present else "at least layer 0"
    else:
        wanted, expected = [None], f"every stage adapter {adapter.name!r} maps"
    problems = [f"{folder}: missing {concrete(source, layer)}{suffix} (stage "
                f"{concrete(mapping.stage, layer)}); expected {expected}"
                for layer in wanted for index, source in enumerate(mapping.sources())
                if index not in by_layer.get(layer, {})]
    if len(mapping.sources()) > 1 and stage_found is not None:
        problems += _stack_problems(folder, mapping, by_layer, stage_found.stage, seen.shaped)
    return problems


def _parsed_problems(folder: Path, adapter: Adapter) -> list[str]:
    """The document the adapter's tool prints (:attr:`Adapter.printed`): what its ``parse``
    cannot read of the tool's ``stdout.txt`` and ``stderr.txt`` in ``folder`` (without the
    model, which a raw folder lacks), one line."""
    stdout = folder / "stdout.txt"
    if not stdout.is_file():
        return [f"{folder}: missing stdout.txt (stage {adapter.printed.stage}); expected the "
                f"tool's output, from which adapter {adapter.name!r} reads it"]
    stderr = folder / "stderr.txt"
    try:
        adapter.parse(stdout.read_text(), stderr.read_text() if stderr.is_file() else "", None,
                      options={})
    except AudioparityError as err:
        return [f"{stdout}: {err}"]
    return []


def _unmapped_problems(folder: Path, name: str, file: Path, suffix: str,
                       adapter: Adapter) -> list[str]:
    """A file the adapter declares unmapped: not compared, but ``candidate run`` reads every
    file of the folder, so an unreadable one is a problem (a broken ``.f32`` + ``.json`` pair,
    a corrupt ``.npy``, a ``.json`` that is not JSON)."""
    if adapter.output == "f32json":
        return f32json.check_pair(folder, name)[1]
    if suffix == ".npy":
        try:
            _read_npy_header(file)
        except AudioparityError as err:
            return [str(err)]
        return []
    try:
        json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        return [f"{file}: unreadable JSON ({_one_line(err)}); expected the JSON document adapter "
                f"{adapter.name!r} writes"]
    return []


def _mapped_shape(mapping: TensorMap, stage: Stage, stage_name: str, file: Path,
                  shape: tuple[int, ...]) -> Shaped:
    """A candidate's tensor as the shape checks see it: transposed to the stage's axes when
    the map declares its own layout; the frames it drops and the rows its view takes noted."""
    where = f"{file} ({stage_name})"
    if mapping.layout:
        shape = shape[::-1]
        where = f"{file} ({stage_name}, its {mapping.layout} transposed)"
    rows = sum(1 for step in mapping.view if step[0] == "row")
    return Shaped(stage_name, where, shape, stage.layout, rows, mapping.drop_frames)


def _stack_problems(folder: Path, mapping: TensorMap, by_layer: dict, stage: Stage,
                    shaped: list[Shaped]) -> list[str]:
    """A stacked map's sources (``dec.lstm.{i}.h.0`` and ``.c.0``): all of one shape, which,
    stacked ``[layers, sources, ...]`` as ``candidate run`` stacks them, joins the shape
    checks."""
    parts = [(where, shape) for _, by_index in sorted(by_layer.items(), key=lambda i: i[0] or 0)
             for _, (where, shape) in sorted(by_index.items()) if shape]
    if not parts:
        return []
    model = Counter(shape for _, shape in parts).most_common(1)[0][0]
    problems = [f"{where}: shape {list(shape)}; expected {list(model)} like the other sources "
                f"stacked into {stage.name}" for where, shape in parts if shape != model]
    if not problems:
        names = " + ".join(mapping.sources())
        shaped.append(Shaped(stage.name, f"{folder}/{names} ({stage.name}, stacked)",
                              (len(by_layer), len(mapping.sources()), *model), stage.layout))
    return problems
