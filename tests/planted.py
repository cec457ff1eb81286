"""Bugs planted in a copy of a family's ggml port, dumped through the command line as a port of
a user's would be: what every family's planted-bug tests share."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from audioparity.dumping.artifacts import Dump
from audioparity.dumping.emulation import emulated_dir
from audioparity.dumping.storage import EMULATED_TYPES
from audioparity.models.registry import family
from tests import REPO, cell_rows

#: A planted bug: (file of the family's package, its exact original text, the replacement);
#: the text must occur in the file exactly once.
Patch = tuple[str, str, str]


def planted_source(root: Path, name: str, patches: list[Patch]) -> Path:
    """A copy of the package under ``root/src`` with ``patches`` applied to family ``name``'s
    files; the folder to put first on the Python path.

    Raises:
        AssertionError: a patch's text is not in its file exactly once.
    """
    src = root / "src"
    shutil.copytree(REPO / "src" / "audioparity", src / "audioparity",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for file, old, new in patches:
        path = src / "audioparity" / "models" / name / file
        text = path.read_text()
        assert text.count(old) == 1, f"{path.name}: the text to patch is not there exactly once"
        path.write_text(text.replace(old, new))
    return src


def planted_dump(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
                 reference: Path | None = None, weight_type: str = "f32") -> Dump:
    """The ggml dump of ``case`` at ``weight_type`` by :func:`planted_source`'s copy
    (``audioparity ggml <family>`` in a subprocess, the copy first on the Python path), written
    to ``root/dump``.

    Raises:
        AssertionError: a patch's text is not in its file exactly once, or the dump fails.
    """
    return _dump(root, name, patches, model, case, reference, weight_type, guarded=False)


def planted_crash(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
                  reference: Path) -> tuple[Dump, dict[str, dict]]:
    """The f32 dump of ``case`` by :func:`planted_source`'s copy, whose patches make it fail,
    run inside ``audioparity guard`` as the workflow runs a cell (a process that raises or
    dies gives a ``crashed`` dump of what it finished), and its rows against ``reference``
    (:func:`planted_rows`' gates).

    Raises:
        AssertionError: a patch's text is not there exactly once, or the guard fails.
    """
    dump = _dump(root, name, patches, model, case, reference, "f32", guarded=True)
    return dump, cell_rows(reference, dump.path, root / "cell.json", name)


def _dump(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
          reference: Path | None, weight_type: str, guarded: bool) -> Dump:
    spec = family(name).spec
    src = planted_source(root, name, patches)
    output = root / "dump"
    reference_args = ["--reference-dir", str(reference)] if spec.ggml_reads_reference else []
    guard = ([sys.executable, "-m", "audioparity.cli", "guard", "--output-dir", str(output),
              "--"] if guarded else [])
    result = subprocess.run(
        [*guard, sys.executable, "-m", "audioparity.cli", "ggml", spec.command, "--model",
         str(model), spec.input_flag, str(case), *reference_args, "--output-dir", str(output),
         "--weight-type", weight_type, "--threads", "1"],
        env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Dump(output)


def planted_rows(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
                 reference: Path, weight_type: str = "f32") -> dict[str, dict]:
    """{stage: row} of :func:`planted_dump` at ``weight_type`` against ``reference`` (the
    float32 one; a quantized weight type reads and is compared with its quantization-aware
    twin beside it, its cost measured against ``reference``, as the workflow does), under the
    gates the default config gives family ``name`` at that type."""
    emulated = weight_type in EMULATED_TYPES
    own = emulated_dir(reference, weight_type if emulated else None)
    dump = planted_dump(root, name, patches, model, case, own, weight_type)
    return cell_rows(own, dump.path, root / "cell.json", name, weight_type,
                     reference if emulated else None)


def planted_statuses(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
                     reference: Path, weight_type: str = "f32") -> dict[str, str]:
    """{stage: status} of :func:`planted_rows`."""
    rows = planted_rows(root, name, patches, model, case, reference, weight_type)
    return {stage: row["status"] for stage, row in rows.items()}


def failing(statuses: dict[str, str]) -> set[str]:
    """The stages that did not pass."""
    return {stage for stage, status in statuses.items() if status != "pass"}


def clean_and_planted(tmp_path_factory, name: str, fault: str, patches: list[Patch],
                      model: Path, case: Path, reference: Path) -> dict[str, dict[str, str]]:
    """``{"clean": {stage: status}, fault: {stage: status}}``: :func:`planted_statuses` of
    family ``name``'s port as it is and with ``patches``, each in a folder of its own."""
    return {run: planted_statuses(tmp_path_factory.mktemp(run), name, applied, model, case,
                                  reference)
            for run, applied in (("clean", []), (fault, patches))}
