"""The shared safetensors reader (:mod:`audioparity.checkpoints.safetensors`) against what the
``safetensors`` package writes and torch reads back: every float dtype equal to torch's
float32, shards found through the index, and damaged files refused with one clean line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.checkpoints.floats import check_finite
from audioparity.checkpoints.safetensors import (
    INDEX_FILE,
    SINGLE_FILE,
    checkpoint_entries,
    file_entries,
    shard_files,
)
from audioparity.contract.errors import AudioparityError

torch = pytest.importorskip("torch")
save_file = pytest.importorskip("safetensors.torch").save_file


def state(seed: int) -> dict:
    """Random tensors of each float dtype a checkpoint stores, one integer tensor, one empty."""
    generator = torch.Generator().manual_seed(seed)
    values = torch.randn(5, 7, generator=generator) * 100
    return {"w32": values, "w16": values.half(), "wbf": values.bfloat16(),
            "bias": values[0].bfloat16(), "steps": torch.arange(3), "empty": torch.zeros(0, 4)}


def test_float_tensors_equal_torch_float32(tmp_path: Path):
    tensors = state(0)
    save_file(tensors, tmp_path / SINGLE_FILE)
    entries = file_entries(tmp_path / SINGLE_FILE)
    assert set(entries) == set(tensors)
    for name in ("w32", "w16", "wbf", "bias", "empty"):
        array = entries[name].read()
        assert array.dtype == np.float32 and array.shape == tuple(tensors[name].shape)
        np.testing.assert_array_equal(array, tensors[name].float().numpy(), err_msg=name)
    assert {name: entries[name].kind for name in ("w32", "w16", "wbf")} == {
        "w32": "f32", "w16": "f16", "wbf": "bf16"}
    # a fresh read-only array per read (no long-lived memory map)
    assert not entries["w32"].read().flags.writeable


def test_integer_tensor_is_listed_and_refused_when_read(tmp_path: Path):
    save_file(state(0), tmp_path / SINGLE_FILE)
    entry = file_entries(tmp_path / SINGLE_FILE)["steps"]
    assert (entry.dtype, entry.shape) == ("I64", (3,))
    with pytest.raises(AudioparityError, match=r"tensor 'steps' has dtype I64; expected one of "
                                               r"F32, F16, BF16"):
        entry.read()


def test_shards_are_read_through_the_index(tmp_path: Path):
    first, second = state(1), state(2)
    save_file({"a": first["wbf"]}, tmp_path / "model-00002-of-00002.safetensors")
    save_file({"b": second["w16"], "c": second["w32"]},
              tmp_path / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00002-of-00002.safetensors", "b": "model-00001-of-00002.safetensors",
                  "c": "model-00001-of-00002.safetensors"}
    (tmp_path / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert [p.name for p in shard_files(tmp_path)] == sorted(set(weight_map.values()))
    entries = checkpoint_entries(tmp_path)
    np.testing.assert_array_equal(entries["a"].read(), first["wbf"].float().numpy())
    np.testing.assert_array_equal(entries["b"].read(), second["w16"].float().numpy())
    np.testing.assert_array_equal(entries["c"].read(), second["w32"].numpy())


@pytest.mark.parametrize("index, message", [
    ({"weight_map": {"a": "../model.safetensors"}}, "expected a 'weight_map' of tensor -> file"),
    ({"weight_map": ["model.safetensors"]}, "unreadable shard index"),
    ({}, "unreadable shard index"),
])
def test_an_index_naming_no_plain_files_is_refused(tmp_path: Path, index, message):
    (tmp_path / INDEX_FILE).write_text(json.dumps(index))
    with pytest.raises(AudioparityError, match=message):
        checkpoint_entries(tmp_path)


def test_a_directory_without_safetensors_is_refused(tmp_path: Path):
    with pytest.raises(AudioparityError, match=f"neither {SINGLE_FILE} nor {INDEX_FILE}"):
        checkpoint_entries(tmp_path)


def read_all(path: Path) -> None:
    for entry in file_entries(path).values():
        if entry.dtype != "I64":
            entry.read()


def test_every_cut_and_header_damage_is_refused_in_one_line(tmp_path: Path):
    """A file cut at every length, and with each header byte overwritten: read in full or
    refused with an :class:`AudioparityError` of one line, never another exception."""
    good = tmp_path / "good.safetensors"
    save_file({"w": torch.ones(3, 2, dtype=torch.bfloat16), "v": torch.ones(2)}, good)
    data = good.read_bytes()
    bad = tmp_path / "bad.safetensors"
    header_end = 8 + int.from_bytes(data[:8], "little")
    variants = [data[:cut] for cut in range(len(data))]
    variants += [data[:i] + bytes([value]) + data[i + 1:]
                 for i in range(header_end) for value in (0, ord("9"), ord("-"), 255)]
    refused = 0
    for blob in variants:
        bad.write_bytes(blob)
        try:
            read_all(bad)
        except AudioparityError as err:
            assert str(err).startswith(f"{bad}: ") and "\n" not in str(err), repr(err)
            refused += 1
    assert refused >= len(data)  # every cut at least


def test_non_finite_weight_is_named_with_the_counts():
    array = np.ones((2, 3), np.float32)
    array[0, 1], array[1, 2] = np.nan, -np.inf
    with pytest.raises(AudioparityError) as err:
        check_finite("layer.w", array, "ckpt", noun="weight")
    assert str(err.value) == ("ckpt: weight 'layer.w' [2, 3] holds 1 NaN and 1 infinite values; "
                              "expected finite weights")
    check_finite("layer.w", np.ones(3, np.float32), "ckpt")


def test_blocks_cover_the_tensor_and_count_non_finite_over_all_of_them(tmp_path: Path):
    values = torch.arange(40, dtype=torch.float32).reshape(10, 4)
    values[1, 2], values[7, 0], values[8, 3] = float("nan"), float("inf"), float("nan")
    save_file({"w": values.bfloat16()}, tmp_path / SINGLE_FILE)
    entry = file_entries(tmp_path / SINGLE_FILE)["w"]
    seen = []
    with pytest.raises(AudioparityError, match=r"m: tensor 'w' \[10, 4\] holds 2 NaN and 1 "
                                               r"infinite values; expected finite weights"):
        for first, block in entry.blocks("m", max_bytes=3 * 16):  # 3 rows of 4 float32
            seen.append((first, block.copy()))
    assert [first for first, _ in seen] == [0, 3, 6, 9]
    np.testing.assert_array_equal(np.concatenate([b for _, b in seen]), values.float().numpy())
