"""Entries of the caches every checkout of a machine shares (``~/.cache/audioparity``: the ports'
trees and their downloads, the reference environments, the tiny seeded fixtures
(:func:`cached_tree`); setup/ggml-python.sh keeps its wheels the same way with flock(1)). Two
runs may want one entry at once (a ``make ports`` in one clone while another clone's ``make
test`` builds it): each entry is built under an exclusive lock of its own (:func:`building`), so
one run builds it and the other waits, then finds it complete and reuses it; two different
entries build at once. An entry appears complete or not at all."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger("audioparity")


def lock_path(entry: Path) -> Path:
    """The lock file of cache entry ``entry``: ``<parent>/.<name>.lock``."""
    return entry.parent / f".{entry.name}.lock"


@contextlib.contextmanager
def building(entry: Path) -> Iterator[None]:
    """Hold the exclusive lock of cache entry ``entry`` (:func:`lock_path`, created with its
    folder) for the block; when another run holds it, say so once (``waiting for another build
    of <name> (lock <path>)``, logged) and wait. The block re-checks whether the entry is
    complete before building it: the run that held the lock may have built it. The lock is
    ``flock(2)``'s, so a run that dies releases it."""
    lock = lock_path(entry)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with open(lock, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("waiting for another build of %s (lock %s)", entry.name, lock)
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def replace_link(link: Path, target: str) -> None:
    """Point the symbolic link ``link`` at ``target`` (relative to its folder) in one rename,
    so a reader finds the old target or the new one, never no link."""
    temporary = link.with_name(f".{link.name}.{os.getpid()}")
    temporary.unlink(missing_ok=True)
    temporary.symlink_to(target)
    temporary.replace(link)


#: Environment variable: the folder of built fixtures every checkout shares (default
#: ``~/.cache/audioparity/fixtures``).
FIXTURES = "AUDIOPARITY_FIXTURES"
#: The file a complete cache entry holds, written last.
BUILT = ".built"


def fixtures_cache() -> Path:
    """The shared folder of built fixtures (:data:`FIXTURES`)."""
    return Path(os.environ.get(FIXTURES) or Path.home() / ".cache" / "audioparity" / "fixtures")


def cached_tree(entry: Path, output: Path, build: Callable[[Path], None]) -> bool:
    """Write the folder ``output`` from cache entry ``entry``: copied when the entry is
    complete, else built by ``build(output)`` under the entry's lock (:func:`building`) and
    then stored (copied beside the entry, marked :data:`BUILT`, renamed into place). Returns
    whether it came from the cache. ``output`` is written either way; a build that raises
    stores nothing."""
    if (entry / BUILT).is_file():
        shutil.copytree(entry, output, ignore=shutil.ignore_patterns(BUILT))
        return True
    with building(entry):
        if (entry / BUILT).is_file():
            shutil.copytree(entry, output, ignore=shutil.ignore_patterns(BUILT))
            return True
        build(output)
        staging = entry.with_name(f".{entry.name}.{os.getpid()}")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(output, staging)
        (staging / BUILT).touch()
        shutil.rmtree(entry, ignore_errors=True)  # an entry some run left without BUILT
        staging.rename(entry)
    return False


#: The libraries whose versions key a fixture besides its code: what builds and saves it.
FIXTURE_LIBRARIES = ("numpy", "torch", "nemo_toolkit", "transformers", "safetensors")


def fixture_entry(family: str, seed: int, options: dict, code: Path) -> Path:
    """The cache entry of a fixture (:func:`fixtures_cache`): named by the sha256 of the
    family, the seed, the options, the digest of the code that builds it (the first line of
    ``code``, the workflow's ``results/code/<family>/fixture.sha256``) and the versions of
    :data:`FIXTURE_LIBRARIES`; anything else changed builds anew.

    Raises:
        AudioparityError: ``code`` cannot be read.
    """
    import hashlib
    import json
    from importlib.metadata import PackageNotFoundError, version

    from audioparity.contract.errors import AudioparityError

    try:
        digest = Path(code).read_text().split("\n", 1)[0].strip()
    except OSError as err:
        raise AudioparityError(f"{code}: cannot read the fixture's code digest "
                               f"({err.strerror or err})") from None
    versions = {}
    for name in FIXTURE_LIBRARIES:
        try:
            versions[name] = version(name)
        except PackageNotFoundError:
            versions[name] = None
    key = json.dumps({"family": family, "seed": seed, "options": options, "code": digest,
                      "versions": versions}, sort_keys=True, default=str)
    return fixtures_cache() / f"{family}-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
