"""Where a dump came from, as its manifest records it: the sha256 of a file or folder (a model,
an input), a model's size and time as a cheap key for its hash, and the installed versions of
the libraries that computed it."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import platform
from pathlib import Path

from audioparity.contract.errors import AudioparityError


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


def stat_key(path: Path) -> str:
    """Size and modification time of a file, or of every file under a directory, as one
    string: what changes when the file's bytes do (short of a rewrite that keeps both)."""
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    return ";".join(f"{f.relative_to(path) if path.is_dir() else ''}:{f.stat().st_size}:"
                    f"{f.stat().st_mtime_ns}" for f in files)


def model_record(model: str | os.PathLike) -> dict[str, str]:
    """What a file derived from ``model`` (a converted weights file) records of it: its
    sha256 and :func:`stat_key`, for :func:`model_digest`."""
    model = Path(model)
    return {"model_sha256": sha256_of(model), "model_stat": stat_key(model)}


@functools.lru_cache(maxsize=8)
def _model_sha256(path: str, stat_key: str) -> str:
    """:func:`sha256_of` a model, once per process while its size and time stay: a reference
    job writes one dump per case and quantization-aware type from one model (a v3-shape
    ``.nemo`` is 2.4 GB to hash)."""
    return sha256_of(path)


def model_digest(model: str | os.PathLike, weights: str | os.PathLike | None = None) -> str:
    """The sha256 of ``model``; with ``weights`` (a GGUF file whose metadata holds
    :func:`model_record` of its model, under ``audioparity.*``) the one recorded there when the
    model's size and time are unchanged since, so a dump that maps converted weights does not
    read the whole model again.

    Raises:
        AudioparityError: the model is absent, or ``weights`` was converted from another model.
    """
    model = Path(model)
    if weights is None:
        if not model.exists():
            raise AudioparityError(f"{model}: no such file or directory")
        return _model_sha256(str(model.resolve()), stat_key(model))
    import gguf

    try:
        fields = gguf.GGUFReader(weights).fields
        recorded = {key: bytes(fields[f"audioparity.{key}"].parts[-1]).decode()
                    for key in ("model_sha256", "model_stat")}
    except (OSError, ValueError, KeyError) as err:
        raise AudioparityError(f"weights file {weights}: unreadable or without the record of "
                               f"its model ({err}); convert it again") from None
    if not model.exists():
        raise AudioparityError(f"{model}: no such file or directory")
    if recorded["model_stat"] == stat_key(model):
        return recorded["model_sha256"]
    digest = sha256_of(model)
    if digest != recorded["model_sha256"]:
        raise AudioparityError(f"weights file {weights} was converted from another model than "
                               f"{model}; convert it again")
    return digest


def library_versions(*names: str) -> dict[str, str]:
    """Installed versions of the named distributions (``"absent"`` when not installed)."""
    versions = {"python": platform.python_version()}
    for name in ("numpy", *names):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "absent"
    return versions
