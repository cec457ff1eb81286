"""Parakeet-TDT hyper-parameters, read from a NeMo ``.nemo`` or a Hugging Face Parakeet directory.

Field names are NeMo's (``model_config.yaml``: ``preprocessor``, ``encoder``, ``decoder.prednet``,
``joint.jointnet``, ``decoding``); defaults are those of the NeMo modules the config
instantiates (``AudioToMelSpectrogramPreprocessor``, ``ConformerEncoder``, ``RNNTDecoder``,
``RNNTJoint``). A Hugging Face checkpoint (``config.json`` of ``ParakeetForTDT`` plus an optional
``preprocessor_config.json``) is mapped back to these names, inverting transformers'
``convert_nemo_to_hf.py``.

Settings are read as NeMo reads them: a null is a null (``preemph: null``: no pre-emphasis), -1
defaults are resolved (``subsampling_conv_channels: -1``: ``d_model``), named values are
converted (``log_zero_guard_value: tiny``). Only the architecture the ggml port implements is
accepted (:data:`.settings.SETTINGS` says which values of which settings): any other setting
raises :class:`AudioparityError` with one line naming the setting and the value found, when the
config is read, before anything runs.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from audioparity.checkpoints.nemo import read_nemo_member
from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.settings import SETTINGS, refusal, refused

#: ``torch.nn.LayerNorm`` / ``torch.nn.BatchNorm1d`` default eps (NeMo does not override it).
NORM_EPS = 1e-5
#: ``log_zero_guard_value`` names NeMo's ``FilterbankFeatures`` accepts, as float32 ``finfo``
#: attributes of the (float32) features.
NAMED_GUARDS = ("tiny", "eps")
#: Symbols per frame when the decoding config names none (``GreedyBatchedRNNTInferConfig``'s
#: ``max_symbols_per_step``, which NeMo merges into the model's decoding config).
MAX_SYMBOLS = 10


@dataclass(frozen=True)
class PreprocessorConfig:
    """``preprocessor`` (NeMo ``AudioToMelSpectrogramPreprocessor`` arguments and defaults)."""

    sample_rate: int = 16000
    window_size: float = 0.02
    window_stride: float = 0.01
    window: str = "hann"
    normalize: str = "per_feature"
    n_fft: int | None = None
    preemph: float | None = 0.97
    features: int = 64
    lowfreq: float = 0.0
    highfreq: float | None = None
    log: bool = True
    log_zero_guard_type: str = "add"
    log_zero_guard_value: float = 2.0**-24
    dither: float = 1e-5
    pad_to: int = 16
    frame_splicing: int = 1
    exact_pad: bool = False
    pad_value: float = 0.0
    mag_power: float = 2.0
    mel_norm: str = "slaney"

    @property
    def win_length(self) -> int:
        """Window length in samples (``int(window_size * sample_rate)``, as NeMo computes it)."""
        return int(self.window_size * self.sample_rate)

    @property
    def hop_length(self) -> int:
        """Hop in samples (``int(window_stride * sample_rate)``)."""
        return int(self.window_stride * self.sample_rate)


@dataclass(frozen=True)
class EncoderConfig:
    """``encoder`` (NeMo ``ConformerEncoder`` arguments and defaults); ``subsampling_conv_channels``
    -1 is resolved to ``d_model``, as ``ConformerEncoder`` does."""

    feat_in: int
    n_layers: int
    d_model: int
    feat_out: int = -1
    subsampling: str = "striding"
    subsampling_factor: int = 4
    subsampling_conv_channels: int = -1
    causal_downsampling: bool = False
    ff_expansion_factor: int = 4
    self_attention_model: str = "rel_pos"
    n_heads: int = 4
    att_context_size: tuple[int, int] = (-1, -1)
    global_tokens: int = 0
    xscaling: bool = True
    untie_biases: bool = True
    pos_emb_max_len: int = 5000
    conv_kernel_size: int = 31
    conv_norm_type: str = "batch_norm"
    conv_context_size: int | None = None
    use_bias: bool = True
    layer_norm_eps: float = NORM_EPS
    batch_norm_eps: float = NORM_EPS

    def __post_init__(self) -> None:
        if self.subsampling_conv_channels == -1:
            object.__setattr__(self, "subsampling_conv_channels", self.d_model)

    @property
    def d_ff(self) -> int:
        """Feed-forward hidden size (``d_model * ff_expansion_factor``)."""
        return self.d_model * self.ff_expansion_factor

    @property
    def d_k(self) -> int:
        """Attention head size (``d_model // n_heads``)."""
        return self.d_model // self.n_heads

    def subsampled_length(self, length: int) -> int:
        """``calc_length`` of NeMo's ``ConvSubsampling`` (dw_striding, striding):
        ``log2(factor)`` times
        ``(length + 1 + 1 - 3) // 2 + 1`` (kernel 3, stride 2, padding 1 each side, floor). The
        same for mel frames (``T -> T'``) and for mel bins (``n_mels -> F'``, the width the
        ``out`` projection flattens)."""
        for _ in range(int(math.log2(self.subsampling_factor))):
            length = (length + 2 - 3) // 2 + 1
        return length

    @property
    def local_context(self) -> int | None:
        """The window ``w`` of ``rel_pos_local_attn`` (``att_context_size = [w, w]``: each
        query sees the keys ``w`` frames before it to ``w`` after it), or None for full
        context (``rel_pos``)."""
        if self.self_attention_model != "rel_pos_local_attn":
            return None
        return int(self.att_context_size[0])

    def pos_emb_rows(self, n_frames: int) -> int:
        """Rows of the relative positional encoding fed to the layers: ``2T'-1`` (positions
        ``T'-1 ... -(T'-1)``, NeMo ``RelPositionalEncoding``) or, with local attention,
        ``2w+1`` (positions ``w ... -w``, NeMo ``LocalAttRelPositionalEncoding``)."""
        w = self.local_context
        return 2 * n_frames - 1 if w is None else 2 * w + 1

    @property
    def xscale(self) -> float | None:
        """``sqrt(d_model)`` if ``xscaling`` else None (NeMo ``RelPositionalEncoding.xscale``)."""
        return math.sqrt(self.d_model) if self.xscaling else None

    def attention_bytes(self, n_frames: int) -> int:
        """About how many bytes the NeMo reference's encoder holds at its peak over
        ``n_frames`` encoder frames, beyond the model (T' = ``n_frames``, float32 unless said):

        - attention: full context (``RelPositionMultiHeadAttention``) runs in chunks of query
          rows (:class:`~.chunked_attention.ChunkedRelPosAttention`), one chunk's
          :data:`~audioparity.dumping.memory.REFERENCE_SCORE_COPIES` ``[H, r, T']`` tensors, within
          :data:`~audioparity.dumping.memory.ATTENTION_CHUNK_BYTES` (one row at least); a local
          window ``w`` (``RelPositionMultiHeadAttentionLongformer``) holds about 11 ``[H, T',
          2w+1]``;
        - ``ConformerEncoder._create_masks``: ``[T', T']`` bools (full context only), counted 8
          times;
        - ``ConvSubsampling``: the first conv's output ``[C, T_mel/2, n_mels/2]`` (``T_mel =
          8 T'`` at x8), counted 1.25 times;
        - the taps of every layer (``[T', D]`` each) and a layer's working set (feed-forward
          ``[T', 4D]``, attention's q, k, v, p, the conv module's ``[T', 2D]``), counted as
          ``n_layers + 16`` ``[T', D]``.

        Calibrated on the v3 shape (peak RSS of the reference, BENCHMARKS.md "Long audio"): with
        :func:`~audioparity.dumping.memory.reference_bytes` it gives 10.2 and 20.5 GiB at 10 and 30
        minutes (T' 7501 and 22501), where the reference peaked at 9.5 and 19.4 GiB. Counting
        4 masks, the number ``_create_masks`` builds by its code, fell 0.9 GiB short at 30
        minutes: the peak's growth between the two is quadratic beyond the linear terms.
        """
        from audioparity.dumping.memory import (
            REFERENCE_SCORE_COPIES,
            attention_chunk_rows,
        )

        if self.local_context is None:
            row = REFERENCE_SCORE_COPIES * self.n_heads * n_frames * 4
            scores = attention_chunk_rows(n_frames, row) * row
            masks = 8 * n_frames**2
        else:
            scores, masks = 11 * self.n_heads * n_frames * (2 * self.local_context + 1) * 4, 0
        mel_frames = n_frames * self.subsampling_factor
        channels = self.subsampling_conv_channels
        conv = 5 * channels * (mel_frames // 2) * (self.feat_in // 2)  # 1.25 float32
        layers = (self.n_layers + 16) * n_frames * self.d_model * 4
        return scores + masks + conv + layers

    def position_table_note(self, n_frames: int) -> str | None:
        """What happens to ``n_frames`` encoder frames beyond ``pos_emb_max_len``, or None.

        There is no hard limit on either side: NeMo's ``ConformerEncoder.forward`` calls
        ``update_max_seq_length``, which rebuilds the ``RelPositionalEncoding`` table for the
        longer input (``set_max_audio_length``), and the port computes the table for the
        frames it is given (:func:`~audioparity.models.parakeet_tdt.positions.rel_pos_encoding`).
        Both dumps record this note; the cost is attention's ``T'^2`` memory.
        """
        if n_frames <= self.pos_emb_max_len:
            return None
        return (f"T'={n_frames} encoder frames exceed pos_emb_max_len={self.pos_emb_max_len}: "
                "NeMo extends its position table (update_max_seq_length), the port computes "
                "positions for any length")


@dataclass(frozen=True)
class DecoderConfig:
    """``decoder`` (NeMo ``RNNTDecoder``): prediction network sizes and the vocabulary;
    ``rnn_hidden_size`` is the LSTM's width (-1: ``pred_hidden``; larger: an LSTM projecting
    back to ``pred_hidden``, which the port refuses)."""

    vocab_size: int
    pred_hidden: int
    pred_rnn_layers: int = 1
    rnn_hidden_size: int = -1


@dataclass(frozen=True)
class JointConfig:
    """``joint`` (NeMo ``RNNTJoint``): ``num_classes`` excludes the blank; TDT adds
    ``num_extra_outputs`` duration logits."""

    num_classes: int
    joint_hidden: int
    encoder_hidden: int
    pred_hidden: int
    activation: str = "relu"
    num_extra_outputs: int = 0


@dataclass(frozen=True)
class CtcConfig:
    """A CTC decoder (NeMo ``ConvASRDecoder``): a 1x1 Conv1d ``feat_in -> num_classes + 1``
    (the blank last) then log-softmax. ``prefix`` is its module's name in the model:
    ``decoder`` in ``EncDecCTCModelBPE``, ``ctc_decoder`` in ``EncDecHybridRNNTCTCBPEModel``."""

    feat_in: int
    num_classes: int
    prefix: str = "decoder"


@dataclass(frozen=True)
class ParakeetTDTConfig:
    """Everything the ggml port needs to build the encoder and the decoders: a transducer
    (``decoder`` prediction network and ``joint``, TDT with ``durations`` or RNNT without), a
    CTC decoder (``ctc``), or both (the hybrid TDT+CTC model)."""

    preprocessor: PreprocessorConfig
    encoder: EncoderConfig
    decoder: DecoderConfig | None
    joint: JointConfig | None
    durations: tuple[int, ...]
    max_symbols: int | None = MAX_SYMBOLS
    ctc: CtcConfig | None = None

    @property
    def vocab_size(self) -> int:
        """Tokenizer pieces V (without the blank)."""
        return self.decoder.vocab_size if self.decoder is not None else self.ctc.num_classes

    @property
    def blank_id(self) -> int:
        """Index of the blank class (the last token class, ``vocab_size``), of every decoder."""
        return self.vocab_size

    @property
    def transducer(self) -> bool:
        """The model has a transducer (prediction network and joint): TDT or RNNT."""
        return self.joint is not None

    @property
    def min_samples(self) -> int:
        """Fewest audio samples that give one encoder frame: one hop (``hop_length``).

        NeMo's featurizer gives ``T = L // hop_length`` mel frames and ConvSubsampling's
        ``calc_length`` maps ``T >= 1`` to ``T' >= 1`` encoder frames; ``T = 0`` leaves the
        encoder nothing (and NeMo's relative positions an empty table).
        """
        return self.preprocessor.hop_length

    @property
    def n_joint_outputs(self) -> int:
        """Width of the joint output: ``V + 1 + n_durations``."""
        return self.joint.num_classes + 1 + self.joint.num_extra_outputs


def _pick(cls, section: dict, where: str):
    """Build dataclass ``cls`` from the keys of ``section`` it declares (others are ignored). A
    null is kept for a field that may be None (``preemph: null``: no pre-emphasis, as NeMo
    reads it) and means the default for the others."""
    nullable = {f.name for f in fields(cls) if "None" in str(f.type)}
    values = {k: v for k, v in section.items()
              if any(f.name == k for f in fields(cls)) and (v is not None or k in nullable)}
    try:
        return cls(**values)
    except TypeError as err:
        raise AudioparityError(f"{where}: {err}") from None


def _require(where: str, key: str, value, allowed) -> None:
    """Refuse ``value`` of the setting ``key`` (``encoder.subsampling``) unless it is one of
    ``allowed``: :func:`~.settings.refusal`'s line, after ``where``."""
    if value not in allowed:
        raise AudioparityError(f"{where}: {refusal(key, value)}")


def _validate(config: ParakeetTDTConfig, where: str) -> ParakeetTDTConfig:
    """``config`` when the port implements it, checked by :data:`~.settings.SETTINGS`' fixed
    values and the rules of the settings whose values depend on others.

    Raises:
        AudioparityError: one line naming the first setting the port does not implement.
    """
    enc = config.encoder
    for key in ("subsampling", "causal_downsampling", "self_attention_model", "conv_norm_type"):
        _require(where, f"encoder.{key}", getattr(enc, key), SETTINGS["encoder"][key].supported)
    context = tuple(enc.att_context_size)
    if enc.self_attention_model == "rel_pos":
        _require(where, "encoder.att_context_size", context, ((-1, -1),))
    elif (len(context) != 2 or not all(isinstance(c, int) for c in context)
          or context[0] != context[1] or context[0] < 1):
        # NeMo's RelPositionMultiHeadAttentionLongformer adds the positional scores to the
        # columns of a [w, w] window (w = max(L, R)): only L == R is a consistent band.
        _require(where, "encoder.att_context_size", context, ())
    else:  # Longformer's global tokens attend to and from every frame
        _require(where, "encoder.global_tokens", enc.global_tokens, (0,))
    _require(where, "encoder.feat_out", enc.feat_out, (-1, enc.d_model))
    _require(where, "encoder.conv_context_size", enc.conv_context_size,
             (None, (enc.conv_kernel_size - 1) // 2, [(enc.conv_kernel_size - 1) // 2] * 2))
    if enc.subsampling_factor & (enc.subsampling_factor - 1) or enc.subsampling_factor < 2:
        _require(where, "encoder.subsampling_factor", enc.subsampling_factor, ())
    if config.decoder is not None:
        _require(where, "decoder.prednet.rnn_hidden_size", config.decoder.rnn_hidden_size,
                 (-1, config.decoder.pred_hidden))
    if enc.d_model % enc.n_heads:
        raise AudioparityError(
            f"{where}: encoder.d_model={enc.d_model} is not a multiple of n_heads={enc.n_heads}"
        )
    if config.decoder is None and config.ctc is None:
        raise AudioparityError(f"{where}: neither a transducer (decoder + joint) nor a CTC "
                               "decoder (ConvASRDecoder)")
    if config.ctc is not None:
        _require(where, f"{config.ctc.prefix}.feat_in", config.ctc.feat_in, (enc.d_model,))
        if config.decoder is not None:
            _require(where, f"{config.ctc.prefix}.num_classes", config.ctc.num_classes,
                     (config.decoder.vocab_size,))
    if config.joint is not None and config.joint.num_extra_outputs != len(config.durations):
        raise AudioparityError(
            f"{where}: joint.num_extra_outputs={config.joint.num_extra_outputs} but "
            f"{len(config.durations)} durations {list(config.durations)}"
        )
    return config


def from_nemo_config(cfg: dict, where: str = "model_config.yaml") -> ParakeetTDTConfig:
    """Config from a NeMo ``model_config.yaml`` (already parsed to a dict).

    Raises:
        AudioparityError: a missing section or an architecture the port does not implement.
    """
    for section in ("preprocessor", "encoder", "decoder"):
        if not isinstance(cfg.get(section), dict):
            raise AudioparityError(f"{where}: no {section!r} section")
    _refuse_unsupported(cfg, where)
    encoder = dict(cfg["encoder"])
    if encoder.get("att_context_size") is not None:
        encoder["att_context_size"] = tuple(encoder["att_context_size"])
    ctc = None
    if _is_ctc_decoder(cfg["decoder"]):  # EncDecCTCModelBPE: the decoder is the CTC head
        ctc, decoder, joint = _pick(CtcConfig, cfg["decoder"], f"{where} decoder"), None, None
    else:
        if not isinstance(cfg.get("joint"), dict):
            raise AudioparityError(f"{where}: no 'joint' section")
        decoder = _pick(DecoderConfig, {**cfg["decoder"], **cfg["decoder"].get("prednet", {})},
                        f"{where} decoder")
        joint = _pick(JointConfig, {**cfg["joint"], **cfg["joint"].get("jointnet", {})},
                      f"{where} joint")
        aux = (cfg.get("aux_ctc") or {}).get("decoder")
        if isinstance(aux, dict):  # EncDecHybridRNNTCTCBPEModel: aux_ctc.decoder
            if not _is_ctc_decoder(aux):
                raise AudioparityError(f"{where}: aux_ctc.decoder._target_="
                                       f"{aux.get('_target_')!r} is not a ConvASRDecoder")
            ctc = _pick(CtcConfig, {**aux, "prefix": "ctc_decoder"}, f"{where} aux_ctc.decoder")
    decoding = cfg.get("decoding") or {}
    greedy = decoding.get("greedy") or {}
    durations = (decoding.get("durations") or cfg.get("model_defaults", {}).get("tdt_durations")
                 or []) if joint is not None else []
    config = ParakeetTDTConfig(
        preprocessor=_pick(PreprocessorConfig, _preprocessor(cfg["preprocessor"], where),
                           f"{where} preprocessor"),
        encoder=_pick(EncoderConfig, encoder, f"{where} encoder"),
        decoder=decoder,
        joint=joint,
        durations=tuple(int(d) for d in durations),
        # RNNTDecoding reads max_symbols, then max_symbols_per_step (default MAX_SYMBOLS)
        max_symbols=(greedy.get("max_symbols")
                     or greedy.get("max_symbols_per_step", MAX_SYMBOLS)),
        ctc=ctc,
    )
    return _validate(config, where)


def _refuse_unsupported(cfg: dict, where: str) -> None:
    """Refuse the first setting of ``cfg`` whose value :data:`~.settings.SETTINGS` says the port
    does not implement (the CTC head's settings under its own path).

    Raises:
        AudioparityError: ``"<where>: encoder.reduction: pooling is not supported by the ggml
            port (supported: null)"``.
    """
    ctc_model = _is_ctc_decoder(cfg["decoder"])  # its decoder is the CTC head
    paths = {table: table for table in SETTINGS
             if not (ctc_model and table.startswith("decoder"))}
    paths["ctc"] = "decoder" if ctc_model else "aux_ctc.decoder"
    for table, path in paths.items():
        section = cfg
        for key in path.split("."):
            section = section.get(key) if isinstance(section, dict) else None
        if isinstance(section, dict) and (line := refused(path, table, section)):
            raise AudioparityError(f"{where}: {line}")


def _preprocessor(section: dict, where: str) -> dict:
    """``preprocessor`` with ``log_zero_guard_value`` a number, as NeMo's ``FilterbankFeatures``
    reads a name (:data:`NAMED_GUARDS`: that attribute of ``torch.finfo(float32)``).

    Raises:
        AudioparityError: a guard value that is neither a number nor one of the names.
    """
    guard = section.get("log_zero_guard_value")
    if not isinstance(guard, str):
        return section
    if guard not in NAMED_GUARDS:
        raise AudioparityError(f"{where}: preprocessor.log_zero_guard_value: {guard!r} is neither "
                               f"a number nor one of {', '.join(NAMED_GUARDS)}")
    return {**section, "log_zero_guard_value": float(getattr(np.finfo(np.float32), guard))}


def _is_ctc_decoder(section: dict) -> bool:
    """A decoder section of NeMo's ``ConvASRDecoder`` (the CTC head)."""
    return str(section.get("_target_", "")).rsplit(".", 1)[-1] == "ConvASRDecoder"


def from_hf_config(cfg: dict, preprocessor: dict | None = None,
                   where: str = "config.json") -> ParakeetTDTConfig:
    """Config from a Hugging Face ``ParakeetForTDT`` ``config.json`` (and, when present, its
    ``preprocessor_config.json`` of ``ParakeetFeatureExtractor``), mapped to NeMo's names.

    Raises:
        AudioparityError: not a TDT config, or an architecture the port does not implement.
    """
    if cfg.get("model_type") != "parakeet_tdt" or not isinstance(cfg.get("encoder_config"), dict):
        raise AudioparityError(
            f"{where}: model_type={cfg.get('model_type')!r}; expected 'parakeet_tdt' with an "
            "encoder_config"
        )
    encoder = _hf_encoder(cfg["encoder_config"], where)
    vocab = cfg.get("vocab_size", 8193) - 1  # HF counts the blank
    hidden_pred = cfg.get("decoder_hidden_size", 640)
    durations = tuple(int(d) for d in cfg.get("durations", (0, 1, 2, 3, 4)))
    config = ParakeetTDTConfig(
        preprocessor=_hf_preprocessor(preprocessor or {}, encoder.feat_in),
        encoder=encoder,
        decoder=DecoderConfig(vocab_size=vocab, pred_hidden=hidden_pred,
                              pred_rnn_layers=cfg.get("num_decoder_layers", 2)),
        joint=JointConfig(num_classes=vocab, joint_hidden=hidden_pred,
                          encoder_hidden=encoder.d_model, pred_hidden=hidden_pred,
                          activation=cfg.get("hidden_act", "relu"),
                          num_extra_outputs=len(durations)),
        durations=durations,
        max_symbols=cfg.get("max_symbols_per_step", 10),
    )
    return _validate(config, where)


def _hf_encoder(enc: dict, where: str) -> EncoderConfig:
    """The ``encoder`` of a Hugging Face ``encoder_config`` (transformers' defaults).

    Raises:
        AudioparityError: a subsampling other than dw_striding's, attention and convolution
            biases that differ, or a feed-forward size that is not a multiple of the hidden's.
    """
    hidden = enc.get("hidden_size", 1024)
    kernel_stride = (enc.get("subsampling_conv_kernel_size", 3),
                     enc.get("subsampling_conv_stride", 2))
    if kernel_stride != (3, 2):
        raise AudioparityError(f"{where}: subsampling kernel/stride {kernel_stride} is not "
                               "dw_striding's (3, 2)")
    if enc.get("attention_bias", True) != enc.get("convolution_bias", True):
        raise AudioparityError(f"{where}: attention_bias != convolution_bias has no NeMo use_bias")
    intermediate = enc.get("intermediate_size", 4096)
    if intermediate % hidden:
        raise AudioparityError(f"{where}: intermediate_size={intermediate} is not a multiple of "
                               f"hidden_size={hidden}")
    return EncoderConfig(
        feat_in=enc.get("num_mel_bins", 80),
        n_layers=enc.get("num_hidden_layers", 24),
        d_model=hidden,
        subsampling="dw_striding",
        subsampling_factor=enc.get("subsampling_factor", 8),
        subsampling_conv_channels=enc.get("subsampling_conv_channels", 256),
        ff_expansion_factor=intermediate // hidden,
        n_heads=enc.get("num_attention_heads", 8),
        xscaling=enc.get("scale_input", True),
        pos_emb_max_len=enc.get("max_position_embeddings", 5000),
        conv_kernel_size=enc.get("conv_kernel_size", 9),
        use_bias=enc.get("attention_bias", True),
    )


def _hf_preprocessor(pre: dict, feat_in: int) -> PreprocessorConfig:
    """The ``preprocessor`` of a ``preprocessor_config.json`` (``ParakeetFeatureExtractor``;
    empty: its defaults, ``feat_in`` mel bins)."""
    sample_rate = pre.get("sampling_rate", 16000)
    return PreprocessorConfig(
        sample_rate=sample_rate,
        window_size=pre.get("win_length", 400) / sample_rate,
        window_stride=pre.get("hop_length", 160) / sample_rate,
        n_fft=pre.get("n_fft", 512),
        preemph=pre.get("preemphasis", 0.97),
        features=pre.get("feature_size", feat_in),
        pad_value=pre.get("padding_value", 0.0),
    )


def load_config(model: Path) -> ParakeetTDTConfig:
    """Config of a ``.nemo`` file or of a Hugging Face Parakeet directory (``config.json``).

    Raises:
        AudioparityError: the path is neither, or its config is unusable.
    """
    model = Path(model)
    if model.is_dir():
        config_json = model / "config.json"
        if not config_json.is_file():
            raise AudioparityError(f"{model}: a model directory needs config.json (Hugging Face "
                                   "Parakeet); expected that or a .nemo file")
        pre_json = model / "preprocessor_config.json"
        pre = read_json(pre_json) if pre_json.is_file() else None
        return from_hf_config(read_json(config_json), pre, where=str(config_json))
    if not model.exists():
        raise AudioparityError(f"{model}: no such .nemo file or model directory")
    if not model.is_file():
        raise AudioparityError(f"{model}: not a regular file; expected a .nemo file or a model "
                               "directory")
    import yaml

    where = f"{model}:model_config.yaml"
    try:
        # libyaml's loader when PyYAML has it: a 0.6B model's config lists 8192 pieces
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
        cfg = yaml.load(read_nemo_member(model, "model_config.yaml"), Loader=loader)  # noqa: S506
    except yaml.YAMLError as err:
        raise AudioparityError(f"{where}: not YAML ({str(err).splitlines()[0]})") from None
    if not isinstance(cfg, dict):
        raise AudioparityError(f"{where}: expected a mapping, got {type(cfg).__name__}")
    return from_nemo_config(cfg, where=where)


def read_json(path: Path) -> dict:
    """A JSON object from ``path``.

    Raises:
        AudioparityError: unreadable, not JSON, or not an object.
    """
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as err:
        raise AudioparityError(f"{path}: unreadable JSON ({err})") from None
    if not isinstance(value, dict):
        raise AudioparityError(f"{path}: expected a JSON object, got {type(value).__name__}")
    return value
