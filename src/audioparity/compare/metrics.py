"""Parity metrics: small pure functions over numpy arrays, computed in float64.

Every tensor metric takes ``(cand, ref)``: the candidate (ggml, external port) and the reference
(NeMo, PyTorch) arrays of the same shape, any real dtype. Conventions shared by all of them:

* **Agreed infinities.** A position where both arrays hold the same infinity (a logit masked to
  ``-inf`` on both sides, as MOSS's pad logit) is agreement: it is dropped before every float
  metric (means and stds run over the other values) and is not counted by :func:`non_finite`.
  ggml's ``test-backend-ops`` likewise skips pairs of infinities in its ``distance``
  (``if (isinf(v1[i]) && isinf(v2[i])) continue;``), though without checking their signs.
* **Other non-finite values.** Any other NaN or infinity, on either side, makes the float metrics
  NaN ("computed only if all finite"); :func:`non_finite` counts them, :func:`argmax` points at
  the first one. A NaN never compares as passing a threshold (``nan >= x`` is false).
* **Zero and empty.** An empty array counts as all zeros. Two all-zero arrays are identical
  (cosine 1, NMSE 0, std ratio 1, max_rel 0); a nonzero candidate against an all-zero reference is
  as far off as a ratio can say (cosine 0, NMSE and max_rel ``inf``; std ratio ``inf`` unless the
  candidate is constant, as the reference is).
* **Huge values.** Sums are taken on arrays divided by a power of two near their largest
  magnitude (exact, see :func:`_scale`), so float64 inputs near 1e308 neither overflow nor warn;
  only a result that is itself out of float64 range (a ``max_abs`` beyond 1.8e308) comes back as
  ``inf`` (Python float arithmetic, no warning).

Logits metrics (:func:`top1`, :func:`kl`, and :func:`top1_gap`, the reference's largest margin
where the top-1 flips) read the last axis as classes. The metrics of sequences and texts are
:mod:`.sequences`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError


def _pair(cand: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Both arrays as float64, and the mask of agreed infinities (all the same shape).

    Raises:
        AudioparityError: the shapes differ.
    """
    cand = np.asarray(cand, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    if cand.shape != ref.shape:
        raise AudioparityError(
            f"metrics need equal shapes: candidate {list(cand.shape)}, reference {list(ref.shape)}"
        )
    return cand, ref, np.isinf(cand) & (cand == ref)


def _finite_pair(cand: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Flattened float64 values without the agreed infinities, or None if a non-finite remains."""
    cand, ref, agreed = _pair(cand, ref)
    cand, ref = cand[~agreed], ref[~agreed]
    if not (np.isfinite(cand).all() and np.isfinite(ref).all()):
        return None
    return cand, ref


def _peak(*arrays: np.ndarray) -> float:
    """Largest magnitude over the arrays (0 for empty or all-zero ones)."""
    return max((float(np.max(np.abs(a))) if a.size else 0.0) for a in arrays)


def _scale(*arrays: np.ndarray) -> float:
    """The power of two ``s`` with ``s <= peak < 2s`` (1 when all zero or empty).

    Dividing by a power of two is exact (short of the subnormal range), so ``a/s − b/s`` rounds
    exactly as ``a − b`` would, while every scaled value stays within (−2, 2).
    """
    peak = _peak(*arrays)
    return math.ldexp(1.0, math.frexp(peak)[1] - 1) if peak > 0 else 1.0


def _scaled_pair(cand: np.ndarray, ref: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, float] | None:
    """:func:`_finite_pair` divided by their common :func:`_scale` ``s``: ``(a/s, b/s, s)``,
    or None if a non-finite value remains."""
    pair = _finite_pair(cand, ref)
    if pair is None:
        return None
    scale = _scale(*pair)
    return pair[0] / scale, pair[1] / scale, scale


def non_finite(cand: np.ndarray, ref: np.ndarray) -> int:
    """Count of NaN/Inf values in ``cand`` that are not agreed infinities.

    A NaN always counts (also where ``ref`` holds a NaN); an infinity counts unless ``ref`` holds
    the same infinity at that position. Call it with the arguments swapped to count the
    reference's own non-finite values.
    """
    cand, _, agreed = _pair(cand, ref)
    return int((~np.isfinite(cand) & ~agreed).sum())


def cosine(cand: np.ndarray, ref: np.ndarray) -> float:
    """Cosine similarity of the flattened arrays: ``Σ a·b / (‖a‖ ‖b‖)``.

    As the C++ parity tools (CrispASR, moss.cpp) report it. Each side is divided by its own
    :func:`_scale` first (cosine is scale-invariant), so nothing overflows. Both all-zero: 1;
    exactly one all-zero: 0 (no shared direction). NaN if a non-finite value remains.
    """
    pair = _finite_pair(cand, ref)
    if pair is None:
        return float("nan")
    a, b = pair
    a = a / _scale(a)
    b = b / _scale(b)
    norm_a = float(np.sqrt(np.dot(a, a)))
    norm_b = float(np.sqrt(np.dot(b, b)))
    if norm_a == 0.0 or norm_b == 0.0:
        return 1.0 if norm_a == norm_b else 0.0
    return float(np.clip(np.dot(a, b) / (norm_a * norm_b), -1.0, 1.0))


def std_ratio(cand: np.ndarray, ref: np.ndarray) -> float:
    """``std(cand) / std(ref)`` over all elements (population std, ddof 0).

    As the C++ parity tools report it: 1 when the candidate has the reference's spread. Both
    arrays are divided by the same :func:`_scale` first (the ratio is invariant).
    ``std(ref) == 0``: 1 if ``std(cand) == 0`` too, else ``inf``. NaN if a non-finite value
    remains.
    """
    scaled = _scaled_pair(cand, ref)
    if scaled is None:
        return float("nan")
    a, b, _ = scaled
    std_a = float(np.std(a)) if a.size else 0.0
    std_b = float(np.std(b)) if b.size else 0.0
    if std_b == 0.0:
        return 1.0 if std_a == 0.0 else float("inf")
    return std_a / std_b


def nmse(cand: np.ndarray, ref: np.ndarray) -> float:
    """Normalised mean squared error ``Σ(a−b)² / Σb²``, ``b`` the reference.

    ggml's ``test-backend-ops`` (``nmse(a, b)``: ``mse(a, b) / mse(a, 0)``) normalises by its
    first argument; here the normaliser is the reference, so the figure does not move when the
    candidate is the one that is off. Its default limit is 1e-7 (5e-4 for matmul, conv and flash
    attention). All-zero reference: 0 if the candidate is all-zero too, else ``inf``. NaN if a
    non-finite value remains.
    """
    scaled = _scaled_pair(cand, ref)
    if scaled is None:
        return float("nan")
    a, b, _ = scaled
    diff = a - b
    err = float(np.dot(diff, diff))
    energy = float(np.dot(b, b))
    if energy == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / energy


def _rows(cand: np.ndarray, ref: np.ndarray, agreed: float
          ) -> tuple[np.ndarray, np.ndarray] | None:
    """Both arrays as rows ``[R, C]`` (leading axes flattened, the last axis the row; a 0-D
    array one row of one value; no row for an empty array), float64, with the infinities both
    hold alike set to ``agreed``; None when another non-finite value remains."""
    a, b, same = _pair(cand, ref)
    if non_finite(a, b) or non_finite(b, a):
        return None
    if a.size == 0:
        return np.zeros((0, 1)), np.zeros((0, 1))
    width = a.shape[-1] if a.ndim else 1
    return (np.where(same, agreed, a).reshape(-1, width),
            np.where(same, agreed, b).reshape(-1, width))


def median_row_nmse(cand: np.ndarray, ref: np.ndarray) -> float:
    """Median over rows of each row's NMSE ``Σ_row(a−b)² / Σ_row b²``: what a dense error
    shows and a few flipped roundings do not.

    Rows are all leading axes flattened, the last axis holds the features (a 1-D array is one
    row, a 0-D array one row of one value), as :func:`top1` reads them: the frames ``[T, D]`` of
    a layer, the steps of ``joint_logits``. A rounding that float32 noise flips in a matmul's
    quantized input (one element off by one step of the type) moves the whole output row of
    that matmul, so such flips are dense within the rows they reach and leave the other rows at
    the float32 floor; an error spread over the tensor (a wrong norm epsilon, a scale off by
    1e-4) lifts every row, and then this equals :func:`nmse` (exactly so when every row has the
    same NMSE). Half of the rows are at least this far off.

    Agreed infinities count as agreement within their row. A row whose reference is all zero:
    0 if the candidate's is too, else ``inf``. No row (an empty array): 0. NaN if a non-finite
    value remains.
    """
    rows = _rows(cand, ref, 0.0)
    if rows is None:
        return float("nan")
    a, b = rows
    if a.size == 0:
        return 0.0
    scale = _scale(a, b)
    a, b = a / scale, b / scale
    err = np.sum((a - b) ** 2, axis=1)
    energy = np.sum(b ** 2, axis=1)
    with np.errstate(over="ignore"):  # a row whose energy underflows beside its error: inf
        rows = np.where(energy > 0, err / np.where(energy > 0, energy, 1.0),
                        np.where(err > 0, np.inf, 0.0))
    return float(np.median(rows))


#: NeMo's ``normalize_batch`` epsilon: a per-feature normalised column is ``(x − μ)/(σ + ε)``.
NORMALIZE_EPSILON = 1e-5
#: The raw spread ``τ`` (the log-mel's own unit, the natural log of power) below which a
#: feature's error is counted in log-mel units rather than normalised ones
#: (:func:`spread_nmse`): a feature whose std over frames is under it is "near-constant".
#: Set so that NeMo against itself (its float32 normalisation against float64 of the same
#: log-mel) stays 10x under the mel gate's float32 bound on band-limited audio (8.6e-12 at
#: most, jfk.wav through 8 kHz; 0.1 lets it reach 7.7e-11), while float32 sums of the statistics
#: frame by frame, 50x NeMo's own noise in those features, still fail it (telephone speech
#: 7.8e-10; 1.0 would let it through at 7.3e-11).
SPREAD_FLOOR = 0.3


def _feature_rows(x: np.ndarray) -> np.ndarray:
    """``x`` as rows ``[R, F]``: its last axis the features, every leading axis flattened into
    the rows (a 0-D array one row of one; an empty one keeps its zero-size axis)."""
    if x.ndim == 0:
        return x.reshape(1, 1)
    return x.reshape(int(np.prod(x.shape[:-1])), x.shape[-1])


def feature_spreads(ref: np.ndarray) -> np.ndarray:
    """Each feature's raw spread ``σ`` (its std over frames before normalisation, in the
    log-mel's units), read from a per-feature normalised reference alone: ``[F]`` float64,
    ``F`` the last axis (the mel bins of ``mel_features`` ``[T, F]``), the rows all leading axes
    flattened.

    NeMo's ``normalize_batch(x, len, "per_feature")`` divides each column by ``σ + ε`` (``σ``
    its unbiased std over frames, ``ε`` :data:`NORMALIZE_EPSILON`), so the normalised column's
    own unbiased std is ``s = σ/(σ + ε)``, and ``σ = ε s/(1 − s)``. ``1 − s`` is floored at
    2^-23 (a float32 ulp of 1, below which the reference's rounding decides it: σ beyond
    about 84 reads as 84). Fewer than two rows: every spread 0 (NeMo's std of one frame).
    """
    rows = _feature_rows(np.asarray(ref, dtype=np.float64))
    if rows.shape[0] < 2:
        return np.zeros(rows.shape[1])
    scale = _scale(rows)  # exact (a power of two), so no square overflows; a column spread
    with np.errstate(over="ignore"):  # beyond the float range is spread enough: s = 1
        s = np.minimum(np.std(rows / scale, axis=0, ddof=1) * scale, 1.0)
    return NORMALIZE_EPSILON * s / np.maximum(1.0 - s, 2.0 ** -23)


def near_constant_features(ref: np.ndarray) -> int:
    """How many features of a per-feature normalised ``ref`` are near-constant: a raw spread
    (:func:`feature_spreads`) under :data:`SPREAD_FLOOR`. 0 where ``ref`` is not finite."""
    b = np.asarray(ref, dtype=np.float64)
    if not np.isfinite(b).all():
        return 0
    return int(np.sum(feature_spreads(b) < SPREAD_FLOOR))


def _spread_weighted(cand: np.ndarray, ref: np.ndarray
                     ) -> tuple[np.ndarray, np.ndarray] | None:
    """The difference ``a − b`` as rows ``[R, F]`` with each feature's column times
    ``min(1, (σ_f + ε)/τ)`` (:func:`feature_spreads` of ``ref``, ``τ`` :data:`SPREAD_FLOOR`),
    and ``b`` as rows, both divided by their common :func:`_scale`; None when a value is not
    finite (a normalised feature holds no infinity)."""
    a, b, _ = _pair(cand, ref)
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        return None
    a, b = _feature_rows(a), _feature_rows(b)
    weights = np.minimum(1.0, (feature_spreads(b) + NORMALIZE_EPSILON) / SPREAD_FLOOR)
    scale = _scale(a, b)
    a, b = a / scale, b / scale
    return (a - b) * weights, b


def spread_nmse(cand: np.ndarray, ref: np.ndarray) -> float:
    """NMSE of a per-feature normalised tensor ``[T, F]`` (rows: the leading axes) with the
    error of each near-constant feature counted in log-mel units:
    ``Σ_f w_f² Σ_t (a−b)² / Σ b²``, ``w_f = min(1, (σ_f + ε)/τ)``, ``σ_f`` the feature's raw
    spread read from the reference (:func:`feature_spreads`), ``τ`` :data:`SPREAD_FLOOR`.

    Normalisation divides each feature's error by ``σ_f + ε``. Where a feature is nearly
    constant (audio band-limited below the model's band: σ about 1e-5 at a mean of −16.6), the
    float32 rounding of the log-mel and of its statistics (a few 1e-6, which NeMo's own float32
    normalisation makes) is amplified 1e5-fold, and NeMo against itself (float32 against
    float64 normalisation of the same log-mel) scores a plain NMSE of ~1e-3. Here such a
    feature's error is scaled back to ``τ`` log-mel units, what it weighs in the log-mel, while
    every feature that varies by ``τ`` or more counts as in :func:`nmse`: equal to it on audio
    whose features all vary, never above it. An error the port makes in every feature (an f16
    rounding of the mel, a wrong pre-emphasis) keeps its size; float32 sums of the statistics
    over frames, 50x NeMo's noise in the near-constant features, still show.

    (Scaling every feature back to its raw spread, ``w_f ∝ σ_f + ε``, hides the near-constant
    features entirely: the float32 sums score 5e-12 on telephone speech, under what a correct
    port scores elsewhere.) All-zero reference, non-finite values: as :func:`nmse`.
    """
    weighted = _spread_weighted(cand, ref)
    if weighted is None:
        return float("nan")
    diff, b = weighted
    err, energy = float(np.sum(diff * diff)), float(np.sum(b * b))
    if energy == 0.0:
        return 0.0 if err == 0.0 else float("inf")
    return err / energy


def spread_max_rel(cand: np.ndarray, ref: np.ndarray) -> float:
    """:func:`max_rel` with the error of each near-constant feature counted in log-mel units,
    as :func:`spread_nmse`: ``max w_f |a−b| / max |b|``. All-zero reference, non-finite values:
    as :func:`max_rel`."""
    weighted = _spread_weighted(cand, ref)
    if weighted is None:
        return float("nan")
    diff, b = weighted
    worst = float(np.max(np.abs(diff))) if diff.size else 0.0
    peak = _peak(b)
    if peak == 0.0:
        return 0.0 if worst == 0.0 else float("inf")
    return worst / peak


def _abs_error(cand: np.ndarray, ref: np.ndarray, reduce) -> float:
    """``reduce(|a − b|)`` computed as ``s · reduce(|a/s − b/s|)`` with the scale ``s`` of
    :func:`_scale` (no overflow for huge values); 0 for empty arrays, NaN if a non-finite value
    remains."""
    scaled = _scaled_pair(cand, ref)
    if scaled is None:
        return float("nan")
    a, b, scale = scaled
    values = np.abs(a - b)
    return (float(reduce(values)) if values.size else 0.0) * scale


def max_abs(cand: np.ndarray, ref: np.ndarray) -> float:
    """``max |a − b|`` (0 for empty arrays; NaN if a non-finite value remains)."""
    return _abs_error(cand, ref, np.max)


def mean_abs(cand: np.ndarray, ref: np.ndarray) -> float:
    """``mean |a − b|`` (0 for empty arrays; NaN if a non-finite value remains)."""
    return _abs_error(cand, ref, np.mean)


def max_rel(cand: np.ndarray, ref: np.ndarray) -> float:
    """``max |a − b| / max |b|``: the largest error relative to the reference's peak magnitude.

    As the published MOSS C++ parity figures (3.5e-7 at f32). All-zero reference: 0 if the
    candidate is all-zero too, else ``inf``. NaN if a non-finite value remains.
    """
    scaled = _scaled_pair(cand, ref)
    if scaled is None:
        return float("nan")
    a, b, _ = scaled
    peak_ref = _peak(b)
    worst = float(np.max(np.abs(a - b))) if a.size else 0.0
    if peak_ref == 0.0:
        return 0.0 if worst == 0.0 else float("inf")
    return worst / peak_ref


def argmax(cand: np.ndarray, ref: np.ndarray) -> str | None:
    """Index of the largest ``|a − b|`` as text, e.g. ``"12,301"`` for ``[row, col]``.

    One comma-separated integer per axis (``"5"`` for 1-D, ``"0,1,17"`` for 3-D); ties go to the
    first in C order. When a non-finite value remains (see the module notes), the index of the
    first one, candidate or reference, so a reader finds where a NaN starts. None for empty or
    0-D arrays.
    """
    a, b, agreed = _pair(cand, ref)
    if a.size == 0 or a.ndim == 0:
        return None
    a, b = np.where(agreed, 0.0, a), np.where(agreed, 0.0, b)
    bad = ~(np.isfinite(a) & np.isfinite(b))
    if bad.any():
        flat = int(np.flatnonzero(bad)[0])
    else:
        scale = _scale(a, b)
        flat = int(np.argmax(np.abs(a / scale - b / scale)))
    return ",".join(str(int(i)) for i in np.unravel_index(flat, a.shape))


def _decisions(width: int, decisions: Sequence[int]) -> list[slice]:
    """The class slices of a logits row of ``width`` classes: one per decision (``decisions``:
    the sizes of the runs of classes, in order, e.g. a TDT joint row's ``[V+1, n_durations]``,
    a token and a duration chosen apart), the whole row when ``decisions`` is empty.

    Raises:
        AudioparityError: the sizes do not add up to ``width``.
    """
    if not decisions:
        return [slice(0, width)]
    if sum(decisions) != width or min(decisions) < 1:
        raise AudioparityError(f"logits decisions {list(decisions)} do not split a row of "
                               f"{width} classes")
    ends = np.cumsum([0, *decisions])
    return [slice(int(a), int(b)) for a, b in zip(ends[:-1], ends[1:], strict=True)]


def _agreement(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int]
               ) -> tuple[np.ndarray, np.ndarray] | None:
    """Per row (leading axes flattened) and decision (:func:`_decisions`): whether the argmax
    agrees, and the reference's margin there (:func:`row_margins`), both ``[rows, decisions]``;
    None when a value is not finite (agreed infinities aside)."""
    a, b, _ = _pair(cand, ref)
    if non_finite(a, b) or non_finite(b, a):
        return None
    if a.size == 0:
        return np.ones((0, 1), bool), np.zeros((0, 1))
    width = a.shape[-1] if a.ndim else 1
    rows_a, rows_b = a.reshape(-1, width), b.reshape(-1, width)
    parts = _decisions(width, decisions)
    agree = np.stack([np.argmax(rows_a[:, p], axis=1) == np.argmax(rows_b[:, p], axis=1)
                      for p in parts], axis=1)
    margins = np.stack([row_margins(rows_b[:, p]) for p in parts], axis=1)
    return agree, margins


def top1_agreement(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()
                   ) -> dict[str, Any]:
    """The top-1 metrics of a logits array, from one argmax of each row: ``top1``
    (:func:`top1`), ``top1_flips`` (:func:`top1_flips`) and ``logit_gap`` (:func:`top1_gap`).

    Raises:
        AudioparityError: ``decisions`` do not split the last axis.
    """
    found = _agreement(cand, ref, decisions)
    if found is None:
        return {"top1": float("nan"), "top1_flips": [], "logit_gap": float("nan")}
    agree, margins = found
    if agree.size == 0:
        return {"top1": 1.0, "top1_flips": [], "logit_gap": 0.0}
    flipped = np.flatnonzero(~agree.all(axis=1))
    gaps = np.where(agree, -np.inf, margins).max(axis=1)
    flips = [(int(row), float(gaps[row])) for row in flipped]
    return {"top1": float(np.mean(agree)), "top1_flips": flips,
            "logit_gap": max((margin for _, margin in flips), default=0.0)}


def top1(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()) -> float:
    """Fraction of logits rows whose argmax agrees (llama.cpp's "top-1 agreement").

    Rows are all leading axes flattened, the last axis holds the classes (a 1-D array is one
    row). With ``decisions`` (:func:`_decisions`: a row holding several choices, as a TDT joint
    row its token and its duration), the fraction of every row's decisions that agree. Agreed
    infinities (masked logits) take part as themselves. Zero rows: 1 (nothing disagrees). NaN if
    any other non-finite value is present.

    Raises:
        AudioparityError: ``decisions`` do not split the last axis.
    """
    return top1_agreement(cand, ref, decisions)["top1"]


def row_margins(rows: np.ndarray) -> np.ndarray:
    """The decision margin of each row of ``rows`` ``[R, C]``: its largest value minus its
    second largest (0 where the top two tie, ``inf`` for a row of one class or one whose
    runner-up is ``-inf``), float64 ``[R]``. What greedy decoding leaves between its choice and
    the runner-up (:func:`audioparity.models.parakeet_tdt.greedy.decision_margins` takes it per
    decision of a TDT row)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.shape[1] < 2:
        return np.full(rows.shape[0], np.inf)
    top = np.partition(rows, -2, axis=1)[:, -2:]
    # inf - inf: a row of two infinities ties; a difference beyond float64 is an inf margin
    with np.errstate(invalid="ignore", over="ignore"):
        margins = top[:, 1] - top[:, 0]
    return np.where(np.isnan(margins), 0.0, margins)


def top1_flips(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()
               ) -> list[tuple[int, float]]:
    """The rows (leading axes flattened, as :func:`top1` counts them) whose argmax differs,
    each with the reference's margin there (:func:`row_margins`: how near a tie the reference's
    own choice was; with ``decisions``, the largest over the row's decisions that differ): which
    steps of ``joint_logits`` or ``decode_logits``, which audio heads of ``audio_logits``.
    Empty when the values are not all finite (top1 is NaN then) or every row agrees."""
    return top1_agreement(cand, ref, decisions)["top1_flips"]


def top1_gap(cand: np.ndarray, ref: np.ndarray, decisions: Sequence[int] = ()) -> float:
    """The per-step judgment of a logits stage: the LARGEST reference margin among the rows
    whose top-1 flips (:func:`top1_flips`), 0.0 when none does; NaN when a value is not finite
    (as :func:`top1`).

    A row fed the reference's own history (teacher-forced) is one step: at most a near tie
    (a margin within the logits' own error) may flip, and a flip at a clear margin anywhere is
    an error. Unlike a document's :func:`logit_gap` (the nearest tie where the sequences first
    part, nothing after it judged), every row counts, so the largest margin is the one to gate.
    """
    return top1_agreement(cand, ref, decisions)["logit_gap"]


def log_softmax(rows: np.ndarray) -> np.ndarray:
    """``log softmax`` of each row of ``rows`` ``[R, C]`` (float64, ``-inf`` entries allowed).

    ``x − max − log Σ exp(x − max)``; a row holding only ``-inf`` stays ``-inf``. A difference
    beyond the float64 range (``x − max`` below −1.8e308) is ``-inf``, as its exponential is 0.
    """
    peak = np.max(rows, axis=1, keepdims=True)
    peak = np.where(np.isfinite(peak), peak, 0.0)
    with np.errstate(over="ignore", divide="ignore"):
        shifted = rows - peak
        total = np.sum(np.exp(shifted), axis=1, keepdims=True)
        return shifted - np.where(total > 0, np.log(total), 0.0)


def kl(cand: np.ndarray, ref: np.ndarray) -> float:
    """Largest KL divergence ``KL(ref ‖ cand)`` over logits rows, in nats.

    Per row, with ``p = softmax(ref)`` and ``q = softmax(cand)`` over the row's entries:
    ``KL = Σ_i p_i (log p_i − log q_i)`` (terms with ``p_i = 0`` are 0). This is llama.cpp's
    ``llama-perplexity --kl-divergence`` (tools/perplexity/perplexity.cpp, ``log_softmax``:
    ``sum += p_base * (p_log_base - logits[i] + max_logit)``, the base model's distribution
    first), which reports the mean and percentiles over tokens; here the maximum over rows, so
    one bad head shows, and exact float64 (llama.cpp stores the base log-probabilities as
    16-bit and skips ``log p_base <= -16``).

    Rows are all leading axes flattened, the last axis holds the classes (a 1-D array is one
    row, a 0-D array one row of one class). Agreed infinities (a logit masked to ``-inf`` on both
    sides, as MOSS's audio pad logit) are dropped from their row before the softmax; a row left
    empty counts 0. Rounding can make a row's sum a few ulps negative: it is clipped at 0.
    A candidate logit that underflows to probability 0 where the reference's is not gives
    ``inf``. Zero rows: 0. NaN if any other non-finite value is present (see the module notes).
    """
    rows = _rows(cand, ref, -np.inf)
    if rows is None:
        return float("nan")
    a, b = rows
    if a.size == 0:
        return 0.0
    log_p, log_q = log_softmax(b), log_softmax(a)
    with np.errstate(over="ignore", invalid="ignore"):  # -inf - -inf where p = 0: dropped
        terms = np.where(log_p > -np.inf, np.exp(log_p) * (log_p - log_q), 0.0)
    return max(0.0, float(np.max(np.sum(terms, axis=1))))
