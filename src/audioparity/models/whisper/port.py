"""The ggml port's stages of one case (:meth:`WhisperEncoder.ggml`), each phase timed by the
driver:

- ``mel``: :func:`.frontend.mel_features` -> ``mel_features [T, n_mels]``;
- ``encoder``: the end-to-end encoder on that mel, one graph -> ``conv_out``, ``layer_{i}``,
  ``enc_out`` (``[T', D]`` each);
- ``layers_isolated``: every layer alone on the reference's input of that layer (reference
  ``conv_out`` plus ``embed_positions`` for layer 0, reference ``layer_{i-1}`` after) ->
  ``layer_{i}_isolated``.
"""

from __future__ import annotations

import logging
from typing import Any

from audioparity.artifacts import Dump
from audioparity.family import Case, Outputs, Phase
from audioparity.ggml import Runtime, Weights
from audioparity.models.whisper.encoder import Encoder
from audioparity.models.whisper.frontend import mel_features

log = logging.getLogger("audioparity")


def stages(runtime: Runtime, weights: Weights, case: Case, reference: Dump) -> Outputs:
    """The stages of the module docstring, on ``case`` (its audio ``[L]`` float32 at the
    extractor's rate)."""
    config = case.config
    yield Phase("mel")
    mel = mel_features(case.data.samples, config.feature_extractor)
    yield "mel_features", mel

    encoder = Encoder(weights, config, runtime)
    yield Phase("encoder")
    taps: dict[str, Any] = encoder.forward(mel)
    yield from taps.items()

    yield Phase("layers_isolated")
    inputs = [reference.tensor(name)
              for name in ["conv_out", *(f"layer_{i}" for i in range(config.n_layers - 1))]]
    for i, output in enumerate(encoder.layers_isolated(inputs)):
        yield f"layer_{i}_isolated", output
    log.info("ggml whisper %s: mel %s, encoder (%d layers, T'=%d)", case.path.name,
             list(mel.shape), config.n_layers, taps["enc_out"].shape[0])
