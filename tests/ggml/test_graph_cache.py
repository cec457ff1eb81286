"""A :class:`GraphCache` builds a graph once per key and input shapes and computes it again on
new inputs: the same bytes as a graph built for the call, whatever graphs ran in between; a new
key or shape builds anew; while graphs are captured (a drill-down) each stage keeps its own;
past its limit, nothing is kept."""

from __future__ import annotations

import ggml
import numpy as np
import pytest

from audioparity.ggml import GraphCache, Runtime
from audioparity.ggml import graph as graph_module

RNG = np.random.default_rng(7)
WEIGHT = RNG.standard_normal((48, 64)).astype(np.float32)  # [out, in]


@pytest.fixture(scope="module")
def runtime():
    with Runtime("cpu", threads=2) as rt:
        yield rt


@pytest.fixture(scope="module")
def weights(runtime):
    return runtime.upload({"w": WEIGHT, "w_q": WEIGHT}, {"w": "f32", "w_q": "q8_0"})


def projection(weights, name: str):
    """A build of ``y = gelu(w x) * 2`` over weight ``name``, counting its calls."""
    def build(g, t) -> None:
        build.calls += 1
        y = ggml.ggml_gelu(g.ctx, ggml.ggml_mul_mat(g.ctx, weights[name], t["x"]))
        g.output("y", ggml.ggml_scale(g.ctx, y, 2.0))
    build.calls = 0
    return build


def fresh(runtime, weights, name: str, x: np.ndarray) -> np.ndarray:
    """The same graph built for this one call."""
    with runtime.graph() as g:
        projection(weights, name)(g, {"x": g.input("x", x)})
        return g.compute()["y"]


def test_a_kept_graph_computes_the_bytes_of_a_fresh_one_on_new_inputs(runtime, weights):
    cache, build, other = GraphCache(runtime), projection(weights, "w"), projection(weights, "w_q")
    try:
        for rows in (5, 9, 5, 9):
            for name, b in (("w", build), ("w_q", other)):  # another graph runs in between
                x = RNG.standard_normal((rows, 64)).astype(np.float32)
                got = cache.compute(name, {"x": x}, b)["y"]
                np.testing.assert_array_equal(got, fresh(runtime, weights, name, x))
        # one build per key and shape: (w, 5), (w, 9), (w_q, 5), (w_q, 9)
        assert (build.calls, other.calls, len(cache)) == (2, 2, 4)
    finally:
        cache.close()
    assert len(cache) == 0


def test_a_new_dtype_or_input_name_builds_anew(runtime):
    def build(g, t) -> None:
        build.calls += 1
        g.output("y", ggml.ggml_cast(g.ctx, t["x"], ggml.GGML_TYPE_F32))
    build.calls = 0
    cache = GraphCache(runtime)
    x = RNG.standard_normal((3, 64)).astype(np.float32)
    with pytest.raises(KeyError):  # the build reads "x": another name is another graph
        cache.compute("cast", {"rows": x}, build)
    assert len(cache) == 0  # a failed build keeps nothing
    np.testing.assert_array_equal(cache.compute("cast", {"x": x}, build)["y"], x)
    half = cache.compute("cast", {"x": x.astype(np.float16)}, build)["y"]
    np.testing.assert_array_equal(half, x.astype(np.float16).astype(np.float32))
    assert build.calls == 3 and len(cache) == 2
    cache.close()


def test_while_graphs_are_captured_each_stage_keeps_and_saves_its_own(runtime, weights,
                                                                      monkeypatch):
    """A drill-down pairs saved graphs by the stage that computed them: a graph kept from an
    earlier stage would leave a later one without its graph."""
    saved, stage = [], {"running": "layer_0"}

    class Capture:
        def save(self, gf, **_):
            saved.append(stage["running"])

        def phase(self):
            return stage["running"]

    monkeypatch.setattr(runtime, "capture", Capture())
    cache, build = GraphCache(runtime), projection(weights, "w")
    for running, computes in (("layer_0", 3), ("layer_0_isolated", 2)):
        stage["running"] = running
        for _ in range(computes):
            cache.compute("w", {"x": RNG.standard_normal((4, 64)).astype(np.float32)}, build)
    assert build.calls == 2 and saved == ["layer_0", "layer_0_isolated"] and len(cache) == 2
    cache.close()


def test_past_its_limit_a_call_builds_and_frees_its_own_graph(runtime, weights, monkeypatch):
    monkeypatch.setattr(graph_module, "GRAPH_CACHE_LIMIT", 1)
    cache, build = GraphCache(runtime), projection(weights, "w")
    for rows in (2, 3, 3, 2):
        x = RNG.standard_normal((rows, 64)).astype(np.float32)
        np.testing.assert_array_equal(cache.compute("w", {"x": x}, build)["y"],
                                      fresh(runtime, weights, "w", x))
    # the 2-row graph is kept; the 3-row one is built at each of its two calls
    assert build.calls == 3 and len(cache) == 1
    cache.close()


def test_a_graph_put_back_holds_its_placement_as_built(runtime, weights):
    """Before a graph is allocated again (another graph ran in between), every tensor of its
    context has the ``buffer`` and ``data`` it had as built (none, or a view's of the
    weights) and every node its sources: a stale ``data`` would be taken as allocated at an
    offset the other graph reused, a stale source read a freed copy."""
    from audioparity.ggml.bindings import address

    def placement(graph) -> dict:
        found, tensor = {}, ggml.ggml_get_first_tensor(graph.ctx)
        while tensor:
            t = tensor.contents
            found[address(tensor)] = (address(t.buffer), address(t.data),
                                      tuple(address(s) for s in t.src))
            tensor = ggml.ggml_get_next_tensor(graph.ctx, tensor)
        return found

    with runtime.graph() as a, runtime.graph() as b:
        w = weights["w"]
        half = ggml.ggml_view_2d(a.ctx, w, 64, 24, w.contents.nb[1], 0)  # in a's context
        a.output("y", ggml.ggml_mul_mat(a.ctx, half, a.input("x", np.ones((3, 64), np.float32))))
        built = placement(a)
        assert built[address(half)][1] is not None  # a view of the weights has their data
        a.compute()
        assert placement(a) != built  # allocated
        b.output("z", ggml.ggml_scale(b.ctx, b.input("x", np.ones((4096, 64), np.float32)), 2))
        b.compute()
        a._as_built()
        assert placement(a) == built
        x = RNG.standard_normal((3, 64)).astype(np.float32)
        a.set("x", x)
        np.testing.assert_allclose(a.compute()["y"], x @ WEIGHT[:24].T, rtol=1e-5, atol=1e-5)
