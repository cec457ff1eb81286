"""transcribe.cpp's tensor files: ``<name>.f32`` (raw little-endian float32, row-major) beside
``<name>.json`` (``{"name", "shape", "dtype": "f32", "layout": "row-major", ...}``), one pair per
tensor in a folder, as ``TRANSCRIBE_DUMP_DIR`` writes them and its ``scripts/compare_tensors.py``
reads them. Read natively, and written from a dump of ours (``audioparity export``), so either
side's tooling reads the other's tensors."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump

SIDECAR = ".json"
DATA = ".f32"


def check_pair(folder: str | os.PathLike, name: str) -> tuple[tuple[int, ...] | None, list[str]]:
    """The row-major shape of tensor ``name`` of a folder of ``.f32`` + ``.json`` pairs, and
    every problem of its pair, one line each (what, which file, what was expected); the shape
    is None when there is a problem.

    Problems: no sidecar, a sidecar that is not JSON or lacks a shape of non-negative integers,
    a dtype other than f32 or a layout other than row-major, a ``.f32`` that is missing or of
    another size than the shape needs (4 bytes a value: truncated or padded).
    """
    folder = Path(folder)
    sidecar, data = folder / f"{name}{SIDECAR}", folder / f"{name}{DATA}"
    if not sidecar.is_file():
        return None, [f"{data}: has no {SIDECAR} sidecar; expected {sidecar.name} with its shape"]
    try:
        meta = json.loads(sidecar.read_text(encoding="utf-8"))
        shape = tuple(int(n) for n in meta["shape"])
        if any(n < 0 for n in shape):
            raise ValueError(f"negative shape {list(shape)}")
    except (OSError, ValueError, KeyError, TypeError, RecursionError) as err:
        return None, [f"{sidecar}: unreadable tensor sidecar ({err!r}); expected JSON with a "
                      "'shape'"]
    problems = []
    if meta.get("dtype", "f32") != "f32" or meta.get("layout", "row-major") != "row-major":
        problems.append(f"{sidecar}: dtype {meta.get('dtype')!r}, layout "
                        f"{meta.get('layout')!r}; expected f32, row-major")
    expected = 4 * math.prod(shape)
    if not data.is_file():
        problems.append(f"{data}: missing; its sidecar {sidecar.name} lists it")
    elif data.stat().st_size != expected:
        problems.append(f"{data}: {data.stat().st_size} bytes, expected {expected} for shape "
                        f"{list(shape)} of f32 (truncated?)")
    return (None if problems else shape), problems


def pair_names(folder: str | os.PathLike) -> list[str]:
    """The tensor names of a folder of ``.f32`` + ``.json`` pairs: every file ending in either
    suffix, less the suffix, sorted."""
    return sorted({p.name.removesuffix(suffix) for suffix in (SIDECAR, DATA)
                   for p in Path(folder).glob(f"*{suffix}") if p.is_file()})


def read_folder(folder: str | os.PathLike) -> dict[str, np.ndarray]:
    """Every tensor of a folder of ``.f32`` + ``.json`` pairs, by name, shaped as its sidecar
    says.

    Raises:
        AudioparityError: the first problem :func:`check_pair` finds, in name order (a sidecar
            that is not JSON or lacks a shape, a dtype other than f32, a ``.f32`` that is
            missing or truncated, a ``.f32`` without its sidecar).
    """
    tensors, problems = read_readable(folder)
    if problems:
        raise AudioparityError(next(iter(problems.values())))
    return tensors


def read_readable(folder: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The tensors of a folder of ``.f32`` + ``.json`` pairs that :func:`check_pair` finds
    sound, by name, and for each other pair its first problem, by name (name order)."""
    folder = Path(folder)
    tensors, problems = {}, {}
    for name in pair_names(folder):
        shape, found = check_pair(folder, name)
        if found:
            problems[name] = found[0]
        else:
            tensors[name] = np.fromfile(folder / f"{name}{DATA}", dtype="<f4").reshape(shape)
    return tensors, problems


def write_folder(dump: Dump, folder: str | os.PathLike) -> list[str]:
    """Write every float tensor of ``dump`` as a ``.f32`` + ``.json`` pair into ``folder`` (the
    stage's name and layout kept in the sidecar); the names written.

    Raises:
        AudioparityError: an unreadable dump.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for name in dump.tensor_names:
        array = dump.tensor(name)
        if array.dtype.kind != "f":
            continue
        data = np.ascontiguousarray(array, dtype="<f4")
        data.tofile(folder / f"{name}{DATA}")
        finite = data[np.isfinite(data)]
        meta = {"name": name, "stage": name, "shape": list(data.shape), "dtype": "f32",
                "layout": "row-major", "axes": dump.layout(name),
                "min": float(finite.min()) if finite.size else None,
                "max": float(finite.max()) if finite.size else None,
                "mean": float(finite.mean()) if finite.size else None,
                "source": {"kind": dump.manifest.get("producer", "audioparity")}}
        (folder / f"{name}{SIDECAR}").write_text(json.dumps(meta, indent=2) + "\n")
        written.append(name)
    return written
