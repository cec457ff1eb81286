"""Reference-side replay of a MOSS-VoiceGenerator candidate: torch runs each Qwen3 decoder layer
on the candidate's own input to it, so a port that cannot be fed the reference's activations
layer by layer (llama.cpp, openmoss) is still localised layer by layer (docs/candidates.md,
"Replay").

In one prefill of the reference's prompt rows, forward pre-hooks substitute the candidate's
``layer_{i-1}`` ``[S, H]`` for the input of decoder layer ``i``, and its ``input_embeddings``
for layer 0's. What layer ``i`` computes on it is ``layer_{i}_replayed`` ``[S, H]``; the compare
measures the candidate's ``layer_{i}`` against it: the error of that layer alone.
"""

from __future__ import annotations

import logging

import numpy as np

from audioparity.artifacts import Dump
from audioparity.family import Case, Note, Outputs, Phase, Skipped
from audioparity.models.moss_voicegen.reference import forward, reference_prompt

log = logging.getLogger("audioparity")


def layer_inputs(candidate: Dump, n_layers: int, shape: tuple[int, int]
                 ) -> tuple[dict[int, np.ndarray], dict[str, str], list[str]]:
    """The candidate's input to each decoder layer: ``input_embeddings`` for layer 0,
    ``layer_{i-1}`` for layer ``i``, each ``[S, H]`` float32.

    Args:
        candidate: the candidate's dump of the case.
        n_layers: decoder layers of the checkpoint.
        shape: ``(S, H)`` of the reference's prompt.

    Returns:
        ``(inputs, skipped, notes)``: ``{layer: array}``; for each ``layer_{i}_replayed`` that
        cannot be replayed, why (the candidate lacks its input or has it in another shape);
        notes. A candidate without ``input_embeddings`` (one fed the reference's, as llama.cpp
        is) has layer 0 replayed on the reference's own, and a note says so.
    """
    inputs: dict[int, np.ndarray] = {}
    skipped: dict[str, str] = {}
    notes: list[str] = []
    for layer in range(n_layers):
        name = "input_embeddings" if layer == 0 else f"layer_{layer - 1}"
        replayed = f"layer_{layer}_replayed"
        if not candidate.has(name):
            if layer == 0:
                notes.append("layer_0 replayed on the reference's input_embeddings: the "
                             "candidate dump has none")
            else:
                skipped[replayed] = f"the candidate dump has no {name}"
            continue
        array = candidate.tensor(name)
        if array.shape != shape:
            skipped[replayed] = (f"the candidate's {name} is {list(array.shape)}, the "
                                 f"reference's input there is {list(shape)}")
            continue
        inputs[layer] = np.ascontiguousarray(array, dtype=np.float32)
    return inputs, skipped, notes


def replayed(net, case: Case, candidate: Dump) -> Outputs:
    """The reference's decoder layers on a candidate's own inputs (module notes), with the loaded
    ``net``: ``layer_{i}_replayed`` ``[S, H]`` of each layer the candidate gives an input for,
    :class:`~audioparity.family.Skipped` with why for the others (one forward: phase
    ``layer_0_replayed``).

    Args:
        net: the loaded ``MossTTSDelayModel`` (computing as the cell's weight type, for a
            quantized cell's replay).
        case: the case's request, rendered by the reference's own processor.
        candidate: the candidate's dump of the case.
    """
    import torch

    config = case.config
    with torch.inference_mode():
        yield Phase("layer_0_replayed")
        rows = reference_prompt(case.model, config, case.data).rows
        inputs, skipped, notes = layer_inputs(candidate, config.n_layers,
                                              (len(rows), config.hidden_size))
        full, _ = forward(net, torch.from_numpy(rows)[None], layer_inputs=inputs)
    for layer, array in enumerate(full.layers):
        if f"layer_{layer}_replayed" not in skipped:
            yield f"layer_{layer}_replayed", array
    for note in notes:
        yield Note(note)
    for stage, why in skipped.items():
        yield Skipped(stage, why)
    log.info("replay moss-voicegen: %s: %d layers replayed, %d not", candidate.path,
             config.n_layers - len(skipped), len(skipped))
