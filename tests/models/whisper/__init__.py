"""Tests of the Whisper encoder family; what its test files share: the gates the default config
gives the tiny fixture."""

from __future__ import annotations

from fnmatch import fnmatchcase

from tests import config_gates


def gate(weight_type: str, stage: str) -> dict:
    """The gate entry ``stage`` takes at ``weight_type`` (the first whose pattern matches)."""
    return next(entry for entry in config_gates("whisper", weight_type)["gates"]
                if fnmatchcase(stage, entry["stage"]))
