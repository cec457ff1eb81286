"""The NeMo side of a Parakeet-TDT comparison: run a ``.nemo`` end to end on CPU and dump the
activations named in the artifact contract.

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
fixture. Importing this module does not import torch or NeMo (it imports ggml, through the
decoder module).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.artifacts import DumpWriter
from audioparity.audio import Audio, load_audio
from audioparity.errors import AudioparityError
from audioparity.memory import reference_bytes, refuse_if_over
from audioparity.models.parakeet_tdt.checkpoint import check_weights
from audioparity.models.parakeet_tdt.config import ParakeetTDTConfig, load_config
from audioparity.models.parakeet_tdt.greedy import (
    STRATEGY,
    collapse_ctc,
    ctc_margins,
    decision_margins,
    greedy_ctc,
    replay_path,
)
from audioparity.storage import emulations
from audioparity.threads import torch_threads

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


def encoder(model: Any, features: Any, length: Any) -> dict[str, np.ndarray]:
    """NeMo ``model.encoder`` (``ConformerEncoder``) with taps on its sub-modules.

    Hooks: ``pre_encode`` output (``ConvSubsampling``), ``pos_emb`` as passed to ``layers[0]``
    (forward pre-hook with kwargs), every ``layers[i]`` output.

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

    taps: dict[str, list[Any]] = {}

    def keep(name: str, value: Any) -> None:
        taps.setdefault(name, []).append(value[0] if isinstance(value, tuple) else value)

    enc = model.encoder
    handles = [
        enc.pre_encode.register_forward_hook(lambda m, i, o: keep("pre_encode", o)),
        enc.layers[0].register_forward_pre_hook(
            lambda m, a, kw: keep("pos_emb", kw.get("pos_emb")), with_kwargs=True
        ),
    ]
    for index, layer in enumerate(enc.layers):
        handles.append(layer.register_forward_hook(lambda m, i, o, n=index: keep(f"layer_{n}", o)))
    try:
        with torch.inference_mode():
            encoded, encoded_length = enc(audio_signal=features, length=length)
    finally:
        for handle in handles:
            handle.remove()
    n_frames = int(encoded_length[0])
    local = enc.self_attention_model == "rel_pos_local_attn"
    out: dict[str, np.ndarray] = {}
    for name in ("pre_encode", "pos_emb", *(f"layer_{i}" for i in range(len(enc.layers)))):
        values = taps.get(name, [])
        if len(values) != 1 or values[0] is None:
            raise AudioparityError(
                f"encoder tap {name!r}: expected one tensor, got {len(values)} "
                f"({'none' if not values else type(values[0]).__name__}); rel_pos attention needed"
            )
        array = values[0][0].float().numpy()
        if name != "pos_emb":
            out[name] = array[:n_frames]
        else:  # a local window's table does not depend on the frames
            out[name] = array if local else valid_positions(array, n_frames)
    rows = (sum(enc.att_context_size) + 1) if local else 2 * n_frames - 1
    if out["pos_emb"].shape != (rows, encoded.shape[1]):
        raise AudioparityError(
            f"pos_emb: shape {list(out['pos_emb'].shape)}, expected [{rows}, "
            f"{encoded.shape[1]}] for T'={n_frames}"
        )
    out["enc_out"] = encoded[0, :, :n_frames].transpose(0, 1).float().numpy()
    return out


def valid_positions(pos_emb: np.ndarray, n_frames: int) -> np.ndarray:
    """The rows of ``pos_emb`` for the valid frames: positions ``T'-1 ... -(T'-1)``.

    NeMo sizes ``pos_emb`` by the padded length P of the batch (``[2P-1, D]``, rows ``P-1 ...
    -(P-1)``), and P can exceed the valid length T' by one: the preprocessor returns L//160 + 1
    frames of which L//160 are valid, so when L//160 is a multiple of 8 the padded frame
    survives the x8 subsampling (e.g. exactly 10.0 s: T' 125, P 126). The padded frame is masked
    in attention, so the valid rows are the middle ``2T'-1``.

    Raises:
        AudioparityError: ``pos_emb`` has an even row count or fewer than ``2T'-1`` rows.
    """
    rows = pos_emb.shape[0]
    if rows % 2 == 0 or rows < 2 * n_frames - 1:
        raise AudioparityError(
            f"pos_emb: shape {list(pos_emb.shape)}, expected [2P-1, D] with P >= T'={n_frames}"
        )
    start = (rows + 1) // 2 - n_frames
    return pos_emb[start : start + 2 * n_frames - 1]


def greedy_tdt_decoding(
    model: Any, enc_out: np.ndarray
) -> tuple[dict, np.ndarray, np.ndarray, dict]:
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
    import torch
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
    settings = {"strategy": STRATEGY, "durations": durations, "max_symbols": infer.max_symbols}

    rows: list[Any] = []
    states: list[Any] = []

    def keep_rows(module: Any, inputs: Any, output: Any) -> None:
        rows.append(output.reshape(-1, output.shape[-1]).float().clone())

    def keep_state(module: Any, inputs: Any, output: Any) -> None:
        if not states:
            states.append(torch.stack([s[:, 0].float().clone() for s in output[1]], dim=1))

    handles = [
        model.joint.joint_net.register_forward_hook(keep_rows),
        model.decoder.prediction["dec_rnn"].register_forward_hook(keep_state),
    ]
    encoded = torch.from_numpy(enc_out).transpose(0, 1).unsqueeze(0)
    length = torch.tensor([enc_out.shape[0]], dtype=torch.int64)
    try:
        with torch.inference_mode():
            (hypothesis,) = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=encoded, encoded_lengths=length, return_hypotheses=True
            )
    finally:
        for handle in handles:
            handle.remove()
    decode = {
        "ids": _int_list(hypothesis.y_sequence),
        "frames": _int_list(hypothesis.timestamp),
        "durations": _int_list(hypothesis.token_duration),
        "text": hypothesis.text,
    }
    joint_logits = torch.cat(rows).numpy()
    path = replay_path(joint_logits, enc_out.shape[0], durations, infer.max_symbols)
    replay = {"ids": path.ids, "frames": path.frames, "durations": path.durations}
    for key, values in replay.items():
        if values != decode[key]:
            raise AudioparityError(
                f"joint_logits: greedy TDT replay gives {key} {values[:20]}..., NeMo's hypothesis "
                f"{decode[key][:20]}... ({len(values)} vs {len(decode[key])} entries)"
            )
    margins = decision_margins(joint_logits, path, len(durations))
    return decode, joint_logits, states[0].numpy(), settings, margins


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


def dump_reference(model: Path, cases: Sequence[tuple[Path, Path]], threads: int = 1,
                   emulate: Sequence[str] = ()) -> None:
    """Dump NeMo's activations for each ``(audio, output_dir)`` pair of ``cases`` (artifact
    contract), importing NeMo and restoring the model once for all of them: for
    parakeet-tdt-0.6b-v3 on 2 cores the import takes about 7 s and the restore 20 s, a case
    about 1 s per 10 s of audio (``BENCHMARKS.md``).

    Each dump holds ``mel_features [T, n_mels]``, ``pre_encode [T', D]``, ``pos_emb [2T'-1, D]``,
    ``layer_{i} [T', D]``, ``enc_out [T', D]``; a transducer's ``joint_logits
    [steps, V+1+n_durations]`` (raw, one row per joint evaluation of the greedy decode),
    ``lstm_state_0 [layers, 2, H]`` (h then c after the blank/SOS step), ``decode.json`` and
    ``decode_margins [positions]`` (how firmly each token was decided, for the compare's
    ``logit_gap``); a CTC decoder's ``ctc_logits [T', V+1]``, ``ctc_decode.json`` and
    ``ctc_decode_margins`` (:func:`greedy_ctc_decoding`). Manifest fields: family, threads,
    cases_per_load (how many dumps shared the import and load whose ``seconds`` it records),
    n_layers, decoding (strategy, durations, max_symbols), ctc_decoding, audio (the file's
    format, see :class:`~audioparity.audio.Audio`), versions of torch and nemo_toolkit.

    Before NeMo is imported, every input goes through the checks of the ggml dump, in its order
    and with its messages: the config (:func:`~.config.load_config`), each audio file
    (:func:`~audioparity.audio.load_audio`, at least one encoder frame), and the checkpoint's
    tensors (:func:`~.weights.check_weights`: present, shaped as the config says, finite;
    this reads the weights once more, a few seconds for a 0.6B model).

    Args:
        model: ``.nemo`` file (:data:`MODEL_CLASSES`).
        cases: ``(audio file, dump directory)`` pairs; audio is read at the model's sample rate,
            each directory is written atomically.
        threads: torch intra-op threads (results are bit-stable at a fixed count); the previous
            count is restored afterwards.
        emulate: weight types to dump each case again for, as ggml's CPU backend computes with
            them (:func:`audioparity.storage.emulations`), to ``<output_dir>@<type>``.

    Raises:
        AudioparityError: no cases; a missing or unreadable model or audio file, a Hugging Face
            directory (NeMo restores ``.nemo`` files only), a model that is not Parakeet-TDT
            shaped or whose tensors are missing, misshapen or not finite, too little audio, or a
            decode the joint rows do not reproduce. The failing case's directory is not left
            behind; an input error leaves none at all.
    """
    model = Path(model)
    cases = [(Path(audio), Path(output_dir)) for audio, output_dir in cases]
    if not cases:
        raise AudioparityError("reference parakeet-tdt: no audio file given")
    if model.is_dir():
        raise AudioparityError(f"{model}: a directory; the NeMo reference restores a .nemo file")
    config = load_config(model)
    sounds = [load_audio(audio, sample_rate=config.preprocessor.sample_rate,
                         min_samples=config.min_samples, purpose="one encoder frame")
              for audio, _ in cases]
    for (audio, _), sound in zip(cases, sounds, strict=True):
        n_mel = sound.samples.size // config.preprocessor.hop_length  # valid mel frames
        check_attention_memory(audio, model, config.encoder,
                               config.encoder.subsampled_length(n_mel), bool(emulate))
    check_weights(model, config)

    with torch_threads(threads):
        start = time.perf_counter()
        import nemo.collections.asr  # noqa: F401  (the one NeMo import of this job)

        imported = time.perf_counter()
        asr_model = restore_model(model)
        seconds = {"import": round(imported - start, 4),
                   "load": round(time.perf_counter() - imported, 4)}
        log.info("reference parakeet-tdt: imported NeMo in %.1f s, loaded %s in %.1f s, for %d "
                 "case(s)", seconds["import"], model, seconds["load"], len(cases))
        for variant in emulations(asr_model, emulate):
            for (audio, output_dir), sound in zip(cases, sounds, strict=True):
                _dump(variant.model, model, audio, sound, config, variant.dump_dir(output_dir),
                      {"threads": threads, "cases_per_load": len(cases), **variant.fields},
                      seconds)


def check_attention_memory(audio: Path, model: Path, encoder_config, n_frames: int,
                           emulates: bool = False) -> None:
    """Refuse a clip that would not fit the memory free, before NeMo is imported (a process
    killed for memory says nothing): the model as the reference holds it
    (:func:`~audioparity.memory.reference_bytes`: the stack, the float32 weights, their saved
    originals when it ``emulates`` a weight type) and the attention's peak
    (:meth:`~.config.EncoderConfig.attention_bytes` of the clip's encoder frames).

    Raises:
        AudioparityError: that exceeds :func:`~audioparity.memory.host_free_bytes`.
    """
    refuse_if_over(reference_bytes(model, emulates) + encoder_config.attention_bytes(n_frames),
                   f"{audio}: T'={n_frames} encoder frames; the NeMo reference",
                   "the input is too long for this memory", " (attention grows as T'^2)")


def _dump(asr_model: Any, model: Path, audio: Path, sound: Audio, config: ParakeetTDTConfig,
          output_dir: Path, fields: dict[str, int], seconds: dict[str, float]) -> None:
    start = time.perf_counter()
    with DumpWriter(
        output_dir,
        producer="nemo",
        model=model,
        inputs={"audio": audio},
        fields={"family": "parakeet_tdt", **fields, "audio": sound.source},
        versions=("torch", "nemo_toolkit"),
    ) as writer:
        for note in sound.notes:
            writer.note(note)
        log.info("reference parakeet-tdt: %s (%.2f s of audio)", audio, sound.seconds)
        writer.manifest["seconds"].update(seconds)
        writer.manifest["n_layers"] = len(asr_model.encoder.layers)

        with writer.timed("preprocessor"):
            features, length = preprocessor(asr_model, sound.samples)
        writer.add_tensor(
            "mel_features", features[0, :, : int(length[0])].T.float().numpy(), "[T, n_mels]"
        )

        with writer.timed("encoder"):
            taps = encoder(asr_model, features, length)
        position_note = config.encoder.position_table_note(taps["enc_out"].shape[0])
        if position_note:
            writer.note(position_note)
            log.info("reference parakeet-tdt: %s", position_note)
        writer.add_tensor("pre_encode", taps.pop("pre_encode"), "[T, D]")
        writer.add_tensor("pos_emb", taps.pop("pos_emb"), "[2T-1, D]")
        for name, array in taps.items():
            writer.add_tensor(name, array, "[T, D]")
        log.info(
            "reference parakeet-tdt: mel + encoder (%d layers, T'=%d) in %.2f s",
            writer.manifest["n_layers"], taps["enc_out"].shape[0],
            writer.manifest["seconds"]["preprocessor"] + writer.manifest["seconds"]["encoder"],
        )

        if config.transducer:
            _dump_transducer(writer, asr_model, taps["enc_out"])
        if config.ctc is not None:
            with writer.timed("ctc_decoding"):
                ctc_decode, ctc_logits, ctc_margins_ = greedy_ctc_decoding(asr_model,
                                                                          taps["enc_out"])
            writer.manifest["ctc_decoding"] = {"strategy": STRATEGY}
            writer.add_tensor("ctc_logits", ctc_logits, "[T, V+1]")
            writer.add_json("ctc_decode", ctc_decode)
            writer.add_tensor("ctc_decode_margins", ctc_margins_, "[positions]")
            writer.note(f"ctc_decode: NeMo CTCBPEDecoding {STRATEGY}, batch 1; the argmax of "
                        "ctc_logits folded reproduces its ids and frames")
            log.info("reference parakeet-tdt: CTC decoded %d tokens in %.2f s",
                     len(ctc_decode["ids"]), writer.manifest["seconds"]["ctc_decoding"])
    log.info("reference parakeet-tdt: wrote %s in %.1f s", output_dir, time.perf_counter() - start)


def _dump_transducer(writer: DumpWriter, asr_model: Any, enc_out: np.ndarray) -> None:
    """The transducer's stages of a reference dump (:func:`greedy_tdt_decoding`)."""
    with writer.timed("decoding"):
        decode, joint_logits, lstm_state, settings, margins = greedy_tdt_decoding(
            asr_model, enc_out
        )
    writer.manifest["decoding"] = settings
    writer.add_tensor("joint_logits", joint_logits, "[steps, V+1+n_durations]")
    writer.add_tensor("lstm_state_0", lstm_state, "[layers, 2, H]")
    writer.add_json("decode", decode)
    writer.add_tensor("decode_margins", margins, "[positions]")
    writer.note(
        f"decode: NeMo {settings['strategy']} (label looping), batch 1; joint rows replayed "
        f"through the greedy TDT rules reproduce its ids, frames and durations"
    )
    log.info(
        "reference parakeet-tdt: decoded %d tokens in %d joint steps in %.2f s",
        len(decode["ids"]), len(joint_logits), writer.manifest["seconds"]["decoding"],
    )
