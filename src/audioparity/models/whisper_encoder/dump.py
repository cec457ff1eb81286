"""The ggml side of a Whisper encoder comparison: one dump directory per (model, audio, backend,
weight type), in the artifact contract's names.

Stages, each timed into the manifest (``seconds``):

- ``load``: the config, and the encoder's weights read once, stored in their storage types
  (:mod:`.weights`) and uploaded once;
- ``mel``: :func:`.frontend.mel_features` -> ``mel_features [T, n_mels]``;
- ``encoder``: the end-to-end encoder on that mel, one graph -> ``conv_out``, ``layer_{i}``,
  ``enc_out`` (``[T', D]`` each);
- ``layers_isolated``: every layer alone on the reference's input of that layer (reference
  ``conv_out`` plus ``embed_positions`` for layer 0, reference ``layer_{i-1}`` after) ->
  ``layer_{i}_isolated``.

Manifest fields: ``family`` (``whisper_encoder``), ``backend``, ``device``, ``weight_type``,
``threads``, ``n_layers``, ``audio`` (the file's format), ``ggml_build`` and
``device_description``; notes record the storage types and any storage fallback. A backend that
is not built into this ggml writes a manifest with status ``unavailable`` and no tensors, and
returns normally (exit code 0).
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np

from audioparity.artifacts import Dump, DumpWriter
from audioparity.audio import load_audio
from audioparity.errors import AudioparityError
from audioparity.ggml import Runtime, open_runtime
from audioparity.models.whisper_encoder.config import WhisperEncoderConfig, load_config
from audioparity.models.whisper_encoder.encoder import Encoder
from audioparity.models.whisper_encoder.frontend import mel_features, trim_note
from audioparity.models.whisper_encoder.weights import load_weights

log = logging.getLogger("audioparity")


def reference_inputs(reference: Dump, n_layers: int) -> list[np.ndarray]:
    """The reference's inputs of the isolated layers: ``[conv_out, layer_0, ...,
    layer_{N-2}]``.

    Raises:
        AudioparityError: the reference dump is not ``ok`` or lacks one of them.
    """
    if reference.status != "ok":
        raise AudioparityError(f"{reference.path}: reference dump has status {reference.status!r}")
    names = ["conv_out"] + [f"layer_{i}" for i in range(n_layers - 1)]
    missing = [name for name in names if not reference.has(name)]
    if missing:
        raise AudioparityError(f"{reference.path}: reference dump lacks {', '.join(missing)}")
    return [reference.tensor(name) for name in names]


def dump_ggml(model: Path, audio: Path, output_dir: Path, *, reference_dir: Path,
              weight_type: str, backend: str, device: int = 0, threads: int = 1,
              weights_file: Path | None = None) -> None:
    """Dump the ggml port's activations for one audio file into ``output_dir`` (module doc).

    Args:
        model: Hugging Face Whisper checkpoint directory.
        audio: audio file, read by :func:`audioparity.audio.load_audio` at the extractor's
            ``sampling_rate`` (then trimmed or padded to its ``n_samples``).
        output_dir: the dump directory (written atomically).
        reference_dir: the reference dump of the same model and audio.
        weight_type: ``native|f32|f16|bf16|q8_0`` for the matmul weights.
        backend: ``cpu|cuda|vulkan``; device: its device index.
        threads: CPU threads.
        weights_file: the encoder's weights converted once (:func:`~.weights.save_weights` at
            the same type), mapped instead of read from the checkpoint.

    Raises:
        AudioparityError: unreadable or unsupported config, audio or reference dump, a
            reference dump lacking a stage, or a checkpoint whose encoder tensors are missing,
            misshapen or not finite (:func:`~.checkpoint.check_weights`). Config and audio are
            checked first, in the reference dump's order and with its messages. Nothing is left
            at ``output_dir`` then.
    """
    model, audio = Path(model), Path(audio)
    reference_dir, output_dir = Path(reference_dir), Path(output_dir)
    start = time.perf_counter()
    label = f"ggml whisper-encoder [{model.name} | {audio.stem} | {backend} {weight_type}]"
    config = load_config(model)
    sound = load_audio(audio, sample_rate=config.feature_extractor.sampling_rate)
    reference = Dump(reference_dir)
    fields = {"family": "whisper_encoder", "backend": backend, "device": device,
              "weight_type": weight_type, "threads": threads, "n_layers": config.n_layers,
              "audio": sound.source}
    with DumpWriter(output_dir, producer="ggml", model=model,
                    inputs={"audio": audio, "reference": reference_dir}, fields=fields,
                    versions=("ggml-python",), weights=weights_file) as writer:
        for note in [*sound.notes, trim_note(len(sound.samples), config.feature_extractor)]:
            if note:
                writer.note(note)
        runtime = open_runtime(writer, backend, device, threads)
        if runtime is None:
            return
        with runtime:
            _dump_stages(writer, runtime, reference, model, sound.samples, config, label,
                         weight_type, weights_file)
    log.info("%s: wrote %s in %.1f s", label, output_dir, time.perf_counter() - start)


def _dump_stages(writer: DumpWriter, runtime: Runtime, reference: Dump, model: Path,
                 samples: np.ndarray, config: WhisperEncoderConfig, label: str,
                 weight_type: str, weights_file: Path | None) -> None:
    """Every stage of the module docstring, into ``writer``; ``samples`` ``[L]`` float32 at the
    extractor's rate."""
    seconds = writer.manifest["seconds"]
    n_layers = config.n_layers
    inputs = reference_inputs(reference, n_layers)

    with writer.timed("load"):
        host = load_weights(model, config, weight_type)
        weights = host.upload(runtime, weights_file)
    for note in host.notes:
        writer.note(note)
    writer.note("storage: " + ", ".join(f"{count} x {kind}" for kind, count in
                                       sorted(Counter(host.storage.values()).items()))
                + f" (checkpoint dtypes: {', '.join(sorted(set(host.native.values())))})")
    log.info("%s: loaded weights (%.1f MiB on %s) in %.2f s", label, weights.nbytes / 2**20,
             runtime.backend_name, seconds["load"])

    with writer.timed("mel"):
        mel = mel_features(samples, config.feature_extractor)
    writer.add_tensor("mel_features", mel, "[T, n_mels]")

    encoder = Encoder(weights, config, runtime)
    with writer.timed("encoder"):
        taps = encoder.forward(mel)
    writer.add_tensor("conv_out", taps["conv_out"], "[T, D]")
    for i in range(n_layers):
        writer.add_tensor(f"layer_{i}", taps[f"layer_{i}"], "[T, D]")
    writer.add_tensor("enc_out", taps["enc_out"], "[T, D]")

    with writer.timed("layers_isolated"):
        isolated = encoder.layers_isolated(inputs)
    for i, output in enumerate(isolated):
        writer.add_tensor(f"layer_{i}_isolated", output, "[T, D]")
    log.info("%s: mel %s in %.2f s, encoder (%d layers, T'=%d) in %.2f s, isolated layers in "
             "%.2f s", label, list(mel.shape), seconds["mel"], n_layers,
             taps["enc_out"].shape[0], seconds["encoder"], seconds["layers_isolated"])
