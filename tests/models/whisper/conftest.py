"""The tiny Whisper checkpoint and its reference dump of the shipped clip, shared by this
folder's tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def whisper_model(fixture_model) -> Path:
    """The tiny Whisper checkpoint directory (seed 0)."""
    return fixture_model("whisper")


@pytest.fixture(scope="session")
def whisper_reference(whisper_model: Path, clip_wav: Path,
                      tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The transformers reference dump directory of ``clip_wav`` (1 thread), with its q8_0
    quantization-aware twin beside it (``clip@q8_0``)."""
    from audioparity.driver import dump_reference
    from audioparity.models.whisper import Whisper

    output = tmp_path_factory.mktemp("whisper_reference") / "clip"
    dump_reference(Whisper(), whisper_model, [(clip_wav, output)], options={},
                   threads=1, emulate=["q8_0"])
    return output
