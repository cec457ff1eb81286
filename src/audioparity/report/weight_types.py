"""The cost of each weight type of a sweep, against its bits per weight, read from summary.csv.

For each (family, model, candidate, backend) of the comparisons with the reference, a
:class:`Sweep` holds, per weight type: the bits per weight the candidate stored its weights at
(``bits_per_weight``), the tensors that fell back to another type (``fallbacks``,
``fallback_tensors``), the statuses of its stages, and three costs, each the mean over the
model's cases of one stage measured against the float32 reference (:data:`COSTS`):

- the NMSE of the last tensor stage of the trunk (a head's own state, such as the transducer's
  ``lstm_state_0``, only where the trunk has none);
- the WER of the last document stage (the decode), or 1 − its token match where the document
  has no text (MOSS's ``generation``);
- the KL of the last logits stage.

Only end-to-end stages count (no isolated or replayed form), and none whose rows follow the
reference's own decisions (``Stage.reference_path``: Parakeet's ``joint_logits``, Whisper's
teacher-forced decoder), which have no cost. A quantized cell's cost is its ``cost_*`` column
(its own reference being quantization-aware); a cell compared with the float32 reference itself
(``f32``, ``native``: no ``cost_*`` value on any of its rows) costs its own metric. A cost is
None unless every case of the model has it.

:func:`pareto_front` gives the weight types no other one beats on both bits and cost.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pandas as pd

from audioparity.compare.cell import COST_COLUMNS, FALLBACK_SEPARATOR
from audioparity.contract.vocabulary import OUR_PORT, WEIGHT_TYPES
from audioparity.models.registry import spec_of
from audioparity.report.summary import ordered, rows_of


@dataclass(frozen=True)
class Cost:
    """One cost of a sweep: a stage kind, the metric read, how it reads.

    Attributes:
        kind: the kind of stage it measures (``tensor``, ``document``, ``logits``).
        metrics: the metrics it reads, the first the chosen stage has any value of being
            used (``wer``, then ``token_match`` for a document).
        log: whether it is drawn on a log axis.
    """

    kind: str
    metrics: tuple[str, ...]
    log: bool


#: The costs of a sweep, one plot panel each: NMSE of the last tensor stage, WER (or token
#: mismatch) of the decode, KL of the last logits stage.
COSTS = (Cost("tensor", ("nmse",), True), Cost("document", ("wer", "token_match"), False),
         Cost("logits", ("kl",), True))

#: How each metric a cost reads is named in the report (token match as its complement, so
#: that every cost is lower-is-better).
COST_NAMES = {"nmse": "NMSE", "wer": "WER", "token_match": "1 − token match", "kl": "KL"}


@dataclass
class Measured:
    """One cost of one sweep, per weight type.

    Attributes:
        cost: what is measured (:data:`COSTS`).
        stage: the stage it is measured at, None where the sweep has none.
        metric: the metric read (of ``cost.metrics``).
        values: weight type -> the mean over the cases (``token_match`` as 1 − it; NaN when a
            case's is), None when a case lacks it.
    """

    cost: Cost
    stage: str | None
    metric: str
    values: dict[str, float | None] = field(default_factory=dict)

    @property
    def title(self) -> str:
        """``NMSE of enc_out`` (the metric as :data:`COST_NAMES` names it, the stage)."""
        return f"{COST_NAMES[self.metric]} of {self.stage}"


@dataclass
class Sweep:
    """The weight types of one (family, model, candidate, backend), compared with the reference.

    Attributes:
        labels: family, model, candidate, backend.
        cases: the model's cases, in summary order.
        weight_types: in the vocabulary's order (others, ``<base>+<recipe>``, after it).
        bits: weight type -> bits per weight (None where its dumps do not say).
        fallbacks: weight type -> how many tensors fell back (None where unknown).
        fallback_lines: weight type -> the fallback lines (``<tensor> [shape]: a -> b``).
        statuses: weight type -> count of each status over its stages and cases.
        costs: one :class:`Measured` per :data:`COSTS` entry whose kind the sweep has.
    """

    labels: dict[str, str]
    cases: list[str]
    weight_types: list[str]
    bits: dict[str, float | None]
    fallbacks: dict[str, int | None]
    fallback_lines: dict[str, list[str]]
    statuses: dict[str, Counter]
    costs: list[Measured]


def _float(text: str) -> float | None:
    """A summary field as a float, None when empty (``nan`` is NaN)."""
    return float(text) if text != "" else None


def _kind(family: str, stage: str, rows: pd.DataFrame) -> str:
    """A stage's kind: its family's spec's, else read from its rows' metrics (``kl`` on some
    row: logits; ``token_match``: a document; else a tensor)."""
    found = spec_of(family).locate(stage)
    if found is not None:
        return found.stage.kind
    if ((rows["kl"] != "") | (rows["cost_kl"] != "")).any():
        return "logits"
    if ((rows["token_match"] != "") | (rows["cost_token_match"] != "")).any():
        return "document"
    return "tensor"


def _trunk(family: str, stage: str) -> bool:
    """Whether a stage belongs to every model of its family (no ``head``), True for a stage
    of a family this install does not know."""
    found = spec_of(family).locate(stage)
    return found is None or found.stage.head is None


def costed_cells(frame: pd.DataFrame) -> set[tuple]:
    """The cells (model, case, candidate, backend, weight type) with a ``cost_*`` value on
    some row: those compared with a quantization-aware reference."""
    has = (frame[list(COST_COLUMNS)] != "").any(axis=1)
    keys = ["family", "model", "case", "candidate", "backend", "weight_type"]
    return set(frame.loc[has, keys].drop_duplicates().itertuples(index=False, name=None))


def cost_value(row: Mapping[str, str], metric: str, costed: bool) -> float | None:
    """A row's ``metric`` against the float32 reference: its ``cost_<metric>`` in a costed cell
    (:func:`costed_cells`), its own ``metric`` in another; ``token_match`` as 1 − it; None
    where it has none."""
    value = _float(row[f"cost_{metric}"] if costed else row[metric])
    if value is not None and metric == "token_match":
        return 1.0 - value
    return value


def _mean(values: Sequence[float | None], cases: int) -> float | None:
    """The mean of one value per case, None unless every case has one."""
    if len(values) != cases or any(v is None for v in values):
        return None
    return math.fsum(values) / len(values)


#: The columns a cost is read from (:func:`_measure`).
READ = ("model", "case", "candidate", "backend", "weight_type",
        *(m for cost in COSTS for m in cost.metrics),
        *(f"cost_{m}" for cost in COSTS for m in cost.metrics))


def _measure(cost: Cost, family: str, rows: pd.DataFrame, cases: list[str],
             costed: set[tuple]) -> Measured | None:
    """``cost`` of one sweep's rows, per weight type: the last eligible stage of its kind with
    a value of one of its metrics (module docstring), read in the first of them that stage
    has (a decode's WER, a generation's token match beside a prompt's WER); None where no
    stage has one."""
    def is_costed(row: Mapping[str, str]) -> bool:
        return (family, row["model"], row["case"], row["candidate"], row["backend"],
                row["weight_type"]) in costed

    eligible = {stage: rows_of(part, READ) for stage, part in rows.groupby("stage", sort=False)
                if spec_of(family).reference_stage(stage) == stage
                and not spec_of(family).on_reference_path(stage)
                and _kind(family, stage, part) == cost.kind}
    valued = {}  # stage -> the first of the cost's metrics it has a value of
    for stage, part in eligible.items():
        ranks = [rank for rank, metric in enumerate(cost.metrics) for r in part
                 if cost_value(r, metric, is_costed(r)) is not None]
        if ranks:
            valued[stage] = min(ranks)
    if not valued:
        return None
    stage = max(valued, key=lambda s: (_trunk(family, s), spec_of(family).stage_key(s)))
    metric = cost.metrics[valued[stage]]
    measured = Measured(cost, stage, metric)
    per_type: dict[str, dict[str, float | None]] = {}
    for r in eligible[stage]:
        per_type.setdefault(r["weight_type"], {})[r["case"]] = cost_value(r, metric,
                                                                           is_costed(r))
    for weight_type, per_case in per_type.items():
        measured.values[weight_type] = _mean([per_case.get(c) for c in cases], len(cases))
    return measured


def _storage(part: pd.DataFrame) -> tuple[float | None, int | None, list[str]]:
    """Bits per weight, fallback count and fallback lines of one weight type's rows (the first
    row that says; the lines of every case, each once)."""
    bits = next((float(v) for v in part["bits_per_weight"] if v != ""), None)
    count = next((int(float(v)) for v in part["fallbacks"] if v != ""), None)
    lines = [line for text in dict.fromkeys(part["fallback_tensors"]) if text
             for line in text.split(FALLBACK_SEPARATOR)]
    return bits, count, list(dict.fromkeys(lines))


def sweeps(frame: pd.DataFrame) -> list[Sweep]:
    """One :class:`Sweep` per (family, model, candidate, backend) of ``frame`` (summary rows
    compared with the reference, in summary order; candidates ours first)."""
    costed = costed_cells(frame)
    found = []
    for (family, model), rows in frame.groupby(["family", "model"], sort=False):
        by_candidate = dict(list(rows.groupby("candidate", sort=False)))
        for candidate in ordered(list(by_candidate), (OUR_PORT,)):
            for backend, part in by_candidate[candidate].groupby("backend", sort=False):
                found.append(_sweep(family, model, candidate, backend, part, costed))
    return found


def _sweep(family: str, model: str, candidate: str, backend: str, rows: pd.DataFrame,
           costed: set[tuple]) -> Sweep:
    cases = list(dict.fromkeys(rows["case"]))
    types = ordered(list(rows["weight_type"].unique()), WEIGHT_TYPES)
    sweep = Sweep({"family": family, "model": model, "candidate": candidate,
                   "backend": backend}, cases, types, {}, {}, {}, {}, [])
    by_type = dict(list(rows.groupby("weight_type", sort=False)))
    for weight_type in types:
        part = by_type[weight_type]
        bits, count, lines = _storage(part)
        sweep.bits[weight_type], sweep.fallbacks[weight_type] = bits, count
        sweep.fallback_lines[weight_type] = lines
        sweep.statuses[weight_type] = Counter(part["status"])
    for cost in COSTS:
        measured = _measure(cost, family, rows, cases, costed)
        if measured is not None:
            sweep.costs.append(measured)
    return sweep


def pareto_front(points: Mapping[str, tuple[float, float]]) -> list[str]:
    """The labels of the points that no other point dominates, by increasing x.

    Args:
        points: label -> (x, y), both to be minimised (bits per weight, cost). A point with a
            non-finite coordinate is on no front and dominates none.

    Returns:
        The labels of the finite points for which no other finite point has x and y both at
        most theirs and one of them below (equal points are both on the front), sorted by x,
        then y, then label.
    """
    finite = {k: (x, y) for k, (x, y) in points.items()
              if math.isfinite(x) and math.isfinite(y)}
    front = [k for k, (x, y) in finite.items()
             if not any(x2 <= x and y2 <= y and (x2 < x or y2 < y)
                        for x2, y2 in finite.values())]
    return sorted(front, key=lambda k: (*finite[k], k))
