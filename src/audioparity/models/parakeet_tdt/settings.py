"""Every setting of a NeMo Parakeet model config (TDT, RNNT, CTC and the hybrid), and what the ggml
port does with it: the one table that :mod:`.config` refuses from and ``docs/parakeet-settings.md``
is generated from (:func:`markdown`).

The sections and names are those of the NeMo modules a Parakeet ``model_config.yaml``
instantiates: ``preprocessor`` (``AudioToMelSpectrogramPreprocessorConfig``), ``encoder``
(``ConformerEncoder.__init__``), ``decoder`` and ``decoder.prednet`` (``RNNTDecoder``), ``joint``
and ``joint.jointnet`` (``RNNTJoint``), ``decoding`` and ``decoding.greedy``
(``RNNTDecodingConfig``, ``GreedyBatchedRNNTInferConfig``), and the CTC head ``ctc``
(``ConvASRDecoder``: ``decoder`` of ``EncDecCTCModelBPE``, ``aux_ctc.decoder`` of the hybrid).
``tests/models/parakeet_tdt/test_settings.py`` walks those NeMo signatures and dataclasses, so a
setting NeMo adds shows up there as unlisted.

Each setting is one of:

- :data:`FOLLOWS`: the port reads it and computes what NeMo computes for any value NeMo takes;
- :data:`LIMITED`: the port implements only some values; :func:`refusal` gives the one-line
  refusal of another (``supported`` lists them; a setting whose supported values depend on
  another, e.g. ``conv_context_size`` on ``conv_kernel_size``, is checked by its rule in
  :mod:`.config` and has ``supported`` None);
- :data:`INERT`: it changes nothing NeMo computes in eval mode for one greedy decode (dropout,
  augmentation, initialisation, training losses, what a hypothesis records), so any value is
  accepted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The joint activations the port computes (``joint.jointnet.activation``; ggml has each).
JOINT_ACTIVATIONS = ("relu", "sigmoid", "tanh")

#: The port computes what NeMo computes for every value.
FOLLOWS = "follows"
#: The port implements some values and refuses the others by name.
LIMITED = "limited"
#: No effect on an eval-mode forward and greedy decode.
INERT = "inert"


@dataclass(frozen=True)
class Setting:
    """One config key: its :data:`FOLLOWS` / :data:`LIMITED` / :data:`INERT` status, what the port
    does with it (``note``), and for a :data:`LIMITED` one the values it implements."""

    status: str
    note: str
    supported: tuple[Any, ...] | None = None


def _f(note: str) -> Setting:
    return Setting(FOLLOWS, note)


def _only(supported: tuple[Any, ...] | None, note: str) -> Setting:
    return Setting(LIMITED, note, supported)


def _inert(note: str) -> Setting:
    return Setting(INERT, note)


_TRAINING = "training only (dropout is off in eval)"
_INIT = "initialisation only; the checkpoint's weights are used"
_RECORD = "what a hypothesis records, not what is decoded"

#: Section (its path in ``model_config.yaml``; ``ctc`` stands for the CTC head's section) ->
#: setting -> :class:`Setting`.
SETTINGS: dict[str, dict[str, Setting]] = {
    "preprocessor": {
        "sample_rate": _f("audio is resampled to it"),
        "window_size": _f("win_length = int(window_size * sample_rate)"),
        "window_stride": _f("hop_length = int(window_stride * sample_rate)"),
        "n_window_size": _only((None,), "the window in samples, overriding window_size"),
        "n_window_stride": _only((None,), "the hop in samples, overriding window_stride"),
        "window": _f("the checkpoint's stored window; without one (Hugging Face) only hann"),
        "normalize": _only(("per_feature",), "per-feature mean and std over the valid frames"),
        "n_fft": _f("null: the next power of two of the window"),
        "preemph": _f("null or 0: no pre-emphasis"),
        "features": _f("mel bins"),
        "lowfreq": _f("in the checkpoint's stored filterbank"),
        "highfreq": _f("in the checkpoint's stored filterbank (null: sample_rate / 2)"),
        "log": _f("log of the mel energies, or the energies themselves"),
        "log_zero_guard_type": _only(("add", "clamp"), "log(mel + guard) or log(max(mel, guard))"),
        "log_zero_guard_value": _f("a number, or 'tiny' / 'eps' of float32 as NeMo reads them"),
        "dither": _inert("NeMo dithers in training only"),
        "pad_to": _inert("pads frames past the valid ones, which the encoder masks"),
        "frame_splicing": _only((1,), "stacking of neighbouring frames"),
        "exact_pad": _only((False,), "the STFT is centred (reflect-padded) as NeMo's default"),
        "pad_value": _inert("the value of pad_to's frames, which the encoder masks"),
        "mag_power": _f("power of the STFT magnitude"),
        "rng": _inert("dither's generator"),
        "nb_augmentation_prob": _inert("narrow-band augmentation, training only"),
        "nb_max_freq": _inert("narrow-band augmentation, training only"),
        "mel_norm": _f("in the checkpoint's stored filterbank"),
        "use_torchaudio": _inert("deprecated; NeMo ignores it"),
        "stft_exact_pad": _inert("deprecated; NeMo ignores it"),
        "stft_conv": _inert("deprecated; NeMo ignores it"),
    },
    "encoder": {
        "feat_in": _f("mel bins in"),
        "n_layers": _f("conformer layers"),
        "d_model": _f("model width"),
        "feat_out": _only(None, "-1 or d_model: no output projection"),
        "causal_downsampling": _only((False,), "the subsampling convs are symmetric"),
        "subsampling": _only(("dw_striding", "striding"), "ConvSubsampling's 3x3 stride-2 convs"),
        "subsampling_factor": _only(None, "a power of two from 2 (2, 4, 8, 16 tested)"),
        "subsampling_conv_chunking_factor": _inert("splits the convs to save memory, same sums"),
        "subsampling_conv_channels": _f("-1: d_model"),
        "reduction": _only((None,), "time reduction (pooling, striding) inside the layers"),
        "reduction_position": _inert("only with reduction, which is refused"),
        "reduction_factor": _inert("only with reduction, which is refused"),
        "ff_expansion_factor": _f("feed-forward width d_model * factor"),
        "self_attention_model": _only(("rel_pos", "rel_pos_local_attn"),
                                      "relative positions, full context or a local window"),
        "n_heads": _f("attention heads (d_model a multiple of it)"),
        "att_context_size": _only(None, "[-1, -1] with rel_pos, [w, w] with rel_pos_local_attn"),
        "att_context_probs": _inert("training-time choice among several att_context_size"),
        "att_chunk_context_size": _only((None,), "chunked attention"),
        "att_context_style": _only(("regular",), "chunked_limited streaming masks"),
        "xscaling": _f("sqrt(d_model) input scale"),
        "untie_biases": _only((True,), "per-layer pos_bias_u/v"),
        "pos_emb_max_len": _f("the port computes positions for any length, as NeMo extends"),
        "conv_kernel_size": _f("depthwise conv kernel"),
        "conv_norm_type": _only(("batch_norm",), "batch norm, folded into the depthwise conv"),
        "conv_context_size": _only(None, "null or symmetric [(k-1)/2, (k-1)/2]"),
        "conv_context_style": _only(("regular",), "the conv module's context style"),
        "use_bias": _f("biases of the linear layers and convs"),
        "dropout": _inert(_TRAINING),
        "dropout_pre_encoder": _inert(_TRAINING),
        "dropout_emb": _inert(_TRAINING),
        "dropout_att": _inert(_TRAINING),
        "stochastic_depth_drop_prob": _inert("layer drop, training only"),
        "stochastic_depth_mode": _inert("layer drop, training only"),
        "stochastic_depth_start_layer": _inert("layer drop, training only"),
        "global_tokens": _only(None, "0: Longformer global tokens are not implemented"),
        "global_tokens_spacing": _inert("only with global_tokens, which is refused"),
        "global_attn_separate": _inert("only with global_tokens, which is refused"),
        "use_pytorch_sdpa": _inert("the same attention through torch's fused kernel"),
        "use_pytorch_sdpa_backends": _inert("the same attention through torch's fused kernel"),
        "sync_max_audio_length": _inert("multi-GPU bookkeeping of the position table"),
    },
    "decoder": {
        "vocab_size": _f("tokens without the blank"),
        "normalization_mode": _only((None,), "'layer' is a LayerNorm LSTM"),
        "random_state_sampling": _inert("random LSTM state, training only"),
        "blank_as_pad": _only((True,), "the blank is the embedding's zero padding row"),
    },
    "decoder.prednet": {
        "pred_hidden": _f("embedding and LSTM width"),
        "pred_rnn_layers": _f("LSTM layers"),
        "rnn_hidden_size": _only(None, "-1 or pred_hidden: an LSTM without projection"),
        "t_max": _inert(_INIT),
        "weights_init_scale": _inert(_INIT),
        "hidden_hidden_bias_scale": _inert(_INIT),
        "forget_gate_bias": _inert(_INIT),
        "dropout": _inert(_TRAINING),
    },
    "joint": {
        "num_classes": _f("tokens without the blank"),
        "num_extra_outputs": _f("TDT duration logits (the length of decoding.durations)"),
        "vocabulary": _inert("token strings come from the tokenizer"),
        "log_softmax": _only((None,), "null: log-softmax on CPU, as the reference runs"),
        "preserve_memory": _inert("frees memory in training"),
        "fuse_loss_wer": _inert("training loss fusion"),
        "fused_batch_size": _inert("training loss fusion"),
        "experimental_fuse_loss_wer": _inert("training loss fusion"),
        "masking_prob": _inert("HAINAN decoder-output masking, training only"),
    },
    "joint.jointnet": {
        "joint_hidden": _f("joint width"),
        "activation": _only(JOINT_ACTIVATIONS, "the joint's activation"),
        "encoder_hidden": _f("encoder width into the joint"),
        "pred_hidden": _f("prediction-net width into the joint"),
        "dropout": _inert(_TRAINING),
    },
    "decoding": {
        "model_type": _f("rnnt or tdt, as the joint's extra outputs say"),
        "strategy": _inert("both dumps decode greedily (greedy_batch) whatever the default"),
        "compute_hypothesis_token_set": _inert(_RECORD),
        "preserve_alignments": _inert(_RECORD),
        "tdt_include_token_duration": _inert(_RECORD),
        "confidence_cfg": _inert(_RECORD),
        "fused_batch_size": _inert("training loss fusion"),
        "compute_timestamps": _inert(_RECORD),
        "compute_langs": _inert(_RECORD),
        "word_seperator": _inert(_RECORD),
        "segment_seperators": _inert(_RECORD),
        "segment_gap_threshold": _inert(_RECORD),
        "rnnt_timestamp_type": _inert(_RECORD),
        "greedy": _f("see decoding.greedy"),
        "beam": _inert("beam search is not what the dumps decode"),
        "temperature": _only((1.0,), "joint logits divided by a temperature"),
        "durations": _f("TDT durations (or model_defaults.tdt_durations)"),
        "big_blank_durations": _only(((), []), "multi-blank RNNT"),
        "strip_lang_tags": _inert(_RECORD),
        "lang_tag_pattern": _inert(_RECORD),
    },
    "decoding.greedy": {
        "max_symbols": _f("symbols per frame; read before max_symbols_per_step, as NeMo does"),
        "max_symbols_per_step": _f("symbols per frame when max_symbols is not set"),
        "preserve_alignments": _inert(_RECORD),
        "compute_timestamps": _inert(_RECORD),
        "preserve_frame_confidence": _inert(_RECORD),
        "tdt_include_token_duration": _inert(_RECORD),
        "tdt_include_duration_confidence": _inert(_RECORD),
        "confidence_method_cfg": _inert(_RECORD),
        "loop_labels": _inert("label- or frame-looping, the same decode"),
        "use_cuda_graph_decoder": _inert("the same decode through CUDA graphs"),
        "ngram_lm_model": _only((None,), "shallow fusion with an n-gram LM"),
        "ngram_lm_alpha": _inert("only with ngram_lm_model, which is refused"),
        "boosting_tree": _inert("only with boosting_tree_alpha, which is refused"),
        "boosting_tree_alpha": _only((0, 0.0), "phrase boosting"),
        "enable_per_stream_biasing": _only((False,), "per-stream phrase boosting"),
    },
    "ctc": {
        "feat_in": _f("d_model"),
        "num_classes": _f("tokens without the blank (-1: the vocabulary's)"),
        "init_mode": _inert(_INIT),
        "vocabulary": _inert("token strings come from the tokenizer"),
        "add_blank": _only((True,), "the blank is the last class"),
    },
}


def refusal(path: str, value: Any) -> str:
    """The one-line refusal of ``value`` at ``path`` (``encoder.reduction``), a setting
    :data:`SETTINGS` lists as :data:`LIMITED`: ``"encoder.reduction: pooling is not supported by
    the ggml port (supported: null)"``."""
    section, _, name = path.rpartition(".")
    if section not in SETTINGS:  # the CTC head: decoder or aux_ctc.decoder
        section = "ctc"
    setting = SETTINGS[section][name]
    supported = ("; " + setting.note) if setting.supported is None else \
        " (supported: " + ", ".join(_show(v) for v in setting.supported) + ")"
    return f"{path}: {_show(value)} is not supported by the ggml port{supported}"


def _show(value: Any) -> str:
    """A config value as YAML writes it: ``null``, ``false``, ``pooling``, ``[8, 4]``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_show(v) for v in value) + "]"
    return str(value)


def refused(section_path: str, table: str, section: dict) -> str | None:
    """The refusal of the first setting of ``section`` (the config mapping at ``section_path``,
    described by ``SETTINGS[table]``) whose value the port does not implement, or None. Only
    settings with fixed ``supported`` values; the rules of :mod:`.config` check the others."""
    for name, setting in SETTINGS[table].items():
        if setting.supported is not None and name in section \
                and not _among(section[name], setting.supported):
            return refusal(f"{section_path}.{name}", section[name])
    return None


def _among(value: Any, supported: tuple[Any, ...]) -> bool:
    """``value`` is one of ``supported``, a bool only as a bool (``1`` is not ``True``)."""
    return any(value == s and isinstance(value, bool) == isinstance(s, bool) for s in supported)


def markdown() -> str:
    """``docs/parakeet-settings.md``: the table, one row per setting, section by section."""
    status = {FOLLOWS: "follows", LIMITED: "only", INERT: "no effect"}
    lines = [
        "# Parakeet settings and the ggml port",
        "",
        "Every setting of a NeMo Parakeet model config (TDT, RNNT, CTC, hybrid TDT+CTC) and what",
        "the ggml port does with it. **follows**: computed as NeMo computes it, for any value;",
        "**only**: the values listed are implemented, any other is refused when the config is",
        "read, in one line naming the setting and its value, before anything runs;",
        "**no effect**: changes nothing NeMo computes in eval mode for one greedy decode, so any",
        "value is accepted.",
        "",
        "Generated from `src/audioparity/models/parakeet_tdt/settings.py` (`python -m",
        "audioparity.models.parakeet_tdt.settings > docs/parakeet-settings.md`);",
        "`tests/models/parakeet_tdt/test_settings.py` checks this page against it and the table",
        "against NeMo's own config schema. `ctc` is the CTC head: `decoder` of a CTC model,",
        "`aux_ctc.decoder` of the hybrid.",
    ]
    for section, settings in SETTINGS.items():
        lines += ["", f"## `{section}`", "", "| setting | port | values | what |",
                  "|---|---|---|---|"]
        for name, setting in settings.items():
            values = "" if setting.supported is None else ", ".join(
                f"`{_show(v)}`" for v in setting.supported)
            lines.append(f"| `{name}` | {status[setting.status]} | {values} | {setting.note} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")
