"""The NeMo side of a Parakeet-TDT comparison: run a ``.nemo`` end to end on CPU and yield the
activations named in the family's contract (:func:`stages`; the driver writes the dump).

Stages, in NeMo's order (``EncDecRNNTBPEModel``): ``preprocessor`` (mel), ``encoder``
(``pre_encode`` -> ``pos_enc`` -> ``layers[i]``), then greedy TDT or RNNT decoding (``decoder``
LSTM prediction net + ``joint``) and, for ``EncDecCTCModelBPE`` and the hybrid
``EncDecHybridRNNTCTCBPEModel``, greedy CTC decoding (``ConvASRDecoder``). Taps are forward
hooks on NeMo's own modules, so every dumped tensor is what NeMo computed in one end-to-end run,
batch size 1, eval mode, no dither.

Decoding is NeMo's label-looping greedy TDT decoder (``GreedyBatchedTDTInfer``, strategy
``greedy_batch``, the strategy v3 ships with; ``GreedyBatchedRNNTInfer`` for RNNT) run on one
utterance, with the model's own durations and ``max_symbols``. The recorded joint rows are
checked by replaying them through the project's one implementation of its rules,
:func:`audioparity.models.parakeet_tdt.greedy.greedy_tdt` (:func:`~.greedy.replay_path`); a CTC
decode likewise through :func:`~.greedy.greedy_ctc`.

Only NeMo's generic structure is used, so the same code dumps parakeet-tdt-0.6b-v3 and the tiny
fixture. Importing this module imports neither torch, NeMo nor ggml.

Replay (:func:`replay_stages`): NeMo's blocks on a candidate's own inputs
(:func:`~..replay.replayed_encoder`), and its decoding of the candidate's ``enc_out``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

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
from audioparity.contract.taps import Taps
from audioparity.dumping.artifacts import Dump
from audioparity.models.parakeet_tdt.chunked_attention import chunk_note, chunked_attention
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig
from audioparity.models.parakeet_tdt.floor import ReferenceRun, floor_note, noise_floor
from audioparity.models.parakeet_tdt.greedy import (
    STRATEGY,
    collapse_ctc,
    ctc_margins,
    decision_margins,
    greedy_ctc,
    joint_decisions,
    replay_path,
)
from audioparity.models.parakeet_tdt.positions import valid_positions
from audioparity.models.parakeet_tdt.replay import replayed_encoder
from audioparity.models.parakeet_tdt.spec import SPEC, Names

log = logging.getLogger("audioparity")

#: The NeMo model classes the reference restores, by the decoders they have.
MODEL_CLASSES = ("EncDecRNNTBPEModel", "EncDecCTCModelBPE", "EncDecHybridRNNTCTCBPEModel")


def restore_model(path: Path) -> Any:
    """``ASRModel.restore_from(path, map_location="cpu")`` (the class the checkpoint names:
    one of :data:`MODEL_CLASSES`) in eval mode, dither off.

    Raises:
        AudioparityError: NeMo cannot restore the file, the model is of another class, or its
            transducer has no LSTM prediction network.
    """
    from nemo.collections.asr.models import ASRModel

    try:
        model = ASRModel.restore_from(str(path), map_location="cpu")
    except Exception as err:  # NeMo raises many types; the CLI needs one line naming the file
        raise AudioparityError(
            f"{path}: NeMo cannot restore it as an ASRModel ({err})"
        ) from err
    if type(model).__name__ not in MODEL_CLASSES:
        raise AudioparityError(f"{path}: a {type(model).__name__}; expected one of "
                               f"{', '.join(MODEL_CLASSES)}")
    model.eval()
    model.preprocessor.featurizer.dither = 0.0
    if hasattr(model, "joint") and "dec_rnn" not in getattr(model.decoder, "prediction", {}):
        raise AudioparityError(
            f"{path}: decoder has no LSTM prediction network (decoder.prediction.dec_rnn)"
        )
    return model


def preprocessor(model: Any, samples: np.ndarray) -> tuple[Any, Any]:
    """NeMo ``model.preprocessor`` (``AudioToMelSpectrogramPreprocessor``) on one utterance.

    Args:
        samples: ``[L]`` float32 mono samples at the model's sample rate.

    Returns:
        ``(features [1, n_mels, T_padded], length [1])``; the first ``length`` frames are valid.
    """
    import torch

    signal = torch.from_numpy(samples).unsqueeze(0)
    length = torch.tensor([signal.shape[1]], dtype=torch.int64)
    with torch.inference_mode():
        return model.preprocessor(input_signal=signal, length=length)


def encoder(model: Any, features: Any, length: Any,
            chunks: list[tuple[int, int]] | None = None) -> dict[str, np.ndarray]:
    """NeMo ``model.encoder`` (``ConformerEncoder``) with taps on its sub-modules, its
    full-context attention computed in chunks of query rows (:func:`chunked_attention`: one
    chunk for a clip within :data:`audioparity.dumping.memory.ATTENTION_CHUNK_BYTES`).

    Hooks: ``pre_encode`` output (``ConvSubsampling``), ``pos_emb`` as passed to ``layers[0]``
    (forward pre-hook with kwargs), every ``layers[i]`` output. ``chunks``, when given,
    collects ``(T, chunk rows)`` of every attention call.

    Returns:
        Canonical arrays, valid frames only: ``pre_encode [T', D]``, ``pos_emb [2T'-1, D]``
        (``rel_pos_local_attn`` with ``att_context_size [L, R]``: ``[L+R+1, D]``, positions
        ``L ... -R``, ``LocalAttRelPositionalEncoding``), ``layer_{i} [T', D]``,
        ``enc_out [T', D]`` (NeMo returns ``[B, D, T']``).

    Raises:
        AudioparityError: a hook did not fire exactly once, or ``pos_emb`` is absent (not
            ``rel_pos`` attention) or not of those rows.
    """
    import torch

    enc = model.encoder
    with chunked_attention(enc) as calls, Taps("encoder") as taps:
        taps.output(Names.PRE_ENCODE, enc.pre_encode)
        taps.input(Names.POS_EMB, enc.layers[0], "pos_emb")  # ConformerLayer.forward(pos_emb=)
        taps.outputs(Names.LAYER, enc.layers)
        with torch.inference_mode():
            encoded, encoded_length = enc(audio_signal=features, length=length)
    if chunks is not None:
        chunks.extend(calls)
    n_frames = int(encoded_length[0])
    local = enc.self_attention_model == "rel_pos_local_attn"
    out: dict[str, np.ndarray] = {}
    for name in (Names.PRE_ENCODE, Names.POS_EMB,
                 *(Names.LAYER.at(i) for i in range(len(enc.layers)))):
        array = taps.once(name)[0].float().numpy()
        if name != Names.POS_EMB:
            out[name] = array[:n_frames]
        else:  # a local window's table does not depend on the frames
            out[name] = array if local else valid_positions(array, n_frames)
    rows = (sum(enc.att_context_size) + 1) if local else 2 * n_frames - 1
    if out[Names.POS_EMB].shape != (rows, encoded.shape[1]):
        raise AudioparityError(
            f"pos_emb: shape {list(out[Names.POS_EMB].shape)}, expected [{rows}, "
            f"{encoded.shape[1]}] for T'={n_frames}"
        )
    out[Names.ENC_OUT] = encoded[0, :, :n_frames].transpose(0, 1).float().numpy()
    return out


def greedy_tdt_decoding(
    model: Any, enc_out: np.ndarray
) -> tuple[dict, np.ndarray, np.ndarray, dict, np.ndarray]:
    """NeMo's greedy TDT decoding (``model.decoding``, strategy :data:`STRATEGY`) of one utterance.

    The model's decoding config is kept (durations, ``max_symbols``) except the strategy, which is
    set to :data:`STRATEGY`, and ``tdt_include_token_duration``, set so the hypothesis carries
    durations. Hooks record every raw output of ``joint.joint_net`` (before NeMo's CPU
    log-softmax) and the state after the first call of ``decoder.prediction.dec_rnn``.

    Args:
        enc_out: ``[T', D]`` encoder output.

    Returns:
        ``(decode, joint_logits [steps, V+1+n_durations], lstm_state_0 [layers, 2, H], settings,
        margins [positions])`` where ``decode`` is ``{"ids", "frames", "durations", "text"}``,
        ``settings`` holds the strategy, durations and max_symbols NeMo used, and ``margins``
        how firmly each token was decided (:func:`~.greedy.decision_margins`).

    Raises:
        AudioparityError: the model is not a TDT transducer, or the joint rows do not reproduce
            NeMo's hypothesis under :func:`~.greedy.replay_path`.
    """
    settings = _greedy_tdt_strategy(model)
    hypothesis, joint_logits, lstm_state_0 = _recorded_decode(model, enc_out)
    decode = {
        "ids": _int_list(hypothesis.y_sequence),
        "frames": _int_list(hypothesis.timestamp),
        "durations": _int_list(hypothesis.token_duration),
        "text": hypothesis.text,
    }
    durations = settings["durations"]
    path = replay_path(joint_logits, enc_out.shape[0], durations, settings["max_symbols"])
    replay = {"ids": path.ids, "frames": path.frames, "durations": path.durations}
    for key, values in replay.items():
        if values != decode[key]:
            raise AudioparityError(
                f"joint_logits: greedy TDT replay gives {key} {values[:20]}..., NeMo's hypothesis "
                f"{decode[key][:20]}... ({len(values)} vs {len(decode[key])} entries)"
            )
    margins = decision_margins(joint_logits, path, len(durations))
    return decode, joint_logits, lstm_state_0, settings, margins


def _greedy_tdt_strategy(model: Any) -> dict:
    """Set ``model``'s transducer decoding to :data:`STRATEGY` with token durations, no
    timestamps and no alignments; the settings it decodes with (``strategy``, ``durations``,
    ``max_symbols``).

    Raises:
        AudioparityError: the decoder is not NeMo's greedy batched TDT or RNNT one.
    """
    from nemo.collections.asr.parts.submodules.rnnt_greedy_decoding import (
        GreedyBatchedRNNTInfer,
        GreedyBatchedTDTInfer,
    )
    from omegaconf import open_dict

    config = model.cfg.decoding.copy()
    with open_dict(config):
        config.strategy = STRATEGY
        config.tdt_include_token_duration = True
        config.compute_timestamps = False
        config.preserve_alignments = False
    model.change_decoding_strategy(config, verbose=False)
    infer = model.decoding.decoding
    if not isinstance(infer, GreedyBatchedTDTInfer | GreedyBatchedRNNTInfer):
        raise AudioparityError(
            "decoding: expected a TDT or RNNT model (GreedyBatchedTDTInfer, "
            f"GreedyBatchedRNNTInfer), got {type(infer).__name__}"
        )
    # an RNNT model has no durations: each token stays on its frame (greedy.py)
    durations = [int(d) for d in getattr(infer, "durations", None) or []]
    return {"strategy": STRATEGY, "durations": durations, "max_symbols": infer.max_symbols}


def _recorded_decode(model: Any, enc_out: np.ndarray) -> tuple[Any, np.ndarray, np.ndarray]:
    """NeMo's hypothesis of ``enc_out [T', D]`` under the model's decoding, with every raw
    ``joint.joint_net`` output row ``[steps, V+1+n_durations]`` and the LSTM state after the
    first prediction step ``[layers, 2, H]``."""
    import torch

    encoded = torch.from_numpy(enc_out).transpose(0, 1).unsqueeze(0)
    length = torch.tensor([enc_out.shape[0]], dtype=torch.int64)
    with Taps("decoder") as taps:
        taps.output("joint", model.joint.joint_net, keep=lambda out: out.float().clone())
        taps.output("dec_rnn", model.decoder.prediction["dec_rnn"], keep=lambda out: torch.stack(
            [state[:, 0].float().clone() for state in out[1]], dim=1))
        with torch.inference_mode():
            (hypothesis,) = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=length, return_hypotheses=True
            )
    rows = [out.reshape(-1, out.shape[-1]) for out in taps.all("joint")]
    return hypothesis, torch.cat(rows).numpy(), taps.all("dec_rnn")[0].numpy()


def greedy_ctc_decoding(model: Any, enc_out: np.ndarray) -> tuple[dict, np.ndarray, np.ndarray]:
    """NeMo's CTC decoder (``ConvASRDecoder``: ``model.decoder`` of ``EncDecCTCModelBPE``,
    ``model.ctc_decoder`` of the hybrid) and its greedy decoding (``CTCBPEDecoding``, strategy
    :data:`STRATEGY`: ``GreedyBatchedCTCInfer``) of one utterance.

    The decoding config is the model's (``decoding``, the hybrid's ``aux_ctc.decoding``) with
    the strategy set to :data:`STRATEGY` and timestamps off. NeMo's hypothesis holds the argmax
    label of every frame; its tokens are those labels folded as NeMo folds them
    (:func:`~.greedy.collapse_ctc`), each at the first frame of its run, its text NeMo's own.

    Args:
        enc_out: ``[T', D]`` encoder output.

    Returns:
        ``(ctc_decode, ctc_logits [T', V+1], margins [positions])``: ``{"ids", "frames",
        "text"}``, the log-probabilities, and how firmly each token was decided
        (:func:`~.greedy.ctc_margins`).

    Raises:
        AudioparityError: the argmax of the log-probabilities is not NeMo's hypothesis.
    """
    import torch
    from omegaconf import open_dict

    hybrid = hasattr(model, "ctc_decoder")
    config = (model.cfg.aux_ctc.decoding if hybrid else model.cfg.decoding).copy()
    with open_dict(config):
        config.strategy = STRATEGY
        config.compute_timestamps = False
        config.preserve_alignments = False
    if hybrid:
        model.change_decoding_strategy(config, decoder_type="ctc", verbose=False)
    else:
        model.change_decoding_strategy(config, verbose=False)
    module, decoding = ((model.ctc_decoder, model.ctc_decoding) if hybrid
                        else (model.decoder, model.decoding))
    encoded = torch.from_numpy(enc_out).transpose(0, 1).unsqueeze(0)
    length = torch.tensor([enc_out.shape[0]], dtype=torch.int64)
    with torch.inference_mode():
        log_probs = module(encoder_output=encoded)
        (hypothesis,) = decoding.ctc_decoder_predictions_tensor(
            log_probs, decoder_lengths=length, return_hypotheses=True)
    ctc_logits = log_probs[0].float().numpy()
    labels = _int_list(hypothesis.y_sequence)[: enc_out.shape[0]]
    path = collapse_ctc(labels, ctc_logits.shape[1] - 1)
    replay = greedy_ctc(ctc_logits, ctc_logits.shape[1] - 1)
    if (replay.ids, replay.frames) != (path.ids, path.frames):
        raise AudioparityError(
            f"ctc_logits: greedy CTC of the log-probabilities gives ids {replay.ids[:20]}..., "
            f"NeMo's hypothesis {path.ids[:20]}... ({len(replay.ids)} vs {len(path.ids)})"
        )
    decode = {"ids": path.ids, "frames": path.frames, "text": hypothesis.text}
    return decode, ctc_logits, ctc_margins(ctc_logits, path)


def _int_list(values: Any) -> list[int]:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [int(v) for v in values]


def stages(asr_model: Any, case: Case, carries: Callable[[str], bool]) -> Outputs:
    """The reference's stages of one case, each phase (named by the first stage it computes)
    timed by the driver: the preprocessor (``mel_features [T, n_mels]``), the encoder
    (``pre_encode``, ``pos_emb``, ``layer_{i}``, ``enc_out``: :func:`encoder`), then a
    transducer's decoding (:func:`transducer_stages`) and a CTC decoder's
    (:func:`ctc_stages`); then, on band-limited audio, the manifest's ``noise_floor``
    (:func:`~.floor.noise_floor`, of the stages ``carries`` names; its time counts in the last
    stage's: it is no stage)."""
    config, sound = case.config, case.data
    log.info("reference parakeet-tdt: %s (%.2f s of audio)", case.path, sound.seconds)
    yield Phase(Names.MEL_FEATURES)
    features, length = preprocessor(asr_model, sound.samples)
    yield Names.MEL_FEATURES, features[0, :, : int(length[0])].T.float().numpy()

    yield Phase(Names.PRE_ENCODE)
    chunks: list[tuple[int, int]] = []
    taps = encoder(asr_model, features, length, chunks)
    position_note = config.encoder.position_table_note(taps[Names.ENC_OUT].shape[0])
    for note in (position_note, chunk_note(chunks)):
        if note:
            yield Note(note)
            log.info("reference parakeet-tdt: %s", note)
    yield from taps.items()
    log.info("reference parakeet-tdt: mel + encoder (%d layers, T'=%d)",
             len(asr_model.encoder.layers), taps[Names.ENC_OUT].shape[0])
    outputs = dict(taps)
    for item in _decoders(asr_model, config, taps[Names.ENC_OUT]):
        if isinstance(item, tuple):
            outputs[item[0]] = item[1]
        yield item
    floor = noise_floor(asr_model, ReferenceRun(sound.samples, features, length, outputs),
                        partial(_stages_on, asr_model, config, length), carries)
    if floor is not None:
        yield Fields({"noise_floor": floor})
        yield Note(floor_note(floor))
        log.info("reference parakeet-tdt: %s", floor_note(floor))


def _decoders(asr_model: Any, config: ParakeetTDTConfig, enc_out: np.ndarray) -> Outputs:
    """The stages of the model's decoders on ``enc_out``: a transducer's, a CTC decoder's."""
    if config.transducer:
        yield from transducer_stages(asr_model, enc_out)
    if config.ctc is not None:
        yield from ctc_stages(asr_model, enc_out)


def _stages_on(asr_model: Any, config: ParakeetTDTConfig, length: Any, features: Any
               ) -> dict[str, Any]:
    """The stages after the mel on ``features`` (``[1, n_mels, T_padded]``), by name: the
    encoder's taps (:func:`encoder`) and the decoders' outputs (:func:`_decoders`)."""
    out = encoder(asr_model, features, length)
    out.update(item for item in _decoders(asr_model, config, out[Names.ENC_OUT])
               if isinstance(item, tuple))
    return out


def transducer_stages(asr_model: Any, enc_out: np.ndarray) -> Outputs:
    """The transducer's stages of a reference dump (:func:`greedy_tdt_decoding`):
    ``joint_logits``, ``lstm_state_0``, ``decode`` and its margins, ``decode_logits`` (the
    joint rows again: on its own ``enc_out`` the decode teacher-forced along its own path is
    its decode), and the manifest's ``decoding`` settings."""
    yield Phase(Names.JOINT_LOGITS)
    decode, joint_logits, lstm_state, settings, margins = greedy_tdt_decoding(asr_model, enc_out)
    yield Fields({"decoding": settings})
    yield Names.JOINT_LOGITS, joint_logits
    yield Names.LSTM_STATE_0, lstm_state
    yield Names.DECODE, decode
    yield Names.DECODE_MARGINS, margins
    yield Names.DECODE_LOGITS, joint_logits
    yield Fields({"decisions": joint_decisions(joint_logits.shape[1], len(settings["durations"]))})
    yield Note(f"decode: NeMo {settings['strategy']} (label looping), batch 1; joint rows "
               "replayed through the greedy TDT rules reproduce its ids, frames and durations")
    log.info("reference parakeet-tdt: decoded %d tokens in %d joint steps",
             len(decode["ids"]), len(joint_logits))


def ctc_stages(asr_model: Any, enc_out: np.ndarray) -> Outputs:
    """The CTC decoder's stages of a reference dump (:func:`greedy_ctc_decoding`):
    ``ctc_logits``, ``ctc_decode`` and its margins, and the manifest's ``ctc_decoding``."""
    yield Phase(Names.CTC_LOGITS)
    ctc_decode, ctc_logits, margins = greedy_ctc_decoding(asr_model, enc_out)
    yield Fields({"ctc_decoding": {"strategy": STRATEGY}})
    yield Names.CTC_LOGITS, ctc_logits
    yield Names.CTC_DECODE, ctc_decode
    yield Names.CTC_DECODE_MARGINS, margins
    yield Note(f"ctc_decode: NeMo CTCBPEDecoding {STRATEGY}, batch 1; the argmax of "
               "ctc_logits folded reproduces its ids and frames")
    log.info("reference parakeet-tdt: CTC decoded %d tokens", len(ctc_decode["ids"]))


def replay_stages(asr_model: Any, case: Case, candidate: Dump) -> Outputs:
    """The replayed forms of one case (module notes), each phase timed by the driver: the
    encoder's (``pre_encode_replayed [T', D]``, ``layer_{i}_replayed [T', D]``, one run), then
    the decoding's (``decode_replayed``, ``{ids, frames, durations, text}``, with its
    ``decode_replayed_margins``); each form not replayed is :class:`Skipped` with why (the
    candidate lacks its input, or has it in another shape; a CTC model has no transducer
    decode)."""
    yield Phase(Names.PRE_ENCODE_REPLAYED)
    features, length = preprocessor(asr_model, case.data.samples)
    replayed, skipped = replayed_encoder(asr_model, features, length, candidate)
    yield from replayed.items()
    for name, why in skipped.items():
        yield Skipped(name, why)
    if not case.config.transducer:
        yield Skipped(Names.DECODE_REPLAYED, "a CTC model: no transducer decode to replay")
    elif candidate.has(Names.ENC_OUT):
        yield Phase(Names.DECODE_REPLAYED)
        decode, *_, margins = greedy_tdt_decoding(asr_model, candidate.tensor(Names.ENC_OUT))
        yield Names.DECODE_REPLAYED, decode
        yield f"{Names.DECODE_REPLAYED}_margins", margins
    else:
        yield Skipped(Names.DECODE_REPLAYED, "the candidate dump has no enc_out")


class Nemo(ReferenceLibrary):
    """NeMo's own model, restored from the ``.nemo`` file (:func:`restore_model`): its stages
    (:func:`stages`) and its blocks on a candidate's inputs (:func:`replay_stages`)."""

    @classmethod
    def check(cls, model: Path, config: Any, cases: list[Case], *, emulates: bool) -> None:
        """Refuse a directory: NeMo restores ``.nemo`` files only.

        Raises:
            AudioparityError: ``model`` is a directory.
        """
        if Path(model).is_dir():
            raise AudioparityError(f"{model}: a directory; the NeMo reference restores a .nemo "
                                   "file")

    def __init__(self, model: Path, config: Any, options: Mapping[str, Any]) -> None:
        super().__init__(model, config, options)
        import nemo.collections.asr  # noqa: F401  (the one NeMo import of this job)

        self.model = restore_model(model)

    @property
    def module(self) -> Any:
        return self.model

    def stages(self, case: Case) -> Outputs:
        return stages(self.model, case, partial(SPEC.carries, Names.MEL_FEATURES))

    def replay(self, case: Case, candidate: Any) -> Outputs:
        return replay_stages(self.model, case, candidate)
