"""Entries of the caches every checkout of a machine shares (``~/.cache/audioparity``: the ports'
trees and their downloads, the reference environments; setup/ggml-python.sh keeps its wheels the
same way with flock(1)). Two runs may want one entry at once (a ``make ports`` in one clone while
another clone's ``make test`` builds it): each entry is built under an exclusive lock of its own
(:func:`building`), so one run builds it and the other waits, then finds it complete and reuses
it; two different entries build at once. An entry appears complete or not at all."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
from collections.abc import Iterator
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
