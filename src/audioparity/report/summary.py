"""summary.csv: the cells' rows merged into one table (docs/design.md, "summary.csv").

One row per (family, model, case, candidate, backend, weight_type, against, stage); columns
exactly :data:`audioparity.compare.cell.COLUMNS`. Rows are sorted in reading order: family,
model and case naturally (``clip2`` before ``clip10``), candidates with this project's port
first, then naturally, backends and weight types in the vocabulary's
order (:data:`~audioparity.contract.vocabulary.BACKENDS`,
:data:`~audioparity.contract.vocabulary.WEIGHT_TYPES`; others after, natural), the comparison with
the reference before those with another backend, stages in the pipeline order of the family's spec,
layer numbers numeric, a stage's isolated form after it
(:meth:`audioparity.contract.spec.FamilySpec.stage_key`). Values are written as
text: floats at full precision (``repr``), non-finite ones as ``nan``/``inf``/``-inf``, a metric
that does not apply as an empty field.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from audioparity.compare.cell import COLUMNS, KEY_COLUMNS, read_cell
from audioparity.compare.plan import REFERENCE
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import natural_key
from audioparity.contract.vocabulary import BACKENDS, FRESH, OUR_PORT, WEIGHT_TYPES
from audioparity.dumping.artifacts import write_text_atomic
from audioparity.models.registry import spec_of
from audioparity.report.culprit import CELL, FAILING, culprits

#: The columns whose values repeat from cell to cell, held once each while a summary is
#: merged (a fourth less memory for 100,000 cells).
SHARED_COLUMNS = (*KEY_COLUMNS, "status", "gate")


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
        spec_of(row["family"]).stage_key(row["stage"]),
    )


def _text(value: Any) -> str:
    """A cell value as summary text: '' for None, ``repr`` for floats, ``str`` otherwise."""
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)
    return str(value)


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
    shared: dict[str, str] = {}
    rows = []
    files = [file for path in map(Path, cells)
             for file in (sorted(path.glob("*.json")) if path.is_dir() else [path])]
    for cell in files:
        for row in read_cell(cell):
            for column in SHARED_COLUMNS:  # one string for a value every cell repeats
                if isinstance(value := row[column], str):
                    row[column] = shared.setdefault(value, value)
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
    _write_csv(Path(output), ([_text(row[c]) for c in COLUMNS] for row in rows))


def _write_csv(path: Path, rows: Iterable[list[str]]) -> None:
    """summary.csv (header :data:`COLUMNS`, then ``rows``) written as it is made, through a
    temp file in the same folder renamed onto ``path`` (a reader never sees half of it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", newline="", encoding="utf-8") as handle:
            writer = csv.writer(handle, lineterminator="\n")
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def rows_of(frame: pd.DataFrame, columns: Sequence[str] | None = None) -> list[dict[str, str]]:
    """The rows of a summary table as dicts (of its ``columns``, every one by default), read
    column by column (a row read through pandas costs more than a whole column)."""
    columns = list(frame.columns if columns is None else columns)
    return [dict(zip(columns, values, strict=True))
            for values in zip(*(frame[c].tolist() for c in columns), strict=True)]


def in_summary_order(frame: pd.DataFrame) -> pd.DataFrame:
    """A summary table sorted by :func:`row_key`, indexed 0.. in that order: each column's
    distinct values ranked by their part of the key, then the rows by those ranks (a stable
    sort, as :func:`row_key`'s; a key per row would hold every label once more)."""
    def ranks(values: list, key) -> np.ndarray:
        keys = [key(value) for value in values]
        order = {k: i for i, k in enumerate(sorted(set(keys)))}
        return np.array([order[k] for k in keys], dtype=np.int64)

    orders = {"candidate": (OUR_PORT,), "backend": BACKENDS, "weight_type": WEIGHT_TYPES,
              "against": (REFERENCE, *BACKENDS, FRESH)}
    columns = []
    for column in KEY_COLUMNS[:-1]:
        codes, uniques = pd.factorize(frame[column])
        key = (lambda v, o=orders[column]: _ranked(v, o)) if column in orders else natural_key
        columns.append(ranks(list(uniques), key)[codes])
    families, stages = (pd.factorize(frame[c]) for c in ("family", "stage"))
    pairs, inverse = np.unique(np.stack([families[0], stages[0]]), axis=1, return_inverse=True)
    # a stage's key is read within its family (two families' keys need not compare)
    columns.append(ranks([(families[1][f], stages[1][s]) for f, s in pairs.T],
                         lambda pair: (natural_key(pair[0]), spec_of(pair[0]).stage_key(pair[1])))
                   [inverse.reshape(-1)])
    order = np.lexsort(columns[::-1]) if len(frame) else np.arange(0)
    return frame.iloc[order].reset_index(drop=True)


def shown_cases(frame: pd.DataFrame, limit: int) -> tuple[pd.Series, int]:
    """Which rows of ``frame`` belong to a case the report shows where it shows at most
    ``limit`` cases of each family and model (a sweep of a thousand cases would otherwise draw
    thousands of figures, and make a page no browser opens): the cases with a stage that
    needs attention (:data:`~audioparity.report.culprit.FAILING`) first, then the others, each
    in summary order; and how many cases are left out."""
    keys = list(zip(frame["family"], frame["model"], frame["case"], strict=True))
    failing = {key for key, status in zip(keys, frame["status"], strict=True)
               if status in FAILING}
    by_model: dict[tuple[str, str], list[tuple[str, str, str]]] = {}
    for key in dict.fromkeys(keys):
        by_model.setdefault(key[:2], []).append(key)
    shown: set[tuple[str, str, str]] = set()
    for cases in by_model.values():
        shown.update(sorted(cases, key=lambda key: key not in failing)[:limit])
    left = sum(len(cases) for cases in by_model.values()) - len(shown)
    return pd.Series([key in shown for key in keys], index=frame.index, dtype=bool), left


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
