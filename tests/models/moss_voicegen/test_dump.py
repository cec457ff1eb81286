"""The ggml MOSS backbone against the PyTorch reference on the tiny moss_model: float32 parity
on four prompts, the other weight types and the f16 KV cache, the massive-activation fixture at
f16, the codebook pad rows read back from the uploaded weights, the storage policy, and a backend
that is not built in."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from audioparity.compare.metrics import max_rel, non_finite
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import RunSettings, dump_ggml, dump_reference, storage_types
from audioparity.ggml import doctor
from audioparity.models.moss_voicegen.checkpoint import expected_shapes
from audioparity.models.moss_voicegen.config import load_config
from tests import MOSS_PROMPTS
from tests.models.moss_voicegen import F32_GATE, FAMILY, HIDDEN_STAGES, PROMPT, options


def ggml_dump(model: Path, prompt: Path, output: Path, reference: Dump,
              weight_type: str = "f32", kv_cache_type: str = "f32", backend: str = "cpu"
              ) -> Dump:
    dump_ggml(FAMILY, model, prompt, output,
              RunSettings(weight_type, backend, options("ggml", kv_cache_type=kv_cache_type)),
              reference.path)
    return Dump(output)


@pytest.mark.parametrize("prompt", MOSS_PROMPTS, ids=lambda p: p.stem)
def test_f32_port_matches_the_reference(tmp_path: Path, moss_model: Path,
                                        moss_references: dict[str, Dump],
                                        prompt: Path) -> None:
    ref = moss_references[prompt.stem]
    cand = ggml_dump(moss_model, prompt, tmp_path / f"ggml_f32_{prompt.stem}", ref)
    assert cand.manifest["producer"] == "ggml" and cand.manifest["weight_type"] == "f32"
    assert cand.json("prompt") == ref.json("prompt")
    assert sorted(cand.tensor_names) == sorted(ref.tensor_names)
    for stage in (*HIDDEN_STAGES, "text_logits", "audio_logits", "generation_text_logits",
                  "generation_audio_logits"):
        assert cand.layout(stage) == ref.layout(stage)
        assert max_rel(cand.tensor(stage), ref.tensor(stage)) <= F32_GATE, stage
    assert np.argmax(cand.tensor("text_logits")) == np.argmax(ref.tensor("text_logits"))
    np.testing.assert_array_equal(np.argmax(cand.tensor("audio_logits"), axis=1),
                                  np.argmax(ref.tensor("audio_logits"), axis=1))
    assert np.isneginf(cand.tensor("audio_logits")[:, -1]).all()
    assert cand.json("generation") == ref.json("generation")
    assert max_rel(cand.tensor("generation_margins"), ref.tensor("generation_margins")) <= 1e-4


def test_generation_exercises_the_delay_pattern(moss_model: Path,
                                                moss_references: dict[str, Dump]) -> None:
    config = load_config(moss_model)
    for ref in moss_references.values():
        rows = np.array(ref.json("generation")["rows"])
        assert len(rows) == 16
        texts = set(rows[:, 0].tolist())
        assert {config.audio_start_token_id, config.audio_assistant_gen_slot_token_id,
                config.audio_assistant_delay_slot_token_id,
                config.audio_end_token_id} <= texts
        assert (rows[:, 1:] != config.audio_pad_code).any(axis=0).all()  # every codebook used


def test_massive_activation_gives_non_finite_values_at_f16(tmp_path: Path, fixture_model) -> None:
    massive = fixture_model("moss_voicegen", massive_activation=True)
    dump_reference(FAMILY, massive, [(PROMPT, tmp_path / "reference_massive")],
                   options=options("reference"))
    ref = Dump(tmp_path / "reference_massive")
    f16 = ggml_dump(massive, PROMPT, tmp_path / "ggml_massive_f16", ref, weight_type="f16")
    f32 = ggml_dump(massive, PROMPT, tmp_path / "ggml_massive_f32", ref, weight_type="f32")
    for stage in ("last_hidden", "step_last_hidden", "probe_hidden"):
        assert non_finite(ref.tensor(stage), ref.tensor(stage)) == 0
        assert non_finite(f16.tensor(stage), ref.tensor(stage)) > 0, stage
        assert max_rel(f32.tensor(stage), ref.tensor(stage)) <= F32_GATE, stage


@pytest.mark.parametrize("weight_type", ["f16", "bf16", "q8_0"])
def test_storage_types_round_the_weights(tmp_path: Path, moss_model: Path,
                                         moss_references: dict[str, Dump],
                                         weight_type: str) -> None:
    ref = moss_references[PROMPT.stem]
    cand = ggml_dump(moss_model, PROMPT, tmp_path / f"ggml_{weight_type}", ref,
                     weight_type=weight_type)
    error = max_rel(cand.tensor("last_hidden"), ref.tensor("last_hidden"))
    assert F32_GATE < error < 5e-2
    assert cand.manifest["storage"]["types"].get(weight_type, 0) > 0


def test_native_weights_are_the_checkpoints_bf16(tmp_path: Path, moss_model: Path,
                                                 moss_references: dict[str, Dump]) -> None:
    ref = moss_references[PROMPT.stem]
    native = ggml_dump(moss_model, PROMPT, tmp_path / "ggml_native", ref, weight_type="native")
    bf16 = ggml_dump(moss_model, PROMPT, tmp_path / "ggml_bf16_again", ref, weight_type="bf16")
    for name in native.tensor_names:
        np.testing.assert_array_equal(native.tensor(name), bf16.tensor(name), err_msg=name)
    assert any("pad rows: all 4 zero" in note for note in native.manifest["notes"])


def test_a_nonzero_pad_row_is_noted_as_uploaded(tmp_path: Path, moss_model: Path,
                                               moss_references: dict[str, Dump]) -> None:
    """The pad rows are read back from the weights the dump computes with, streamed from the
    checkpoint or mapped from a converted file alike."""
    from safetensors.torch import load_file, save_file

    from audioparity.dumping.driver import save_weights

    model = tmp_path / "model"
    shutil.copytree(moss_model, model)
    state = load_file(model / "model.safetensors")
    state["emb_ext.2.weight"][load_config(model).audio_pad_code, 5] = 0.5
    save_file(state, model / "model.safetensors", metadata={"format": "pt"})
    save_weights(FAMILY, model, tmp_path / "q8_0.gguf", weight_type="q8_0", options={})
    note = ("codebook pad rows: NOT zero in emb_ext.2.weight (pad codes contribute to the "
            "embedding)")
    ref = moss_references[PROMPT.stem]
    streamed = ggml_dump(model, PROMPT, tmp_path / "streamed", ref, weight_type="q8_0")
    dump_ggml(FAMILY, model, PROMPT, tmp_path / "mapped",
              RunSettings("q8_0", "cpu", options("ggml"), weights_file=tmp_path / "q8_0.gguf"),
              ref.path)
    for dump in (streamed, Dump(tmp_path / "mapped")):
        assert note in dump.manifest["notes"]


def test_moss_weights_take_the_one_storage_policy(moss_model: Path) -> None:
    """Norm weights float32, every matrix in the weight type; a q8_0 matrix whose rows are no
    multiple of 32 falls back to f16 with a note, as in every family."""
    shapes = expected_shapes(load_config(moss_model))
    native = dict.fromkeys(shapes, "bf16")
    storage, notes = storage_types(FAMILY, shapes, native, "q8_0", {})
    assert {name for name, kind in storage.items() if kind == "f32"} == {
        name for name, shape in shapes.items() if len(shape) == 1}
    assert {kind for name, kind in storage.items() if len(shapes[name]) == 2} == {"q8_0"}
    assert notes == []
    down = "language_model.layers.0.mlp.down_proj.weight"
    storage, notes = storage_types(FAMILY, {**shapes, down: (64, 144)}, native, "q8_0", {})
    assert storage[down] == "f16"
    assert notes == [f"{down} [64, 144]: q8_0 -> f16 (rows of 144 values, blocks of 32)"]
    assert storage_types(FAMILY, shapes, native, "native", {})[0] == {
        name: "f32" if len(shape) == 1 else "bf16" for name, shape in shapes.items()}


def test_f16_kv_cache_is_used(tmp_path: Path, moss_model: Path,
                              moss_references: dict[str, Dump]) -> None:
    ref = moss_references[PROMPT.stem]
    cand = ggml_dump(moss_model, PROMPT, tmp_path / "ggml_kv16", ref, kv_cache_type="f16")
    assert cand.manifest["kv_cache_type"] == "f16"
    assert 1e-6 < max_rel(cand.tensor("step_last_hidden"), ref.tensor("step_last_hidden")) < 1e-2


def test_backend_not_built_in_is_unavailable(tmp_path: Path, moss_model: Path,
                                             moss_references: dict[str, Dump]) -> None:
    missing = [b for b, built in doctor()["backends"].items() if not built]
    if not missing:
        pytest.skip("every backend is built into this ggml-python")
    dump = ggml_dump(moss_model, PROMPT, tmp_path / "ggml_unavailable",
                     moss_references[PROMPT.stem], backend=missing[0])
    assert dump.status == "unavailable" and dump.tensor_names == []
    assert not dump.has("generation")
