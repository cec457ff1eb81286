"""The registered model families (:class:`~audioparity.contract.family.Family` classes, one per
package under :mod:`audioparity.models`), and what the summary and the report ask of a family's
stages by its name, also for a family this install does not know (a summary from elsewhere).
"""

from __future__ import annotations

import functools

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.contract.spec import FORMS, Located, natural_key


@functools.cache
def registered() -> dict[str, Family]:
    """Every family, by name: each package's :class:`Family` class, instantiated.

    Importing a family package imports neither torch nor ggml: its methods import what they
    run.
    """
    from audioparity.models.moss_voicegen import MossVoicegen
    from audioparity.models.parakeet_tdt import ParakeetTdt
    from audioparity.models.whisper import Whisper

    families = [ParakeetTdt(), MossVoicegen(), Whisper()]
    return {family.spec.name: family for family in families}


def family(name: str) -> Family:
    """The family ``name``, or the one whose command it is (``parakeet-tdt``).

    Raises:
        AudioparityError: no family of that name or command (the message lists them).
    """
    families = registered()
    found = families.get(name) or next(
        (known for known in families.values() if known.spec.command == name), None)
    if found is None:
        raise AudioparityError(f"unknown family {name!r}; registered: {', '.join(families)}")
    return found


def _form_of(stage: str) -> tuple[str, int]:
    """``(stage, form index)`` of a name by the suffix convention ``<stage>_<form>``
    (:data:`~audioparity.contract.spec.FORMS`), for a family this install does not know."""
    for index, form in enumerate(FORMS[1:], 1):
        suffix = f"_{form}"
        if stage.endswith(suffix) and stage != suffix:
            return stage.removesuffix(suffix), index
    return stage, 0


@functools.cache
def locate(family_name: str | None, stage: str) -> Located | None:
    """:meth:`FamilySpec.locate` of a family's stage, once for each name (the report reads it
    for every row of a summary); None for a stage or family not registered here."""
    known = registered().get(family_name or "")
    return known.spec.locate(stage) if known is not None else None


@functools.cache
def stage_key(family_name: str, stage: str) -> tuple:
    """:meth:`FamilySpec.stage_key` of a family's stage; for a family not registered here,
    natural order with layer numbers numeric and ``<stage>_isolated``, ``<stage>_replayed``
    after ``<stage>``."""
    known = registered().get(family_name)
    if known is not None:
        return known.spec.stage_key(stage)
    base, form = _form_of(stage)
    return (0, natural_key(base), form)


def flow(family_name: str, names: list[str], reference: bool = False
         ) -> dict[str, tuple[tuple[str, ...], ...]]:
    """:meth:`FamilySpec.flow` of a family's stage names (``reference``: in a reference's own
    pipeline); for a family not registered here, the pipeline read as a chain: each stage's
    input is the stage before it in :func:`stage_key` order, a form has none."""
    known = registered().get(family_name)
    if known is not None:
        return known.spec.flow(names, reference)
    bases = sorted({_form_of(name)[0] for name in names},
                   key=lambda name: stage_key(family_name, name))
    before = dict(zip(bases[1:], bases[:-1], strict=True))
    return {name: ((before[name],) if name in before else (), ()) for name in names}


@functools.cache
def reference_stage(family_name: str | None, stage: str) -> str:
    """:meth:`FamilySpec.reference_stage` of a family's stage; for a family not registered
    here, ``<stage>_isolated`` and ``<stage>_replayed`` belong to ``<stage>``, any other name
    is its own."""
    known = registered().get(family_name or "")
    if known is not None:
        return known.spec.reference_stage(stage)
    return _form_of(stage)[0]


def stage_kind(family_name: str | None, stage: str) -> str | None:
    """The kind of a family's stage (``tensor``, ``logits``, ``document``), None for a stage or
    family not registered here."""
    found = locate(family_name, stage)
    return found.stage.kind if found is not None else None


def on_reference_path(family_name: str | None, stage: str) -> bool:
    """Whether a family's stage follows the reference's own decisions
    (:attr:`Stage.reference_path`); False for a stage or family not registered here."""
    found = locate(family_name, stage)
    return found is not None and found.stage.reference_path


def form_of(family_name: str | None, stage: str, form: str) -> str | None:
    """The ``isolated`` or ``replayed`` form of a family's stage (``layer_3`` ->
    ``layer_3_isolated``, ``decode`` -> ``decoder_replay``), None when the stage has none, is
    itself a form, or the family is not registered here."""
    found = locate(family_name, stage)
    if found is None or found.form:
        return None
    return found.form_name(form)
