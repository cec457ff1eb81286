"""The test suite, laid out as src/audioparity is: one folder per package, one per model family
under models/. Shared session fixtures live in conftest.py."""

from pathlib import Path

#: The checkout, and the small inputs it ships (the speech clip, the MOSS prompts).
REPO = Path(__file__).resolve().parent.parent
RESOURCES = REPO / "resources"
#: The MOSS prompt files the default sweep uses.
MOSS_PROMPTS = sorted((RESOURCES / "moss").glob("*.json"))
