"""Whisper hyper-parameters from a Hugging Face checkpoint directory, under the names of
transformers' classes: ``config.json`` (``WhisperConfig``), ``preprocessor_config.json``
(``WhisperFeatureExtractor``) and ``generation_config.json`` (the ``GenerationConfig`` that
``WhisperGenerationMixin.generate`` reads: the prompt's and the suppressed tokens). Reads JSON
only (no torch, no ggml).

A key the file leaves out takes the default of the transformers class, as ``from_pretrained``
does (``save_pretrained`` writes only the values that differ from the defaults). Only what the
port implements is accepted; anything else raises :class:`AudioparityError` naming the file, the
key and the value found:

- ``model_type`` ``whisper``; ``activation_function`` ``gelu`` (the exact erf form,
  ``ACT2FN["gelu"]``), the only activation the port computes;
- ``feature_size`` (mel bins of the extractor) equal to ``num_mel_bins`` (the conv's input);
- ``n_samples // hop_length`` mel frames equal to ``2 * max_source_positions``: the only input
  length ``WhisperEncoder.forward`` accepts (it raises otherwise);
- ``dither`` 0 (dithering adds random noise: no two runs agree);
- ``tie_word_embeddings`` true: the logits are ``embed_tokens`` applied as the output
  projection (``proj_out`` tied), as in every released Whisper;
- every token id of the generation config inside the vocabulary.

``scale_embedding`` is accepted either way: neither ``WhisperEncoder`` nor ``WhisperDecoder``
applies the ``embed_scale`` they compute (transformers 5.x), so neither does the port; a test
holds transformers to that.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError

CONFIG_FILE = "config.json"
PREPROCESSOR_FILE = "preprocessor_config.json"
GENERATION_FILE = "generation_config.json"

#: ``torch.nn.LayerNorm``'s default eps; ``WhisperEncoder`` does not set another.
LAYER_NORM_EPS = 1e-5
#: Strides of ``conv1`` and ``conv2`` (kernel 3, padding 1 each).
CONV_STRIDES = (1, 2)


@dataclass(frozen=True)
class EncoderConfig:
    """The ``WhisperConfig`` fields ``WhisperEncoder`` reads (defaults: ``WhisperConfig``'s)."""

    num_mel_bins: int = 80
    d_model: int = 384
    encoder_layers: int = 4
    encoder_attention_heads: int = 6
    encoder_ffn_dim: int = 1536
    max_source_positions: int = 1500
    activation_function: str = "gelu"
    scale_embedding: bool = False

    @property
    def head_dim(self) -> int:
        """Size of one attention head, ``d_model // encoder_attention_heads``."""
        return self.d_model // self.encoder_attention_heads


@dataclass(frozen=True)
class DecoderConfig:
    """The ``WhisperConfig`` fields ``WhisperDecoder`` and the tied ``proj_out`` read (defaults:
    ``WhisperConfig``'s); ``d_model`` is the encoder's."""

    vocab_size: int = 51865
    decoder_layers: int = 4
    decoder_attention_heads: int = 6
    decoder_ffn_dim: int = 1536
    max_target_positions: int = 448
    tie_word_embeddings: bool = True


@dataclass(frozen=True)
class GenerationConfig:
    """The ``generation_config.json`` fields Whisper's greedy decoding reads
    (``WhisperGenerationMixin.generate`` without timestamps, :mod:`.decoding`).

    Attributes:
        decoder_start_token_id: ``<|startoftranscript|>``, the prompt's first token.
        eos_token_id: ``<|endoftext|>``, which ends a decode.
        no_timestamps_token_id: ``<|notimestamps|>``, the prompt's last token.
        suppress_tokens: ids whose logits are ``-inf`` at every step
            (``SuppressTokensLogitsProcessor``).
        begin_suppress_tokens: ids whose logits are ``-inf`` at the first generated step
            (``SuppressTokensAtBeginLogitsProcessor``).
        max_length: the longest sequence, prompt included (``MaxLengthCriteria``).
        is_multilingual: the prompt carries a language and a task token.
        lang_to_id: ``<|xx|>`` -> id (multilingual models).
        task_to_id: ``transcribe``/``translate`` -> id (multilingual models).
    """

    decoder_start_token_id: int
    eos_token_id: int
    no_timestamps_token_id: int
    suppress_tokens: tuple[int, ...] = ()
    begin_suppress_tokens: tuple[int, ...] = ()
    max_length: int = 448
    is_multilingual: bool = False
    lang_to_id: tuple[tuple[str, int], ...] = ()
    task_to_id: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class FeatureExtractorConfig:
    """The ``WhisperFeatureExtractor`` settings (defaults: its ``__init__``'s).

    ``n_samples`` and ``nb_max_frames`` are derived, as ``__init__`` derives them (values of
    those keys in the file are overwritten there, so they are ignored here too). The mel filters
    are not stored in the file (``to_dict`` drops them); ``__init__`` builds them, and so does
    :func:`~.frontend.mel_filter_bank`.
    """

    feature_size: int = 80
    sampling_rate: int = 16000
    hop_length: int = 160
    chunk_length: int = 30
    n_fft: int = 400
    padding_value: float = 0.0
    dither: float = 0.0

    @property
    def n_samples(self) -> int:
        """Samples every input is padded or trimmed to: ``chunk_length * sampling_rate``."""
        return self.chunk_length * self.sampling_rate

    @property
    def nb_max_frames(self) -> int:
        """Mel frames of ``n_samples`` (the last STFT frame dropped): ``n_samples // hop``."""
        return self.n_samples // self.hop_length


@dataclass(frozen=True)
class WhisperModelConfig:
    """Everything the frontend, the ggml encoder and decoder and the greedy decoding need."""

    encoder: EncoderConfig
    decoder: DecoderConfig
    feature_extractor: FeatureExtractorConfig
    generation: GenerationConfig

    @property
    def n_decoder_layers(self) -> int:
        """Decoder layers (``decoder_layers``)."""
        return self.decoder.decoder_layers

    @property
    def n_layers(self) -> int:
        """Encoder layers (``encoder_layers``)."""
        return self.encoder.encoder_layers

    @property
    def n_frames(self) -> int:
        """Encoder frames T' of the ``nb_max_frames`` mel frames: ``conv2``'s output length."""
        return conv_output_length(self.feature_extractor.nb_max_frames)


def conv_output_length(n_mel_frames: int) -> int:
    """Frames out of ``conv2`` (kernel 3, stride 2, padding 1) for ``n_mel_frames`` frames into
    ``conv1`` (stride 1, same length): ``(T - 1) // 2 + 1``, as
    ``WhisperPreTrainedModel._get_feat_extract_output_lengths``."""
    return (n_mel_frames - 1) // 2 + 1


#: What a config value must be, by the type it is read as (a bool is no number here).
_KINDS = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


def _value(raw: dict[str, Any], key: str, default: Any, where: str) -> Any:
    """``raw[key]`` of the type of ``default`` (``default`` when absent or null)."""
    value = raw.get(key)
    if value is None:
        return default
    kind = type(default)
    allowed = (int, float) if kind is float else (kind,)
    if (isinstance(value, bool) and kind is not bool) or not isinstance(value, allowed):
        raise AudioparityError(f"{where}: {key!r} is {json.dumps(value)[:60]}; expected "
                               f"{_KINDS[kind]}")
    return kind(value)


def _fields(cls, raw: dict[str, Any], where: str):
    """Dataclass ``cls`` from the keys of ``raw`` it declares, each typed as its default."""
    defaults = cls()
    return cls(**{name: _value(raw, name, getattr(defaults, name), where)
                  for name in defaults.__dataclass_fields__})


def _positive(where: str, obj, *keys: str) -> None:
    for key in keys:
        if getattr(obj, key) < 1:
            raise AudioparityError(f"{where}: {key!r} is {getattr(obj, key)}; expected a "
                                   "positive integer")


def _token_ids(raw: dict[str, Any], key: str, vocab_size: int, where: str) -> tuple[int, ...]:
    """``raw[key]``, a list of token ids below ``vocab_size`` (empty when absent or null)."""
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size for i in value):
        raise AudioparityError(f"{where}: {key!r} is {json.dumps(value)[:60]}; expected a list "
                               f"of token ids in [0, {vocab_size})")
    return tuple(value)


def _token_map(raw: dict[str, Any], key: str, vocab_size: int, where: str
               ) -> tuple[tuple[str, int], ...]:
    """``raw[key]``, an object of name -> token id below ``vocab_size`` (empty when absent)."""
    value = raw.get(key)
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab_size
            for i in value.values()):
        raise AudioparityError(f"{where}: {key!r} is {json.dumps(value)[:60]}; expected an "
                               f"object of token ids in [0, {vocab_size})")
    return tuple(value.items())


def parse_generation(raw: Any, decoder: DecoderConfig, where: str = GENERATION_FILE
                     ) -> GenerationConfig:
    """The :class:`GenerationConfig` of the parsed ``generation_config.json`` object.

    Raises:
        AudioparityError: not a JSON object, a missing or out-of-vocabulary special token id,
            a ``max_length`` below 1, or a multilingual config without ``lang_to_id`` and
            ``task_to_id``.
    """
    if not isinstance(raw, dict):
        raise AudioparityError(f"{where}: expected a JSON object, got {type(raw).__name__}")
    vocab = decoder.vocab_size
    ids = {}
    for key in ("decoder_start_token_id", "eos_token_id", "no_timestamps_token_id"):
        value = raw.get(key)
        if isinstance(value, list) and len(value) == 1:  # eos_token_id may be a list of one
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value < vocab:
            raise AudioparityError(f"{where}: {key!r} is {json.dumps(value)[:60]}; expected a "
                                   f"token id in [0, {vocab})")
        ids[key] = value
    max_length = _value(raw, "max_length", GenerationConfig.max_length, where)
    if max_length < 1:
        raise AudioparityError(f"{where}: 'max_length' is {max_length}; expected a positive "
                               "integer")
    config = GenerationConfig(
        **ids,
        suppress_tokens=_token_ids(raw, "suppress_tokens", vocab, where),
        begin_suppress_tokens=_token_ids(raw, "begin_suppress_tokens", vocab, where),
        max_length=max_length,
        is_multilingual=_value(raw, "is_multilingual", False, where),
        lang_to_id=_token_map(raw, "lang_to_id", vocab, where),
        task_to_id=_token_map(raw, "task_to_id", vocab, where),
    )
    if config.is_multilingual and not (config.lang_to_id and config.task_to_id):
        raise AudioparityError(f"{where}: 'is_multilingual' is true without 'lang_to_id' and "
                               "'task_to_id'; expected both (the prompt's language and task)")
    return config


def parse_config(raw: Any, preprocessor: Any, generation: Any, where: str = CONFIG_FILE,
                 preprocessor_where: str = PREPROCESSOR_FILE,
                 generation_where: str = GENERATION_FILE) -> WhisperModelConfig:
    """The config from the parsed ``config.json``, ``preprocessor_config.json`` and
    ``generation_config.json`` objects.

    Raises:
        AudioparityError: not JSON objects, a value of another type, a size that is not
            positive, or a setting the port does not implement (module docstring).
    """
    for obj, name in ((raw, where), (preprocessor, preprocessor_where)):
        if not isinstance(obj, dict):
            raise AudioparityError(f"{name}: expected a JSON object, got {type(obj).__name__}")
    if raw.get("model_type") != "whisper":
        raise AudioparityError(f"{where}: model_type={raw.get('model_type')!r}; expected "
                               "'whisper'")
    encoder = _fields(EncoderConfig, raw, where)
    decoder = _fields(DecoderConfig, raw, where)
    features = _fields(FeatureExtractorConfig, preprocessor, preprocessor_where)
    _positive(where, encoder, "num_mel_bins", "d_model", "encoder_layers",
              "encoder_attention_heads", "encoder_ffn_dim", "max_source_positions")
    _positive(where, decoder, "vocab_size", "decoder_layers", "decoder_attention_heads",
              "decoder_ffn_dim", "max_target_positions")
    _positive(preprocessor_where, features, "feature_size", "sampling_rate", "hop_length",
              "chunk_length", "n_fft")
    if encoder.activation_function != "gelu":
        raise AudioparityError(f"{where}: activation_function={encoder.activation_function!r} "
                               "is not supported by the ggml port (supported: 'gelu')")
    for key in ("encoder_attention_heads", "decoder_attention_heads"):
        heads = getattr(decoder if key.startswith("decoder") else encoder, key)
        if encoder.d_model % heads:
            raise AudioparityError(f"{where}: d_model={encoder.d_model} is not a multiple of "
                                   f"{key}={heads}")
    if not decoder.tie_word_embeddings:
        raise AudioparityError(f"{where}: tie_word_embeddings=false is not supported by the "
                               "ggml port (the logits are embed_tokens applied as proj_out)")
    if features.feature_size != encoder.num_mel_bins:
        raise AudioparityError(f"{preprocessor_where}: feature_size={features.feature_size}; "
                               f"expected num_mel_bins={encoder.num_mel_bins} of {where}")
    if features.nb_max_frames != 2 * encoder.max_source_positions:
        raise AudioparityError(
            f"{preprocessor_where}: chunk_length={features.chunk_length} s gives "
            f"{features.nb_max_frames} mel frames; WhisperEncoder takes exactly "
            f"2 * max_source_positions = {2 * encoder.max_source_positions}")
    if features.dither != 0.0:
        raise AudioparityError(f"{preprocessor_where}: dither={features.dither} is not "
                               "supported (random noise; expected 0.0)")
    if features.n_fft // 2 >= features.n_samples:
        raise AudioparityError(f"{preprocessor_where}: n_fft={features.n_fft} is too long for "
                               f"n_samples={features.n_samples} (reflect padding)")
    return WhisperModelConfig(encoder=encoder, decoder=decoder, feature_extractor=features,
                              generation=parse_generation(generation, decoder,
                                                          generation_where))


def read_json(path: Path) -> Any:
    """The parsed JSON of ``path``.

    Raises:
        AudioparityError: a missing or unreadable file, or not JSON.
    """
    if not path.is_file():
        raise AudioparityError(f"{path}: no such file; a Whisper checkpoint directory holds "
                               f"{CONFIG_FILE}, {PREPROCESSOR_FILE} and {GENERATION_FILE}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise AudioparityError(f"{path}: unreadable JSON ({err})") from None


def load_config(model_dir: Path) -> WhisperModelConfig:
    """The config of the checkpoint directory ``model_dir`` (:func:`parse_config` of its
    ``config.json``, ``preprocessor_config.json`` and ``generation_config.json``).

    Raises:
        AudioparityError: not a directory, a missing or unreadable file, or an unusable config.
    """
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise AudioparityError(f"{model_dir}: no such checkpoint directory; expected a Hugging "
                               f"Face Whisper directory ({CONFIG_FILE}, model.safetensors, "
                               f"{PREPROCESSOR_FILE}, {GENERATION_FILE})")
    paths = [model_dir / name for name in (CONFIG_FILE, PREPROCESSOR_FILE, GENERATION_FILE)]
    return parse_config(*map(read_json, paths), *map(str, paths))
