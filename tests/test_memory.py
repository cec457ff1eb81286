"""What the memory checks count: the float values of a checkpoint from its headers alone,
against the counts torch and safetensors give when they load it, and the one-line refusal."""

from __future__ import annotations

import tarfile

import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.memory import (
    REFERENCE_STACK_BYTES,
    SMALLEST_VALUE_BYTES,
    float_values,
    reference_bytes,
    refuse_if_over,
)


def test_a_nemo_checkpoint_counts_the_values_torch_loads(parakeet_model, tmp_path):
    import torch

    with tarfile.open(parakeet_model) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_weights.ckpt"))
        tar.extract(member, tmp_path, filter="data")
    state = torch.load(tmp_path / member.name, map_location="cpu", weights_only=True)
    expected = sum(t.numel() for t in state.values() if t.is_floating_point())
    assert float_values(parakeet_model) == expected
    # the model, the originals emulation saves, the checkpoint's tensors NeMo's restore loads
    assert reference_bytes(parakeet_model, emulates=True) == REFERENCE_STACK_BYTES + 12 * expected


def test_a_safetensors_directory_counts_the_values_safetensors_loads(moss_model):
    from safetensors.torch import load_file

    expected = sum(t.numel() for f in sorted(moss_model.glob("*.safetensors"))
                   for t in load_file(f).values() if t.is_floating_point())
    assert float_values(moss_model) == expected
    assert reference_bytes(moss_model, emulates=False) == REFERENCE_STACK_BYTES + 4 * expected


def test_an_unreadable_checkpoint_counts_its_bytes_at_the_smallest_storage(tmp_path):
    model = tmp_path / "model.nemo"
    model.write_bytes(b"\0" * 1000)  # not a tar: the job reports that; the estimate stays high
    assert float_values(model) == 1000 // SMALLEST_VALUE_BYTES


def test_a_need_over_the_free_memory_is_refused_in_one_line(monkeypatch):
    monkeypatch.setenv("AUDIOPARITY_MEMORY_MB", "8")
    refuse_if_over(8 * 2**20, "job", "give it more memory")  # fits exactly
    with pytest.raises(AudioparityError) as raised:
        refuse_if_over(9 * 2**20, "job", "give it more memory", " (why)")
    assert str(raised.value) == ("job needs about 9 MiB (why), more than the 8 MiB free "
                                 "(machine or AUDIOPARITY_MEMORY_MB): give it more memory")
