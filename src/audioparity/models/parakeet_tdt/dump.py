"""The ggml side of a Parakeet-TDT comparison: one dump directory per (model, audio, backend,
weight type), in the artifact contract's names.

Stages, each timed into the manifest (``seconds``) and logged once:

- ``load``: config, weights (read once, stored in the requested types, uploaded once), tokenizer;
- ``mel``: :func:`frontend.mel_features` -> ``mel_features [T, n_mels]``;
- ``encoder``: the end-to-end encoder on that mel -> ``pre_encode``, ``pos_emb``, ``layer_{i}``,
  ``enc_out``;
- ``layers_isolated``: every layer alone on the reference's input of that layer (reference
  ``pre_encode`` for layer 0, reference ``layer_{i-1}`` after, reference ``pos_emb``) ->
  ``layer_{i}_isolated``;
- ``joint_logits``: the ggml joint along the reference greedy path (reference ``enc_out`` and
  token history, rows as in the reference's ``joint_logits``) -> ``joint_logits``,
  ``lstm_state_0``;
- ``decoder_replay``: the ggml greedy decoder run free on the reference ``enc_out`` ->
  ``decoder_replay.json``;
- ``decode``: the ggml greedy decoder on the ggml ``enc_out`` -> ``decode.json``;
- a CTC model's (and the hybrid's) ``ctc_decoder_replay`` and ``ctc_decode``: the ggml CTC
  decoder and greedy CTC on the reference ``enc_out`` -> ``ctc_logits_isolated``,
  ``ctc_decoder_replay.json``, and on the ggml ``enc_out`` -> ``ctc_logits``, ``ctc_decode.json``.

The transducer's stages (``joint_logits`` to ``decode``) exist for a TDT or RNNT model only.

A backend that is not built into this ggml writes a manifest with status ``unavailable`` and no
tensors, and returns normally (exit code 0).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import numpy as np

from audioparity.artifacts import Dump, DumpWriter
from audioparity.audio import load_audio
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, open_runtime
from audioparity.models.parakeet_tdt.config import load_config
from audioparity.models.parakeet_tdt.ctc import CtcDecoder
from audioparity.models.parakeet_tdt.decoder import TdtDecoder
from audioparity.models.parakeet_tdt.encoder import Encoder
from audioparity.models.parakeet_tdt.frontend import mel_features
from audioparity.models.parakeet_tdt.greedy import STRATEGY, replay_path
from audioparity.models.parakeet_tdt.tokenizer import (
    ctc_document,
    decode_document,
    load_tokenizer,
)
from audioparity.models.parakeet_tdt.weights import load_weights

log = logging.getLogger("audioparity")

FB = "preprocessor.featurizer.fb"
WINDOW = "preprocessor.featurizer.window"


def _reference_inputs(reference: Dump, config) -> None:
    """Check that the reference dump holds what the teacher-forced stages read.

    Raises:
        AudioparityError: the reference is not ``ok`` or lacks a tensor or ``decode.json``.
    """
    if reference.status != "ok":
        raise AudioparityError(f"{reference.path}: reference dump has status {reference.status!r}")
    n_layers = config.encoder.n_layers
    needed = ["pre_encode", "pos_emb", "enc_out", *(f"layer_{i}" for i in range(n_layers))]
    needed += ["joint_logits", "decode"] if config.transducer else []
    needed += ["ctc_logits", "ctc_decode"] if config.ctc is not None else []
    missing = [name for name in needed if not reference.has(name)]
    if missing:
        raise AudioparityError(f"{reference.path}: reference dump lacks {', '.join(missing)}")


def dump_ggml(
    model: Path,
    audio: Path,
    output_dir: Path,
    *,
    reference_dir: Path,
    weight_type: str,
    backend: str,
    device: int = 0,
    threads: int = 1,
    conv_weight_type: str = "f32",
    flash_attention: int = 0,
    weights_file: Path | None = None,
) -> None:
    """Dump the ggml port's activations for one audio file into ``output_dir`` (module doc).

    Args:
        model: ``.nemo`` file or Hugging Face Parakeet directory.
        audio: audio file, read by :func:`audioparity.audio.load_audio` at 16 kHz.
        output_dir: the dump directory (written atomically).
        reference_dir: the NeMo reference dump of the same model and audio.
        weight_type: ``native|f32|f16|bf16|q8_0`` for linear/LSTM/joint/embedding weights.
        backend: ``cpu|cuda|vulkan``; device: its device index.
        threads: CPU threads.
        conv_weight_type: ``f32|f16`` for the subsampling and depthwise conv kernels.
        flash_attention: 1: attention through ``ggml_flash_attn_ext``.
        weights_file: the model's weights converted once (:func:`~.weights.save_weights` at
            the same types), mapped instead of read from the model.

    Raises:
        AudioparityError: unreadable model, audio (see :func:`~audioparity.audio.load_audio`;
            fewer samples than one encoder frame needs) or reference dump, a reference dump
            lacking a stage, a checkpoint whose tensors are missing, misshapen or not finite
            (:func:`~.weights.check_weights`), or a reference path that its own
            ``joint_logits`` do not reproduce. Checked in that order, so the reference dump
            refuses the same bad model or audio with the same message. Nothing is left at
            ``output_dir`` then.
    """
    model, audio = Path(model), Path(audio)
    reference_dir, output_dir = Path(reference_dir), Path(output_dir)
    start = time.perf_counter()
    label = f"ggml parakeet-tdt [{model.name} | {audio.stem} | {backend} {weight_type}]"
    config = load_config(model)
    sound = load_audio(audio, sample_rate=config.preprocessor.sample_rate,
                       min_samples=config.min_samples, purpose="one encoder frame")
    reference = Dump(reference_dir)
    n_layers = config.encoder.n_layers
    fields = {
        "family": "parakeet_tdt", "backend": backend, "device": device,
        "weight_type": weight_type, "conv_weight_type": conv_weight_type,
        "threads": threads, "flash_attention": bool(flash_attention), "n_layers": n_layers,
        "decoding": {"strategy": STRATEGY, "durations": list(config.durations),
                     "max_symbols": config.max_symbols},
        "audio": sound.source,
    }
    with DumpWriter(output_dir, producer="ggml", model=model,
                    inputs={"audio": audio, "reference": reference_dir}, fields=fields,
                    versions=("ggml-python",), weights=weights_file) as writer:
        for note in sound.notes:
            writer.note(note)
        runtime = open_runtime(writer, backend, device, threads)
        if runtime is None:
            return
        with runtime:
            _dump_stages(writer, runtime, reference, model, sound.samples, config, label,
                         weight_type, conv_weight_type, bool(flash_attention), weights_file)
    log.info("%s: wrote %s in %.1f s", label, output_dir, time.perf_counter() - start)


def _dump_stages(writer: DumpWriter, runtime: Runtime, reference: Dump, model: Path,
                 samples: np.ndarray, config, label: str, weight_type: str,
                 conv_weight_type: str, flash_attention: bool,
                 weights_file: Path | None) -> None:
    """Every stage of the module docstring, into ``writer``; ``samples`` ``[L]`` float32 at the
    model's rate."""
    seconds = writer.manifest["seconds"]
    n_layers = config.encoder.n_layers
    _reference_inputs(reference, config)

    with writer.timed("load"):
        host = load_weights(model, config, weight_type, conv_weight_type)
        weights = host.upload(runtime, weights_file)
        tokenizer = load_tokenizer(model)
    for note in host.notes:
        writer.note(note)
    writer.note("mel filterbank and window: "
                + ("the checkpoint's" if FB in host.preprocessor else "built (librosa, hann)"))
    log.info("%s: loaded weights (%.1f MiB on %s) in %.2f s", label, weights.nbytes / 2**20,
             runtime.backend_name, seconds["load"])

    with writer.timed("mel"):
        mel = mel_features(samples, config.preprocessor,
                           filterbank=host.preprocessor.get(FB),
                           window=host.preprocessor.get(WINDOW))
    writer.add_tensor("mel_features", mel, "[T, n_mels]")
    log.info("%s: mel %d frames in %.2f s", label, mel.shape[0], seconds["mel"])

    encoder = Encoder(weights, config, runtime, flash_attention=flash_attention)
    with writer.timed("encoder"):
        taps = encoder.forward(mel)
    writer.add_tensor("pre_encode", taps["pre_encode"], "[T, D]")
    writer.add_tensor("pos_emb", taps["pos_emb"], "[2T-1, D]")
    for i in range(n_layers):
        writer.add_tensor(f"layer_{i}", taps[f"layer_{i}"], "[T, D]")
    writer.add_tensor("enc_out", taps["enc_out"], "[T, D]")
    position_note = config.encoder.position_table_note(taps["enc_out"].shape[0])
    if position_note:
        writer.note(position_note)
        log.info("%s: %s", label, position_note)
    log.info("%s: encoder (%d layers, T'=%d) in %.2f s", label, n_layers,
             taps["enc_out"].shape[0], seconds["encoder"])

    with writer.timed("layers_isolated"):
        # layers_isolated scales pre_encode by xscale itself, as NeMo's pos_enc does
        inputs = [reference.tensor("pre_encode")] + [reference.tensor(f"layer_{i - 1}")
                                                     for i in range(1, n_layers)]
        isolated = encoder.layers_isolated(inputs, reference.tensor("pos_emb"))
    for i, output in enumerate(isolated):
        writer.add_tensor(f"layer_{i}_isolated", output, "[T, D]")
    log.info("%s: %d isolated layers in %.2f s", label, n_layers, seconds["layers_isolated"])

    if config.transducer:
        _dump_transducer(writer, runtime, weights, reference, config, taps["enc_out"],
                         tokenizer, label)
    if config.ctc is not None:
        _dump_ctc(writer, runtime, weights, reference, config, taps["enc_out"], tokenizer, label)


def _dump_transducer(writer: DumpWriter, runtime: Runtime, weights, reference: Dump, config,
                     enc_out: np.ndarray, tokenizer, label: str) -> None:
    """The transducer's stages: ``joint_logits`` and ``lstm_state_0`` along the reference path,
    ``decoder_replay`` (on the reference ``enc_out``) and ``decode`` (on ours)."""
    seconds = writer.manifest["seconds"]
    ref_enc_out = reference.tensor("enc_out")
    with TdtDecoder(runtime, weights, config) as decoder:
        with writer.timed("joint_logits"):
            path = _reference_path(reference, ref_enc_out.shape[0], config)
            joint_logits, lstm_state_0 = decoder.teacher_forced(ref_enc_out, path)
        writer.add_tensor("joint_logits", joint_logits, "[steps, V+1+n_durations]")
        writer.add_tensor("lstm_state_0", lstm_state_0, "[layers, 2, H]")
        log.info("%s: joint along the reference path (%d rows) in %.2f s", label,
                 joint_logits.shape[0], seconds["joint_logits"])

        with writer.timed("decoder_replay"):
            replay = decode_document(decoder.greedy(ref_enc_out), tokenizer)
        writer.add_json("decoder_replay", replay)
        with writer.timed("decode"):
            decode = decode_document(decoder.greedy(enc_out), tokenizer)
        writer.add_json("decode", decode)
    writer.note(f"decode and decoder_replay: greedy TDT ({STRATEGY} rules, batch 1) on the host "
                "around ggml prediction-network and joint graphs")
    log.info("%s: decoder_replay %d tokens in %.2f s, decode %d tokens in %.2f s", label,
             len(replay["ids"]), seconds["decoder_replay"], len(decode["ids"]), seconds["decode"])


def _dump_ctc(writer: DumpWriter, runtime: Runtime, weights, reference: Dump, config,
              enc_out: np.ndarray, tokenizer, label: str) -> None:
    """The CTC decoder's stages: ``ctc_logits`` and ``ctc_decode`` of our ``enc_out``, and
    their isolated forms on the reference's: ``ctc_logits_isolated``, ``ctc_decoder_replay``."""
    seconds = writer.manifest["seconds"]
    decoder = CtcDecoder(runtime, weights, config)
    with writer.timed("ctc_decoder_replay"):
        isolated, replay = decoder.greedy(reference.tensor("enc_out"))
    writer.add_tensor("ctc_logits_isolated", isolated, "[T, V+1]")
    writer.add_json("ctc_decoder_replay", ctc_document(replay, tokenizer))
    with writer.timed("ctc_decode"):
        log_probs, path = decoder.greedy(enc_out)
    writer.add_tensor("ctc_logits", log_probs, "[T, V+1]")
    writer.add_json("ctc_decode", ctc_document(path, tokenizer))
    writer.note("ctc_decode and ctc_decoder_replay: greedy CTC (argmax, repeats folded, blanks "
                "dropped) on the host of the ggml ConvASRDecoder's log-probabilities")
    log.info("%s: ctc_decoder_replay %d tokens in %.2f s, ctc_decode %d tokens in %.2f s", label,
             len(replay.ids), seconds["ctc_decoder_replay"], len(path.ids), seconds["ctc_decode"])


def _reference_path(reference: Dump, n_frames: int, config):
    """The reference's greedy path, read off its own ``joint_logits`` and checked against its
    ``decode.json``.

    Raises:
        AudioparityError: the rows do not reproduce the reference decode.
    """
    path = replay_path(reference.tensor("joint_logits"), n_frames, list(config.durations),
                           config.max_symbols)
    decode = reference.json("decode")
    if [path.ids, path.frames, path.durations] != [decode["ids"], decode["frames"],
                                                   decode["durations"]]:
        raise AudioparityError(
            f"{reference.path}: joint_logits replayed with durations {list(config.durations)} "
            f"and max_symbols {config.max_symbols} do not reproduce decode.json"
        )
    return path
