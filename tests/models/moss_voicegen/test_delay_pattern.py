"""The greedy delay-pattern rules against trajectories derived by hand from upstream's
``MossTTSDelayModel.generate`` (batch 1, temperature 0): masks, the codebook staircase, the
delay run, ``audio_end``, ``im_end``."""

from __future__ import annotations

import math

import numpy as np
import pytest

from audioparity.models.moss_voicegen.config import LanguageConfig, MossTTSDelayConfig
from audioparity.models.moss_voicegen.delay_pattern import (
    FORCED,
    DelayPatternState,
    _argmax_with_margin,
    greedy_generate,
)

PAD, IM_START, IM_END, A_START, A_END, USER, GEN, DELAY = 10, 11, 12, 13, 14, 15, 8, 9
N_VQ, CODES = 3, 5  # pad code = 5
CONFIG = MossTTSDelayConfig(
    n_vq=N_VQ, audio_vocab_size=CODES, audio_pad_code=CODES, pad_token_id=PAD,
    im_start_token_id=IM_START, im_end_token_id=IM_END, audio_start_token_id=A_START,
    audio_end_token_id=A_END, audio_user_slot_token_id=USER,
    audio_assistant_gen_slot_token_id=GEN, audio_assistant_delay_slot_token_id=DELAY,
    language_config=LanguageConfig(
        vocab_size=16, hidden_size=8, intermediate_size=8, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=8, rms_norm_eps=1e-6,
        rope_theta=1e4, hidden_act="silu", attention_bias=False),
)
PROMPT = np.array([[IM_START] + [CODES] * N_VQ, [3] + [CODES] * N_VQ])


def text_logits(order: list[int]) -> np.ndarray:
    """Logits ranking ``order`` first (highest) to last; other ids far below."""
    logits = np.full(16, -100.0)
    for rank, token in enumerate(order):
        logits[token] = 10.0 - rank
    return logits


def audio_logits(best: list[int]) -> np.ndarray:
    """Codebook k prefers code ``best[k]``; the pad code is highest of all (must be excluded)."""
    logits = np.zeros((N_VQ, CODES + 1))
    for k, code in enumerate(best):
        logits[k, code] = 2.0
    logits[:, CODES] = 50.0
    return logits


def test_one_audio_segment_follows_the_delay_pattern() -> None:
    # Text preferences per step; the masks decide what is allowed at each step.
    steps = [
        [DELAY, IM_END, PAD, A_START, 1],  # step 0: delay and im_end masked, pad excluded
        [A_START, GEN, DELAY],             # in audio: only gen/delay allowed -> gen
        [GEN, DELAY],
        [DELAY, GEN],                      # the delay run starts
        [GEN, DELAY], [GEN, DELAY],        # forced delay slots while draining
        [GEN, DELAY],                      # forced audio_end
        [IM_END, 1, 2],                    # outside audio, after step n_vq: im_end allowed
    ]
    state = DelayPatternState.from_prompt(CONFIG, PROMPT)
    rows = [state.step(text_logits(order), audio_logits([1, 2, 3]))[0] for order in steps]
    p = CODES
    assert rows == [
        [A_START, p, p, p],  # audio_length 0: no code yet
        [GEN, 1, p, p],      # staircase: codebook k starts k rows after audio_start
        [GEN, 1, 2, p],
        [DELAY, 1, 2, 3],
        [DELAY, p, 2, 3],    # draining: codebook k stops k rows after the first delay slot
        [DELAY, p, p, 3],
        [A_END, p, p, p],
        [IM_END, p, p, p],
    ]
    assert state.is_stopping and not state.is_audio


def test_margins_are_runner_up_gaps_and_forced_values_are_infinite() -> None:
    state = DelayPatternState.from_prompt(CONFIG, PROMPT)
    _, margins = state.step(text_logits([A_START, 1]), audio_logits([1, 2, 3]))
    assert margins[0] == pytest.approx(1.0)  # 10 - 9
    assert all(math.isinf(m) for m in margins[1:])  # no code sampled: all forced pads


def test_one_allowed_value_is_forced_and_a_non_finite_allowed_logit_is_nan() -> None:
    everything = np.ones(3, dtype=bool)
    assert _argmax_with_margin(np.array([5.0, 2.0, 7.0]), np.array([False, True, False])) \
        == (1, FORCED)
    assert _argmax_with_margin(np.array([1.0, 3.0, 2.5]), everything) == (1, 0.5)
    # an overflow that leaves one finite logit is not a forced choice
    for logits in ([-np.inf, 2.0, -np.inf], [np.nan, 1.0, 0.0], [np.inf, 1.0, 0.0]):
        assert math.isnan(_argmax_with_margin(np.array(logits), everything)[1])
    # a non-finite logit the masks exclude decides nothing
    assert _argmax_with_margin(np.array([np.nan, 1.0, 0.0]),
                               np.array([False, True, True])) == (1, 1.0)


def test_a_step_whose_audio_logits_overflowed_is_undecided_not_forced() -> None:
    state = DelayPatternState.from_prompt(CONFIG, PROMPT)
    state.step(text_logits([A_START, 1]), audio_logits([1, 2, 3]))  # audio opens
    overflowed = audio_logits([1, 2, 3])
    overflowed[0, :] = -np.inf
    overflowed[0, 2] = 0.0
    _, margins = state.step(text_logits([GEN, 1]), overflowed)
    assert math.isnan(margins[1])


def test_im_end_is_masked_until_step_n_vq() -> None:
    state = DelayPatternState.from_prompt(CONFIG, PROMPT)
    texts = [state.step(text_logits([IM_END, 1]), audio_logits([0, 0, 0]))[0][0]
             for _ in range(N_VQ + 2)]
    assert texts == [1] * (N_VQ + 1) + [IM_END]


def test_prompt_ending_in_audio_start_continues_the_segment() -> None:
    prompt = np.vstack([PROMPT, [A_START] + [CODES] * N_VQ])
    state = DelayPatternState.from_prompt(CONFIG, prompt)
    assert state.is_audio and state.audio_length == 1
    row, _ = state.step(text_logits([DELAY, A_START, GEN]), audio_logits([4, 4, 4]))
    assert row == [GEN, 4, CODES, CODES]  # delay masked at step 0, codebook 0 open


def test_greedy_generate_stops_after_im_end() -> None:
    calls = []

    def step(row):
        calls.append(row)
        return text_logits([IM_END, 1]), audio_logits([0, 0, 0])

    document, margins = greedy_generate(CONFIG, PROMPT, text_logits([1, 2]),
                                        audio_logits([0, 0, 0]), step, n_rows=16)
    assert [r[0] for r in document["rows"]] == [1, 1, 1, 1, IM_END]
    assert document["stopped"] and document["requested_rows"] == 16
    assert margins.shape == (5, 1 + N_VQ) and len(calls) == 4
