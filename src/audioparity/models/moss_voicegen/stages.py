"""What both MOSS sides yield, in the family's stage names: the tensors of a full prefill and the
greedy generation after it. The reference and the ggml dump yield from the same generators, so
their dumps agree by construction in names and order (the driver lays them out from the
family's stages). Imports neither torch nor ggml.

The ``generation`` document::

    {"rows": [[text, code_0, ..., code_{n_vq-1}], ...],  # <= requested_rows rows, int
     "requested_rows": N, "stopped": bool,  # stopped: im_end emitted (then rows < N)
     "n_vq": int, "audio_pad_code": int, "rules": str}

and ``generation_margins`` ``[rows, 1+n_vq]``: per generated value, its argmax margin (chosen
minus runner-up logit, after the rules' masks); ``+inf`` where the rules force the value, NaN
where the logits were not finite (:func:`.delay_pattern.greedy_generate`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from audioparity.family import Phase
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.models.moss_voicegen.delay_pattern import greedy_generate


@dataclass(frozen=True)
class Forward:
    """Outputs of one forward over ``n`` rows (float32).

    ``embeddings`` ``[n, H]``: the input embeddings (``_compute_input_embeddings``, the text
    embedding plus the ``n_vq`` codebook embeddings of each row); ``hidden`` ``[n, H]``: final
    normed hidden states; ``layers`` ``[n_layers, n, H]``: each decoder
    layer's output at every row; ``text_logits`` ``[vocab_size]`` and ``audio_logits``
    ``[n_vq, audio_vocab_size+1]`` (pad logit ``-inf``): the heads at the last row.
    """

    embeddings: np.ndarray
    hidden: np.ndarray
    layers: np.ndarray
    text_logits: np.ndarray
    audio_logits: np.ndarray


def probe_rows(n_rows: int) -> list[int]:
    """Rows of ``probe_hidden``: the first two and the middle one, ``[0, 1, S//2]``."""
    return [0, 1, n_rows // 2]


def prefill_outputs(full: Forward) -> Iterator[tuple[str, np.ndarray]]:
    """The stages of the full prefill, as both sides yield them: ``input_embeddings``
    ``[S, H]``, ``last_hidden`` ``[H]``, ``probe_hidden`` ``[3, H]`` (rows :func:`probe_rows`),
    ``layer_{i}`` ``[S, H]``, ``text_logits`` ``[V_text]``, ``audio_logits``
    ``[n_vq, audio_vocab_size+1]``.

    Args:
        full: the forward over all ``S`` prompt rows (:class:`Forward`).
    """
    yield "input_embeddings", full.embeddings
    yield "last_hidden", full.hidden[-1]
    yield "probe_hidden", full.hidden[probe_rows(len(full.hidden))]
    for i, layer in enumerate(full.layers):
        yield f"layer_{i}", layer
    yield "text_logits", full.text_logits
    yield "audio_logits", full.audio_logits


def generation_outputs(config: MossTTSDelayConfig, prompt_rows: np.ndarray, full: Forward,
                       step: Callable[[list[int]], tuple[np.ndarray, np.ndarray]],
                       generate_rows: int) -> Generator[Any, None, dict]:
    """Greedy generation after the full prefill (:func:`.delay_pattern.greedy_generate`, phase
    ``generation``), yielded as document ``generation`` and its margins
    ``generation_margins`` ``[rows, 1+n_vq]`` (module docstring) by both sides.

    Args:
        config: the checkpoint config.
        prompt_rows: the prompt rows ``[S, 1+n_vq]``.
        full: the forward over them (its ``text_logits``, ``audio_logits``).
        step: feeds one row through the side's KV cache and returns its heads.
        generate_rows: rows to generate at most.

    Returns:
        The ``generation`` document (the value of ``yield from``).
    """
    yield Phase("generation")
    document, margins = greedy_generate(config, prompt_rows, full.text_logits,
                                        full.audio_logits, step, generate_rows)
    yield "generation", document
    yield "generation_margins", margins
    return document
