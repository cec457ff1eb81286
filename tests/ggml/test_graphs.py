"""Saved graphs and the drill-down on the CPU backend, against numpy float64 and against the
graph as first computed: a saved graph rebuilt reproduces its outputs bit for bit; two saves of
one graph drill down to nothing; an op changed in one of them, an op only one of them has and a
weight stored differently are each named at the node where they enter; inputs the two cells
computed differently are fed the baseline's, so no node is blamed for them."""

from __future__ import annotations

import json
from pathlib import Path

import ggml
import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Runtime
from audioparity.ggml.graphs import (
    FLOAT32_NMSE,
    GRAPH,
    GraphCapture,
    LoadedGraph,
    drill_down,
    drill_pairs,
    op_threshold,
)

RNG = np.random.default_rng(7)
W1 = RNG.standard_normal((48, 64)).astype(np.float32)  # [out, in]
W2 = RNG.standard_normal((32, 48)).astype(np.float32)
TABLE = RNG.standard_normal((10, 64)).astype(np.float32)  # an embedding
X = RNG.standard_normal((5, 64)).astype(np.float32)
IDS = np.array([3, 1, 4, 1, 5, 9], np.int32)


def build(rt: Runtime, weights, *, scale: float = 0.5, cast: bool = False):
    """A small graph of the ops the ports use: a matmul on a q8_0 weight, a silu, a scale, an
    f32 matmul, rows of an embedding picked through a view of an int32 input, a softmax, a
    transposed input made contiguous; one f16 round trip of an intermediate with ``cast``.
    Returns its outputs."""
    with rt.graph() as g:
        x = g.input("x", X)
        ids = g.input("ids", IDS)
        h = ggml.ggml_mul_mat(g.ctx, weights["w1"], x)  # ne [48, 5]
        h = ggml.ggml_silu(g.ctx, h)
        if cast:
            h = ggml.ggml_cast(g.ctx, ggml.ggml_cast(g.ctx, h, ggml.GGML_TYPE_F16),
                               ggml.GGML_TYPE_F32)
        h = ggml.ggml_scale(g.ctx, h, scale)
        y = ggml.ggml_soft_max(g.ctx, ggml.ggml_mul_mat(g.ctx, weights["w2"], h))
        g.output("y", y)
        picked = ggml.ggml_get_rows(g.ctx, weights["table"],
                                    ggml.ggml_view_1d(g.ctx, ids, 3, 2 * 4))  # ids[2:5]
        g.output("rows", picked)
        g.output("x_t", ggml.ggml_cont(g.ctx, ggml.ggml_transpose(g.ctx, x)))  # a strided view
        return g.compute()


def saved(tmp_path: Path, name: str, storage: str = "q8_0", **kwargs) -> tuple[Path, dict]:
    """The graph of :func:`build` saved at its first compute into ``tmp_path/name/0``, and what
    that compute returned."""
    with Runtime("cpu", threads=1) as rt:
        rt.capture = GraphCapture(tmp_path / name, lambda: "phase-a")  # as a drill-down's
        weights = rt.upload({"w1": W1, "w2": W2, "table": TABLE},
                            {"w1": storage, "w2": "f32", "table": "f16"})
        outputs = build(rt, weights, **kwargs)
    return tmp_path / name / "0", outputs


@pytest.fixture(scope="module")
def cpu():
    with Runtime("cpu", threads=1) as rt:
        yield rt


def test_a_saved_graph_rebuilt_computes_its_outputs_bit_for_bit(tmp_path, cpu):
    folder, outputs = saved(tmp_path, "a")
    description = json.loads((folder / GRAPH).read_text())
    assert description["phase"] == "phase-a"
    assert sorted(description["outputs"]) == ["rows", "x_t", "y"]
    kinds = {r["name"]: r.get("kind") for r in description["tensors"]}
    assert kinds["w1"] == kinds["table"] == "weight" and kinds["x"] == kinds["ids"] == "input"
    loaded = LoadedGraph(folder, cpu.backend)
    try:
        loaded.compute()
        for name, expected in outputs.items():
            tensor = loaded.tensors[description["outputs"][name]]
            got = loaded.read(tensor).reshape(expected.shape)
            np.testing.assert_array_equal(got, expected.astype(np.float64))
    finally:
        loaded.close()
    # the picked rows are the embedding's rows 4, 1, 5 (f16-stored), as numpy picks them
    np.testing.assert_array_equal(outputs["rows"],
                                  TABLE.astype(np.float16).astype(np.float32)[[4, 1, 5]])


def test_two_saves_of_one_graph_drill_down_to_nothing(tmp_path, cpu):
    a, _ = saved(tmp_path, "a")
    b, _ = saved(tmp_path, "b")
    result = drill_down(a, b, cpu.backend, cpu.backend, "cpu")
    assert result["structure"] == "same"
    assert result["first_bad"] is None and result["first_not_float32"] is None
    measured = [n for n in result["nodes"] if "nmse" in n]
    assert measured and all(n["nmse"] == 0.0 for n in measured)
    assert {n["feeds"] for n in measured} == {"y", "rows", "x_t"}


def test_an_op_changed_in_one_graph_is_named_at_its_node(tmp_path, cpu):
    a, _ = saved(tmp_path, "a", scale=0.5)
    b, _ = saved(tmp_path, "b", scale=0.5 * (1 + 1e-3))
    result = drill_down(a, b, cpu.backend, cpu.backend, "target")
    # a different op parameter is another op: the scale nodes align with nothing, and the
    # first node only the target has is the scale
    assert result["structure"].startswith("differs")
    assert result["first_bad"]["op"] == "SCALE"
    assert result["first_bad"]["verdict"] == "only in target"


def test_an_f16_round_trip_only_one_graph_has_is_the_first_bad_op(tmp_path, cpu):
    a, _ = saved(tmp_path, "a")
    b, _ = saved(tmp_path, "b", cast=True)
    result = drill_down(a, b, cpu.backend, cpu.backend, "vulkan")
    bad = result["first_bad"]
    assert (bad["op"], bad["type"], bad["verdict"]) == ("CPY", "f16", "only in vulkan")
    assert bad["feeds"] == "y"
    # the nodes after it align again, each fed the baseline's values of its sources: the scale
    # after the f16 round trip carries the rounding (NMSE ~1e-7, above float32 noise)
    scale = next(n for n in result["nodes"] if n["op"] == "SCALE")
    assert FLOAT32_NMSE < scale["nmse"] < 1e-5


def test_the_drill_down_stops_at_the_first_graph_with_a_bad_op(tmp_path):
    """Graphs after the first bad one read what it computed: they are not drilled."""
    clean, _ = saved(tmp_path, "clean")
    again, _ = saved(tmp_path, "again")
    cast, _ = saved(tmp_path, "cast", cast=True)
    done = tmp_path / "done.jsonl"
    drill_pairs([(0, clean, again), (1, clean, cast), (2, clean, again)], done, "cpu", "cpu")
    records = [json.loads(line) for line in done.read_text().splitlines()]
    assert [r["graph"] for r in records] == [0, 1]
    assert records[0]["first_bad"] is None and records[1]["first_bad"]["op"] == "CPY"


def test_without_a_bad_op_the_drill_down_reads_every_graph(tmp_path):
    """No graph with a bad op (a Vulkan cell whose every op is within ggml's bound, failing
    only the f32 gates): every graph is drilled, so a bad op in the last one is found."""
    clean, _ = saved(tmp_path, "clean")
    again, _ = saved(tmp_path, "again")
    done = tmp_path / "done.jsonl"
    drill_pairs([(0, clean, again), (1, clean, again), (2, clean, again)], done, "cpu", "cpu")
    records = [json.loads(line) for line in done.read_text().splitlines()]
    assert [r["graph"] for r in records] == [0, 1, 2]
    assert all(r["first_bad"] is None and len(r["nodes"]) > 1 for r in records)


def test_a_weight_stored_differently_is_named(tmp_path, cpu):
    a, _ = saved(tmp_path, "a", storage="q8_0")
    b, _ = saved(tmp_path, "b", storage="f32")
    result = drill_down(a, b, cpu.backend, cpu.backend, "target")
    differing = [leaf["name"] for leaf in result["leafs"] if leaf["kind"] == "weight"]
    assert differing == ["w1"]
    assert result["first_bad"]["verdict"] == "leaf differs"


def test_inputs_the_two_cells_computed_differently_are_fed_the_baselines(tmp_path, cpu):
    global X
    a, _ = saved(tmp_path, "a")
    kept, X = X, X * (1 + 1e-3)  # what an earlier graph of the other cell handed this one
    try:
        b, _ = saved(tmp_path, "b")
    finally:
        X = kept
    result = drill_down(a, b, cpu.backend, cpu.backend, "target")
    assert result["first_bad"] is None
    assert [(leaf["name"], leaf["kind"]) for leaf in result["leafs"]] == [("x", "input")]
    assert all(n.get("nmse", 0.0) == 0.0 for n in result["nodes"])


def test_thresholds_are_ggml_test_backend_ops():
    assert op_threshold("MUL_MAT") == 5e-4 and op_threshold("ADD") == 1e-7
    assert op_threshold("SOFT_MAX") == 1e-6
    assert op_threshold("FLASH_ATTN_EXT", kv_length=40000) == pytest.approx(1e-3)


def test_a_graph_saved_by_another_ggml_is_refused(tmp_path, cpu):
    folder, _ = saved(tmp_path, "a")
    description = json.loads((folder / GRAPH).read_text())
    description["ggml_build"]["ggml"] = "0.0.1"
    (folder / GRAPH).write_text(json.dumps(description))
    with pytest.raises(AudioparityError, match="saved by ggml 0.0.1"):
        LoadedGraph(folder, cpu.backend)
