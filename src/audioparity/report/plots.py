"""The report's plots, PNGs embedded as base64: the error per layer (where drift starts, and
whether it is accumulated or local), the key stages by weight type (each weight type's
cost against the float32 reference), and each sweep's costs against its bits per weight with
their Pareto front."""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from audioparity.contract.spec import FORMS
from audioparity.contract.vocabulary import BACKENDS, OUR_PORT, WEIGHT_TYPES
from audioparity.models.registry import spec_of
from audioparity.report.summary import ordered, rows_of, shown_cases
from audioparity.report.weight_types import Measured, Sweep, pareto_front

#: The marker of each form of a per-layer stage (:data:`~audioparity.contract.spec.FORMS`): end to
#: end, isolated, replayed.
FORM_MARKERS = dict(zip(FORMS, ("o", "s", "^"), strict=True))
#: A colour per weight type (and per stage of the key stages), in the vocabulary's order: 16,
#: so that every weight type of a full sweep has its own.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#ad494a", "#637939", "#e7969c",
           "#7b4173", "#3182bd")


def _png(figure: Figure, alt: str) -> str:
    """An ``<img>`` holding ``figure`` as a base64 PNG (no software stamp: the same figure
    gives the same bytes)."""
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight", metadata={"Software": None})
    data = base64.b64encode(buffer.getvalue()).decode("ascii")
    return f'<img alt="{html.escape(alt, quote=True)}" src="data:image/png;base64,{data}">'


def weight_type_colours(weight_types: Sequence[str]) -> dict[str, str]:
    """A :data:`PALETTE` colour per weight type, in the vocabulary's order."""
    types = ordered(list(weight_types), WEIGHT_TYPES)
    return {w: PALETTE[i % len(PALETTE)] for i, w in enumerate(types)}


def _floor(values: Sequence[float]) -> float:
    """Bottom of a log axis: a decade below the smallest positive value (1e-16 if none)."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    return 10.0 ** (math.floor(math.log10(min(positive))) - 1) if positive else 1e-16


def _log_series(ax, xs, ys, floor: float, **style) -> None:
    """Plot ``ys`` on a log axis: zeros drawn at ``floor``, non-finite values as red x at top."""
    finite = [(x, max(y, floor)) for x, y in zip(xs, ys, strict=True) if math.isfinite(y)]
    if finite:
        ax.plot(*zip(*finite, strict=True), **style)
    bad = [x for x, y in zip(xs, ys, strict=True) if not math.isfinite(y)]
    if bad:
        ax.plot(bad, [0.97] * len(bad), "x", color="#b91c1c", markersize=9, mew=2,
                transform=ax.get_xaxis_transform(), clip_on=False)


#: Panels of the per-layer plot: (title, value from a summary row).
LAYER_PANELS: tuple[tuple[str, Callable[[pd.Series], float]], ...] = (
    ("1 − cosine", lambda r: 1.0 - float(r["cosine"])),
    ("NMSE", lambda r: float(r["nmse"])),
)


#: Line style of each candidate's curves, in candidate order (our port's first).
LINE_STYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (5, 2, 1, 2)), (0, (8, 2, 1, 2, 1, 2)),
               (0, (2, 3)))
#: Legend entries per column beside a plot 3.3 inches tall; more take another column.
LEGEND_ROWS = 12


def _legend_columns(handles: Sequence[object]) -> int:
    """How many columns a legend of ``handles`` takes (:data:`LEGEND_ROWS` entries each)."""
    return max(1, math.ceil(len(handles) / LEGEND_ROWS))


def per_layer(family: str, stage: str) -> tuple[int, str] | None:
    """``(layer, form)`` of a per-layer stage of a registered family, one whose spec's name
    holds the layer placeholder (``layer_3_isolated`` -> ``(3, "isolated")``); None for any
    other stage, and for every stage of a family this install does not know (a summary from
    elsewhere: its rows show in the other sections only)."""
    found = spec_of(family).locate(stage)
    if found is None or found.layer is None:
        return None
    return found.layer, found.form


def _layers(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of per-layer stages that have a cosine, with their ``layer`` and ``form``."""
    found = [per_layer(family, stage) for family, stage in zip(frame["family"], frame["stage"],
                                                               strict=True)]
    keep = [f is not None and cosine != "" for f, cosine in zip(found, frame["cosine"],
                                                                strict=True)]
    kept = [f for f, k in zip(found, keep, strict=True) if k]
    return frame[keep].assign(layer=[f[0] for f in kept], form=[f[1] for f in kept])


def _layer_panel(ax, rows: pd.DataFrame, title: str, value: Callable[[pd.Series], float],
                 colours: dict[str, str], styles: dict[str, object]) -> None:
    """One panel of the per-layer plot: ``value`` per layer, a curve per (candidate, weight
    type, form)."""
    records = rows_of(rows)
    floor = _floor([value(r) for r in records])
    curves: dict[tuple[str, str, str], list[dict[str, str]]] = {}
    for r in records:
        curves.setdefault((r["candidate"], r["weight_type"], r["form"]), []).append(r)
    for (candidate, weight_type, form), part in curves.items():
        part = sorted(part, key=lambda r: r["layer"])
        local = form != ""
        # native is drawn thin and on top: it often equals the type the checkpoint stores
        # (f32 or bf16), which would otherwise hide it
        width = (0.8 if weight_type == "native" else 1.4) * (0.6 if local else 1.0)
        _log_series(
            ax, [int(r["layer"]) for r in part], [value(r) for r in part],
            floor, color=colours[weight_type], linestyle=styles[candidate],
            marker=FORM_MARKERS[form], markersize=3 if local else 3.5,
            markerfacecolor="white" if local else colours[weight_type],
            linewidth=width, zorder=3 if weight_type == "native" else 2,
        )
    ax.set_yscale("log")
    ax.set_ylim(bottom=floor * 0.8)
    ax.set_xlabel("layer")
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    ax.xaxis.get_major_locator().set_params(integer=True)


def _layer_legend(rows: pd.DataFrame, colours: dict[str, str], styles: dict[str, object]
                  ) -> list[Line2D]:
    """The legend of a per-layer plot: weight types, candidates (when several), forms."""
    candidates = list(styles)
    handles = [Line2D([], [], color=c, linewidth=2, label=w) for w, c in colours.items()
               if w in set(rows["weight_type"])]
    handles.extend(Line2D([], [], color="#52525b", linestyle=styles[c], label=c)
                   for c in candidates if len(candidates) > 1)
    handles.append(Line2D([], [], color="#52525b", marker="o", linewidth=1.4, label="end-to-end"))
    handles.extend(Line2D([], [], color="#52525b", marker=FORM_MARKERS[form],
                          markerfacecolor="white", linewidth=0.8, label=form)
                   for form in FORMS[1:] if (rows["form"] == form).any())
    return handles


#: What the per-layer plots show.
_LAYER_NOTE = (
    '<p class="note">Thick, filled markers: the layer\'s output in the end-to-end run (error '
    "accumulated from every stage before it). Thin, hollow markers: the layer's own error, "
    "isolated (squares: the candidate's layer fed the reference's input) or replayed "
    "(triangles: the reference's layer fed the candidate's input, for a port that cannot be "
    "fed). A thin curve that stays flat while the thick one climbs means drift accumulates; "
    "a jump in both marks the layer that is off. A colour "
    "per weight type, a line style per candidate. Exact zeros sit on the bottom edge; a red "
    "× at the top marks a non-finite value.</p>"
)


#: The most cases of a model drawn in each kind of per-case plot (the per-layer error, the key
#: stages by weight type): a figure costs about half a second and tens of KB of the page, and
#: a sweep of a thousand cases would draw thousands (:func:`~audioparity.report.summary.
#: shown_cases`: those with a stage that needs attention first).
DRAWN_CASES = 8


def _drawn(frame: pd.DataFrame) -> tuple[pd.Series, str]:
    """Which rows of ``frame`` (the comparisons with the reference) belong to a case drawn
    (:data:`DRAWN_CASES`), and the note saying how many are not ("" when none is)."""
    chosen, left = shown_cases(frame, DRAWN_CASES)
    note = (f'<p class="note">{left} case{"s" if left != 1 else ""} not drawn: at most '
            f"{DRAWN_CASES} of each model, those with a stage that needs attention first "
            "(summary.csv holds every case).</p>") if left else ""
    return chosen, note


def layer_curves(frame: pd.DataFrame, colours: dict[str, str]) -> str:
    """Per (family, model, case, backend): error per layer; a colour per weight type, a line
    style per candidate; end to end thick with filled markers, the local forms (isolated:
    squares, replayed: triangles) thin with hollow ones. At most :data:`DRAWN_CASES` cases of
    a model (:func:`_drawn`)."""
    images = []
    chosen, left_out = _drawn(frame)
    for (family, model, case, backend), rows in _layers(frame[chosen]).groupby(
        ["family", "model", "case", "backend"], sort=False
    ):
        candidates = ordered(list(rows["candidate"].unique()), (OUR_PORT,))
        styles = {c: LINE_STYLES[i % len(LINE_STYLES)] for i, c in enumerate(candidates)}
        figure = Figure(figsize=(11, 3.3), layout="constrained")
        axes = figure.subplots(1, 2)
        for ax, (title, value) in zip(axes, LAYER_PANELS, strict=True):
            _layer_panel(ax, rows, title, value, colours, styles)
        handles = _layer_legend(rows, colours, styles)
        axes[1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1),
                       fontsize=8.5, frameon=False, ncols=_legend_columns(handles))
        figure.suptitle(f"{family} · {model} · {case} · {backend}", fontsize=11)
        # the page's backend filter hides the plots of the backends it leaves out
        images.append(f'<div data-backend="{html.escape(backend, quote=True)}">'
                      f'{_png(figure, f"per-layer error, {model} {case} {backend}")}</div>')
    if not images:
        return '<p class="note">No per-layer stages in this summary.</p>'
    return _LAYER_NOTE + left_out + "".join(images)


def _f32_nmse(row: pd.Series) -> float:
    """A row's NMSE against the float32 reference: its cost where it has one, else its own."""
    return float(row["cost_nmse"] if row["cost_nmse"] != "" else row["nmse"])


def by_weight_type(frame: pd.DataFrame) -> str:
    """Per (family, model, case): NMSE of each non-layer tensor stage against the float32
    reference across weight types (the cost of each weight type). At most
    :data:`DRAWN_CASES` cases of a model (:func:`_drawn`)."""
    chosen, left_out = _drawn(frame)
    frame = frame[chosen]
    layered = [per_layer(family, stage) is not None
               for family, stage in zip(frame["family"], frame["stage"], strict=True)]
    stages = frame[~pd.Series(layered, index=frame.index, dtype=bool) & (frame["nmse"] != "")]
    images = []
    for (family, model, case), rows in stages.groupby(["family", "model", "case"], sort=False):
        records = rows_of(rows)
        backends = ordered(list(rows["backend"].unique()), BACKENDS)
        # a full sweep's 16 weight types need the room of their tick labels
        width = max(3.6, 0.3 * rows["weight_type"].nunique())
        figure = Figure(figsize=(width * len(backends) + 2.2, 3.3), layout="constrained")
        axes = figure.subplots(1, len(backends), squeeze=False)[0]
        names = sorted(set(rows["stage"]), key=lambda s: spec_of(family).stage_key(s))
        floor = _floor([_f32_nmse(r) for r in records])
        candidates = ordered(list(rows["candidate"].unique()), (OUR_PORT,))
        styles = {c: LINE_STYLES[i % len(LINE_STYLES)] for i, c in enumerate(candidates)}
        series: dict[tuple[str, str, str], dict[str, float]] = {}
        for r in records:
            series.setdefault((r["backend"], r["stage"], r["candidate"]), {})[
                r["weight_type"]] = _f32_nmse(r)
        for ax, backend in zip(axes, backends, strict=True):
            types = ordered([w for w, b in zip(rows["weight_type"], rows["backend"],
                                               strict=True) if b == backend], WEIGHT_TYPES)
            for (i, stage), candidate in itertools.product(enumerate(names), candidates):
                values = series.get((backend, stage, candidate), {})
                xs = [x for x, w in enumerate(types) if w in values]
                _log_series(ax, xs, [values[types[x]] for x in xs], floor,
                            color=PALETTE[i % len(PALETTE)], marker="o", markersize=4,
                            linewidth=1.2, linestyle=styles[candidate], label=stage)
            ax.set_xticks(range(len(types)), types, rotation=60 if len(types) > 6 else 0,
                          fontsize=8.5)
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor * 0.8)
            ax.set_title(f"{backend}: NMSE against f32 reference", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color=PALETTE[i % len(PALETTE)], marker="o", label=s)
                   for i, s in enumerate(names)]
        handles.extend(Line2D([], [], color="#52525b", linestyle=styles[c], label=c)
                       for c in candidates if len(candidates) > 1)
        axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1),
                        fontsize=8.5, frameon=False, ncols=_legend_columns(handles))
        figure.suptitle(f"{family} · {model} · {case}", fontsize=11)
        images.append(_png(figure, f"key stages by weight type, {model} {case}"))
    if not images:
        return '<p class="note">No tensor stages besides layers in this summary.</p>'
    return left_out + "".join(images)


#: Colours of the Pareto plots: the points on the front, the others, the front's staircase.
FRONT, DOMINATED, STAIRS = "#1f77b4", "#a1a1aa", "#93c5fd"


#: Where a Pareto plot's label may sit beside its point, in points, tried in order; a
#: negative x is counted from the label's left edge (the label then ends left of the point).
LABEL_OFFSETS = ((4, 2), (4, -9), (-4, 2), (-4, -9), (4, 10), (4, -17), (-4, 10), (-4, -17),
                 (4, 18), (4, -25))
#: The size of a Pareto panel's axes (points) and of a label's characters (7 pt text).
PANEL_AXES, LABEL_CHAR, LABEL_HEIGHT = (290.0, 205.0), 4.3, 8.0


def place_labels(spots: Sequence[tuple[float, float, str]]) -> list[tuple[float, float]]:
    """Offsets (points) for labels beside points of a panel, so that they overlap as little as
    the tries of :data:`LABEL_OFFSETS` allow: each label in turn takes the first offset whose
    box meets no point's marker and no label placed before it, else the first offset.

    Args:
        spots: per point, its place in the axes (0..1 each way) and its label, in the order
            the labels are placed (the front's first).

    Returns:
        ``(dx, dy)`` per spot, in the order given (a negative ``dx`` already the label's
        left edge).
    """
    width, height = PANEL_AXES
    # every point's marker is in the way of the labels of the others
    placed = [(u * width - 3, v * height - 3, 6.0, 6.0) for u, v, _ in spots]
    offsets = []
    for u, v, label in spots:
        size = LABEL_CHAR * len(label)
        chosen = None
        for dx, dy in LABEL_OFFSETS:
            left = dx if dx >= 0 else dx - size
            box = (u * width + left, v * height + dy, size, LABEL_HEIGHT)
            if not any(box[0] < b[0] + b[2] and b[0] < box[0] + box[2]
                       and box[1] < b[1] + b[3] and b[1] < box[1] + box[3] for b in placed):
                chosen = (left, dy, box)
                break
        if chosen is None:
            dx, dy = LABEL_OFFSETS[0]
            chosen = (dx, dy, (u * width + dx, v * height + dy, size, LABEL_HEIGHT))
        placed.append(chosen[2])
        offsets.append(chosen[:2])
    return offsets


#: Bits per weight beyond which a Pareto plot's axis is compressed (the float types: f16,
#: bf16, f32), so that the quantized types, bunched between 2 and 9 bits, get the room.
COMPRESSED_BEYOND, COMPRESSION = 9.0, 0.3


def _bits_scale(x):
    """The x of a Pareto plot: log2 of bits per weight, compressed beyond
    :data:`COMPRESSED_BEYOND` (``x`` a number or an array)."""
    x = np.maximum(np.asarray(x, dtype=float), 1e-9)
    edge = math.log2(COMPRESSED_BEYOND)
    value = np.log2(x)
    return np.where(value <= edge, value, edge + COMPRESSION * (value - edge))


def _bits_unscale(u):
    """The inverse of :func:`_bits_scale`."""
    u = np.asarray(u, dtype=float)
    edge = math.log2(COMPRESSED_BEYOND)
    return np.exp2(np.where(u <= edge, u, edge + (u - edge) / COMPRESSION))


def _cost_floor(points: dict[str, tuple[float, float]], log: bool) -> float:
    """The bottom of a Pareto panel's cost axis: on a log axis, a decade below the smallest
    positive cost of the weight types under :data:`COMPRESSED_BEYOND` bits (the quantized
    ones), so that float types' costs many decades lower (f32's float32 noise) do not flatten
    them; a decade below the smallest positive cost where there are none; -0.03 on a linear
    axis."""
    if not log:
        return -0.03
    small = [y for x, y in points.values()
             if x < COMPRESSED_BEYOND and math.isfinite(y) and y > 0]
    return _floor(small or [y for _, y in points.values()])


def _pareto_panel(ax, measured: Measured, bits: dict[str, float | None]) -> None:
    """One cost of a sweep against bits per weight (:func:`_bits_scale`): a point per weight
    type with bits and a value, labelled; the front's points filled and joined by the
    staircase that bounds what the sweep attains; a precision recipe (``<base>+<recipe>``) as
    a diamond; a non-finite cost as a red x at the top, a weight type without one (a case
    crashed or missing) as a grey x there; a cost below the axis's bottom (:func:`_cost_floor`:
    zero, or f32's noise) as a triangle on it, its value in its label."""
    points = {w: (bits[w], v) for w, v in measured.values.items()
              if bits.get(w) is not None and v is not None}
    absent = [w for w, v in measured.values.items() if v is None and bits.get(w) is not None]
    front = pareto_front(points)
    finite = {w: p for w, p in points.items() if math.isfinite(p[1])}
    log = measured.cost.log
    low, high = _cost_range(points, log)

    def shown(y: float) -> float:
        return max(y, low) if log else y

    sizes = sorted({b for b in bits.values() if b is not None})
    left, right = sizes[0] / 1.15, sizes[-1] * 1.15
    span = float(_bits_scale(right) - _bits_scale(left))

    def place(x: float, y: float) -> tuple[float, float]:
        """A point's place in the axes, 0..1 each way."""
        u = float(_bits_scale(x) - _bits_scale(left)) / span
        if not math.isfinite(y):
            return u, 0.97
        v = (math.log(shown(y) / low) / math.log(high / low) if log
             else (y - low) / (high - low))
        return u, v

    if front:
        xs = [points[w][0] for w in front]
        stairs = [shown(points[w][1]) for w in front]
        ax.step([*xs, max(x for x, _ in finite.values())], [*stairs, stairs[-1]], where="post",
                color=STAIRS, linewidth=1.6, zorder=1)
    order = [*front, *(w for w in points if w not in front)]
    spots = [(*place(*points[w]), _point_label(w, points[w][1], low, log)) for w in order]
    spots += [(place(bits[w], math.nan)[0], 0.97, f"{w}: no cost") for w in absent]
    offsets = place_labels(spots)
    _absent_points(ax, [(bits[w], label) for w, (_, _, label) in zip(absent, spots[len(order):],
                                                                     strict=True)],
                   offsets[len(order):])
    for weight_type, offset in zip(order, offsets[:len(order)], strict=True):
        x, y = points[weight_type]
        on = weight_type in front
        label = _point_label(weight_type, y, low, log)
        if not math.isfinite(y):
            where, style = (x, 0.97), {"color": "#b91c1c"}
            ax.plot(*where, "x", color="#b91c1c", markersize=8, mew=2, clip_on=False,
                    transform=ax.get_xaxis_transform())
        else:
            where = (x, shown(y))
            style = {"color": "#18181b" if on else "#71717a",
                     "fontweight": "bold" if on else "normal"}
            marker = "D" if "+" in weight_type else "v" if label != weight_type else "o"
            ax.plot(*where, marker, color=FRONT if on else DOMINATED, markersize=5.5,
                    markerfacecolor=FRONT if on else "white", zorder=3, clip_on=False)
        ax.annotate(label, where, xytext=offset, textcoords="offset points", fontsize=7,
                    xycoords=ax.get_xaxis_transform() if not math.isfinite(y) else "data",
                    **style)
    _bits_axes(ax, (left, right), (low, high), log)
    ax.set_title(measured.title, fontsize=10)


def _cost_range(points: dict[str, tuple[float, float]], log: bool) -> tuple[float, float]:
    """The cost axis of a Pareto panel: from a little under :func:`_cost_floor` to a margin
    above the largest finite cost."""
    low = _cost_floor(points, log)
    ys = [y for _, y in points.values() if math.isfinite(y)]
    if log:
        low *= 0.8
        return low, max([y for y in ys if y > low] or [low * 10]) * 3
    return low, max([*ys, 0.1]) * 1.15


def _absent_points(ax, points: list[tuple[float, str]], offsets: list) -> None:
    """Each weight type without a cost, ``(bits, label)``, as a grey x at the top."""
    for (bits, label), offset in zip(points, offsets, strict=True):
        ax.plot(bits, 0.97, "x", color=DOMINATED, markersize=7, mew=1.5, clip_on=False,
                transform=ax.get_xaxis_transform())
        ax.annotate(label, (bits, 0.97), xycoords=ax.get_xaxis_transform(), xytext=offset,
                    textcoords="offset points", fontsize=7, color="#71717a")


def _bits_axes(ax, bits: tuple[float, float], costs: tuple[float, float], log: bool) -> None:
    """The axes of a Pareto panel: bits per weight from ``bits[0]`` to ``bits[1]`` on
    :func:`_bits_scale` (marked where it compresses), the costs over ``costs``, log or
    linear."""
    left, right = bits
    ax.set_xscale("function", functions=(_bits_scale, _bits_unscale))
    majors = [t for t in (2, 3, 4, 5, 6, 8, 16, 32) if left <= t <= right]
    ax.set_xticks(majors, [f"{t:g}" for t in majors])
    ax.set_xticks([], minor=True)
    ax.set_xlim(left, right)
    if right > COMPRESSED_BEYOND:
        ax.axvline(COMPRESSED_BEYOND, color="#d4d4d8", linestyle=(0, (2, 2)), linewidth=1)
    if log:
        ax.set_yscale("log")
    ax.set_ylim(*costs)
    ax.set_xlabel("bits per weight (compressed beyond 9)" if right > COMPRESSED_BEYOND
                  else "bits per weight")
    ax.grid(True, which="major", alpha=0.3)


def _point_label(weight_type: str, y: float, low: float, log: bool) -> str:
    """A point's label: its weight type, with its value where it is drawn on the bottom edge
    of a log axis (below it)."""
    if log and math.isfinite(y) and y < low:
        return f"{weight_type} {y:.0e}" if y > 0 else f"{weight_type} 0"
    return weight_type


def pareto_plot(sweep: Sweep) -> str:
    """The costs of a sweep (:class:`~audioparity.report.weight_types.Sweep`) against bits per
    weight, one panel per cost, as an ``<img>``; a note where no weight type has both bits per
    weight and a cost."""
    drawn = [m for m in sweep.costs
             if any(sweep.bits.get(w) is not None and v is not None
                    for w, v in m.values.items())]
    labels = sweep.labels
    if not drawn:
        return ('<p class="note">No weight type here has both its bits per weight and a cost '
                "(dumps written before their manifests gave their storage, or no stage "
                "compared).</p>")
    figure = Figure(figsize=(4.7 * len(drawn), 3.7), layout="constrained")
    axes = figure.subplots(1, len(drawn), squeeze=False)[0]
    for ax, measured in zip(axes, drawn, strict=True):
        _pareto_panel(ax, measured, sweep.bits)
    cases = len(sweep.cases)
    figure.suptitle(f"{labels['family']} · {labels['model']} · {labels['candidate']} · "
                    f"{labels['backend']}: cost against the float32 reference"
                    + (f", mean over {cases} cases" if cases > 1 else ""), fontsize=10.5)
    return _png(figure, f"cost against bits per weight, {labels['model']} "
                        f"{labels['candidate']} {labels['backend']}")
