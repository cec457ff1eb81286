"""A second backend through the real workflow (Vulkan; lavapipe on a machine without a GPU): a
fault planted in a copy of the port that takes another path on Vulkan only fails the Vulkan
cells, the comparison with the CPU names its stage and the drill-down names its op; and the
default sweep on Vulkan (config/examples/vulkan.yaml) passes the f32 gates with ggml-vulkan's
f16 arithmetic off, with every cell also compared with the CPU."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import REPO
from tests.conftest import vulkan_or_skip
from tests.workflow import workdir as wd

pytestmark = pytest.mark.slow

#: ggml-vulkan's f16 arithmetic off: the Vulkan cells compute f32 as f32 (config/config.yaml)
NO_F16 = {"name": "vulkan-no-f16", "backend": "vulkan", "env": {"GGML_VK_DISABLE_F16": "1"}}

#: One op that takes another path on Vulkan only: layer 1's output rounded to f16 and back, in
#: the graph that computes layer 1 end to end and alone (``Encoder.layer``).
PLANTED = (
    "            g.output(Names.LAYER.at(index), h, ndim=2)\n",
    "            if index == 1 and self.runtime.backend_name == 'vulkan':  # planted\n"
    "                h = ggml.ggml_cast(g.ctx, ggml.ggml_cast(g.ctx, h, ggml.GGML_TYPE_F16),"
    " ggml.GGML_TYPE_F32)\n"
    "            g.output(Names.LAYER.at(index), h, ndim=2)\n",
)


@pytest.fixture(autouse=True)
def vulkan(monkeypatch):
    """Vulkan on a device, and the workflow's jobs seeing it: the device list and the Mesa
    shader cache (compiling lavapipe's pipelines is most of a cold run)."""
    vulkan_or_skip()
    extra = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"),
             "MESA_SHADER_CACHE_DIR": str(Path.home() / ".cache" / "mesa_shader_cache")}
    plain = wd.environment
    monkeypatch.setattr(wd, "environment", lambda workdir: {**plain(workdir), **extra})


def summary(workdir: Path) -> pd.DataFrame:
    return pd.read_csv(workdir / "results/report/summary.csv", dtype=str, keep_default_na=False)


def test_a_vulkan_only_fault_fails_only_vulkan_and_the_drill_down_names_its_op(tmp_path):
    workdir = wd.make_workdir(tmp_path / "run", wd.parakeet_config(
        weight_types=["f32"], backends=["cpu", NO_F16]))
    encoder = workdir / "src/audioparity/models/parakeet_tdt/encoder.py"
    text = encoder.read_text()
    assert text.count(PLANTED[0]) == 1
    encoder.write_text(text.replace(*PLANTED))
    wd.run_to_completion(workdir)

    rows = summary(workdir)
    reference = rows[rows["against"] == "reference"]
    status = {(r.backend, r.stage): r.status for r in reference.itertuples()}
    assert {s for (backend, _), s in status.items() if backend == "cpu"} == {"pass"}
    failed = {stage for (backend, stage), s in status.items()
              if backend == "vulkan-no-f16" and s != "pass"}
    assert "layer_1" in failed and "layer_0" not in failed
    # layer 1 alone is wrong too, and it is the only layer that is
    assert {stage for stage in failed if stage.endswith("_isolated")} == {"layer_1_isolated"}

    against_cpu = rows[rows["against"] == "cpu"]
    failing = against_cpu[against_cpu["status"] == "fail"]
    assert list(failing["stage"])[0] == "layer_1"  # pipeline order: the first that breaks
    assert "CPY" in failing["first_bad_op"].iloc[0]

    folder = workdir / "results/drilldown/parakeet_tdt/tiny/audioparity/vulkan-no-f16/f32/clip"
    drilled = json.loads((folder / "drilldown.json").read_text())
    bad = drilled["first_bad"]
    assert (bad["op"], bad["type"], bad["verdict"], bad["phase"], bad["feeds"]) == (
        "CPY", "f16", "only in vulkan", "layer_1", "layer_1")
    repro = folder / "repro"
    assert (repro / "vulkan" / "graph.json").is_file() and (repro / "cpu" / "leafs.gguf").is_file()
    assert list((repro / "vulkan" / "inputs").glob("*.npy"))
    # the command as the workflow's folder (where `make run` runs) names it
    assert drilled["repro"]["command"] == (f"audioparity repro {repro.relative_to(workdir)} "
                                           "--backend vulkan --against cpu")


def test_the_default_sweep_on_vulkan(tmp_path):
    """config/examples/vulkan.yaml: every family on the CPU and on Vulkan with its f16
    arithmetic off, Parakeet and MOSS also with ggml-vulkan's defaults, each Vulkan cell also
    against the CPU. MOSS runs the shortest of its four prompts: with ggml-vulkan's defaults
    each of its cells is drilled into, and the prompts take the same ops; Parakeet and MOSS at
    f32, f16 and q8_0, Whisper at f32."""
    sweep = yaml.safe_load((REPO / "config/examples/vulkan.yaml").read_text())
    moss_cases = yaml.safe_load((REPO / "config/config.yaml").read_text())["moss_voicegen"]["cases"]
    # 109 prompt rows (en-instruction: 148): lavapipe runs ggml-vulkan's norms and soft_max,
    # workgroups of 512 with a barrier per reduction step, at about a millisecond a row (an
    # RMS_NORM of the prefill, measured with the suite running beside it)
    sweep["moss_voicegen"]["cases"] = [c for c in moss_cases if c["name"] == "en-no-instruction"]
    # f32 (a float32 port, and ggml-vulkan's f16 tiles at f32), f16 and q8_0 (its own rounding
    # of quantized matmuls): native is the checkpoints' f32 and bf16 another float type; the
    # example runs all five
    for family in ("parakeet_tdt", "moss_voicegen"):
        sweep[family]["weight_types"] = ["f32", "f16", "q8_0"]
    # Whisper at f32 alone, and not on ggml-vulkan's defaults: there its drill-down finds no op
    # past its bound, so it reads every one of its 96 graphs, and lavapipe takes seconds for
    # each soft_max over the encoder's 1500 positions; the drill-down's reading every graph is
    # tests/ggml/test_graphs.py's, and the example runs Whisper on both settings
    sweep["whisper"]["weight_types"] = ["f32"]
    sweep["whisper"]["backends"] = ["cpu", NO_F16]
    # Parakeet on the clip: heldout takes the same ops (the CPU's default sweep runs both)
    sweep["parakeet_tdt"]["cases"] = [{"name": "clip", "path": "resources/speech/clip.wav"}]
    # the primary references alone: the others run in tests/workflow/test_references.py and
    # in the default quantized sweep (tests/workflow/test_quantized.py)
    sweep["parakeet_tdt"]["references"] = wd.PRIMARY_ONLY
    sweep["moss_voicegen"]["references"] = [{"name": "remote_code",
                                             "implementation": "remote_code"}]
    # every Parakeet cell run again after another in one process, on each backend too (a
    # backend's buffers kept between runs); MOSS's and Whisper's reruns are checked on the CPU
    for family in ("moss_voicegen", "whisper"):
        sweep[family]["reuse"] = False
    workdir = wd.make_workdir(tmp_path / "run", sweep, fresh_check=True)
    (workdir / "resources").symlink_to(REPO / "resources")  # the cases config.yaml names
    wd.run_to_completion(workdir)

    rows = summary(workdir)
    reference = rows[rows["against"] == "reference"]
    assert set(reference["backend"]) == {"cpu", "vulkan", "vulkan-no-f16"}
    assert set(reference["family"]) == {"parakeet_tdt", "moss_voicegen", "whisper"}
    assert set(reference[reference["family"] == "moss_voicegen"]["case"]) == {"en-no-instruction"}
    assert set(reference[reference["family"] == "whisper"]["backend"]) == {"cpu", "vulkan-no-f16"}
    # nothing fails that is not declared, and f32 without f16 arithmetic meets every f32 gate
    assert set(reference["status"]) <= {"pass", "xfail"}, reference[
        reference["status"] == "fail"][["family", "backend", "weight_type", "stage", "reason"]]
    f32 = reference[(reference["backend"] == "vulkan-no-f16") & (reference["weight_type"] == "f32")
                    & (reference["candidate"] == "audioparity")]
    assert len(f32) > 40 and set(f32["status"]) == {"pass"}
    # each Vulkan cell against the CPU, stage by stage, with its NMSE
    against_cpu = rows[rows["against"] == "cpu"]
    assert set(against_cpu["backend"]) == {"vulkan", "vulkan-no-f16"}
    tensors = against_cpu[against_cpu["nmse"] != ""]
    assert len(tensors) >= 250  # 264: Parakeet (clip) and MOSS cells f32 to q8_0, Whisper f32
    # with the defaults the f32 cells differ from the CPU, and each names its first bad op
    defaults = against_cpu[(against_cpu["backend"] == "vulkan") &
                           (against_cpu["weight_type"] == "f32") &
                           (against_cpu["status"] == "fail")]
    assert len(defaults) and (defaults["first_bad_op"].str.contains("MUL_MAT")).all()
    # the same answer run again after another case, on every backend
    fresh = rows[rows["against"] == "fresh"]
    assert set(fresh["backend"]) == {"cpu", "vulkan", "vulkan-no-f16"}
    assert set(fresh["family"]) == {"parakeet_tdt"} and set(fresh["status"]) == {"pass"}
    html = (workdir / "results/report/index.html").read_text()
    assert "Backends against the CPU" in html and "First bad op" in html
