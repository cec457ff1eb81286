"""Greedy TDT decoding of one utterance, NeMo's rules at batch size 1, on the host; pure
Python and numpy (the NeMo reference and the ggml decoder both use it).

:func:`greedy_tdt` mirrors NeMo's label-looping greedy TDT decoder (``GreedyBatchedTDTInfer``,
strategy ``greedy_batch``, ``TDTLabelLoopingComputer.torch_impl`` in
``nemo/collections/asr/parts/submodules/transducer_decoding/tdt_label_looping.py``) at batch size
1, the decoder the reference dump uses: start from the blank/SOS label (its embedding row, zero)
and a zero LSTM state; at frame ``t`` evaluate the joint; token = argmax of the first V+1 outputs,
duration = ``durations[argmax of the rest]``. Blank: ``t += max(d, 1)``, prediction state
unchanged. Token: emit at ``t``, step the prediction network, ``t += d``; after ``max_symbols``
consecutive tokens on one frame with ``d == 0``, ``t += 1``. (NeMo's older frame-looping
``GreedyTDTInfer``, strategy ``greedy``, differs in corner cases: it re-evaluates a zero-duration
blank on the same frame and counts blanks towards ``max_symbols``.)

:func:`replay_path` runs the same rules over recorded joint rows: the reference checks NeMo's
hypothesis with it, and the ggml dump reads the reference's path (where to evaluate the joint
teacher-forced) off the reference's ``joint_logits``.

A model without durations (parakeet-rnnt: no duration outputs, ``durations`` empty) is decoded
by the same loop as NeMo's label-looping greedy RNNT decoder (``GreedyBatchedRNNTInfer``,
``GreedyBatchedRNNTLabelLoopingComputer.torch_impl`` in ``rnnt_label_looping.py``) decodes it:
every token has duration 0 (it stays on its frame), a blank advances one frame, and after
``max_symbols`` tokens on one frame the frame advances; as in NeMo's RNNT hypotheses, the path
records no token durations.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.spec import Names

#: Decoding strategy of the reference: NeMo's label-looping greedy TDT decoder.
STRATEGY = "greedy_batch"


def replay_path(
    joint_logits: np.ndarray, n_frames: int, durations: list[int], max_symbols: int | None
) -> GreedyPath:
    """The greedy TDT path of recorded joint outputs: :func:`greedy_tdt` (NeMo's
    label-looping rules, batch size 1) with a joint that replays the rows in order, one per
    joint evaluation, and a prediction network that does nothing (the rows already hold its
    effect).

    Args:
        joint_logits: ``[steps, V+1+n_durations]`` joint outputs (raw or log-softmaxed: only
            argmaxes are used); the blank is class V.
        n_frames: number of valid encoder frames T'.
        durations: duration values, e.g. ``[0, 1, 2, 3, 4]`` (empty: RNNT).
        max_symbols: NeMo's ``max_symbols`` (None: no limit).

    Raises:
        AudioparityError: the path asks for more rows than were recorded, or leaves rows over.
    """
    used = 0

    def replay(t: int, _g: Any) -> np.ndarray:
        nonlocal used
        if used == len(joint_logits):
            raise AudioparityError(
                f"greedy TDT path needs more than {used} joint rows "
                f"(asked for one at frame {t} of {n_frames})"
            )
        used += 1
        return joint_logits[used - 1]

    path = greedy_tdt(n_frames, replay, lambda label, state: (None, None),
                      blank_id=joint_logits.shape[1] - len(durations) - 1,
                      durations=durations, max_symbols=max_symbols)
    if used != len(joint_logits):
        raise AudioparityError(f"greedy TDT path used {used} of {len(joint_logits)} joint rows")
    return path


@dataclass(frozen=True)
class GreedyPath:
    """A greedy TDT path: what was emitted, and where the joint was evaluated.

    Attributes:
        ids: emitted token ids.
        frames: encoder frame of each emitted token.
        durations: predicted duration value (not index) of each emitted token; empty for a
            model without durations (RNNT).
        row_frames: encoder frame of each joint evaluation (row of ``joint_logits``).
        row_history: number of tokens emitted before each joint evaluation; the prediction-net
            input of row ``i`` is ``ids[row_history[i] - 1]`` (blank/SOS when 0).
    """

    ids: list[int]
    frames: list[int]
    durations: list[int]
    row_frames: list[int]
    row_history: list[int]

    def within(self, n_frames: int) -> GreedyPath:
        """The part of the path on the first ``n_frames`` encoder frames: the evaluations there
        (frames never decrease along a path) and the tokens emitted there; itself when it
        fits."""
        rows = sum(frame < n_frames for frame in self.row_frames)
        tokens = sum(frame < n_frames for frame in self.frames)
        return GreedyPath(self.ids[:tokens], self.frames[:tokens], self.durations[:tokens],
                          self.row_frames[:rows], self.row_history[:rows])


def greedy_tdt(
    n_frames: int,
    joint: Callable[[int, Any], np.ndarray],
    predict: Callable[[int, Any], tuple[Any, Any]],
    *,
    blank_id: int,
    durations: tuple[int, ...] | list[int],
    max_symbols: int | None,
) -> GreedyPath:
    """Greedy TDT decoding of one utterance (NeMo label looping, batch size 1; module doc).

    Args:
        n_frames: number of valid encoder frames T'.
        joint: ``joint(t, g) -> [V+1+n_durations]`` logits (raw or log-softmaxed) at encoder
            frame ``t`` for prediction-network output ``g``.
        predict: ``predict(label, state) -> (g, state)``, one prediction-network step;
            ``state`` None is the zero state. Called first with the blank (SOS) label.
        blank_id: the blank class V (also the SOS label).
        durations: duration values, e.g. ``(0, 1, 2, 3, 4)``; empty for RNNT (module doc: each
            token's duration is 0, and none is recorded).
        max_symbols: NeMo's ``max_symbols`` (None: no limit).

    Returns:
        The path: emitted ``ids``, their ``frames`` and duration values, and per joint evaluation
        its frame (``row_frames``) and the number of tokens emitted before it (``row_history``).

    Raises:
        AudioparityError: ``joint`` returned a row of the wrong width.
    """
    width = blank_id + 1 + len(durations)
    path = GreedyPath([], [], [], [], [])
    g, state = predict(blank_id, None)
    t = run = 0
    while t < n_frames:
        logits = np.asarray(joint(t, g))
        if logits.shape != (width,):
            raise AudioparityError(
                f"joint output at frame {t} has shape {list(logits.shape)}, expected [{width}] "
                f"(V+1={blank_id + 1} tokens + {len(durations)} durations)"
            )
        path.row_frames.append(t)
        path.row_history.append(len(path.ids))
        token = int(np.argmax(logits[: blank_id + 1]))
        duration = int(durations[int(np.argmax(logits[blank_id + 1 :]))]) if durations else 0
        if token == blank_id:
            t += max(duration, 1)
            continue
        run = run + 1 if path.frames and path.frames[-1] == t else 1
        path.ids.append(token)
        path.frames.append(t)
        if durations:
            path.durations.append(duration)
        g, state = predict(token, state)
        t += duration
        if max_symbols is not None and run >= max_symbols and duration == 0:
            t += 1
    return path


def decision_margins(joint_logits: np.ndarray, path: GreedyPath, n_durations: int) -> np.ndarray:
    """How firmly each emitted token was decided: per position of the decode, the smallest
    margin (top logit minus the runner-up) of the decisions that placed it there, the token
    and duration choices of every joint row evaluated since the previous token (the blanks and
    their skips) and of the row that emitted it. A candidate that leaves the path at a
    position with a small margin broke a near tie (the compare's ``logit_gap``).

    Args:
        joint_logits: ``[steps, V+1+n_durations]`` the rows of ``path``, raw.
        path: the path those rows give (:func:`replay_path`).
        n_durations: number of duration classes.

    Returns:
        ``[positions]`` float32 margins in the joint's logit units.
    """
    rows = np.asarray(joint_logits, dtype=np.float64)
    tokens = np.sort(rows[:, : rows.shape[1] - n_durations], axis=1)
    durations = np.sort(rows[:, rows.shape[1] - n_durations :], axis=1)
    row_margin = tokens[:, -1] - tokens[:, -2]
    if n_durations > 1:
        row_margin = np.minimum(row_margin, durations[:, -1] - durations[:, -2])
    margins = np.full(len(path.ids), np.inf)
    for row, emitted_before in enumerate(path.row_history):
        if emitted_before < len(path.ids):
            margins[emitted_before] = min(margins[emitted_before], row_margin[row])
    return margins.astype(np.float32)


def joint_decisions(width: int, n_durations: int) -> dict[str, list[int]]:
    """The dump manifest's ``decisions`` (:data:`audioparity.compare.stage.DECISIONS`) of the
    transducer's logits stages, rows of ``width`` classes: a TDT row chooses its token among
    the first ``width - n_durations`` and its duration among the last ``n_durations`` apart;
    an RNNT row (no durations) is one decision, and needs no entry."""
    if not n_durations:
        return {}
    return {stage: [width - n_durations, n_durations]
            for stage in (Names.JOINT_LOGITS, Names.DECODE_LOGITS)}


@dataclass(frozen=True)
class CtcPath:
    """A greedy CTC decode: the emitted token ids and the first frame of each one's run."""

    ids: list[int]
    frames: list[int]


def collapse_ctc(labels: list[int] | np.ndarray, blank_id: int) -> CtcPath:
    """The tokens of per-frame CTC labels, as NeMo's ``AbstractCTCDecoding.decode_hypothesis``
    folds them (``fold_consecutive``): a label is emitted where it differs from the previous
    frame's or follows a blank, and is not the blank; its frame is the first of its run (NeMo's
    token start offset)."""
    path = CtcPath([], [])
    previous = blank_id
    for frame, label in enumerate(int(v) for v in labels):
        if (label != previous or previous == blank_id) and label != blank_id:
            path.ids.append(label)
            path.frames.append(frame)
        previous = label
    return path


def greedy_ctc(log_probs: np.ndarray, blank_id: int) -> CtcPath:
    """Greedy CTC decoding of one utterance, NeMo's ``GreedyCTCInfer`` / ``GreedyBatchedCTCInfer``
    (strategies ``greedy``, ``greedy_batch``) at batch size 1: the argmax class of every frame of
    ``log_probs [T', V+1]`` (the first on a tie, as torch's ``argmax``), then
    :func:`collapse_ctc`."""
    return collapse_ctc(np.argmax(np.asarray(log_probs), axis=1), blank_id)


def ctc_margins(log_probs: np.ndarray, path: CtcPath) -> np.ndarray:
    """How firmly each emitted CTC token was decided: per position, the smallest margin (top
    log-probability minus the runner-up) of the frames after the previous token's first frame up
    to this token's first frame, the frames whose argmax placed it there.

    Returns:
        ``[positions]`` float32 margins in log-probability units.
    """
    rows = np.sort(np.asarray(log_probs, dtype=np.float64), axis=1)
    frame_margin = rows[:, -1] - rows[:, -2]
    starts = [-1, *path.frames]
    return np.array([frame_margin[starts[k] + 1 : starts[k + 1] + 1].min()
                     for k in range(len(path.ids))], dtype=np.float32)
