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
from contextlib import ExitStack
from pathlib import Path

import numpy as np

from audioparity.artifacts import Dump
from audioparity.models.moss_voicegen import text_processor
from audioparity.models.moss_voicegen.config import load_config
from audioparity.models.moss_voicegen.reference import forward, load_model, reference_prompt
from audioparity.replay import load_emulated, nothing_to_replay, record_skipped, replay_writer
from audioparity.threads import torch_threads

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


def dump_replay(model: Path, prompt: Path, candidate_dir: Path, output_dir: Path,
                threads: int = 1, emulate: str | None = None) -> None:
    """Replay a candidate's decoder layers through torch (module notes) and write
    ``layer_{i}_replayed`` ``[S, H]`` as a dump; the manifest's ``skipped`` says, per layer not
    replayed, why.

    A candidate dump that is not ``ok`` (unavailable, crashed) gives a replay of the same
    status: nothing to replay.

    Args:
        model: the checkpoint directory the candidate ran (its own conversion of it).
        prompt: the case's prompt JSON.
        candidate_dir: the candidate's dump of the case.
        output_dir: the replay dump, written atomically.
        threads: torch intra-op threads.
        emulate: a weight type to replay as ggml's CPU backend computes with it
            (:func:`audioparity.storage.emulating`; a quantized cell's replay), or None.

    Raises:
        AudioparityError: an unreadable checkpoint, prompt or candidate dump.
    """
    import torch

    model, candidate_dir = Path(model), Path(candidate_dir)
    config = load_config(model)
    request = text_processor.load_prompt(prompt)
    candidate = Dump(candidate_dir)
    with replay_writer(output_dir, candidate, producer="torch", model=model,
                       inputs={"prompt": prompt}, family="moss_voicegen", threads=threads,
                       emulate=emulate, versions=("torch", "transformers")) as writer:
        if nothing_to_replay(writer, candidate):
            return
        with torch_threads(threads), ExitStack() as stack, torch.inference_mode():
            net = load_emulated(writer, stack, lambda: load_model(model, config), emulate)
            with writer.timed("prefill"):
                rows = reference_prompt(model, config, request).rows
                inputs, skipped, notes = layer_inputs(
                    candidate, config.n_layers, (len(rows), config.hidden_size))
                full, _ = forward(net, torch.from_numpy(rows)[None], layer_inputs=inputs)
        for layer, array in enumerate(full.layers):
            if f"layer_{layer}_replayed" not in skipped:
                writer.add_tensor(f"layer_{layer}_replayed", array, "[S, H]")
        for note in notes:
            writer.note(note)
        record_skipped(writer, skipped)
        log.info("replay moss-voicegen: %s: %d layers replayed, %d not", candidate_dir,
                 config.n_layers - len(skipped), len(skipped))
