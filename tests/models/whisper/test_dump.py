"""``audioparity ggml whisper`` as a subprocess on the tiny fixture and its reference dump:
the manifest lists every contract tensor with the reference's shapes and layouts, a backend that
is not built in gives status ``unavailable`` with exit code 0, and bad inputs leave nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ggml
import pytest

from audioparity.compare.metrics import nmse
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import RunSettings, dump_ggml
from audioparity.models.whisper import Whisper

FIELDS = ("family", "backend", "device", "weight_type", "threads", "n_layers",
          "n_decoder_layers")


def run_dump(model: Path, audio: Path, reference: Path, output: Path, *options: str):
    return subprocess.run(
        [sys.executable, "-m", "audioparity.cli", "ggml", "whisper", "--model",
         str(model), "--audio", str(audio), "--reference-dir", str(reference), "--output-dir",
         str(output), *options],
        capture_output=True, text=True, timeout=300,
    )


def test_dump_writes_every_stage(whisper_model, clip_wav, whisper_reference, tmp_path):
    output = tmp_path / "ggml"
    result = run_dump(whisper_model, clip_wav, whisper_reference, output,
                      "--weight-type", "f32", "--threads", "2")
    assert result.returncode == 0, result.stderr[-2000:]
    dump, reference = Dump(output), Dump(whisper_reference)
    manifest = dump.manifest
    assert dump.status == "ok" and manifest["producer"] == "ggml"
    assert {key: manifest[key] for key in FIELDS} == {
        "family": "whisper", "backend": "cpu", "device": 0, "weight_type": "f32",
        "threads": 2, "n_layers": reference.manifest["n_layers"],
        "n_decoder_layers": reference.manifest["n_decoder_layers"]}
    assert manifest["audio"] == reference.manifest["audio"]
    assert manifest["ggml_build"]["ggml_python"] == ggml.__version__
    assert manifest["device_description"]
    expected = set(reference.tensor_names) | {"layer_0_isolated", "layer_1_isolated",
                                              "decoder_layer_0_isolated",
                                              "decoder_layer_1_isolated",
                                              "decoder_replay_margins"}
    assert set(dump.tensor_names) == expected
    for name in dump.tensor_names:
        ref_name = name.removesuffix("_isolated").replace("decoder_replay", "decode")
        assert dump.tensor(name).shape == reference.tensor(ref_name).shape, name
        assert dump.layout(name) == reference.layout(ref_name), name
    assert set(manifest["documents"]) == {"decode", "decoder_replay"}
    # each phase named by the first stage it computes
    assert set(manifest["seconds"]) == {"load", "mel_features", "conv_out", "layer_0_isolated",
                                        "decoder_layer_0", "decode", "decoder_layer_0_isolated",
                                        "decoder_replay"}
    assert manifest["storage"]["types"] == {"f32": 89}


def test_q8_0_dump_stores_the_matmul_weights_in_q8_0(whisper_model, clip_wav, whisper_reference,
                                                     tmp_path):
    output = tmp_path / "q8"
    result = run_dump(whisper_model, clip_wav, whisper_reference, output, "--weight-type", "q8_0")
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(output)
    assert (dump.status, dump.manifest["weight_type"]) == ("ok", "q8_0")
    storage = dump.manifest["storage"]
    assert (storage["types"], storage["fallbacks"], storage["checkpoint_dtypes"]) == (
        {"f32": 56, "q8_0": 33}, [], ["f32"])
    assert len(storage["hashes"]) == len(storage["tensor_types"]) == 89
    assert 8.5 < dump.manifest["storage"]["bits_per_weight"] < 32


@pytest.mark.parametrize("backend", ["vulkan", "cuda"])
def test_backend_not_built_in_is_unavailable(backend, whisper_model, clip_wav, whisper_reference,
                                             tmp_path):
    if getattr(ggml, f"GGML_USE_{backend.upper()}", False):
        pytest.skip(f"{backend} is built into this ggml-python")
    output = tmp_path / backend
    result = run_dump(whisper_model, clip_wav, whisper_reference, output, "--backend", backend)
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(output)
    assert dump.status == "unavailable"
    assert backend in dump.manifest["message"]
    assert dump.tensor_names == [] and dump.manifest["documents"] == {}


def test_a_reference_lacking_a_stage_is_refused_and_nothing_is_left(whisper_model, clip_wav,
                                                                   whisper_reference, tmp_path):
    import shutil

    reference = tmp_path / "reference"
    shutil.copytree(whisper_reference, reference)
    manifest = (reference / "manifest.json").read_text()
    (reference / "manifest.json").write_text(manifest.replace('"conv_out": {', '"gone": {'))
    output = tmp_path / "out"
    with pytest.raises(AudioparityError, match="reference dump lacks conv_out"):
        dump_ggml(Whisper(), whisper_model, clip_wav, output, RunSettings("f32", "cpu", {}),
                  reference)
    assert not output.exists() and not (tmp_path / "out.partial").exists()
    result = run_dump(whisper_model, tmp_path / "missing.wav", whisper_reference, output)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines()[-1].endswith(
        "missing.wav: no such file; expected an audio file")
    assert not output.exists()


def test_q8_0_cell_passes_against_its_quantization_aware_reference(whisper_model, clip_wav,
                                                                   whisper_reference, tmp_path):
    """The q8_0 dump read and compared with the q8_0 reference (torch computing as ggml's CPU
    does with q8_0 matmul weights, the decoder's and the tied embeddings' included): every stage
    passes the q8_0 gates, and the decoder's stages fed the reference's inputs are far closer
    to it than to the float32 reference (their cost)."""
    from audioparity.dumping.emulation import emulated_dir
    from tests import cell_rows

    emulated = emulated_dir(whisper_reference, "q8_0")
    output = tmp_path / "q8"
    result = run_dump(whisper_model, clip_wav, emulated, output, "--weight-type", "q8_0")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = cell_rows(emulated, output, tmp_path / "cell.json", "whisper", "q8_0",
                     whisper_reference)
    assert {stage: row["status"] for stage, row in rows.items() if row["status"] != "pass"} == {}
    reference, f32 = Dump(emulated), Dump(whisper_reference)
    dump = Dump(output)
    for name in ("decoder_layer_0_isolated", "decoder_layer_1_isolated"):
        own = nmse(dump.tensor(name), reference.tensor(name.removesuffix("_isolated")))
        cost = nmse(dump.tensor(name), f32.tensor(name.removesuffix("_isolated")))
        assert cost > 1e6 * own, (name, own, cost)
