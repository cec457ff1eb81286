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
from audioparity.models.whisper.spec import Names
from audioparity.models.whisper.tokenizer import Tokenizer

log = logging.getLogger("audioparity")


def stages(runtime: Runtime, weights: Weights, case: Case, reference: Dump) -> Outputs:
    """The stages of the module docstring, on ``case`` (its audio ``[L]`` float32 at the
    extractor's rate)."""
    config = case.config
    tokenizer = Tokenizer(case.model)
    prompt = prompt_ids(config, case.options["language"], case.options["task"])
    yield Phase(Names.MEL_FEATURES)
    mel = mel_features(case.data.samples, config.feature_extractor)
    yield Names.MEL_FEATURES, mel

    encoder = Encoder(weights, config, runtime)
    yield Phase(Names.CONV_OUT)
    taps: dict[str, Any] = encoder.forward(mel)
    yield from taps.items()

    yield Phase(Names.LAYER_ISOLATED.at(0))
    inputs = [reference.tensor(name) for name in
              [Names.CONV_OUT, *(Names.LAYER.at(i) for i in range(config.n_layers - 1))]]
    for i, output in enumerate(encoder.layers_isolated(inputs)):
        yield Names.LAYER_ISOLATED.at(i), output

    decoder = Decoder(weights, config, runtime)
    yield Phase(Names.DECODER_LAYER.at(0))
    decoder.encoder_output(taps[Names.ENC_OUT])
    tokens = prompt + list(reference.json(Names.DECODE)["ids"])
    forced = decoder.teacher_forced(tokens, len(prompt))
    for i in range(config.n_decoder_layers):
        yield Names.DECODER_LAYER.at(i), forced[Names.DECODER_LAYER.at(i)]
    yield Names.DECODER_LOGITS, forced["logits"]

    yield Phase(Names.DECODE)
    decode = decoder.greedy(prompt)
    yield Names.DECODE, {"ids": decode.ids, "text": tokenizer.decode(decode.ids)}
    yield Names.DECODE_MARGINS, decode.margins

    yield Phase(Names.DECODER_LAYER_ISOLATED.at(0))
    decoder.encoder_output(reference.tensor(Names.ENC_OUT))
    inputs = [reference.tensor(Names.DECODER_LAYER.at(i))
              for i in range(config.n_decoder_layers - 1)]
    for i, output in enumerate(decoder.layers_isolated(tokens, inputs)):
        yield Names.DECODER_LAYER_ISOLATED.at(i), output
    yield Phase(Names.DECODER_REPLAY)
    replay = decoder.greedy(prompt)
    yield Names.DECODER_REPLAY, {"ids": replay.ids, "text": tokenizer.decode(replay.ids)}
    yield f"{Names.DECODER_REPLAY}_margins", replay.margins
    log.info("ggml whisper %s: mel %s, encoder (%d layers, T'=%d), decoder (%d layers): %d "
             "tokens (%s), on the reference's enc_out %d (%s)", case.path.name, list(mel.shape),
             config.n_layers, taps[Names.ENC_OUT].shape[0], config.n_decoder_layers,
             len(decode.ids), decode.stopped, len(replay.ids), replay.stopped)
