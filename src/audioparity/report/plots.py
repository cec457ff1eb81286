"""The report's plots, PNGs embedded as base64: the error per layer (where drift starts, and
whether it is accumulated or local) and the key stages by weight type (each weight type's
cost against the float32 reference)."""

from __future__ import annotations

import base64
import html
import io
import itertools
import math
from collections.abc import Callable, Sequence

import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from audioparity.families import registered, stage_key
from audioparity.family import FORMS
from audioparity.report.summary import ordered
from audioparity.vocabulary import BACKENDS, OUR_PORT, WEIGHT_TYPES

#: The marker of each form of a per-layer stage (:data:`~audioparity.family.FORMS`): end to
#: end, isolated, replayed.
FORM_MARKERS = dict(zip(FORMS, ("o", "s", "^"), strict=True))
#: A colour per weight type (and per stage of the key stages), in the vocabulary's order.
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
           "#7f7f7f", "#bcbd22", "#17becf")


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
LINE_STYLES = ("-", (0, (5, 2)), (0, (1, 1.5)), (0, (5, 2, 1, 2)))


def per_layer(family: str, stage: str) -> tuple[int, str] | None:
    """``(layer, form)`` of a per-layer stage of a registered family, one whose spec's name
    holds the layer placeholder (``layer_3_isolated`` -> ``(3, "isolated")``); None for any
    other stage, and for every stage of a family this install does not know (a summary from
    elsewhere: its rows show in the other sections only)."""
    known = registered().get(family)
    found = known.spec.locate(stage) if known is not None else None
    if found is None or found.layer is None:
        return None
    return found.layer, found.form


def _layers(frame: pd.DataFrame) -> pd.DataFrame:
    """The rows of per-layer stages that have a cosine, with their ``layer`` and ``form``."""
    found = [per_layer(family, stage) for family, stage in zip(frame["family"], frame["stage"],
                                                               strict=True)]
    layers = frame.assign(layer=[f[0] if f else None for f in found],
                          form=[f[1] if f else "" for f in found])
    return layers[layers["layer"].notna() & (layers["cosine"] != "")]


def _layer_panel(ax, rows: pd.DataFrame, title: str, value: Callable[[pd.Series], float],
                 colours: dict[str, str], styles: dict[str, object]) -> None:
    """One panel of the per-layer plot: ``value`` per layer, a curve per (candidate, weight
    type, form)."""
    floor = _floor([value(r) for _, r in rows.iterrows()])
    for (candidate, weight_type, form), part in rows.groupby(
            ["candidate", "weight_type", "form"], sort=False):
        part = part.sort_values("layer")
        local = form != ""
        # native is drawn thin and on top: it often equals the type the checkpoint stores
        # (f32 or bf16), which would otherwise hide it
        width = (0.8 if weight_type == "native" else 1.4) * (0.6 if local else 1.0)
        _log_series(
            ax, list(part["layer"].astype(int)), [value(r) for _, r in part.iterrows()],
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


def layer_curves(frame: pd.DataFrame, colours: dict[str, str]) -> str:
    """Per (family, model, case, backend): error per layer; a colour per weight type, a line
    style per candidate; end to end thick with filled markers, the local forms (isolated:
    squares, replayed: triangles) thin with hollow ones."""
    images = []
    for (family, model, case, backend), rows in _layers(frame).groupby(
        ["family", "model", "case", "backend"], sort=False
    ):
        candidates = ordered(list(rows["candidate"].unique()), (OUR_PORT,))
        styles = {c: LINE_STYLES[i % len(LINE_STYLES)] for i, c in enumerate(candidates)}
        figure = Figure(figsize=(11, 3.3), layout="constrained")
        axes = figure.subplots(1, 2)
        for ax, (title, value) in zip(axes, LAYER_PANELS, strict=True):
            _layer_panel(ax, rows, title, value, colours, styles)
        axes[1].legend(handles=_layer_legend(rows, colours, styles), loc="upper left",
                       bbox_to_anchor=(1.02, 1), fontsize=8.5, frameon=False)
        figure.suptitle(f"{family} · {model} · {case} · {backend}", fontsize=11)
        images.append(_png(figure, f"per-layer error, {model} {case} {backend}"))
    if not images:
        return '<p class="note">No per-layer stages in this summary.</p>'
    return _LAYER_NOTE + "".join(images)


def _f32_nmse(row: pd.Series) -> float:
    """A row's NMSE against the float32 reference: its cost where it has one, else its own."""
    return float(row["cost_nmse"] if row["cost_nmse"] != "" else row["nmse"])


def by_weight_type(frame: pd.DataFrame) -> str:
    """Per (family, model, case): NMSE of each non-layer tensor stage against the float32
    reference across weight types (the cost of each weight type)."""
    layered = [per_layer(family, stage) is not None
               for family, stage in zip(frame["family"], frame["stage"], strict=True)]
    stages = frame[~pd.Series(layered, index=frame.index, dtype=bool) & (frame["nmse"] != "")]
    images = []
    for (family, model, case), rows in stages.groupby(["family", "model", "case"], sort=False):
        backends = ordered(list(rows["backend"].unique()), BACKENDS)
        figure = Figure(figsize=(3.6 * len(backends) + 2.2, 3.3), layout="constrained")
        axes = figure.subplots(1, len(backends), squeeze=False)[0]
        names = sorted(set(rows["stage"]), key=lambda s: stage_key(family, s))
        floor = _floor([_f32_nmse(r) for _, r in rows.iterrows()])
        candidates = ordered(list(rows["candidate"].unique()), (OUR_PORT,))
        styles = {c: LINE_STYLES[i % len(LINE_STYLES)] for i, c in enumerate(candidates)}
        for ax, backend in zip(axes, backends, strict=True):
            part = rows[rows["backend"] == backend]
            types = ordered(list(part["weight_type"].unique()), WEIGHT_TYPES)
            for (i, stage), candidate in itertools.product(enumerate(names), candidates):
                values = {r["weight_type"]: _f32_nmse(r) for _, r in part[
                    (part["stage"] == stage) & (part["candidate"] == candidate)].iterrows()}
                xs = [x for x, w in enumerate(types) if w in values]
                _log_series(ax, xs, [values[types[x]] for x in xs], floor,
                            color=PALETTE[i % len(PALETTE)], marker="o", markersize=4,
                            linewidth=1.2, linestyle=styles[candidate], label=stage)
            ax.set_xticks(range(len(types)), types)
            ax.set_yscale("log")
            ax.set_ylim(bottom=floor * 0.8)
            ax.set_title(f"{backend}: NMSE against f32 reference", fontsize=10)
            ax.grid(True, which="major", alpha=0.3)
        handles = [Line2D([], [], color=PALETTE[i % len(PALETTE)], marker="o", label=s)
                   for i, s in enumerate(names)]
        handles.extend(Line2D([], [], color="#52525b", linestyle=styles[c], label=c)
                       for c in candidates if len(candidates) > 1)
        axes[-1].legend(handles=handles, loc="upper left", bbox_to_anchor=(1.02, 1),
                        fontsize=8.5, frameon=False)
        figure.suptitle(f"{family} · {model} · {case}", fontsize=11)
        images.append(_png(figure, f"key stages by weight type, {model} {case}"))
    if not images:
        return '<p class="note">No tensor stages besides layers in this summary.</p>'
    return "".join(images)
