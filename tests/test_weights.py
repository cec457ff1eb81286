"""Weights converted once (``audioparity weights``) and mapped by a family's ggml dump: each
family's dump from the mapped file equals, file for file, its dump streamed from the model, and
a weights file converted from another model is refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.dumping.artifacts import Dump, dump_differences
from audioparity.dumping.driver import RunSettings, dump_ggml, dump_reference, save_weights
from audioparity.models.registry import family, registered
from tests import MOSS_PROMPTS


def defaults(known: Family, side: str) -> dict:
    """The family's options of ``side`` at their defaults."""
    return {option.name: option.default for option in known.spec.options_for(side)}


def dump(known: Family, model: Path, case: Path, output: Path, reference: Path | None,
         weights_file: Path | None = None):
    dump_ggml(known, model, case, output,
              RunSettings("q8_0", "cpu", defaults(known, "ggml"), weights_file=weights_file),
              reference)


@pytest.mark.parametrize("name", [n for n, f in registered().items() if f.spec.converts_weights])
def test_a_dump_from_mapped_weights_equals_the_dump_streamed_from_the_model(
        name, fixture_model, clip_wav, tmp_path):
    known = family(name)
    model = fixture_model(name)
    case = clip_wav if known.spec.input == "audio" else MOSS_PROMPTS[0]
    reference = None
    if known.spec.ggml_reads_reference:
        reference = tmp_path / "reference"
        dump_reference(known, model, [(case, reference)], options=defaults(known, "reference"))
    save_weights(known, model, tmp_path / "q8_0.gguf", weight_type="q8_0",
                 options=defaults(known, "weights"))
    dump(known, model, case, tmp_path / "streamed", reference)
    dump(known, model, case, tmp_path / "mapped", reference, weights_file=tmp_path / "q8_0.gguf")
    # the manifests name the weights file (a path the difference shortens); nothing else differs
    differences = dump_differences(tmp_path / "streamed", tmp_path / "mapped")
    assert len(differences) == 1, differences
    assert differences[0].startswith("manifest.json: 'weights_file' differs: null vs "), differences
    assert Dump(tmp_path / "mapped").manifest["weights_file"] == str(tmp_path / "q8_0.gguf")


def test_weights_converted_from_another_model_are_refused(moss_model, tmp_path):
    """The file records its model's sha256 and size and time: a model whose bytes changed since
    is refused (not silently computed with the old weights); one only touched is re-hashed."""
    model = tmp_path / "model"
    shutil.copytree(moss_model, model)
    weights = tmp_path / "q8_0.gguf"
    moss, prompt = family("moss_voicegen"), MOSS_PROMPTS[0]
    save_weights(moss, model, weights, weight_type="q8_0", options={})
    reference = tmp_path / "reference"
    dump_reference(moss, model, [(prompt, reference)], options=defaults(moss, "reference"))
    (model / "config.json").touch()
    dump(moss, model, prompt, tmp_path / "touched", reference, weights_file=weights)
    (model / "extra.txt").write_text("another file: another model\n")
    with pytest.raises(AudioparityError, match=r"weights file .*q8_0\.gguf was converted from "
                       r"another model than .*model; convert it again"):
        dump(moss, model, prompt, tmp_path / "changed", reference, weights_file=weights)
    assert not (tmp_path / "changed").exists()


@pytest.mark.parametrize("name", [n for n, f in registered().items() if f.spec.converts_weights])
@pytest.mark.parametrize("weight_type", ["q4_1", "q4_K"])
def test_our_weights_file_as_storage_is_the_quantization_aware_reference(
        name, weight_type, fixture_model, clip_wav, tmp_path):
    """Our port's converted weights given as a candidate's storage file: the storage-matched
    reference computes what the quantization-aware reference of the weight type computes, bit
    for bit (every tensor, document and stored hash; q4_1 with its block minimums' term): the
    two references are one arithmetic for our port."""
    from audioparity.dumping.weight_files import FileStorage

    known = family(name)
    model = fixture_model(name)
    case = clip_wav if known.spec.input == "audio" else MOSS_PROMPTS[0]
    options = defaults(known, "reference")
    save_weights(known, model, tmp_path / "w.gguf", weight_type=weight_type,
                 options=defaults(known, "weights"))
    dump_reference(known, model, [(case, tmp_path / "ref")], options=options,
                   emulate=[weight_type])
    dump_reference(known, model, [(case, tmp_path / "matched")], options=options,
                   emulate=FileStorage.read(tmp_path / "w.gguf", weight_type))
    emulated, matched = Dump(tmp_path / f"ref@{weight_type}"), Dump(tmp_path / "matched")
    assert emulated.manifest["storage"] == matched.manifest["storage"]
    differences = dump_differences(emulated.path, matched.path)
    assert all(d.startswith("manifest.json: 'emulates' differs") for d in differences), \
        differences
