"""The checks a dump of the contract and a tool's raw output folder share
(:mod:`.check`, :mod:`.check_raw`): each problem one line."""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from audioparity.contract.spec import FamilySpec, Stage
from audioparity.contract.vocabulary import StageKind
from audioparity.dumping.artifacts import _one_line, base_layout

#: The dtype of every tensor stage ("float32 unless said otherwise": no stage says otherwise).
FLOAT = "float32"
#: What ``candidate run`` adds to a tool's raw folder: its stdout, its stderr, and the files
#: ``prepare`` writes for it.
RUNNER_FILES = ("stdout.txt", "stderr.txt", "inputs")


@dataclass(frozen=True)
class Checked:
    """What :func:`check` found: the problems (one line each) and, for the ok line, what was
    checked (``a dump of parakeet_tdt: 12 tensors, 2 documents, layers 0..2``)."""

    problems: list[str]
    checked: str


@dataclass(frozen=True)
class Shaped:
    """A tensor stage found, for the shape checks: its shape in the stage's axis order."""

    stage: str  # concrete stage name (layer_3, layer_3_isolated)
    where: str  # the file, for messages
    shape: tuple[int, ...]
    layout: str  # the stage's layout in the spec
    rows: int = 0  # leading axes a view takes away (``("row", k)`` steps)
    drop: int = 0  # frames the candidate keeps beyond the stage's, dropped before comparing


def layout_axes(layout: str) -> list[str] | None:
    """The axes of a layout string (``[2T-1, D]`` -> ``["2T-1", "D"]``), a view's prefix
    (``view row(0) of [...]``) dropped; None when it is not ``[...]``."""
    text = base_layout(layout)
    if not (text.startswith("[") and text.endswith("]")):
        return None
    inner = text[1:-1].strip()
    return [axis.strip() for axis in inner.split(",")] if inner else []


def layout_fields(layout: str) -> list[str]:
    """The fields a document stage's layout names (``{ids, frames, durations, text}``), less
    ``...`` (more allowed)."""
    inner = layout.strip().removeprefix("{").removesuffix("}")
    return [f.strip() for f in inner.split(",") if f.strip() and f.strip() != "..."]


def layers_text(layers: set[int]) -> str:
    return f", layers 0..{max(layers)}" if layers else ""


def value_problems(where: str, array: np.ndarray, kind: str) -> list[str]:
    """NaN and infinite values of a float tensor of a stage of ``kind``: all of them, or how
    many (-inf allowed in a ``logits`` stage: a masked class)."""
    if array.dtype.kind != "f":
        return []
    logits = kind == StageKind.LOGITS
    counts = [(int(np.isnan(array).sum()), "NaN"), (int(np.isposinf(array).sum()), "+inf"),
              (0 if logits else int(np.isneginf(array).sum()), "-inf")]
    bad = sum(count for count, _ in counts)
    if not bad:
        return []
    amount = f"all {array.size}" if bad == array.size else f"{bad} of {array.size}"
    what = ", ".join(f"{count} {label}" for count, label in counts if count)
    allowed = " or -inf (a masked class)" if logits else ""
    return [f"{where}: {amount} values non-finite ({what}); expected finite values{allowed}"]


def shape_problems(items: list[Shaped], spec: FamilySpec) -> list[str]:
    """Rank and numeric axes of each tensor against its stage's layout; then every tensor of
    one layout against the commonest shape of that layout (the first in pipeline order on a
    tie), views aside."""
    problems = []
    groups: dict[str, list[Shaped]] = defaultdict(list)
    for item in sorted(items, key=lambda i: spec.stage_key(i.stage)):
        axes = layout_axes(item.layout)
        if axes is None:
            problems.append(f"{item.where}: stage {item.stage} has layout {item.layout!r}, "
                            "no axes to check; expected [A, B, ...] in the family's spec")
            continue
        axes = axes[item.rows:]
        if len(item.shape) != len(axes):
            less = f" less the {item.rows} row axis its view takes" if item.rows else ""
            problems.append(f"{item.where}: shape {list(item.shape)} has rank "
                            f"{len(item.shape)}; expected rank {len(axes)} (layout "
                            f"{item.layout}{less})")
            continue
        wrong = [(k, n, a) for k, (n, a) in enumerate(zip(item.shape, axes, strict=True))
                 if a.isdigit() and n != int(a)]
        for k, n, a in wrong:
            problems.append(f"{item.where}: shape {list(item.shape)} has {n} on axis {k}; "
                            f"expected {a} (layout {item.layout})")
        if not wrong and not item.rows:
            shape = (max(0, item.shape[0] - item.drop), *item.shape[1:]) if item.shape else ()
            groups["".join(item.layout.split())].append(
                Shaped(item.stage, item.where, shape, item.layout, drop=item.drop))
    for group in groups.values():
        counts = Counter(item.shape for item in group)
        most = max(counts.values())
        model = next(item for item in group if counts[item.shape] == most)
        for item in group:
            if item.shape != model.shape:
                dropped = f" (its last {item.drop} frame(s) dropped)" if item.drop else ""
                problems.append(f"{item.where}: shape {list(item.shape)}{dropped}; expected "
                                f"{list(model.shape)} like {model.stage} (every "
                                f"{model.layout} stage of a dump has one shape)")
    return problems


def document_problems(where: Path, stage: Stage, omits: list[str]) -> list[str]:
    """A document file that is missing, not JSON, not an object, or lacks a field of its
    stage (less ``omits``)."""
    fields = [f for f in layout_fields(stage.layout) if f not in omits]
    expected = f"expected an object with fields {', '.join(fields)}"
    if not where.is_file():
        return [f"{where}: missing; {expected} (stage {stage.name})"]
    try:
        document = json.loads(where.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        return [f"{where}: unreadable JSON ({_one_line(err)}); {expected}"]
    if not isinstance(document, dict):
        return [f"{where}: a JSON {type(document).__name__}; {expected} (stage {stage.name})"]
    lacking = [f for f in fields if f not in document]
    if lacking:
        return [f"{where}: lacks field(s) {', '.join(lacking)}; {expected} (stage "
                f"{stage.name} {stage.layout})"]
    return []


def missing_layers(present: set[int]) -> list[int]:
    """The layers a per-layer stage lacks: 0 when none is present, else the gaps below the
    highest."""
    return [0] if not present else [k for k in range(max(present)) if k not in present]
