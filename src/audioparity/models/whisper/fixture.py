"""A tiny, seeded Whisper checkpoint directory, laid out as a Hugging Face one.

Files, as ``save_pretrained`` writes them (transformers' own classes, nothing hand-made):

- ``config.json`` of a ``WhisperConfig`` (:data:`ENCODER` and :data:`DECODER`): 80 mel bins,
  ``d_model`` 64, 4 heads of 16, 2 encoder layers, ``encoder_ffn_dim`` 256,
  ``max_source_positions`` 1500 (the 30 s window, as every Whisper), exact GELU; a one-layer
  decoder with a 64-token vocabulary, which the encoder does not use;
- ``model.safetensors`` of a ``WhisperForConditionalGeneration`` (keys ``model.encoder.*``),
  float32 like the released checkpoints;
- ``generation_config.json``, and ``preprocessor_config.json`` of a
  ``WhisperFeatureExtractor(feature_size=80)`` (every other setting Whisper's default).

The matmul widths (64 and 256) are multiples of 32, so q8_0 holds every matmul weight.

transformers' initialisation (normal, std 0.02) is degenerate for a parity target: the conv
stack's output is tiny next to the positions and the layers hardly change the residual stream.
:func:`redraw_weights` replaces every parameter but ``embed_positions`` (kept as the sinusoids
transformers writes) with seeded draws at gains that keep each block's contribution of the
order of its input, and the speech, not the silence padding, in the conv stack's output.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from audioparity.artifacts import built_directory

log = logging.getLogger("audioparity")

#: The encoder of the fixture (``WhisperConfig`` names).
ENCODER = {
    "num_mel_bins": 80,
    "d_model": 64,
    "encoder_layers": 2,
    "encoder_attention_heads": 4,
    "encoder_ffn_dim": 256,
    "max_source_positions": 1500,
    "activation_function": "gelu",
}
#: The decoder and vocabulary (saved, never run): small, with token ids inside the vocabulary.
DECODER = {
    "vocab_size": 64,
    "decoder_layers": 1,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "max_target_positions": 32,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "decoder_start_token_id": 3,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}

#: Gain of the re-drawn matrices: std = GAIN / sqrt(fan_in).
GAIN = 1.0
#: Gain of the re-drawn conv kernels, drawn with zero mean per output channel: no response to a
#: constant input such as the silence that pads every input to 30 s (with their mean, the
#: silence's constant response dominates the conv stack's output). At 4 the speech frames reach
#: rms 2.6 (clip) and 1.9 (jfk) against the positions' 0.68 and the silence's 0.24, and the
#: encoder output's std over time is half its overall std (0.50 clip, 0.51 jfk).
CONV_GAIN = 4.0
#: Std of the re-drawn biases, and of the norm weights around 1.
VECTOR_STD = 0.2


def redraw_weights(model, seed: int) -> None:
    """Re-draw every parameter of ``model`` but ``embed_positions`` in place, from a
    ``torch.Generator`` seeded ``seed``, in ``named_parameters()`` order (fixed by the config):

    - matrices (``ndim == 2``): normal, std ``GAIN / sqrt(fan_in)`` with
      ``fan_in = numel / shape[0]``; conv kernels (``ndim == 3``): the same with
      :data:`CONV_GAIN` (``fan_in = in * k``), less each output channel's mean;
    - LayerNorm weights: ``1 + VECTOR_STD N(0, 1)``; other vectors (biases): ``VECTOR_STD
      N(0, 1)``.

    Both ``embed_positions`` tables keep what transformers wrote: the sinusoids of the encoder
    (``sinusoids(max_source_positions, d_model)``), the decoder's init.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    norm_weights = {f"{name}.weight" for name, module in model.named_modules()
                    if isinstance(module, torch.nn.LayerNorm)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "embed_positions" in name:
                continue
            draw = torch.randn(param.shape, generator=generator, dtype=param.dtype)
            if param.ndim >= 2:
                gain = CONV_GAIN if param.ndim == 3 else GAIN
                draw *= gain / math.sqrt(param.numel() / param.shape[0])
                if param.ndim == 3:
                    draw -= draw.mean(dim=(1, 2), keepdim=True)
            elif name in norm_weights:
                draw = 1.0 + VECTOR_STD * draw
            else:
                draw *= VECTOR_STD
            param.copy_(draw)


def build_fixture(output: Path, seed: int = 0) -> None:
    """Write the tiny Whisper checkpoint directory ``output`` (the family spec's
    ``fixture_model`` is "": the directory is the model), atomically
    (:func:`~audioparity.artifacts.built_directory`): ``output`` is either absent or complete,
    an existing one replaced. Offline and deterministic: the same seed gives the same tensors.

    Raises:
        AudioparityError: the parent directory cannot be written.
    """
    output = Path(output)
    with built_directory(output) as work:
        start = time.perf_counter()
        import torch
        from transformers import (
            WhisperConfig,
            WhisperFeatureExtractor,
            WhisperForConditionalGeneration,
        )

        imported = time.perf_counter()
        config = WhisperConfig(**ENCODER, **DECODER)
        torch.manual_seed(seed)
        model = WhisperForConditionalGeneration(config)
        redraw_weights(model, seed)
        model.eval()
        model.save_pretrained(work)
        WhisperFeatureExtractor(feature_size=ENCODER["num_mel_bins"]).save_pretrained(work)
        for file in work.iterdir():
            file.chmod(0o644)  # save_pretrained writes model.safetensors owner-only
    log.info("fixture whisper: transformers imported in %.1f s; wrote %s (seed %d) in "
             "%.2f s", imported - start, output, seed, time.perf_counter() - imported)
