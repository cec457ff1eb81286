"""The drill-down's answer for a cell compared with the CPU backend, on synthetic dumps: a cell
whose every stage agrees is not needed; one whose dump crashed, is unavailable or lacks a stage
(on either side) says which side, which stage and why, and never that it agrees."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.artifacts import DumpWriter
from audioparity.compare import compare_cell, resolve_gates
from audioparity.drilldown import drill_cell

SECTION = {"gates": {"default": [{"stage": "*", "nmse_max": 1e-6}]}}
LABELS = {"family": "synthetic", "model": "m", "case": "c", "candidate": "audioparity",
          "backend": "vulkan", "weight_type": "f32", "against": "cpu"}
STAGES = {name: np.arange(12, dtype=np.float32).reshape(3, 4) + k
          for k, name in enumerate(("pre_encode", "layer_0", "layer_1", "layer_2"))}
ABORT = "exit code -6: GGML_ASSERT(ggml_nbytes(src0) <= INT_MAX) failed"


def dump(path: Path, stages: list[str], status: tuple[str, str] | None = None,
         crashed_in: str | None = None) -> Path:
    """A dump holding ``stages`` of :data:`STAGES`, of ``status`` (``crashed`` in
    ``crashed_in``, as ``audioparity guard`` leaves one)."""
    with DumpWriter(path, producer="ggml") as writer:
        for name in stages:
            writer.add_tensor(name, STAGES[name], "[T, D]")
        if status:
            writer.set_status(*status)
    if crashed_in:
        manifest = json.loads((path / "manifest.json").read_text())
        manifest["crashed_in"] = crashed_in
        (path / "manifest.json").write_text(json.dumps(manifest))
    return path


def drilled(tmp_path: Path, cpu: Path, vulkan: Path) -> dict:
    """The drill-down of the cell ``vulkan`` against ``cpu``, as the workflow asks for it: it
    reads the cell's rows, and runs nothing when none fails."""
    gates = resolve_gates(SECTION, model="m", backend="vulkan", weight_type="f32",
                          against="cpu", ggml_backend="vulkan")
    cell = tmp_path / "cell.json"
    compare_cell(cpu, vulkan, json.loads(json.dumps(gates)), LABELS, cell)
    return drill_cell(None, model=tmp_path, case=tmp_path, reference_dir=None,
                      weight_type="f32", backend="vulkan", against="cpu", options={},
                      output_dir=tmp_path / "drilldown", cell=cell)


ALL = list(STAGES)


def test_a_cell_whose_stages_all_agree_is_not_needed(tmp_path):
    result = drilled(tmp_path, dump(tmp_path / "cpu", ALL), dump(tmp_path / "vk", ALL))
    assert (result["status"], result["not_compared"]) == ("not needed", [])
    assert result["reason"] == "every stage agrees with cpu within its gate"


@pytest.mark.parametrize(("cpu", "vulkan", "expected"), [
    # the backend's dump died in layer_1: that stage is crashed, the one after never computed
    ((ALL, None, None), (ALL[:2], ("crashed", ABORT), "layer_1"),
     [("vulkan", "layer_1", "crashed", ABORT),
      ("vulkan", "layer_2", "missing", f"not computed: the dump crashed in layer_1 ({ABORT})")]),
    # the CPU's dump died in layer_1: the backend's stages from there have nothing to meet
    ((ALL[:2], ("crashed", ABORT), "layer_1"), (ALL, None, None),
     [("cpu", "layer_1", "missing", f"the cpu dump crashed in layer_1 ({ABORT}): it has no "
       "'layer_1'"),
      ("cpu", "layer_2", "missing", f"the cpu dump crashed in layer_1 ({ABORT}): it has no "
       "'layer_2'")]),
    # the backend is not built into this ggml: nothing of it is compared
    ((ALL, None, None), ([], ("unavailable", "backend vulkan is not built in"), None),
     [("vulkan", name, "unavailable", "backend vulkan is not built in") for name in ALL]),
    # a dump that finished without a stage
    ((ALL, None, None), (ALL[:3], None, None),
     [("vulkan", "layer_2", "missing", "not in the candidate dump {vk}")]),
])
def test_a_cell_not_compared_everywhere_never_agrees(tmp_path, cpu, vulkan, expected):
    result = drilled(tmp_path, dump(tmp_path / "cpu", *cpu), dump(tmp_path / "vk", *vulkan))
    found = [(r["side"], r["stage"], r["status"], r["reason"]) for r in result["not_compared"]]
    assert sorted(found) == sorted((side, stage, status, reason.format(vk=tmp_path / "vk"))
                                   for side, stage, status, reason in expected)
    assert result["status"] == "not drilled"
    assert "agrees" not in result["reason"]
    assert result["reason"].startswith(f"no stage fails, but {len(expected)} were not compared "
                                       "with cpu: ")
    side, stage, status, _ = found[0]
    assert f"{side}: {stage}" in result["reason"] and status in result["reason"]
    written = json.loads((tmp_path / "drilldown" / "drilldown.json").read_text())
    assert written["status"] == "not drilled" and written["reason"] == result["reason"]


def test_the_line_names_a_few_stages_and_counts_the_rest(tmp_path):
    from audioparity.drilldown import not_compared_text

    rows = [{"side": "vulkan", "stage": "layer_1", "status": "crashed", "reason": ABORT}] + [
        {"side": "vulkan", "stage": f"layer_{k}", "status": "missing", "reason": "not computed"}
        for k in range(2, 7)]
    assert not_compared_text(rows) == (
        f"vulkan: layer_1 crashed ({ABORT}); vulkan: layer_2, layer_3, layer_4 and 2 more "
        "missing (not computed)")
