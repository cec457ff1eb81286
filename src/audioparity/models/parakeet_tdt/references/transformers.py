"""transformers' own Parakeet (``ParakeetForTDT``, ``ParakeetForRNNT``, ``ParakeetForCTC``,
``ParakeetFeatureExtractor``) as a second reference of the family: the checkpoint converted in
memory by our own code (a ``.nemo`` or a Hugging Face directory, both read NeMo-named by
:mod:`.checkpoint`), the contract's stages tapped by forward hooks on transformers' modules, and
the decodes transformers' own ``generate()``'s. Importing this module imports neither torch nor
transformers.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, Fields, Note, Outputs, Phase, ReferenceLibrary
from audioparity.contract.taps import Taps
from audioparity.models.parakeet_tdt.checkpoint import (
    NEMO_TRANSFORMERS,
    expected_shapes,
    read_state,
)
from audioparity.models.parakeet_tdt.config import (
    EncoderConfig,
    ParakeetTDTConfig,
    PreprocessorConfig,
)
from audioparity.models.parakeet_tdt.greedy import (
    GreedyPath,
    collapse_ctc,
    ctc_margins,
    decision_margins,
    greedy_ctc,
    joint_decisions,
    replay_path,
)
from audioparity.models.parakeet_tdt.positions import valid_positions
from audioparity.models.parakeet_tdt.spec import Names
from audioparity.models.parakeet_tdt.tokenizer import Tokenizer, load_tokenizer

log = logging.getLogger("audioparity")

#: The log guard ``ParakeetFeatureExtractor`` adds before its log (``LOG_ZERO_GUARD_VALUE``).
LOG_GUARD = 2.0**-24


def n_fft(pre: PreprocessorConfig) -> int:
    """NeMo's FFT size: ``n_fft``, else the power of two at or above the window length."""
    return pre.n_fft or 2 ** int(np.ceil(np.log2(pre.win_length)))


def check_convertible(config: ParakeetTDTConfig, where: Path) -> None:
    """Refuse what transformers' Parakeet cannot express, before torch is imported.

    ``ParakeetFeatureExtractor`` hard-codes a periodic-free Hann window, per-feature
    normalisation, ``log(x + 2**-24)``, a power spectrum, a Slaney filterbank from 0 Hz to
    Nyquist and no frame splicing; ``ParakeetEncoder`` has full-context ``rel_pos`` attention
    only and flattens ``num_mel_bins // 2**k`` subsampled bins; one ``decoder_hidden_size``
    sizes the LSTM, both projections and the joint; TDT's ``generate`` advances by the argmax
    duration's index, so the durations must be ``0 ... n-1``.

    Raises:
        AudioparityError: the first setting it cannot express, naming the key and its value.
    """
    pre, enc = config.preprocessor, config.encoder
    fixed = (("preprocessor.window", pre.window, "hann"),
             ("preprocessor.normalize", pre.normalize, "per_feature"),
             ("preprocessor.log", pre.log, True),
             ("preprocessor.log_zero_guard_type", pre.log_zero_guard_type, "add"),
             ("preprocessor.log_zero_guard_value", pre.log_zero_guard_value, LOG_GUARD),
             ("preprocessor.lowfreq", pre.lowfreq, 0.0),
             ("preprocessor.highfreq", pre.highfreq or pre.sample_rate / 2, pre.sample_rate / 2),
             ("preprocessor.mel_norm", pre.mel_norm, "slaney"),
             ("preprocessor.mag_power", pre.mag_power, 2.0),
             ("preprocessor.frame_splicing", pre.frame_splicing, 1),
             ("preprocessor.exact_pad", pre.exact_pad, False),
             ("encoder.self_attention_model", enc.self_attention_model, "rel_pos"),
             ("encoder.subsampled mel bins", enc.subsampled_length(enc.feat_in),
              enc.feat_in // enc.subsampling_factor))
    if config.joint is not None:
        fixed += (("joint.joint_hidden", config.joint.joint_hidden, config.decoder.pred_hidden),
                  ("decoding.durations", list(config.durations),
                   list(range(len(config.durations)))))
    for key, value, expected in fixed:
        if value != expected:
            raise AudioparityError(
                f"{where}: {key}={value!r}; transformers' Parakeet supports only {expected!r}")


def feature_extractor_settings(pre: PreprocessorConfig) -> dict[str, Any]:
    """``ParakeetFeatureExtractor`` arguments of NeMo's ``AudioToMelSpectrogramPreprocessor``
    settings (``features`` mels, ``window_size``/``window_stride`` seconds as samples,
    ``n_fft``, ``preemph``, ``pad_value``); the rest is fixed (:func:`check_convertible`)."""
    return {"feature_size": pre.features, "sampling_rate": pre.sample_rate,
            "hop_length": pre.hop_length, "win_length": pre.win_length, "n_fft": n_fft(pre),
            "preemphasis": pre.preemph, "padding_value": pre.pad_value}


def encoder_settings(enc: EncoderConfig) -> dict[str, Any]:
    """``ParakeetEncoderConfig`` of NeMo's ``ConformerEncoder`` settings: sizes, Swish
    (``silu``) feed-forward and conv module, ``use_bias`` as both ``attention_bias`` and
    ``convolution_bias``, ``xscaling`` as ``scale_input``, dw_striding's 3x3 stride-2
    subsampling (``subsampling_conv_channels`` -1: ``d_model``), every dropout and layerdrop 0."""
    channels = enc.subsampling_conv_channels
    return {"hidden_size": enc.d_model, "num_hidden_layers": enc.n_layers,
            "num_attention_heads": enc.n_heads, "intermediate_size": enc.d_ff,
            "hidden_act": "silu", "attention_bias": enc.use_bias,
            "convolution_bias": enc.use_bias, "conv_kernel_size": enc.conv_kernel_size,
            "subsampling_factor": enc.subsampling_factor,
            "subsampling_conv_channels": enc.d_model if channels == -1 else channels,
            "num_mel_bins": enc.feat_in, "subsampling_conv_kernel_size": 3,
            "subsampling_conv_stride": 2, "dropout": 0.0, "dropout_positions": 0.0,
            "layerdrop": 0.0, "activation_dropout": 0.0, "attention_dropout": 0.0,
            "max_position_embeddings": enc.pos_emb_max_len, "scale_input": enc.xscaling}


def model_settings(config: ParakeetTDTConfig) -> dict[str, tuple[str, dict[str, Any]]]:
    """The transformers models of a Parakeet, ``"transducer"`` and/or ``"ctc"`` -> (config
    class name, its arguments): ``ParakeetTDTConfig`` (durations) or ``ParakeetRNNTConfig``
    (``RNNTDecoder`` + ``RNNTJoint``: ``vocab_size`` V+1 with the blank V,
    ``decoder_hidden_size`` the LSTM's, ``max_symbols_per_step`` NeMo's ``max_symbols``);
    ``ParakeetCTCConfig`` (``ConvASRDecoder``: V+1 classes, blank V as ``pad_token_id``)."""
    encoder = encoder_settings(config.encoder)
    blank = config.blank_id
    models: dict[str, tuple[str, dict[str, Any]]] = {}
    if config.transducer:
        settings = {"vocab_size": blank + 1, "decoder_hidden_size": config.decoder.pred_hidden,
                    "num_decoder_layers": config.decoder.pred_rnn_layers,
                    "hidden_act": config.joint.activation,
                    "max_symbols_per_step": config.max_symbols, "encoder_config": encoder,
                    "pad_token_id": blank, "blank_token_id": blank}
        if config.durations:
            models["transducer"] = ("ParakeetTDTConfig",
                                    {**settings, "durations": list(config.durations)})
        else:
            models["transducer"] = ("ParakeetRNNTConfig", settings)
    if config.ctc is not None:
        models["ctc"] = ("ParakeetCTCConfig", {"vocab_size": blank + 1, "pad_token_id": blank,
                                               "encoder_config": encoder})
    return models


def state_dicts(state: Mapping[str, np.ndarray], config: ParakeetTDTConfig
                ) -> dict[str, dict[str, np.ndarray]]:
    """The float32 state dict of each model of :func:`model_settings`, from NeMo-named
    tensors (:func:`~.checkpoint.read_state`): the tensors of :func:`~.checkpoint.
    expected_shapes` renamed (:data:`~.checkpoint.NEMO_TRANSFORMERS`); the transducer's
    everything but a
    CTC decoder, the CTC model's the encoder and its decoder. The featurizer buffers (window,
    filterbank) are left out: the feature extractor computes its own."""
    names = expected_shapes(config)
    ctc_prefix = f"{config.ctc.prefix}." if config.ctc is not None else None
    dicts: dict[str, dict[str, np.ndarray]] = {}
    for model in model_settings(config):
        dicts[model] = {
            NEMO_TRANSFORMERS.right(name): state[name] for name in names
            if name.startswith("encoder.")
            or (model == "ctc") == (ctc_prefix is not None and name.startswith(ctc_prefix))}
    return dicts


def load_models(path: Path, config: ParakeetTDTConfig) -> dict[str, Any]:
    """transformers' models of ``config`` (:func:`model_settings`: ``transducer``, ``ctc`` or
    both) in float32, eval mode, the checkpoint's tensors loaded converted
    (:func:`state_dicts`); a hybrid's CTC model shares the transducer's encoder module.

    Raises:
        AudioparityError: what :func:`check_convertible` refuses, or a model parameter the
            converted state does not give (BatchNorm's ``num_batches_tracked`` aside).
    """
    import torch
    import transformers

    state, _ = read_state(path)
    classes = {"ParakeetTDTConfig": "ParakeetForTDT", "ParakeetRNNTConfig": "ParakeetForRNNT",
               "ParakeetCTCConfig": "ParakeetForCTC"}
    models: dict[str, Any] = {}
    for name, (config_class, settings) in model_settings(config).items():
        hf_config = getattr(transformers, config_class)(**settings)
        model = getattr(transformers, classes[config_class])(hf_config).eval()
        tensors = {key: torch.from_numpy(np.array(value, dtype=np.float32))
                   for key, value in state_dicts(state, config)[name].items()}
        missing, unexpected = model.load_state_dict(tensors, strict=False)
        missing = [key for key in missing if not key.endswith("num_batches_tracked")]
        if missing or unexpected:
            raise AudioparityError(f"{path}: transformers' {classes[config_class]} left "
                                   f"{(missing or unexpected)[0]!r} unset or unknown")
        generation = model.generation_config
        generation.decoder_start_token_id = config.blank_id  # NeMo's SOS is the blank
        generation.pad_token_id = config.blank_id
        if config_class == "ParakeetTDTConfig":  # the token argmax leaves the durations out
            generation.suppress_tokens = list(range(config.blank_id + 1,
                                                    config.blank_id + 1 + len(config.durations)))
        models[name] = model
    if "transducer" in models and "ctc" in models:
        models["ctc"].encoder = models["transducer"].encoder
    return models



def features(loaded: Transformers, samples: np.ndarray) -> tuple[Any, Any]:
    """``ParakeetFeatureExtractor`` on one utterance as a user calls it (its sampling rate,
    torch tensors, the attention mask).

    Args:
        samples: ``[L]`` float32 mono samples.

    Returns:
        ``(input_features [1, L//hop + 1, n_mels], attention_mask [1, L//hop + 1])``: the
        STFT's last frame is padding (mask 0, features zeroed).
    """
    out = loaded.extractor(samples, sampling_rate=loaded.config.preprocessor.sample_rate,
                           return_tensors="pt", return_attention_mask=True)
    return out["input_features"], out["attention_mask"]


def _copy(value: Any) -> Any:
    """A tapped tensor kept as a copy (transformers reuses some of its buffers)."""
    return value.detach().clone()


def tap_encoder(taps: Taps, encoder: Any) -> None:
    """Tap transformers' ``ParakeetEncoder``: the subsampling's output (``pre_encode``), the
    ``position_embeddings`` passed to ``layers[0]`` (``pos_emb``) and every ``layers[i]``
    output (``layer_{i}``)."""
    taps.output(Names.PRE_ENCODE, encoder.subsampling)
    taps.input(Names.POS_EMB, encoder.layers[0], "position_embeddings")
    taps.outputs(Names.LAYER, encoder.layers)


def encoder_stages(taps: Taps, n_layers: int, n_frames: int) -> dict[str, np.ndarray]:
    """Canonical arrays of :func:`tap_encoder`'s taps, valid frames only: ``pre_encode [T', D]``
    (before ``scale_input``, as NeMo's ``pre_encode``), ``pos_emb [2T'-1, D]`` (the middle rows,
    :func:`~.nemo.valid_positions`), ``layer_{i} [T', D]``, ``enc_out [T', D]`` (the last
    layer's output: ``ParakeetEncoder`` has no output projection).

    Raises:
        AudioparityError: a hook did not fire exactly once.
    """
    out: dict[str, np.ndarray] = {}
    for name in (Names.PRE_ENCODE, Names.POS_EMB, *(Names.LAYER.at(i) for i in range(n_layers))):
        array = taps.once(name)[0].float().numpy()
        out[name] = (valid_positions(array, n_frames) if name == Names.POS_EMB
                     else array[:n_frames])
    out[Names.ENC_OUT] = out[Names.LAYER.at(n_layers - 1)]
    return out


def generated_path(sequence: list[int], advances: list[int], blank_id: int,
                   tdt: bool) -> tuple[GreedyPath, int]:
    """The path of a transducer ``generate()``: ``sequence`` its ``sequences[0]`` (the start
    token, then one class per joint evaluation), ``advances`` its ``durations[0]`` (0, then the
    frames each evaluation moved on: TDT the duration index, a blank's 0 made 1; RNNT 1 on a
    blank or a forced advance). A token is at the frame it was evaluated at; its TDT duration
    is its advance (the durations are ``0 ... n-1``, :func:`check_convertible`).

    Returns:
        ``(path, the frame after the last evaluation)``.
    """
    path = GreedyPath([], [], [], [], [])
    t = 0
    for label, advance in zip(sequence[1:], advances[1:], strict=True):
        path.row_frames.append(t)
        path.row_history.append(len(path.ids))
        if label != blank_id:
            path.ids.append(label)
            path.frames.append(t)
            if tdt:
                path.durations.append(advance)
        t += advance
    return path, t


def _longest_run(frames: list[int]) -> tuple[int, int]:
    """``(length, frame)`` of the longest run of tokens on one frame."""
    best, frame, run = 0, 0, 0
    for k, t in enumerate(frames):
        run = run + 1 if k and frames[k - 1] == t else 1
        if run > best:
            best, frame = run, t
    return best, frame


def transducer_stages(loaded: Transformers, input_features: Any, attention_mask: Any,
                      n_frames: int) -> Outputs:
    """The encoder's and the transducer's stages of one utterance from one ``generate()`` of
    ``ParakeetForTDT``/``ParakeetForRNNT`` (greedy, batch 1, ``attention_mask`` None or passed): the
    encoder taps (:func:`encoder_stages`), every ``joint`` output row ``[steps,
    V+1+n_durations]`` (``joint_logits``), the LSTM state after its first step (the start
    token, the blank) as ``[layers, 2, H]`` (``lstm_state_0``), the decode of
    :func:`generated_path` and its margins (:func:`~.greedy.decision_margins` along that path),
    and ``decode_logits``, the joint rows again (its decode teacher-forced along its own path
    on its own ``enc_out``).

    Raises:
        AudioparityError: the joint rows replayed under transformers' rules (TDT without a
            symbol limit) do not reproduce ``generate()``'s path.
    """
    import torch

    model, config = loaded.transducer, loaded.config
    with Taps("transformers encoder", keep=_copy) as taps:
        tap_encoder(taps, model.encoder)
        taps.output("joint", model.joint, keep=lambda out: out.reshape(-1, out.shape[-1]).float())
        taps.output("lstm", model.decoder.lstm, keep=lambda out: torch.stack(
            [state[:, 0].float() for state in out[1]], dim=1))
        generated = model.generate(input_features=input_features, attention_mask=attention_mask)
    yield from encoder_stages(taps, config.encoder.n_layers, n_frames).items()
    tdt = bool(config.durations)
    joint_logits = torch.cat(taps.all("joint")).numpy()
    path, end = generated_path(generated.sequences[0].tolist(), generated.durations[0].tolist(),
                               config.blank_id, tdt)
    limit = None if tdt else config.max_symbols
    if end >= n_frames:
        replay = replay_path(joint_logits, n_frames, list(config.durations), limit)
        if (replay.ids, replay.frames, replay.durations) != (path.ids, path.frames,
                                                            path.durations):
            raise AudioparityError("joint_logits: the greedy replay of transformers' joint rows "
                                   f"gives ids {replay.ids[:20]}..., its generate() "
                                   f"{path.ids[:20]}...")
    else:
        yield Note(f"decode: transformers' generate() stopped at max_length after "
                   f"{len(joint_logits)} joint steps, at frame {end} of {n_frames}")
    run, frame = _longest_run(path.frames)
    if tdt and run > config.max_symbols:
        yield Note(f"decode: transformers' TDT generate() has no max_symbols limit: {run} tokens "
                   f"in a row at frame {frame}, where NeMo moves on after {config.max_symbols}")
    decode = {"ids": path.ids, "frames": path.frames, "durations": path.durations,
              "text": loaded.tokenizer.ids_to_text(path.ids)}
    yield Fields({"decoding": {"strategy": "transformers generate (greedy)",
                               "durations": list(config.durations),
                               "max_symbols": limit}})
    yield Names.JOINT_LOGITS, joint_logits
    yield Names.LSTM_STATE_0, taps.all("lstm")[0].numpy()
    yield Names.DECODE, decode
    yield Names.DECODE_MARGINS, decision_margins(joint_logits, path, len(config.durations))
    yield Names.DECODE_LOGITS, joint_logits
    yield Fields({"decisions": joint_decisions(joint_logits.shape[1], len(config.durations))})
    log.info("reference parakeet-tdt (transformers): decoded %d tokens in %d joint steps",
             len(path.ids), len(joint_logits))


def ctc_stages(loaded: Transformers, input_features: Any, attention_mask: Any,
               n_frames: int, with_encoder: bool) -> Outputs:
    """The CTC decoder's stages from one ``ParakeetForCTC.generate()`` (its ``sequences``:
    the argmax of every frame; ``return_dict_in_generate`` for its ``logits``): ``ctc_logits
    [T', V+1]`` the log-softmax of its raw ``ctc_head`` logits (NeMo's ``ConvASRDecoder``
    returns log-probabilities), ``ctc_decode`` the sequence folded (:func:`~.greedy.
    collapse_ctc`) and its margins; with ``with_encoder``, the encoder's stages of that run
    first.

    Raises:
        AudioparityError: the argmax of the log-probabilities is not ``generate()``'s.
    """
    import torch

    model = loaded.ctc
    with Taps("transformers encoder", keep=_copy) as taps:
        if with_encoder:
            tap_encoder(taps, model.encoder)
        generated = model.generate(input_features=input_features, attention_mask=attention_mask,
                                   return_dict_in_generate=True)
    if with_encoder:
        yield from encoder_stages(taps, loaded.config.encoder.n_layers, n_frames).items()
    blank = loaded.config.blank_id
    ctc_logits = torch.log_softmax(generated.logits[0, :n_frames].float(), dim=-1).numpy()
    path = collapse_ctc(generated.sequences[0, :n_frames].tolist(), blank)
    replay = greedy_ctc(ctc_logits, blank)
    if (replay.ids, replay.frames) != (path.ids, path.frames):
        raise AudioparityError(f"ctc_logits: their greedy CTC gives ids {replay.ids[:20]}..., "
                               f"transformers' generate() {path.ids[:20]}...")
    yield Fields({"ctc_decoding": {"strategy": "transformers generate (argmax)"}})
    yield Names.CTC_LOGITS, ctc_logits
    yield Names.CTC_DECODE, {"ids": path.ids, "frames": path.frames,
                             "text": loaded.tokenizer.ids_to_text(path.ids)}
    yield Names.CTC_DECODE_MARGINS, ctc_margins(ctc_logits, path)
    log.info("reference parakeet-tdt (transformers): CTC decoded %d tokens", len(path.ids))


def stages(loaded: Transformers, case: Case) -> Outputs:
    """The reference's stages of one case under transformers, each phase named by the first
    stage it computes: the feature extractor's (``mel_features [T, n_mels]``, the valid frames
    of :func:`features`), then the transducer's ``generate()`` (:func:`transducer_stages`, the
    encoder's stages from that run) and a CTC decoder's (:func:`ctc_stages`; the encoder's
    stages from it for a CTC model)."""
    config, sound = loaded.config, case.data
    log.info("reference parakeet-tdt (transformers): %s (%.2f s of audio)", case.path,
             sound.seconds)
    yield Phase(Names.MEL_FEATURES)
    input_features, attention_mask = features(loaded, sound.samples)
    n_mel = int(attention_mask.sum())
    yield Names.MEL_FEATURES, input_features[0, :n_mel].float().numpy()
    n_frames = config.encoder.subsampled_length(n_mel)
    masked = bool(case.options.get("attention_mask", 1))
    yield Note("transformers reference: our converter of the checkpoint, ParakeetFeatureExtractor "
               "configured from its preprocessor, the attention mask "
               f"{'passed to' if masked else 'not passed to (option attention_mask 0)'} "
               "generate(); decode texts by the model's own tokenizer pieces")
    mask = attention_mask if masked else None
    if loaded.transducer is not None:
        yield Phase(Names.PRE_ENCODE)
        yield from transducer_stages(loaded, input_features, mask, n_frames)
    if loaded.ctc is not None:
        yield Phase(Names.CTC_LOGITS if loaded.transducer is not None else Names.PRE_ENCODE)
        yield from ctc_stages(loaded, input_features, mask, n_frames,
                              with_encoder=loaded.transducer is None)


class Transformers(ReferenceLibrary):
    """transformers' Parakeet: our converter of the checkpoint (:func:`load_models`), its
    ``ParakeetFeatureExtractor`` and ``generate()`` (:func:`stages`).

    Attributes:
        config: the family's config of the model.
        extractor: the ``ParakeetFeatureExtractor``.
        transducer: ``ParakeetForTDT`` or ``ParakeetForRNNT``, or None.
        ctc: ``ParakeetForCTC`` (in a hybrid, sharing the transducer's encoder), or None.
        tokenizer: ids -> text (:mod:`..tokenizer`: the model's own pieces).
    """

    @classmethod
    def check(cls, model: Path, config: Any, cases: list[Case], *, emulates: bool) -> None:
        """What transformers cannot express (:func:`check_convertible`)."""
        check_convertible(config, Path(model))

    def __init__(self, model: Path, config: ParakeetTDTConfig, options: Mapping[str, Any]
                 ) -> None:
        """Load the models (:func:`load_models`; raises what :func:`check_convertible`
        refuses), the feature extractor and the tokenizer."""
        import transformers

        super().__init__(model, config, options)
        check_convertible(config, Path(model))
        models = load_models(Path(model), config)
        self.config = config
        self.extractor = transformers.ParakeetFeatureExtractor(
            **feature_extractor_settings(config.preprocessor))
        self.transducer, self.ctc = models.get("transducer"), models.get("ctc")
        self.tokenizer: Tokenizer = load_tokenizer(Path(model))

    @property
    def module(self) -> Any:
        """The models loaded, as ``transducer.*`` and ``ctc.*``."""
        import torch

        return torch.nn.ModuleDict({name: model for name, model in
                                    (("transducer", self.transducer), ("ctc", self.ctc))
                                    if model is not None})

    def stages(self, case: Case) -> Outputs:
        return stages(self, case)
