"""A tiny, seeded Whisper checkpoint directory, laid out as a Hugging Face one.

Files, as ``save_pretrained`` writes them (transformers' and tokenizers' own classes):

- ``config.json`` of a ``WhisperConfig`` (:data:`ENCODER` and :data:`DECODER`): 80 mel bins,
  ``d_model`` 64, 4 heads of 16, 2 encoder layers, ``encoder_ffn_dim`` 256,
  ``max_source_positions`` 1500 (the 30 s window, as every Whisper), exact GELU; a two-layer
  decoder, ``decoder_ffn_dim`` 128, 32 positions, and a 64-token vocabulary (:data:`TEXT`, then
  :data:`SPECIAL`), ``proj_out`` tied to ``embed_tokens``;
- ``model.safetensors`` of a ``WhisperForConditionalGeneration`` (keys ``model.*``), float32
  like the released checkpoints;
- ``generation_config.json`` (:func:`generation_config`): an English-only model's prompt
  tokens, suppressed tokens as Whisper's (the tasks, ``<|startoflm|>``, ``<|startofprev|>``,
  ``<|nocaptions|>`` and a few text tokens; at the first step the space and
  ``<|endoftext|>``), ``max_length`` the decoder's 32 positions;
- ``tokenizer.json`` (a byte-level BPE of :data:`TEXT`, the :data:`SPECIAL` tokens added, as
  Whisper's; no merges: the decode only reads ids) and the files transformers'
  ``WhisperTokenizer`` reads beside it
  (:func:`~audioparity.checkpoints.ctranslate2_whisper.tokenizer_files`);
- ``preprocessor_config.json`` of a ``WhisperFeatureExtractor(feature_size=80)`` (every other
  setting Whisper's default).

The matmul widths (64, 128 and 256) are multiples of 32, so q8_0 holds every matmul weight.

transformers' initialisation (normal, std 0.02) is degenerate for a parity target: the conv
stack's output is tiny next to the positions and the layers hardly change the residual stream.
:func:`redraw_weights` replaces every parameter but ``embed_positions`` (the encoder's kept as
the sinusoids transformers writes) with seeded draws at gains that keep each block's
contribution of the order of its input, and the speech, not the silence padding, in the conv
stack's output.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

from audioparity.checkpoints.ctranslate2_whisper import tokenizer_files
from audioparity.dumping.artifacts import built_directory

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
#: The text tokens of the vocabulary, ids 0 .. 55, as a byte-level BPE spells them (``Ġ`` a
#: space): letters, the space, punctuation, and words of jfk.wav's sentence.
TEXT = (*"abcdefghijklmnopqrstuvwxyz", "Ġ", ",", ".", "'",
        *("Ġ" + word for word in (
            "And", "so", "my", "fellow", "Americans", "ask", "not", "what", "your", "country",
            "can", "do", "for", "you", "the", "a", "we", "it", "is", "to", "of", "in", "that",
            "this", "be", "on")))
#: The special tokens after the text, in Whisper's order (an English-only model's: no
#: language tokens), ids 56 .. 63.
SPECIAL = ("<|endoftext|>", "<|startoftranscript|>", "<|translate|>", "<|transcribe|>",
           "<|startoflm|>", "<|startofprev|>", "<|nocaptions|>", "<|notimestamps|>")
EOT, SOT = len(TEXT), len(TEXT) + 1
#: The decoder and vocabulary.
DECODER = {
    "vocab_size": len(TEXT) + len(SPECIAL),
    "decoder_layers": 2,
    "decoder_attention_heads": 4,
    "decoder_ffn_dim": 128,
    "max_target_positions": 32,
    "pad_token_id": EOT,
    "bos_token_id": SOT,
    "eos_token_id": EOT,
    "decoder_start_token_id": SOT,
    "suppress_tokens": None,
    "begin_suppress_tokens": None,
}
#: Text tokens suppressed at every step (Whisper suppresses symbols such as ``"`` and ``#``).
SUPPRESSED_TEXT = (2, 7, 29)

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
    """Re-draw every parameter of ``model`` but the encoder's ``embed_positions`` in place, from a
    ``torch.Generator`` seeded ``seed``, in ``named_parameters()`` order (fixed by the config):

    - matrices (``ndim == 2``): normal, std ``GAIN / sqrt(fan_in)`` with
      ``fan_in = numel / shape[0]``; conv kernels (``ndim == 3``): the same with
      :data:`CONV_GAIN` (``fan_in = in * k``), less each output channel's mean;
    - LayerNorm weights: ``1 + VECTOR_STD N(0, 1)``; other vectors (biases): ``VECTOR_STD
      N(0, 1)``.

    The encoder's ``embed_positions`` keeps what transformers wrote, the sinusoids
    (``sinusoids(max_source_positions, d_model)``); the decoder's, a learned table, is drawn as
    a matrix, at the scale of the token embeddings (its init, std 0.02, would leave the
    positions invisible beside them). The encoder's draws come first, so they do not depend on
    the decoder's size.
    """
    import torch

    generator = torch.Generator().manual_seed(seed)
    norm_weights = {f"{name}.weight" for name, module in model.named_modules()
                    if isinstance(module, torch.nn.LayerNorm)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("encoder.embed_positions.weight"):
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


def generation_config() -> dict:
    """``generation_config.json`` of the fixture, as an English-only Whisper's (module notes)."""
    ids = {token: DECODER["vocab_size"] - len(SPECIAL) + i for i, token in enumerate(SPECIAL)}
    return {
        "decoder_start_token_id": SOT, "bos_token_id": SOT, "eos_token_id": EOT,
        "pad_token_id": EOT, "no_timestamps_token_id": ids["<|notimestamps|>"],
        "prev_sot_token_id": ids["<|startofprev|>"], "is_multilingual": False,
        "max_length": DECODER["max_target_positions"], "return_timestamps": False,
        "suppress_tokens": [*SUPPRESSED_TEXT, *(ids[t] for t in SPECIAL[2:7])],
        "begin_suppress_tokens": [TEXT.index("Ġ"), EOT],
    }


def tokenizer_json() -> dict:
    """``tokenizer.json`` of the fixture (module notes), built by ``tokenizers``."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    tokenizer = Tokenizer(models.BPE(vocab={token: i for i, token in enumerate(TEXT)},
                                     merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([AddedToken(token, special=True, normalized=False)
                                  for token in SPECIAL])
    return json.loads(tokenizer.to_str())


def build_fixture(output: Path, seed: int = 0) -> None:
    """Write the tiny Whisper checkpoint directory ``output`` (the family spec's
    ``fixture_model`` is "": the directory is the model), atomically
    (:func:`~audioparity.dumping.artifacts.built_directory`): ``output`` is either absent or
    complete, an existing one replaced. Offline and deterministic: the same seed gives the same
    tensors.

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
        tokenizer = tokenizer_json()
        files = {"generation_config.json": generation_config(), "tokenizer.json": tokenizer,
                 **tokenizer_files(tokenizer, DECODER["max_target_positions"])}
        for name, value in files.items():
            text = value if isinstance(value, str) else json.dumps(value, indent=2) + "\n"
            (work / name).write_text(text, encoding="utf-8")
        for file in work.iterdir():
            file.chmod(0o644)  # save_pretrained writes model.safetensors owner-only
    log.info("fixture whisper: transformers imported in %.1f s; wrote %s (seed %d) in "
             "%.2f s", imported - start, output, seed, time.perf_counter() - imported)
