"""Writing a dump of ours in another tool's format (``audioparity export``).

Formats (:data:`FORMATS`):

- ``f32json``: every float tensor as transcribe.cpp's ``<name>.f32`` + ``<name>.json`` pair
  (:func:`audioparity.candidates.f32json.write_folder`), which its
  ``scripts/compare_tensors.py`` reads;
- ``seed``: the files the family's seed tool (``../shared/seeds``, the C++ programs this
  project grew from) reads from a reference dump, written by the family's
  :meth:`~audioparity.contract.family.Family.export_seed` (the family is the manifest's ``family``).
"""

from __future__ import annotations

import os
from pathlib import Path

from audioparity.candidates import f32json
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import implements
from audioparity.dumping.artifacts import Dump, built_directory
from audioparity.models.registry import family as registered_family

#: The formats :func:`export_dump` writes.
FORMATS = ("f32json", "seed")


def _seed_writer(dump: Dump, expected_family: str | None):
    """The seed writer of the dump's family (:meth:`Family.export_seed`, ``(dump, folder)``).

    Raises:
        AudioparityError: the manifest names no family, another one than ``expected_family``,
            an unknown family, or a family without a seed format (no
            :meth:`~audioparity.contract.family.Family.export_seed`).
    """
    name = dump.manifest.get("family")
    if not isinstance(name, str) or not name:
        raise AudioparityError(f"{dump.path}: the manifest names no 'family'; the seed format "
                               "is the family's")
    if expected_family is not None and name != expected_family:
        raise AudioparityError(f"{dump.path}: a dump of family {name!r}; expected "
                               f"{expected_family!r}")
    known = registered_family(name)
    if not implements(known, "export_seed"):
        raise AudioparityError(f"{dump.path}: family {name!r} has no seed format")
    return known.export_seed


def export_dump(dump_dir: str | os.PathLike, fmt: str, output_dir: str | os.PathLike, *,
                family: str | None = None) -> list[str]:
    """Write the dump at ``dump_dir`` in format ``fmt`` (:data:`FORMATS`, module docstring)
    into the folder ``output_dir``, atomically (a new folder, or an empty one); the names of
    the files written.

    Args:
        dump_dir: a committed dump directory of status ``ok``.
        fmt: ``f32json`` or ``seed``.
        output_dir: the folder to write; it must not exist, or be empty.
        family: with ``seed``, the family the dump must be of (an adapter preparing its
            tool's inputs); None: any family with a seed format.

    Raises:
        AudioparityError: an unknown format, an unreadable dump or one whose status is not
            ``ok``, a non-empty ``output_dir``, a dump that lacks what the format needs (no float
            tensor for ``f32json``; the family's needs for ``seed``). Nothing is written then.
    """
    if fmt not in FORMATS:
        raise AudioparityError(f"unknown export format {fmt!r}; valid: {', '.join(FORMATS)}")
    dump = Dump(dump_dir)
    if dump.status != "ok":
        raise AudioparityError(f"{dump.path}: status {dump.status!r}; only a dump of status "
                               "'ok' can be exported")
    output = Path(output_dir)
    if output.exists() and (not output.is_dir() or any(output.iterdir())):
        raise AudioparityError(f"{output}: exists and is not an empty folder; expected a new "
                               "folder to export into")
    write = _seed_writer(dump, family) if fmt == "seed" else None
    with built_directory(output) as work:
        if write is not None:
            written = write(dump, work)
        else:
            written = [f"{name}{suffix}" for name in f32json.write_folder(dump, work)
                       for suffix in (f32json.DATA, f32json.SIDECAR)]
            if not written:
                raise AudioparityError(f"{dump.path}: no float tensor to export as f32json")
    return written
