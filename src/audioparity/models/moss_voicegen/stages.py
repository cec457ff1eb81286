"""What both MOSS sides yield, in the family's stage names: the tensors of a full prefill, the
heads at each generated row along the reference's path, and the greedy generation after the
prefill. The reference and the ggml dump yield from the same generators, so their dumps agree by
construction in names and order (the driver lays them out from the family's stages). Imports
neither torch nor ggml.

The path stages ``generation_text_logits`` ``[rows, V_text]`` and ``generation_audio_logits``
``[rows, n_vq, audio_vocab_size+1]`` (pad logit ``-inf``): row ``j`` holds the heads that decide
generated row ``j`` (the rows of ``generation_margins``), every head at every row as the greedy
loop computes them before the delay pattern's masks: row 0 the full prefill's last row, row
``j > 0`` one cached step fed row ``j-1``. The reference records what its own greedy loop saw
(:func:`generation_outputs`); the ggml dump is teacher-forced along it
(:func:`teacher_forced_outputs`): prefilled with the reference's prompt rows and fed the
reference's generated rows, so a step that decides otherwise costs that step alone.

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

from audioparity.contract.family import Outputs, Phase
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.models.moss_voicegen.delay_pattern import greedy_generate
from audioparity.models.moss_voicegen.spec import Names


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
    yield Names.INPUT_EMBEDDINGS, full.embeddings
    yield Names.LAST_HIDDEN, full.hidden[-1]
    yield Names.PROBE_HIDDEN, full.hidden[probe_rows(len(full.hidden))]
    for i, layer in enumerate(full.layers):
        yield Names.LAYER.at(i), layer
    yield Names.TEXT_LOGITS, full.text_logits
    yield Names.AUDIO_LOGITS, full.audio_logits


#: The heads of one row: ``(text [V_text], audio [n_vq, audio_vocab_size+1])``.
Heads = tuple[np.ndarray, np.ndarray]


def path_outputs(heads: list[Heads]) -> Iterator[tuple[str, np.ndarray]]:
    """The path stages (module docstring) of the heads that decided each generated row, in
    row order: ``generation_text_logits`` ``[rows, V_text]``, ``generation_audio_logits``
    ``[rows, n_vq, audio_vocab_size+1]``."""
    yield Names.GENERATION_TEXT_LOGITS, np.stack([text for text, _ in heads])
    yield Names.GENERATION_AUDIO_LOGITS, np.stack([audio for _, audio in heads])


def generation_outputs(config: MossTTSDelayConfig, prompt_rows: np.ndarray, full: Forward,
                       step: Callable[[list[int]], Heads], generate_rows: int
                       ) -> Generator[Any, None, tuple[dict, list[Heads]]]:
    """Greedy generation after the full prefill (:func:`.delay_pattern.greedy_generate`),
    yielded as document ``generation`` and its margins ``generation_margins``
    ``[rows, 1+n_vq]`` (module docstring) by both sides, each naming its phase first (the
    reference's loop computes its path stages too).

    Args:
        config: the checkpoint config.
        prompt_rows: the prompt rows ``[S, 1+n_vq]``.
        full: the forward over them (its ``text_logits``, ``audio_logits``).
        step: feeds one row through the side's KV cache and returns its heads.
        generate_rows: rows to generate at most.

    Returns:
        The ``generation`` document and the heads that decided each of its rows (the value of
        ``yield from``; the reference's path, :func:`path_outputs`).
    """
    heads = [(full.text_logits, full.audio_logits)]

    def recorded(row: list[int]) -> Heads:
        heads.append(step(row))
        return heads[-1]

    document, margins = greedy_generate(config, prompt_rows, *heads[0], recorded, generate_rows)
    yield Names.GENERATION, document
    yield Names.GENERATION_MARGINS, margins
    return document, heads


def teacher_forced_outputs(prompt_rows: np.ndarray, generated_rows: list[list[int]],
                           prefill: Callable[[np.ndarray], Forward],
                           step: Callable[[list[int]], Heads]) -> Outputs:
    """The path stages (:func:`path_outputs`, phase ``generation_text_logits``) along another
    side's generation: a prefill of its ``prompt_rows`` ``[S, 1+n_vq]``, then each of its
    ``generated_rows`` but the last fed as one cached step, whatever this side would have
    chosen there.

    Args:
        prefill: empties this side's KV cache and runs the rows from position 0.
        step: feeds one row through this side's KV cache and returns its heads.
    """
    yield Phase(Names.GENERATION_TEXT_LOGITS)
    full = prefill(prompt_rows)
    heads = [(full.text_logits, full.audio_logits)]
    heads += [step(row) for row in generated_rows[:-1]]
    yield from path_outputs(heads)
