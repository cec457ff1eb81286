"""Whisper's greedy decoding rules, shared by the reference and the port (numpy only, no torch,
no ggml): the forced prompt, the suppressed tokens, the greedy choice with its margin, and when
to stop. They are ``WhisperGenerationMixin.generate``'s (transformers
``generation_utils.py`` of ``models/whisper``) at ``num_beams=1``, ``do_sample=False``,
``return_timestamps=False``, one 30 s window:

- the prompt (``init_tokens``): ``<|startoftranscript|>``; for a multilingual model the
  language token and the task token; ``<|notimestamps|>``;
- at every step the logits of ``suppress_tokens`` are ``-inf`` (``SuppressTokensLogitsProcessor``)
  and at the first generated step those of ``begin_suppress_tokens`` too
  (``SuppressTokensAtBeginLogitsProcessor``, ``begin_index`` the prompt's length);
- the token is the argmax (the first on a tie, as ``torch.argmax``); its margin is its logit
  minus the runner-up's, after suppression;
- the decode ends when ``<|endoftext|>`` is chosen, or when the sequence, prompt included,
  reaches ``max_length`` (``MaxLengthCriteria``), at most ``max_target_positions``.

Timestamps are not implemented: the prompt always ends with ``<|notimestamps|>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.models.whisper.config import WhisperModelConfig

#: The tasks of a multilingual model's prompt.
TASKS = ("transcribe", "translate")


def prompt_ids(config: WhisperModelConfig, language: str, task: str) -> list[int]:
    """The forced decoder prompt: ``<|startoftranscript|>``, for a multilingual model
    ``<|language|>`` and ``<|task|>``, then ``<|notimestamps|>``.

    Args:
        language: a multilingual model's language, as ``lang_to_id`` names it (``en`` or
            ``<|en|>``); "" for an English-only model (language detection is not implemented).
        task: ``transcribe`` or ``translate`` (an English-only model only transcribes).

    Raises:
        AudioparityError: a language for an English-only model or none for a multilingual one,
            a language the model does not know, or a task other than ``transcribe`` for an
            English-only model.
    """
    generation = config.generation
    if task not in TASKS:
        raise AudioparityError(f"task {task!r}; expected one of {', '.join(TASKS)}")
    if not generation.is_multilingual:
        if language or task != "transcribe":
            raise AudioparityError(f"language={language!r}, task={task!r}: an English-only "
                                   "Whisper takes no language and only transcribes (expected "
                                   "language '' and task 'transcribe')")
        return [generation.decoder_start_token_id, generation.no_timestamps_token_id]
    languages = dict(generation.lang_to_id)
    token = language if language.startswith("<|") else f"<|{language}|>"
    if token not in languages:
        raise AudioparityError(f"language {language!r} is not one of the model's lang_to_id "
                               f"({', '.join(sorted(languages))[:200]}); language detection "
                               "is not implemented")
    return [generation.decoder_start_token_id, languages[token], dict(generation.task_to_id)[task],
            generation.no_timestamps_token_id]


def max_length(config: WhisperModelConfig) -> int:
    """The longest sequence a decode makes, prompt included: ``max_length`` of the generation
    config, at most ``max_target_positions`` (the decoder has no position beyond)."""
    return min(config.generation.max_length, config.decoder.max_target_positions)


def suppressed(config: WhisperModelConfig, logits: np.ndarray, first: bool) -> np.ndarray:
    """``logits`` ``[V]`` (a copy, float32) with the suppressed tokens ``-inf``: every step's
    ``suppress_tokens``, and the first generated step's ``begin_suppress_tokens``."""
    out = np.array(logits, dtype=np.float32)
    generation = config.generation
    out[list(generation.suppress_tokens)] = -np.inf
    if first:
        out[list(generation.begin_suppress_tokens)] = -np.inf
    return out


def choose(logits: np.ndarray) -> tuple[int, float]:
    """The greedy token of processed ``logits`` ``[V]`` (the first maximum) and its margin: its
    logit minus the runner-up's (``+inf`` when every other logit is ``-inf``; NaN when the
    logits are not finite)."""
    token = int(np.argmax(logits))
    if np.isnan(logits).any() or logits[token] == -np.inf:
        return token, float("nan")
    others = np.delete(logits, token)
    runner_up = float(np.max(others)) if len(others) else -np.inf
    return token, float(logits[token]) - runner_up


@dataclass
class Decode:
    """A greedy decode.

    Attributes:
        ids: the generated tokens: no prompt, no ``<|endoftext|>``.
        margins: the margin of each generated token ``[len(ids)]`` float32 (:func:`choose`).
        stopped: ``eos`` (``<|endoftext|>`` chosen) or ``max_length``.
        steps: the logits of every step ``[steps, V]`` float32, before suppression: the
            prompt's last row, then one row per generated token (the ``<|endoftext|>`` step
            included).
    """

    ids: list[int]
    margins: np.ndarray
    stopped: str
    steps: np.ndarray


def greedy(config: WhisperModelConfig, prompt: Sequence[int],
           forward: Callable[[list[int]], np.ndarray]) -> Decode:
    """The greedy decode of the module's rules over a KV-cached decoder.

    Args:
        prompt: the forced tokens (:func:`prompt_ids`).
        forward: runs the decoder on the given new tokens (first the whole prompt, then one
            token at a time), after those it ran before (its KV cache), and returns the logits
            ``[V]`` of the last of them.

    Raises:
        AudioparityError: the prompt already fills ``max_length``.
    """
    limit = max_length(config)
    if len(prompt) >= limit:
        raise AudioparityError(f"the prompt has {len(prompt)} tokens; max_length is {limit}")
    eos = config.generation.eos_token_id
    ids: list[int] = []
    margins: list[float] = []
    steps = [np.asarray(forward(list(prompt)), dtype=np.float32)]
    stopped = "max_length"
    while True:
        token, margin = choose(suppressed(config, steps[-1], first=not ids))
        if token == eos:
            stopped = "eos"
            break
        ids.append(token)
        margins.append(margin)
        if len(prompt) + len(ids) >= limit:
            break
        steps.append(np.asarray(forward([token]), dtype=np.float32))
    return Decode(ids, np.asarray(margins, dtype=np.float32), stopped, np.stack(steps))
