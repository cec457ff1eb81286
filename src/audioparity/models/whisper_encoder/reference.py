"""The PyTorch reference dump of a Whisper encoder (producer ``torch``): transformers'
``WhisperFeatureExtractor`` and ``WhisperEncoder`` run on CPU, float32, eager attention, batch
size 1, eval mode; every tensor is what they computed in one run, taken by forward hooks on the
encoder's own modules.

Dump (canonical layouts, batch dropped, float32, time-major):

- ``mel_features`` ``[T, n_mels]``: ``WhisperFeatureExtractor.from_pretrained(model)(samples)``
  (with torch installed it runs ``_torch_extract_fbank_features``), transposed from its
  ``[n_mels, T]``; ``T = nb_max_frames`` (3000 for 30 s);
- ``conv_out`` ``[T', D]``: ``nn.functional.gelu`` of ``conv2``'s output (a forward hook, the
  same call ``WhisperEncoder.forward`` makes), transposed; checked to give, plus
  ``embed_positions``, exactly the input of layer 0 (a forward pre-hook);
- ``layer_{i}`` ``[T', D]``: the output of ``layers[i]`` (forward hooks);
- ``enc_out`` ``[T', D]``: ``last_hidden_state``, after the final ``layer_norm``.

The model is ``WhisperModel.from_pretrained(model).encoder``: a
``WhisperForConditionalGeneration`` checkpoint (keys ``model.*``) and a ``WhisperModel`` one
load alike. Importing this module imports neither torch nor ggml.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import DumpWriter
from audioparity.audio import Audio, load_audio
from audioparity.errors import AudioparityError
from audioparity.models.whisper_encoder.checkpoint import check_weights
from audioparity.models.whisper_encoder.config import WhisperEncoderConfig, load_config
from audioparity.models.whisper_encoder.frontend import trim_note
from audioparity.storage import emulations
from audioparity.threads import torch_threads

log = logging.getLogger("audioparity")


def load_model(model_dir: Path) -> tuple[Any, Any]:
    """``(WhisperFeatureExtractor, WhisperEncoder)`` of the checkpoint: the extractor from
    ``preprocessor_config.json``, the encoder of ``WhisperModel.from_pretrained`` in float32,
    eager attention, eval mode.

    Raises:
        AudioparityError: transformers cannot load the checkpoint, or it lacks encoder weights.
    """
    import torch
    from transformers import WhisperFeatureExtractor, WhisperModel

    try:
        extractor = WhisperFeatureExtractor.from_pretrained(str(model_dir))
        net, info = WhisperModel.from_pretrained(str(model_dir), dtype=torch.float32,
                                                 attn_implementation="eager",
                                                 output_loading_info=True)
    except (OSError, ValueError, KeyError) as err:
        raise AudioparityError(f"{model_dir}: transformers cannot load the model ({err})") from err
    missing = [key for key in info.get("missing_keys", ()) if key.startswith("encoder.")]
    if missing:
        raise AudioparityError(f"{model_dir}: transformers found no weights for {missing[:3]}")
    return extractor, net.encoder.eval()


def mel_features(extractor: Any, sound: Audio) -> np.ndarray:
    """``extractor(samples)["input_features"]`` of one utterance: ``[n_mels, T]`` float32."""
    features = extractor(sound.samples, sampling_rate=sound.sample_rate, return_tensors="np")
    return np.asarray(features["input_features"][0], dtype=np.float32)


def encoder(net: Any, features: np.ndarray) -> dict[str, np.ndarray]:
    """``WhisperEncoder.forward`` on ``features`` ``[n_mels, T]``, with taps on its modules.

    Hooks: ``conv2``'s output (``conv_out`` is its ``nn.functional.gelu``), the input of
    ``layers[0]`` (checked: exactly ``conv_out + embed_positions``), every ``layers[i]``'s
    output; ``enc_out`` is ``last_hidden_state``.

    Returns:
        ``conv_out``, ``layer_{i}``, ``enc_out``, each ``[T', D]`` float32.

    Raises:
        AudioparityError: a hook did not fire exactly once, or layer 0's input is not
            ``conv_out + embed_positions`` (the encoder does something this dump does not
            describe).
    """
    import torch

    taps: dict[str, list[Any]] = {}

    def keep(name: str, value: Any) -> None:
        taps.setdefault(name, []).append(value[0] if isinstance(value, tuple) else value)

    handles = [
        net.conv2.register_forward_hook(lambda m, a, out: keep("conv2", out)),
        net.layers[0].register_forward_pre_hook(lambda m, args: keep("layer_0_input", args[0])),
    ]
    for index, layer in enumerate(net.layers):
        handles.append(layer.register_forward_hook(
            lambda m, a, out, n=index: keep(f"layer_{n}", out)))
    try:
        with torch.inference_mode():
            result = net(torch.from_numpy(features).unsqueeze(0))
            for name in ("conv2", "layer_0_input", *(f"layer_{i}" for i in range(len(net.layers)))):
                if len(taps.get(name, ())) != 1:
                    raise AudioparityError(f"encoder tap {name!r}: fired "
                                           f"{len(taps.get(name, ()))} times; expected once")
            conv_out = torch.nn.functional.gelu(taps.pop("conv2")[0]).permute(0, 2, 1)
            positions = net.embed_positions.weight[: conv_out.shape[1]]
            if not torch.equal(conv_out + positions, taps.pop("layer_0_input")[0]):
                raise AudioparityError("encoder: the input of layers[0] is not gelu(conv2(...)) "
                                       "+ embed_positions")
    finally:
        for handle in handles:
            handle.remove()
    out = {"conv_out": conv_out[0].numpy()}
    for index in range(len(net.layers)):
        out[f"layer_{index}"] = taps[f"layer_{index}"][0][0].numpy()
    out["enc_out"] = result.last_hidden_state[0].numpy()
    return out


def dump_reference(model: Path, cases: Sequence[tuple[Path, Path]], threads: int = 1,
                   emulate: Sequence[str] = ()) -> None:
    """Write one reference dump (contents in the module docstring) per ``(audio, output_dir)``
    pair of ``cases``, importing torch and transformers and loading the model once for all.

    Before torch is imported, every input goes through the checks of the ggml dump, in its
    order and with its messages: the config (:func:`~.config.load_config`), each audio file
    (:func:`~audioparity.audio.load_audio` at the extractor's ``sampling_rate``) and the
    checkpoint's encoder tensors (:func:`~.checkpoint.check_weights`: present, shaped as the
    config says, finite).

    Manifest fields: ``family``, ``threads``, ``cases_per_load`` (how many dumps shared the
    import and load whose ``seconds`` it records), ``n_layers``, ``audio`` (the file's format,
    :class:`~audioparity.audio.Audio`), versions of torch and transformers.

    Args:
        model: checkpoint directory (``config.json``, ``model.safetensors``,
            ``preprocessor_config.json``).
        cases: ``(audio file, dump directory)`` pairs; each directory is written atomically.
        threads: torch intra-op threads (the previous count is restored afterwards).
        emulate: weight types to dump each case again for, as ggml's CPU backend computes with
            them (:func:`audioparity.storage.emulations`), to ``<output_dir>@<type>``.

    Raises:
        AudioparityError: no cases; an unreadable or unsupported config, audio or checkpoint;
            transformers cannot load it. The failing case's directory is not left behind; an
            input error leaves none at all.
    """
    model = Path(model)
    cases = [(Path(audio), Path(output_dir)) for audio, output_dir in cases]
    if not cases:
        raise AudioparityError("reference whisper-encoder: no audio file given")
    config = load_config(model)
    rate = config.feature_extractor.sampling_rate
    sounds = [load_audio(audio, sample_rate=rate) for audio, _ in cases]
    check_weights(model, config)

    with torch_threads(threads):
        start = time.perf_counter()
        import transformers  # noqa: F401  (the one transformers import of this job)

        imported = time.perf_counter()
        extractor, net = load_model(model)
        seconds = {"import": round(imported - start, 4),
                   "load": round(time.perf_counter() - imported, 4)}
        log.info("reference whisper-encoder: imported transformers in %.1f s, loaded %s in "
                 "%.1f s, for %d case(s)", seconds["import"], model, seconds["load"], len(cases))
        # the port keeps the positions in float32 (weights.MATMUL)
        for variant in emulations(net, emulate, keep={"embed_positions"}):
            for (audio, output_dir), sound in zip(cases, sounds, strict=True):
                _dump(extractor, variant.model, model, audio, sound, config,
                      variant.dump_dir(output_dir),
                      {"threads": threads, "cases_per_load": len(cases), **variant.fields},
                      seconds)


def _dump(extractor: Any, net: Any, model: Path, audio: Path, sound: Audio,
          config: WhisperEncoderConfig, output_dir: Path, fields: dict[str, int],
          seconds: dict[str, float]) -> None:
    start = time.perf_counter()
    with DumpWriter(output_dir, producer="torch", model=model, inputs={"audio": audio},
                    fields={"family": "whisper_encoder", **fields, "n_layers": config.n_layers,
                            "audio": sound.source},
                    versions=("torch", "transformers")) as writer:
        for note in sound.notes:
            writer.note(note)
        note = trim_note(len(sound.samples), config.feature_extractor)
        if note:
            writer.note(note)
        writer.manifest["seconds"].update(seconds)
        with writer.timed("mel"):
            features = mel_features(extractor, sound)
        writer.add_tensor("mel_features", features.T, "[T, n_mels]")
        with writer.timed("encoder"):
            taps = encoder(net, features)
        writer.add_tensor("conv_out", taps.pop("conv_out"), "[T, D]")
        for name, array in taps.items():
            writer.add_tensor(name, array, "[T, D]")
        writer.note("conv_out: gelu of conv2's output (hook); plus embed_positions it equals "
                    "the input of layers[0] exactly (checked)")
        log.info("reference whisper-encoder: %s (%.2f s of audio): mel %s, encoder %d layers, "
                 "T'=%d in %.2f s", audio, sound.seconds, list(features.shape), config.n_layers,
                 taps["enc_out"].shape[0],
                 writer.manifest["seconds"]["mel"] + writer.manifest["seconds"]["encoder"])
    log.info("reference whisper-encoder: wrote %s in %.1f s", output_dir,
             time.perf_counter() - start)
