"""The ggml runtime layer against numpy float64: storage round trips, quantisation error, matmul,
graphs with several outputs, persistent state written by expanded nodes in declaration order,
unused inputs, and backend availability."""

from __future__ import annotations

import ggml
import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import BackendUnavailable, Runtime, doctor, storage_supported

RNG = np.random.default_rng(1234)
WEIGHT = RNG.standard_normal((96, 64)).astype(np.float32)  # [out, in]
ACTIVATION = RNG.standard_normal((7, 64)).astype(np.float32)  # [T, in]


@pytest.fixture(scope="module")
def runtime():
    with Runtime("cpu", threads=1) as rt:
        yield rt


def round_bf16(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 (round to nearest even) -> float32, in integer arithmetic."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return (rounded.astype(np.uint32) << 16).view(np.float32)


def round_f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def q8_0_bound(x: np.ndarray) -> np.ndarray:
    """Largest |x - dequant(q8_0(x))| per element: half a step d = amax/127 of its 32-block,
    plus 127 steps of the f16 rounding of d."""
    blocks = np.abs(x.astype(np.float64)).reshape(-1, 32)
    step = blocks.max(axis=1, keepdims=True) / 127
    f16_error = np.abs(step - step.astype(np.float16).astype(np.float64))
    return np.broadcast_to(0.5 * step + 127 * f16_error, blocks.shape).reshape(x.shape)


def test_f32_round_trip_is_exact(runtime):
    weights = runtime.upload({"w": WEIGHT}, {"w": "f32"})
    np.testing.assert_array_equal(weights.read("w"), WEIGHT)
    assert weights.shape("w") == WEIGHT.shape and weights.storage("w") == "f32"


@pytest.mark.parametrize("storage, rounding", [("f16", round_f16), ("bf16", round_bf16)])
def test_half_precision_round_trip_rounds_to_nearest_even(runtime, storage, rounding):
    weights = runtime.upload({"w": WEIGHT}, {"w": storage})
    np.testing.assert_array_equal(weights.read("w"), rounding(WEIGHT))


def test_q8_0_round_trip_error_is_within_half_a_step(runtime):
    weights = runtime.upload({"w": WEIGHT}, {"w": "q8_0"})
    error = np.abs(weights.read("w").astype(np.float64) - WEIGHT.astype(np.float64))
    assert np.all(error <= q8_0_bound(WEIGHT) * (1 + 1e-6))
    assert error.max() > 0  # really quantised


def test_q8_0_needs_rows_of_32(runtime):
    assert storage_supported("q8_0", (5, 64)) and not storage_supported("q8_0", (64, 48))
    with pytest.raises(AudioparityError, match="multiple of 32"):
        runtime.upload({"w": np.ones((4, 48), np.float32)}, {"w": "q8_0"})


def test_missing_weight_is_a_key_error(runtime):
    weights = runtime.upload({"w": WEIGHT}, {"w": "f32"})
    assert weights.get("absent") is None
    with pytest.raises(AudioparityError, match="absent"):
        weights["absent"]


def _matmul(runtime, storage: str) -> np.ndarray:
    weights = runtime.upload({"w": WEIGHT}, {"w": storage})
    with runtime.graph() as g:
        y = ggml.ggml_mul_mat(g.ctx, weights["w"], g.input("x", ACTIVATION))
        g.output("y", y)
        return g.compute()["y"]


def test_f32_matmul_matches_float64(runtime):
    expected = ACTIVATION.astype(np.float64) @ WEIGHT.astype(np.float64).T
    out = _matmul(runtime, "f32")
    assert out.shape == (7, 96)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-5)


@pytest.mark.parametrize("storage, rounding", [("f16", round_f16), ("bf16", round_bf16)])
def test_half_precision_matmul_rounds_activations_to_the_weight_type(runtime, storage, rounding):
    """ggml's CPU mul_mat converts the activations to the weight's dot type."""
    expected = rounding(ACTIVATION).astype(np.float64) @ rounding(WEIGHT).astype(np.float64).T
    np.testing.assert_allclose(_matmul(runtime, storage), expected, rtol=0, atol=1e-4)


def test_q8_0_matmul_error_is_bounded(runtime):
    """Both operands quantised: |error| <= sum |x| bound(w) + |w| bound(x) + bound(x) bound(w)."""
    x, w = ACTIVATION.astype(np.float64), WEIGHT.astype(np.float64)
    bx, bw = q8_0_bound(ACTIVATION), q8_0_bound(WEIGHT)
    bound = np.abs(x) @ bw.T + bx @ np.abs(w).T + bx @ bw.T
    error = np.abs(_matmul(runtime, "q8_0") - x @ w.T)
    assert np.all(error <= bound * 1.01 + 1e-5)


def test_graph_returns_every_output_in_numpy_order_and_recomputes(runtime):
    weights = runtime.upload({"w": WEIGHT}, {"w": "f32"})
    with runtime.graph() as g:
        y = ggml.ggml_mul_mat(g.ctx, weights["w"], g.input("x", ACTIVATION))
        g.output("y", y)
        g.output("y_t", ggml.ggml_transpose(g.ctx, y))  # a non-contiguous view
        g.output("sum", ggml.ggml_sum_rows(g.ctx, y), ndim=2)
        first = g.compute()
        g.set("x", 2 * ACTIVATION)
        second = g.compute()
    expected = ACTIVATION.astype(np.float64) @ WEIGHT.astype(np.float64).T
    assert first["y"].shape == (7, 96) and first["y_t"].shape == (96, 7)
    assert first["sum"].shape == (7, 1)
    np.testing.assert_allclose(first["y_t"], expected.T, atol=1e-5)
    np.testing.assert_allclose(first["sum"][:, 0], expected.sum(axis=1), atol=1e-4)
    np.testing.assert_allclose(second["y"], 2 * expected, atol=2e-5)


def test_graph_rejects_float64_inputs_and_reshaped_updates(runtime):
    with runtime.graph() as g:
        with pytest.raises(AudioparityError, match="float64"):
            g.input("x", np.ones((2, 3)))
        g.input("y", np.ones((2, 3), np.float32))
        with pytest.raises(AudioparityError, match=r"expected float32 \[2, 3\]"):
            g.set("y", np.ones((3, 2), np.float32))


def test_unused_input_raises_naming_it_instead_of_aborting(runtime):
    """ggml leaves an input no node uses unallocated; setting it would abort the process."""
    with runtime.graph() as g:
        x = g.input("x", ACTIVATION)
        g.input("mask", np.zeros((7, 7), np.float32))
        g.output("y", ggml.ggml_scale(g.ctx, x, 2.0))
        with pytest.raises(AudioparityError, match=r"input 'mask' .*not used"):
            g.compute()


def _rows(ctx, tensor, first: int, n: int):
    """View of numpy rows ``first..first+n-1`` of a 2-D tensor."""
    nb1 = tensor.contents.nb[1]
    return ggml.ggml_view_2d(ctx, tensor, tensor.contents.ne[0], n, nb1, first * nb1)


@pytest.mark.parametrize("storage, rounding", [("f32", lambda x: x), ("f16", round_f16)])
def test_state_starts_at_zero_and_keeps_expanded_writes_across_graphs(runtime, storage,
                                                                      rounding):
    state = runtime.state({"cache": ((6, 64), storage)})
    assert state.shape("cache") == (6, 64) and state.storage("cache") == storage
    np.testing.assert_array_equal(state.read("cache"), np.zeros((6, 64), np.float32))
    # not marked as weights: the scheduler treats it as ordinary (mutable) memory
    assert ggml.ggml_backend_buffer_get_usage(state._buffer) == \
        ggml.GGML_BACKEND_BUFFER_USAGE_ANY
    rows = ACTIVATION[:2]
    with runtime.graph() as g:
        g.expand(ggml.ggml_cpy(g.ctx, g.input("rows", rows), _rows(g.ctx, state["cache"], 3, 2)))
        assert g.compute() == {}
    expected = np.zeros((6, 64), np.float32)
    expected[3:5] = rounding(rows)
    np.testing.assert_array_equal(state.read("cache"), expected)
    with runtime.graph() as g:  # a later graph reads what the first one wrote
        g.output("all", ggml.ggml_scale(g.ctx, ggml.ggml_cast(g.ctx, state["cache"],
                                                              ggml.GGML_TYPE_F32), 1.0))
        np.testing.assert_array_equal(g.compute()["all"], expected)


def test_nodes_run_in_the_order_of_expand_and_output_calls(runtime):
    """A read of state rows declared after the write sees it; one declared before does not
    (the write has no data dependency on the read)."""
    state = runtime.state({"cache": ((4, 64), "f32")})
    with runtime.graph() as g:
        g.output("before", ggml.ggml_sum(g.ctx, state["cache"]))
        g.expand(ggml.ggml_cpy(g.ctx, g.input("row", ACTIVATION[:1]),
                               _rows(g.ctx, state["cache"], 1, 1)))
        g.output("after", ggml.ggml_scale(g.ctx, _rows(g.ctx, state["cache"], 0, 2), 1.0))
        out = g.compute()
        with pytest.raises(AudioparityError, match="after the first compute"):
            g.expand(ggml.ggml_scale(g.ctx, state["cache"], 1.0))
    assert out["before"].item() == 0.0
    np.testing.assert_array_equal(out["after"][1], ACTIVATION[0])
    np.testing.assert_array_equal(out["after"][0], np.zeros(64, np.float32))


def test_graph_without_outputs_or_expanded_nodes_is_an_error(runtime):
    with runtime.graph() as g:
        with pytest.raises(AudioparityError, match="no outputs and no expanded nodes"):
            g.compute()


@pytest.mark.parametrize("backend, flag", [("cuda", "GGML_USE_CUDA"),
                                           ("vulkan", "GGML_USE_VULKAN")])
def test_backend_not_built_in_raises_backend_unavailable(backend, flag):
    if getattr(ggml, flag):
        pytest.skip(f"{backend} is built into this ggml-python")
    with pytest.raises(BackendUnavailable, match=backend):
        Runtime(backend)
    assert doctor()["backends"][backend] is False


def test_unknown_backend_is_an_error():
    with pytest.raises(AudioparityError, match="unknown backend"):
        Runtime("metal")


def test_doctor_reports_versions_and_the_cpu():
    report = doctor()
    assert report["ggml_python"] == ggml.__version__
    assert report["backends"]["cpu"] is True
    assert any(device["registry"] == "CPU" for device in report["devices"])


@pytest.mark.parametrize("storage", ["f32", "f16", "bf16", "q8_0"])
def test_weights_streamed_in_row_blocks_equal_one_upload(runtime, storage):
    whole = runtime.upload({"w": WEIGHT}, {"w": storage})
    blocks = [("w", 0, WEIGHT[:40]), ("w", 40, WEIGHT[40:41]), ("w", 41, WEIGHT[41:])]
    streamed = runtime.load({"w": WEIGHT.shape}, {"w": storage}, iter(blocks))
    np.testing.assert_array_equal(streamed.read("w"), whole.read("w"))


@pytest.mark.parametrize("blocks, message", [
    ([("w", 0, WEIGHT[:40])], r"'w' \[96, 64\]: 40 of 96 rows uploaded"),
    ([("w", 0, WEIGHT), ("w", 0, WEIGHT[:1])], r"block of rows 0\.\.1 after 96 of 96 rows"),
    ([("w", 0, WEIGHT[:, :32])], r"block of shape \[96, 32\]; expected rows of 64 values"),
    ([("v", 0, WEIGHT)], r"weight 'v' was not allocated"),
])
def test_streamed_blocks_must_cover_each_weight_once(runtime, blocks, message):
    with pytest.raises(AudioparityError, match=message):
        runtime.load({"w": WEIGHT.shape}, {"w": "f32"}, iter(blocks))


def test_a_graph_computed_again_after_another_on_two_backends():
    """The scheduler rewires a node's source to its copy on the other backend and frees the
    copy at its next allocation: a graph computed again after another one ran must be put back
    as built (an abort in the scheduler before)."""
    from tests.conftest import vulkan_or_skip

    vulkan_or_skip()
    with Runtime("vulkan", threads=1) as rt:
        weights = rt.upload({"w": WEIGHT}, {"w": "f32"})
        first, second = rt.graph(), rt.graph()
        first.output("y", ggml.ggml_mul_mat(first.ctx, weights["w"],
                                            first.input("x", ACTIVATION)))
        second.output("z", ggml.ggml_scale(second.ctx, second.input("x", ACTIVATION), 2.0))
        with first, second:
            for scale in (1.0, -3.0):
                first.set("x", ACTIVATION * np.float32(scale))
                got = first.compute()["y"]
                # loose: ggml-vulkan may round an f32 matmul's operands to f16 (fp16 devices)
                np.testing.assert_allclose(got, scale * ACTIVATION @ WEIGHT.T, rtol=1e-2,
                                           atol=5e-2)
                np.testing.assert_array_equal(second.compute()["z"], 2 * ACTIVATION)


WEIGHTS = {"w": WEIGHT, "norm": RNG.standard_normal(64).astype(np.float32)}


@pytest.mark.parametrize("backend", ["cpu", "vulkan"])
@pytest.mark.parametrize("storage", ["f32", "f16", "bf16", "q8_0"])
def test_mapped_weights_hold_and_compute_the_bytes_that_were_saved(tmp_path, backend, storage):
    """A saved file mapped back holds the same bytes (read back through ggml's own
    dequantisation) and gives the same matmul, bit for bit, as the weights it was saved from;
    on the CPU in place, on another backend copied from the mapping."""
    if backend == "vulkan":
        from tests.conftest import vulkan_or_skip

        vulkan_or_skip()
    types = {"w": storage, "norm": "f32"}
    shapes = {name: array.shape for name, array in WEIGHTS.items()}
    with Runtime(backend, threads=1) as rt:
        uploaded = rt.upload(WEIGHTS, types)
        uploaded.save(tmp_path / "w.gguf", {"note": "x"})
        mapped = rt.map(tmp_path / "w.gguf", shapes, types)
        products = []
        for weights in (uploaded, mapped):
            np.testing.assert_array_equal(weights.read("w"), uploaded.read("w"))
            np.testing.assert_array_equal(weights.read("norm"), WEIGHTS["norm"])
            with rt.graph() as g:
                g.output("y", ggml.ggml_mul_mat(g.ctx, weights["w"], g.input("x", ACTIVATION)))
                products.append(g.compute()["y"])
        np.testing.assert_array_equal(products[0], products[1])
    assert [p.name for p in tmp_path.iterdir()] == ["w.gguf"]  # no partial file left


@pytest.mark.parametrize("shapes, types, message", [
    ({"w": (96, 64), "norm": (64,)}, {"w": "f16", "norm": "f32"},
     r"tensor 'w' is \[96, 64\] f32; the model wants \[96, 64\] f16"),
    ({"w": (64, 96), "norm": (64,)}, {"w": "f32", "norm": "f32"},
     r"tensor 'w' is \[96, 64\] f32; the model wants \[64, 96\] f32"),
    ({"w": (96, 64)}, {"w": "f32"}, r"tensor 'norm' is \[64\] f32; the model wants none"),
    ({"w": (96, 64), "norm": (64,), "b": (3,)}, {"w": "f32", "norm": "f32", "b": "f32"},
     r"tensor 'b' is absent; the model wants \[3\] f32"),
])
def test_a_weights_file_of_other_shapes_or_types_is_refused(runtime, tmp_path, shapes, types,
                                                            message):
    runtime.upload(WEIGHTS, {"w": "f32", "norm": "f32"}).save(tmp_path / "w.gguf")
    with pytest.raises(AudioparityError, match=message + r" \(convert it again\)"):
        runtime.map(tmp_path / "w.gguf", shapes, types)


def test_an_unreadable_weights_file_is_one_error(runtime, tmp_path):
    (tmp_path / "w.gguf").write_bytes(b"not a gguf")
    with pytest.raises(AudioparityError, match=r"weights file .*w\.gguf: unreadable"):
        runtime.map(tmp_path / "w.gguf", {"w": (96, 64)}, {"w": "f32"})


def _square(g, rows: int, cols: int):
    """A graph computing ``x x^T`` of ``x`` = ones ``[rows, cols]``: every value ``cols``."""
    x = g.input("x", np.ones((rows, cols), np.float32))
    g.output("y", ggml.ggml_mul_mat(g.ctx, x, x))


def test_a_graph_whose_buffers_exceed_free_memory_is_refused_before_it_computes(monkeypatch):
    """The compute buffers are sized first and compared with the memory free: a graph that
    would not fit is one error line, not a process killed for memory."""
    from audioparity.ggml import graph as module

    with Runtime("cpu", threads=1) as rt:  # its own: no earlier graph's buffers held
        monkeypatch.setattr(module, "free_bytes", lambda handle: 1024)
        with rt.graph() as g:
            _square(g, 64, 512)
            with pytest.raises(AudioparityError, match=r"a graph of \d+ nodes needs 0 MiB of "
                               r"compute buffers on CPU, more than the 0 MiB free \(machine or "
                               r"AUDIOPARITY_MEMORY_MB\): the input is too long"):
                g.compute()
        monkeypatch.undo()
        with rt.graph() as g:
            _square(g, 64, 512)
            np.testing.assert_array_equal(g.compute()["y"], np.full((64, 64), 512, np.float32))


def test_a_graph_that_fits_the_buffers_an_earlier_one_left_needs_no_free_memory(monkeypatch):
    """The scheduler keeps its compute buffers between graphs, growing them only: a graph as
    large as one before it runs with no memory free, a larger one is refused with what it
    needs against the buffers held plus the memory free."""
    from audioparity.ggml import graph as module

    with Runtime("cpu", threads=1) as rt:
        with rt.graph() as g:
            _square(g, 512, 2048)  # [512, 512] from [512, 2048] twice: 5 MiB of buffers
            g.compute()
        monkeypatch.setattr(module, "free_bytes", lambda handle: 1024)
        with rt.graph() as g:
            _square(g, 512, 2048)
            np.testing.assert_array_equal(g.compute()["y"], np.full((512, 512), 2048,
                                                                    np.float32))
        with rt.graph() as g:
            _square(g, 1024, 4096)  # 20 MiB
            with pytest.raises(AudioparityError, match=r"needs 20 MiB of compute buffers on CPU, "
                               r"more than the 5 MiB free"):
                g.compute()


def test_a_dump_records_the_seconds_its_graphs_compute_per_stage(tmp_path):
    """``graph_seconds`` holds the backend's compute of each stage's graphs, not the host work
    around them; a stage without graphs has none."""
    import json
    import time

    from audioparity.dumping.artifacts import GRAPH_SECONDS, DumpWriter
    from audioparity.ggml import open_runtime

    x = RNG.standard_normal((256, 512)).astype(np.float32)
    with DumpWriter(tmp_path / "d", producer="ggml", fields={"backend": "cpu"}) as writer:
        with open_runtime(writer, "cpu") as rt:
            w = rt.upload({"w": x}, {"w": "f32"})
            with writer.timed("layer_0"):
                time.sleep(0.2)  # host work, not the graph's
                for _ in range(3):
                    with rt.graph() as g:
                        g.output("y", ggml.ggml_mul_mat(g.ctx, w["w"], g.input("x", x)))
                        g.compute()
            with writer.timed("decode"):
                time.sleep(0.01)
            writer.add_tensor("layer_0", x, "[T, D]")
    manifest = json.loads((tmp_path / "d" / "manifest.json").read_text())
    seconds, graphs = manifest["seconds"], manifest[GRAPH_SECONDS]
    assert set(graphs) == {"layer_0"}
    assert 0 < graphs["layer_0"] < seconds["layer_0"] - 0.2
