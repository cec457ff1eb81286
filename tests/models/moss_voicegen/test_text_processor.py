"""Our MOSS text processor against the reference processors (transformers' chat template; the
checkpoint's own code), and the prompt files it reads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.models.moss_voicegen import text_processor as tp
from audioparity.models.moss_voicegen.config import load_config
from audioparity.models.moss_voicegen.references.remote_code import reference_prompt
from tests import MOSS_PROMPTS

PROMPTS = MOSS_PROMPTS


@pytest.fixture(scope="module")
def checkpoints(fixture_model) -> dict[str, Path]:
    """The tiny checkpoint, the one that ships its modeling code, the massive-activation one."""
    return {"plain": fixture_model("moss_voicegen"),
            "remote": fixture_model("moss_voicegen", remote_code=True),
            "massive": fixture_model("moss_voicegen", massive_activation=True)}


def test_four_prompt_cases_are_shipped() -> None:
    requests = [tp.load_prompt(p) for p in PROMPTS]
    assert len(requests) >= 4
    assert any(r.instruction is None for r in requests)
    assert any(any("\u4e00" <= ch <= "\u9fff" for ch in r.text) for r in requests)
    assert any(r.text[-1].isalpha() for r in requests)  # no final punctuation


def test_tokenizer_round_trips_english_and_chinese(checkpoints: dict[str, Path]) -> None:
    path = checkpoints["plain"]
    tokenizer = tp.load_tokenizer(path, load_config(path))
    for request in map(tp.load_prompt, PROMPTS):
        assert tokenizer.decode(tokenizer.encode(request.text).ids) == request.text


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
