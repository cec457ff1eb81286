"""Session-wide fixtures shared by the test files: the tiny Parakeet-TDT model, the project's
speech clip, and one NeMo reference dump of that clip."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

RESOURCES = Path(__file__).resolve().parent.parent / "resources"

# Hypothesis: HYPOTHESIS_PROFILE=ci runs 2000 examples per property (tests/test_fuzz.py);
# locally a few dozen. Tests that set max_examples themselves keep theirs.
settings.register_profile("ci", max_examples=2000, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


@pytest.fixture(scope="session")
def clip_wav() -> Path:
    """The project's own speech clip (16 kHz mono 16-bit, see resources/README.md)."""
    path = RESOURCES / "speech" / "clip.wav"
    assert path.is_file(), f"{path} is missing"
    return path


@pytest.fixture(scope="session")
def tiny_nemo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny v3-shaped Parakeet-TDT ``.nemo`` built once per session with seed 0."""
    from audioparity.models.parakeet_tdt.fixture import build_fixture

    path = tmp_path_factory.mktemp("parakeet_fixture") / "tiny.nemo"
    build_fixture(path, seed=0)
    return path


@pytest.fixture(scope="session")
def reference_dump(
    tiny_nemo: Path, clip_wav: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """The NeMo reference dump directory of ``clip_wav`` through ``tiny_nemo`` (1 thread)."""
    from audioparity.models.parakeet_tdt.reference import dump_reference

    output = tmp_path_factory.mktemp("parakeet_reference") / "clip"
    dump_reference(tiny_nemo, [(clip_wav, output)], threads=1)
    return output
