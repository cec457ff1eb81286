"""The second reference of Whisper (producer ``openai_whisper``): OpenAI's own ``openai-whisper``
package (``whisper/model.py``, ``audio.py``, ``decoding.py``, ``tokenizer.py``) run on CPU,
float32, batch size 1, eval mode, on the transformers-format checkpoint directory the family
reads, converted here in memory (:func:`convert`). Every tensor is what openai-whisper's own code
computed, taken by forward hooks on its modules; the stages have the names and layouts of the
transformers reference (:mod:`.reference`):

- ``mel_features`` ``[T, n_mels]``: ``whisper.log_mel_spectrogram(whisper.pad_or_trim(samples),
  n_mels)`` (the samples padded with zeros or cut to ``N_SAMPLES``, 30 s; its STFT and log as
  transformers' torch path, its mel filters loaded from openai-whisper's assets,
  ``mel_filters.npz``, 80 or 128 mels), transposed from ``[n_mels, T]``; a note gives how far
  those filters are from the ones the checkpoint's extractor builds
  (:func:`~.frontend.mel_filter_bank`);
- ``conv_out``, ``layer_{i}``, ``enc_out`` ``[T', D]``: ``AudioEncoder.forward``, hooks on
  ``conv2`` (``conv_out`` is its ``F.gelu``, checked to give with ``positional_embedding``
  exactly the input of ``blocks[0]``) and on every ``blocks[i]``; ``enc_out`` after ``ln_post``;
- ``decode`` ``{ids, text}`` and ``decode_margins`` ``[len(ids)]``: ``whisper.decoding``'s
  ``DecodingTask`` (what ``whisper.decode`` runs) on ``enc_out``: ``temperature=0`` (its
  ``GreedyDecoder``, ``argmax``), ``without_timestamps=True``, ``fp16=False``, ``beam_size``
  None, ``sample_len`` so that the sequence stops at the family's ``max_length``
  (:func:`~.decoding.max_length`), ``suppress_tokens`` the generation config's (to which
  ``DecodingTask`` adds its own: the tasks, ``<|startoftranscript|>``, ``<|startofprev|>``,
  ``<|startoflm|>``, ``<|nospeech|>``) and ``suppress_blank`` (the space and ``<|endoftext|>``
  at the first step, where transformers reads ``begin_suppress_tokens``); the prompt is
  openai-whisper's ``sot_sequence_including_notimestamps``, refused unless it is the family's
  (:func:`~.decoding.prompt_ids`). The margins are read from the processed logits of each step,
  taken by a logit filter run after openai-whisper's own. ``text`` is openai-whisper's tokenizer's
  ``decode(ids)`` (tiktoken, its assets), not stripped, as the contract keeps Whisper's leading
  space (``DecodingResult.text`` is stripped);
- ``decoder_layer_{i}`` ``[S, D]`` and ``decoder_logits`` ``[S, V]``: one ``TextDecoder.forward``
  (no cache) over the prompt then the decoded ids, hooks on ``decoder.blocks[i]``; its logits
  are ``ln(x) @ token_embedding.weight.T``.

What openai-whisper cannot compute is yielded as :class:`~audioparity.contract.family.Skipped` with
why: the decoder stages of a checkpoint whose ``decoder_ffn_dim`` is not ``4 * d_model``
(``ResidualAttentionBlock`` fixes the MLP at ``n_state * 4``), and the decode and the teacher-forced
stages of one whose special tokens are not those of openai-whisper's tokenizer for its vocabulary
(the tiny fixture's 64 ids). Attention is openai-whisper's default (``MultiHeadAttention.use_sdpa``:
torch's ``scaled_dot_product_attention``).

Importing this module imports neither torch nor openai-whisper.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from audioparity.checkpoints.renames import Renames
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import (
    Case,
    Fields,
    Note,
    Outputs,
    Phase,
    ReferenceLibrary,
    Skipped,
)
from audioparity.models.whisper.checkpoint import read_weights
from audioparity.models.whisper.config import WhisperModelConfig
from audioparity.models.whisper.decoding import choose, max_length, prompt_ids
from audioparity.models.whisper.frontend import mel_filter_bank
from audioparity.models.whisper.spec import Names
from audioparity.models.whisper.taps import decoder_stages, encoder_stages

log = logging.getLogger("audioparity")

#: ``WhisperModel`` names against openai-whisper ``Whisper`` names (layer numbers kept):
#: transformers' ``convert_openai_to_hf.py`` mapping, the one table of the pair.
TRANSFORMERS_OPENAI = Renames((
    ("^encoder.embed_positions.weight$", "^encoder.positional_embedding$"),
    ("^decoder.embed_positions.weight$", "^decoder.positional_embedding$"),
    ("^decoder.embed_tokens.", "^decoder.token_embedding."),
    ("^encoder.layer_norm.", "^encoder.ln_post."),
    ("^decoder.layer_norm.", "^decoder.ln."),
    (".layers.", ".blocks."),
    (".self_attn_layer_norm.", ".attn_ln."),
    (".encoder_attn_layer_norm.", ".cross_attn_ln."),
    (".self_attn.", ".attn."),
    (".encoder_attn.", ".cross_attn."),
    (".q_proj.", ".query."),
    (".k_proj.", ".key."),
    (".v_proj.", ".value."),
    (".out_proj.", ".out."),
    (".fc1.", ".mlp.0."),
    (".fc2.", ".mlp.2."),
    (".final_layer_norm.", ".mlp_ln."),
))

#: openai-whisper's hard-coded audio settings (``whisper/audio.py``), as the checkpoint's
#: ``preprocessor_config.json`` names them, and the mel counts its assets hold filters for.
_AUDIO = {"sampling_rate": 16000, "n_fft": 400, "hop_length": 160, "chunk_length": 30,
          "padding_value": 0.0}
_MELS = (80, 128)


def dimensions(config: WhisperModelConfig) -> dict[str, int]:
    """openai-whisper's ``ModelDimensions`` fields of the checkpoint's config: ``n_mels``
    ``num_mel_bins``, ``n_audio_ctx`` ``max_source_positions``, ``n_audio_state`` and
    ``n_text_state`` ``d_model``, ``n_audio_head``/``n_text_head`` the attention heads,
    ``n_audio_layer``/``n_text_layer`` the layers, ``n_vocab`` ``vocab_size``, ``n_text_ctx``
    ``max_target_positions``."""
    enc, dec = config.encoder, config.decoder
    return {"n_mels": enc.num_mel_bins, "n_audio_ctx": enc.max_source_positions,
            "n_audio_state": enc.d_model, "n_audio_head": enc.encoder_attention_heads,
            "n_audio_layer": enc.encoder_layers, "n_vocab": dec.vocab_size,
            "n_text_ctx": dec.max_target_positions, "n_text_state": enc.d_model,
            "n_text_head": dec.decoder_attention_heads, "n_text_layer": dec.decoder_layers}


def unsupported(config: WhisperModelConfig) -> tuple[str, str]:
    """Why openai-whisper cannot run the checkpoint's encoder, and its decoder ("" when it
    can): its ``ResidualAttentionBlock`` fixes the MLP at ``4 * n_state``; its audio code fixes
    16 kHz, ``n_fft`` 400, ``hop_length`` 160, 30 s and zero padding, and has mel filters for
    80 and 128 mels only."""
    features = config.feature_extractor
    four = 4 * config.encoder.d_model
    encoder = ""
    other = {key: getattr(features, key) for key, value in _AUDIO.items()
             if getattr(features, key) != value}
    if other:
        encoder = (f"openai-whisper hard-codes {_AUDIO} (whisper/audio.py); the checkpoint's "
                   f"extractor has {other}")
    elif features.feature_size not in _MELS:
        encoder = (f"openai-whisper's assets hold mel filters for {_MELS} mels; the checkpoint "
                   f"has {features.feature_size}")
    elif config.encoder.encoder_ffn_dim != four:
        encoder = (f"openai-whisper's ResidualAttentionBlock fixes the MLP at 4 * n_state = "
                   f"{four}; the checkpoint's encoder_ffn_dim is "
                   f"{config.encoder.encoder_ffn_dim}")
    decoder = "" if config.decoder.decoder_ffn_dim == four else (
        f"openai-whisper's ResidualAttentionBlock fixes the MLP at 4 * n_state = {four}; the "
        f"checkpoint's decoder_ffn_dim is {config.decoder.decoder_ffn_dim}")
    return encoder, decoder


def convert(weights: dict[str, np.ndarray], config: WhisperModelConfig, decoder: bool = True
            ) -> tuple[dict[str, int], dict[str, np.ndarray]]:
    """openai-whisper's ``ModelDimensions`` fields and state dict of ``WhisperModel``'s
    float32 ``weights`` (:func:`~.checkpoint.read_weights`: every tensor present and shaped),
    the arrays themselves, renamed (:data:`TRANSFORMERS_OPENAI`); with ``decoder`` false, the
    encoder's
    only. No tensor is reshaped: both keep ``nn.Linear``'s ``[out, in]``, ``nn.Conv1d``'s
    ``[out, in, 3]`` and ``[positions, D]`` tables; ``proj_out`` is tied to ``embed_tokens``
    in both (``TextDecoder`` multiplies by ``token_embedding.weight.T``)."""
    state = {TRANSFORMERS_OPENAI.right(name): array for name, array in weights.items()
             if decoder or name.startswith("encoder.")}
    return dimensions(config), state


class Loaded(NamedTuple):
    """openai-whisper's ``Whisper`` with the checkpoint's weights (``decoder`` None when
    :func:`unsupported` names why), its tokenizer (None when the checkpoint's special tokens
    are not its own) and the reasons for what it cannot dump.

    Attributes:
        model: ``whisper.model.Whisper``, float32, eval mode.
        tokenizer: ``whisper.tokenizer.Tokenizer`` of the checkpoint's prompt, or None.
        no_decoder: why the decoder stages are skipped ("" when they are not).
        no_decode: why the decode is skipped ("" when it is not).
        filters_note: how far openai-whisper's mel filters are from the extractor's.
        config: the family's config of the checkpoint.
        options: the reference's options (``language``, ``task``).
    """

    model: Any
    tokenizer: Any
    no_decoder: str
    no_decode: str
    filters_note: str
    config: WhisperModelConfig
    options: dict[str, Any]


def _tokenizer(config: WhisperModelConfig, options: dict[str, Any], model: Any
               ) -> tuple[Any, str]:
    """openai-whisper's tokenizer as ``DecodingTask`` builds it for this model and options, and
    "" when its prompt, ``<|endoftext|>`` and vocabulary size are the checkpoint's; else None
    and why."""
    from whisper.tokenizer import get_tokenizer

    prompt = prompt_ids(config, options["language"], options["task"])
    language = options["language"].strip("<|>") or "en"
    try:
        tokenizer = get_tokenizer(model.is_multilingual, num_languages=model.num_languages,
                                  language=language, task=options["task"])
    except (ValueError, KeyError) as err:
        return None, f"openai-whisper has no tokenizer for this model ({err})"
    theirs = list(tokenizer.sot_sequence_including_notimestamps)
    mismatches = {key: (ours, found) for key, ours, found in (
        ("start of transcript", prompt, theirs),
        ("<|endoftext|>", config.generation.eos_token_id, tokenizer.eot),
        ("n_vocab", config.decoder.vocab_size, tokenizer.encoding.n_vocab)) if ours != found}
    if mismatches:
        return None, ("openai-whisper's decode builds its tokenizer from its own assets; the "
                      "checkpoint's special tokens are not those (checkpoint, openai-whisper): "
                      f"{mismatches}")
    return tokenizer, ""


def _filters_note(config: WhisperModelConfig) -> str:
    """The largest difference between openai-whisper's asset filters and the extractor's
    (:func:`~.frontend.mel_filter_bank` rounded to float32), both ``[n_mels, n_fft // 2 + 1]``,
    relative to the largest filter value."""
    from whisper.audio import mel_filters

    features = config.feature_extractor
    theirs = mel_filters("cpu", features.feature_size).numpy().astype(np.float64)
    ours = mel_filter_bank(features.n_fft // 2 + 1, features.feature_size,
                           features.sampling_rate).astype(np.float32).astype(np.float64)
    diff = float(np.abs(theirs - ours).max())
    return (f"mel filters: openai-whisper's assets (mel_filters.npz, librosa) against the "
            f"extractor's (transformers mel_filter_bank, float32): max |diff| {diff:.3g}, "
            f"{diff / float(np.abs(ours).max()):.3g} of the largest value")


def load_model(model_dir: Path, config: WhisperModelConfig, options: dict[str, Any]) -> Loaded:
    """openai-whisper's ``Whisper(ModelDimensions(...))`` with the checkpoint's weights
    (:func:`convert`, ``load_state_dict(strict=True)``), float32, eval mode; its decoder
    removed when it cannot hold the checkpoint's (:func:`unsupported`).

    Raises:
        AudioparityError: the checkpoint's audio settings or encoder are not what openai-whisper
            can compute (:func:`unsupported`), or a tensor the checkpoint lacks
            (:func:`~.checkpoint.read_weights`).
    """
    import torch
    from whisper.model import ModelDimensions, Whisper

    no_encoder, no_decoder = unsupported(config)
    if no_encoder:
        raise AudioparityError(f"{model_dir}: {no_encoder}")
    dims, state = convert(read_weights(model_dir, config), config, decoder=not no_decoder)
    model = Whisper(ModelDimensions(**dims))
    if no_decoder:
        model.decoder = None
    model.load_state_dict({name: torch.from_numpy(array) for name, array in state.items()},
                          strict=True)
    model = model.float().eval()
    tokenizer, no_decode = (None, no_decoder) if no_decoder else _tokenizer(config, options, model)
    return Loaded(model, tokenizer, no_decoder, no_decode, _filters_note(config), config,
                  dict(options))


def transformers_view(model: Any) -> Any:
    """A torch module holding openai-whisper's ``model``'s matmul modules under the names
    transformers' ``WhisperForConditionalGeneration`` gives them
    (``model.encoder.layers.{i}.self_attn.q_proj``, ``...fc1``, ``model.decoder.embed_tokens``,
    ...), the same module objects: what the quantization-aware references round
    (:func:`~audioparity.dumping.emulation.emulating`), which name each weight as the port does.
    ``TextDecoder`` multiplies by ``token_embedding.weight`` outside any module, so its logits
    see the rounded weight but not a rounded input (transformers' tied ``proj_out`` rounds it).
    """
    import torch

    def tree(**children: Any) -> Any:
        node = torch.nn.Module()
        for name, child in children.items():
            node.add_module(name, child)
        return node

    def attention(attn: Any) -> Any:
        return tree(q_proj=attn.query, k_proj=attn.key, v_proj=attn.value, out_proj=attn.out)

    def layers(blocks: Any) -> Any:
        return torch.nn.ModuleList(
            tree(self_attn=attention(b.attn), fc1=b.mlp[0], fc2=b.mlp[2],
                 **({"encoder_attn": attention(b.cross_attn)} if b.cross_attn else {}))
            for b in blocks)

    parts = {"encoder": tree(layers=layers(model.encoder.blocks))}
    if model.decoder is not None:
        parts["decoder"] = tree(embed_tokens=model.decoder.token_embedding,
                                layers=layers(model.decoder.blocks))
    return tree(model=tree(**parts))


def mel_features(samples: np.ndarray, n_mels: int) -> np.ndarray:
    """``whisper.log_mel_spectrogram(whisper.pad_or_trim(samples), n_mels)``: ``[n_mels, T]``
    float32, ``T = N_FRAMES`` (3000)."""
    import whisper

    audio = whisper.pad_or_trim(np.asarray(samples, dtype=np.float32))
    return whisper.log_mel_spectrogram(audio, n_mels).numpy()


def encoder(net: Any, features: np.ndarray) -> dict[str, np.ndarray]:
    """``AudioEncoder.forward`` on ``features`` ``[n_mels, T]`` with hooks on ``conv2``, the
    input of ``blocks[0]`` and every ``blocks[i]``.

    Returns:
        ``conv_out``, ``layer_{i}``, ``enc_out``, each ``[T', D]`` float32.

    Raises:
        AudioparityError: a hook did not fire exactly once, or the input of ``blocks[0]`` is not
            ``gelu(conv2(...)) + positional_embedding``.
    """
    import torch

    return encoder_stages(
        net.conv2, net.blocks, lambda n: net.positional_embedding[:n],
        lambda: net(torch.from_numpy(np.ascontiguousarray(features))[None]))


class Decoded(NamedTuple):
    """openai-whisper's greedy decode: ``ids`` (no prompt, no ``<|endoftext|>``), ``margins``
    ``[len(ids)]`` float32, ``stopped`` (``eos`` or ``max_length``), and the tokens it
    suppressed at every step and at the first."""

    ids: list[int]
    margins: np.ndarray
    stopped: str
    suppress: list[int]
    begin_suppress: list[int]


def greedy_decoding(loaded: Loaded, enc_out: np.ndarray) -> Decoded:
    """``DecodingTask(model, options).run(enc_out)`` (module docstring), with a last logit
    filter that keeps each step's processed logits for the margins (:func:`~.decoding.choose`).

    Raises:
        AudioparityError: a step's kept logits choose another token than the decode did.
    """
    import torch
    from whisper.decoding import (
        DecodingOptions,
        DecodingTask,
        LogitFilter,
        SuppressBlank,
        SuppressTokens,
    )

    config, tokenizer = loaded.config, loaded.tokenizer
    prompt = list(tokenizer.sot_sequence_including_notimestamps)
    steps: list[np.ndarray] = []

    class Keep(LogitFilter):
        def apply(self, logits: Any, tokens: Any) -> None:
            steps.append(logits[0].float().numpy().copy())

    # an English-only model decodes with language "en" (what whisper.transcribe passes): None
    # would ask DecodingTask to detect it
    language = loaded.options["language"].strip("<|>") or "en"
    options = DecodingOptions(task=loaded.options["task"], language=language, temperature=0.0,
                              sample_len=max_length(config) - len(prompt),
                              suppress_tokens=list(config.generation.suppress_tokens),
                              suppress_blank=True, without_timestamps=True, fp16=False)
    task = DecodingTask(loaded.model, options)
    task.logit_filters.append(Keep())
    with torch.inference_mode():
        result = task.run(torch.from_numpy(np.ascontiguousarray(enc_out))[None])[0]
    ids = list(result.tokens)
    chosen = [choose(row) for row in steps]
    picked = [token for token, _ in chosen]
    stopped = "eos" if picked[-1] == tokenizer.eot else "max_length"
    if picked[:len(ids)] != ids or (stopped == "eos") != (len(picked) == len(ids) + 1):
        raise AudioparityError("openai-whisper's decode chose other tokens than the argmax of "
                               "its processed logits")
    suppress = [t for f in task.logit_filters if isinstance(f, SuppressTokens)
                for t in f.suppress_tokens]
    begin = [t for f in task.logit_filters if isinstance(f, SuppressBlank)
             for t in tokenizer.encode(" ") + [tokenizer.eot]]  # SuppressBlank.apply's
    return Decoded(ids, np.asarray([m for _, m in chosen[:len(ids)]], dtype=np.float32),
                   stopped, sorted(set(suppress)), sorted(set(begin)))


def teacher_forced(net: Any, enc_out: np.ndarray, tokens: list[int]) -> dict[str, np.ndarray]:
    """``TextDecoder.forward`` over ``tokens`` ``[S]`` at once (no cache), hooks on its blocks.

    Returns:
        ``decoder_layer_{i}`` ``[S, D]`` and ``decoder_logits`` ``[S, V]``, float32.

    Raises:
        AudioparityError: a hook did not fire exactly once.
    """
    import torch

    return decoder_stages(net.blocks, lambda: net(
        torch.tensor([tokens]), torch.from_numpy(np.ascontiguousarray(enc_out))[None]))


def stages(loaded: Loaded, case: Case) -> Outputs:
    """openai-whisper's stages of one case (module docstring), each phase timed by the driver;
    the decoder's as :class:`~audioparity.contract.family.Skipped` when it cannot compute them."""
    config = case.config
    yield Phase(Names.MEL_FEATURES)
    features = mel_features(case.data.samples, config.feature_extractor.feature_size)
    yield Names.MEL_FEATURES, features.T
    yield Note(loaded.filters_note)
    yield Phase(Names.CONV_OUT)
    taps = encoder(loaded.model.encoder, features)
    yield from taps.items()
    yield Note("conv_out: gelu of conv2's output (hook); plus positional_embedding it equals the "
               "input of blocks[0] exactly (checked)")
    decoder_stages = [*(Names.DECODER_LAYER.at(i) for i in range(config.n_decoder_layers)),
                      Names.DECODER_LOGITS]
    if loaded.no_decode:
        yield Skipped(Names.DECODE, loaded.no_decode)
        for name in decoder_stages:
            yield Skipped(name, loaded.no_decoder or f"no decode to teacher-force along: "
                                                     f"{loaded.no_decode}")
        return
    yield Phase(Names.DECODE)
    decode = greedy_decoding(loaded, taps[Names.ENC_OUT])
    prompt = list(loaded.tokenizer.sot_sequence_including_notimestamps)
    yield Names.DECODE, {"ids": decode.ids, "text": loaded.tokenizer.decode(decode.ids)}
    yield Names.DECODE_MARGINS, decode.margins
    yield Fields({"decoder_prompt": prompt, "decode_stopped": decode.stopped,
                  "suppress_tokens": decode.suppress,
                  "begin_suppress_tokens": decode.begin_suppress})
    generation = config.generation
    added = sorted(set(decode.suppress) - set(generation.suppress_tokens))
    begin = sorted(set(decode.begin_suppress) - set(generation.begin_suppress_tokens))
    missing = sorted(set(generation.begin_suppress_tokens) - set(decode.begin_suppress))
    if added or begin or missing:
        yield Note(f"decode: openai-whisper suppresses {added} beyond the generation config's "
                   f"suppress_tokens, {begin} beyond its begin_suppress_tokens, and not "
                   f"{missing} of them")
    yield Phase(Names.DECODER_LAYER.at(0))  # along its decode
    yield from teacher_forced(loaded.model.decoder, taps[Names.ENC_OUT],
                              prompt + decode.ids).items()
    log.info("reference whisper (openai-whisper): %s: %d tokens (%s)", case.path,
             len(decode.ids), decode.stopped)


class OpenaiWhisper(ReferenceLibrary):
    """OpenAI's ``openai-whisper`` package with the checkpoint's weights (:func:`load_model`):
    its stages (:func:`stages`), rounded by the quantization-aware references through
    :func:`transformers_view`."""

    def __init__(self, model: Path, config: WhisperModelConfig, options: Mapping[str, Any]
                 ) -> None:
        super().__init__(model, config, options)
        self.loaded = load_model(model, config, dict(options))

    @property
    def module(self) -> Any:
        return transformers_view(self.loaded.model)

    def stages(self, case: Case) -> Outputs:
        return stages(self.loaded, case)
