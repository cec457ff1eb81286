"""Reading a ``.nemo``'s ``model_weights.ckpt`` without torch: every float tensor equals
``torch.load``'s (the fixture, and hand-made state dicts with half types, views and shared
storages), reading imports no torch, and anything but a plain state dict is a clear error."""

from __future__ import annotations

import pickle
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from audioparity.checkpoints.nemo import read_nemo_member
from audioparity.checkpoints.torch_zip import read_torch_state_dict
from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.checkpoint import read_state

torch = pytest.importorskip("torch")

NATIVE = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def assert_equals_torch_load(path: Path) -> None:
    expected = torch.load(path, map_location="cpu", weights_only=True)
    arrays, native = read_torch_state_dict(path)
    floats = {name: t for name, t in expected.items() if t.dtype in NATIVE}
    assert set(arrays) == set(floats) == set(native)
    for name, tensor in floats.items():
        assert native[name] == NATIVE[tensor.dtype], name
        assert arrays[name].dtype == np.float32, name
        np.testing.assert_array_equal(arrays[name], tensor.float().numpy(), err_msg=name)


def test_fixture_checkpoint_equals_torch_load(parakeet_model: Path, tmp_path: Path) -> None:
    ckpt = tmp_path / "model_weights.ckpt"
    ckpt.write_bytes(read_nemo_member(parakeet_model, "model_weights.ckpt"))
    assert_equals_torch_load(ckpt)
    arrays, _ = read_state(parakeet_model)  # through the .nemo tar
    assert "encoder.layers.0.conv.batch_norm.num_batches_tracked" not in arrays  # int64
    assert len(arrays) > 100


@pytest.mark.parametrize("mode", ["w", "w:gz"])
def test_a_nemo_checkpoint_is_read_in_place_or_extracted_when_compressed(
        parakeet_model: Path, tmp_path: Path, mode: str) -> None:
    """NeMo's own uncompressed tar is read where it lies (a window on the file); a gzipped one
    has no such window and is extracted; both give every tensor as torch.load does."""
    import tarfile

    from audioparity.checkpoints.nemo import nemo_member_span
    from audioparity.models.parakeet_tdt.checkpoint import Checkpoint

    ckpt = tmp_path / "model_weights.ckpt"
    ckpt.write_bytes(read_nemo_member(parakeet_model, "model_weights.ckpt"))
    nemo = tmp_path / "model.nemo"
    with tarfile.open(nemo, mode) as tar:
        tar.add(ckpt, arcname="./model_weights.ckpt")
    span = nemo_member_span(nemo, "model_weights.ckpt")
    assert (span is None) == (mode == "w:gz")
    if span is not None:
        with open(nemo, "rb") as handle:
            handle.seek(span[0])
            assert handle.read(span[1]) == ckpt.read_bytes()
    expected = torch.load(ckpt, map_location="cpu", weights_only=True)
    with Checkpoint(nemo) as checkpoint:
        assert (checkpoint._scratch is None) == (mode == "w")
        for name, entry in checkpoint.entries.items():
            np.testing.assert_array_equal(entry.read(), expected[name].float().numpy(),
                                          err_msg=name)


def open_files(path: Path) -> int:
    """How many of this process's file descriptors are open on ``path``."""
    fds = Path("/proc/self/fd")
    return sum(1 for fd in fds.iterdir() if fd.is_symlink() and Path(fd.readlink()) == path)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_reading_the_header_leaves_no_file_open(parakeet_model: Path, tmp_path: Path) -> None:
    """The pickle stream is closed with the archive (a leaked one kept the checkpoint open until
    the garbage collector ran, and warned then)."""
    from audioparity.checkpoints.torch_zip import torch_entries

    ckpt = tmp_path / "model_weights.ckpt"
    ckpt.write_bytes(read_nemo_member(parakeet_model, "model_weights.ckpt"))
    entries = torch_entries(ckpt)
    assert entries and open_files(ckpt) == 0


def test_half_types_views_and_shared_storages_equal_torch_load(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    base = torch.randn(6, 10, generator=generator)
    state = {
        "f32": torch.randn(3, 4, generator=generator),
        "f16": torch.randn(5, 32, generator=generator).half(),
        "bf16": torch.randn(7, 3, generator=generator).bfloat16(),
        "transposed": base.t(),  # non-contiguous: stride (1, 10)
        "rows": base[2:5],  # offset 20 into the shared storage
        "column": base[:, 3],  # offset 3, stride 10
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
        "steps": torch.tensor(7),  # int64: left out
    }
    path = tmp_path / "state.ckpt"
    torch.save(state, path)
    assert_equals_torch_load(path)


def test_reading_a_nemo_imports_no_torch(parakeet_model: Path) -> None:
    code = ("import sys; from audioparity.models.parakeet_tdt.checkpoint import read_state; "
            f"read_state({str(parakeet_model)!r}); assert 'torch' not in sys.modules, 'torch'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]


def _zip_with_pickle(path: Path, payload: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("archive/data.pkl", payload)
        archive.writestr("archive/byteorder", "little")
    return path


@pytest.mark.parametrize("case, message", [
    ("parameter", "unexpected torch._utils._rebuild_parameter"),
    ("legacy", "not a torch zip checkpoint"),
    ("not_a_tensor", "entry 'name' is not a tensor"),
    ("foreign_global", r"unexpected __builtin__\.print"),
    ("truncated_storage", r"data/0 holds 8 bytes, expected 4 x FloatStorage"),
])
def test_anything_but_a_plain_state_dict_is_a_clear_error(tmp_path: Path, case: str,
                                                          message: str) -> None:
    path = tmp_path / f"{case}.ckpt"
    if case == "parameter":
        torch.save({"w": torch.nn.Parameter(torch.ones(2))}, path)
    elif case == "legacy":
        torch.save({"w": torch.ones(2)}, path, _use_new_zipfile_serialization=False)
    elif case == "not_a_tensor":
        torch.save({"w": torch.ones(2), "name": "tiny"}, path)
    elif case == "foreign_global":
        _zip_with_pickle(path, pickle.dumps({"w": print}, protocol=2))
    else:  # the storage record cut to half of its 4 values
        torch.save({"w": torch.ones(4)}, path)
        with zipfile.ZipFile(path) as archive:
            records = {name: archive.read(name) for name in archive.namelist()}
        with zipfile.ZipFile(path, "w") as archive:
            for name, data in records.items():
                archive.writestr(name, data[:8] if name.endswith("/data/0") else data)
    with pytest.raises(AudioparityError, match=message):
        read_torch_state_dict(path)
