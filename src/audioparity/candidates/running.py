"""Running a third-party candidate for one cell and reading what it writes into a dump of the
contract (``audioparity candidate convert|run``); building the ports (``make ports``)."""

from __future__ import annotations

import collections
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import DumpWriter, built_directory, sha256_of, viewed_layout
from audioparity.candidates import (
    VULKAN_MARK,
    Adapter,
    TensorMap,
    adapter_module,
    f32json,
    registered,
)
from audioparity.errors import AudioparityError
from audioparity.families import FamilySpec, family
from audioparity.guard import describe_exit

log = logging.getLogger("audioparity")

#: Lines of a tool's stderr kept in the message when it fails.
STDERR_TAIL = 3


class ToolFailed(AudioparityError):
    """A tool that started and exited non-zero or was killed (not one that could not start)."""


def _run_tool(argv: Sequence[str], env: dict[str, str], what: str,
              cwd: Path | None = None, echo: bool = True) -> tuple[str, str]:
    """Run ``argv``; its stdout and stderr. With ``echo``, its stderr also goes through to ours
    (a job's log); a build's thousands of compiler lines do not.

    Raises:
        AudioparityError: it cannot start, or exits non-zero (naming the exit and the last
            lines of its stderr).
    """
    log.info("%s: %s", what, " ".join(map(str, argv)))
    try:
        result = subprocess.run([str(a) for a in argv], env={**os.environ, **env}, cwd=cwd,
                                capture_output=True, text=True, errors="replace")
    except OSError as err:
        raise AudioparityError(f"{what}: cannot run {argv[0]} ({err.strerror or err})") from None
    if echo:
        sys.stderr.write(result.stderr)
    if result.returncode != 0:
        tail = " | ".join(line.strip() for line in result.stderr.splitlines()[-STDERR_TAIL:])
        raise ToolFailed(f"{what}: {Path(str(argv[0])).name} failed "
                         f"({describe_exit(result.returncode)}): {tail or 'no stderr'}")
    return result.stdout, result.stderr


def convert(adapter_name: str, model: Path, weight_type: str, output_dir: Path,
            options: dict[str, Any]) -> None:
    """The candidate's own model files for ``model`` at ``weight_type``, written by its
    adapter's ``convert`` commands into ``output_dir`` (atomically).

    Raises:
        AudioparityError: the adapter converts nothing, or a command fails.
    """
    module = adapter_module(adapter_name)
    if not module.ADAPTER.converts:
        raise AudioparityError(f"adapter {adapter_name!r} converts no model")
    options = module.ADAPTER.check_options(options, f"adapter {adapter_name!r} options")
    with built_directory(output_dir) as work:
        for argv in module.convert(Path(model), weight_type, work, options=options):
            _run_tool(argv, {}, f"convert {model} for {adapter_name} ({weight_type})")


def run_candidate(adapter_name: str, family_name: str, options: dict[str, Any], model: Path,
                  case: Path, output_dir: Path, *, reference_dir: Path | None, weight_type: str,
                  backend: str, threads: int, family_options: dict[str, Any] | None = None
                  ) -> None:
    """One cell of a third-party candidate: run its command, then read what it wrote (raw
    files kept under ``<dump>/raw/``) into a dump of the contract at ``output_dir``.

    ``family_options`` are the family's options of the config (its ggml options: flash
    attention, ...), for an adapter that maps them onto the tool's flags. A weight type or
    backend the adapter does not run gives an ``unavailable`` dump saying so.
    Each tensor is mapped by the adapter's :class:`TensorMap`; what it maps to nothing is named
    in a note, never dropped silently.

    A tool that dies (exits non-zero, or a signal) gives a ``crashed`` dump holding what it
    wrote before, each file mapped as usual: the compare keeps those stages, marks the first
    stage it lacks ``crashed`` and the later ones ``missing``.

    Raises:
        AudioparityError: the tool cannot start, or writes what the adapter cannot read.
    """
    module = adapter_module(adapter_name)
    adapter: Adapter = module.ADAPTER
    spec = family(family_name)
    options = adapter.check_options(options, f"adapter {adapter_name!r} options")
    family_options = spec.check_options(family_options or {}, f"family {family_name} options")
    fields = {"family": family_name, "candidate_adapter": adapter_name, "backend": backend,
              "weight_type": weight_type, "threads": threads, "candidate_options": options}
    with DumpWriter(output_dir, producer=adapter_name, model=model, inputs={"case": case},
                    fields=fields) as writer:
        for note in adapter.notes:
            writer.note(note)
        missing = []
        if weight_type not in adapter.weight_types:
            missing.append(f"weight type {weight_type}")
        if backend not in adapter.backends:
            missing.append(f"backend {backend}")
        if missing:
            writer.set_status("unavailable", f"{adapter.title} has no {' or '.join(missing)} "
                              f"here (it runs {', '.join(adapter.weight_types)} on "
                              f"{', '.join(adapter.backends)})")
            return
        why = module.unavailable(options, backend) if hasattr(module, "unavailable") else None
        if why:
            writer.set_status("unavailable", why)
            return
        raw = writer.partial / "raw"
        raw.mkdir()
        reference = Path(reference_dir) if reference_dir is not None else None
        if adapter.reads_reference and reference is None:
            raise AudioparityError(f"{adapter.title} reads the reference dump of the case: "
                                   "give --reference-dir")
        if hasattr(module, "prepare"):
            module.prepare(reference, raw / "inputs", options=options)
            reference = raw / "inputs"
        commands = module.run(Path(model), Path(case), raw, spec=spec,
                              family_options=family_options,
                              options=options, weight_type=weight_type, backend=backend,
                              threads=threads, reference=reference)
        outputs, crash = [], None
        with writer.timed("run"):
            for argv, env in commands:
                try:
                    outputs.append(_run_tool(argv, env, f"{adapter_name} on {Path(case).name}"))
                except ToolFailed as err:  # it died: keep what it wrote before
                    crash = str(err)
                    break
        stdout, stderr = ("".join(part) for part in zip(*outputs, strict=True)) if outputs \
            else ("", "")
        (raw / "stdout.txt").write_text(stdout)
        (raw / "stderr.txt").write_text(stderr + (f"{crash}\n" if crash else ""))
        if adapter.output in ("f32json", "npy"):
            files, unreadable = (f32json.read_readable(raw) if adapter.output == "f32json"
                                 else _npy_folder(raw))
            _import(writer, adapter, spec, files, unreadable)
        if crash:
            writer.set_status("crashed", crash)
            log.warning("%s: %s; kept the %d tensor(s) it wrote", adapter_name, crash,
                        len(writer.manifest["tensors"]))
            return
        if hasattr(module, "parse"):
            name, document = module.parse(stdout, stderr, Path(model), options=options)
            found = adapter.tensor_map(name)
            stage = found[0].concrete(found[2]) if found else name
            writer.add_json(stage, document)
            if found:
                _conventions(writer, found[0], stage)
        _not_exposed(writer, adapter, spec)


def _not_exposed(writer: DumpWriter, adapter: Adapter, spec: FamilySpec) -> None:
    """Record, under the manifest's ``not_exposed``, each stage of the contract the candidate
    wrote nothing for (a port that prints only its decode), with why: the compare reports
    those stages ``unavailable``, not ``missing``. The stages of a head (:attr:`Stage.head`)
    the candidate wrote nothing of are another kind of model's, not unexposed ones (unless it
    wrote no head's stage at all). A stage it takes as its input (:attr:`Adapter.inputs`) is
    named as such."""
    written = [*writer.manifest["tensors"], *writer.manifest["documents"]]
    stages = [located[1] for located in map(spec.locate, written) if located]
    found = {stage.name for stage in stages}
    heads = {stage.head for stage in stages if stage.head}
    writer.manifest["not_exposed"] = {
        stage.name: (f"{adapter.title} takes it from the reference as its input"
                     if stage.name in adapter.inputs else f"{adapter.title} does not expose it")
        for stage in spec.stages
        if stage.name not in found and (not heads or stage.head in heads | {None})}


def _npy_folder(folder: Path) -> tuple[dict[str, np.ndarray | dict], dict[str, str]]:
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


def _import(writer: DumpWriter, adapter: Adapter, spec: FamilySpec,
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
        _conventions(writer, mapping, stage)
    for stage, layers in stacks.items():
        mapping = next(m for m in adapter.tensors if m.stage == stage)
        rows = [np.stack([parts[k] for k in range(len(mapping.sources()))])
                for _, parts in sorted(layers.items())]
        _add(writer, spec, mapping, stage, np.stack(rows))
        _conventions(writer, mapping, stage)
    if unmapped:
        writer.note(f"not compared (no stage of {spec.name} holds them): {', '.join(unmapped)}")
    if unknown:
        writer.note(f"not compared, and unknown to adapter {adapter.name!r}: "
                    f"{', '.join(unknown)}")


def _conventions(writer: DumpWriter, mapping: TensorMap, stage: str) -> None:
    """Record what the compare must know of ``stage`` (:class:`TensorMap`'s ``view``,
    ``omits``, ``why``) under the manifest's ``conventions``."""
    entry = {key: value for key, value in (("view", [list(v) for v in mapping.view]),
                                          ("omits", list(mapping.omits)),
                                          ("why", mapping.why)) if value}
    if entry:
        writer.manifest.setdefault("conventions", {})[stage] = entry


def _add(writer: DumpWriter, spec: FamilySpec, mapping: TensorMap, stage: str,
         array: np.ndarray) -> None:
    located = spec.locate(stage)
    layout = located[1].layout if located else mapping.layout or "?"
    if mapping.layout:
        array = array.T
        writer.note(f"{stage}: the candidate's {mapping.layout} transposed to {layout}")
    if mapping.drop_frames:
        array = array[: array.shape[0] - mapping.drop_frames]
        writer.note(f"{stage}: its last {mapping.drop_frames} frame(s) dropped: {mapping.why}")
    if mapping.view:
        layout = viewed_layout(mapping.view, layout)
    writer.add_tensor(stage, array.astype(np.float32), layout)


def build_ports(source: Path, cache: Path, jobs: int = 2,
                adapters: Sequence[Adapter] | None = None, vulkan: bool = False
                ) -> dict[str, Path]:
    """Build the port of every adapter (``adapters``, default every registered one) that has
    one, from its snapshot in ``source`` into ``cache`` (one folder per port and snapshot,
    ``<archive stem>-<sha256 prefix>``), once: a built one is reused (seconds). Returns
    ``{adapter: link}``; ``cache/<adapter>`` links to the tree. With ``vulkan``, each port that
    has a Vulkan build (:attr:`Port.vulkan`) also gets it, patched, in a tree of its own linked
    as ``cache/<adapter>-vulkan``.

    Raises:
        AudioparityError: no ``source`` folder, a snapshot missing or ambiguous, a build step
            failing (its last lines), or a product the build did not leave.
    """
    if not Path(source).is_dir():
        raise AudioparityError(f"{source}: no such folder; expected the ports' source snapshots "
                               "(PORTS_SOURCE=<folder>)")
    built = {}
    known = {**registered(), **{adapter.name: adapter for adapter in adapters or ()}}
    for adapter in registered().values() if adapters is None else adapters:
        if adapter.port is None:
            continue
        archive, digest = _archive(adapter, Path(source), Path(cache))
        drivers = [DRIVERS / name for name in adapter.port.drivers]
        vendored = [(*_archive(known[name], Path(source), Path(cache)), folder, into)
                    for name, folder, into in adapter.port.vendors]
        commands = json.dumps([adapter.port.commands, adapter.port.vendors]).encode()
        stem = "-".join([archive.name.removesuffix('.tar.gz'), digest[:12],
                         hashlib.sha256(commands).hexdigest()[:8],
                         *(sha256_of(driver)[:8] for driver in drivers),
                         *(other_digest[:8] for _, other_digest, _, _ in vendored)])
        variants = [(adapter.name, stem, (), None)]
        if vulkan and adapter.port.vulkan:
            patch = PATCHES / adapter.port.vulkan_patch if adapter.port.vulkan_patch else None
            key = sha256_of(patch)[:8] if patch else "plain"
            variants.append((f"{adapter.name}-vulkan", f"{stem}-vulkan-{key}",
                             adapter.port.vulkan, patch))
        for name, tree, extra, patch in variants:
            tree_root = Path(cache) / tree
            stamp = tree_root / ".built"
            if not stamp.is_file():
                _build(adapter, archive, tree_root, jobs, extra, patch,
                       [(other, folder, into) for other, _, folder, into in vendored])
                stamp.write_text(" ".join(adapter.port.products) + "\n")
            link = Path(cache) / name
            if link.is_symlink() or link.exists():
                link.unlink()
            link.symlink_to(tree_root.name)
            built[name] = link
            log.info("ports: %s ready in %s", name, tree_root)
    return built


def _unpack_folder(archive: Path, folder: str, destination: Path) -> None:
    """The files under ``<top>/<folder>/`` of ``archive`` unpacked into ``destination``.

    Raises:
        AudioparityError: the archive has no such folder.
    """
    with tarfile.open(archive) as tar:
        members = tar.getmembers()
        prefix = f"{members[0].name.split('/')[0]}/{folder}/"
        inside = [m.replace(name=m.name.removeprefix(prefix)) for m in members
                  if m.name.startswith(prefix)]
        if not inside:
            raise AudioparityError(f"{archive}: no folder {folder}; expected it to vendor")
        destination.mkdir(parents=True, exist_ok=True)
        tar.extractall(destination, members=inside, filter="data")


#: Patches a port's build applies to its unpacked tree (:attr:`Port.vulkan_patch`).
PATCHES = Path(__file__).resolve().parent / "patches"
#: Our drivers of ports' public APIs, built into their trees (:attr:`Port.drivers`).
DRIVERS = Path(__file__).resolve().parent / "drivers"


def _archive(adapter: Adapter, source: Path, cache: Path) -> tuple[Path, str]:
    """The port's source archive and its sha256: the one snapshot in ``source`` matching
    :attr:`Port.archive`, or, for a port with a :attr:`Port.download`, that package fetched once
    into ``cache/downloads`` and checked against its sha256.

    Raises:
        AudioparityError: no archive or several; a download of another digest (removed).
    """
    port = adapter.port
    archives = sorted(source.glob(port.archive))
    downloaded = not archives and port.download
    if downloaded:
        downloads = cache / "downloads"
        archives = sorted(downloads.glob(port.archive))
        if not archives:
            log.info("ports: downloading %s (the source package)", port.download)
            _run_tool([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                       "--no-binary", ":all:", "--dest", str(downloads), port.download], {},
                      f"download {adapter.name}", echo=False)
            archives = sorted(downloads.glob(port.archive))
        if not archives:
            raise AudioparityError(f"{downloads}: pip download {port.download} left no "
                                   f"{port.archive}")
    if len(archives) != 1:
        raise AudioparityError(f"{source}: expected one {port.archive}, found {len(archives)}")
    digest = sha256_of(archives[0])
    if downloaded and port.download_sha256 and digest != port.download_sha256:
        archives[0].unlink()
        raise AudioparityError(f"{archives[0]}: sha256 differs from {port.download_sha256} "
                               f"({port.download}); removed, run again to fetch it anew")
    return archives[0], digest


def _build(adapter: Adapter, archive: Path, tree_root: Path, jobs: int,
           configure: tuple[str, ...] = (), patch: Path | None = None,
           vendored: Sequence[tuple[Path, str, str]] = ()) -> None:
    """Unpack ``archive`` into ``tree_root``, each ``(archive, folder, destination)`` of
    ``vendored`` (:attr:`Port.vendors`) into it, apply ``patch``, and run the port's commands,
    ``configure`` appended to the first; a Vulkan build (``configure`` given) leaves
    :data:`VULKAN_MARK` in the tree."""
    if tree_root.exists():
        shutil.rmtree(tree_root)
    tree_root.mkdir(parents=True)
    with tarfile.open(archive) as tar:
        tar.extractall(tree_root, filter="data")
    (top,) = [p for p in tree_root.iterdir() if p.is_dir()]
    for entry in top.iterdir():
        entry.rename(tree_root / entry.name)
    top.rmdir()
    for other, folder, into in vendored:
        _unpack_folder(other, folder, tree_root / into)
    if patch is not None:
        _run_tool(["patch", "-p1", "--quiet", "-i", str(patch)], {}, f"patch {adapter.name}",
                  cwd=tree_root, echo=False)
    if adapter.port.drivers:
        (tree_root / "drivers").mkdir()
        for name in adapter.port.drivers:
            shutil.copy(DRIVERS / name, tree_root / "drivers" / name)
    for step, command in enumerate(adapter.port.commands):
        argv = [arg.format(jobs=jobs) for arg in command] + list(configure if step == 0 else ())
        _run_tool(argv, {}, f"build {adapter.name}", cwd=tree_root, echo=False)
    missing = [p for p in adapter.port.products if not (tree_root / p).is_file()]
    if missing:
        raise AudioparityError(f"build {adapter.name}: {missing[0]} was not built")
    if configure:
        (tree_root / VULKAN_MARK).write_text(" ".join(configure) + "\n")

