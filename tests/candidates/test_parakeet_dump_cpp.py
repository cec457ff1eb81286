"""The ``parakeet_dump_cpp`` adapter (a tool with the seed ``dump_cpp_reference``'s command line)
run on the stand-in ``tests/standins/parakeet_dump_cpp.py`` (that command line over our ggml
port): its commands, its prepared ``--nemo-dir``, the stand-in's refusals as the seed's, and a
cell whose stages pass at f32 against the NeMo reference."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys

import numpy as np
import pytest

from audioparity.candidates import ToolCall, load_adapter
from audioparity.candidates.running import CandidateEntry, run_candidate
from audioparity.compare.cell import compare_cell
from audioparity.compare.plan import CellDumps
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.driver import RunSettings
from audioparity.models.registry import family
from tests import REPO, config_gates

STANDIN = REPO / "tests" / "standins" / "parakeet_dump_cpp.py"
#: The stand-in as the adapter's ``binary`` option: an interpreter and its script.
BINARY = f"{shlex.quote(sys.executable)} {shlex.quote(str(STANDIN))}"
#: The stages the tool's files map to, each compared against the NeMo reference.
STAGES = ("mel_features", "enc_out", "layer_0_isolated", "decoder_replay")

ADAPTER = load_adapter("parakeet_dump_cpp")


def standin(*args, timeout=300):
    return subprocess.run([sys.executable, str(STANDIN), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout)


def test_run_gives_the_main_run_then_the_decoder_replay(tmp_path):
    commands = ADAPTER.run(ToolCall(tmp_path / "m.nemo", tmp_path / "a.wav", tmp_path / "raw",
                                    family("parakeet_tdt").spec, {"flash_attention": 1},
                                    {"binary": "python3 'my tools/dump.py'"}, "q8_0", "cuda", 4,
                                    tmp_path / "raw" / "inputs"))
    common = ["python3", "my tools/dump.py", "--model", str(tmp_path / "m.nemo"), "--audio",
              str(tmp_path / "a.wav"), "--output-dir", str(tmp_path / "raw"),
              "--matmul-weight-type", "q8_0", "--backend", "cuda", "--flash-attention", "1"]
    assert commands == [
        ([*common, "--nemo-dir", str(tmp_path / "raw" / "inputs")], {}),
        ([*common, "--decoder-input", str(tmp_path / "raw" / "inputs" / "enc_out.npy")], {}),
    ]
    assert ADAPTER.files({"binary": "python3 'my tools/dump.py'"}) == ["my tools/dump.py"]


def test_the_adapter_is_registered_with_the_seeds_cells():
    adapter = ADAPTER
    assert adapter.weight_types == ("native", "f32", "f16", "bf16", "q8_0")
    assert adapter.backends == ("cpu", "cuda", "vulkan")
    assert adapter.reads_reference and adapter.replays and adapter.output == "npy"
    stages = {m.source: m.stage for m in adapter.tensors}
    assert stages == {"mel_features": "mel_features", "enc_out": "enc_out",
                      "layer_0": "layer_0_isolated", "decoder_tokens": "decoder_replay"}
    assert all(family("parakeet_tdt").spec.locate(stage) for stage in stages.values())


@pytest.mark.parametrize("binary", ["", "  ", "tool 'unclosed"])
def test_an_empty_or_unsplittable_binary_is_refused(tmp_path, binary):
    with pytest.raises(AudioparityError, match="option 'binary'"):
        ADAPTER.run(ToolCall(tmp_path, tmp_path, tmp_path, family("parakeet_tdt").spec, {},
                             {"binary": binary}, "f32", "cpu", 1, tmp_path))


def test_prepare_writes_the_rank3_nemo_dir(tmp_path):
    with DumpWriter(tmp_path / "ref", producer="nemo",
                    fields={"family": "parakeet_tdt"}) as writer:
        for name, rows in (("pre_encode", 3), ("pos_emb", 5), ("enc_out", 3)):
            writer.add_tensor(name, np.ones((rows, 2), np.float32), "[T, D]")
    assert ADAPTER.prepare(tmp_path / "ref", tmp_path / "raw" / "inputs",
                           options={"binary": "x"}) == tmp_path / "raw" / "inputs"
    shapes = {p.name: np.load(p).shape for p in (tmp_path / "raw" / "inputs").iterdir()}
    assert shapes == {"pre_encode.npy": (1, 3, 2), "pos_emb.npy": (1, 5, 2),
                      "enc_out.npy": (3, 2)}


@pytest.mark.parametrize("args", [
    ["--model", "m", "--audio", "a.wav", "--nemo-dir", "n"],
    ["--model", "m", "--nemo-dir", "n", "--output-dir", "o"],
    ["--model", "m", "--audio", "a.wav", "--output-dir", "o"],
])
def test_standin_usage_errors_exit_2_as_the_seed(tmp_path, args):
    result = standin(*(tmp_path / arg if arg in ("n", "o") else arg for arg in args))
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(f"usage: {STANDIN} --model --audio --nemo-dir --output-dir")
    assert not (tmp_path / "o").exists()


def test_standin_refuses_rank2_nemo_tensors_as_the_seed(parakeet_model, clip_wav, tmp_path):
    nemo = tmp_path / "nemo"
    nemo.mkdir()
    np.save(nemo / "pre_encode.npy", np.zeros((4, 64), np.float32))
    np.save(nemo / "pos_emb.npy", np.zeros((7, 64), np.float32))
    result = standin("--model", parakeet_model, "--audio", clip_wav, "--nemo-dir", nemo,
                     "--output-dir", tmp_path / "out", "--matmul-weight-type", "f32")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "dump_cpp_reference failed: expected NeMo pre_encode/pos_emb dumps to be rank-3 "
        "[1, T, D]")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["enc_out.npy",
                                                                   "mel_features.npy"]


def test_standin_encoder_only_needs_no_nemo_dir(parakeet_model, clip_wav, tmp_path):
    result = standin("--model", parakeet_model, "--audio", clip_wav, "--output-dir",
                     tmp_path / "out", "--encoder-only", "1")
    assert result.returncode == 0, result.stderr
    files = {p.name: np.load(p) for p in (tmp_path / "out").iterdir()}
    assert sorted(files) == ["enc_out.npy", "mel_features.npy"]
    mel, enc_out = files["mel_features.npy"], files["enc_out.npy"]
    assert mel.ndim == enc_out.ndim == 2 and 0 < enc_out.shape[0] < mel.shape[0]
    assert f"Wrote mel_features.npy and enc_out.npy to {tmp_path / 'out'}" in result.stdout


def test_standin_refuses_a_decoder_input_of_another_width(parakeet_model, clip_wav, tmp_path):
    np.save(tmp_path / "enc.npy", np.zeros((5, 3), np.float32))
    result = standin("--model", parakeet_model, "--audio", clip_wav, "--decoder-input",
                     tmp_path / "enc.npy", "--output-dir", tmp_path / "out")
    assert result.returncode == 1, result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        "dump_cpp_reference failed: decoder input must be [frames, encoder_hidden_size]")


@pytest.mark.slow
def test_a_cell_through_the_standin_passes_at_f32(parakeet_model, parakeet_reference, clip_wav,
                                                   tmp_path):
    output = tmp_path / "cell"
    run_candidate(CandidateEntry("parakeet_dump_cpp", "parakeet_tdt"), parakeet_model, clip_wav,
                  output, RunSettings("f32", "cpu", {"binary": BINARY}), parakeet_reference)
    dump, reference = Dump(output), Dump(parakeet_reference)
    assert dump.status == "ok"
    assert sorted(dump.tensor_names) == ["enc_out", "layer_0_isolated", "mel_features"]
    assert list(dump.manifest["documents"]) == ["decoder_replay"]
    assert set(dump.json("decoder_replay")) == {"ids", "frames", "durations"}
    assert dump.manifest["conventions"]["decoder_replay"]["omits"] == ["text"]
    for name in ("mel_features", "enc_out", "layer_0_isolated"):
        source = reference.tensor("layer_0" if name == "layer_0_isolated" else name)
        assert dump.tensor(name).shape == source.shape, name
    raw = output / "raw"
    assert np.load(raw / "inputs" / "pre_encode.npy").ndim == 3

    cell = tmp_path / "cell.json"
    compare_cell(CellDumps(parakeet_reference, output), config_gates("parakeet_tdt", "f32"),
                 {"family": "parakeet_tdt", "candidate": "dump_cpp", "weight_type": "f32"}, cell)
    rows = {row["stage"]: row for row in json.loads(cell.read_text())}
    assert {stage: rows[stage]["status"] for stage in STAGES} == dict.fromkeys(STAGES, "pass"), (
        {stage: rows[stage]["reason"] for stage in STAGES})
    assert rows["decoder_replay"]["token_match"] == 1.0
    assert "no text" in rows["decoder_replay"]["reason"]
    assert rows["layer_0_isolated"]["cosine"] > 0.9999
