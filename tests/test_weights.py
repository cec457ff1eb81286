"""Weights converted once (``audioparity weights``) and mapped by a family's ggml dump: each
family's dump from the mapped file equals, file for file, its dump streamed from the model, and
a weights file converted from another model is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from audioparity.artifacts import dump_differences
from audioparity.errors import AudioparityError
from audioparity.families import WEIGHTS, family, registered
from tests import MOSS_PROMPTS


def dump(spec, model: Path, case: Path, output: Path, reference: Path | None, **weights):
    extra = {"reference_dir": reference} if spec.ggml_reads_reference else {}
    spec.entry_point("ggml")(model, case, output, weight_type="q8_0", backend="cpu", **extra,
                             **weights)


@pytest.mark.parametrize("name", [n for n, s in registered().items() if WEIGHTS in s.entry_points])
def test_a_dump_from_mapped_weights_equals_the_dump_streamed_from_the_model(
        name, fixture_model, clip_wav, tmp_path):
    spec = family(name)
    model = fixture_model(name)
    case = clip_wav if spec.input == "audio" else MOSS_PROMPTS[0]
    reference = None
    if spec.ggml_reads_reference:
        reference = tmp_path / "reference"
        spec.entry_point("reference")(model, [(case, reference)], threads=1)
    spec.entry_point(WEIGHTS)(model, tmp_path / "q8_0.gguf", weight_type="q8_0")
    dump(spec, model, case, tmp_path / "streamed", reference)
    dump(spec, model, case, tmp_path / "mapped", reference, weights_file=tmp_path / "q8_0.gguf")
    assert dump_differences(tmp_path / "streamed", tmp_path / "mapped") == [
        f"manifest.json: 'weights_file' differs: null vs \"{tmp_path / 'q8_0.gguf'}\""]


def test_weights_converted_from_another_model_are_refused(moss_model, tmp_path):
    """The file records its model's sha256 and size and time: a model whose bytes changed since
    is refused (not silently computed with the old weights); one only touched is re-hashed."""
    model = tmp_path / "model"
    shutil.copytree(moss_model, model)
    weights = tmp_path / "q8_0.gguf"
    family("moss_voicegen").entry_point(WEIGHTS)(model, weights, weight_type="q8_0")
    spec, prompt = family("moss_voicegen"), MOSS_PROMPTS[0]
    (model / "config.json").touch()
    dump(spec, model, prompt, tmp_path / "touched", None, weights_file=weights)
    (model / "extra.txt").write_text("another file: another model\n")
    with pytest.raises(AudioparityError, match=r"weights file .*q8_0\.gguf was converted from "
                       r"another model than .*model; convert it again"):
        dump(spec, model, prompt, tmp_path / "changed", None, weights_file=weights)
    assert not (tmp_path / "changed").exists()
