"""Reference-side replay of a Parakeet-TDT candidate: NeMo runs each block on the candidate's own
input to it, so a port that cannot be fed the reference's activations (a third-party binary) is
still localised block by block (docs/candidates.md, "Replay").

In one NeMo encoder run on the case's audio, forward hooks substitute the candidate's tensors:
its ``mel_features`` for the preprocessor's output, its ``pre_encode`` for ``pre_encode``'s
output (so ``layer_0`` runs on it, after NeMo's own ``pos_enc``), its ``layer_{i-1}`` for
``layers[i]``'s input. What each block computes on the substituted input is its replayed form:
``pre_encode_replayed``, ``layer_{i}_replayed``. NeMo's greedy TDT decoding of the candidate's
``enc_out`` is ``decode_replayed``. The compare then measures the candidate's stage against its
replayed form: the error of that block alone.
"""

from __future__ import annotations

import logging
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import Dump
from audioparity.audio import load_audio
from audioparity.models.parakeet_tdt.config import load_config
from audioparity.models.parakeet_tdt.reference import (
    greedy_tdt_decoding,
    preprocessor,
    restore_model,
)
from audioparity.replay import load_emulated, nothing_to_replay, record_skipped, replay_writer
from audioparity.threads import torch_threads

log = logging.getLogger("audioparity")


def _given(candidate: Dump, name: str, shape: tuple[int, ...], skipped: dict[str, str],
           replayed: str) -> np.ndarray | None:
    """The candidate's tensor ``name`` when it has it with ``shape``; else None, and the reason
    ``replayed`` cannot be replayed in ``skipped``."""
    if not candidate.has(name):
        skipped[replayed] = f"the candidate dump has no {name}"
        return None
    array = candidate.tensor(name)
    if array.shape != shape:
        skipped[replayed] = (f"the candidate's {name} is {list(array.shape)}, NeMo's input "
                             f"there is {list(shape)}")
        return None
    return array


def replayed_encoder(model: Any, features: Any, length: Any, candidate: Dump
                     ) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """NeMo ``model.encoder`` (``ConformerEncoder``) with each block fed the candidate's input
    (module notes).

    Args:
        features, length: the preprocessor's output on the case (``[1, n_mels, T_padded]``,
            ``[1]``).
        candidate: the candidate's dump (``mel_features [T, n_mels]``, ``pre_encode [T', D]``,
            ``layer_{i} [T', D]``; each one it lacks skips the block fed by it).

    Returns:
        ``(replayed, skipped)``: ``pre_encode_replayed`` and ``layer_{i}_replayed`` ``[T', D]``
        (valid frames); for each block not replayed, why.
    """
    import torch

    enc = model.encoder
    replayed: dict[str, np.ndarray] = {}
    skipped: dict[str, str] = {}
    n_frames = int(length[0])
    mel = _given(candidate, "mel_features", (n_frames, features.shape[1]), skipped,
                 "pre_encode_replayed")
    features = features.clone()
    if mel is not None:
        features[0, :, :n_frames] = torch.from_numpy(mel.T.copy())
    frames: list[int] = []

    def on_pre_encode(module: Any, inputs: Any, output: Any) -> Any:
        x, lengths = output
        frames.append(int(lengths[0]))
        if mel is not None:
            replayed["pre_encode_replayed"] = x[0, : frames[0]].float().numpy().copy()
        given = _given(candidate, "pre_encode", (frames[0], x.shape[2]), skipped,
                       "layer_0_replayed")
        if given is None:
            return None
        x = x.clone()
        x[0, : frames[0]] = torch.from_numpy(given)
        return x, lengths

    def before_layer(index: int) -> Any:
        def hook(module: Any, args: Any, kwargs: dict) -> Any:
            if index == 0:
                return None
            x = kwargs["x"]
            given = _given(candidate, f"layer_{index - 1}", (frames[0], x.shape[2]), skipped,
                           f"layer_{index}_replayed")
            if given is None:
                return None
            x = x.clone()
            x[0, : frames[0]] = torch.from_numpy(given)
            return args, {**kwargs, "x": x}
        return hook

    def after_layer(index: int) -> Any:
        def hook(module: Any, inputs: Any, output: Any) -> None:
            name = f"layer_{index}_replayed"
            if name not in skipped:
                replayed[name] = output[0, : frames[0]].float().numpy().copy()
        return hook

    handles = [enc.pre_encode.register_forward_hook(on_pre_encode)]
    for index, layer in enumerate(enc.layers):
        handles.append(layer.register_forward_pre_hook(before_layer(index), with_kwargs=True))
        handles.append(layer.register_forward_hook(after_layer(index)))
    try:
        with torch.inference_mode():
            enc(audio_signal=features, length=length)
    finally:
        for handle in handles:
            handle.remove()
    return replayed, skipped


def dump_replay(model: Path, audio: Path, candidate_dir: Path, output_dir: Path,
                threads: int = 1, emulate: str | None = None) -> None:
    """Replay a candidate's blocks through NeMo (module notes) and write the replayed forms as a
    dump: ``pre_encode_replayed [T', D]``, ``layer_{i}_replayed [T', D]``, ``decode_replayed``
    (``{ids, frames, durations, text}``, with its ``decode_replayed_margins``); the manifest's
    ``skipped`` says, per replayed form not written, why (the candidate lacks its input, or has
    it in another shape).

    A candidate dump that is not ``ok`` (unavailable, crashed) gives a replay of the same
    status: nothing to replay.

    Args:
        model: the ``.nemo`` file the candidate ran (its own conversion of it).
        audio: the case's audio file.
        candidate_dir: the candidate's dump of the case.
        output_dir: the replay dump, written atomically.
        threads: torch intra-op threads.
        emulate: a weight type to replay as ggml's CPU backend computes with it
            (:func:`audioparity.storage.emulating`; a quantized cell's replay), or None.

    Raises:
        AudioparityError: an unreadable model, audio file or candidate dump.
    """
    model, candidate_dir = Path(model), Path(candidate_dir)
    config = load_config(model)
    sound = load_audio(audio, sample_rate=config.preprocessor.sample_rate,
                       min_samples=config.min_samples, purpose="one encoder frame")
    candidate = Dump(candidate_dir)
    with replay_writer(output_dir, candidate, producer="nemo", model=model,
                       inputs={"audio": audio}, family="parakeet_tdt", threads=threads,
                       emulate=emulate, versions=("torch", "nemo_toolkit")) as writer:
        if nothing_to_replay(writer, candidate):
            return
        with torch_threads(threads), ExitStack() as stack:
            asr_model = load_emulated(writer, stack, lambda: restore_model(model), emulate)
            with writer.timed("encoder"):
                features, length = preprocessor(asr_model, sound.samples)
                replayed, skipped = replayed_encoder(asr_model, features, length, candidate)
            for name, array in replayed.items():
                writer.add_tensor(name, array, "[T, D]")
            if not config.transducer:
                skipped["decode_replayed"] = "a CTC model: no transducer decode to replay"
            elif candidate.has("enc_out"):
                with writer.timed("decoding"):
                    decode, *_, margins = greedy_tdt_decoding(asr_model,
                                                              candidate.tensor("enc_out"))
                writer.add_json("decode_replayed", decode)
                writer.add_tensor("decode_replayed_margins", margins, "[positions]")
            else:
                skipped["decode_replayed"] = "the candidate dump has no enc_out"
        record_skipped(writer, skipped)
        log.info("replay parakeet-tdt: %s: %d blocks replayed, %d not", candidate_dir,
                 len(replayed) + ("decode_replayed" not in skipped), len(skipped))
