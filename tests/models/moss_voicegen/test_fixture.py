"""The tiny MOSS checkpoint: laid out as the real one, the same bytes from the same seed, and
the massive activation beyond float16 where it is planted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.models.moss_voicegen import checkpoint as wt
from audioparity.models.moss_voicegen import fixture as fx
from audioparity.models.moss_voicegen.config import load_config


@pytest.fixture(scope="module")
def checkpoints(fixture_model) -> dict[str, Path]:
    """The tiny checkpoint, the one that ships its modeling code, the massive-activation one."""
    return {"plain": fixture_model("moss_voicegen"),
            "remote": fixture_model("moss_voicegen", remote_code=True),
            "massive": fixture_model("moss_voicegen", massive_activation=True)}


def test_same_seed_gives_the_same_bytes(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    again = tmp_path / "again"
    fx.build_fixture(again, seed=0)
    files = sorted(p.name for p in checkpoints["plain"].iterdir())
    assert files == sorted(p.name for p in again.iterdir())
    for name in files:
        assert (again / name).read_bytes() == (checkpoints["plain"] / name).read_bytes(), name
    fx.build_fixture(again, seed=1)
    assert ((again / "model.safetensors").read_bytes()
            != (checkpoints["plain"] / "model.safetensors").read_bytes())


def test_checkpoint_is_laid_out_as_the_real_one(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["plain"]
    config = load_config(path)
    lang = config.language_config
    assert (config.n_vq, lang.hidden_size, lang.num_hidden_layers) == (4, 64, 2)
    assert (lang.num_attention_heads, lang.num_key_value_heads, lang.head_dim) == (4, 2, 16)
    assert config.audio_pad_code == config.audio_vocab_size and config.auto_map is None
    arrays, stored = wt.load_weights(path, config)
    assert set(arrays) == set(wt.expected_shapes(config))
    assert set(stored.values()) == {"BF16"}
    assert wt.nonzero_pad_rows(arrays, config) == []
    header = json.loads((path / "tokenizer_config.json").read_text())
    assert "chat_template" in header
    remote = load_config(checkpoints["remote"])
    assert remote.auto_map and (checkpoints["remote"] / "modeling_moss_tts.py").is_file()


def test_massive_fixture_exceeds_float16_at_row_0(checkpoints: dict[str, Path]) -> None:
    """Layer 0 at row 0 (``<|im_start|>``, attending only to itself), in float64 numpy from the
    stored weights: the SwiGLU product and the massive channel pass float16's 65504."""
    path = checkpoints["massive"]
    config = load_config(path)
    lang = config.language_config
    w, _ = wt.load_weights(path, config)
    w = {k: v.astype(np.float64) for k, v in w.items()}
    p = "language_model.layers.0."

    def norm(x, weight):
        return x / np.sqrt(np.mean(x**2) + lang.rms_norm_eps) * weight

    x = w["language_model.embed_tokens.weight"][config.im_start_token_id]
    v = (w[p + "self_attn.v_proj.weight"] @ norm(x, w[p + "input_layernorm.weight"]))
    group = lang.num_attention_heads // lang.num_key_value_heads
    per_head = np.repeat(v.reshape(lang.num_key_value_heads, lang.head_dim), group, axis=0)
    h = norm(x + w[p + "self_attn.o_proj.weight"] @ per_head.ravel(),
             w[p + "post_attention_layernorm.weight"])
    gate, up = w[p + "mlp.gate_proj.weight"] @ h, w[p + "mlp.up_proj.weight"] @ h
    act = gate / (1 + np.exp(-gate)) * up
    assert act.max() > 65504  # the down_proj input overflows float16
    out = w[p + "mlp.down_proj.weight"] @ act
    assert abs(out[fx.MASSIVE_CHANNEL]) > 65504
    assert np.abs(np.delete(out, fx.MASSIVE_CHANNEL)).max() < 1e3
