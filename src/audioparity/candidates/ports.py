"""Building the third-party ports (``make ports``, ``audioparity ports``): each adapter's
:class:`~audioparity.candidates.Port`, from its source snapshot into a cache, once."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import sys
import tarfile
from collections.abc import Sequence
from pathlib import Path

from audioparity.candidates.adapter import VULKAN_MARK, Adapter, source_file
from audioparity.candidates.registry import registered
from audioparity.candidates.running import run_tool
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import sha256_of
from audioparity.dumping.shared_cache import building, replace_link

log = logging.getLogger("audioparity")

#: Patches a port's build applies to its unpacked tree (:attr:`Port.vulkan_patch`,
#: :attr:`Port.patches`).
PATCHES = Path(__file__).resolve().parent / "patches"
#: Our drivers of ports' public APIs, built into their trees (:attr:`Port.drivers`).
DRIVERS = Path(__file__).resolve().parent / "drivers"
#: The stamp a port's tree holds once it is built (its products, one line).
BUILT = ".built"


def build_ports(source: Path, cache: Path, jobs: int = 2,
                adapters: Sequence[Adapter] | None = None, vulkan: bool = False
                ) -> dict[str, Path]:
    """Build the port of every adapter (``adapters``, default every registered one) that has
    one, from its snapshot in ``source`` into ``cache`` (one folder per port and snapshot,
    ``<archive stem>-<sha256 prefix>``), once: a built one is reused (seconds). Returns
    ``{adapter: link}``; ``cache/<adapter>`` links to the tree. With ``vulkan``, each port that
    has a Vulkan build (:attr:`Port.vulkan`) also gets it, patched, in a tree of its own linked
    as ``cache/<adapter>-vulkan``. The cache is shared by every checkout of the machine: each
    tree, and each download, is built by one run at a time (:func:`_build`,
    :func:`~audioparity.dumping.shared_cache.building`); another run wanting it waits, saying so,
    and reuses it.

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
        vendored += [(_download(package, source_file(package), sha256, Path(cache),
                                adapter.name), sha256, folder, into)
                     for package, sha256, folder, into in adapter.port.assets]
        commands = json.dumps([adapter.port.commands, adapter.port.vendors]).encode()
        patches = [PATCHES / patch for patch in adapter.port.patches]  # an absolute one stays
        stem = "-".join([archive.name.removesuffix('.tar.gz'), digest[:12],
                         hashlib.sha256(commands).hexdigest()[:8],
                         *(sha256_of(driver)[:8] for driver in drivers),
                         *(other_digest[:8] for _, other_digest, _, _ in vendored),
                         *(sha256_of(patch)[:8] for patch in patches)])
        variants = [(adapter.name, stem, (), patches)]
        if vulkan and adapter.port.vulkan:
            patch = PATCHES / adapter.port.vulkan_patch if adapter.port.vulkan_patch else None
            key = sha256_of(patch)[:8] if patch else "plain"
            variants.append((f"{adapter.name}-vulkan", f"{stem}-vulkan-{key}",
                             adapter.port.vulkan, [*patches, *([patch] if patch else [])]))
        for name, tree, extra, tree_patches in variants:
            tree_root = Path(cache) / tree
            with building(tree_root):
                if not (tree_root / BUILT).is_file():
                    _build(adapter, archive, tree_root, jobs, extra, tree_patches,
                           [(other, folder, into) for other, _, folder, into in vendored])
            link = Path(cache) / name
            replace_link(link, tree_root.name)
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


def _archive(adapter: Adapter, source: Path, cache: Path) -> tuple[Path, str]:
    """The port's source archive and its sha256: the one snapshot in ``source`` matching
    :attr:`Port.archive`, or, for a port with a :attr:`Port.download`, that package fetched once
    into ``cache/downloads`` and checked against its sha256.

    Raises:
        AudioparityError: no archive or several; a download of another digest (removed).
    """
    port = adapter.port
    archives = sorted(source.glob(port.archive))
    if not archives and port.download:
        archive = _download(port.download, port.archive, port.download_sha256, cache,
                            adapter.name)
        return archive, sha256_of(archive)
    if len(archives) != 1:
        raise AudioparityError(f"{source}: expected one {port.archive}, found {len(archives)}")
    return archives[0], sha256_of(archives[0])


def _download(package: str, pattern: str, sha256: str | None, cache: Path, name: str) -> Path:
    """The source package ``package`` (``name==version``), fetched once into
    ``cache/downloads`` without its dependencies (``pip download --no-deps --no-binary
    :all:``) and checked against ``sha256`` when given; ``pattern`` is its file name.

    Raises:
        AudioparityError: pip leaves no such file or several; a file of another digest
            (removed).
    """
    downloads = cache / "downloads"
    with building(downloads / pattern):
        archives = sorted(downloads.glob(pattern))
        if not archives:
            log.info("ports: downloading %s (the source package)", package)
            work = downloads / f".{pattern}.partial"  # this run's while it holds the lock
            shutil.rmtree(work, ignore_errors=True)
            run_tool([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
                      "--no-binary", ":all:", "--dest", str(work), package], {},
                     f"download {name}", echo=False)
            for fetched in work.glob(pattern):
                os.replace(fetched, downloads / fetched.name)
            shutil.rmtree(work)
            archives = sorted(downloads.glob(pattern))
        if len(archives) != 1:
            raise AudioparityError(f"{downloads}: pip download {package} left "
                                   f"{len(archives)} {pattern}; expected one")
        if sha256 and sha256_of(archives[0]) != sha256:
            archives[0].unlink()
            raise AudioparityError(f"{archives[0]}: sha256 differs from {sha256} ({package}); "
                                   "removed, run again to fetch it anew")
    return archives[0]


def _build(adapter: Adapter, archive: Path, tree_root: Path, jobs: int,
           configure: tuple[str, ...] = (), patches: Sequence[Path] = (),
           vendored: Sequence[tuple[Path, str, str]] = ()) -> None:
    """Unpack ``archive`` into ``tree_root``, each ``(archive, folder, destination)`` of
    ``vendored`` (:attr:`Port.vendors`, :attr:`Port.assets`) into it, apply ``patches``, and run
    the port's commands, ``configure`` appended to the first; a Vulkan build (``configure``
    given) leaves :data:`VULKAN_MARK` in the tree. Run under the tree's lock.

    The tree is built where it stays, not renamed into place: CMake writes its absolute path
    into what it links (``build/bin/llama-quantize`` finds ``libllama.so`` by it). It counts as
    built once it holds :data:`BUILT`, written last in one rename, and ``cache/<adapter>`` links
    to it only then; a build that dies leaves a tree without the stamp, which the next build
    removes."""
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
    for patch in patches:
        run_tool(["patch", "-p1", "--quiet", "-i", str(patch)], {}, f"patch {adapter.name}",
                 cwd=tree_root, echo=False)
    if adapter.port.drivers:
        (tree_root / "drivers").mkdir()
        for name in adapter.port.drivers:
            shutil.copy(DRIVERS / name, tree_root / "drivers" / name)
    for step, command in enumerate(adapter.port.commands):
        argv = [arg.format(jobs=jobs) for arg in command] + list(configure if step == 0 else ())
        run_tool(argv, {}, f"build {adapter.name}", cwd=tree_root, echo=False)
    missing = [p for p in adapter.port.products if not (tree_root / p).is_file()]
    if missing:
        raise AudioparityError(f"build {adapter.name}: {missing[0]} was not built")
    if configure:
        (tree_root / VULKAN_MARK).write_text(" ".join(configure) + "\n")
    stamp = tree_root / f"{BUILT}.partial"
    stamp.write_text(" ".join(adapter.port.products) + "\n")
    stamp.replace(tree_root / BUILT)

