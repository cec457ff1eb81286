"""audioparity.dumping.storage against ggml itself: the stored values are the bytes
ggml_quantize_chunk writes, read back by ggml; the CPU backend's matmul equals float64 arithmetic on
the emulated operands; a torch model made to emulate a weight type computes that arithmetic."""

from __future__ import annotations

import ggml
import numpy as np
import pytest
import torch

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import STORAGE_TYPES
from audioparity.dumping.emulation import emulated_dir, emulating, emulations
from audioparity.dumping.storage import (
    BITS_PER_WEIGHT,
    BLOCK_SIZES,
    EMULATED_TYPES,
    VEC_DOT_TYPES,
    matmul_input,
    min_term,
    storage_or_fallback,
    storage_record,
    stored,
)
from audioparity.ggml import Runtime

RNG = np.random.default_rng(11)


def _values(rows: int, cols: int, huge: float = 1e5) -> np.ndarray:
    """Normal values with the cases rounding is decided on: a zero block, exact halves of a
    q8_0 step, one ``huge`` value (beyond the f16 range), a subnormal-sized one."""
    x = RNG.standard_normal((rows, cols)).astype(np.float32)
    x[0, :32] = 0.0
    x[1, :32] = np.arange(32, dtype=np.float32) - 15.5  # amax 16.5: steps of 16.5/127
    x[2, 5] = huge
    x[3, 7] = 1e-30
    return x


def test_block_sizes_are_ggml_s() -> None:
    from audioparity.ggml import STORAGE_TYPES

    assert list(BLOCK_SIZES) == list(STORAGE_TYPES)
    assert {name: ggml.ggml_blck_size(STORAGE_TYPES[name]) for name in BLOCK_SIZES} == BLOCK_SIZES


@pytest.mark.parametrize("storage", STORAGE_TYPES)
def test_stored_is_what_a_ggml_backend_holds(storage: str) -> None:
    """Bit for bit: the values a port's weights hold on the CPU backend, uploaded and read back
    through the backend (tests/test_quants.py holds the bytes to ggml's block layouts)."""
    x = _values(8, 512)
    with Runtime("cpu") as runtime:
        weights = runtime.upload({"w": x}, {"w": storage})
        assert weights.storage("w") == storage
        ggml_values = weights.read("w")
    np.testing.assert_array_equal(stored(x, storage), ggml_values)


def _ggml_matmul(w: np.ndarray, x: np.ndarray, storage: str) -> np.ndarray:
    """``x @ w.T`` by the CPU backend, ``w`` stored as ``storage``."""
    with Runtime("cpu", threads=2) as runtime:
        weights = runtime.upload({"w": w}, {"w": storage})
        with runtime.graph() as g:
            g.output("y", ggml.ggml_mul_mat(g.ctx, weights["w"], g.input("x", x)))
            return g.compute()["y"]


def _emulated_product(x: np.ndarray, w_stored: np.ndarray, storage: str) -> np.ndarray:
    """float64 ``matmul_input(x) @ w_stored.T``, plus the q8_1 block sums' :func:`min_term`."""
    product = matmul_input(x, storage).astype(np.float64) @ w_stored.astype(np.float64).T
    term = min_term(x, w_stored, storage)
    return product if term is None else product + term


@pytest.mark.parametrize("storage", EMULATED_TYPES)
def test_cpu_matmul_is_float64_on_the_emulated_operands(storage: str) -> None:
    """The CPU backend's product is float64 arithmetic on stored(w) and matmul_input(x) (and,
    for q4_1 and q5_1, the min term of their f16 block sums) within float32 summation noise, for
    every input type (VEC_DOT_TYPES); without rounding x, or without the min term, it is orders
    of magnitude off."""
    w, x = _values(24, 512, huge=300.0), RNG.standard_normal((7, 512)).astype(np.float32)
    y = _ggml_matmul(w, x, storage)
    w_stored = stored(w, storage).astype(np.float64)
    emulated = _emulated_product(x, w_stored.astype(np.float32), storage)
    naive = x.astype(np.float64) @ w_stored.T

    def nmse(a: np.ndarray) -> float:
        return float(np.sum((y - a) ** 2) / np.sum(a ** 2))

    assert nmse(emulated) < 1e-13
    assert nmse(naive) > 1e3 * max(nmse(emulated), 1e-16)
    if VEC_DOT_TYPES[storage] == "q8_1":
        without = matmul_input(x, storage).astype(np.float64) @ w_stored.T
        assert nmse(without) > 1e3 * max(nmse(emulated), 1e-16)
    else:
        assert min_term(x, w_stored, storage) is None


def test_q8_0_inputs_round_half_to_even_weights_half_away() -> None:
    """A block whose scaled values fall on halves: ggml's weights round them away from zero
    (roundf), its x86 matmul inputs to even (_mm256_round_ps)."""
    x = np.zeros((1, 32), np.float32)
    x[0, 0], x[0, 1] = 127.0, 2.5  # d = 1: 2.5 scales to exactly 2.5
    assert stored(x, "q8_0")[0, 1] == 3.0
    assert matmul_input(x, "q8_0")[0, 1] == 2.0


def test_stored_refuses_rows_q8_0_cannot_hold() -> None:
    with pytest.raises(AudioparityError, match="q8_0 cannot store rows of 48 values"):
        stored(np.zeros((2, 48), np.float32), "q8_0")
    with pytest.raises(AudioparityError, match="q4_K cannot store rows of 96 values"):
        stored(np.zeros((2, 96), np.float32), "q4_K")


def _lstm_step_float64(lstm: torch.nn.LSTM, layer: int, x: np.ndarray, h: np.ndarray,
                       c: np.ndarray, storage: str) -> tuple[np.ndarray, np.ndarray]:
    """One step of one layer of torch's LSTM equations in float64, each matmul on the emulated
    operands: the new ``h`` and ``c`` from input ``x`` and state ``h``, ``c`` (float32)."""
    def sigmoid(v: np.ndarray) -> np.ndarray:
        return 1 / (1 + np.exp(-v))

    w_ih, w_hh, b_ih, b_hh = (getattr(lstm, f"{k}_l{layer}").detach().numpy()
                              for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"))
    gates = (_emulated_product(x[None], w_ih, storage)[0] + b_ih
             + _emulated_product(h[None], w_hh, storage)[0] + b_hh)
    i, f, g, o = np.split(gates, 4)
    c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
    return sigmoid(o) * np.tanh(c), c


def _check_lstm_steps(lstm: torch.nn.LSTM, x: torch.Tensor, storage: str) -> None:
    """The emulated LSTM run one step at a time, each layer's new state against float64 from
    the state and input the emulation itself had (teacher-forced: float32 and float64 states
    that part by float32 noise would otherwise flip a rounding of the next step's input)."""
    zeros = torch.zeros(lstm.num_layers, 1, lstm.hidden_size)
    state = (zeros, zeros)
    for x_t in x:
        with torch.inference_mode():
            output, (h_n, c_n) = lstm(x_t[None, None], state)
        inputs = x_t.numpy()
        for layer in range(lstm.num_layers):
            h, c = _lstm_step_float64(lstm, layer, inputs, state[0][layer, 0].numpy(),
                                      state[1][layer, 0].numpy(), storage)
            np.testing.assert_allclose(h_n[layer, 0].numpy(), h, rtol=0, atol=1e-5)
            np.testing.assert_allclose(c_n[layer, 0].numpy(), c, rtol=0, atol=1e-5)
            inputs = h_n[layer, 0].numpy()
        np.testing.assert_array_equal(output[0, 0].numpy(), h_n[-1, 0].numpy())
        state = (h_n, c_n)


@pytest.mark.parametrize("storage", EMULATED_TYPES)
def test_emulated_modules_compute_on_rounded_operands(storage: str) -> None:
    """Linear, pointwise Conv1d and LSTM emulating ``storage``: float64 on stored weights and
    rounded inputs; a kept module and the biases stay float32."""
    torch.manual_seed(0)
    net = torch.nn.ModuleDict({
        "linear": torch.nn.Linear(256, 32), "kept": torch.nn.Linear(256, 32),
        "pointwise": torch.nn.Conv1d(256, 32, 1), "lstm": torch.nn.LSTM(256, 256, num_layers=2),
    }).requires_grad_(False)
    original = {name: p.detach().clone() for name, p in net.named_parameters()}
    x = torch.from_numpy(RNG.standard_normal((5, 256)).astype(np.float32))
    with torch.inference_mode():
        before = net["linear"](x), net["lstm"](x[:, None])[0]
    with emulating(net, storage, keep={"kept"}) as stored_weights:
        assert stored_weights.notes == []
        assert set(stored_weights.types) == {"linear.weight", "pointwise.weight",
                                             *(f"lstm.weight_{k}_l{i}" for k in ("ih", "hh")
                                               for i in (0, 1))}
        _check_emulated(net, original, x, storage)
    for name, param in net.named_parameters():
        assert torch.equal(param, original[name]), f"{name} is float32 again"
    with torch.inference_mode():
        assert torch.equal(net["linear"](x), before[0])
        assert torch.equal(net["lstm"](x[:, None])[0], before[1])


def _check_emulated(net: torch.nn.ModuleDict, original: dict, x: torch.Tensor,
                    storage: str) -> None:
    for name, param in net.named_parameters():
        expected = original[name].numpy()
        if "weight" in name and not name.startswith("kept"):
            expected = stored(expected.reshape(expected.shape[0], -1), storage).reshape(
                expected.shape)
        np.testing.assert_array_equal(param.detach().numpy(), expected, err_msg=name)

    w, b = net["linear"].weight.detach().double().numpy(), net["linear"].bias.double().numpy()
    with torch.inference_mode():
        np.testing.assert_allclose(net["linear"](x).numpy(),
                                   _emulated_product(x.numpy(), w.astype(np.float32), storage)
                                   + b, rtol=0, atol=1e-5)
        np.testing.assert_allclose(net["kept"](x).numpy(), x.double().numpy()
                                   @ original["kept.weight"].double().numpy().T
                                   + original["kept.bias"].double().numpy(), rtol=0, atol=1e-5)
        conv = net["pointwise"](x.T[None])[0].T.numpy()
        pw = net["pointwise"].weight.detach()[:, :, 0].double().numpy()
        np.testing.assert_allclose(conv, _emulated_product(x.numpy(), pw.astype(np.float32),
                                                           storage)
                                   + net["pointwise"].bias.double().numpy(), rtol=0, atol=1e-5)
    _check_lstm_steps(net["lstm"], x, storage)


def test_rows_q8_0_cannot_hold_fall_back_to_f16_with_a_note() -> None:
    net = torch.nn.Linear(48, 32).requires_grad_(False)
    weight = net.weight.detach().clone().numpy()
    with emulating(net, "q8_0") as stored_weights:
        assert stored_weights.notes == [
            ".weight [32, 48]: q8_0 -> f16 (rows of 48 values, blocks of 32)"]
        np.testing.assert_array_equal(net.weight.numpy(), stored(weight, "f16"))


@pytest.mark.parametrize(("wanted", "cols", "expected"), [
    ("q4_K", 512, "q4_K"), ("q4_K", 96, "q5_0"), ("q5_K", 96, "q5_1"), ("q6_K", 96, "q8_0"),
    ("q2_K", 96, "q4_0"), ("q3_K", 96, "q4_0"), ("q4_K", 40, "f16"), ("iq4_nl", 40, "f16"),
    ("mxfp4", 64, "mxfp4"),
])
def test_fallbacks_are_llama_cpp_s(wanted: str, cols: int, expected: str) -> None:
    """llama-quant.cpp's tensor_type_fallback: a k-quant demotes to a 32-value type, and a row
    that type cannot hold either is stored f16; each fallback is one note."""
    notes: list[str] = []
    assert storage_or_fallback("w", wanted, (8, cols), notes) == expected
    assert len(notes) == (expected != wanted)


def test_storage_record_counts_bits_over_every_value() -> None:
    """Bits per weight weighted by each tensor's values: 1024 q4_K values (4.5 bits) and 256
    f32 ones (32 bits) make (1024 * 4.5 + 256 * 32) / 1280 = 10.0."""
    record = storage_record({"a": (4, 256), "b": (256,)}, {"a": "q4_K", "b": "f32"}, ["x"])
    assert record == {"bits_per_weight": 10.0, "types": {"f32": 1, "q4_K": 1},
                      "fallbacks": ["x"]}


def test_bits_per_weight_are_ggml_s() -> None:
    from audioparity.ggml import STORAGE_TYPES as TYPES

    assert BITS_PER_WEIGHT == {name: ggml.ggml_type_size(TYPES[name]) * 8
                               / ggml.ggml_blck_size(TYPES[name]) for name in STORAGE_TYPES}


def test_emulations_one_at_a_time_then_float32_again() -> None:
    net = torch.nn.Linear(64, 32).requires_grad_(False)
    weight = net.weight.clone()
    seen = []
    for variant in emulations(net, ["f16", "q8_0"]):
        assert variant.model is net
        expected = weight.numpy() if variant.weight_type is None \
            else stored(weight.numpy(), variant.weight_type)
        np.testing.assert_array_equal(net.weight.numpy(), expected)
        seen.append((variant.weight_type, variant.fields,
                     variant.dump_dir(emulated_dir("r/clip", None)).as_posix()))
    assert seen == [
        (None, {}, "r/clip"),
        ("f16", {"emulates": {"weight_type": "f16", "backend": "cpu", "fallbacks": []}},
         "r/clip@f16"),
        ("q8_0", {"emulates": {"weight_type": "q8_0", "backend": "cpu", "fallbacks": []}},
         "r/clip@q8_0"),
    ]
    assert torch.equal(net.weight, weight)
    with pytest.raises(AudioparityError, match="weight type\\(s\\) f32"):
        next(emulations(net, ["f32"]))


@pytest.mark.parametrize("storage", ["f16", "q8_0", "q4_K"])
def test_a_weight_of_more_rows_than_one_pass_rounds_holds_ggml_s_bytes_everywhere(storage):
    """A large embedding is rounded a block of rows at a time (bounded temporaries): every
    row, those of the last partial block too, holds what ggml stores, and leaving restores it."""
    from audioparity.dumping.emulation import _ROWS_AT_ONCE, emulating

    rows = 2 * _ROWS_AT_ONCE + 5
    embedding = torch.nn.Embedding(rows, 256)
    original = embedding.weight.detach().clone().numpy()
    with Runtime("cpu") as rt:
        expected = rt.upload({"w": original}, {"w": storage}).read("w")
    with emulating(torch.nn.Sequential(embedding), storage):
        np.testing.assert_array_equal(embedding.weight.detach().numpy(), expected)
    np.testing.assert_array_equal(embedding.weight.detach().numpy(), original)
