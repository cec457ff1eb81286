"""The drill-down's answer for a cell compared with the CPU backend, on synthetic dumps: a cell
whose every stage agrees is not needed; one whose dump crashed, is unavailable or lacks a stage
(on either side) says which side, which stage and why, and never that it agrees."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.drilldown import Drill, drill_cell
from audioparity.compare.gate_lists import resolve_gates
from audioparity.compare.plan import CellDumps, CellKey
from audioparity.dumping.artifacts import DumpWriter
from audioparity.dumping.driver import RunSettings

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
    gates = resolve_gates(SECTION, CellKey(**LABELS), ggml_backend="vulkan")
    cell = tmp_path / "cell.json"
    compare_cell(CellDumps(cpu, vulkan), json.loads(json.dumps(gates)), LABELS, cell)
    return drill_cell(None, tmp_path, tmp_path, RunSettings("f32", "vulkan", {}),
                      Drill("cpu", tmp_path / "drilldown", cell))


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
    # both dumps died before their first stage (a module missing on a bundle's host): the
    # cell still owes that stage, never no row at all
    (([], ("crashed", ABORT), "pre_encode"), ([], ("crashed", ABORT), "pre_encode"),
     [("vulkan", "pre_encode", "crashed", ABORT)]),
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
    from audioparity.compare.drilldown import not_compared_text

    rows = [{"side": "vulkan", "stage": "layer_1", "status": "crashed", "reason": ABORT}] + [
        {"side": "vulkan", "stage": f"layer_{k}", "status": "missing", "reason": "not computed"}
        for k in range(2, 7)]
    assert not_compared_text(rows) == (
        f"vulkan: layer_1 crashed ({ABORT}); vulkan: layer_2, layer_3, layer_4 and 2 more "
        "missing (not computed)")


def cuda_dump(tmp_path: Path, env: dict[str, str], backend: str = "cuda") -> Path:
    """A dump as a drill-down's CUDA side leaves it (manifest ``backend``, ``backend_env``,
    ``device_properties`` of an H200), its one saved graph the one of
    :func:`tests.ggml.test_graphs.build`, computed on the CPU: a q8_0 matmul of 5 columns, then
    an f32 one of ``[48, 32]`` by 5 columns."""
    from tests.ggml.test_graphs import saved

    path = tmp_path / backend
    with DumpWriter(path, producer="ggml", fields={
            "backend": backend, "backend_env": env,
            "device_properties": {"name": "NVIDIA H200", "compute capability": "9.0"}}):
        pass
    saved(path, "graphs")
    return path


def first_not_float32(dump: Path, source_type: str) -> dict:
    """The MUL_MAT node of the dump's graph whose weight is of ``source_type``, as a drill-down
    names it: the first op not in float32 (an NMSE of TF32's order) of graph 0."""
    from audioparity.ggml import Runtime
    from audioparity.ggml.graphs import GRAPHS, drill_down

    folder = dump / GRAPHS / "0"
    with Runtime("cpu", threads=1) as rt:
        nodes = drill_down(folder, folder, rt.backend, rt.backend, "cuda")["nodes"]
    node = next(n for n in nodes if n["op"] == "MUL_MAT" and n["source_types"][0] == source_type)
    return {**node, "nmse": 3e-7, "threshold": 5e-4, "graph": 0, "phase": "layer_0"}


@pytest.mark.parametrize(("env", "weight", "expected"), [
    # f32 [48, 32] by 5 columns on an H200: no mmvf (ne11 <= 3), no mmf (48 % 32): cuBLAS
    ({}, "f32", "NMSE 3e-07: TF32 (cuBLAS in TF32 math mode; GGML_CUDA_DISABLE_TF32=1 "
                "(cuda-strict) computes it in float32)"),
    # the same under cuda-strict: float32, so nothing but 'not float32' to say
    ({"GGML_CUDA_DISABLE_TF32": "1"}, "f32", "NMSE 3e-07: not float32 (ggml's tolerance 0.0005)"),
    # a q8_0 weight takes mmvq, which has no TF32
    ({}, "q8_0", "NMSE 3e-07: not float32 (ggml's tolerance 0.0005)"),
])
def test_a_cuda_matmul_in_tf32_is_named_as_the_cause(tmp_path, env, weight, expected):
    from audioparity.compare.drilldown import first_bad_text, kernel_cause

    dump = cuda_dump(tmp_path, env)
    node = first_not_float32(dump, weight)
    node["cause"] = kernel_cause(dump, node)
    line = first_bad_text({"first_bad": None, "first_not_float32": node})
    assert line.startswith(f"MUL_MAT #{node['position']} (layer_0, feeds ")
    assert line.endswith(f"): {expected}")
    # above ggml's tolerance, the cause follows the verdict
    bad = first_bad_text({"first_bad": {**node, "verdict": "above threshold", "nmse": 1e-3},
                          "first_not_float32": None})
    assert bad.endswith(": NMSE 0.001 > 0.0005" + (f": {node['cause']}" if node["cause"] else ""))


def test_no_cuda_cause_is_named_on_another_backend(tmp_path):
    from audioparity.compare.drilldown import kernel_cause

    dump = cuda_dump(tmp_path, {}, backend="vulkan")
    assert kernel_cause(dump, first_not_float32(dump, "f32")) is None
