"""What both MOSS sides write, in the family's stage names: the tensors of a full prefill and
the greedy generation after it (the reference and the ggml dump call the same functions, so
their dumps agree by construction in names, layouts and order)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from audioparity.artifacts import DumpWriter
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


def write_prefill(writer: DumpWriter, full) -> None:
    """The tensors of the full prefill, as both sides write them: ``input_embeddings``
    ``[S, H]``, ``last_hidden`` ``[H]``,
    ``probe_hidden`` ``[3, H]`` (rows :func:`probe_rows`), ``layer_{i}`` ``[S, H]``,
    ``text_logits`` ``[V_text]``, ``audio_logits`` ``[n_vq, audio_vocab_size+1]``.

    Args:
        writer: the dump being written.
        full: the forward over all ``S`` prompt rows, with numpy ``hidden`` ``[S, H]``,
            ``layers`` ``[n_layers, S, H]``, ``text_logits`` and ``audio_logits``
            (:class:`Forward`).
    """
    writer.add_tensor("input_embeddings", full.embeddings, "[S, H]")
    writer.add_tensor("last_hidden", full.hidden[-1], "[H]")
    writer.add_tensor("probe_hidden", full.hidden[probe_rows(len(full.hidden))], "[3, H]")
    for i, layer in enumerate(full.layers):
        writer.add_tensor(f"layer_{i}", layer, "[S, H]")
    writer.add_tensor("text_logits", full.text_logits, "[V_text]")
    writer.add_tensor("audio_logits", full.audio_logits, "[n_vq, audio_vocab_size+1]")


def write_generation(writer: DumpWriter, config: MossTTSDelayConfig, prompt_rows: np.ndarray,
                     full, step: Callable[[list[int]], tuple[np.ndarray, np.ndarray]],
                     generate_rows: int) -> dict:
    """Greedy generation after the full prefill (:func:`.delay_pattern.greedy_generate`, timed
    as stage ``generation``), written as document ``generation`` and tensor
    ``generation_margins`` ``[rows, 1+n_vq]`` by both sides.

    Args:
        writer: the dump being written.
        config: the checkpoint config.
        prompt_rows: the prompt rows ``[S, 1+n_vq]``.
        full: the forward over them (its ``text_logits``, ``audio_logits``; :func:`write_prefill`).
        step: feeds one row through the side's KV cache and returns its heads.
        generate_rows: rows to generate at most.

    Returns:
        The ``generation`` document.
    """
    with writer.timed("generation"):
        document, margins = greedy_generate(config, prompt_rows, full.text_logits,
                                            full.audio_logits, step, generate_rows)
    writer.add_json("generation", document)
    writer.add_tensor("generation_margins", margins, "[rows, 1+n_vq]")
    return document
