"""Tests of the Whisper encoder family; what its test files share: the gates the default config
gives the tiny fixture."""

from __future__ import annotations

from fnmatch import fnmatchcase

import yaml

from audioparity.compare import resolve_gates
from tests import REPO


def config_gates(weight_type: str) -> dict:
    """The gates config/config.yaml gives the tiny model on the CPU at ``weight_type``."""
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    return resolve_gates(config["whisper_encoder"], model="tiny", backend="cpu",
                         weight_type=weight_type)


def gate(weight_type: str, stage: str) -> dict:
    """The gate entry ``stage`` takes at ``weight_type`` (the first whose pattern matches)."""
    return next(entry for entry in config_gates(weight_type)["gates"]
                if fnmatchcase(stage, entry["stage"]))
