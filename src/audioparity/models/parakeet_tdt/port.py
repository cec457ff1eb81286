"""The ggml port's stages of one case (:meth:`ParakeetTdt.ggml`), each phase (named by the
first stage it computes) timed by the driver:

- ``mel_features``: :func:`.frontend.mel_features` (the checkpoint's filterbank and window when
  it has them) -> ``mel_features [T, n_mels]``;
- ``pos_emb``, ``pre_encode``, ``layer_{i}``: the end-to-end encoder on that mel, the
  positional table, the subsampling and each layer in turn -> ``pre_encode``, ``pos_emb``,
  ``layer_{i}``, ``enc_out`` (the last layer's);
- ``layer_{i}_isolated``: each layer alone on the reference's input of that layer (reference
  ``pre_encode`` for layer 0, reference ``layer_{i-1}`` after, reference ``pos_emb``) ->
  ``layer_{i}_isolated``;
- ``joint_logits``: the ggml joint along the reference greedy path (reference ``enc_out`` and
  token history, rows as in the reference's ``joint_logits``) -> ``joint_logits``,
  ``lstm_state_0``;
- ``decoder_replay``: the ggml greedy decoder run free on the reference ``enc_out`` ->
  ``decoder_replay.json``;
- ``decode``: the ggml greedy decoder on the ggml ``enc_out`` -> ``decode.json``;
- ``decode_logits``: the ggml prediction network and joint along the reference greedy path on
  the ggml ``enc_out`` (the whole pipeline's decode teacher-forced: each step fed the
  reference's choice, so a flip at a near tie costs one row, not the rest) -> ``decode_logits``;
- a CTC model's (and the hybrid's) ``ctc_logits_isolated`` and ``ctc_logits``: the ggml CTC
  decoder and greedy CTC on the reference ``enc_out`` -> ``ctc_logits_isolated``,
  ``ctc_decoder_replay.json``, and on the ggml ``enc_out`` -> ``ctc_logits``, ``ctc_decode.json``.

The transducer's stages (``joint_logits`` to ``decode_logits``) exist for a TDT or RNNT model
only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Case, Fields, Note, Outputs, Phase
from audioparity.dumping.artifacts import Dump
from audioparity.ggml import Runtime, Weights
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig
from audioparity.models.parakeet_tdt.ctc import CtcDecoder
from audioparity.models.parakeet_tdt.decoder import TdtDecoder
from audioparity.models.parakeet_tdt.encoder import Encoder
from audioparity.models.parakeet_tdt.frontend import mel_features
from audioparity.models.parakeet_tdt.greedy import (
    STRATEGY,
    GreedyPath,
    joint_decisions,
    replay_path,
)
from audioparity.models.parakeet_tdt.layout import FB, WINDOW
from audioparity.models.parakeet_tdt.spec import Names
from audioparity.models.parakeet_tdt.tokenizer import (
    Tokenizer,
    ctc_document,
    decode_document,
    load_tokenizer,
)

log = logging.getLogger("audioparity")


@dataclass(frozen=True)
class PortCase:
    """What the port's decoding stages of one case share (:func:`stages` builds it once):
    the runtime and its uploaded ``weights``, the ``reference`` dump the teacher-forced and
    isolated stages read, the model's ``config``, its ``tokenizer``, and the log ``label``."""

    runtime: Runtime
    weights: Weights
    reference: Dump
    config: ParakeetTDTConfig
    tokenizer: Tokenizer
    label: str


def stages(runtime: Runtime, weights: Weights, case: Case, reference: Dump) -> Outputs:
    """The stages of the module docstring, on ``case`` (its audio ``[L]`` float32 at the
    model's rate), with the reference dump ``reference`` for the teacher-forced ones.

    Raises:
        AudioparityError: the model carries no readable tokenizer, or the reference's
            ``joint_logits`` do not reproduce its ``decode.json`` (:func:`reference_path`).
    """
    config, label = case.config, f"ggml parakeet-tdt [{case.model.name} | {case.path.stem}]"
    tokenizer = load_tokenizer(case.model)
    yield Fields({"decoding": {"strategy": STRATEGY, "durations": list(config.durations),
                               "max_symbols": config.max_symbols}})
    yield Note("mel filterbank and window: "
               + ("the checkpoint's" if FB in weights.buffers else "built (librosa, hann)"))
    yield Phase(Names.MEL_FEATURES)
    mel = mel_features(case.data.samples, config.preprocessor,
                       filterbank=weights.buffers.get(FB), window=weights.buffers.get(WINDOW))
    yield Names.MEL_FEATURES, mel
    log.info("%s: mel %d frames", label, mel.shape[0])

    encoder = Encoder(weights, config, runtime,
                      flash_attention=bool(case.options.get("flash_attention", 0)))
    enc_out = yield from encoder_stages(encoder, mel, reference, label)
    port = PortCase(runtime, weights, reference, config, tokenizer, label)
    if config.transducer:
        yield from transducer_stages(port, enc_out)
    if config.ctc is not None:
        yield from ctc_stages(port, enc_out)


def encoder_stages(encoder: Encoder, mel: np.ndarray, reference: Dump, label: str) -> Outputs:
    """The encoder's stages end to end (the taps of :meth:`Encoder.forward`, a phase each: the
    positional table, the subsampling, each layer) and each layer isolated; returns (as the
    generator's value) the port's ``enc_out [T', D]``."""
    config = encoder.cfg
    yield Phase(Names.POS_EMB)
    pos_emb = encoder.positions(mel.shape[0])
    yield Phase(Names.PRE_ENCODE)
    pre_encode = encoder.pre_encode(mel)
    yield Names.PRE_ENCODE, pre_encode
    yield Names.POS_EMB, pos_emb
    layers = encoder.layers(pre_encode, pos_emb)
    for i in range(config.n_layers):
        yield Phase(Names.LAYER.at(i))
        enc_out = next(layers)
        yield Names.LAYER.at(i), enc_out
    yield Names.ENC_OUT, enc_out
    position_note = config.position_table_note(enc_out.shape[0])
    if position_note:
        yield Note(position_note)
        log.info("%s: %s", label, position_note)
    log.info("%s: encoder (%d layers, T'=%d)", label, config.n_layers, enc_out.shape[0])

    # layers_isolated scales pre_encode by xscale itself, as NeMo's pos_enc does
    inputs = [reference.tensor(Names.PRE_ENCODE)] + [reference.tensor(Names.LAYER.at(i - 1))
                                                     for i in range(1, config.n_layers)]
    isolated = encoder.layers_isolated(inputs, reference.tensor(Names.POS_EMB))
    for i in range(config.n_layers):
        yield Phase(Names.LAYER_ISOLATED.at(i))
        yield Names.LAYER_ISOLATED.at(i), next(isolated)
    return enc_out


def transducer_stages(port: PortCase, enc_out: np.ndarray) -> Outputs:
    """The transducer's stages of ``port``'s case, our ``enc_out`` ``[T', D]`` given:
    ``joint_logits`` and ``lstm_state_0`` along the reference path, ``decoder_replay`` (on the
    reference ``enc_out``), ``decode`` (on ours) and ``decode_logits`` (ours along the
    reference path)."""
    reference, config, tokenizer, label = port.reference, port.config, port.tokenizer, port.label
    ref_enc_out = reference.tensor(Names.ENC_OUT)
    with TdtDecoder(port.runtime, port.weights, config) as decoder:
        yield Phase(Names.JOINT_LOGITS)
        path = reference_path(reference, ref_enc_out.shape[0], config)
        joint_logits, lstm_state_0 = decoder.teacher_forced(ref_enc_out, path)
        yield Names.JOINT_LOGITS, joint_logits
        yield Names.LSTM_STATE_0, lstm_state_0
        log.info("%s: joint along the reference path (%d rows)", label, joint_logits.shape[0])

        yield Phase(Names.DECODER_REPLAY)
        replay = decode_document(decoder.greedy(ref_enc_out), tokenizer)
        yield Names.DECODER_REPLAY, replay
        yield Phase(Names.DECODE)
        decode = decode_document(decoder.greedy(enc_out), tokenizer)
        yield Names.DECODE, decode
        yield Phase(Names.DECODE_LOGITS)
        own = path.within(enc_out.shape[0])
        if len(own.row_frames) < len(path.row_frames):
            yield Note(f"decode_logits: our enc_out has {enc_out.shape[0]} frames, the "
                       f"reference's {ref_enc_out.shape[0]}: the {len(own.row_frames)} of "
                       f"{len(path.row_frames)} steps of its path on our frames")
        decode_logits, _ = decoder.teacher_forced(enc_out, own)
        yield Names.DECODE_LOGITS, decode_logits
    yield Fields({"decisions": joint_decisions(joint_logits.shape[1], len(config.durations))})
    yield Note(f"decode and decoder_replay: greedy TDT ({STRATEGY} rules, batch 1) on the host "
               "around ggml prediction-network and joint graphs")
    log.info("%s: decoder_replay %d tokens, decode %d tokens, decode_logits %d rows", label,
             len(replay["ids"]), len(decode["ids"]), decode_logits.shape[0])


def ctc_stages(port: PortCase, enc_out: np.ndarray) -> Outputs:
    """The CTC decoder's stages of ``port``'s case: ``ctc_logits`` and ``ctc_decode`` of our
    ``enc_out`` ``[T', D]``, and their isolated forms on the reference's:
    ``ctc_logits_isolated``, ``ctc_decoder_replay``."""
    decoder = CtcDecoder(port.runtime, port.weights, port.config)
    yield Phase(Names.CTC_LOGITS_ISOLATED)
    isolated, replay = decoder.greedy(port.reference.tensor(Names.ENC_OUT))
    yield Names.CTC_LOGITS_ISOLATED, isolated
    yield Names.CTC_DECODER_REPLAY, ctc_document(replay, port.tokenizer)
    yield Phase(Names.CTC_LOGITS)
    log_probs, path = decoder.greedy(enc_out)
    yield Names.CTC_LOGITS, log_probs
    yield Names.CTC_DECODE, ctc_document(path, port.tokenizer)
    yield Note("ctc_decode and ctc_decoder_replay: greedy CTC (argmax, repeats folded, blanks "
               "dropped) on the host of the ggml ConvASRDecoder's log-probabilities")
    log.info("%s: ctc_decoder_replay %d tokens, ctc_decode %d tokens", port.label,
             len(replay.ids), len(path.ids))


def reference_path(reference: Dump, n_frames: int, config: ParakeetTDTConfig) -> GreedyPath:
    """The reference's greedy path, read off its own ``joint_logits`` and checked against its
    ``decode.json``.

    Raises:
        AudioparityError: the rows do not reproduce the reference decode.
    """
    path = replay_path(reference.tensor(Names.JOINT_LOGITS), n_frames,
                       list(config.durations), config.max_symbols)
    decode = reference.json(Names.DECODE)
    if [path.ids, path.frames, path.durations] != [decode["ids"], decode["frames"],
                                                   decode["durations"]]:
        raise AudioparityError(
            f"{reference.path}: joint_logits replayed with durations {list(config.durations)} "
            f"and max_symbols {config.max_symbols} do not reproduce decode.json"
        )
    return path
