"""Bugs planted in a copy of a family's ggml port, dumped through the command line as a port of
a user's would be: what every family's planted-bug tests share."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from audioparity.artifacts import Dump
from audioparity.compare import compare_cell
from audioparity.families import family
from tests import REPO, config_gates

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
                 reference: Path | None = None) -> Dump:
    """The f32 ggml dump of ``case`` by :func:`planted_source`'s copy (``audioparity ggml
    <family>`` in a subprocess, the copy first on the Python path), written to ``root/dump``.

    Raises:
        AssertionError: a patch's text is not in its file exactly once, or the dump fails.
    """
    spec = family(name)
    src = planted_source(root, name, patches)
    output = root / "dump"
    reference_args = ["--reference-dir", str(reference)] if spec.ggml_reads_reference else []
    result = subprocess.run(
        [sys.executable, "-m", "audioparity.cli", "ggml", spec.command, "--model", str(model),
         spec.input_flag, str(case), *reference_args, "--output-dir", str(output),
         "--weight-type", "f32", "--threads", "1"],
        env={**os.environ, "PYTHONPATH": str(src)}, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return Dump(output)


def planted_statuses(root: Path, name: str, patches: list[Patch], model: Path, case: Path,
                     reference: Path) -> dict[str, str]:
    """{stage: status} of :func:`planted_dump` against ``reference``, under the f32 gates the
    default config gives family ``name``."""
    dump = planted_dump(root, name, patches, model, case, reference)
    cell = root / "cell.json"
    compare_cell(reference, dump.path, config_gates(name, "f32"), {"family": name}, cell)
    return {row["stage"]: row["status"] for row in json.loads(cell.read_text())}


def failing(statuses: dict[str, str]) -> set[str]:
    """The stages that did not pass."""
    return {stage for stage, status in statuses.items() if status != "pass"}
