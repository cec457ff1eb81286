"""The encoder and decoder taps both Whisper references take (transformers' and openai-whisper's
modules differ in names only): conv_out, layer_{i} and enc_out from one encoder run, and
decoder_layer_{i} and decoder_logits from one teacher-forced decoder run, through
:class:`~audioparity.contract.taps.Taps`. Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.taps import Taps
from audioparity.models.whisper.spec import Names


def encoder_stages(conv2: Any, layers: Sequence[Any], positions: Callable[[int], Any],
                   run: Callable[[], Any]) -> dict[str, np.ndarray]:
    """``run()`` (the encoder on one ``[1, n_mels, T]`` input, returning its final hidden
    states ``[1, T', D]``) with hooks on ``conv2``, the input of ``layers[0]`` and every
    ``layers[i]``'s output. ``conv_out`` is ``nn.functional.gelu`` of ``conv2``'s output (the
    call the encoder's forward makes), checked to give, plus ``positions(T')`` (the first T'
    rows of the positional table), exactly the input of ``layers[0]``.

    Returns:
        ``conv_out``, ``layer_{i}``, ``enc_out``, each ``[T', D]`` float32.

    Raises:
        AudioparityError: a hook did not fire exactly once, or the input of ``layers[0]`` is
            not ``gelu(conv2(...))`` plus the positions (the encoder does something this dump
            does not describe).
    """
    import torch

    with Taps("encoder") as taps:
        taps.output("conv2", conv2)
        taps.input("layer_0_input", layers[0])
        taps.outputs(Names.LAYER, layers)
        with torch.inference_mode():
            enc_out = run()
            conv_out = torch.nn.functional.gelu(taps.once("conv2")).permute(0, 2, 1)
            if not torch.equal(conv_out + positions(conv_out.shape[1]),
                               taps.once("layer_0_input")):
                raise AudioparityError("encoder: the input of its first layer is not "
                                       "gelu(conv2(...)) + its positional embedding")
    return {Names.CONV_OUT: conv_out[0].numpy(),
            **{Names.LAYER.at(i): taps.once(Names.LAYER.at(i))[0].numpy()
               for i in range(len(layers))},
            Names.ENC_OUT: enc_out[0].numpy()}


def decoder_stages(layers: Sequence[Any], run: Callable[[], Any]) -> dict[str, np.ndarray]:
    """``run()`` (the decoder over the teacher-forced tokens ``[1, S]`` at once, no cache,
    returning the logits ``[1, S, V]``) with hooks on its ``layers``.

    Returns:
        ``decoder_layer_{i}`` ``[S, D]`` and ``decoder_logits`` ``[S, V]``, float32.

    Raises:
        AudioparityError: a hook did not fire exactly once.
    """
    import torch

    with Taps("decoder") as taps:
        taps.outputs(Names.DECODER_LAYER, layers)
        with torch.inference_mode():
            logits = run()
    return {**{Names.DECODER_LAYER.at(i): taps.once(Names.DECODER_LAYER.at(i))[0].numpy()
               for i in range(len(layers))},
            Names.DECODER_LOGITS: logits[0].numpy()}
