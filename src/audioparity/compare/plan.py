"""The rows a cell owes (:func:`plan_rows`: every reference stage, the candidate's own forms, a
replay's) and, for a row that is not compared, why (:data:`RULES`: a dump that crashed,
is unavailable, lacks the stage or never exposes it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, NamedTuple

from audioparity.compare.stage import not_exposed, stage_kinds, stored_weights_difference
from audioparity.contract.spec import AnySpec
from audioparity.dumping.artifacts import (
    CRASHED_IN,
    Dump,
)
from audioparity.models.registry import spec_of

#: The ``against`` label of a comparison with the reference dump.
REFERENCE = "reference"


class CellKey(NamedTuple):
    """One comparison of a sweep, by its labels (:data:`~audioparity.compare.cell.LABEL_COLUMNS`):
    a candidate's dump of a case against the reference, or against the same candidate on
    another backend (``against``: that backend), or a reference against the primary. Its gate
    lists are resolved by it (:func:`~audioparity.compare.gate_lists.resolve_gates`)."""

    family: str
    model: str
    candidate: str
    backend: str
    weight_type: str
    case: str
    against: str = REFERENCE


class Planned(NamedTuple):
    """One row of a cell, as :func:`_plan` lays it out.

    Attributes:
        stage: the row's stage (a replayed form's row is named by the form).
        cand_stage: the candidate's stage it measures.
        against: the dump it is measured against: the reference, or the replay.
        ref_stage: the stage there, None when that dump lacks it.
        kind: the candidate stage's kind, None when the candidate lacks it.
        ref_kind: the kind of the stage ``against`` holds (None when it lacks it).
    """

    stage: str
    cand_stage: str
    against: Dump
    ref_stage: str | None
    kind: str | None
    ref_kind: str | None


@dataclass
class Cell:
    """What every row of one cell reads: its dumps and what they say."""

    reference: Dump
    candidate: Dump | None
    candidate_path: Path
    replay: Dump | None
    cost: Dump | None
    #: The spec of the cell's family (its stage names, also a family this install does not
    #: know).
    family: AnySpec
    #: Each candidate stage against the stage of the same name (a comparison with another
    #: backend), rather than against its reference stage.
    same_stages: bool
    plan: list[Planned] = field(default_factory=list)
    #: The row stage a crashed dump died in (:func:`_crashed_stage`).
    crashed_in: str | None = None
    #: What was said in the case's audio, where the config gives it (``text`` of a case).
    known_text: str | None = None
    #: The other references' dumps of the case, by name (a float32 cell's).
    others: Mapping[str, Dump] = field(default_factory=dict)
    #: What ``reference`` is: ``reference``, or the backend it was computed on (the cell's
    #: ``against`` label).
    against: str = "reference"

    @cached_property
    def weights_differ(self) -> str | None:
        """Where the candidate's stored weights are not the reference's quantization of them
        (:func:`stored_weights_difference`), None where they are or cannot be told."""
        if self.candidate is None or self.same_stages:
            return None
        return stored_weights_difference(self.reference, self.candidate)

    @property
    def message(self) -> str:
        """The candidate's manifest message (or its status), "" without a candidate."""
        if self.candidate is None:
            return ""
        return self.candidate.manifest.get("message") or f"candidate {self.candidate.status}"

    @property
    def seconds(self) -> Mapping[str, float]:
        """The candidate's seconds per stage."""
        return self.candidate.manifest.get("seconds", {}) if self.candidate is not None else {}

    def wanted(self, stage: str) -> str:
        """The reference stage a candidate stage is compared with."""
        return stage if self.same_stages else self.family.reference_stage(stage)


def plan_rows(cell: Cell) -> list[Planned]:
    """The rows of a cell: every reference stage; then every candidate stage that is not a
    reference stage itself (an isolated form, compared with its stage as the family's spec
    says, or a stage the reference lacks; with ``same_stages``, the stage of the same name, as
    between two dumps of one candidate); then, with a replay, each candidate stage's replayed
    form (the candidate's stage against the replay's), in the order of the candidate's stages.
    A crashed dump of the family's own port also owes the isolated forms of the reference's
    stages. Two dumps of which neither holds a stage (each died before its first, or is
    unavailable) still owe one row: the stage a dump died in, else the family's first, so the
    cell never reads as empty.
    """
    reference, family = cell.reference, cell.family
    ref_kinds = stage_kinds(reference, family)
    cand_kinds = stage_kinds(cell.candidate, family) if cell.candidate is not None else {}
    plan = [Planned(name, name, reference, name, cand_kinds.get(name), kind)
            for name, kind in ref_kinds.items()]
    for name, kind in cand_kinds.items():
        if name not in ref_kinds:
            target = cell.wanted(name)
            known = target if target in ref_kinds else None
            plan.append(Planned(name, name, reference, known, kind, ref_kinds.get(target)))
    if cell.candidate is not None and _crashed_port(cell.candidate):
        for name in ref_kinds:
            form = family.form_of(name, "isolated")
            if form is not None and form not in cand_kinds and form not in ref_kinds:
                plan.append(Planned(form, form, reference, name, None, ref_kinds[name]))
    if not plan:
        stage = _first_owed(cell)
        if stage is not None:
            plan.append(Planned(stage, stage, reference, None, None, None))
    if cell.replay is not None:
        replay_kinds = stage_kinds(cell.replay, family)
        for name, kind in cand_kinds.items():
            form = family.form_of(name, "replayed")
            if form is not None:
                plan.append(Planned(form, name, cell.replay,
                                    form if form in replay_kinds else None, kind,
                                    replay_kinds.get(form)))
    return plan


def _first_owed(cell: Cell) -> str | None:
    """The stage a cell without a stage on either side owes: the one the candidate's dump, or
    else the reference's, died in; else its family's first (None for a family not registered
    here)."""
    for dump in (cell.candidate, cell.reference):
        if dump is not None and dump.manifest.get(CRASHED_IN):
            return dump.manifest[CRASHED_IN]
    stages = cell.family.stages
    return stages[0].name if stages else None


def _crashed_port(candidate: Dump) -> bool:
    """A crashed dump of the family's own ggml port (producer ``ggml``), whose isolated forms
    are stages it owed."""
    return candidate.status == "crashed" and candidate.manifest.get("producer") == "ggml"


def crashed_stage(family: AnySpec, lacking: Sequence[str], running: str | None
                  ) -> str | None:
    """The stage a dump that died was computing, of the stages it lacks: ``running`` (the
    stage its :class:`~audioparity.dumping.artifacts.DumpWriter` named as running, a family's
    :class:`~audioparity.contract.family.Phase`) when it lacks it, else the first it lacks in
    pipeline order (a dump that names none: a third-party tool's); None when it lacks none. The
    crashed cell's rows (:data:`RULES`) and a run again that died
    (:func:`~audioparity.compare.fresh.fresh_rows`) both charge the crash to it."""
    if running in lacking:
        return running
    return min(lacking, key=family.stage_key, default=None)


def _crashed_stage(cell: Cell) -> str | None:
    """The row stage a crashed dump died in (:func:`crashed_stage` of its manifest's
    ``crashed_in``, of the stages it lacks and does not say it never exposes); None for a
    dump that did not crash."""
    candidate, family = cell.candidate, cell.family
    if candidate is None or candidate.status != "crashed":
        return None
    lacking = [row.stage for row in cell.plan
               if row.kind is None and not not_exposed(candidate, family, row.stage)]
    return crashed_stage(family, lacking, candidate.manifest.get(CRASHED_IN))


class Rule(NamedTuple):
    """A row that is not compared: when ``when(cell, row)`` holds, its status and reason."""

    when: Callable[[Cell, Planned], Any]
    status: str
    why: Callable[[Cell, Planned], str]


def _lacks(cell: Cell, row: Planned) -> bool:
    """The candidate dump lacks the row's stage."""
    return row.kind is None


def _crashed(cell: Cell, row: Planned) -> bool:
    return _lacks(cell, row) and cell.candidate.status == "crashed"


def _unreadable(cell: Cell, row: Planned) -> str | None:
    return cell.candidate.manifest.get("unreadable", {}).get(row.stage)


def lacking_dump(side: str, dump: Dump) -> str:
    """Why a stage is not compared because the dump of ``side`` (``reference``, or the
    backend a cell is compared with: ``cpu``) did not finish: ``the cpu dump crashed in
    layer_1 (exit code -6: ...)``, ``the cpu dump is unavailable (...)``. A drill-down tells
    the side of a row not compared by it (:func:`lacked_by`)."""
    where = dump.manifest.get(CRASHED_IN)
    state = f"crashed in {where}" if dump.status == "crashed" and where else (
        "crashed" if dump.status == "crashed" else f"is {dump.status}")
    return f"the {side} dump {state} ({dump.manifest.get('message') or dump.status})"


def lacked_by(reason: str, side: str) -> bool:
    """Whether a row's ``reason`` says that the dump of ``side`` lacked its stage
    (:func:`lacking_dump`), rather than the candidate's."""
    return reason.startswith(f"the {side} dump ")


def _not_replayed(cell: Cell, row: Planned) -> str:
    why = cell.replay.manifest.get("skipped", {}).get(row.stage)
    return f"not replayed: {why or f'not in the replay dump {cell.replay.path}'}"


#: The rows that are not compared, tried in order: a crashed dump keeps the stages it finished;
#: the one it died in is crashed, the others it lacks were never computed, but for those it
#: never exposes (a third-party tool's, recorded as it died).
RULES = (
    Rule(lambda cell, row: cell.candidate is None, "missing",
         lambda cell, row: f"no candidate dump at {cell.candidate_path}"),
    Rule(lambda cell, row: cell.candidate.status == "unavailable", "unavailable",
         lambda cell, row: cell.message),
    Rule(lambda cell, row: _crashed(cell, row) and row.stage == cell.crashed_in, "crashed",
         lambda cell, row: cell.message),
    Rule(lambda cell, row: _lacks(cell, row) and not_exposed(cell.candidate, cell.family,
                                                             row.stage),
         "unavailable", lambda cell, row: not_exposed(cell.candidate, cell.family, row.stage)),
    Rule(_crashed, "missing",
         lambda cell, row: "not computed: the dump crashed in "
                           f"{cell.crashed_in or cell.candidate.manifest.get(CRASHED_IN)} "
                           f"({cell.message})"),
    Rule(lambda cell, row: _lacks(cell, row) and _unreadable(cell, row), "missing",
         lambda cell, row: f"the candidate's file is unreadable: {_unreadable(cell, row)}"),
    Rule(_lacks, "missing",
         lambda cell, row: f"not in the candidate dump {cell.candidate_path}"),
    Rule(lambda cell, row: row.ref_stage is None and row.against is cell.replay, "missing",
         _not_replayed),
    Rule(lambda cell, row: row.ref_stage is None and cell.reference.status != "ok", "missing",
         lambda cell, row: f"{lacking_dump(cell.against, cell.reference)}: it has no "
                           f"{cell.wanted(row.stage)!r}"),
    Rule(lambda cell, row: row.ref_stage is None, "missing",
         lambda cell, row: f"no reference stage {cell.wanted(row.stage)!r} in "
                           f"{cell.reference.path}"),
)


def availability(cell: Cell, row: Planned) -> tuple[str, tuple[str, ...]]:
    """``ok``, or the status of a row that is not compared and why (the first of
    :data:`RULES` that holds)."""
    for rule in RULES:
        if rule.when(cell, row):
            return rule.status, (rule.why(cell, row),)
    return "ok", ()


@dataclass(frozen=True)
class CellDumps:
    """The dumps a cell compares: the ``reference``'s and the ``candidate``'s (absent: every
    stage ``missing``), and beside them, where given, the reference's ``replay`` of the
    candidate, the float32 reference of a quantized cell (its ``cost``) and the ``others``
    references' dumps of the case, by name."""

    reference: str | os.PathLike
    candidate: str | os.PathLike
    replay: str | os.PathLike | None = None
    cost: str | os.PathLike | None = None
    others: Mapping[str, str | os.PathLike] = field(default_factory=dict)


def open_cell(dumps: CellDumps, labels: Mapping[str, str], known_text: str | None = None
              ) -> Cell:
    """The dumps of a cell read, and its rows planned (:func:`compare_cell`'s arguments).

    Raises:
        AudioparityError: an unreadable dump.
    """
    candidate_path = Path(dumps.candidate)
    reference = Dump(dumps.reference)
    cell = Cell(
        reference=reference,
        candidate=Dump(candidate_path) if candidate_path.exists() else None,
        candidate_path=candidate_path,
        replay=Dump(dumps.replay) if dumps.replay is not None else None,
        cost=Dump(dumps.cost) if dumps.cost is not None else None,
        family=spec_of(labels.get("family") or reference.manifest.get("family")),
        same_stages=labels.get("against", REFERENCE) != REFERENCE,
        known_text=known_text,
        others={name: Dump(path) for name, path in dumps.others.items()},
        against=labels.get("against", REFERENCE),
    )
    cell.plan = plan_rows(cell)
    cell.crashed_in = _crashed_stage(cell)
    return cell
