"""What a report cell shows of a summary row: its figures for reading (:func:`short`), the key
metric a matrix cell shows (:func:`key_metric`) and its cost (:func:`cost_metric`), the bounds it
would still pass (:func:`passing_bounds`), its tooltip, the labels the page's filters read
(:func:`filter_attrs`), the unmeasured-gate lines, and HTML escaping."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Mapping

import pandas as pd

from audioparity.compare.cell import COST_COLUMNS, METRIC_COLUMNS
from audioparity.compare.gates import unmeasured_mark
from audioparity.contract.vocabulary import FRESH, NOT_COMPARED, STATUSES, WEIGHT_TYPES
from audioparity.report.summary import ordered


def number(text: str) -> float | None:
    """A summary field as a float (None when empty or not a number)."""
    try:
        return float(text) if text != "" else None
    except ValueError:
        return None


#: Columns whose values sit near 1, shown as the distance from 1 (``1−5.4e-15``).
NEAR_ONE = ("cosine", "std_ratio")


def short(column: str, text: str) -> str:
    """A metric field for reading: 3 significant digits, or ``1−d`` / ``1+d`` for a ratio that
    differs from 1 by less than 1e-3; integers and other text unchanged."""
    value = number(text)
    if value is None or re.fullmatch(r"-?\d+", text):
        return text
    if column in NEAR_ONE and 0 < abs(1 - value) < 1e-3:
        return f"1{'−' if value < 1 else '+'}{abs(1 - value):.2g}"
    return f"{value:.3g}"


def status_class(status: str) -> str:
    return f"st-{status}" if status in STATUSES else "st-unknown"




def key_metric(row: pd.Series) -> str:
    """What a matrix cell shows: NMSE for a tensor, token match for a document, max_abs for a
    case run again against its fresh run (:mod:`audioparity.compare.reuse`), else the status."""
    if row["status"] in NOT_COMPARED:
        return {"unavailable": "n/a", "crashed": "crashed", "missing": "missing"}[row["status"]]
    if row["nmse"] != "":
        value = number(row["nmse"])
        return "NaN" if value is None or math.isnan(value) else f"{value:.1e}"
    if row["token_match"] != "":
        return f"{100 * float(row['token_match']):.4g}%"
    if row["against"] == FRESH and row["max_abs"] != "":  # a case run again: its difference
        return f"{float(row['max_abs']):.1e}"
    return row["status"]


def cost_metric(row: pd.Series) -> str:
    """The weight type's cost a matrix cell shows under its own value: the candidate's NMSE
    (or token match) against the float32 reference, where its own reference is
    quantization-aware; else empty."""
    if row["cost_nmse"] != "":
        return f"f32 {float(row['cost_nmse']):.1e}"
    if row["cost_token_match"] != "":
        return f"f32 {100 * float(row['cost_token_match']):.4g}%"
    return ""


#: A bound of a gate's text (``nmse<=1e-08``): metric, comparison.
BOUND = re.compile(r"(\w+)(<=|>=)")


def passing_bounds(row: pd.Series) -> str:
    """The tightest bounds the row would still have passed: each bound of its gate set to the
    value measured (``nmse<=3.2e-13, cosine>=1−1.6e-13``); empty for exact gates."""
    bounds = []
    for metric, op in dict.fromkeys(BOUND.findall(row["gate"].partition(": ")[2])):
        if metric in METRIC_COLUMNS and row[metric] != "":
            bounds.append(f"{metric}{op}{short(metric, row[metric])}")
    return ", ".join(bounds)


def tooltip(row: pd.Series) -> str:
    lines = [f"{row['stage']} — {row['status']}"]
    if row["reason"]:
        lines.append(row["reason"])
    lines.append(f"gate {row['gate']}")
    if passing_bounds(row):
        lines.append(f"would pass down to {passing_bounds(row)}")
    shown = [f"{c} {short(c, row[c])}" for c in METRIC_COLUMNS if row[c] != ""]
    lines.extend(", ".join(shown[i : i + 3]) for i in range(0, len(shown), 3))
    cost = [f"{metric} {short(metric, row[c])}" for c in COST_COLUMNS
            if row[c] != "" for metric in [c.removeprefix("cost_")]]
    if cost:
        lines.append("against the float32 reference (the weight type's cost): "
                     + ", ".join(cost))
    return "\n".join(lines)


def unmeasured_marks(gates: pd.Series) -> dict[str, str | None]:
    """Each distinct text of a ``gate`` column -> its unmeasured mark
    (:func:`~audioparity.compare.gates.unmeasured_mark`), None for a measured list's."""
    return {gate: unmeasured_mark(gate) for gate in gates.unique()}


def esc(text: str) -> str:
    return html.escape(str(text), quote=True)


#: The labels the page filters by (module docstring), as summary columns.
FILTERS = ("candidate", "backend", "weight_type")


def filter_attrs(labels: Mapping[str, str] | pd.Series) -> str:
    """The ``data-candidate``, ``data-backend``, ``data-weight-type`` attributes of an element
    that shows the labels of :data:`FILTERS` that ``labels`` holds (a leading space each)."""
    return "".join(f' data-{key.replace("_", "-")}="{esc(labels[key])}"'
                   for key in FILTERS if key in labels and labels[key] != "")


def unmeasured_lines(rows: pd.DataFrame, marks: Mapping[str, str | None]) -> str:
    """A line per backend and mark under a family's matrix: the weight types of its cells that
    a gate list no device of that backend has measured judged, and why (``marks``: gate text
    -> mark)."""
    found: dict[tuple[str, str], set[str]] = {}
    for backend, weight_type, gate in zip(rows["backend"], rows["weight_type"], rows["gate"],
                                          strict=True):
        if marks[gate]:
            found.setdefault((backend, marks[gate]), set()).add(weight_type)
    return "".join(
        f'<p class="note unmeasured"{filter_attrs({"backend": backend})}><b>unmeasured</b> '
        f"{esc(backend)} \u00b7 {esc(', '.join(ordered(list(types), WEIGHT_TYPES)))}: gates "
        f"{esc(mark)}</p>"
        for (backend, mark), types in found.items())
