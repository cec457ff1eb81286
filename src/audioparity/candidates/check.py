"""``audioparity check-dump``: a candidate's dump directory, or a tool's raw output folder read
through its adapter, checked against a family's dump contract (docs/design.md, "Dump
contract"); every problem is one line, nothing is skipped silently."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from audioparity.candidates.adapter import Adapter
from audioparity.candidates.dump_checks import (
    FLOAT,
    Checked,
    Shaped,
    document_problems,
    layers_text,
    missing_layers,
    shape_problems,
    value_problems,
)
from audioparity.candidates.registry import load_adapter
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import LAYER, FamilySpec
from audioparity.contract.vocabulary import DUMP_STATUSES, StageKind
from audioparity.dumping.artifacts import (
    MANIFEST,
    _convention_ok,
    _not_exposed_ok,
    _one_line,
    _read_npy_header,
    base_layout,
    manifest_problems,
    same_layout,
)
from audioparity.dumping.driver import MARGINS
from audioparity.dumping.storage import BLOCK_HASHES

#: Where our dump of a third-party candidate keeps the tool's own files (``candidate run``).
RAW = "raw"
#: Files besides the contract's that a dump directory may hold: Snakemake's marker of a
#: directory output, and the block hashes of the weights it stored
#: (:data:`~audioparity.dumping.storage.BLOCK_HASHES`).
ALLOWED = (".snakemake_timestamp", BLOCK_HASHES)
def check_dump(path: str | os.PathLike, family_name: str,
               adapter: str | Adapter | None = None) -> list[str]:
    """Every problem of the dump at ``path`` against the contract of family ``family_name``,
    one line each (what, which file, what was expected); empty when it conforms.

    Without ``adapter``, or with an adapter of output ``dump``, ``path`` is a dump directory
    (``manifest.json``). Required stages: every stage of the family's spec, tensor or document,
    that is not an isolated or replayed form, of a head (:attr:`Stage.head`) only when the dump
    holds a stage of that head (at least one head's); a per-layer stage (``layer_{i}``) as
    ``layer_0`` .. ``layer_{n-1}`` without gaps, n >= 1. Forms and ``<document>_margins``
    tensors are allowed, not required. Not required: a stage the manifest's ``not_exposed``
    names (``{stage of the spec: why}``, written by ``candidate run`` for a port that does not
    expose it: the compare reports it ``unavailable``), and any when the status is not ``ok``
    (the status is a problem of its own). Allowed besides the listed files: ``raw/`` (a
    third-party candidate's files, not checked) and :data:`ALLOWED`.

    With an adapter of output ``f32json`` or ``npy``, ``path`` is the tool's raw folder
    (``<name>.f32`` + ``<name>.json`` pairs, or ``<name>.npy`` tensors and ``<name>.json``
    documents, no manifest): each file maps onto a stage through the adapter's
    :class:`TensorMap`; a tensor is transposed to the stage's axes when the map declares a
    layout, and loses the frames it drops. Required: every map of the adapter, a per-layer
    map for layers 0 .. n-1 without gaps (each of its sources, for a stacked map). Allowed
    besides: :data:`RUNNER_FILES`, and the files the adapter declares ``unmapped`` (sub-block
    taps no stage holds: not compared, but ``candidate run`` reads them, so they must be
    readable: a broken pair or ``.npy`` is a problem). An adapter of output ``tokens`` writes
    no files: one problem, nothing to check.

    Problems, in any mode: a missing required stage; a file the contract or the adapter does
    not name (unknown); an unreadable, truncated or corrupt file; a tensor of another rank than
    its stage's layout (``[T, D]`` rank 2, ``[layers, 2, H]`` rank 3; a view's rows less), of
    another size on a numeric axis (``2`` of ``[layers, 2, H]``), or of another shape than the
    other stages of its layout (every ``[T, D]`` stage of a dump has one T and one D); a dtype
    other than float32; NaN or infinite values (-inf is allowed in a logits stage: a masked
    class; margins tensors are not checked for values); a document that is not a JSON object
    or lacks a field of its stage's layout (less the fields the candidate declares it omits);
    a manifest that is malformed (its ``conventions`` and ``not_exposed`` included, one line
    each), of a status other than ``ok``, or of another family; a ``not_exposed`` key that is
    no stage of the family's spec.

    Raises:
        AudioparityError: an unknown family or adapter, an adapter that does not implement the
            family, or ``path`` not a directory.
    """
    return check(path, family_name, adapter).problems


def check(path: str | os.PathLike, family_name: str,
          adapter: str | Adapter | None = None) -> Checked:
    """:func:`check_dump`'s problems, and what was checked (for the ok line).

    Raises:
        AudioparityError: as :func:`check_dump`.
    """
    from audioparity.models.registry import family

    spec = family(family_name).spec
    if isinstance(adapter, str):
        adapter = load_adapter(adapter)
    if adapter is not None and spec.name not in adapter.families:
        raise AudioparityError(f"adapter {adapter.name!r} implements "
                               f"{', '.join(adapter.families)}, not {spec.name}")
    folder = Path(path)
    if not folder.is_dir():
        raise AudioparityError(f"{folder}: no such directory; expected a dump directory")
    if adapter is None or adapter.output == "dump":
        return _check_contract_dump(folder, spec)
    if adapter.output == "tokens":
        return Checked([f"{folder}: adapter {adapter.name!r} writes no files (output "
                        f"'tokens': only the decode it prints): nothing to check; expected an "
                        "adapter of output dump, f32json or npy"], "")
    from audioparity.candidates.check_raw import check_tool_folder

    return check_tool_folder(folder, spec, adapter)


# --- a dump of the contract --------------------------------------------------------------------


def _check_contract_dump(folder: Path, spec: FamilySpec) -> Checked:
    manifest_path = folder / MANIFEST
    if not manifest_path.is_file():
        return Checked([f"{folder}: no {MANIFEST}; expected a dump of the contract (a tool's raw "
                        "folder is checked with --adapter)"], "")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        return Checked([f"{manifest_path}: unreadable manifest ({_one_line(err)})"], "")
    problems, tensors, documents = manifest_problems(manifest, manifest_path)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("tensors"), dict):
        return Checked(problems, "")
    not_exposed = manifest.get("not_exposed", {})
    not_exposed = not_exposed if _not_exposed_ok(not_exposed) else {}
    problems += _header_problems(manifest, manifest_path, spec, not_exposed)
    conventions = manifest.get("conventions", {})
    conventions = {k: v for k, v in conventions.items() if _convention_ok(v)} if isinstance(
        conventions, dict) else {}
    shaped: list[Shaped] = []
    for name, entry in tensors.items():
        problems += _listed_tensor_problems(folder, name, entry, spec, documents,
                                            conventions.get(name, {}), shaped)
    for name, file in documents.items():
        problems += _listed_document_problems(folder / file, name, spec,
                                              conventions.get(name, {}).get("omits", []))
    problems += shape_problems(shaped, spec)
    layers: set[int] = set()
    if manifest.get("status", "ok") == "ok":
        problems += _required_problems(folder, manifest, spec, not_exposed, layers)
    problems += _unknown_files(folder, manifest, tensors, documents)
    hidden = f", {len(not_exposed)} stage(s) not exposed" if not_exposed else ""
    checked = (f"a dump of {spec.name}: {len(tensors)} tensor(s), {len(documents)} "
               f"document(s){layers_text(layers)}{hidden}")
    return Checked(problems, checked)


def _header_problems(manifest: dict, manifest_path: Path, spec: FamilySpec,
                     not_exposed: dict) -> list[str]:
    """A status other than ``ok``, another family, a ``not_exposed`` key that is no stage."""
    problems = []
    status = manifest.get("status", "ok")
    if status != "ok" and status in DUMP_STATUSES:
        why = f" ({manifest['message']})" if manifest.get("message") else ""
        problems.append(f"{manifest_path}: status {status!r}{why}; expected ok (its required "
                        "stages are not checked)")
    if manifest.get("family", spec.name) != spec.name:
        problems.append(f"{manifest_path}: family {manifest['family']!r}; expected {spec.name}")
    names = [stage.name for stage in spec.stages]
    for name in not_exposed:
        if name not in names:
            problems.append(f"{manifest_path}: not_exposed names {name!r}, no stage of "
                            f"{spec.name}; expected stages of its spec ({', '.join(names)})")
    return problems


def _listed_tensor_problems(folder: Path, name: str, entry: dict, spec: FamilySpec,
                            documents: dict, convention: dict, shaped: list[Shaped]
                            ) -> list[str]:
    """One tensor the manifest lists: a stage (or a form, or a document's margins) of a
    tensor kind, its file there and of the header, dtype, layout and values the manifest and
    the stage say; its shape joins ``shaped``."""
    file = folder / entry["file"]
    found = spec.locate(name)
    margins = found is None and name.endswith(MARGINS) and (
        name.removesuffix(MARGINS) in documents)
    if found is None and not margins:
        return [f"{file}: tensor {name!r} is no stage of {spec.name}; expected one of "
                f"{', '.join(stage.name for stage in spec.stages)}, their isolated or replayed "
                f"forms, or <document>{MARGINS}"]
    if found is not None and found.stage.kind == StageKind.DOCUMENT:
        return [f"{file}: {name!r} is listed as a tensor; stage {found.stage.name} is a "
                f"document {found.stage.layout}, expected under 'documents'"]
    if not file.is_file():
        return [f"{file}: missing; {MANIFEST} lists it as tensor {name!r}"]
    try:
        shape, dtype, _ = _read_npy_header(file)
    except AudioparityError as err:
        return [str(err)]
    problems = []
    if list(shape) != entry["shape"] or str(dtype) != entry["dtype"]:
        problems.append(f"{file}: {list(shape)} {dtype} in its header; {MANIFEST} says "
                        f"{entry['shape']} {entry['dtype']}")
    if str(dtype) != FLOAT:
        problems.append(f"{file}: dtype {dtype}; expected {FLOAT}")
    if margins:
        return problems
    stage, view = found.stage, convention.get("view", [])
    if not same_layout(base_layout(entry["layout"]) if view else entry["layout"], stage.layout):
        problems.append(f"{file}: layout {entry['layout']!r} in {MANIFEST}; expected "
                        f"{stage.layout!r} (stage {stage.name})")
    shaped.append(Shaped(name, str(file), tuple(shape), stage.layout,
                          sum(1 for step in view if step[0] == "row")))
    return problems + value_problems(str(file), np.load(file, allow_pickle=False), stage.kind)


def _listed_document_problems(file: Path, name: str, spec: FamilySpec, omits: list[str]
                              ) -> list[str]:
    """One document the manifest lists: a document stage, readable, with its fields."""
    found = spec.locate(name)
    if found is None or found.stage.kind != StageKind.DOCUMENT:
        what = "no stage" if found is None else f"a tensor stage ({found.stage.name})"
        documents = ", ".join(s.name for s in spec.stages if s.kind == StageKind.DOCUMENT)
        return [f"{file}: document {name!r} is {what} of {spec.name}; expected one of "
                f"{documents}"]
    return document_problems(file, found.stage, omits)


def _required_problems(folder: Path, manifest: dict, spec: FamilySpec, not_exposed: dict,
                       layers: set[int]) -> list[str]:
    """The stages an ``ok`` dump lacks: every stage of the spec that is not a form, of the
    heads it holds stages of, less those ``not_exposed`` names; per-layer stages without
    gaps (the layers found are added to ``layers``)."""
    documents = manifest.get("documents")
    listed = {*manifest["tensors"], *(documents if isinstance(documents, dict) else {})}
    heads = {stage.head for stage in spec.stages if stage.head}
    present_heads = {stage.head for stage in spec.stages if stage.head
                     and any(stage.match(n) for n in listed)}
    problems = []
    if heads and not present_heads:
        problems.append(f"{folder}: no stage of any head of {spec.name} "
                        f"({', '.join(sorted(heads))}); expected every stage of one")
    for stage in spec.stages:
        if stage.name in not_exposed or (stage.head and stage.head not in present_heads):
            continue
        if LAYER not in stage.name:
            if stage.name not in listed:
                problems.append(f"{folder}: missing stage {stage.name!r} ({stage.kind} "
                                f"{stage.layout}); expected every stage of {spec.name} but "
                                "isolated and replayed forms")
            continue
        present = {found[0] for n in listed if (found := stage.match(n)) and not found[1]}
        layers |= present
        for k in missing_layers(present):
            expected = (f"layers 0..{max(present)} without gaps" if present
                        else f"at least {stage.concrete(0)}")
            problems.append(f"{folder}: missing stage {stage.concrete(k)!r} ({stage.kind} "
                            f"{stage.layout}); expected {expected}")
    return problems


def _unknown_files(folder: Path, manifest: dict, tensors: dict, documents: dict) -> list[str]:
    """Files and folders of the dump that the manifest does not list (``raw/`` and
    :data:`ALLOWED` aside)."""
    known = {MANIFEST, *ALLOWED, *(entry["file"] for entry in tensors.values()),
             *documents.values()}
    raw_documents = manifest.get("documents")
    known |= {e["file"] for e in manifest["tensors"].values() if isinstance(e, dict) and
              isinstance(e.get("file"), str)}  # a malformed entry's file is no unknown file
    known |= {f for f in (raw_documents.values() if isinstance(raw_documents, dict) else ())
              if isinstance(f, str)}
    problems = []
    for item in sorted(folder.iterdir()):
        if item.name in known or (item.name == RAW and item.is_dir()):
            continue
        kind = "folder" if item.is_dir() else "file"
        problems.append(f"{item}: unknown {kind}; expected only {MANIFEST}, the files it lists "
                        f"and {RAW}/")
    return problems
