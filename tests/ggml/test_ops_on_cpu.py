"""Ops a backend does not support, which ggml's scheduler runs on the CPU, are recorded in the
dump's manifest per stage (once per graph and stage, however often the stage computes it) and
surface in the cell's rows: on the CPU backend nothing is asked or recorded; on Vulkan
(lavapipe) with ``ggml_backend_supports_op`` saying no for SOFT_MAX (as ggml-cuda says no for a
FLASH_ATTN_EXT whose mask has several slices), every soft_max node is."""

from __future__ import annotations

import json

import ggml
import numpy as np
import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.gate_lists import resolve_gates
from audioparity.compare.plan import CellDumps, CellKey
from audioparity.dumping.artifacts import OPS_ON_CPU, DumpWriter
from audioparity.ggml import open_runtime
from audioparity.ggml.bindings import ggml as bound
from tests.conftest import vulkan_or_skip

X = np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6)


def dump_softmax(path, backend: str, graphs: int = 2, computes: int = 2) -> dict:
    """A dump of ``graphs`` graphs in stage ``layer_0`` (each two soft_max nodes and a scale,
    computed ``computes`` times), then one in ``layer_1``; its manifest."""
    with DumpWriter(path, producer="ggml", fields={"backend": backend}) as writer:
        runtime = open_runtime(writer, backend)
        with runtime:
            for stage, count in (("layer_0", graphs), ("layer_1", 1)):
                writer.running = stage
                for _ in range(count):
                    with runtime.graph() as g:
                        x = g.input("x", X)
                        y = ggml.ggml_soft_max(g.ctx, ggml.ggml_scale(g.ctx, x, 2.0))
                        g.output("y", ggml.ggml_soft_max(g.ctx, y))
                        for _ in range(computes):
                            out = g.compute()["y"]
                writer.add_tensor(stage, out, "[T, D]")
            writer.running = None
    return json.loads((path / "manifest.json").read_text())


@pytest.fixture
def softmax_unsupported(monkeypatch):
    """``ggml_backend_supports_op`` saying no for SOFT_MAX on every backend; the nodes asked
    about, by op name."""
    asked = []
    supports = bound.ggml_backend_supports_op

    def fake(backend, node):
        name = bound.ggml_op_name(node.contents.op).decode()
        asked.append(name)
        return name != "SOFT_MAX" and supports(backend, node)

    monkeypatch.setattr(bound, "ggml_backend_supports_op", fake)
    return asked


def test_on_the_cpu_backend_nothing_is_asked_or_recorded(tmp_path, softmax_unsupported):
    manifest = dump_softmax(tmp_path / "cpu", "cpu")
    assert OPS_ON_CPU not in manifest and softmax_unsupported == []


def test_an_unsupported_op_is_recorded_per_stage_once_per_graph(tmp_path, softmax_unsupported,
                                                                monkeypatch):
    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    vulkan_or_skip()
    manifest = dump_softmax(tmp_path / "vulkan", "vulkan")
    # two soft_max nodes per graph: two graphs in layer_0, each computed twice, one in layer_1
    assert manifest[OPS_ON_CPU] == [{"phase": "layer_0", "op": "SOFT_MAX", "count": 4},
                                    {"phase": "layer_1", "op": "SOFT_MAX", "count": 2}]
    # asked once per node of each graph (scale, soft_max, soft_max), not per compute
    assert sorted(softmax_unsupported) == sorted(["SCALE", "SOFT_MAX", "SOFT_MAX"] * 3)
    # and the cell's rows say so, stage by stage
    cpu = tmp_path / "cpu"
    dump_softmax(cpu, "cpu")
    gates = resolve_gates({"gates": {"default": [{"stage": "*", "nmse_max": 1e-6}]}},
                          CellKey("synthetic", "m", "audioparity", "vulkan", "f32", "",
                                  against="cpu"))
    cell = tmp_path / "cell.json"
    compare_cell(CellDumps(cpu, tmp_path / "vulkan"), json.loads(json.dumps(gates)),
                 {"family": "synthetic", "backend": "vulkan", "against": "cpu"}, cell)
    reasons = {row["stage"]: row["reason"] for row in json.loads(cell.read_text())}
    assert reasons["layer_0"].endswith("on the CPU, not vulkan: SOFT_MAX (4 nodes)")
    assert reasons["layer_1"].endswith("on the CPU, not vulkan: SOFT_MAX (2 nodes)")


def test_a_graph_computed_again_in_a_later_stage_counts_there_too(tmp_path, softmax_unsupported,
                                                                  monkeypatch):
    """A kept graph (:class:`~audioparity.ggml.GraphCache`) that one stage builds and a later
    one computes again ran its unsupported ops on the CPU in both."""
    from audioparity.ggml import GraphCache

    monkeypatch.setenv("GGML_VK_VISIBLE_DEVICES", "0")
    path = tmp_path / "vulkan"
    with DumpWriter(path, producer="ggml", fields={"backend": "vulkan"}) as writer:
        runtime = open_runtime(writer, "vulkan")
        if runtime is None:
            pytest.skip(writer.manifest["message"])
        with runtime:
            cache = GraphCache(runtime)
            for stage, computes in (("layer_0", 2), ("layer_1", 1)):
                writer.running = stage
                for _ in range(computes):
                    out = cache.compute("softmax", {"x": X}, lambda g, t: g.output(
                        "y", ggml.ggml_soft_max(g.ctx, ggml.ggml_scale(g.ctx, t["x"], 2.0))))
                writer.add_tensor(stage, out["y"], "[T, D]")
            cache.close()
            writer.running = None
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest[OPS_ON_CPU] == [{"phase": "layer_0", "op": "SOFT_MAX", "count": 1},
                                    {"phase": "layer_1", "op": "SOFT_MAX", "count": 1}]
    assert sorted(softmax_unsupported) == ["SCALE", "SOFT_MAX"]  # one graph, asked once
