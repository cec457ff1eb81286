"""The report's "Needs attention": stages that fail, crashed or went missing, by their cause.

A cause is one of the cell's culprits (:mod:`audioparity.report.culprit`, in summary.csv's
``culprit``, joined by ``||``) with its measured values left out (:func:`general`): a cell with
two culprits is listed under each, never under the pair, so each cause is listed once with
every cell it covers. The rows of a cell that need attention are listed under the culprit that
names their stage (its own form's culprit for a block), and the others, which what is named
upstream explains, under its first culprit in data-flow order: a dump that crashed shows its
message once, not on each stage it never computed, and cells that break at the same stage
against the same bound (``pre_encode (fail): nmse > 5e-10``, at every quantized weight type)
are one cause, not one per value measured. A row without a culprit (a summary written
otherwise) has its status and reason as its cause.
Cells under one cause that differ only by their case, with the same stages, are one line: a
port that crashes alike on every case is one cause and one line per weight type. Each line
keeps its cells' own culprits, values included.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from audioparity.models.registry import spec_of
from audioparity.report.culprit import SEPARATOR

#: Statuses that need attention, the most severe first (a cause takes its rows' most severe).
SEVERITY = ("crashed", "fail", "missing")


@dataclass
class Covered:
    """The stages of one cell (or of cells that differ by their case only) under a cause.

    Attributes:
        labels: family, model, candidate, backend, weight type.
        cases: the cases, in summary order.
        stages: the stages, in summary (pipeline) order, each once.
        rows: ``(case, stage, status, reason)`` of each row covered.
        culprits: each case's own cause (:func:`cause_of`, measured values included).
    """

    labels: dict[str, str]
    cases: list[str]
    stages: list[str]
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    culprits: list[str] = field(default_factory=list)


@dataclass
class Cause:
    """One cause and what it covers.

    Attributes:
        text: the culprit, or ``<status>: <reason>`` of rows without one, its measured values
            left out (:func:`general`).
        status: the most severe status of the rows it covers (:data:`SEVERITY`).
        covered: one :class:`Covered` per cell, cells of several cases merged.
    """

    text: str
    status: str
    covered: list[Covered]

    @property
    def stages(self) -> int:
        """How many rows (stages of cells) the cause covers."""
        return sum(len(c.rows) for c in self.covered)


#: The labels of a :class:`Covered` line (a cell less its case).
LINE = ("family", "model", "candidate", "backend", "weight_type")


#: What a gate's reason says of one cell's measurement, each pattern with what replaces it
#: (:mod:`audioparity.compare.gates`): a value missing a bound (``nmse 2.955e-08 > 5e-10``,
#: ``std_ratio 1.02 outside 1 ± 0.01``: the value goes, the bound stays), where a decode
#: first parts (``not exact: ids differ (first divergence at position 4, reference logit
#: gap 0.0025)``), how many values are not finite and where the first is.
_MEASURED = (
    (re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*) "
                r"(?:[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|NaN|nan|-?inf)"
                r"(?= (?:[<>]=?|outside) )"), r"\1"),
    (re.compile(r" \(first divergence at position \d+(?:, reference logit gap [^)]*)?\)"
                r"|(?<= differ) \(reference logit gap [^)]*\)"), ""),
    (re.compile(r"\b\d+ non-finite value\(s\) in (\w+)(?: \(first at [^)]*\))?"),
     r"non-finite values in \1"),
    (re.compile(r"reference holds \d+ non-finite value\(s\)"),
     "reference holds non-finite values"),
)


def general(text: str) -> str:
    """A cause with what its cells measured left out, the bounds they missed kept (each of
    :data:`_MEASURED`): ``pre_encode (fail): nmse 2.955e-08 > 5e-10`` -> ``pre_encode (fail):
    nmse > 5e-10``."""
    for pattern, replacement in _MEASURED:
        text = pattern.sub(replacement, text)
    return text


def cause_of(row: Mapping[str, Any]) -> str:
    """A row's cause: the one of its cell's culprits that names its stage, or the first
    (module docstring); ``<status>: <reason>`` without a culprit (``<status>`` alone without a
    reason)."""
    if row.get("culprit"):
        found = row["culprit"].split(SEPARATOR)
        family = row.get("family")
        base = spec_of(family).reference_stage(row["stage"])
        return next((c for c in found
                     if spec_of(family).reference_stage(c.partition(" (")[0]) == base), found[0])
    return f"{row['status']}: {row['reason']}" if row.get("reason") else row["status"]


def causes(rows: Iterable[Mapping[str, Any]]) -> list[Cause]:
    """The rows that need attention (:data:`SEVERITY`) grouped by cause, in the order each
    cause first appears.

    Args:
        rows: summary rows (mappings with the summary's columns as strings), in summary order.

    Returns:
        One :class:`Cause` per (family, cause text less its measured values); under it one
        :class:`Covered` per cell label set less the case (:data:`LINE`) and stage list, its
        cases merged, in the order they first appear.
    """
    grouped: dict[tuple[str, str], dict[tuple, list[Mapping[str, Any]]]] = {}
    for row in rows:
        if row["status"] not in SEVERITY:
            continue
        cells = grouped.setdefault((row["family"], general(cause_of(row))), {})
        cells.setdefault(tuple(row[k] for k in (*LINE, "case")), []).append(row)
    found = []
    for (_, text), cells in grouped.items():
        lines: dict[tuple, Covered] = {}
        for key, cell in cells.items():
            stages = list(dict.fromkeys(r["stage"] for r in cell))
            line = lines.setdefault((key[:-1], tuple(stages)),
                                    Covered(dict(zip(LINE, key[:-1], strict=True)), [], stages))
            line.cases.append(key[-1])
            line.culprits.append(cause_of(cell[0]))
            line.rows.extend((r["case"], r["stage"], r["status"], r["reason"]) for r in cell)
        statuses = {status for line in lines.values() for _, _, status, _ in line.rows}
        worst = next(s for s in SEVERITY if s in statuses)
        found.append(Cause(text, worst, list(lines.values())))
    return found


def compact(names: list[str], shown: int = 6) -> str:
    """``a, b, c (3)``: the names joined, the first ``shown`` - 1 and an ellipsis when there
    are more than ``shown``, their count in parentheses."""
    listed = names if len(names) <= shown else [*names[: shown - 1], "…"]
    return f"{', '.join(listed)} ({len(names)})"
