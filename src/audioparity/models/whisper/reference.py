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
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from audioparity.audio import Audio
from audioparity.errors import AudioparityError
from audioparity.family import Case, Note, Outputs, Phase

log = logging.getLogger("audioparity")


class Loaded(NamedTuple):
    """The reference's ``WhisperFeatureExtractor`` and ``WhisperEncoder``."""

    extractor: Any
    encoder: Any


def load_model(model_dir: Path) -> Loaded:
    """The ``WhisperFeatureExtractor`` and ``WhisperEncoder`` of the checkpoint: the extractor from
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
    return Loaded(extractor, net.encoder.eval())


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


def stages(loaded: Loaded, case: Case) -> Outputs:
    """The reference's stages of one case (module docstring), each phase timed by the driver."""
    yield Phase("mel")
    features = mel_features(loaded.extractor, case.data)
    yield "mel_features", features.T
    yield Phase("encoder")
    taps = encoder(loaded.encoder, features)
    yield from taps.items()
    yield Note("conv_out: gelu of conv2's output (hook); plus embed_positions it equals the "
               "input of layers[0] exactly (checked)")
    log.info("reference whisper: %s (%.2f s of audio): mel %s, encoder %d layers, "
             "T'=%d", case.path, case.data.seconds, list(features.shape),
             case.config.n_layers, taps["enc_out"].shape[0])
