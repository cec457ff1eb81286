"""``audioparity ggml parakeet-tdt`` as a subprocess on the tiny fixture and its reference dump:
the manifest lists every contract tensor with the reference's shapes, and a backend that is not
built in gives status ``unavailable`` with exit code 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import ggml
import pytest

from audioparity.dumping.artifacts import Dump
from audioparity.models.parakeet_tdt.greedy import replay_path

FIELDS = ("family", "backend", "weight_type", "conv_weight_type", "threads", "flash_attention",
          "n_layers")


def run_dump(model: Path, audio: Path, reference: Path, output: Path, *options: str):
    return subprocess.run(
        [sys.executable, "-m", "audioparity.cli", "ggml", "parakeet-tdt", "--model", str(model),
         "--audio", str(audio), "--reference-dir", str(reference), "--output-dir", str(output),
         *options],
        capture_output=True, text=True, timeout=300,
    )


def test_dump_lists_every_contract_tensor(parakeet_model, clip_wav, parakeet_reference, tmp_path):
    output = tmp_path / "ggml"
    result = run_dump(parakeet_model, clip_wav, parakeet_reference, output,
                      "--weight-type", "f32", "--threads", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    dump, reference = Dump(output), Dump(parakeet_reference)
    manifest = dump.manifest
    assert dump.status == "ok"
    assert manifest["producer"] == "ggml"
    assert {key: manifest[key] for key in FIELDS} == {
        "family": "parakeet_tdt", "backend": "cpu", "weight_type": "f32",
        "conv_weight_type": "f32", "threads": 1, "flash_attention": False,
        "n_layers": reference.manifest["n_layers"],
    }
    n_layers = manifest["n_layers"]
    shared = ["mel_features", "pre_encode", "pos_emb", "enc_out", "joint_logits",
              "lstm_state_0", "decode_logits", *(f"layer_{i}" for i in range(n_layers))]
    expected = set(shared) | {f"layer_{i}_isolated" for i in range(n_layers)}
    assert set(dump.tensor_names) == expected
    for name in dump.tensor_names:
        ref_name = name.removesuffix("_isolated")
        assert dump.tensor(name).shape == reference.tensor(ref_name).shape, name
        assert dump.layout(name) == reference.layout(ref_name), name
    for document in ("decode", "decoder_replay"):
        assert set(dump.json(document)) == {"ids", "frames", "durations", "text"}
    assert dump.json("decoder_replay") == reference.json("decode")
    # a phase per stage it computes apart: each layer end to end and alone
    assert set(manifest["seconds"]) == {"load", "mel_features", "pos_emb", "pre_encode",
                                        *(f"layer_{i}{form}" for i in range(n_layers)
                                          for form in ("", "_isolated")),
                                        "joint_logits", "decoder_replay", "decode",
                                        "decode_logits"}
    assert manifest["decisions"] == reference.manifest["decisions"]
    # decode_logits is the decode teacher-forced along the reference's path on our enc_out:
    # where our free-running decode is the reference's (f32, the clip), the greedy rules over
    # its rows give that decode back, row for row
    decoding = manifest["decoding"]
    path = replay_path(dump.tensor("decode_logits"), dump.tensor("enc_out").shape[0],
                       decoding["durations"], decoding["max_symbols"])
    assert dump.json("decode") == reference.json("decode")
    assert [path.ids, path.frames, path.durations] == [
        dump.json("decode")[key] for key in ("ids", "frames", "durations")]


def test_quantized_flash_attention_dump_runs(parakeet_model, clip_wav, parakeet_reference,
                                             tmp_path):
    output = tmp_path / "q8"
    result = run_dump(parakeet_model, clip_wav, parakeet_reference, output, "--weight-type",
                      "q8_0", "--conv-weight-type", "f16", "--flash-attention", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(output)
    assert (dump.status, dump.manifest["weight_type"], dump.manifest["flash_attention"]) == (
        "ok", "q8_0", True)
    assert dump.has("decode") and dump.has("joint_logits")


@pytest.mark.parametrize("backend", ["vulkan", "cuda"])
def test_backend_not_built_in_is_unavailable(backend, parakeet_model, clip_wav, parakeet_reference,
                                             tmp_path):
    if getattr(ggml, f"GGML_USE_{backend.upper()}", False):
        pytest.skip(f"{backend} is built into this ggml-python")
    output = tmp_path / backend
    result = run_dump(parakeet_model, clip_wav, parakeet_reference, output, "--backend", backend)
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(output)
    assert dump.status == "unavailable"
    assert backend in dump.manifest["message"]
    assert dump.tensor_names == [] and dump.manifest["documents"] == {}


def test_manifest_records_which_ggml_build_computed(tmp_path: Path, parakeet_model: Path,
                                                    clip_wav: Path,
                                                    parakeet_reference: Path) -> None:
    """llamafile and BLAS builds change the matmul kernels: a dump says which one it ran."""
    from tests.models.parakeet_tdt import ggml_dump

    out = tmp_path / "dump"
    ggml_dump(parakeet_model, clip_wav, out, reference_dir=parakeet_reference)
    build = Dump(out).manifest["ggml_build"]
    assert build["ggml_python"] == ggml.__version__
    assert ("llamafile" in build["cpu_features"]) == bool(ggml.ggml_cpu_has_llamafile())


def test_an_xscaling_model_passes_at_f32_its_isolated_layers_included(fixture_model, clip_wav,
                                                                     tmp_path):
    """NeMo's ConformerEncoder scales pre_encode by sqrt(d_model) by default (v3 turns it
    off): layer 0 alone must get the reference's pre_encode scaled once, as NeMo scales it
    (it was scaled twice, and layer_0_isolated failed with cosine 0.9998)."""
    from audioparity.models.parakeet_tdt.config import load_config
    from tests import cell_rows
    from tests.models.parakeet_tdt import reference_dump

    model = fixture_model("parakeet_tdt", xscaling=True)
    assert load_config(model).encoder.xscale == pytest.approx(8.0)  # d_model 64
    reference = tmp_path / "reference"
    reference_dump(model, [(clip_wav, reference)], threads=1)
    result = run_dump(model, clip_wav, reference, tmp_path / "ggml", "--weight-type", "f32",
                      "--threads", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = cell_rows(reference, tmp_path / "ggml", tmp_path / "cell.json")
    failing = {stage: row["reason"] for stage, row in rows.items() if row["status"] != "pass"}
    assert not failing, failing
    assert rows["layer_0_isolated"]["nmse"] < 1e-11
