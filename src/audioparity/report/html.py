"""index.html: a self-contained report built from summary.csv alone.

Sections, top to bottom: headline counts by status; filters; the stages that need attention,
grouped under their cause; the status matrix (rows family/model/case/stage, columns candidate x
backend x weight type, the key metric in each cell, the reason as its tooltip; a cell judged by
a gate list no device of its backend has measured marked ``unmeasured``, with a line per backend
saying why: config ``unmeasured_gates``); the weight
types of each sweep (cost against bits per weight, the Pareto front, a table); each backend
against the CPU backend, stage by stage, with the first bad op of each cell that fails there
(its drill-down); each case run again in one process against its fresh run; per-layer error
curves (where drift starts, and whether it is accumulated or local); key stages by weight type;
the full table. CSS and the filters' script are inline and
plots are PNGs embedded as base64, so the file can be mailed or archived as it is. A sweep of
many cases keeps the page one a browser opens: a matrix shows at most :data:`SHOWN_CASES` cases
of a model and the per-case plots :data:`~audioparity.report.plots.DRAWN_CASES` (those with a
stage that needs attention first), a table of rows its first :data:`SHOWN_ROWS`; each says what
it leaves out, and summary.csv holds every row.

The filters: checkboxes per candidate, backend and weight type hide the matrix columns and the
rows of the other tables (every element carrying ``data-candidate``, ``data-backend`` or
``data-weight-type``) of the values not ticked. They are also set from the URL fragment,
``index.html#candidate=transcribe_cpp&weight_type=q4_K,q8_0`` (a dimension not named: every
value), which ticking writes back, so a view can be linked. The script marks ``<body>`` with
``data-filters="ready"`` once applied, ``data-selection`` (the ticked values as a fragment,
empty when all are), ``data-hidden`` (how many elements it hid), and ``data-js-error`` with
the message of any error.
"""

from __future__ import annotations

import math
import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path

import pandas as pd

from audioparity.compare.cell import COLUMNS, COST_COLUMNS, METRIC_COLUMNS
from audioparity.compare.gates import STALE
from audioparity.compare.plan import REFERENCE
from audioparity.contract.vocabulary import (
    BACKENDS,
    FRESH,
    OUR_PORT,
    STATUSES,
    WEIGHT_TYPES,
)
from audioparity.dumping.artifacts import write_text_atomic
from audioparity.models.registry import spec_of
from audioparity.report.assets import CSS, SCRIPT, status_css
from audioparity.report.attention import Cause, causes, compact
from audioparity.report.cells import (
    FILTERS,
    cost_metric,
    esc,
    filter_attrs,
    key_metric,
    short,
    status_class,
    tooltip,
    unmeasured_lines,
    unmeasured_marks,
)
from audioparity.report.culprit import REFERENCE_BACKEND, SEPARATOR
from audioparity.report.plots import by_weight_type, layer_curves, pareto_plot, weight_type_colours
from audioparity.report.summary import (
    in_summary_order,
    ordered,
    read_summary,
    rows_of,
    shown_cases,
)
from audioparity.report.weight_types import Sweep, pareto_front, sweeps

#: Statuses listed under "Needs attention".
ATTENTION = ("fail", "crashed", "missing")


def _headline(frame: pd.DataFrame, against_backend: pd.DataFrame,
              against_fresh: pd.DataFrame) -> str:
    """Counts by status of the comparisons with the reference, a line on those between
    backends, and one on the cases run again against their fresh runs."""
    counts = frame["status"].value_counts()
    badges = "".join(
        f'<div class="badge {status_class(s)}{"" if counts.get(s, 0) else " zero"}">'
        f"<b>{counts.get(s, 0)}</b>{s}</div>"
        for s in STATUSES
    )
    attention = int(sum(counts.get(s, 0) for s in ATTENTION))
    total = len(frame)
    if total == 0:
        verdict = "The summary holds no rows."
    elif attention:
        verdict = f"{attention} of {total} stages need attention (fail, crashed or missing)."
    else:
        verdict = f"All {total} stages pass, or fail as declared, or are unavailable."
    passing = frame.loc[frame["status"] == "pass", "gate"]
    unmeasured = int(passing.map(unmeasured_marks(passing)).notna().sum())
    if unmeasured:
        verdict += (f" Of the {len(passing)} stages that pass, {unmeasured} passed on gates no "
                    "device of their backend has measured (cells marked \u201cunmeasured\u201d).")
    if len(against_backend):
        failing = int((against_backend["status"] == "fail").sum())
        verdict += (f" Against the CPU backend, {failing} of {len(against_backend)} stages of "
                    "other backends fail (\u201cBackends against the CPU\u201d).")
    if len(against_fresh):
        failing = int(against_fresh["status"].isin(ATTENTION).sum())
        verdict += (f" Run again in one process, {failing} of {len(against_fresh)} stages "
                    "differ from their fresh runs (\u201cFresh against reused\u201d)"
                    + (", which fails the check." if failing else "."))
    return f'<p class="verdict">{esc(verdict)}</p><div class="badges">{badges}</div>'


#: Columns other than metrics shown as numbers.
_NUMBERS = ("seconds", "bits_per_weight", "fallbacks")
#: The most cases of a model a status matrix shows, and the most rows a table of rows does: a
#: sweep of a thousand cases would make a page of hundreds of MB, which no browser opens
#: (summary.csv holds them all).
SHOWN_CASES, SHOWN_ROWS = 20, 5000


def _row_table(rows: pd.DataFrame | Sequence[Mapping[str, str]], columns: Sequence[str],
               css: str) -> str:
    """An HTML table of the ``columns`` of ``rows`` (a table, or its rows as dicts): status
    coloured, numbers shortened; each row carries its candidate, backend and weight type for
    the filters. The first :data:`SHOWN_ROWS` rows, a note saying how many are left out."""
    head = "".join(f"<th>{esc(c)}</th>" for c in columns)
    body = []
    total = len(rows)
    rows = rows.iloc[:SHOWN_ROWS] if isinstance(rows, pd.DataFrame) else rows[:SHOWN_ROWS]
    left = (f'<p class="note">The first {SHOWN_ROWS} of {total} rows; summary.csv holds every '
            "one.</p>") if total > SHOWN_ROWS else ""
    for row in rows_of(rows) if isinstance(rows, pd.DataFrame) else rows:
        cells = []
        for c in columns:
            if c == "status":
                cells.append(f'<td class="{status_class(row[c])}">{esc(row[c])}</td>')
            elif c in METRIC_COLUMNS or c in COST_COLUMNS or c in _NUMBERS:
                cells.append(f'<td class="num">{esc(short(c.removeprefix("cost_"), row[c]))}'
                             "</td>")
            else:
                cells.append(f'<td class="{c}">{esc(row[c])}</td>')
        body.append(f"<tr{filter_attrs(row)}>{''.join(cells)}</tr>")
    return (
        f'<table class="{css}"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(body)}</tbody></table>{left}'
    )


def _cause(cause: Cause) -> str:
    """One cause of "Needs attention": its family and text once, then a line per cell it
    covers (cells that differ by their case only on one line) with the cell's stages,
    compact; in the line's tooltip each case's own culprit (its values) and each row's status
    and reason."""
    family = cause.covered[0].labels["family"]
    lines = []
    for covered in cause.covered:
        labels = covered.labels
        where = " · ".join([labels["model"], ", ".join(covered.cases), labels["candidate"],
                            labels["backend"], labels["weight_type"]])
        tip = "\n".join([*(f"{case}: {text}" for case, text in zip(
            covered.cases, covered.culprits, strict=True)), *(
            f"{case} {stage} — {status}" + (f": {reason}" if reason else "")
            for case, stage, status, reason in covered.rows)])
        lines.append(f'<li{filter_attrs(labels)} title="{esc(tip)}">{esc(where)} — '
                     f"stages: {esc(compact(covered.stages))}</li>")
    return (f'<div class="cause"><p><span class="pill {status_class(cause.status)}">'
            f'{esc(cause.status)}</span> <span class="family">{esc(family)}</span> '
            f"{'<br>'.join(map(esc, cause.text.split(SEPARATOR)))} "
            f"<small>({cause.stages} stage{'s' if cause.stages != 1 else ''}"
            f")</small></p><ul>{''.join(lines)}</ul></div>")


def _attention(frame: pd.DataFrame) -> str:
    """The stages that fail, crashed or went missing, under their cause
    (:func:`audioparity.report.attention.causes`), then the declared expected failures."""
    found = causes(rows_of(frame[frame["status"].isin(ATTENTION)]))
    declared = frame[frame["status"] == "xfail"]
    parts = []
    if found:
        cells = sum(len(c.covered) for c in found)
        parts.append(f'<p class="note">{len(found)} cause{"s" if len(found) != 1 else ""}, '
                     f"{cells} line{'s' if cells != 1 else ''}. A cause is the culprit of its "
                     "cells: the first stage, in pipeline order, that breaks while the stages "
                     "feeding it pass (its isolated or replayed form when that fails too: the "
                     "block itself), and the bounds it misses, the values measured left out; "
                     "under it, each cell (model · cases · candidate · backend · weight type) "
                     "and its stages that need attention. Hover a line for its own values and "
                     "each stage's reason. A quantized cell is judged in three parts: "
                     "<code>storage</code>, the types its file stores against the weight type "
                     "asked; <code>stored_weights</code>, its quantizer's bytes against "
                     "ggml's; its stages, its arithmetic, against a reference computing with "
                     "its own stored weights.</p>")
        parts.extend(_cause(cause) for cause in found)
    else:
        parts.append('<p class="note">Nothing failed, crashed or went missing.</p>')
    if len(declared):
        parts.append(f"<h3>Declared expected failures ({len(declared)} stages)</h3>")
        parts.append(_row_table(_grouped(declared), _GROUPED, "full"))
    return "".join(parts)


#: Columns of the table of every row: summary.csv's, less the fallback lines repeated on every
#: row of a cell (the "Weight types" tables hold them).
_ALL_ROWS = tuple(c for c in COLUMNS if c != "fallback_tensors")
#: Columns of the grouped expected-failure table.
_GROUPED = ("model", "candidate", "backend", "weight_type", "status", "cases", "stages",
            "reason")


def _grouped(declared: pd.DataFrame) -> pd.DataFrame:
    """One row per (model, candidate, backend, weight type): the cases and stages that failed as
    declared, and the first reason (declarations are per stage pattern, so a group shares its
    cause)."""
    groups = declared.groupby(["model", "candidate", "backend", "weight_type"], sort=False)
    return groups.agg(
        status=("status", "first"),
        cases=("case", lambda c: ", ".join(dict.fromkeys(c))),
        stages=("stage", lambda s: ", ".join(dict.fromkeys(s))),
        reason=("reason", "first"),
    ).reset_index()


def _header_rows(columns: list[tuple[str, ...]], edge: list[str]) -> list[str]:
    """The header rows of a matrix whose columns are label tuples (candidate, backend, weight
    type): one row per level, a label spanning the columns it opens. The last level's cells
    (``leaf``) carry the column's labels for the filters; a spanning cell (``span``) the first
    column it spans and how many, so that the filters can narrow it."""
    rows = []
    last = len(columns[0]) - 1
    for level in range(last + 1):
        cells, i = [], 0
        while i < len(columns):
            span = 1
            while (i + span < len(columns)
                   and columns[i + span][: level + 1] == columns[i][: level + 1]):
                span += 1
            if level == last:
                attrs = filter_attrs(dict(zip(FILTERS, columns[i], strict=True)))
                css = f"leaf{edge[i]}"
            else:
                attrs, css = f' data-first="{i}" data-span="{span}"', f"span{edge[i]}"
            cells.append(f'<th class="{css}"{attrs} colspan="{span}">'
                         f"{esc(columns[i][level])}</th>")
            i += span
        rows.append("".join(cells))
    return rows


def _matrix_cell(row: Mapping[str, str] | None, column: tuple[str, ...], edge: str,
                 marks: Mapping[str, str | None]) -> str:
    """One cell of a status matrix: the row's key metric on its status's colour, its cost and
    unmeasured mark under it, its tooltip; an empty cell where the column has no such row."""
    attrs = filter_attrs(dict(zip(FILTERS, column, strict=True)))
    if row is None:
        return f'<td class="empty{edge}"{attrs}></td>'
    cost = cost_metric(row)
    unmeasured = " unmeasured" if marks[row["gate"]] else ""
    return (f'<td class="{status_class(row["status"])}{unmeasured}{edge}"'
            f'{attrs} title="{esc(tooltip(row))}">{esc(key_metric(row))}'
            + (f'<br><small class="cost">{esc(cost)}</small>' if cost else "")
            + ('<br><small class="unmeasured">unmeasured</small>' if unmeasured else "")
            + "</td>")


def _matrix(frame: pd.DataFrame, note: str = "Each cell shows the NMSE of a tensor stage or "
            "the token match of a document stage; hover a cell for the reason, the gate, the "
            "tightest bounds it would pass and every metric. A quantized weight type is "
            "compared with a quantization-aware reference (torch computing as ggml's CPU "
            "backend does at that type); the small line under it (f32 ...) is the weight "
            "type's cost: the same stage against the float32 reference.") -> str:
    """One status matrix per family: rows (model, case) groups of stages, columns candidate x
    backend x weight type; at most :data:`SHOWN_CASES` cases of a model
    (:func:`~audioparity.report.summary.shown_cases`)."""
    parts = [
        '<p class="note legend">'
        + "".join(f'<span class="{status_class(s)}">{s}</span>' for s in STATUSES)
        + f"<br>{esc(note)}</p>"
    ]
    shown, left = shown_cases(frame, SHOWN_CASES)
    if left:
        parts.append(f'<p class="note">{left} case{"s" if left != 1 else ""} not shown: at '
                     f"most {SHOWN_CASES} of each model, those with a stage that needs "
                     "attention first (summary.csv holds every case).</p>")
    marks = unmeasured_marks(frame["gate"])
    for family, rows in frame[shown].groupby("family", sort=False):
        labels = list(dict.fromkeys(zip(rows["candidate"], rows["backend"],
                                        rows["weight_type"], strict=True)))
        columns = [
            (c, b, w)
            for c in ordered([c for c, _, _ in labels], (OUR_PORT,))
            for b in ordered([b for c2, b, _ in labels if c2 == c], BACKENDS)
            for w in ordered([w for c2, b2, w in labels if (c2, b2) == (c, b)], WEIGHT_TYPES)
        ]
        # a heavier rule opens each candidate's and each backend's block of columns
        edge = [" edge" if i == 0 or columns[i - 1][:2] != column[:2] else ""
                for i, column in enumerate(columns)]
        header = _header_rows(columns, edge)
        body = []
        for (model, case), group in rows.groupby(["model", "case"], sort=False):
            body.append(
                f'<tr class="group"><th colspan="{len(columns) + 1}">'
                f"{esc(model)} · {esc(case)}</th></tr>"
            )
            cells = {(r["stage"], r["candidate"], r["backend"], r["weight_type"]): r
                     for r in rows_of(group)}
            for stage in sorted(set(group["stage"]), key=lambda s: spec_of(family).stage_key(s)):
                tds = [_matrix_cell(cells.get((stage, *column)), column, edge[i], marks)
                       for i, column in enumerate(columns)]
                body.append(f'<tr><th class="stage">{esc(stage)}</th>{"".join(tds)}</tr>')
        stage_th = f'<th class="corner" rowspan="{len(header)}">stage</th>'
        head = "".join(f"<tr>{stage_th if i == 0 else ''}{cells}</tr>"
                       for i, cells in enumerate(header))
        parts.append(
            f"<h3>{esc(family)}</h3>{unmeasured_lines(rows, marks)}"
            f"<table class=\"matrix\"><thead>{head}</thead><tbody>{''.join(body)}</tbody></table>"
        )
    return "".join(parts)


#: Columns of the table of the cells that fail against another backend.
_DRILLED = ("model", "case", "candidate", "backend", "weight_type", "against", "stage",
            "first_bad_op")


def _backends(frame: pd.DataFrame) -> str:
    """Each backend against the baseline backend: the matrix, then per cell that fails there its
    first failing stage (pipeline order) and the first bad op its drill-down found."""
    if frame.empty:
        return ('<p class="note">No backend besides the CPU in this summary (config '
                "<code>backends</code>; config/examples/vulkan.yaml).</p>")
    parts = [_matrix(frame, "Each backend's cell against the same candidate and weight type on "
                     "the CPU backend, under the cell's own gates: a stage that passes against "
                     "the reference here but fails there is computed differently by the backend, "
                     "not by the port. Each cell shows the NMSE against the CPU.")]
    failing = frame[frame["status"] == "fail"]
    rows = []
    for _, group in failing.groupby(["family", "model", "case", "candidate", "backend",
                                     "weight_type", "against"], sort=False):
        first = min(rows_of(group),
                    key=lambda r: spec_of(r["family"]).stage_key(r["stage"]))
        rows.append(first)
    if rows:
        parts.append(f"<h3>First bad op of each cell that fails ({len(rows)})</h3>"
                     '<p class="note">The first failing stage in pipeline order, and the first '
                     "op of the drill-down (every ggml graph of the cell run node by node on "
                     "both backends, each node fed the CPU's values of its sources) above ggml's "
                     "own tolerance for it (test-backend-ops), or, where none is, the first "
                     "that did not compute in float32. Its folder holds drilldown.json and a "
                     "repro/ to rerun that graph alone.</p>")
        parts.append(_row_table(rows, _DRILLED, "full"))
    return "".join(parts)


#: Columns of the table of the cases run again that differ from their fresh runs.
_REUSED = ("model", "case", "candidate", "backend", "weight_type", "stage", "status", "max_abs",
           "non_finite", "argmax", "gate", "reason", "culprit")


def _fresh(frame: pd.DataFrame) -> str:
    """Each case run again in one process (after another case, or twice) against the same
    candidate's fresh run of it: the matrix, then every stage that differs."""
    if frame.empty:
        return ('<p class="note">No case run again in this summary (config <code>reuse</code>; '
                "only a candidate that runs several cases in one process: docs/design.md, "
                "\u201cFresh against reused\u201d).</p>")
    parts = [_matrix(frame, "Each case run again in one process, after another case or a "
                     "second time, against the same candidate's fresh run of it (its own "
                     "process), stage by stage: identical, or within the config's "
                     "reuse_bounds. A stage that differs reads what an earlier case left "
                     "behind (a KV cache, a recurrent state, a buffer not reset), and fails the "
                     "check. Each cell shows the largest difference (max_abs).")]
    differing = frame[frame["status"].isin(ATTENTION)]
    if len(differing):
        parts.append(f"<h3>Stages that differ from their fresh runs ({len(differing)})</h3>")
        parts.append(_row_table(differing, _REUSED, "full"))
    return "".join(parts)


#: Columns of the table of the stages where the references disagree.
_SPREAD = ("model", "case", "candidate", "against", "stage", "status", "nmse", "max_abs",
           "token_match", "reason")


def _references(frame: pd.DataFrame) -> str:
    """Each reference besides the primary against the primary, case by case (the spread
    between references that the culprits read: docs/references.md): the matrix, then the
    stages where they part beyond the float32 gates."""
    if frame.empty:
        return ('<p class="note">One reference per family in this summary (config '
                "<code>references</code>; docs/references.md).</p>")
    parts = [_matrix(frame, "Each other reference (column: its name) against the family's "
                     "primary reference (the one every cell is judged against), on the same "
                     "model and case, under the float32 gates: where they part, the "
                     "references themselves disagree, and a candidate whose difference lies "
                     "within that spread has it named as a reference disagreement in its "
                     "culprit. Each cell shows the NMSE against the primary.")]
    apart = frame[frame["status"].isin(["fail", "xfail"])
                  & ~frame["reason"].str.startswith(STALE)]
    if len(apart):
        parts.append(f"<h3>Where the references disagree ({len(apart)} stages)</h3>"
                     '<p class="note">A declared difference (the reference entry\'s '
                     "<code>differences</code>) shows as xfail with its cause; fail is a "
                     "disagreement no entry explains. A declared difference that no longer "
                     "holds fails as stale in the matrix and is not listed here.</p>")
        parts.append(_row_table(apart, _SPREAD, "full"))
    return "".join(parts)


#: Statuses in the order a weight type's verdict picks its worst.
_WORST = ("crashed", "fail", "missing", "xfail", "unavailable", "pass")


def _verdict(counts: Counter) -> str:
    """A sweep table's status cell: the worst status of a weight type's stages (over its
    cases) and how many of them have it, every count in the tooltip (in the vocabulary's
    order)."""
    total = sum(counts.values())
    others = sorted(set(counts) - set(_WORST))
    worst = next(s for s in (*_WORST, *others) if counts.get(s))
    tip = ", ".join(f"{s} {counts[s]}" for s in (*STATUSES, *others) if counts.get(s))
    return (f'<td class="{status_class(worst)}" title="{esc(tip)}">'
            f"{esc(worst)} {counts[worst]}/{total}</td>")


def _cost_text(value: float | None) -> str:
    """A cost as the sweep table shows it: 3 significant digits, ``NaN``, or a dash (None)."""
    if value is None:
        return "—"
    return "NaN" if math.isnan(value) else f"{value:.3g}"


def _fallbacks(count: int | None, lines: list[str]) -> str:
    """A sweep table's fallbacks cell: how many tensors fell back, their lines on hover and in
    a details element; empty where the dumps do not say."""
    if count is None:
        return '<td class="fallbacks"></td>'
    if not lines:
        return f'<td class="fallbacks num">{count}</td>'
    text = "\n".join(lines)
    return (f'<td class="fallbacks" title="{esc(text)}"><details class="lines"><summary>'
            f"{count} tensor{'s' if count != 1 else ''}</summary><div>{esc(text)}</div>"
            "</details></td>")


def _sweep_table(sweep: Sweep) -> str:
    """One row per weight type of a sweep: bits per weight, each cost (bold on its Pareto
    front), the stages' statuses, the fallbacks."""
    fronts = [set(pareto_front({w: (sweep.bits[w], v) for w, v in m.values.items()
                                if sweep.bits.get(w) is not None and v is not None}))
              for m in sweep.costs]
    head = "".join(f"<th>{esc(h)}</th>" for h in (
        "weight type", "bits per weight", *(m.title for m in sweep.costs), "stages",
        "fallbacks"))
    body = []
    for weight_type in sweep.weight_types:
        bits = sweep.bits[weight_type]
        cells = [f'<td class="weight_type">{esc(weight_type)}</td>',
                 f'<td class="num">{"" if bits is None else f"{bits:.4g}"}</td>']
        for measured, front in zip(sweep.costs, fronts, strict=True):
            value = measured.values.get(weight_type)
            on = weight_type in front
            tip = ("on the Pareto front" if on else
                   f"not measured in every case ({len(sweep.cases)})" if value is None else "")
            cells.append(f'<td class="num{" front" if on else ""}" title="{esc(tip)}">'
                         f"{esc(_cost_text(value))}</td>")
        cells.append(_verdict(sweep.statuses[weight_type]))
        cells.append(_fallbacks(sweep.fallbacks[weight_type], sweep.fallback_lines[weight_type]))
        attrs = filter_attrs({**sweep.labels, "weight_type": weight_type})
        body.append(f"<tr{attrs}>{''.join(cells)}</tr>")
    return (f'<table class="sweep"><thead><tr>{head}</tr></thead>'
            f"<tbody>{''.join(body)}</tbody></table>")


#: What the "Weight types" section shows.
_WEIGHT_TYPES_NOTE = (
    "For each model, candidate and backend swept over several weight types: each weight "
    "type's cost against the float32 reference, over the bits per weight its dumps stored "
    "(manifest storage), one panel per cost: the NMSE of the last tensor stage of the trunk, "
    "the WER of the decode (1 − token match for a document without text), the KL of the last "
    "logits stage; each the mean over the model's cases. A quantized cell's cost is its "
    "cost_* column (its own reference being quantization-aware), f32's and native's their own "
    "metric. Filled points joined by the staircase are the Pareto front: no other weight type "
    "is both smaller and cheaper. A precision recipe (<base>+<recipe>) is a diamond, beside "
    "the uniform types. The table gives the values (bold: on the front), the worst status of "
    "each weight type's stages with its count (every count on hover), and the tensors stored "
    "as another type than asked (rows no multiple of its block), each on hover.")


def _weight_types(frame: pd.DataFrame) -> str:
    """The "Weight types" section: per sweep of two weight types or more
    (:func:`audioparity.report.weight_types.sweeps`), its Pareto plot and its table, in a
    block the filters hide with its candidate or backend."""
    found = [s for s in sweeps(frame) if len(s.weight_types) > 1]
    if not found:
        return '<p class="note">No candidate here was swept over two weight types.</p>'
    parts = [f'<p class="note">{esc(_WEIGHT_TYPES_NOTE)}</p>']
    for sweep in found:
        labels = sweep.labels
        title = " · ".join(labels[k] for k in ("family", "model", "candidate", "backend"))
        parts.append(f'<div class="sweep"{filter_attrs(labels)}><h3>{esc(title)}</h3>'
                     f"{pareto_plot(sweep)}{_sweep_table(sweep)}</div>")
    return "".join(parts)


def _filters(frame: pd.DataFrame) -> str:
    """The filters' form: per candidate, backend and weight type of ``frame``, in reading
    order, a checkbox (ticked), and buttons that tick all or none of them."""
    orders = {"candidate": (OUR_PORT,), "backend": BACKENDS, "weight_type": WEIGHT_TYPES}
    sets = []
    for key in FILTERS:
        values = ordered(list(frame[key].unique()), orders[key])
        boxes = "".join(f'<label><input type="checkbox" name="{key}" value="{esc(v)}" '
                        f"checked> {esc(v)}</label>" for v in values)
        sets.append(f"<fieldset><legend>{esc(key.replace('_', ' '))}</legend>"
                    f'<button type="button" data-all="{key}" data-on="1">all</button>'
                    f'<button type="button" data-all="{key}" data-on="0">none</button>'
                    f"{boxes}</fieldset>")
    return f'<form id="filters" class="filters">{"".join(sets)}</form>'


def _anchor(title: str) -> str:
    """A section's id: its title in lower case, words joined by dashes (``#backends-...``)."""
    return "-".join(re.findall(r"[a-z0-9]+", title.lower()))


def build_html(frame: pd.DataFrame, source: str) -> str:
    """The whole report page for a summary table (strings, columns :data:`COLUMNS`)."""
    frame = in_summary_order(frame)
    between_references = frame[frame["backend"] == REFERENCE_BACKEND]
    against_fresh = frame[frame["against"] == FRESH]
    against_backend = frame[~frame["against"].isin([REFERENCE, FRESH])
                            & (frame["backend"] != REFERENCE_BACKEND)]
    frame = frame[frame["against"] == REFERENCE]
    # the table of every row shows the first SHOWN_ROWS, in this order
    every = (frame, against_backend, against_fresh, between_references)
    total = sum(map(len, every))
    shown = pd.concat([part.iloc[:SHOWN_ROWS] for part in every]).iloc[:SHOWN_ROWS]
    colours = weight_type_colours(list(frame["weight_type"].unique()))
    # models and cases are named per family (two families may both have a "tiny")
    counts = {c: len(frame[["family", c]].drop_duplicates()) if c in ("model", "case")
              else frame[c].nunique() for c in ("model", "case", "candidate", "backend",
                                                "weight_type")}
    described = ", ".join(f"{n} {c.replace('_', ' ')}{'s' if n != 1 else ''}"
                          for c, n in counts.items())
    sections = [
        ("Needs attention", _attention(frame)),
        ("Status matrix", _matrix(frame)),
        ("References", _references(between_references)),
        ("Weight types", _weight_types(frame)),
        ("Backends against the CPU", _backends(against_backend)),
        ("Fresh against reused", _fresh(against_fresh)),
        ("Per-layer error", layer_curves(frame, colours)),
        ("Key stages by weight type", by_weight_type(frame)),
        (f"All rows ({total})",
         '<p class="note">Every column of summary.csv but fallback_tensors (each weight '
         "type's in the “Weight types” tables)"
         + (f"; the first {SHOWN_ROWS} rows, summary.csv holds every one"
            if total > SHOWN_ROWS else "") + ".</p>" + _row_table(shown, _ALL_ROWS, "full")),
    ]
    body = "".join(f'<h2 id="{_anchor(title)}">{esc(title)}</h2>{content}'
                   for title, content in sections)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        "<title>audioparity report</title>"
        f"<style>{CSS}{status_css()}</style></head><body>"
        "<h1>audioparity: ggml port vs reference</h1>"
        f'<p class="sub">From {esc(source)}: {esc(described)}.</p>'
        f"{_headline(frame, against_backend, against_fresh)}"
        f"{_filters(pd.concat([part[list(FILTERS)] for part in every[:3]]))}"
        f"{body}<script>{SCRIPT}</script></body></html>\n"
    )


def write_html(summary_csv: str | os.PathLike, output: str | os.PathLike) -> None:
    """Write the self-contained report page built from ``summary_csv`` alone (atomic write).

    Raises:
        AudioparityError: the summary is unreadable or its columns are not the summary's.
    """
    summary_csv = Path(summary_csv)
    write_text_atomic(Path(output), build_html(read_summary(summary_csv), summary_csv.name))
