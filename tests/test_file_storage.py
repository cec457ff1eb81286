"""The storage-matched reference (audioparity.dumping.weight_files.FileStorage): a torch model
computing with the bytes a candidate's own file stores. Given the bytes ggml's own quantizer writes,
it is the quantization-aware reference bit for bit; given other bytes, it computes with them, and
the hashes it records are still ggml's quantization of the checkpoint."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from audioparity.candidates import WeightName
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.emulation import emulating
from audioparity.dumping.storage import (
    BLOCK_SIZES,
    dequantize,
    matmul_input,
    quantize,
    storage_or_fallback,
    stored,
)
from audioparity.dumping.weight_files import (
    FileStorage,
    StoredTensor,
    read_stored,
    storage_verdict,
    write_stored,
)

RNG = np.random.default_rng(5)


def _net() -> torch.nn.ModuleDict:
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "linear": torch.nn.Linear(256, 64), "pointwise": torch.nn.Conv1d(256, 64, 1),
        "narrow": torch.nn.Linear(48, 32), "embedding": torch.nn.Embedding(16, 256),
        "lstm": torch.nn.LSTM(256, 64), "kernel": torch.nn.Conv2d(1, 4, 3),
    }).requires_grad_(False)


def _outputs(net: torch.nn.ModuleDict, x: torch.Tensor) -> list[torch.Tensor]:
    with torch.inference_mode():
        return [net["linear"](x), net["pointwise"](x.T[None]), net["narrow"](x[:, :48]),
                net["embedding"](torch.tensor([1, 5, 15])), net["lstm"](x[:, None])[0],
                net["kernel"](x[None, None, :, :16])]


def _ggml_file(net: torch.nn.Module, weight_type: str, path, skip=()) -> FileStorage:
    """What our port's storage policy stores of ``net``'s matmul weights at ``weight_type``,
    written as a storage file."""
    tensors = []
    for name, param in net.named_parameters():
        if name in skip or not name.endswith(("weight", "weight_ih_l0", "weight_hh_l0")) \
                or name.startswith("kernel"):
            continue
        matrix = param.detach().numpy().reshape(param.shape[0], -1)
        kind = storage_or_fallback(name, weight_type, matrix.shape, [])
        tensors.append(StoredTensor(name, tuple(param.shape), kind, quantize(matrix, kind)))
    write_stored(path, tensors)
    return FileStorage.read(path, weight_type)


@pytest.mark.parametrize("weight_type", ["f16", "q8_0", "q4_1", "q4_K", "q2_K"])
def test_ggml_s_own_bytes_are_the_quantization_aware_reference(tmp_path, weight_type) -> None:
    """The file of our storage policy's bytes and the emulated weight type compute the same,
    bit for bit, and record the same types and block hashes: one arithmetic."""
    net = _net()
    x = torch.from_numpy(RNG.standard_normal((6, 256)).astype(np.float32))
    file = _ggml_file(net, weight_type, tmp_path / "w.gguf")
    with emulating(net, weight_type) as emulated:
        expected = _outputs(net, x)
        types, hashes = dict(emulated.types), {k: v.copy() for k, v in emulated.hashes.items()}
    with emulating(net, file) as matched:
        for got, want in zip(_outputs(net, x), expected, strict=True):
            assert torch.equal(got, want)
        assert matched.types == types
        assert {k: v.tolist() for k, v in matched.hashes.items()} == {
            k: v.tolist() for k, v in hashes.items()}


def test_it_computes_with_the_file_s_bytes_and_hashes_ggml_s(tmp_path) -> None:
    """One block of one weight changed in the file: the model computes with the changed value,
    and the hash it records of that block is still ggml's quantization of the checkpoint (the
    candidate's own hash differs there: its quantizer's fault, not its arithmetic)."""
    net = _net()
    weight = net["linear"].weight.detach().numpy().copy()
    raw = quantize(weight, "q8_0")
    changed = raw.copy()
    changed[34 * 40 + 5] ^= 0x7F  # block 40 (row 5, its 9th block), a value byte
    write_stored(tmp_path / "w.gguf", [StoredTensor("linear.weight", (64, 256), "q8_0", changed)])
    file = FileStorage.read(tmp_path / "w.gguf", "q8_0")
    with emulating(net, file) as matched:
        np.testing.assert_array_equal(net["linear"].weight.numpy(),
                                      dequantize(changed, "q8_0", (64, 256)))
    ours = read_stored(tmp_path / "w.gguf")["linear.weight"]
    from audioparity.dumping.storage import block_hashes

    theirs = block_hashes(ours.data, "q8_0", (64, 256))
    differ = np.flatnonzero(matched.hashes["linear.weight"] != theirs)
    assert differ.tolist() == [40]
    assert any("pointwise.weight: not in the candidate's file" in n for n in matched.notes)
    np.testing.assert_array_equal(net["linear"].weight.numpy(), weight)  # float32 again


def test_a_weight_absent_stays_float32_and_unknown_tensors_are_named(tmp_path) -> None:
    net = _net()
    original = net["pointwise"].weight.detach().clone()
    file_tensors = [StoredTensor("stray.weight", (4, 32), "f16",
                                 quantize(np.ones((4, 32), np.float32), "f16"))]
    write_stored(tmp_path / "w.gguf", file_tensors)
    with emulating(net, FileStorage.read(tmp_path / "w.gguf", "q8_0")) as matched:
        assert torch.equal(net["pointwise"].weight, original)
        assert matched.types == {}
        assert "1 tensor(s) of the candidate's file are no weight of the reference model: " \
               "stray.weight" in matched.notes


def test_a_transposed_layout_is_named(tmp_path) -> None:
    """A file holding a square weight transposed (a layout its adapter does not map) computes
    with it, as the port does, and says its values are not the checkpoint's."""
    net = torch.nn.ModuleDict({"square": torch.nn.Linear(64, 64)}).requires_grad_(False)
    weight = net["square"].weight.detach().numpy()
    write_stored(tmp_path / "w.gguf", [StoredTensor("square.weight", (64, 64), "q8_0",
                                                    quantize(weight.T.copy(), "q8_0"))])
    with emulating(net, FileStorage.read(tmp_path / "w.gguf", "q8_0")) as matched:
        assert any(n.startswith("square.weight: the candidate's values are not the "
                                "checkpoint's (NMSE ") for n in matched.notes)


def test_an_f16_kernel_rounds_the_convolution_s_input(tmp_path) -> None:
    """A 3x3 kernel the file stores f16: the convolution computes on the f16 kernel and its
    input rounded to f16 (ggml's im2col in the kernel's type), in float64 within float32's
    noise; a float32 kernel in the file leaves the convolution alone."""
    conv = torch.nn.Conv2d(2, 4, 3).requires_grad_(False)
    net = torch.nn.ModuleDict({"conv": conv})
    kernel = conv.weight.detach().numpy()
    write_stored(tmp_path / "w.gguf", [StoredTensor("conv.weight", kernel.shape, "f16",
                                                    quantize(kernel.reshape(-1, 3), "f16"))])
    x = torch.from_numpy(RNG.standard_normal((1, 2, 9, 9)).astype(np.float32) * 3)
    with emulating(net, FileStorage.read(tmp_path / "w.gguf", "q8_0")) as matched:
        assert matched.types == {"conv.weight": "f16"}
        with torch.inference_mode():
            got = conv(x).double().numpy()
    rounded = torch.from_numpy(matmul_input(x.numpy().reshape(-1, 1), "f16").reshape(x.shape))
    want = torch.nn.functional.conv2d(
        rounded.double(), torch.from_numpy(stored(kernel.reshape(-1, 3), "f16").reshape(
            kernel.shape)).double(), conv.bias.double()).numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)
    unrounded = torch.nn.functional.conv2d(x.double(), torch.from_numpy(stored(
        kernel.reshape(-1, 3), "f16").reshape(kernel.shape)).double(), conv.bias.double())
    assert np.abs(unrounded.numpy() - want).max() > 1e-4  # the input rounding is measurable


def test_a_quantized_kernel_is_refused(tmp_path) -> None:
    conv = torch.nn.Conv2d(32, 4, 3).requires_grad_(False)
    kernel = conv.weight.detach().numpy().reshape(4, -1)  # rows of 288: q8_0 holds them
    write_stored(tmp_path / "w.gguf", [StoredTensor("weight", (4, 288), "q8_0",
                                                    quantize(kernel, "q8_0"))])
    with pytest.raises(AudioparityError, match="weight: the candidate's file stores this "
                                               "convolution kernel as q8_0"), \
            emulating(conv, FileStorage.read(tmp_path / "w.gguf", "q8_0")):
        pass


def test_a_weight_map_renames_and_reorders_gates() -> None:
    """whisper.cpp's LSTM rows: torch's gates i, f, g, o kept as i, f, o, g. The map gives the
    checkpoint's name and row order, whole rows of bytes moved (ggml stores rows apart)."""
    rows = np.arange(8 * 32, dtype=np.float32).reshape(8, 32)
    port_order = np.concatenate([rows[0:2], rows[2:4], rows[6:8], rows[4:6]])
    raw = quantize(port_order, "q8_0")
    entry = WeightName("lstm.w_{i}", "decoder.lstm.weight_ih_l{i}", gates=(0, 1, 3, 2))
    found = entry.checkpoint_tensor(StoredTensor("lstm.w_3", (8, 32), "q8_0", raw))
    assert found.name == "decoder.lstm.weight_ih_l3" and found.shape == (8, 32)
    np.testing.assert_array_equal(dequantize(found.data, "q8_0", (8, 32)),
                                  stored(rows, "q8_0"))
    assert entry.checkpoint_tensor(StoredTensor("lstm.x_3", (8, 32), "q8_0", raw)) is None
    with pytest.raises(ValueError, match="no permutation"):
        WeightName("a", "b", gates=(0, 0, 1))


def test_the_storage_file_round_trips_every_type(tmp_path) -> None:
    """Every storage type written and read back: names, shapes (a block type's trailing axes
    of 1 dropped), types and bytes."""
    tensors = [StoredTensor(f"w.{kind}", (3, 2, 256, 1), kind,
                            quantize(RNG.standard_normal((6, 256)).astype(np.float32), kind))
               for kind in BLOCK_SIZES]
    write_stored(tmp_path / "w.gguf", tensors)
    read = read_stored(tmp_path / "w.gguf")
    assert list(read) == [t.name for t in tensors]
    for tensor in tensors:
        got = read[tensor.name]
        kept = (3, 2, 256, 1) if tensor.type in ("f32", "f16", "bf16") else (3, 2, 256)
        assert (got.shape, got.type) == (kept, tensor.type)
        np.testing.assert_array_equal(got.data, tensor.data)
    with pytest.raises(AudioparityError, match="its bytes are not its shape's"):
        write_stored(tmp_path / "x.gguf", [StoredTensor("x", (2, 32), "q8_0",
                                                        np.zeros(10, np.uint8))])


def test_the_storage_verdict_names_each_choice_and_fails_the_ones_not_asked():
    """Rows of 48 cannot hold q4_K: a fallback, listed. Rows of 256 can: f16 there is a weight
    left unquantized (fails), q8_0 a choice of the tool (fails a uniform type, listed for a
    mix); f32 where f16 was asked is another type, not "unquantized"; a weight the file lacks is
    listed."""
    matmul = {"a": [4, 256], "b": [4, 48], "c": [4, 256], "d": [4, 256], "e": [4, 256]}
    stored = {"a": "q4_K", "b": "q8_0", "c": "f16", "d": "q8_0"}
    honoured, line = storage_verdict("q4_K", matmul, stored, tool="my.cpp")
    assert not honoured
    assert line == ("asked q4_K: 1 of 5 matmul weights as asked; fallbacks, rows q4_K cannot "
                    "hold: 1 q8_0 (b); unquantized where q4_K fits: 1 f16 (c); my.cpp chose "
                    "another type where q4_K fits: 1 q8_0 (d); not in its file (the reference "
                    "computes them float32): 1 (e)")
    del stored["c"]
    matmul.pop("c")
    honoured, line = storage_verdict("q4_K", matmul, stored, mix=True)
    assert honoured and "its mix where q4_K fits: 1 q8_0 (d)" in line
    honoured, line = storage_verdict("f16", {"a": [4, 256]}, {"a": "f32"}, tool="my.cpp")
    assert not honoured and line.endswith("my.cpp chose another type where f16 fits: 1 f32 (a)")
    assert storage_verdict("q8_0", {"a": [4, 256]}, {"a": "q8_0"}) == (
        True, "asked q8_0: 1 of 1 matmul weights as asked")
