"""Candidates other than our port, through the real workflow: a stand-in external tool of each
family with a fault planted in one layer, localised by the reference's replay alone; and
transcribe.cpp, whisper.cpp and llama.cpp, built by `make ports`, judged beside our port on one
report."""

from __future__ import annotations

import json
import os
from fnmatch import fnmatchcase

import pandas as pd
import pytest
import yaml

from audioparity.models.registry import family as family_spec
from tests import MOSS_PROMPTS, REPO
from tests.models.moss_voicegen.test_replay import LAYER_0_FAULT
from tests.models.parakeet_tdt.test_planted_bugs import BUGS
from tests.planted import planted_source
from tests.workflow.workdir import (
    edited,
    make_workdir,
    parakeet_config,
    planned_jobs,
    run_to_completion,
)

pytestmark = pytest.mark.slow

#: A user's dump tool, as the `command` adapter runs it (`tool.py <family command> ARGS`): our
#: port from a copy with a planted fault (PLANTED_SRC first on the Python path), its dump passed
#: on without the isolated forms (`*_isolated`, Parakeet's `decoder_replay`), so that only the
#: reference's replay can localise the fault.
STAND_IN = """\
import subprocess, sys, tempfile
from pathlib import Path
from audioparity.dumping.artifacts import Dump, DumpWriter
family, *args = sys.argv[1:]
output = Path(args[args.index("--output-dir") + 1])
with tempfile.TemporaryDirectory() as work:
    full = Path(work) / "dump"
    argv = [a if a != str(output) else str(full) for a in args]
    subprocess.run([sys.executable, "-m", "audioparity.cli", "ggml", family, *argv],
                   check=True, env={"PYTHONPATH": "PLANTED_SRC", "PATH": "/usr/bin:/bin"})
    dump = Dump(full)
    with DumpWriter(output, producer="external", model=dump.manifest["model"]["path"]) as out:
        for name in dump.tensor_names:
            if not name.endswith("_isolated"):
                out.add_tensor(name, dump.tensor(name), dump.layout(name))
        for name in dump.manifest["documents"]:
            if not name.endswith("_replay"):
                out.add_json(name, dump.json(name))
"""


def stand_in(tmp_path, family: str, patches) -> str:
    """The `command` adapter's template running :data:`STAND_IN` on a planted copy of
    ``family``'s port (a family without ``ggml_reads_reference`` is not given the reference)."""
    spec = family_spec(family).spec
    source = planted_source(tmp_path / "planted", family, patches)
    tool = tmp_path / "tool.py"
    tool.write_text(STAND_IN.replace("PLANTED_SRC", str(source)))
    reference = " --reference-dir {reference}" if spec.ggml_reads_reference else ""
    return (f"python {tool} {spec.command} --model {{model}} {spec.input_flag} {{case}}"
            f"{reference} --output-dir {{output}} --weight-type {{weight_type}} "
            "--backend {backend} --threads {threads} {options}")


def replayed_statuses(workdir) -> tuple[dict[str, str], dict[str, str]]:
    """({stage: status}, {replayed form: status}) of the sweep's summary."""
    summary = pd.read_csv(workdir / "results/report/summary.csv")
    summary = summary[summary.against == "reference"]  # not the references' own comparisons
    status = dict(zip(summary.stage, summary.status, strict=True))
    return status, {stage: s for stage, s in status.items() if stage.endswith("_replayed")}


def test_a_one_layer_fault_in_an_external_tool_is_localised_by_replay_alone(tmp_path):
    command = stand_in(tmp_path, "parakeet_tdt", BUGS["layer_1_norm_bias_dropped"])
    workdir = make_workdir(tmp_path / "run", parakeet_config(
        weight_types=["f32"], candidates=[
            {"name": "planted", "adapter": "command", "options": {"command": command}}]))
    run_to_completion(workdir)

    status, replayed = replayed_statuses(workdir)
    assert not any(stage.endswith("_isolated") for stage in status)
    assert [stage for stage, s in replayed.items() if s != "pass"] == ["layer_1_replayed"]
    assert set(replayed) == {"pre_encode_replayed", "layer_0_replayed", "layer_1_replayed",
                             "layer_2_replayed", "decode_replayed"}
    assert status["layer_0"] == "pass" and status["layer_1"] == "fail"
    assert status["enc_out"] == "fail"


def test_a_one_layer_fault_in_an_external_moss_tool_is_localised_by_replay_alone(tmp_path):
    """Layer 0 faulty: end to end, layer 1 fails too; replayed, layer 1 passes."""
    command = stand_in(tmp_path, "moss_voicegen", LAYER_0_FAULT)
    workdir = make_workdir(tmp_path / "run", {"families": ["moss_voicegen"], "moss_voicegen": {
        "models": [{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
        "cases": [{"name": "en-instruction", "path": str(MOSS_PROMPTS[0])}],
        "weight_types": ["f32"],
        "candidates": [{"name": "planted", "adapter": "command", "replay": True,
                        "options": {"command": command}}]}})
    run_to_completion(workdir)

    status, replayed = replayed_statuses(workdir)
    assert replayed == {"layer_0_replayed": "fail", "layer_1_replayed": "pass"}
    assert status["layer_0"] == status["layer_1"] == status["last_hidden"] == "fail"


#: A user's port adapter in a folder of their own, outside the checkout: a tool that writes
#: `.npy` files under its own names (here our port's stages, renamed, the mel transposed) and
#: its decode as JSON, and does not write `pos_emb`.
MY_PORT = """\
import sys
from pathlib import Path

from audioparity.candidates import Adapter, TensorMap

TOOL = Path(__file__).with_name("my_tool.py")


class MyPort(Adapter):
    name = "my_port"
    title = "my.port"
    families = ("parakeet_tdt",)
    output = "npy"
    weight_types = ("f32",)
    tensors = (TensorMap("mel", "mel_features", layout="[n_mels, T]"),
               TensorMap("pre", "pre_encode"), TensorMap("block{i}", "layer_{i}"),
               TensorMap("encoder_out", "enc_out"), TensorMap("tokens", "decode"))
    unexposed = {"pos_emb": "my.port computes the positions inside its attention"}
    reads_reference = True

    def files(self, options):
        return [str(TOOL)]

    def run(self, call):
        return [([sys.executable, str(TOOL), str(call.model), str(call.case), str(call.reference),
                  str(call.output)], {})]
"""

#: The tool :data:`MY_PORT` runs: our port's dump, handed over as its own files.
MY_TOOL = """\
import json, subprocess, sys, tempfile
from pathlib import Path
import numpy as np
from audioparity.dumping.artifacts import Dump
model, case, reference, output = sys.argv[1:]
names = {"mel_features": "mel", "pre_encode": "pre", "enc_out": "encoder_out"}
with tempfile.TemporaryDirectory() as work:
    subprocess.run([sys.executable, "-m", "audioparity.cli", "ggml", "parakeet-tdt",
                    "--model", model, "--audio", case, "--reference-dir", reference,
                    "--output-dir", f"{work}/dump", "--weight-type", "f32"], check=True)
    dump = Dump(f"{work}/dump")
    for name in dump.tensor_names:
        if name.startswith("layer_") and not name.endswith("_isolated"):
            np.save(Path(output) / f"block{name.removeprefix('layer_')}.npy", dump.tensor(name))
        elif name in names:
            array = dump.tensor(name)
            np.save(Path(output) / f"{names[name]}.npy", array.T if name == "mel_features"
                    else array)
    (Path(output) / "tokens.json").write_text(json.dumps(dump.json("decode")))
"""


def test_a_users_adapter_outside_the_checkout_runs_through_the_workflow_with_replay(tmp_path):
    """A config names the adapter by a path relative to the working directory; nothing under
    src/ is touched. Its stages pass, each replayed layer passes, the stage it names is
    unavailable with its reason, and its run's wall time is its last stage's seconds."""
    mine = tmp_path / "my-ports"
    mine.mkdir()
    (mine / "my_port.py").write_text(MY_PORT)
    (mine / "my_tool.py").write_text(MY_TOOL)
    workdir = make_workdir(tmp_path / "run", parakeet_config(
        weight_types=["f32"], candidates=[
            {"name": "my.port", "adapter": "../my-ports/my_port.py", "replay": True}]))
    run_to_completion(workdir)

    summary = pd.read_csv(workdir / "results/report/summary.csv")
    got = {row.stage: row for row in summary[summary.candidate == "my.port"].itertuples()}
    compared = {"mel_features", "pre_encode", "layer_0", "layer_1", "layer_2", "enc_out",
                "decode", "pre_encode_replayed", "layer_0_replayed", "layer_1_replayed",
                "layer_2_replayed", "decode_replayed"}
    assert {stage: got[stage].status for stage in compared} == dict.fromkeys(compared, "pass")
    assert got["pos_emb"].status == "unavailable"
    assert got["pos_emb"].reason == ("my.port does not expose it: my.port computes the "
                                     "positions inside its attention")
    assert got["joint_logits"].reason == "my.port does not expose it"
    assert got["decode"].seconds > 0
    assert all(pd.isna(row.seconds) for stage, row in got.items() if stage != "decode")


PORTS = REPO / ".ports"


@pytest.fixture(scope="module")
def ports_sweep(tmp_path_factory):
    """config/examples/ports.yaml, run to completion: Parakeet on the shipped clip at f32,
    MOSS on both fixtures and one prompt at every weight type it sweeps."""
    if not all((PORTS / name).is_dir() for name in ("transcribe_cpp", "whisper_cpp",
                                                     "llama_cpp", "openmoss")):
        message = f"{PORTS} has no built ports: run `make ports`"
        if os.environ.get("AUDIOPARITY_REQUIRE_PORTS"):
            pytest.fail(message)
        pytest.skip(message)
    config = yaml.safe_load((REPO / "config/examples/ports.yaml").read_text())
    section = config["parakeet_tdt"]
    # the fixture the assertions below know (the example also has the trained default model)
    section["models"] = [m for m in section["models"] if m["name"] == "tiny-ports"]
    section["cases"] = [{"name": "clip", "path": str(REPO / "resources/speech/clip.wav")}]
    section["weight_types"] = ["f32"]
    # NeMo alone: the example's other references run on jfk.wav in
    # tests/workflow/test_references.py
    section["references"] = section["references"][:1]
    section["expected_failures"] = [e for e in section["expected_failures"]
                                    if e.get("case", "*") != "jfk"
                                    and fnmatchcase("f32", e.get("weight_type", "*"))]
    # MOSS on one prompt per fixture (the four prompts take the same ops; the default sweep
    # runs them all)
    moss = config["moss_voicegen"]
    prompts = yaml.safe_load((REPO / "config/config.yaml").read_text())["moss_voicegen"]["cases"]
    moss["cases"] = prompts[:1]
    for candidate in section["candidates"] + moss["candidates"]:
        if "options" in candidate:
            candidate["options"]["root"] = str(PORTS / candidate["adapter"])
    workdir = make_workdir(tmp_path_factory.mktemp("ports") / "run", config)
    (workdir / "resources").symlink_to(REPO / "resources")  # the MOSS prompts config.yaml names
    run_to_completion(workdir)
    return workdir, pd.read_csv(workdir / "results/report/summary.csv")


def rows(summary: pd.DataFrame, candidate: str) -> dict[str, pd.Series]:
    return {row.stage: row for row in summary[(summary.candidate == candidate)
                                              & (summary.family == "parakeet_tdt")].itertuples()}


def test_transcribe_cpp_every_stage_is_compared_and_its_f16_roundings_are_localised(ports_sweep):
    _, summary = ports_sweep
    got = rows(summary, "transcribe.cpp")
    compared = {"mel_features", "pre_encode", "pos_emb", "layer_0", "layer_1", "layer_2",
                "enc_out", "joint_logits", "lstm_state_0", "decode", "pre_encode_replayed",
                "layer_0_replayed", "layer_1_replayed", "layer_2_replayed", "decode_replayed"}
    assert set(got) == compared | {"decode_logits"}
    # its decoder runs free: the decode teacher-forced along the reference's path is not its
    assert got["decode_logits"].status == "unavailable"
    assert got["decode_logits"].reason.startswith("transcribe.cpp does not expose it: its "
                                                  "decoder runs free")
    del got["decode_logits"]
    # Right where it matches NeMo: the frontend, the positions, the LSTM, the decoder.
    for stage in ("mel_features", "pos_emb", "lstm_state_0", "decode", "decode_replayed"):
        assert got[stage].status == "pass", (stage, got[stage].reason)
    # Its f16 roundings inside the f32 path: the conv stem's im2col, the attention's mask.
    assert got["pre_encode_replayed"].status == "xfail" and got["pre_encode_replayed"].nmse > 1e-8
    for layer in range(3):
        assert got[f"layer_{layer}_replayed"].status == "xfail"
        assert 1e-11 < got[f"layer_{layer}_replayed"].nmse < 1e-6
    assert "first joint step only" in got["joint_logits"].reason


def test_whisper_cpp_decode_is_compared_and_its_tensors_are_unavailable(ports_sweep):
    _, summary = ports_sweep
    got = rows(summary, "whisper.cpp")
    assert got["decode"].status in ("pass", "fail") and got["decode"].token_match > 0.5
    assert {row.status for stage, row in got.items() if stage != "decode"} == {"unavailable"}
    assert "does not expose" in got["enc_out"].reason


def test_converted_models_are_cached_per_weight_type(ports_sweep):
    workdir, _ = ports_sweep
    converted = workdir / "results/candidates/parakeet_tdt/tiny-ports"
    assert (converted / "transcribe.cpp/f32/models/parakeet-tdt-0.6b-v2/model-f32.gguf").is_file()
    assert (converted / "whisper.cpp/f32/ggml-model-f32.bin").is_file()
    report = (workdir / "results/report/index.html").read_text()
    assert "transcribe.cpp" in report and "whisper.cpp" in report


def test_editing_our_encoder_reruns_our_port_only(ports_sweep):
    workdir, _ = ports_sweep
    with edited(workdir / "src/audioparity/models/parakeet_tdt/encoder.py"):
        planned = planned_jobs(workdir)
    assert planned == {"ggml_dump": 1, "compare_cell": 1, "report_summary": 1, "report_html": 1}


#: What llama.cpp computes of the MOSS backbone (the driver's files), the reference's replay of
#: its layers, and what it does not compute.
LLAMA_STAGES = {"layer_0", "layer_1", "last_hidden", "probe_hidden", "step_last_hidden",
                "text_logits"}
REPLAYED = {"layer_0_replayed", "layer_1_replayed"}
NOT_LLAMA = {"prompt", "input_embeddings", "audio_logits", "generation"}


def moss_rows(summary: pd.DataFrame, candidate: str) -> pd.DataFrame:
    return summary[(summary.family == "moss_voicegen") & (summary.candidate == candidate)
                   & (summary.against == "reference")]


def test_llama_cpp_meets_the_f32_gates_and_like_with_like_at_every_weight_type(ports_sweep):
    """llama.cpp with flash attention off and an f32 KV cache is a float32 port of the
    backbone: every stage it exposes passes, at f32 within float32 noise, on both fixtures;
    at bf16 and q8_0 against the quantization-aware references."""
    _, summary = ports_sweep
    got = moss_rows(summary, "llama.cpp")
    assert len(set(zip(got.model, got.case, strict=True))) == 2
    assert set(got.weight_type) == {"f32", "f16", "bf16", "q8_0"}
    exposed = got[got.stage.isin(LLAMA_STAGES | REPLAYED)]
    assert set(exposed.stage) == LLAMA_STAGES | REPLAYED
    like = exposed[exposed.weight_type.isin(["f32", "bf16", "q8_0"])]
    assert set(like.status) == {"pass"}, like[like.status != "pass"][["stage", "reason"]]
    assert exposed[exposed.weight_type == "f32"].max_rel.max() < 1e-6
    assert set(got[got.stage.isin(NOT_LLAMA)].status) == {"unavailable"}


def test_llama_cpp_settings_are_recorded_and_their_f16_roundings_named(ports_sweep):
    """An f16 KV cache, and flash attention (which casts an f32 cache to f16), fail the f32
    gates: each of their cells is an expected failure that would be a failure without its
    declaration; flash attention's one-row step rounds Q as well, so its step_last_hidden is
    further off than the f16 cache's."""
    workdir, summary = ports_sweep
    step = {}
    for candidate in ("llama.cpp-kv-f16", "llama.cpp-flash", "llama.cpp-flash-kv-f16"):
        got = moss_rows(summary, candidate)
        assert set(got.weight_type) == {"f32"}
        exposed = got[got.stage.isin(LLAMA_STAGES)]
        assert set(exposed.status) == {"xfail"} and exposed.max_rel.min() > 1e-5
        step[candidate] = exposed[exposed.stage == "step_last_hidden"].max_rel.max()
    assert step["llama.cpp-flash"] > 3 * step["llama.cpp-kv-f16"]
    dump = workdir / "results/ggml/moss_voicegen/tiny/llama.cpp-flash/cpu/f32/en-instruction"
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["candidate_options"]["flash_attn"] == "on"
    assert manifest["candidate_options"]["kv_cache_type"] == "f32"
    settings = (dump / "raw/stdout.txt").read_text()
    assert '"flash_attn": "enabled", "type_k": "f32", "type_v": "f32"' in settings


def by_cell(summary: pd.DataFrame, candidate: str) -> dict[tuple, float]:
    """{(model, case, stage): max_rel} of a candidate's f32 rows."""
    got = moss_rows(summary, candidate)
    got = got[(got.weight_type == "f32") & got.max_rel.notna()]
    return {(r.model, r.case, r.stage): r.max_rel for r in got.itertuples()}


def test_openmoss_builds_the_reference_prompt_and_runs_llama_cpps_backbone(ports_sweep):
    """openmoss's own prompt rows and input embeddings are the reference's exactly; its
    backbone's figures are llama.cpp's at the same settings to the digit (an f16 KV cache,
    flash attention as set), so each f32 difference is that stored precision, declared."""
    workdir, summary = ports_sweep
    got = moss_rows(summary, "openmoss")
    assert set(got.weight_type) == {"f32", "bf16"}
    assert len(set(zip(got.model, got.case, strict=True))) == 2
    exact = got[got.stage.isin(["prompt", "input_embeddings"])]
    assert set(exact.status) == {"pass"} and len(exact) == 8
    assert exact[exact.stage == "input_embeddings"].max_rel.max() == 0.0
    assert set(got[got.stage == "generation"].status) == {"unavailable"}
    assert "fail" not in set(got.status)
    f32 = got[(got.weight_type == "f32") & got.stage.isin(LLAMA_STAGES | {"audio_logits"})]
    assert set(f32.status) == {"xfail"} and f32.max_rel.min() > 1e-5
    for openmoss, llama in (("openmoss", "llama.cpp-flash-kv-f16"),
                            ("openmoss-flash-off", "llama.cpp-kv-f16")):
        theirs, ours = by_cell(summary, llama), by_cell(summary, openmoss)
        assert theirs and {cell: ours[cell] for cell in theirs} == theirs, openmoss
    dump = workdir / "results/ggml/moss_voicegen/tiny/openmoss/cpu/f32/en-instruction"
    manifest = json.loads((dump / "manifest.json").read_text())
    assert manifest["candidate_options"]["flash_attn"] == "on"
    assert '"flash_attn":true,"kv_cache_type":"f16"' in (dump / "raw/stdout.txt").read_text()
