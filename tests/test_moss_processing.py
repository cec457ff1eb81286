"""The tiny MOSS checkpoint (layout, determinism, the massive activation) and our text processor
against the reference processors (transformers' chat template; the checkpoint's own code)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from audioparity.errors import AudioparityError
from audioparity.models.moss_voicegen import checkpoint as wt
from audioparity.models.moss_voicegen import fixture as fx
from audioparity.models.moss_voicegen import text_processor as tp
from audioparity.models.moss_voicegen.config import load_config
from audioparity.models.moss_voicegen.reference import reference_prompt

PROMPTS = sorted((Path(__file__).resolve().parent.parent / "resources" / "moss").glob("*.json"))


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("moss_checkpoints")
    paths = {"plain": root / "plain", "remote": root / "remote", "massive": root / "massive"}
    fx.build_fixture(paths["plain"], seed=0)
    fx.build_fixture(paths["remote"], seed=0, remote_code=True)
    fx.build_fixture(paths["massive"], seed=0, massive_activation=True)
    return paths


def test_four_prompt_cases_are_shipped() -> None:
    requests = [tp.load_prompt(p) for p in PROMPTS]
    assert len(requests) >= 4
    assert any(r.instruction is None for r in requests)
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in r.text) for r in requests)
    assert any(r.text[-1].isalpha() for r in requests)  # no final punctuation


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


def test_tokenizer_round_trips_english_and_chinese(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["plain"]
    tokenizer = tp.load_tokenizer(path, load_config(path))
    for request in map(tp.load_prompt, PROMPTS):
        assert tokenizer.decode(tokenizer.encode(request.text).ids) == request.text


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


def test_render_matches_the_voice_generator_template() -> None:
    rendered = tp.render(tp.Prompt(text="Hello there"))
    assert rendered == (
        "<|im_start|>user\n<user_inst>\n- Reference(s):\nNone\n- Instruction:\nNone\n"
        "- Tokens:\nNone\n- Quality:\nNone\n- Sound Event:\nNone\n- Ambient Sound:\nNone\n"
        "- Language:\nNone\n- Text:\nHello there\n</user_inst><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


@pytest.mark.parametrize("kind", ["plain", "remote"])
@pytest.mark.parametrize("prompt", PROMPTS, ids=lambda p: p.stem)
def test_prompt_rows_equal_the_reference_processor(checkpoints: dict[str, Path], kind: str,
                                                   prompt: Path) -> None:
    path = checkpoints[kind]
    config = load_config(path)
    request = tp.load_prompt(prompt)
    ours = tp.encode(path, config, request)
    reference = reference_prompt(path, config, request)
    assert ours.text == reference.text
    assert ours.rows.dtype == reference.rows.dtype == np.int64
    np.testing.assert_array_equal(ours.rows, reference.rows)
    assert (ours.rows[:, 1:] == config.audio_pad_code).all()


def test_chat_token_id_mismatch_is_an_error(checkpoints: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(checkpoints["plain"], broken)
    raw = json.loads((broken / "config.json").read_text())
    raw["im_start_token_id"] += 1
    (broken / "config.json").write_text(json.dumps(raw))
    with pytest.raises(AudioparityError, match="im_start"):
        tp.load_tokenizer(broken, load_config(broken))


@pytest.mark.parametrize("content, message", [
    ({"instruction": "calm"}, "'text' must be a string"),
    ({"text": "hi", "voice": "x"}, "unknown keys"),
    ({"text": "hi", "language": 3}, "'language' must be a string or null"),
])
def test_bad_prompt_files_are_errors(tmp_path: Path, content: dict, message: str) -> None:
    path = tmp_path / "prompt.json"
    path.write_text(json.dumps(content))
    with pytest.raises(AudioparityError, match=message):
        tp.load_prompt(path)
