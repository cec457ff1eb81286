"""A bundle: the candidate side of a sweep's cells on some backends, packed on any machine to run
on another that has the backend and no network (a GPU host), and its results merged back into
the first machine's sweep (docs/bundles.md).

The first machine runs the references, the conversions and the baseline (cpu) dumps, and packs
what the host's jobs read: those files, the project's workflow and source, the wheels of
everything the candidate side imports (no torch, no NeMo), and ggml-python's source package. On
the host, the bundle's ``run`` installs the wheels offline, builds ggml-python with the
backend, and runs the same workflow on the same config, allowed only the rules that run ggml
(:data:`HOST_RULES`): every other output is a file the bundle brought. What it computed comes
back as a folder, ``returned/``, which :func:`merge` takes into the first machine's results
when nothing it was computed from has changed there since the bundle was packed; the
workflow then replays and compares those cells with the reference, and reports them with the
rest.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterable, Iterator
from contextlib import chdir
from importlib.metadata import version
from pathlib import Path
from types import SimpleNamespace

import tomllib
import yaml

from audioparity.compare.plan import CellKey
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import FRESH
from audioparity.workflow import paths
from audioparity.workflow.code import BUILD
from audioparity.workflow.plan import BASELINE_BACKEND, Sweep

#: The rules a bundle's host runs: those whose jobs run ggml (its dumps, the fresh-against-
#: reused check, the drill-down) and the comparison with the baseline, which reads only dumps.
#: The comparisons with the reference read the reference's replay of the cell (torch): they
#: run on the first machine once the results are merged.
HOST_RULES = ("ggml_dump", "compare_backend", "compare_fresh", "drilldown")
#: The workflow's files the host runs (and the report's captions the Snakefile names).
PROJECT_ITEMS = ("Snakefile", "rules", "config", "envs", "docs", "src", "setup", "Makefile")
#: The project's files whose change makes a bundle's results stale: what the jobs run (how
#: ggml is built too), and the config the sweep starts from.
CODE_ITEMS = ("Snakefile", "rules", "config/config.yaml", "config/schema.yaml", "envs", "src",
              *BUILD)
#: The bundle's description (and the returned folder's), at the root of each.
MANIFEST = "bundle.json"
#: Where the host's ``run`` leaves what it computed, in the bundle's folder.
RETURNED = "returned"
#: The folders of a bundle.
PROJECT, WHEELS, SOURCES, EXTERNAL = "project", "wheels", "sources", "external"
#: The requirements the host installs before it builds ggml-python (in WHEELS).
BUILD_REQUIREMENTS = "build-requirements.txt"
#: The host's script, in the project's setup/, copied to the bundle's root as ``run``.
RUN_SCRIPT = "setup/bundle-run.sh"
#: The Python distribution of ggml-python, and the script that finds its source package.
GGML_DISTRIBUTION = "ggml-python"
SOURCE_SCRIPT = "setup/ggml-python-source.sh"


# -- planning -------------------------------------------------------------------------------


def load_config(workdir: Path, configfiles: list[Path]) -> dict:
    """The workflow's config as Snakemake builds it: config/config.yaml, each of
    ``configfiles`` merged over it in order, checked against the registered families and
    validated against config/schema.yaml (which fills the defaults).

    Raises:
        AudioparityError: a file that is missing or not YAML, or the config's first problem.
    """
    from snakemake.exceptions import WorkflowError
    from snakemake.utils import update_config, validate

    from audioparity.models.registry import registered
    from audioparity.workflow.plan import check_keys

    config: dict = {}
    for path in [workdir / "config" / "config.yaml", *configfiles]:
        try:
            update_config(config, yaml.safe_load(path.read_text()) or {})
        except (OSError, yaml.YAMLError) as err:
            raise AudioparityError(f"bundle: cannot read the config file {path}: {err}") from None
    check_keys(config, registered())
    try:
        validate(config, str(workdir / "config" / "schema.yaml"))
    except WorkflowError as err:
        raise AudioparityError(f"bundle: the config does not validate: {err}") from None
    return config


def host_cells(sweep: Sweep, backends: Iterable[str]) -> list[CellKey]:
    """The sweep's cells of ``backends`` (names of the families' backends or settings), each
    kind (against the reference, the baseline, its fresh run) the host computes something of.

    Raises:
        AudioparityError: a backend no family sweeps, or a third-party port's cell on one (a
            bundle carries this project's port: a port built on the first machine is no build
            for the host's backend).
    """
    backends = list(backends)
    known = sorted({name for plan in sweep.families.values() for name in plan.backends})
    for name in backends:
        if name not in known:
            raise AudioparityError(f"bundle: backend {name!r} is in no family's backends "
                                   f"({', '.join(known)})")
    cells = [cell for cell in sweep.cells() if cell.backend in backends]
    for cell in cells:
        if not sweep.families[cell.family].candidates[cell.candidate].adapter.family_port:
            raise AudioparityError(
                f"bundle: candidate {cell.candidate!r} of {cell.family} is a third-party port: "
                "a bundle carries this project's port only; leave that candidate out of the "
                "bundle's config")
    return cells


def ggml_kinds(sweep: Sweep, backends: Iterable[str]) -> list[str]:
    """The ggml backends (not their settings' names) ``backends`` run on, sorted."""
    return sorted({plan.backends[name].backend for plan in sweep.families.values()
                   for name in backends if name in plan.backends})


def _wildcards(cell: CellKey) -> SimpleNamespace:
    return SimpleNamespace(**cell._asdict())


def host_targets(sweep: Sweep, cells: Iterable[CellKey]) -> list[str]:
    """What the host computes of ``cells``: each cell's dump, its comparison with the
    baseline, and its results against the baseline (a drill-down's) and against its fresh run
    (:meth:`~.plan.Sweep.result`), in the sweep's order."""
    targets = []
    for cell in cells:
        if cell.against == "reference":
            targets.append(paths.fill(paths.GGML, cell._asdict()))
            continue
        if cell.against == BASELINE_BACKEND:
            targets.append(paths.fill(paths.COMPARE_BACKEND, cell._asdict()))
        targets.append(sweep.result(cell))
    return list(dict.fromkeys(targets))


def first_targets(sweep: Sweep, cells: Iterable[CellKey]) -> list[str]:
    """What the first machine computes before packing: the reference of each model the cells
    run, the weights they map, and their baseline dumps where the host computes none."""
    from audioparity.workflow.jobs import Jobs

    targets = []
    for cell in cells:
        w = _wildcards(cell)
        targets.append(Jobs.reference_dir(w))
        plan = sweep.families[cell.family]
        if plan.weights(cell.candidate, cell.weight_type):
            targets.append(paths.fill(paths.WEIGHTS, w))
        if cell.against == BASELINE_BACKEND:
            targets.append(Jobs.baseline_dump(w))
    return list(dict.fromkeys(targets))


def host_inputs(jobs, cells: Iterable[CellKey], targets: Iterable[str]) -> list[str]:
    """Every path the host's jobs of ``cells`` read that none of them writes (their
    ``targets``): the files a bundle carries. The same input functions as the rules' (a
    :class:`~.jobs.Jobs`); once the references are done."""
    inputs: list[str] = []
    for cell in cells:
        w = _wildcards(cell)
        if cell.against == "reference":
            found = jobs.ggml_inputs(w)
            if jobs.reads_reference(w):
                found.update(jobs.reference_inputs(w, lambda path: path))
        elif cell.against == FRESH:
            found = jobs.fresh_inputs(w)
        else:
            found = jobs.backend_compare_inputs(w)
            if jobs.sweep.result(cell) == paths.fill(paths.DRILLDOWN, cell._asdict()):
                found.update(jobs.drilldown_inputs(w))
                if jobs.plan(w).spec.ggml_reads_reference:
                    found.update(jobs.reference_inputs(w, lambda path: path))
        for value in found.values():
            inputs.extend([value] if isinstance(value, str) else value)
    written = tuple(targets)
    return [path for path in dict.fromkeys(inputs)
            if not any(path == target or path.startswith(target + "/") for target in written)]


# -- files ----------------------------------------------------------------------------------


def _files(path: Path) -> Iterator[Path]:
    """``path`` if a file, else every file under it (sorted)."""
    if path.is_file():
        yield path
    elif path.is_dir():
        yield from sorted(p for p in path.rglob("*") if p.is_file() and not any(
            part == "__pycache__" or part.endswith(".egg-info") for part in p.parts))


def _sha256(path: Path) -> str | None:
    """A file's content digest, None where it is missing."""
    if not path.is_file():
        return None
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _digests(workdir: Path, entries: Iterable[str]) -> dict[str, str]:
    """``{path: sha256}`` of every file of ``entries`` (relative to ``workdir``, or
    absolute), each keyed as its entry names it."""
    digests = {}
    for entry in entries:
        root = workdir / entry
        for file in _files(root):
            key = entry if file == root else os.path.join(entry, str(file.relative_to(root)))
            digests[key] = _sha256(file)
    return digests


def _copy(source: Path, target: Path) -> None:
    """A file or folder (without Python's caches and build records), with its times."""
    target.parent.mkdir(parents=True, exist_ok=True)
    if source.is_dir():
        shutil.copytree(source, target,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    else:
        shutil.copy2(source, target)


def _inside(workdir: Path, path: str) -> bool:
    return Path(os.path.abspath(workdir / path)).is_relative_to(workdir)


def _relocated(config: dict, workdir: Path, inputs: list[str]) -> tuple[dict, dict[str, str]]:
    """The inputs outside ``workdir`` moved into the bundle: ``(config, moves)``, where
    ``config`` overrides each family's ``models`` and ``cases`` that name one (a list replaces
    the whole list) and ``moves`` maps each such path to its place in the bundle's project.

    Raises:
        AudioparityError: an input outside ``workdir`` that is no model's or case's path.
    """
    outside = {path for path in inputs if not _inside(workdir, path)}
    overrides: dict = {}
    moves: dict[str, str] = {}
    for family in config["families"]:
        for key in ("models", "cases"):
            entries = config[family].get(key) or []
            if not any(entry["path"] in outside for entry in entries):
                continue
            listed = []
            for entry in entries:
                if entry["path"] in outside:
                    place = f"{EXTERNAL}/{family}/{key}/{entry['name']}/" \
                            f"{os.path.basename(entry['path'].rstrip('/'))}"
                    moves[entry["path"]] = place
                    entry = {**entry, "path": place}
                listed.append(entry)
            overrides.setdefault(family, {})[key] = listed
    unplaced = sorted(outside - set(moves))
    if unplaced:
        raise AudioparityError(f"bundle: {unplaced[0]} is read by the bundle's jobs and lies "
                               f"outside {workdir}, and no model's or case's path names it")
    return overrides, moves


# -- pack -----------------------------------------------------------------------------------


def _snakemake(workdir: Path, configfiles: list[Path], cores: int, targets: list[str]) -> None:
    """Run the workflow in ``workdir`` on ``targets``, its output on this process's stderr.

    Raises:
        AudioparityError: it failed.
    """
    command = [sys.executable, "-m", "snakemake", "--directory", str(workdir), "--snakefile",
               str(workdir / "Snakefile"), "--cores", str(cores), "--rerun-incomplete",
               "--configfile", *map(str, configfiles), "--", *targets]
    print(f"bundle: running the first machine's side ({len(targets)} targets)", file=sys.stderr)
    if subprocess.run(command, stdout=sys.stderr).returncode != 0:
        raise AudioparityError("bundle: the workflow failed on the first machine's side (its "
                               "output above); nothing was packed")


def _requirements(workdir: Path) -> list[str]:
    """The project's requirements the candidate side installs: its dependencies and its
    ``workflow`` extra, from ``workdir``'s pyproject.toml, less ggml-python (built from its
    source package on the host)."""
    project = tomllib.loads((workdir / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["workflow"]]
    return [r for r in wanted if not r.lower().replace("_", "-").startswith(GGML_DISTRIBUTION)]


def ggml_source(workdir: Path, folder: Path) -> Path:
    """ggml-python's source package (the installed version's), copied into ``folder``: the one
    setup/ggml-python-source.sh finds (given, kept in the wheel cache, else downloaded there).

    Raises:
        AudioparityError: the script found none (its line).
    """
    result = subprocess.run([str(workdir / SOURCE_SCRIPT), sys.executable,
                             version(GGML_DISTRIBUTION)], capture_output=True, text=True)
    if result.returncode != 0:
        raise AudioparityError(f"bundle: {result.stderr.strip().splitlines()[-1:]}")
    source = Path(result.stdout.strip())
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, folder / source.name)
    return folder / source.name


def _pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "--quiet", *args],
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise AudioparityError(f"bundle: pip {args[0]} failed: "
                               f"{result.stderr.strip().splitlines()[-1:]}")


def _build_requirements(source: Path) -> list[str]:
    """ggml-python's build requirements and its own dependencies, from its source package's
    pyproject.toml; and CMake, which its build needs at 3.21 or newer."""
    with tarfile.open(source) as archive:
        member = next(m for m in archive.getmembers() if m.name.endswith("/pyproject.toml")
                      and m.name.count("/") == 1)
        project = tomllib.loads(archive.extractfile(member).read().decode())
    return [*project["build-system"]["requires"], *project["project"]["dependencies"],
            "cmake>=3.21"]


def _wheels(workdir: Path, source: Path, folder: Path) -> None:
    """Every wheel the host installs, for this machine's Python: the project's, its
    requirements' (built where only a source package exists), ggml-python's build
    requirements; and the list of the latter (:data:`BUILD_REQUIREMENTS`)."""
    build = _build_requirements(source)
    print("bundle: gathering the wheels", file=sys.stderr)
    _pip("wheel", "--wheel-dir", str(folder), *_requirements(workdir), *build)
    with tempfile.TemporaryDirectory() as copy:  # a build writes into its tree: not the sweep's
        for item in ("pyproject.toml", "README.md", "src"):
            _copy(workdir / item, Path(copy) / item)
        _pip("wheel", "--no-deps", "--wheel-dir", str(folder), copy)
    (folder / BUILD_REQUIREMENTS).write_text("".join(f"{r}\n" for r in build))


def _write_bundle(workdir: Path, configfiles: list[Path], output: Path, manifest: dict,
                  inputs: list[str], relocated: tuple[dict, dict[str, str]]) -> None:
    """The tar file ``output``, written whole or not at all: the project's items, the config
    files and their path overrides, the inputs (moved where ``relocated`` says), the ggml
    source package and wheels, the host's run script and ``manifest``."""
    overrides, moves = relocated
    output.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=output.parent, prefix=".bundle-") as staging:
        root = Path(staging) / output.name.removesuffix(".tar")
        project = root / PROJECT
        for item in PROJECT_ITEMS:
            _copy(workdir / item, project / item)
        for i, path in enumerate(configfiles):
            _copy(path, project / "bundle" / f"config-{i}.yaml")
        (project / "bundle" / "paths.yaml").write_text(yaml.safe_dump(overrides))
        for path in inputs:
            _copy(workdir / path, project / moves.get(path, path))
        source = ggml_source(workdir, root / SOURCES)
        _wheels(workdir, source, root / WHEELS)
        shutil.copy2(workdir / RUN_SCRIPT, root / "run")
        (root / "run").chmod(0o755)
        (root / MANIFEST).write_text(json.dumps({**manifest, "ggml_source":
                                                 f"{SOURCES}/{source.name}"}, indent=1) + "\n")
        partial = Path(staging) / "bundle.tar"
        with tarfile.open(partial, "w") as archive:
            archive.add(root, arcname=root.name)
        os.replace(partial, output)


def pack(workdir: Path, configfiles: list[Path], backends: list[str] | None, output: Path,
         cores: int) -> dict:
    """Pack the bundle of the sweep's cells on ``backends`` (default: every backend of the
    sweep but the baseline) into the tar file ``output``, after running the first machine's
    side of them (:func:`first_targets`) in ``workdir``, the workflow's folder.

    Returns:
        The bundle's manifest (:data:`MANIFEST`).

    Raises:
        AudioparityError: bad config, backend or input (one line); the workflow failed.
            Nothing is left at ``output`` then.
    """
    from audioparity.workflow import start

    workdir, output = workdir.resolve(), output.resolve()
    configfiles = [path.resolve() for path in configfiles]
    with chdir(workdir):
        config = load_config(workdir, configfiles)
        sweep = start(config, workdir / "src").jobs.sweep
        if backends is None:
            backends = sorted({name for plan in sweep.families.values()
                               for name in plan.backends} - {BASELINE_BACKEND})
        kinds = [kind for kind in ggml_kinds(sweep, backends) if kind != BASELINE_BACKEND]
        if len(kinds) > 1:
            raise AudioparityError(f"bundle: its backends run on {' and '.join(kinds)}: a "
                                   "bundle builds ggml with one accelerator; pack one bundle "
                                   "for each")
        cells = host_cells(sweep, backends)
        if not cells:
            raise AudioparityError(f"bundle: the sweep has no cell on {', '.join(backends)}")
        targets = host_targets(sweep, cells)
        _snakemake(workdir, configfiles, cores, first_targets(sweep, cells))
        jobs = start(config, workdir / "src").jobs  # the references are done now
        inputs = host_inputs(jobs, cells, targets)
    missing = [path for path in inputs if not (workdir / path).exists()]
    if missing:
        raise AudioparityError(f"bundle: {missing[0]} is read by the bundle's jobs and was "
                               "not made")
    overrides, moves = _relocated(config, workdir, inputs)
    manifest = {
        "packed": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "backends": list(backends),
        "ggml_backend": kinds[0] if kinds else BASELINE_BACKEND,
        "python": "{}.{}".format(*sys.version_info[:2]),
        "configfiles": [f"bundle/config-{i}.yaml" for i in range(len(configfiles))]
        + ["bundle/paths.yaml"],
        "allowed_rules": list(HOST_RULES),
        "targets": targets,
        # what the host's results are computed from, as it is here: merge() holds them to it
        "files": _digests(workdir, [*CODE_ITEMS, *map(str, configfiles), *inputs]),
    }
    _write_bundle(workdir, configfiles, output, manifest, inputs, (overrides, moves))
    return manifest


# -- the host's side ------------------------------------------------------------------------


def collect(bundle: Path) -> list[str]:
    """On the host, after its run: copy what it computed of the bundle's targets (those that
    are there: a failed job leaves none), the jobs' logs and benchmarks, and the manifest into
    ``bundle``/returned, replacing an earlier one.

    Returns:
        The targets that are missing.

    Raises:
        AudioparityError: the run recomputed a result the bundle brought (a baseline dump):
            what it computed would not follow from the first machine's results.
    """
    manifest = json.loads((bundle / MANIFEST).read_text())
    project, returned = bundle / PROJECT, bundle / RETURNED
    redone = sorted(path for path, digest in manifest["files"].items()
                    if path.startswith(f"{paths.RESULTS}/")
                    and _sha256(project / path) != digest)
    if redone:
        raise AudioparityError(
            f"bundle: the host's run recomputed {redone[0]}"
            f"{f' and {len(redone) - 1} more' if len(redone) > 1 else ''}, which the bundle "
            "brought from the first machine (its code or inputs differ here): its results "
            "would not follow from the first machine's; nothing is returned")
    shutil.rmtree(returned, ignore_errors=True)
    returned.mkdir()
    missing = []
    for target in manifest["targets"]:
        if (project / target).exists():
            _copy(project / target, returned / target)
        else:
            missing.append(target)
    for folder in ("logs", f"{paths.RESULTS}/benchmarks"):
        if (project / folder).is_dir():
            _copy(project / folder, returned / folder)
    (returned / MANIFEST).write_text(json.dumps({**manifest, "missing": missing}, indent=1)
                                     + "\n")
    return missing


# -- merge ----------------------------------------------------------------------------------


def merge(workdir: Path, returned: Path) -> list[str]:
    """Take a bundle's returned folder into ``workdir``'s results: each target it computed
    replaces what is there, with the logs and benchmarks, all timed now, so that the workflow
    treats them as made after what they read and computes what follows from them (the
    comparisons with the reference, the report).

    Returns:
        Lines for the user: what was merged, what is missing.

    Raises:
        AudioparityError: ``returned`` is no bundle's returned folder, or a file the results
            were computed from has changed here since the bundle was packed (they would be
            stale); nothing is merged then.
    """
    try:
        manifest = json.loads((returned / MANIFEST).read_text())
    except (OSError, ValueError) as err:
        raise AudioparityError(f"bundle merge: {returned} is no bundle's returned folder "
                               f"(its {MANIFEST}: {err})") from None
    lacking = [key for key in ("packed", "backends", "targets", "files")
               if not isinstance(manifest, dict) or key not in manifest]
    if lacking:
        raise AudioparityError(f"bundle merge: {returned} is no bundle's returned folder (its "
                               f"{MANIFEST} lacks {', '.join(map(repr, lacking))})")
    targets, files = manifest["targets"], manifest["files"]
    workdir = workdir.resolve()
    changed = sorted(path for path, digest in files.items()
                     if _sha256(workdir / path) != digest)
    if changed:
        more = f" and {len(changed) - 1} more" if len(changed) > 1 else ""
        raise AudioparityError(
            f"bundle merge: {changed[0]}{more} changed here since the bundle was packed "
            f"({manifest['packed']}): its results would be stale; pack a new bundle")
    now = time.time()
    merged = [target for target in targets if (returned / target).exists()]
    for entry in [*merged, "logs", f"{paths.RESULTS}/benchmarks"]:
        if not (returned / entry).exists():
            continue
        if entry in merged:
            _replace(returned / entry, workdir / entry)
        else:
            shutil.copytree(returned / entry, workdir / entry, dirs_exist_ok=True)
        for path in [workdir / entry, *(workdir / entry).rglob("*")]:
            os.utime(path, (now, now))
    lines = [f"bundle merge: {len(merged)} of {len(targets)} results of "
             f"{', '.join(manifest['backends'])} merged into {workdir / paths.RESULTS}"]
    missing = [target for target in targets if target not in merged]
    if missing:
        lines.append(f"bundle merge: {len(missing)} missing (their jobs failed on the host; "
                     f"its logs are merged): {missing[0]}{' ...' if len(missing) > 1 else ''}")
    lines.append("bundle merge: run the workflow with the bundle's config to compare them "
                 "with the reference and report them")
    return lines


def _replace(source: Path, target: Path) -> None:
    """``target`` replaced by a copy of ``source``, never half there: copied beside it, then
    renamed over it."""
    partial = target.with_name(f".{target.name}.merging")
    shutil.rmtree(partial, ignore_errors=True)
    _copy(source, partial)
    if target.is_dir():
        shutil.rmtree(target)
    os.replace(partial, target)
