"""Metrics against values worked out by hand (or in plain float64 arithmetic beside them)."""

from __future__ import annotations

import math
import statistics
import warnings

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from audioparity.compare import metrics as m
from audioparity.compare import sequences as seq
from audioparity.contract.errors import AudioparityError

FLOAT_METRICS = (m.cosine, m.std_ratio, m.nmse, m.median_row_nmse, m.max_abs, m.mean_abs,
                 m.max_rel)
INF, NAN = math.inf, math.nan


def test_cosine_of_small_vectors_matches_the_formula():
    # a·b = 1 + 4 + 6 = 11, |a| = sqrt(14), |b| = 3
    assert m.cosine([1, 2, 3], [1, 2, 2]) == pytest.approx(11 / (3 * math.sqrt(14)), rel=1e-15)
    assert m.cosine([1, 0], [0, 1]) == 0.0
    assert m.cosine([1, 2], [-2, -4]) == pytest.approx(-1.0, rel=1e-15)
    assert m.cosine([[1, 2], [3, 4]], [[1, 2], [3, 4]]) == pytest.approx(1.0, rel=1e-15)


def test_std_ratio_is_candidate_spread_over_reference_spread():
    # population std: [1, 3] -> 1, [0, 4] -> 2
    assert m.std_ratio([1, 3], [0, 4]) == pytest.approx(0.5, rel=1e-15)
    assert m.std_ratio([0, 4], [1, 3]) == pytest.approx(2.0, rel=1e-15)


def test_nmse_normalises_by_the_reference():
    # Σ(a-b)² = 1; Σb² = 1 + 4 + 4 = 9; Σa² = 14
    assert m.nmse([1, 2, 3], [1, 2, 2]) == pytest.approx(1 / 9, rel=1e-15)
    assert m.nmse([1, 2, 2], [1, 2, 3]) == pytest.approx(1 / 14, rel=1e-15)


def _row_nmse_median_by_hand(cand: np.ndarray, ref: np.ndarray) -> float:
    """The median row NMSE in plain float64 loops, with the statistics module's median."""
    rows = []
    for a, b in zip(cand.tolist(), ref.tolist(), strict=True):
        rows.append(sum((x - y) ** 2 for x, y in zip(a, b, strict=True)) / sum(y * y for y in b))
    return statistics.median(rows)


def test_median_row_nmse_ignores_a_few_flipped_rows_and_equals_a_dense_nmse():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal((41, 64))
    # a few flipped roundings: one input element of a q8_0 block off by one step (amax/127)
    # moves a whole output row of the next matmul by step * a weight column
    flipped = ref.copy()
    step = np.abs(ref).max() / 127
    for row in (3, 17, 30):
        flipped[row] += step * rng.standard_normal(64)
    assert m.nmse(flipped, ref) > 1e-6
    assert m.median_row_nmse(flipped, ref) == 0.0
    # a dense error: every row off by the same relative 1e-4, NMSE (1e-4)² in each row
    dense = ref * (1 + 1e-4)
    assert m.median_row_nmse(dense, ref) == pytest.approx(1e-8, rel=1e-9)
    assert m.median_row_nmse(dense, ref) == pytest.approx(m.nmse(dense, ref), rel=1e-9)
    # both: the flipped rows lie above the median, which stays at the dense error's rows
    dense[[3, 17, 30]] = flipped[[3, 17, 30]] * (1 + 1e-4)
    noisy = dense * (1 + 1e-5 * rng.standard_normal(dense.shape))
    assert m.median_row_nmse(noisy, ref) == pytest.approx(_row_nmse_median_by_hand(noisy, ref),
                                                          rel=1e-12)
    assert 0.5e-8 < m.median_row_nmse(noisy, ref) < 2e-8 < 1e-6 < m.nmse(noisy, ref)


def test_median_row_nmse_reads_the_last_axis_as_a_row():
    # rows of [2, 2, 3] are the 4 leading positions; their NMSEs 0, 1/4, 1, 4: median 0.625
    ref = np.ones((2, 2, 3))
    cand = ref.copy()
    cand[0, 1] += 0.5
    cand[1, 0] += 1.0
    cand[1, 1] += 2.0
    assert m.median_row_nmse(cand, ref) == pytest.approx(0.625, rel=1e-15)
    assert m.median_row_nmse([1, 2, 3], [1, 2, 2]) == m.nmse([1, 2, 3], [1, 2, 2])  # one row
    assert m.median_row_nmse(2.0, 1.0) == 1.0  # 0-D: one row of one value
    # a row whose reference is all zero: 0 if the candidate's is too, else inf
    assert m.median_row_nmse([[0.0, 0.0], [1.0, 1.0]], [[0.0, 0.0], [1.0, 1.0]]) == 0.0
    assert m.median_row_nmse([[0.0, 1.0], [1.0, 1.0], [0.0, 1.0]],
                             [[0.0, 0.0], [1.0, 1.0], [0.0, 0.0]]) == INF


def test_abs_errors_and_their_location():
    cand = np.array([[1.0, 2.0], [3.0, 5.0], [0.0, -1.0]])
    ref = np.array([[1.0, 2.5], [3.0, 3.0], [0.0, -1.0]])
    # |a-b| = [[0, .5], [0, 2], [0, 0]]: max 2 at [1, 1], mean 2.5 / 6; max|ref| = 3
    assert m.max_abs(cand, ref) == 2.0
    assert m.mean_abs(cand, ref) == pytest.approx(2.5 / 6, rel=1e-15)
    assert m.max_rel(cand, ref) == pytest.approx(2 / 3, rel=1e-15)
    assert m.argmax(cand, ref) == "1,1"
    assert m.argmax([0, 0, 3], [0, 1, 0]) == "2"
    ref3 = np.zeros((2, 2, 3))
    ref3[0, 1, 1], ref3[1, 0, 2] = 3.0, -4.0
    assert m.argmax(np.zeros((2, 2, 3)), ref3) == "1,0,2"


def test_float32_inputs_are_compared_in_float64():
    # 1 + 2^-23 is the float32 after 1; in float32 arithmetic its square loses the difference
    cand = np.array([1 + 2.0**-23, 1.0], dtype=np.float32)
    ref = np.array([1.0, 1.0], dtype=np.float32)
    assert m.max_abs(cand, ref) == 2.0**-23
    assert m.nmse(cand, ref) == pytest.approx(2.0**-46 / 2, rel=1e-12)
    assert m.cosine(cand, ref) < 1.0


def test_top1_counts_rows_whose_argmax_agrees():
    cand = np.array([[1.0, 3.0, 2.0], [5.0, 0.0, 0.0]])
    ref = np.array([[0.0, 4.0, 1.0], [0.0, 0.0, 5.0]])
    assert m.top1(cand, ref) == 0.5
    assert m.top1(np.stack([cand, cand]), np.stack([ref, cand])) == 0.75  # leading axes flattened
    assert m.top1([0.1, 0.9], [0.3, 0.7]) == 1.0  # 1-D: one row


def test_row_margins_are_the_top_logit_minus_the_runner_up():
    rows = np.array([[0.0, 4.0, 1.0], [2.5, 2.5, 0.0], [-INF, 3.0, -INF], [1.0, INF, INF]])
    assert m.row_margins(rows).tolist() == [3.0, 0.0, INF, 0.0]
    assert m.row_margins(np.array([[7.0], [1.0]])).tolist() == [INF, INF]  # one class


def test_top1_gap_is_the_largest_reference_margin_among_the_flipped_rows():
    # reference margins by row: 3.0, 0.25, 0.5, 2.0; the candidate flips rows 1 and 2
    ref = np.array([[0.0, 4.0, 1.0], [1.0, 1.25, 0.0], [2.0, 0.0, 1.5], [0.0, 0.0, 2.0]])
    cand = ref.copy()
    cand[1] = [1.3, 1.25, 0.0]
    cand[2] = [2.0, 0.0, 2.1]
    assert m.top1_flips(cand, ref) == [(1, 0.25), (2, 0.5)]
    assert m.top1(cand, ref) == 0.5
    assert m.top1_gap(cand, ref) == 0.5
    assert m.top1_gap(ref, ref) == 0.0  # nothing flips
    # leading axes flattened: [2, 2, 3] is rows 0..3
    assert m.top1_gap(cand.reshape(2, 2, 3), ref.reshape(2, 2, 3)) == 0.5
    assert m.top1_flips(cand.reshape(2, 2, 3), ref.reshape(2, 2, 3))[1] == (2, 0.5)
    # a non-finite value: NaN, as top1; no rows named
    nan_cand = cand.copy()
    nan_cand[0, 0] = NAN
    assert math.isnan(m.top1_gap(nan_cand, ref)) and m.top1_flips(nan_cand, ref) == []


def test_decisions_judge_a_rows_runs_of_classes_apart():
    """A TDT joint row [3 tokens | 2 durations]: its top-1 is a token and a duration. Over the
    whole row a duration logit above every token logit would decide nothing; judged apart, a
    duration flip shows with the duration's margin, and a move between a token and a duration
    logit is no flip."""
    ref = np.array([[5.0, 1.0, 0.0, 4.9, 4.0],    # token 0 by 4.0, duration 0 by 0.9
                    [2.0, 0.0, 0.0, 3.0, 2.95]])  # token 0 by 2.0, duration 0 by 0.05
    cand = ref.copy()
    cand[0, 3] = 5.1  # the whole row's top-1 moves from token 0 to duration 0: no decision
    cand[1, 4] = 3.1  # row 1's duration flips, at the reference's margin 0.05
    assert m.top1_flips(cand, ref) == [(0, pytest.approx(0.1)), (1, pytest.approx(0.05))]
    assert m.top1_flips(cand, ref, (3, 2)) == [(1, pytest.approx(0.05))]
    assert m.top1(cand, ref, (3, 2)) == 0.75  # 3 of 4 decisions agree
    assert m.top1_gap(cand, ref, (3, 2)) == pytest.approx(0.05)
    cand[1, 1] = 9.0  # and its token flips where the reference was sure: the larger margin
    assert m.top1_flips(cand, ref, (3, 2)) == [(1, 2.0)]
    with pytest.raises(AudioparityError, match=r"decisions \[3, 3\] do not split a row of 5"):
        m.top1(cand, ref, (3, 3))


def test_kl_is_reference_against_candidate_in_nats():
    # p = softmax([0, ln 3]) = [1/4, 3/4], q = softmax([0, 0]) = [1/2, 1/2]
    # KL(p || q) = 1/4 ln(1/2) + 3/4 ln(3/2) = 3/4 ln 3 - ln 2
    # KL(q || p) = 1/2 ln 2 + 1/2 ln(2/3) = ln 2 - 1/2 ln 3
    ref, cand = [0.0, math.log(3.0)], [0.0, 0.0]
    assert m.kl(cand, ref) == pytest.approx(0.75 * math.log(3.0) - math.log(2.0), rel=1e-14)
    assert m.kl(ref, cand) == pytest.approx(math.log(2.0) - 0.5 * math.log(3.0), rel=1e-14)
    # softmax ignores a constant shift of a row
    assert m.kl([5.0, 5.0], [-2.0, math.log(3.0) - 2.0]) == pytest.approx(m.kl(cand, ref),
                                                                          rel=1e-14)
    # rows are the leading axes; the largest row's divergence is reported
    rows = m.kl([[0.0, 0.0], [1.0, 2.0], [0.0, 0.0]], [[0.0, 0.0], [1.0, 2.0], ref])
    assert rows == pytest.approx(0.75 * math.log(3.0) - math.log(2.0), rel=1e-14)
    assert m.kl([[1.0, 2.0]], [[1.0, 2.0]]) == 0.0
    assert m.kl(3.0, 7.0) == 0.0  # 0-D: one row of one class


def test_kl_drops_agreed_infinities_and_never_passes_a_nan():
    # the masked pad logit (-inf on both sides) is dropped: same value as without it
    expected = 0.75 * math.log(3.0) - math.log(2.0)
    assert m.kl([[0.0, -INF, 0.0]], [[0.0, -INF, math.log(3.0)]]) == pytest.approx(expected,
                                                                                rel=1e-14)
    assert m.kl([-INF, -INF], [-INF, -INF]) == 0.0  # a row left empty
    assert math.isnan(m.kl([0.0, NAN], [0.0, 1.0]))
    assert math.isnan(m.kl([0.0, 1.0], [0.0, NAN]))
    assert math.isnan(m.kl([0.0, -INF], [0.0, 1.0]))  # masked on one side only
    assert math.isnan(m.kl([INF, 1.0], [-INF, 1.0]))
    # a candidate probability that underflows to 0 where the reference's is 1/2
    assert m.kl([1e308, -1e308], [0.0, 0.0]) == INF


def test_logit_gap_is_the_nearest_tie_the_candidate_broke():
    margins = np.array([INF, 0.5, 0.25, INF])
    assert seq.logit_gap([1, 5, 7, 0], [1, 6, 8, 0], margins) == 0.25
    assert seq.logit_gap([1, 5, 8, 0], [1, 6, 8, 0], margins) == 0.5
    assert seq.logit_gap([2, 6, 8, 0], [1, 6, 8, 0], margins) == INF  # only a forced value differs
    assert seq.logit_gap([1, 6], [1, 6, 8, 0], margins) == 0.25  # values the candidate lacks
    assert seq.logit_gap([1, 6, 8, 0], [1, 6, 8, 0], margins) is None
    assert seq.logit_gap([9, 9], [1, 6], np.array([0.125])) == 0.125  # one margin per position
    assert math.isnan(seq.logit_gap([1, 5], [1, 6], np.array([INF, NAN])))
    with pytest.raises(AudioparityError, match="3 margins for a position of 2 values"):
        seq.logit_gap([1, 5], [1, 6], np.zeros(3))


def test_a_nan_never_passes():
    cand = np.array([1.0, NAN, 3.0])
    ref = np.array([1.0, 2.0, 3.0])
    for metric in FLOAT_METRICS:
        value = metric(cand, ref)
        assert math.isnan(value), metric.__name__
        assert not value >= 0.0 and not value <= 1e300
    assert m.non_finite(cand, ref) == 1
    assert m.argmax(cand, ref) == "1"
    assert math.isnan(m.top1(cand, ref))
    # a NaN on both sides at the same place still counts, and so does one in the reference only
    assert m.non_finite([NAN, 1.0], [NAN, 1.0]) == 1
    assert math.isnan(m.cosine([1.0, 2.0], [1.0, INF]))
    assert m.non_finite([1.0, 2.0], [1.0, INF]) == 0
    assert m.non_finite([1.0, INF], [1.0, 2.0]) == 1


def test_agreed_infinities_are_dropped_not_counted():
    cand = np.array([-INF, 1.0, 2.0, 5.0])
    ref = np.array([-INF, 1.0, 2.5, 5.0])
    finite_cand, finite_ref = cand[1:], ref[1:]
    assert m.non_finite(cand, ref) == 0
    for metric in FLOAT_METRICS:
        assert metric(cand, ref) == metric(finite_cand, finite_ref), metric.__name__
    assert m.mean_abs(cand, ref) == pytest.approx(0.5 / 3, rel=1e-15)
    assert m.argmax(cand, ref) == "2"
    assert m.top1([[-INF, 2.0, 1.0]], [[-INF, 1.0, 0.0]]) == 1.0
    # opposite infinities disagree
    assert m.non_finite([INF, 1.0], [-INF, 1.0]) == 1
    assert math.isnan(m.nmse([INF, 1.0], [-INF, 1.0]))


def test_zero_reference_conventions():
    zeros = np.zeros(3)
    assert m.cosine(zeros, zeros) == 1.0
    assert m.nmse(zeros, zeros) == 0.0
    assert m.std_ratio(zeros, zeros) == 1.0
    assert m.max_rel(zeros, zeros) == 0.0
    off = np.array([0.0, 1e-30, 0.0])
    assert m.cosine(off, zeros) == 0.0
    assert m.cosine(zeros, off) == 0.0
    assert m.nmse(off, zeros) == INF
    assert m.max_rel(off, zeros) == INF
    assert m.std_ratio(off, zeros) == INF
    assert m.std_ratio(np.ones(3), zeros) == 1.0  # both constant


@pytest.mark.parametrize("shape", [(0,), (0, 5), (3, 0)])
def test_empty_arrays_count_as_zero(shape):
    a, b = np.zeros(shape, np.float32), np.zeros(shape, np.float32)
    assert m.cosine(a, b) == 1.0
    assert m.nmse(a, b) == 0.0
    assert m.std_ratio(a, b) == 1.0
    assert m.max_abs(a, b) == m.mean_abs(a, b) == m.max_rel(a, b) == 0.0
    assert m.median_row_nmse(a, b) == 0.0
    assert m.non_finite(a, b) == 0
    assert m.argmax(a, b) is None
    assert m.top1(a, b) == 1.0
    assert m.kl(a, b) == 0.0


def test_huge_values_neither_overflow_nor_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cand = np.array([1.7e308, 1.0])
        ref = np.array([-1.7e308, 1.0])
        assert m.cosine(cand, ref) == pytest.approx(-1.0, rel=1e-12)
        assert m.nmse(cand, ref) == pytest.approx(4.0, rel=1e-12)  # (2x)² / x²
        assert m.max_rel(cand, ref) == pytest.approx(2.0, rel=1e-12)
        assert m.max_abs(cand, ref) == INF  # 3.4e308 is beyond float64
        assert m.max_abs([1e300, -1e300], [1e300, 1e300]) == pytest.approx(2e300, rel=1e-12)
        assert m.std_ratio([3e38, -3e38], [1.5e38, -1.5e38]) == pytest.approx(2.0, rel=1e-12)
        big32 = np.array([3.0e38, -3.0e38], np.float32)
        assert m.nmse(big32, big32 * np.float32(0.5)) == pytest.approx(1.0, rel=1e-6)


def test_shape_mismatch_raises():
    with pytest.raises(AudioparityError, match=r"candidate \[2\], reference \[3\]"):
        m.nmse(np.zeros(2), np.zeros(3))


def test_token_match_and_first_divergence():
    assert seq.token_match([1, 2, 3], [1, 2, 4, 5]) == 0.5  # 2 equal over the longer length 4
    assert seq.token_match([], []) == 1.0
    assert seq.token_match([(1, 0, 1), (2, 1, 2)], [(1, 0, 1), (2, 1, 3)]) == 0.5
    assert seq.first_divergence([1, 2, 3], [1, 2, 4]) == 2
    assert seq.first_divergence([1, 2], [1, 2, 3]) == 2
    assert seq.first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert seq.first_divergence([], []) is None


def test_wer():
    assert seq.wer("a b c", "a x c") == pytest.approx(1 / 3)
    assert seq.wer("a x c d", "a b c") == pytest.approx(2 / 3)  # one substitution, one insertion
    assert seq.wer("", "") == 0.0
    assert seq.wer("a b", "") == 2.0  # empty reference: the count of inserted words
    assert seq.wer("", "a b") == 1.0


@st.composite
def pairs(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    width = 32 if dtype is np.float32 else 64
    elements = st.floats(allow_nan=True, allow_infinity=True, width=width) | st.sampled_from(
        [0.0, 1e-30, 3.0e38, -3.0e38] + ([1.7e308, -1.7e308] if width == 64 else [])
    )
    cand = draw(hnp.arrays(dtype, shape, elements=elements))
    ref = draw(hnp.arrays(dtype, shape, elements=elements))
    return cand, ref


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs())
def test_metrics_never_crash_and_nan_never_passes(pair):
    cand, ref = pair
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        values = {metric.__name__: metric(cand, ref) for metric in FLOAT_METRICS}
        bad = m.non_finite(cand, ref)
        ref_bad = m.non_finite(ref, cand)
        where = m.argmax(cand, ref)
        agreement = m.top1(cand, ref)
        divergence = m.kl(cand, ref)
    agreed = np.isinf(cand) & (cand == ref)
    assert bad == int((~np.isfinite(cand) & ~agreed).sum())
    if bad or ref_bad:
        assert all(math.isnan(v) for v in values.values())
        assert math.isnan(agreement) and math.isnan(divergence)
        if cand.ndim:
            index = tuple(int(i) for i in where.split(","))
            assert not (np.isfinite(cand[index]) and np.isfinite(ref[index]))
    else:
        assert -1.0 <= values["cosine"] <= 1.0
        assert values["nmse"] >= 0.0 and values["max_rel"] >= 0.0 and values["std_ratio"] >= 0.0
        assert values["median_row_nmse"] >= 0.0
        # a mean of equal values may round one ulp above them
        assert values["max_abs"] * (1 + 1e-12) >= values["mean_abs"] >= 0.0
        assert divergence >= 0.0


@settings(max_examples=40, deadline=None)
@given(hnp.arrays(np.float64, hnp.array_shapes(min_dims=1, max_dims=2, max_side=6),
                  elements=st.floats(-1e300, 1e300)))
def test_an_array_against_itself_is_identical(array):
    assert m.cosine(array, array) == pytest.approx(1.0, abs=1e-12)
    assert m.nmse(array, array) == 0.0
    assert m.median_row_nmse(array, array) == 0.0
    assert m.max_abs(array, array) == 0.0
    assert m.std_ratio(array, array) == pytest.approx(1.0, rel=1e-12)
    assert m.top1(array, array) == 1.0
    assert m.kl(array, array) == 0.0


def test_spread_nmse_counts_near_constant_features_in_log_mel_units():
    """Against float64 truth: a per-feature normalised [T, 3] whose last feature is
    near-constant (raw std 1e-5). An error of 1e-6 in its log-mel (a float32 ulp at -16) is
    2.5e-2 once normalised: plain NMSE sees it, spread_nmse counts 1e-6/0.3; an error of 1e-3 in
    a varied feature counts in full in both."""
    from audioparity.compare import metrics as mm

    rng = np.random.default_rng(0)
    raw = np.stack([rng.standard_normal(400) * 2.0, rng.standard_normal(400),
                    -16.6 + 1e-5 * rng.standard_normal(400)], axis=1)

    def normalise(x):
        centred = x - x.mean(axis=0)
        return centred / (centred.std(axis=0, ddof=1) + 1e-5)

    ref = normalise(raw)
    np.testing.assert_allclose(mm.feature_spreads(ref), raw.std(axis=0, ddof=1), rtol=1e-6)
    assert mm.near_constant_features(ref) == 1
    nudged = raw.copy()
    nudged[::2, 2] += 1e-6
    cand = normalise(nudged)
    energy = float(np.sum(ref * ref))
    err = (cand - ref)[:, 2]
    weight = (raw[:, 2].std(ddof=1) + 1e-5) / mm.SPREAD_FLOOR
    assert mm.nmse(cand, ref) > 1e-4
    assert mm.spread_nmse(cand, ref) == pytest.approx(float(np.sum((err * weight) ** 2)) / energy)
    assert mm.spread_nmse(cand, ref) < 1e-11
    varied = ref.copy()
    varied[:, 0] += 1e-3
    assert mm.spread_nmse(varied, ref) == pytest.approx(mm.nmse(varied, ref))
    assert mm.spread_max_rel(varied, ref) == pytest.approx(mm.max_rel(varied, ref))
    assert np.isnan(mm.spread_nmse(np.full_like(ref, np.nan), ref))
