"""summary.csv: the cells' rows merged into one table (docs/design.md, "summary.csv").

One row per (family, model, case, candidate, backend, weight_type, against, stage); columns
exactly :data:`audioparity.compare.cell.COLUMNS`. Rows are sorted in reading order: family,
model and case naturally (``clip2`` before ``clip10``), candidates with this project's port
first, then naturally, backends and weight types in the vocabulary's
order (cpu, cuda, vulkan; native, f32, f16, bf16, q8_0; others after, natural), the comparison
with the reference before those with another backend, stages in the
pipeline order of the family's spec, layer numbers numeric, a stage's isolated form after it
(:func:`audioparity.families.stage_key`). Values are written as
text: floats at full precision (``repr``), non-finite ones as ``nan``/``inf``/``-inf``, a metric
that does not apply as an empty field.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from audioparity.artifacts import write_text_atomic
from audioparity.compare.cell import COLUMNS, LABEL_COLUMNS, REFERENCE
from audioparity.errors import AudioparityError
from audioparity.families import natural_key, stage_key
from audioparity.report.culprit import CELL, culprits
from audioparity.vocabulary import BACKENDS, FRESH, OUR_PORT, WEIGHT_TYPES

KEY_COLUMNS = (*LABEL_COLUMNS, "stage")


def ordered(values: Sequence[str], order: Sequence[str]) -> list[str]:
    """The distinct ``values`` in reading order: those of ``order`` in its order, then the
    others naturally (``clip2`` before ``clip10``)."""
    known = [v for v in order if v in values]
    return known + sorted((v for v in set(values) if v not in order), key=natural_key)


def _ranked(value: str, order: Sequence[str]) -> tuple:
    return (order.index(value), ()) if value in order else (len(order), natural_key(value))


def row_key(row: Mapping[str, Any]) -> tuple:
    """Sort key of a summary row (labels, then stage; see the module docstring)."""
    return (
        natural_key(row["family"]),
        natural_key(row["model"]),
        natural_key(row["case"]),
        _ranked(row["candidate"], (OUR_PORT,)),
        _ranked(row["backend"], BACKENDS),
        _ranked(row["weight_type"], WEIGHT_TYPES),
        _ranked(row["against"], (REFERENCE, *BACKENDS, FRESH)),
        stage_key(row["family"], row["stage"]),
    )


def _text(value: Any) -> str:
    """A cell value as summary text: '' for None, ``repr`` for floats, ``str`` otherwise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


def read_cell(path: str | os.PathLike) -> list[dict[str, Any]]:
    """The rows of one cell file written by :func:`audioparity.compare.compare_cell`.

    Raises:
        AudioparityError: unreadable JSON, not a list of objects, or a row lacking a column or
            a label (names the file, the row and the key).
    """
    path = Path(path)
    try:
        rows = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise AudioparityError(f"{path}: unreadable cell file ({err})") from err
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise AudioparityError(f"{path}: expected a JSON list of row objects")
    for i, row in enumerate(rows):
        missing = [c for c in COLUMNS if c not in row]
        if missing:
            raise AudioparityError(f"{path}: row {i} lacks column(s) {', '.join(missing)}")
        empty = [c for c in KEY_COLUMNS if not isinstance(row[c], str) or not row[c]]
        if empty:
            raise AudioparityError(
                f"{path}: row {i} has no value for {', '.join(empty)} "
                "(pass them to `audioparity compare --label KEY=VALUE`)"
            )
    return rows


def write_cell_list(cells: Iterable[str | os.PathLike], output: str | os.PathLike) -> int:
    """Write the cell files' list for ``audioparity report summary --cells-from`` (rule
    report_cells): one path a line, each once, in the order given (atomic write); how many.
    A sweep's cells are too many for one command line (100,000 on a cluster)."""
    listed = list(dict.fromkeys(map(str, cells)))
    bad = [p for p in listed if not p or "\n" in p]
    if bad:
        raise AudioparityError(f"{output}: a cell file's path is empty or holds a line break: "
                               f"{bad[0]!r}")
    write_text_atomic(Path(output), "".join(f"{p}\n" for p in listed))
    return len(listed)


def read_cell_list(path: str | os.PathLike) -> list[Path]:
    """The cell files a list of :func:`write_cell_list` names (blank lines skipped).

    Raises:
        AudioparityError: the list is unreadable.
    """
    try:
        text = Path(path).read_text()
    except OSError as err:
        raise AudioparityError(f"{path}: unreadable list of cell files ({err})") from err
    return [Path(line) for line in text.splitlines() if line.strip()]


def write_summary(cells: Iterable[str | os.PathLike], output: str | os.PathLike) -> None:
    """Merge cell files into ``summary.csv`` (columns :data:`COLUMNS`, sorted by :func:`row_key`),
    each row with its cell's ``culprit`` (:func:`audioparity.report.culprit.culprit`). A folder
    among ``cells`` stands for every ``.json`` file in it (rule compare_fresh writes one per
    case).

    Labels beyond :data:`~audioparity.compare.cell.LABEL_COLUMNS` in a cell are not carried
    over.

    Raises:
        AudioparityError: a malformed cell file, or two rows with the same (family, model, case,
            candidate, backend, weight_type, against, stage) (names both files).
    """
    seen: dict[tuple, Path] = {}
    rows = []
    files = [file for path in map(Path, cells)
             for file in (sorted(path.glob("*.json")) if path.is_dir() else [path])]
    for cell in files:
        for row in read_cell(cell):
            key = tuple(row[c] for c in KEY_COLUMNS)
            if key in seen:
                raise AudioparityError(
                    f"{cell}: row {dict(zip(KEY_COLUMNS, key, strict=True))} is also in {seen[key]}"
                )
            seen[key] = cell
            rows.append(row)
    rows.sort(key=row_key)
    found = culprits(rows)
    for row in rows:
        row["culprit"] = found.get(tuple(row[key] for key in CELL))
    frame = pd.DataFrame(
        [[_text(row[c]) for c in COLUMNS] for row in rows], columns=list(COLUMNS), dtype=object
    )
    write_text_atomic(Path(output), frame.to_csv(index=False))


def read_summary(path: str | os.PathLike) -> pd.DataFrame:
    """summary.csv as a table of strings (empty string where a metric does not apply).

    Raises:
        AudioparityError: unreadable file, or columns other than :data:`COLUMNS`.
    """
    path = Path(path)
    try:
        frame = pd.read_csv(path, dtype=str, keep_default_na=False)
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise AudioparityError(f"{path}: unreadable summary CSV ({err})") from err
    if tuple(frame.columns) != COLUMNS:
        raise AudioparityError(
            f"{path}: columns {list(frame.columns)} differ from the summary's {list(COLUMNS)}"
        )
    return frame
