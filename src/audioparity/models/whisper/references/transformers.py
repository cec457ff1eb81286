"""The PyTorch reference dump of Whisper (producer ``torch``): transformers'
``WhisperFeatureExtractor``, ``WhisperForConditionalGeneration`` and ``WhisperTokenizer`` run on
CPU, float32, eager attention, batch size 1, eval mode; every tensor is what they computed, taken
by forward hooks on the model's own modules.

Dump (canonical layouts, batch dropped, float32):

- ``mel_features`` ``[T, n_mels]``: ``WhisperFeatureExtractor.from_pretrained(model)(samples)``
  (with torch installed it runs ``_torch_extract_fbank_features``), transposed from its
  ``[n_mels, T]``; ``T = nb_max_frames`` (3000 for 30 s);
- ``conv_out`` ``[T', D]``: ``nn.functional.gelu`` of ``conv2``'s output (a forward hook, the
  same call ``WhisperEncoder.forward`` makes), transposed; checked to give, plus
  ``embed_positions``, exactly the input of layer 0 (a forward pre-hook);
- ``layer_{i}`` ``[T', D]``: the output of ``encoder.layers[i]`` (forward hooks);
- ``enc_out`` ``[T', D]``: the encoder's ``last_hidden_state``, after the final ``layer_norm``;
- ``decode`` ``{ids, text}`` and ``decode_margins`` ``[len(ids)]``: the greedy decode of
  :mod:`.decoding` written out as a loop over ``model.decoder`` with its
  ``EncoderDecoderCache`` and ``proj_out``, one token a step (tests hold its ids to
  ``model.generate``'s); ``text`` is ``tokenizer.decode(ids, skip_special_tokens=True)``;
- ``decoder_layer_{i}`` ``[S, D]`` and ``decoder_logits`` ``[S, V]``: one forward of
  ``model.decoder`` (no cache) over the teacher-forced sequence, the prompt then the decoded
  ids (``S = len(prompt) + len(ids)``), hooks on ``decoder.layers[i]``, and ``proj_out`` of its
  ``last_hidden_state``: row ``j`` predicts token ``j + 1``.

Importing this module imports neither torch nor ggml.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, Fields, Note, Outputs, Phase, ReferenceLibrary
from audioparity.dumping.audio import Audio
from audioparity.models.whisper.decoding import Decode, greedy, prompt_ids
from audioparity.models.whisper.spec import Names
from audioparity.models.whisper.taps import decoder_stages, encoder_stages

log = logging.getLogger("audioparity")


class Loaded(NamedTuple):
    """The reference's ``WhisperFeatureExtractor``, ``WhisperForConditionalGeneration`` and
    ``WhisperTokenizer``."""

    extractor: Any
    model: Any
    tokenizer: Any


def load_model(model_dir: Path) -> Loaded:
    """The extractor (``preprocessor_config.json``), the model
    (``WhisperForConditionalGeneration.from_pretrained`` in float32, eager attention, eval mode;
    a ``WhisperModel`` checkpoint loads into it, ``proj_out`` tied) and the tokenizer of the
    checkpoint.

    Raises:
        AudioparityError: transformers cannot load the checkpoint or its tokenizer, or it lacks
            weights.
    """
    import torch
    from transformers import (
        AutoTokenizer,
        WhisperFeatureExtractor,
        WhisperForConditionalGeneration,
    )

    try:
        extractor = WhisperFeatureExtractor.from_pretrained(str(model_dir))
        net, info = WhisperForConditionalGeneration.from_pretrained(
            str(model_dir), dtype=torch.float32, attn_implementation="eager",
            output_loading_info=True)
        tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    except (OSError, ValueError, KeyError) as err:
        raise AudioparityError(f"{model_dir}: transformers cannot load the model ({err})") from err
    missing = [key for key in info.get("missing_keys", ()) if key != "proj_out.weight"]
    if missing:
        raise AudioparityError(f"{model_dir}: transformers found no weights for {missing[:3]}")
    return Loaded(extractor, net.eval(), tokenizer)


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

    return encoder_stages(
        net.conv2, net.layers, lambda n: net.embed_positions.weight[:n],
        lambda: net(torch.from_numpy(features).unsqueeze(0)).last_hidden_state)


def greedy_decoding(loaded: Loaded, config: Any, enc_out: np.ndarray, prompt: list[int]
                    ) -> Decode:
    """The greedy decode (:func:`~.decoding.greedy`) of ``enc_out`` ``[T', D]``: the prompt
    through ``model.decoder`` with a new ``EncoderDecoderCache``, then one token at a time with
    the cache it returned, each step's logits ``proj_out`` of its last row."""
    import torch

    model = loaded.model
    encoder_hidden = torch.from_numpy(np.ascontiguousarray(enc_out))[None]
    cache = None

    def forward(ids: list[int]) -> np.ndarray:
        nonlocal cache
        out = model.model.decoder(input_ids=torch.tensor([ids]),
                                  encoder_hidden_states=encoder_hidden, cache=cache,
                                  use_cache=True)
        cache = out.cache
        return model.proj_out(out.last_hidden_state)[0, -1].numpy()

    with torch.inference_mode():
        return greedy(config, prompt, forward)


def teacher_forced(loaded: Loaded, enc_out: np.ndarray, tokens: list[int]
                   ) -> dict[str, np.ndarray]:
    """``model.decoder`` over ``tokens`` ``[S]`` at once (no cache), with hooks on its layers.

    Returns:
        ``decoder_layer_{i}`` ``[S, D]`` and ``decoder_logits`` ``[S, V]`` (``proj_out`` of
        ``last_hidden_state``), float32.

    Raises:
        AudioparityError: a hook did not fire exactly once.
    """
    import torch

    model = loaded.model

    def run() -> Any:
        out = model.model.decoder(input_ids=torch.tensor([tokens]),
                                  encoder_hidden_states=torch.from_numpy(
                                      np.ascontiguousarray(enc_out))[None], use_cache=False)
        return model.proj_out(out.last_hidden_state)

    return decoder_stages(model.model.decoder.layers, run)


def stages(loaded: Loaded, case: Case) -> Outputs:
    """The reference's stages of one case (module docstring), each phase timed by the driver."""
    config = case.config
    yield Phase(Names.MEL_FEATURES)
    features = mel_features(loaded.extractor, case.data)
    yield Names.MEL_FEATURES, features.T
    yield Phase(Names.CONV_OUT)
    taps = encoder(loaded.model.model.encoder, features)
    yield from taps.items()
    yield Note("conv_out: gelu of conv2's output (hook); plus embed_positions it equals the "
               "input of layers[0] exactly (checked)")
    yield Phase(Names.DECODE)
    prompt = prompt_ids(config, case.options["language"], case.options["task"])
    decode = greedy_decoding(loaded, config, taps[Names.ENC_OUT], prompt)
    yield Names.DECODE, {"ids": decode.ids,
                     "text": loaded.tokenizer.decode(decode.ids, skip_special_tokens=True)}
    yield Names.DECODE_MARGINS, decode.margins
    yield Fields({"decoder_prompt": prompt, "decode_stopped": decode.stopped})
    yield Phase(Names.DECODER_LAYER.at(0))  # along its decode
    yield from teacher_forced(loaded, taps[Names.ENC_OUT], prompt + decode.ids).items()
    log.info("reference whisper: %s (%.2f s of audio): mel %s, encoder %d layers, T'=%d, "
             "%d tokens (%s)", case.path, case.data.seconds, list(features.shape),
             config.n_layers, taps[Names.ENC_OUT].shape[0], len(decode.ids), decode.stopped)


class Transformers(ReferenceLibrary):
    """transformers' ``WhisperForConditionalGeneration`` (:func:`load_model`): its stages
    (:func:`stages`) and its encoder layers on a candidate's inputs (:func:`~..replay.stages`)."""

    def __init__(self, model: Path, config: Any, options: Mapping[str, Any]) -> None:
        super().__init__(model, config, options)
        self.loaded = load_model(model)

    @property
    def module(self) -> Any:
        return self.loaded.model

    def stages(self, case: Case) -> Outputs:
        return stages(self.loaded, case)

    def replay(self, case: Case, candidate: Any) -> Outputs:
        from audioparity.models.whisper.replay import stages as replayed

        return replayed(self.loaded, case, candidate)
