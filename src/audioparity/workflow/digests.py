"""Content digests of the sweep's input files (its cases), kept between runs by each file's
size and modification time, so a run hashes only the files that changed since the last: what a
reference job's plan names (:meth:`~.plan.Sweep.reference_plan`)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path


class Digests:
    """The sha256 of files, remembered in ``cache`` (a JSON file; None: not kept) by their
    absolute path, size and modification time."""

    def __init__(self, cache: Path | None = None) -> None:
        self.cache = cache
        self._known: dict[str, list] = {}
        self._dirty = False
        if cache is not None and cache.is_file():
            try:
                self._known = json.loads(cache.read_text())
            except ValueError:
                self._known = {}

    def __call__(self, path: str | os.PathLike) -> str:
        """The sha256 of the file ``path``'s content (a directory's: of its files' names and
        contents, in sorted order).

        Raises:
            OSError: it cannot be read.
        """
        key = os.path.abspath(path)
        stat = os.stat(key)
        stamp = [stat.st_size, stat.st_mtime_ns]
        known = self._known.get(key)
        if known is None or known[:2] != stamp:
            known = [*stamp, _sha256(Path(key))]
            self._known[key] = known
            self._dirty = True
        return known[2]

    def save(self) -> None:
        """Write the cache where a file was hashed since it was read."""
        if self.cache is not None and self._dirty:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.cache.with_name(f".{self.cache.name}.{os.getpid()}")
            temporary.write_text(json.dumps(self._known, sort_keys=True))
            os.replace(temporary, self.cache)
            self._dirty = False


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    for file in files:
        if path.is_dir():
            digest.update(f"{file.relative_to(path)}\0".encode())
        with file.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
