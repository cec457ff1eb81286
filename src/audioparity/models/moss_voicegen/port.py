"""The ggml port's stages of one case (:meth:`MossVoicegen.ggml`), each phase (named by the
first stage it computes) timed by the driver: the same names and layouts as the reference dump
(:mod:`.reference`), computed by the ggml backbone (:mod:`.backbone`) on the rows of our own
text processor (:mod:`.text_processor`):

- ``prompt``: document ``prompt`` ``{"text", "rows"}`` from our text processor;
- ``input_embeddings`` (the prefill): one prefill of all ``S`` rows -> ``input_embeddings``,
  ``last_hidden`` ``[H]``, ``probe_hidden`` ``[3, H]`` (rows ``[0, 1, S//2]``), ``layer_{i}``
  ``[S, H]``, ``text_logits`` ``[vocab_size]``, ``audio_logits``
  ``[n_vq, audio_vocab_size+1]``;
- ``generation``: greedy rows after the full prefill, document ``generation`` and
  ``generation_margins`` (:mod:`.stages`);
- ``generation_text_logits`` (teacher-forced): the reference's prompt rows prefilled, then its
  generated rows fed one cached step at a time -> ``generation_text_logits``
  ``[rows, vocab_size]``, ``generation_audio_logits`` ``[rows, n_vq, audio_vocab_size+1]``
  (:mod:`.stages`), the reference's path read from its dump (:func:`reference_path`);
- ``step_last_hidden``: prefill of rows ``0..S-2``, then row ``S-1`` as one cached step ->
  ``step_last_hidden`` ``[H]``.

A note says whether every codebook's pad row is zero, read back from the uploaded weights.
"""

from __future__ import annotations

import logging

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, Note, Outputs, Phase
from audioparity.dumping.artifacts import Dump
from audioparity.ggml import Runtime, Weights
from audioparity.models.moss_voicegen import text_processor
from audioparity.models.moss_voicegen.backbone import Backbone
from audioparity.models.moss_voicegen.checkpoint import nonzero_pad_rows
from audioparity.models.moss_voicegen.config import MossTTSDelayConfig
from audioparity.models.moss_voicegen.delay_pattern import greedy_generate
from audioparity.models.moss_voicegen.spec import Names
from audioparity.models.moss_voicegen.stages import (
    Heads,
    generation_outputs,
    prefill_outputs,
    teacher_forced_outputs,
)

log = logging.getLogger("audioparity")


def pad_rows_note(weights: Weights, config: MossTTSDelayConfig) -> str:
    """Whether every codebook embedding's pad row (``audio_pad_code``) is zero as uploaded
    (read back from ``weights``, :func:`.checkpoint.nonzero_pad_rows`): a port that skips pad
    codes is right only then."""
    pad = config.audio_pad_code
    names = [f"emb_ext.{k}.weight" for k in range(config.n_vq)]
    nonzero = [name for name in names
               if nonzero_pad_rows({name: weights.read(name)[pad:pad + 1]}, config, row=0)]
    return "codebook pad rows: " + (
        f"all {config.n_vq} zero (checked)" if not nonzero
        else f"NOT zero in {', '.join(nonzero)} (pad codes contribute to the embedding)")


def reference_path(reference: Dump, config: MossTTSDelayConfig
                   ) -> tuple[np.ndarray, list[list[int]]]:
    """The reference's prompt rows ``[S, 1+n_vq]`` and generated rows, read off its dump and
    checked to be one path: its ``generation_text_logits`` and ``generation_audio_logits``,
    through the delay pattern's rules (:func:`.delay_pattern.greedy_generate`), give its
    ``generation`` rows.

    Raises:
        AudioparityError: they do not (path stages of another generation, or of another
            length).
    """
    prompt = np.asarray(reference.json(Names.PROMPT)["rows"], dtype=np.int64)
    generated = reference.json(Names.GENERATION)["rows"]
    text = reference.tensor(Names.GENERATION_TEXT_LOGITS)
    audio = reference.tensor(Names.GENERATION_AUDIO_LOGITS)
    if not len(text) == len(audio) == len(generated):
        raise AudioparityError(f"{reference.path}: {len(text)} and {len(audio)} rows of "
                               f"generation_*_logits for {len(generated)} generated rows")
    served = zip(text[1:], audio[1:], strict=True)
    document, _ = greedy_generate(config, prompt, text[0], audio[0], lambda row: next(served),
                                  len(generated))
    if document["rows"] != generated:
        raise AudioparityError(f"{reference.path}: its generation_*_logits do not give its "
                               "generation rows under the delay pattern's rules")
    return prompt, generated


def stages(runtime: Runtime, weights: Weights, case: Case, reference: Dump, generate_rows: int,
           kv_cache_type: str) -> Outputs:
    """The stages of the module docstring, on ``case`` (its request, :class:`.Prompt`), with the
    reference dump ``reference`` for the teacher-forced ones.

    Raises:
        AudioparityError: a prompt of fewer than 3 rows, or a reference dump whose path stages
            do not give its generation (:func:`reference_path`).
    """
    config = case.config
    path_prompt, path_rows = reference_path(reference, config)
    yield Note(pad_rows_note(weights, config))
    yield Phase(Names.PROMPT)
    encoded = text_processor.encode(case.model, config, case.data)
    yield Names.PROMPT, encoded.document()
    n_rows = len(encoded.rows)
    if n_rows < 3:
        raise AudioparityError(f"prompt: {n_rows} rows; need at least 3")
    net = Backbone(runtime, weights, config, kv_cache_type=kv_cache_type,
                   max_context=max(n_rows + generate_rows, len(path_prompt) + len(path_rows)))
    yield Phase(Names.INPUT_EMBEDDINGS)
    full = net.prefill(encoded.rows)
    yield from prefill_outputs(full)

    def step(row: list[int]) -> Heads:
        result = net.step(row)
        return result.text_logits, result.audio_logits

    yield Phase(Names.GENERATION)
    document, _ = yield from generation_outputs(config, encoded.rows, full, step,
                                                generate_rows)
    yield from teacher_forced_outputs(path_prompt, path_rows, net.prefill, step)
    yield Phase(Names.STEP_LAST_HIDDEN)
    net.prefill(encoded.rows[:-1])
    last = net.step(encoded.rows[-1])
    yield Names.STEP_LAST_HIDDEN, last.hidden[-1]
    log.info("moss ggml %s: %d prompt rows, %d generated", case.path.name, n_rows,
             len(document["rows"]))
