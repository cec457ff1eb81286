"""The test suite, laid out as src/audioparity is: one folder per package, one per model family
under models/. Shared session fixtures live in conftest.py."""

from pathlib import Path

import yaml

#: The checkout, and the small inputs it ships (the speech clip, the MOSS prompts).
REPO = Path(__file__).resolve().parent.parent
RESOURCES = REPO / "resources"
#: The MOSS prompt files the default sweep uses.
MOSS_PROMPTS = sorted((RESOURCES / "moss").glob("*.json"))


def config_gates(family: str, weight_type: str, model: str = "tiny") -> dict:
    """The gates config/config.yaml gives ``model`` of ``family`` on the CPU at ``weight_type``
    (:func:`audioparity.compare.resolve_gates`)."""
    from audioparity.compare import resolve_gates

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    return resolve_gates(config[family], model=model, backend="cpu", weight_type=weight_type)
