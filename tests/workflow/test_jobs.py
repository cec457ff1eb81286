"""Each job's inputs, memory and command from its wildcards (audioparity.workflow.jobs,
.commands, .outcome), on a plan of a config; no Snakemake involved."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest

from audioparity.compare.gate_lists import resolve_gates
from audioparity.compare.plan import CellKey
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.memory import BASE_MEMORY_MB
from audioparity.models.registry import registered
from audioparity.workflow.code import Code
from audioparity.workflow.commands import Commands
from audioparity.workflow.jobs import Jobs
from audioparity.workflow.outcome import outcome
from audioparity.workflow.plan import Sweep
from tests import REPO
from tests.workflow.test_plan import CLIP, adapters, config


def cell(**values) -> SimpleNamespace:
    return SimpleNamespace(**{"family": "parakeet_tdt", "model": "tiny", "candidate":
                              "audioparity", "backend": "cpu", "weight_type": "f32",
                              "case": "clip", **values})


@pytest.fixture
def commands(monkeypatch) -> Commands:
    monkeypatch.chdir(REPO)
    value = config(backends=["cpu", {"name": "vk", "backend": "vulkan",
                                     "env": {"GGML_VK_DISABLE_F16": "1"}}],
                   candidates=[{"name": "audioparity", "adapter": "audioparity", "options": {}},
                               {"name": "t", "adapter": "tool", "options": {}}],
                   gates={"default": [{"stage": "*", "cosine_min": 0.9}],
                          "q8_0": [{"stage": "enc_out", "nmse_max": 1e-3}]},
                   expected_failures=[{"stage": "decode", "case": "cl*", "reason": "why"},
                                      {"stage": "enc_out", "weight_type": "q8_0",
                                       "reason": "because"}])
    return Commands(Jobs(Sweep(value, registered(), adapters), Code(REPO / "src")))


def test_our_ports_dump_runs_candidate_run_with_the_reference_and_the_converted_weights(
        commands):
    command = commands.ggml_command(cell(backend="vk", weight_type="q8_0"), ["out/dump"], 1)
    argv = shlex.split(command)
    assert argv[:3] == ["env", "GGML_VK_DISABLE_F16=1", "audioparity"]
    options = json.dumps(commands.jobs.candidate(cell()).options, sort_keys=True)
    assert argv[3:] == [
        "candidate", "run", "--family", "parakeet_tdt", "--adapter", "audioparity", "--options",
        options, "--family-options", options, "--model",
        "results/fixtures/parakeet_tdt/tiny/model.nemo", "--audio", CLIP, "--reference-dir",
        "results/reference/parakeet_tdt/tiny/clip@q8_0", "--weights-file",
        "results/weights/parakeet_tdt/tiny/audioparity/q8_0.gguf", "--output-dir", "out/dump",
        "--weight-type", "q8_0", "--backend", "vulkan", "--threads", "1"]


def test_a_third_party_dump_runs_on_its_converted_model_without_our_weights(commands):
    argv = shlex.split(commands.ggml_command(cell(candidate="t"), ["out"], 2))
    assert argv[argv.index("--model") + 1] == "results/candidates/parakeet_tdt/tiny/t/f32"
    assert "--reference-dir" not in argv and "--weights-file" not in argv
    assert argv[argv.index("--adapter") + 1] == "tool"
    inputs = commands.jobs.ggml_inputs(cell(candidate="t"))
    assert inputs["model"] == "results/candidates/parakeet_tdt/tiny/t/f32"
    assert inputs["port"] == ["ports/tool/bin/tool"]
    assert "weights" not in inputs and not commands.jobs.reads_reference(cell(candidate="t"))
    assert commands.jobs.converted_model(cell(candidate="t", weight_type="q8_0")) is None


def test_the_inputs_of_a_compare_and_of_our_ports_dump(commands):
    jobs = commands.jobs
    dump = jobs.ggml_inputs(cell(weight_type="q8_0"))
    assert dump["model"] == "results/fixtures/parakeet_tdt/tiny"
    assert dump["weights"] == "results/weights/parakeet_tdt/tiny/audioparity/q8_0.gguf"
    assert dump["code"] == "results/code/parakeet_tdt/audioparity/run.sha256"
    assert jobs.reads_reference(cell())
    compare = jobs.compare_inputs(cell(candidate="t", weight_type="q8_0"))
    assert compare == {"candidate": "results/ggml/parakeet_tdt/tiny/t/cpu/q8_0/clip",
                       "code": "results/code/parakeet_tdt/compare.sha256",
                       "cost_digest": "results/reference/parakeet_tdt/tiny/clip.sha256",
                       "replay": "results/replay/parakeet_tdt/tiny/t/cpu/q8_0/clip"}
    assert jobs.backend_compare_inputs(cell(backend="vk"))["baseline"] == (
        "results/ggml/parakeet_tdt/tiny/audioparity/cpu/f32/clip")


def test_a_reference_is_an_ancient_directory_and_a_digest_once_the_digest_exists(
        commands, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ancient = lambda path: f"ancient({path})"  # noqa: E731
    assert commands.jobs.reference_inputs(cell(), ancient) == {
        "reference": "results/reference/parakeet_tdt/tiny"}
    digest = tmp_path / "results/reference/parakeet_tdt/tiny/clip.sha256"
    digest.parent.mkdir(parents=True)
    digest.write_text("0\n")
    assert commands.jobs.reference_inputs(cell(), ancient) == {
        "reference": "ancient(results/reference/parakeet_tdt/tiny)",
        "reference_digest": "results/reference/parakeet_tdt/tiny/clip.sha256"}


def test_the_gates_shared_between_cases_are_those_resolve_gates_gives_each(commands):
    section = commands.jobs.plan(cell()).section
    for case in ("clip", "other", "clap"):
        for weight_type in ("f32", "q8_0"):
            for against, backend in (("reference", "vk"), ("cpu", "vk"), ("reference", "cpu")):
                w = cell(case=case, weight_type=weight_type, backend=backend)
                expected = resolve_gates(section, CellKey(
                    "parakeet_tdt", "tiny", "audioparity", backend, weight_type, case, against),
                    ggml_backend={"vk": "vulkan"}.get(backend, backend))
                assert json.loads(commands.gates(w, against)) == expected


def test_the_reference_jobs_arguments(commands):
    w = SimpleNamespace(family="parakeet_tdt", model="tiny")
    output = ["results/reference/parakeet_tdt/tiny"]
    assert commands.reference_cases(w, output) == (
        f"--audio {CLIP} --output-dir results/reference/parakeet_tdt/tiny/clip "
        "--emulate q8_0")
    assert commands.reference_dumps(w, output) == (
        "results/reference/parakeet_tdt/tiny/clip results/reference/parakeet_tdt/tiny/clip@q8_0")
    assert commands.family_options("reference")(w) == "--attention-mask 1 --implementation nemo"
    assert commands.weights_options(cell()) == "--conv-weight-type f32"
    fixture = SimpleNamespace(family="parakeet_tdt", name="tiny")
    assert commands.fixture_options(fixture).startswith("--seed 0")
    assert commands.emulate_flag(cell(weight_type="q8_0")) == "--emulate q8_0"
    assert commands.cost_flag(cell()) == ""


def test_a_cell_on_a_backend_other_than_the_cpu_is_a_gpu_job_a_setting_by_its_backend():
    settings = {"cuda-strict": "cuda", "vulkan-no-f16": "vulkan", "cpu-one-thread": "cpu"}
    backends = ["cpu", "vulkan", "cuda",
                *({"name": name, "backend": backend} for name, backend in settings.items())]
    jobs = Jobs(Sweep(config(backends=backends), registered(), adapters), Code(REPO / "src"))
    on_gpu = {name: jobs.on_gpu(cell(backend=name))
              for name in ("cpu", "vulkan", "cuda", *settings)}
    assert on_gpu == {"cpu": False, "vulkan": True, "cuda": True, "cuda-strict": True,
                      "vulkan-no-f16": True, "cpu-one-thread": False}


def test_a_job_asks_memory_for_its_model_and_one_that_cannot_fit_is_refused(commands, tmp_path):
    jobs = commands.jobs
    parakeet_model = tmp_path / "model.bin"  # unreadable as a checkpoint: counted by its size
    parakeet_model.write_bytes(bytes(4 << 20))
    assert jobs.memory_mb("ggml", cell(), None, None) == BASE_MEMORY_MB["ggml"]
    f32 = jobs.memory_mb("ggml", cell(), str(parakeet_model), None)
    q8_0 = jobs.memory_mb("ggml", cell(weight_type="q8_0"), str(parakeet_model), None)
    assert f32 > q8_0 > BASE_MEMORY_MB["ggml"]
    assert jobs.memory_mb("ggml", cell(), str(parakeet_model), None, copies=2) > f32
    with pytest.raises(AudioparityError) as refused:
        jobs.memory_mb("ggml", cell(), str(parakeet_model), f32 - 1)
    assert str(refused.value) == (f"ggml job of parakeet_tdt/tiny/f32 needs about {f32} MB, "
                                  f"more than --resources mem_mb={f32 - 1}: give it more memory")
    reference = SimpleNamespace(family="parakeet_tdt", model="tiny")
    assert jobs.memory_mb("reference", reference, str(parakeet_model), None) > 1500


def test_a_finished_run_prints_its_statuses_and_every_cause_with_its_cells(tmp_path):
    """Every cause, across every comparison, with how many cells it covers: a cell of two
    culprits counts under each (never as their pair); seven cells share one cause, all
    listed; a comparison with the CPU has its own."""
    summary = tmp_path / "summary.csv"
    assert outcome(summary, tmp_path / "index.html") == []
    row = {"family": "f", "model": "m", "candidate": "a", "backend": "cpu", "weight_type": "f32",
           "reason": "r"}
    storage = "storage (fail): asked q8_0; 4 f16"
    rows = [{**row, "case": "c", "stage": "x", "against": "reference", "status": "pass",
             "culprit": ""},
            {**row, "case": "c", "stage": "layer_1", "against": "reference", "status": "fail",
             "culprit": f"{storage} || layer_1 (fail): nmse 2 > 1"},
            {**row, "case": "c", "stage": "storage", "against": "reference", "status": "fail",
             "culprit": f"{storage} || layer_1 (fail): nmse 2 > 1"},
            *({**row, "case": f"k{i}", "stage": "storage", "against": "reference",
               "status": "fail", "culprit": storage} for i in range(7)),
            {**row, "case": "c", "stage": "y", "against": "cpu", "status": "fail",
             "culprit": "y (fail): max_rel 3 > 1", "backend": "vulkan"}]
    pd.DataFrame(rows).to_csv(summary, index=False)
    assert outcome(summary, Path("index.html")) == [
        f"audioparity: 9 fail, 1 pass; against cpu: 1 fail; report: "
        f"{Path('index.html').resolve()}",
        "audioparity: against reference: 2 cause(s) in 8 cell(s)",
        f"audioparity:   8 cell(s): {storage} [m/a/cpu/f32 (c, k0, k1, k2, k3, k4, k5, k6)]",
        "audioparity:   1 cell(s): layer_1 (fail): nmse > 1 [m/a/cpu/f32 (c)]",
        "audioparity: against cpu: 1 cause(s) in 1 cell(s)",
        "audioparity:   1 cell(s): y (fail): max_rel > 1 [m/a/vulkan/f32 (c)]"]
