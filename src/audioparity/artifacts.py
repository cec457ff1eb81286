"""Dump directories: one ``.npy`` per tensor, JSON documents, and ``manifest.json``.

Layout of a dump directory (DESIGN.md, "Artifact contract")::

    <dir>/manifest.json         producer, model + sha256, input + sha256, backend, weight type,
                                threads, library versions, seconds per stage, status, tensors
    <dir>/<name>.npy            one tensor, canonical layout (batch dropped, time-major [T, D])
    <dir>/<name>.json           documents such as decode.json

Writes are atomic: everything goes to ``<dir>.partial/`` first and is renamed to ``<dir>`` only
when the writer commits, so a job that dies leaves nothing that a later stage takes as complete.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import platform
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.errors import AudioparityError

MANIFEST = "manifest.json"
#: Statuses a dump may carry. ``ok``: all tensors written; ``unavailable``: the requested
#: backend is not built into this ggml; ``crashed``: the producing process died.
DUMP_STATUSES = ("ok", "unavailable", "crashed")


def sha256_of(path: str | os.PathLike) -> str:
    """SHA-256 hex digest of a file, or of every file under a directory (sorted by relative path).

    Raises:
        AudioparityError: the path does not exist.
    """
    path = Path(path)
    if not path.exists():
        raise AudioparityError(f"{path}: no such file or directory")
    digest = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if path.is_dir():
            digest.update(str(file.relative_to(path)).encode())
        with open(file, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (``"absent"`` when not installed)."""
    versions = {"python": platform.python_version()}
    for name in ("numpy", *names):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions


def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, default=_json_default) + "\n")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


class DumpWriter:
    """Writes one dump directory atomically.

    Use as a context manager; tensors and documents land in ``<output_dir>.partial/`` and the
    directory is renamed to ``output_dir`` on a clean exit (after the manifest is written). On an
    exception the partial directory is removed and the exception propagates.

    Args:
        output_dir: final directory.
        producer: ``nemo``, ``torch``, ``ggml`` or ``external``.
        model: model path (file or directory); its sha256 goes into the manifest.
        inputs: input files (audio, prompt) by role; their sha256 go into the manifest.
            Both may be omitted for a dump that only records a status (``crashed``).
        fields: further manifest fields (backend, weight_type, threads, ...).
        versions: distributions whose versions to record besides python and numpy.
    """

    def __init__(
        self,
        output_dir: str | os.PathLike,
        *,
        producer: str,
        model: str | os.PathLike | None = None,
        inputs: dict[str, str | os.PathLike] | None = None,
        fields: dict[str, Any] | None = None,
        versions: tuple[str, ...] = (),
    ) -> None:
        self.output_dir = Path(output_dir)
        self.partial = self.output_dir.with_name(self.output_dir.name + ".partial")
        self.manifest: dict[str, Any] = {
            "producer": producer,
            "model": None if model is None else {"path": str(model), "sha256": sha256_of(model)},
            "inputs": {
                role: {"path": str(p), "sha256": sha256_of(p)} for role, p in (inputs or {}).items()
            },
            **(fields or {}),
            "versions": library_versions(*versions),
            "status": "ok",
            "seconds": {},
            "tensors": {},
            "documents": {},
            "notes": [],
        }

    def __enter__(self) -> DumpWriter:
        if self.partial.exists():
            shutil.rmtree(self.partial)
        self.partial.mkdir(parents=True)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            shutil.rmtree(self.partial, ignore_errors=True)
            return
        _write_json(self.partial / MANIFEST, self.manifest)
        if self.output_dir.exists():
            shutil.rmtree(self.output_dir)
        os.replace(self.partial, self.output_dir)

    def add_tensor(self, name: str, array: np.ndarray, layout: str) -> None:
        """Store ``array`` as ``<name>.npy`` (C-contiguous, dtype kept).

        ``layout`` names the axes in the reference's notation, e.g. ``"[T, D]"``.
        """
        array = np.ascontiguousarray(array)
        np.save(self.partial / f"{name}.npy", array, allow_pickle=False)
        self.manifest["tensors"][name] = {
            "file": f"{name}.npy",
            "shape": list(array.shape),
            "dtype": str(array.dtype),
            "layout": layout,
        }

    def add_json(self, name: str, document: Any) -> None:
        """Store a JSON document as ``<name>.json`` (e.g. ``decode``)."""
        _write_json(self.partial / f"{name}.json", document)
        self.manifest["documents"][name] = f"{name}.json"

    def note(self, text: str) -> None:
        """Record a remark for the reader (a downmix, a resample, a check that was made)."""
        self.manifest["notes"].append(text)

    def set_status(self, status: str, message: str = "") -> None:
        """Mark the dump ``unavailable`` or ``crashed`` (with the reason) instead of ``ok``."""
        if status not in DUMP_STATUSES:
            raise ValueError(f"status {status!r}: expected one of {', '.join(DUMP_STATUSES)}")
        self.manifest["status"] = status
        self.manifest["message"] = message

    @contextmanager
    def timed(self, stage: str) -> Iterator[None]:
        """Record the wall-clock seconds of a stage under ``manifest["seconds"][stage]``."""
        start = time.perf_counter()
        yield
        self.manifest["seconds"][stage] = round(time.perf_counter() - start, 4)


class Dump:
    """Read access to a committed dump directory.

    Raises:
        AudioparityError: the directory or its manifest is missing or unreadable, or a requested
            tensor/document is not listed.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        manifest = self.path / MANIFEST
        if not manifest.is_file():
            raise AudioparityError(f"{self.path}: not a dump directory (no {MANIFEST})")
        try:
            self.manifest: dict[str, Any] = json.loads(manifest.read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise AudioparityError(f"{manifest}: unreadable manifest ({err})") from err
        if not isinstance(self.manifest, dict) or "tensors" not in self.manifest:
            raise AudioparityError(f"{manifest}: expected an object with a 'tensors' key")

    @property
    def status(self) -> str:
        return self.manifest.get("status", "ok")

    @property
    def tensor_names(self) -> list[str]:
        return list(self.manifest["tensors"])

    def has(self, name: str) -> bool:
        return name in self.manifest["tensors"] or name in self.manifest.get("documents", {})

    def layout(self, name: str) -> str:
        return self.manifest["tensors"][name]["layout"]

    def tensor(self, name: str) -> np.ndarray:
        """Load tensor ``name`` (shape and dtype as listed in the manifest)."""
        entry = self.manifest["tensors"].get(name)
        if entry is None:
            raise AudioparityError(f"{self.path}: no tensor {name!r} in {MANIFEST}")
        file = self.path / entry["file"]
        try:
            array = np.load(file, allow_pickle=False)
        except (OSError, ValueError) as err:
            raise AudioparityError(f"{file}: unreadable .npy ({err})") from err
        if list(array.shape) != entry["shape"]:
            raise AudioparityError(
                f"{file}: shape {list(array.shape)} differs from the manifest's {entry['shape']}"
            )
        return array

    def json(self, name: str) -> Any:
        """Load JSON document ``name`` (e.g. ``decode``)."""
        file = self.manifest.get("documents", {}).get(name)
        if file is None:
            raise AudioparityError(f"{self.path}: no document {name!r} in {MANIFEST}")
        try:
            return json.loads((self.path / file).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise AudioparityError(f"{self.path / file}: unreadable JSON ({err})") from err
