"""The ggml port's stages of one case (:meth:`Whisper.ggml`), each phase (named by the first
stage it computes) timed by the driver:

- ``mel_features``: :func:`.frontend.mel_features` -> ``mel_features [T, n_mels]``;
- ``conv_out``: the end-to-end encoder on that mel, one graph -> ``conv_out``, ``layer_{i}``,
  ``enc_out`` (``[T', D]`` each);
- ``layer_0_isolated``: every encoder layer alone on the reference's input of that layer
  (reference ``conv_out`` plus ``embed_positions`` for layer 0, reference ``layer_{i-1}``
  after), one graph -> ``layer_{i}_isolated``;
- ``decoder_layer_0`` (teacher-forced): the decoder on our ``enc_out`` over the reference's
  teacher-forced sequence (the prompt and the reference's decoded ids), run as a decode runs
  (the prompt, then one KV-cached step a token: :meth:`.Decoder.teacher_forced`) ->
  ``decoder_layer_{i} [S, D]``, ``decoder_logits [S, V]``;
- ``decode``: our greedy decode of our ``enc_out`` -> ``decode`` and ``decode_margins``;
- ``decoder_layer_0_isolated``: the decoder on the reference's ``enc_out``, every layer alone
  on the reference's input of that layer, one graph -> ``decoder_layer_{i}_isolated``;
- ``decoder_replay``: its greedy decode on the reference's ``enc_out`` -> ``decoder_replay``
  and ``decoder_replay_margins``.
"""

from __future__ import annotations

import logging
from typing import Any

from audioparity.contract.family import Case, Outputs, Phase
from audioparity.dumping.artifacts import Dump
from audioparity.ggml import Runtime, Weights
from audioparity.models.whisper.decoder import Decoder
from audioparity.models.whisper.decoding import prompt_ids
from audioparity.models.whisper.encoder import Encoder
from audioparity.models.whisper.frontend import mel_features
from audioparity.models.whisper.tokenizer import Tokenizer

log = logging.getLogger("audioparity")


def stages(runtime: Runtime, weights: Weights, case: Case, reference: Dump) -> Outputs:
    """The stages of the module docstring, on ``case`` (its audio ``[L]`` float32 at the
    extractor's rate)."""
    config = case.config
    tokenizer = Tokenizer(case.model)
    prompt = prompt_ids(config, case.options["language"], case.options["task"])
    yield Phase("mel_features")
    mel = mel_features(case.data.samples, config.feature_extractor)
    yield "mel_features", mel

    encoder = Encoder(weights, config, runtime)
    yield Phase("conv_out")
    taps: dict[str, Any] = encoder.forward(mel)
    yield from taps.items()

    yield Phase("layer_0_isolated")
    inputs = [reference.tensor(name)
              for name in ["conv_out", *(f"layer_{i}" for i in range(config.n_layers - 1))]]
    for i, output in enumerate(encoder.layers_isolated(inputs)):
        yield f"layer_{i}_isolated", output

    decoder = Decoder(weights, config, runtime)
    yield Phase("decoder_layer_0")
    decoder.encoder_output(taps["enc_out"])
    tokens = prompt + list(reference.json("decode")["ids"])
    forced = decoder.teacher_forced(tokens, len(prompt))
    for i in range(config.n_decoder_layers):
        yield f"decoder_layer_{i}", forced[f"decoder_layer_{i}"]
    yield "decoder_logits", forced["logits"]

    yield Phase("decode")
    decode = decoder.greedy(prompt)
    yield "decode", {"ids": decode.ids, "text": tokenizer.decode(decode.ids)}
    yield "decode_margins", decode.margins

    yield Phase("decoder_layer_0_isolated")
    decoder.encoder_output(reference.tensor("enc_out"))
    inputs = [reference.tensor(f"decoder_layer_{i}") for i in range(config.n_decoder_layers - 1)]
    for i, output in enumerate(decoder.layers_isolated(tokens, inputs)):
        yield f"decoder_layer_{i}_isolated", output
    yield Phase("decoder_replay")
    replay = decoder.greedy(prompt)
    yield "decoder_replay", {"ids": replay.ids, "text": tokenizer.decode(replay.ids)}
    yield "decoder_replay_margins", replay.margins
    log.info("ggml whisper %s: mel %s, encoder (%d layers, T'=%d), decoder (%d layers): %d "
             "tokens (%s), on the reference's enc_out %d (%s)", case.path.name, list(mel.shape),
             config.n_layers, taps["enc_out"].shape[0], config.n_decoder_layers,
             len(decode.ids), decode.stopped, len(replay.ids), replay.stopped)
