"""The registered model families (:class:`~audioparity.contract.family.Family` classes, one per
package under :mod:`audioparity.models`), and the spec of a family by its name, also for a
family this install does not know (a summary from elsewhere).
"""

from __future__ import annotations

import functools

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.contract.spec import AnySpec, UnknownFamily


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


@functools.cache
def spec_of(name: str | None) -> AnySpec:
    """The spec of the family ``name`` (a summary row's ``family``, a dump's), or
    :class:`~audioparity.contract.spec.UnknownFamily` for a family this install does not know
    (a summary from elsewhere), which reads its stage names by the suffix convention."""
    known = registered().get(name or "")
    return known.spec if known is not None else UnknownFamily(name or "")
