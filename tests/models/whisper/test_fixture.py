"""The tiny Whisper checkpoint: a Hugging Face layout transformers loads, seeded determinism,
atomic save, q8_0-friendly widths, the sinusoidal positions, and activations that are not
degenerate on the project's clip."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import storage_types
from audioparity.models.whisper import Whisper
from audioparity.models.whisper.checkpoint import read_weights
from audioparity.models.whisper.config import load_config
from audioparity.models.whisper.fixture import build_fixture

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def all_tensors(directory: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file

    return load_file(directory / "model.safetensors")


def test_same_seed_gives_identical_tensors_and_another_seed_does_not(whisper_model: Path,
                                                                    tmp_path: Path):
    build_fixture(tmp_path / "again", seed=0)
    build_fixture(tmp_path / "other", seed=1)
    first, again = all_tensors(whisper_model), all_tensors(tmp_path / "again")
    other = all_tensors(tmp_path / "other")
    assert sorted(first) == sorted(again)
    assert [k for k in first if not np.array_equal(first[k], again[k])] == []
    for name in ("config.json", "preprocessor_config.json"):
        assert (whisper_model / name).read_text() == (tmp_path / "again" / name).read_text()
    assert not np.array_equal(first["model.encoder.layers.1.fc1.weight"],
                              other["model.encoder.layers.1.fc1.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]


def test_layout_is_a_hugging_face_whisper_checkpoint(whisper_model: Path):
    assert sorted(p.name for p in whisper_model.iterdir()) == [
        "added_tokens.json", "config.json", "generation_config.json", "merges.txt",
        "model.safetensors", "preprocessor_config.json", "special_tokens_map.json",
        "tokenizer.json", "tokenizer_config.json", "vocab.json"]
    raw = json.loads((whisper_model / "config.json").read_text())
    assert raw["model_type"] == "whisper"
    assert raw["architectures"] == ["WhisperForConditionalGeneration"]
    config = load_config(whisper_model)
    encoder = config.encoder
    assert (encoder.num_mel_bins, encoder.d_model, encoder.encoder_layers,
            encoder.encoder_attention_heads, encoder.encoder_ffn_dim,
            encoder.max_source_positions) == (80, 64, 2, 4, 256, 1500)
    assert config.feature_extractor.nb_max_frames == 3000 and config.n_frames == 1500
    decoder = config.decoder
    assert (decoder.vocab_size, decoder.decoder_layers, decoder.decoder_attention_heads,
            decoder.decoder_ffn_dim, decoder.max_target_positions) == (64, 2, 4, 128, 32)
    tensors = all_tensors(whisper_model)
    assert all(value.dtype == np.float32 for value in tensors.values())
    assert "model.encoder.conv1.weight" in tensors
    assert not any(k.endswith("k_proj.bias") for k in tensors)
    assert "proj_out.weight" not in tensors  # tied to model.decoder.embed_tokens.weight
    # transformers loads it back as it was saved
    model = transformers.WhisperForConditionalGeneration.from_pretrained(whisper_model)
    np.testing.assert_array_equal(model.model.encoder.conv2.weight.detach().numpy(),
                                  tensors["model.encoder.conv2.weight"])


def test_q8_0_holds_every_matmul_weight(whisper_model: Path):
    whisper = Whisper()
    weights = whisper.weights(whisper_model, load_config(whisper_model))
    storage, notes = storage_types(whisper, weights.shapes, weights.native, "q8_0", {})
    assert notes == []
    # per encoder layer 4 projections and fc1, fc2; per decoder layer 8 and fc1, fc2;
    # embed_tokens
    assert sum(kind == "q8_0" for kind in storage.values()) == 2 * 6 + 2 * 10 + 1


def test_positions_are_transformers_sinusoids(whisper_model: Path):
    from transformers.models.whisper.modeling_whisper import sinusoids

    positions = read_weights(whisper_model, load_config(whisper_model))[
        "encoder.embed_positions.weight"]
    np.testing.assert_array_equal(positions, sinusoids(1500, 64).numpy())


def test_activations_are_not_degenerate_on_the_clip(whisper_reference: Path):
    """The encoder output varies in time (the std over time per channel is at least 0.4 of the
    overall std, so a per-channel constant does not dominate), each layer's output as well, and
    the speech drives the conv stack more than the silence that pads it to 30 s."""
    dump = Dump(whisper_reference)
    for name in ("layer_0", "layer_1", "enc_out"):
        x = dump.tensor(name)
        assert x.std(axis=0).mean() / x.std() > 0.4, name
        assert np.abs(x).max() < 100, name
    conv = dump.tensor("conv_out")
    speech, silence = conv[:150], conv[-500:]  # the clip lasts 3.09 s: 155 encoder frames
    assert np.sqrt((speech**2).mean()) > 5 * np.sqrt((silence**2).mean())
    mel = dump.tensor("mel_features")
    assert mel[:300].std() > 0.1 and np.ptp(mel[-1000:]) == 0  # the padding: the floor


def test_build_refuses_an_unusable_directory_and_leaves_nothing_when_saving_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(AudioparityError, match="cannot create the directory"):
        build_fixture(tmp_path / "a_file" / "tiny")

    def broken_save(self, path, *args, **kwargs):
        Path(path, "config.json").write_text("{}")
        raise OSError("disk full")

    monkeypatch.setattr(transformers.WhisperForConditionalGeneration, "save_pretrained",
                        broken_save)
    with pytest.raises(OSError, match="disk full"):
        build_fixture(tmp_path / "tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]
