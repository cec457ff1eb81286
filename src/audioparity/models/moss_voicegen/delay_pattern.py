"""Greedy delay-pattern generation rules, shared by the reference and the ggml dump.

Mirrors ``MossTTSDelayModel.generate`` (OpenMOSS ``modeling_moss_tts.py``) for batch size 1 with
``text_temperature = audio_temperature = 0`` (argmax) and ``audio_repetition_penalty = 1.0``.
Each step turns the heads' logits at the last position into the next input row
``[text, code_0, ..., code_{n_vq-1}]``:

- Text. While a delay run is draining (``delayed_length < n_vq``) the text is the delay slot;
  when it reaches ``n_vq`` the text is ``audio_end`` and the audio segment closes. Otherwise the
  text is the argmax of the text logits with masks: outside audio, pad / generation slot / delay
  slot / ``audio_end`` are excluded; inside audio, only the generation and delay slots are
  allowed; at step 0 the delay slot is excluded; up to step ``n_vq`` ``im_end`` is excluded.
  ``audio_start`` opens audio; ``im_end`` stops generation (that row is the last).
- Audio. Codebook ``k`` is sampled (argmax, pad logit excluded) when ``k < audio_length`` (the
  delay pattern's staircase: codebook k starts k rows after ``audio_start``) and, during a delay
  run, ``k >= delayed_length`` (the staircase drains); every other code is the pad.
- Update. ``audio_start``, generation and delay slots lengthen the audio; ``audio_end`` resets
  it; the first delay slot starts the delay run, which counts up and ends after ``n_vq``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from audioparity.models.moss_voicegen.config import MossTTSDelayConfig

#: Margin of a value the rules force (no argmax decision).
FORCED = float("inf")
#: Schema tag of the ``generation`` document.
RULES = "MossTTSDelayModel.generate, batch 1, greedy (temperature 0), repetition penalty 1.0"


@dataclass
class DelayPatternState:
    """Per-sequence generation state (upstream's per-batch tensors for one sequence).

    ``delayed_length`` is None when no delay run is active (upstream: int64 max).
    """

    config: MossTTSDelayConfig
    audio_length: int = 0
    delayed_length: int | None = None
    is_audio: bool = False
    is_stopping: bool = False
    time_step: int = 0

    @classmethod
    def from_prompt(cls, config: MossTTSDelayConfig, rows: np.ndarray) -> DelayPatternState:
        """Initial state after prefilling ``rows`` ``[S, 1+n_vq]``: a prompt ending in
        ``audio_start`` or a generation slot continues the audio segment that starts at the
        last ``audio_start``."""
        state = cls(config)
        text = rows[:, 0]
        continuation = int(text[-1]) in (config.audio_start_token_id,
                                         config.audio_assistant_gen_slot_token_id)
        starts = np.flatnonzero(text == config.audio_start_token_id)
        if continuation and starts.size:
            state.audio_length = len(text) - int(starts[-1])
            state.is_audio = True
        return state

    def _text(self, logits: np.ndarray) -> tuple[int, float]:
        """Next text id and its margin (``+inf`` when forced)."""
        cfg, n_vq = self.config, self.config.n_vq
        if self.delayed_length is not None and self.delayed_length < n_vq:
            return cfg.audio_assistant_delay_slot_token_id, FORCED
        if self.delayed_length == n_vq:
            self.is_audio = False
            return cfg.audio_end_token_id, FORCED
        allowed = np.zeros(len(logits), dtype=bool)
        if self.is_audio:
            allowed[[cfg.audio_assistant_gen_slot_token_id,
                     cfg.audio_assistant_delay_slot_token_id]] = True
        else:
            allowed[:] = True
            allowed[[cfg.pad_token_id, cfg.audio_assistant_gen_slot_token_id,
                     cfg.audio_assistant_delay_slot_token_id, cfg.audio_end_token_id]] = False
        if self.time_step == 0:
            allowed[cfg.audio_assistant_delay_slot_token_id] = False
        if self.time_step <= n_vq:
            allowed[cfg.im_end_token_id] = False
        return _argmax_with_margin(logits, allowed)

    def step(self, text_logits: np.ndarray,
             audio_logits: np.ndarray) -> tuple[list[int], list[float]]:
        """One generation step.

        Args:
            text_logits: ``[vocab_size]`` text head at the last position.
            audio_logits: ``[n_vq, audio_vocab_size+1]`` audio heads at the last position.

        Returns:
            The next row ``[text, code_0, ..., code_{n_vq-1}]`` and, per column, the margin of
            its argmax decision (:func:`_argmax_with_margin`), ``+inf`` for a forced value.
        """
        cfg, n_vq = self.config, self.config.n_vq
        text, text_margin = self._text(text_logits)
        if text == cfg.audio_start_token_id:
            self.is_audio = True
        if text == cfg.im_end_token_id:
            self.is_stopping = True
        codes, margins = [], [text_margin]
        for k in range(n_vq):
            sampled = k < self.audio_length and (
                self.delayed_length is None or k >= self.delayed_length)
            if sampled:
                allowed = np.ones(len(audio_logits[k]), dtype=bool)
                allowed[cfg.audio_pad_code] = False
                code, margin = _argmax_with_margin(audio_logits[k], allowed)
            else:
                code, margin = cfg.audio_pad_code, FORCED
            codes.append(code)
            margins.append(margin)
        if text in (cfg.audio_start_token_id, cfg.audio_assistant_gen_slot_token_id,
                    cfg.audio_assistant_delay_slot_token_id):
            self.audio_length += 1
        if text == cfg.audio_end_token_id:
            self.audio_length = 0
        if self.delayed_length is None and text == cfg.audio_assistant_delay_slot_token_id:
            self.delayed_length = 0
        if self.delayed_length is not None:
            self.delayed_length += 1
            if self.delayed_length > n_vq:
                self.delayed_length = None
        self.time_step += 1
        return [text, *codes], margins


def _argmax_with_margin(logits: np.ndarray, allowed: np.ndarray) -> tuple[int, float]:
    """The rules' choice among the values they allow, as upstream's ``torch.argmax`` over the
    logits with every other value set to ``-inf``, and how clear it was.

    Args:
        logits: ``[n]`` one head's logits at the last position, as the model computed them.
        allowed: ``[n]`` bool, the values the masks leave (at least one).

    Returns:
        The first index of the largest allowed logit, and its margin: the largest minus the
        runner-up among the allowed; :data:`FORCED` when one value is allowed; NaN when an
        allowed logit is not finite (an overflow or a NaN is never a decision, even where
        it leaves one finite value).
    """
    index = np.flatnonzero(allowed)
    values = np.asarray(logits, dtype=np.float64)[index]
    best = int(index[np.argmax(values)])
    if not np.isfinite(values).all():
        return best, float("nan")
    if index.size == 1:
        return best, FORCED
    runner_up, top = np.partition(values, -2)[-2:]
    return best, float(top - runner_up)


def generation_document(config: MossTTSDelayConfig, rows: list[list[int]], requested: int,
                        stopped: bool) -> dict:
    """The ``generation`` document::

        {"rows": [[text, code_0, ..., code_{n_vq-1}], ...],  # <= requested_rows rows, int
         "requested_rows": N, "stopped": bool,  # stopped: im_end emitted (then rows < N)
         "n_vq": int, "audio_pad_code": int, "rules": RULES}
    """
    return {
        "rows": rows,
        "requested_rows": requested,
        "stopped": stopped,
        "n_vq": config.n_vq,
        "audio_pad_code": config.audio_pad_code,
        "rules": RULES,
    }


def greedy_generate(config: MossTTSDelayConfig, prompt_rows: np.ndarray,
                    text_logits: np.ndarray, audio_logits: np.ndarray,
                    step: Callable[[list[int]], tuple[np.ndarray, np.ndarray]],
                    n_rows: int) -> tuple[dict, np.ndarray]:
    """Greedy generation of up to ``n_rows`` rows after a prefill of ``prompt_rows``.

    Args:
        config: the checkpoint config (token ids, ``n_vq``, pad code).
        prompt_rows: the prefilled rows ``[S, 1+n_vq]`` (for the initial state).
        text_logits, audio_logits: the heads at the prompt's last position (``[vocab_size]``,
            ``[n_vq, audio_vocab_size+1]``).
        step: feeds one row through the model's KV cache and returns the heads at that row.
        n_rows: rows to generate; fewer come back when ``im_end`` is generated.

    Returns:
        The ``generation`` document (:func:`generation_document`) and the margins
        ``[rows, 1+n_vq]`` float32: per decision, the chosen minus the runner-up logit; ``+inf``
        where the value was forced (no argmax), NaN where the logits were not finite.
    """
    state = DelayPatternState.from_prompt(config, prompt_rows)
    rows: list[list[int]] = []
    margins: list[list[float]] = []
    while len(rows) < n_rows:
        row, margin = state.step(text_logits, audio_logits)
        rows.append(row)
        margins.append(margin)
        if state.is_stopping or len(rows) == n_rows:
            break
        text_logits, audio_logits = step(row)
    return (generation_document(config, rows, n_rows, state.is_stopping),
            np.asarray(margins, dtype=np.float32).reshape(len(rows), 1 + config.n_vq))
