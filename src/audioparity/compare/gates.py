"""Gates are data: the config says what each stage must reach; :func:`status` is the one place a
stage's status is computed.

Config section (one per family, e.g. ``parakeet_tdt:`` in config/config.yaml)::

    gates:                       # per weight type, each a list of entries tried in order
      default:                   # applies to every weight type, after the weight type's own list
        - {stage: mel_features, cosine_min: 0.99999}
        - {stage: "layer_*", cosine_min: 0.99999, nmse_max: 1.0e-8}
        - {stage: decode, exact: true}
      f16:                       # a weight type's own entries come before `default`
        - {stage: "layer_*", cosine_min: 0.999}
    expected_failures:           # optional; a failing stage that matches shows as `xfail`
      - {stage: enc_out, weight_type: f16, model: "*", backend: "*", reason: "f16 overflow"}
    extra_expected_failures:     # optional; more of them, from a config given after this one

The same for MOSS (``moss_voicegen:``), whose head logits and documents have keys of their own::

    gates:
      default:
        - {stage: prompt, exact: true, wer_max: 0.0}    # rows identical, WER on the text
        - {stage: "*hidden", max_rel_max: 1.0e-5}        # last_hidden, probe_hidden, step_...
        - {stage: "*_logits", max_rel_max: 1.0e-5, top1_min: 1.0, kl_max: 1.0e-9}
        - {stage: generation, exact: true}               # every generated row (logit_gap shown)
    expected_failures:
      - {stage: "*hidden", model: tiny-massive, weight_type: f16, reason: "exceeds f16 range"}

Gate entry: ``stage`` (an fnmatch pattern, case-sensitive, matched against the CANDIDATE's stage
name, so ``layer_*`` also matches ``layer_3_isolated``: put ``layer_*_isolated`` first to gate it
apart) and at least one threshold:

=======================  =========  ========================================================
key                      applies to passes when
=======================  =========  ========================================================
``cosine_min``           tensors    cosine >= value
``nmse_max``             tensors    nmse <= value
``median_row_nmse_max``  tensors    median_row_nmse <= value: the median over rows (last axis
                                    the features) of each row's NMSE; a few flipped roundings,
                                    each moving the rows it reaches, leave it at the float32
                                    floor, an error spread over the tensor lifts it to the NMSE
``max_rel_max``          tensors    max_rel <= value
``max_abs_max``          tensors    max_abs <= value
``std_ratio_tol``        tensors    abs(1 - std_ratio) <= value
``spread_nmse_max``      normalised spread_nmse <= value, where the reference has near-constant
                         features   features (a raw std under ``SPREAD_FLOOR``, read from its
                                    normalised output: band-limited audio's top mel bins); such
                                    a row is judged by these two alone, each feature's error
                                    in log-mel units where it is near-constant
                                    (:func:`audioparity.compare.metrics.spread_nmse`), its
                                    cosine, NMSE, max_rel, max_abs, median row NMSE and std
                                    ratio not read; on a row whose features all vary these two
                                    are not read. The reason says which (``near-constant
                                    features (N of M bins: ...)``)
``spread_max_rel_max``   normalised spread_max_rel <= value, likewise
``top1_min``             logits     top1 >= value (tensors whose stage name contains "logits")
``kl_max``               logits     kl <= value: the largest KL(ref || cand) over rows, in nats
``token_match_min``      documents  token_match >= value
``wer_max``              documents  wer <= value (documents with a "text" field)
``wer_known_max``        documents  wer_known <= value: the candidate's text against the case's
                                    known ``text`` (case and punctuation aside); cases without one
                                    are not held to it
``exact``                documents  ``true``: every field of the reference document is identical
``logit_gap_max``        documents  identical, or the first divergence is at a near-tie: the
                                    reference's margin there (``logit_gap``) <= value
``logit_gap_max``        logits     every row whose top-1 flips is a near tie: the largest
                                    reference margin among them (``logit_gap``, 0 when none
                                    flips) <= value; judged step by step, so on a teacher-forced
                                    decode one flip costs its own step, never the rest
=======================  =========  ========================================================

Besides its thresholds, every tensor stage fails on a non-finite value (a NaN never passes), and
so does a document whose candidate margins (its ``<doc>_margins`` tensor, see
:mod:`audioparity.compare.cell`) hold a NaN: a decision taken on non-finite logits. Every stage
fails on a shape or layout mismatch. A threshold that does not apply to the stage it matched
(``cosine_min`` on a document, ``top1_min`` or ``kl_max`` on hidden states) is a config error.
A document's auxiliary ``<doc>_margins`` tensor is no stage: a gate entry naming it matches
nothing. ``logit_gap`` (the reference's margin where the documents part) is gated by
``logit_gap_max``, and a failing ``exact`` names it in the reason, to tell a near-tie from a real
error. A logits stage's ``logit_gap`` is the largest reference margin over the rows whose top-1
flips (:func:`audioparity.compare.metrics.top1_gap`); a failing ``logit_gap_max`` names the
first of the rows that flip at a clear margin, with their margins.

Length scaling and carried noise (optional, per family section: ``length_scaling``,
``carried_noise``) move the float32 bounds with the case: its length, and the error an upstream
stage carries into the stages after it on band-limited audio (:mod:`audioparity.compare.scaling`).

Unmeasured gates (optional, per family section): the backends' lists (``<weight type>@<ggml
backend>``) that no device of that backend has measured, each with why (copies of another
backend's, say), by name or fnmatch pattern::

    unmeasured_gates:
      "*@cuda": copied from the Vulkan lists (lavapipe)

Their entries judge as any other; each carries the mark ``unmeasured on cuda: <why>``, which the
``gate`` column shows after the gate (:func:`gate_text`) and the report reads back from it
(:func:`unmeasured_mark`): a stage that passes on such a gate does not read as one that passes
on a measured one.

Expected failure: ``stage`` and ``reason`` required; ``model``, ``backend``, ``weight_type``,
``candidate`` and ``case`` patterns default to ``"*"``. A matching stage that fails is
``xfail``; one that passes is ``fail`` ("declared expected failure passed (stale declaration:
...)"), so declarations cannot go stale silently. ``strict: false`` declares an outcome that float
noise decides, one machine's rounding against another's (a greedy decode of a random fixture that
re-routes after a near-tie): a pass there is ``pass``, its reason naming the declaration.
``unavailable``, ``crashed`` and ``missing`` are reported as such, declared or not.

:func:`~.gate_lists.resolve_gates` turns a section into the gates of one cell (JSON-serialisable;
what the workflow passes as ``audioparity compare --gates '<json>'``)::

    {"gates": [{"stage": "layer_*", "from": "f16", "cosine_min": 0.999}, ...],
     "expected_failures": [{"stage": "enc_out", "reason": "f16 overflow"}]}

``from`` names the list an entry came from (the weight type or ``default``) and shows in the
``gate`` column, e.g. ``f16/layer_*: cosine>=0.999``; an entry of an unmeasured list also has
``unmeasured``, its mark.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any, NamedTuple

from audioparity.compare.metrics import SPREAD_FLOOR
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import (
    NOT_COMPARED,
)

#: Threshold key -> (metric it reads, comparison). ``std_ratio_tol`` and ``exact`` are special.
_LIMITS = {
    "cosine_min": ("cosine", ">="),
    "nmse_max": ("nmse", "<="),
    "median_row_nmse_max": ("median_row_nmse", "<="),
    "max_rel_max": ("max_rel", "<="),
    "max_abs_max": ("max_abs", "<="),
    "spread_nmse_max": ("spread_nmse", "<="),
    "spread_max_rel_max": ("spread_max_rel", "<="),
    "std_ratio_tol": ("std_ratio", "tol"),
    "top1_min": ("top1", ">="),
    "kl_max": ("kl", "<="),
    "token_match_min": ("token_match", ">="),
    "wer_max": ("wer", "<="),
    "wer_known_max": ("wer_known", "<="),
}
#: Numeric threshold keys: the limits, and ``logit_gap_max`` (documents part, logits rows flip,
#: at a near-tie only).
NUMERIC = (*_LIMITS, "logit_gap_max")
THRESHOLDS = (*NUMERIC, "exact")
PATTERNS = ("model", "backend", "weight_type", "candidate", "case")
#: The thresholds that judge a per-feature normalised stage (``mel_features``) whose reference
#: has near-constant features (:func:`~audioparity.compare.metrics.near_constant_features`),
#: each error counted in log-mel units there; and the thresholds they replace on such a row,
#: which read the normalised values, where float32 noise is amplified 1e5-fold (module notes).
SPREAD_KEYS = ("spread_nmse_max", "spread_max_rel_max")
SPREAD_REPLACES = ("cosine_min", "nmse_max", "median_row_nmse_max", "max_rel_max", "max_abs_max",
                   "std_ratio_tol")
#: The section's key naming the backend gate lists no device of their backend has measured
#: (module docstring), and how an entry's mark begins: ``unmeasured on <ggml backend>: <why>``.
UNMEASURED_GATES, UNMEASURED = "unmeasured_gates", "unmeasured on"
#: The mark at the end of a gate's text (:func:`gate_text`), read back by :func:`unmeasured_mark`.
_UNMEASURED_TEXT = re.compile(rf" \(({UNMEASURED} [^:]+: .+)\)$")


class Verdict(NamedTuple):
    """A stage's status, the text form of the gate applied, and why (empty for ``pass``)."""

    status: str
    gate: str
    reason: str


#: How the reason of a declared (strict) expected failure that passed begins: the stage meets
#: its gate, and fails only as a stale declaration.
STALE = "declared expected failure passed"


def unmeasured_mark(text: str) -> str | None:
    """The unmeasured mark (``unmeasured on cuda: ...``) a ``gate`` column's ``text`` ends with
    (:func:`gate_text`), None for a gate of a measured list."""
    found = _UNMEASURED_TEXT.search(text)
    return found.group(1) if found else None


def gate_for(stage: str, gates: Mapping[str, Any]) -> dict[str, Any]:
    """The first gate entry whose ``stage`` pattern matches ``stage``.

    Raises:
        AudioparityError: no entry matches (a stage without a gate is a config error, never a
            silent pass).
    """
    for entry in gates["gates"]:
        if fnmatchcase(stage, entry["stage"]):
            return entry
    tried = ", ".join(("{from}/".format(**e) if "from" in e else "") + e["stage"]
                      for e in gates["gates"]) or "none"
    raise AudioparityError(f"gates: no entry matches stage {stage!r} (patterns tried: {tried}); "
                           "every stage needs one (a pattern ending in '*' also covers the names "
                           "it begins, a stage's isolated and replayed forms too)")


def gate_text(gate: Mapping[str, Any]) -> str:
    """Text form of a gate entry for the ``gate`` column, e.g. ``f16/layer_*: cosine>=0.999``,
    then ``(scaled to T frames)`` and ``(carries mel_features' noise: the reference's own,
    x10)`` where its bounds were moved (:mod:`audioparity.compare.scaling`), and
    ``(unmeasured on cuda: why)`` where its list is unmeasured, last."""
    terms = []
    for key, (metric, op) in _LIMITS.items():
        if key in gate:
            if op == "tol":
                terms.append(f"|1-{metric}|<={float(gate[key])!r}")
            else:
                terms.append(f"{metric}{op}{float(gate[key])!r}")
    if gate.get("exact") is True:
        terms.append("exact")
    if "logit_gap_max" in gate:
        terms.append(f"near ties only: logit_gap<={float(gate['logit_gap_max'])!r}")
    origin = f"{gate['from']}/" if "from" in gate else ""
    length = f" (scaled to {gate['length']} frames)" if "length" in gate else ""
    carried = f" (carries {gate['carried']})" if "carried" in gate else ""
    unmeasured = f" ({gate['unmeasured']})" if "unmeasured" in gate else ""
    return f"{origin}{gate['stage']}: {', '.join(terms)}{length}{carried}{unmeasured}"


def _passes(op: str, value: float, limit: float) -> bool:
    """Whether ``value`` meets ``limit`` under ``op`` (``>=``, ``<=``, ``tol``); NaN never does."""
    if op == ">=":
        return value >= limit
    if op == "<=":
        return value <= limit
    return abs(1.0 - value) <= limit


def _shown(op: str, value: float, limit: float) -> str:
    """``value`` with the fewest significant digits (4 or more) that still miss ``limit``."""
    if math.isnan(value):
        return "NaN"
    for digits in range(4, 18):
        text = f"{value:.{digits}g}"
        if not _passes(op, float(text), limit):
            return text
    return repr(value)


#: How a missed threshold reads in the reason column, per comparison.
_MISSED = {
    ">=": "{metric} {value} < {limit}",
    "<=": "{metric} {value} > {limit}",
    "tol": "{metric} {value} outside 1 ± {limit}",
}


def _threshold_failures(stage: str, gate: Mapping[str, Any], metrics: Mapping[str, Any]) -> list:
    """One reason per threshold of ``gate`` that ``metrics`` miss, e.g. ``cosine 0.9981 < 0.99999``.

    Raises:
        AudioparityError: a threshold whose metric does not apply to this stage (None, and
            not among ``not_measured``).
    """
    failures = []
    skipped = _spread_skipped(gate, metrics)
    for key, (metric, op) in _LIMITS.items():
        if key not in gate or key in skipped:
            continue
        value = metrics.get(metric)
        if value is None and metric in metrics.get("not_measured", {}):
            continue
        if value is None:
            raise AudioparityError(
                f"gates: {gate_text(gate)!r} sets {key}, which does not apply to stage {stage!r} "
                f"(no {metric} for it)"
            )
        value, limit = float(value), float(gate[key])
        if not _passes(op, value, limit):
            shown = _shown(op, value, limit)
            failures.append(_MISSED[op].format(metric=metric, value=shown, limit=repr(limit)))
    if gate.get("exact") is True:
        if metrics.get("exact") is None:
            raise AudioparityError(
                f"gates: {gate_text(gate)!r} sets exact, which applies to documents, "
                f"not to stage {stage!r}"
            )
        if not metrics["exact"]:
            details = []
            if metrics.get("first_divergence") is not None:
                details.append(f"first divergence at position {metrics['first_divergence']}")
            if metrics.get("logit_gap") is not None:
                details.append(f"reference logit gap {metrics['logit_gap']:.4g}")
            at = f" ({', '.join(details)})" if details else ""
            failures.append(f"not exact: {', '.join(metrics.get('differing', []))} differ{at}")
    if "logit_gap_max" in gate:
        failures.extend(_near_tie_failures(stage, gate, metrics))
    return failures


def _spread_skipped(gate: Mapping[str, Any], metrics: Mapping[str, Any]) -> tuple[str, ...]:
    """The thresholds of ``gate`` not read on this row: none without :data:`SPREAD_KEYS`;
    where the reference has near-constant features (``near_constant``: their count, > 0),
    :data:`SPREAD_REPLACES`; else :data:`SPREAD_KEYS` (every feature varies, the plain ones
    judge)."""
    if not any(key in gate for key in SPREAD_KEYS):
        return ()
    return SPREAD_REPLACES if metrics.get("near_constant") else SPREAD_KEYS


def spread_note(gate: Mapping[str, Any], metrics: Mapping[str, Any]) -> str:
    """What a row judged by :data:`SPREAD_KEYS` says of it (empty for any other row):
    ``near-constant features (28 of 128 bins: std < 0.3 before normalisation): judged by
    NMSE with their error in log-mel units (spread_nmse 9.9e-12, spread_max_rel 2.0e-05)``."""
    if _spread_skipped(gate, metrics) != SPREAD_REPLACES:
        return ""
    figures = ", ".join(f"{metric} {float(metrics[metric]):.2g}"
                        for metric in ("spread_nmse", "spread_max_rel")
                        if metrics.get(metric) is not None)
    return (f"near-constant features ({metrics['near_constant']} of {metrics['features']} "
            f"bins: std < {SPREAD_FLOOR} before normalisation): judged by NMSE with their "
            f"error in log-mel units ({figures})")


#: How many of the rows a logits stage flips at a clear margin its reason names.
FLIPS_NAMED = 5


def _near_tie_failures(stage: str, gate: Mapping[str, Any], metrics: Mapping[str, Any]) -> list:
    """``logit_gap_max``: documents that part must part where the reference's own choice was a
    near-tie (its margin, the chosen logit minus the runner-up, at most the limit); the rows of
    a logits stage (its ``top1_flips``) may flip their top-1 only at such a near tie, each row
    judged on its own (:func:`_flip_failures`).

    A greedy decode is chaotic after one flipped choice, so counting matching tokens measures
    luck; whether the first flip happened where the weight type's rounding could flip it does
    not. Identical documents pass. Set the limit from the logits error measured at that weight
    type (e.g. twice the head logits' max_abs).

    Raises:
        AudioparityError: the stage is neither a document nor a logits stage.
    """
    if "top1_flips" in metrics:
        return _flip_failures(gate, metrics)
    if metrics.get("exact") is None:
        raise AudioparityError(
            f"gates: {gate_text(gate)!r} sets logit_gap_max, which applies to documents and "
            f"logits, not to stage {stage!r}"
        )
    if metrics["exact"]:
        return []
    gap, limit = metrics.get("logit_gap"), float(gate["logit_gap_max"])
    at = metrics.get("first_divergence")
    if gap is None:
        return [f"parted at position {at}; no reference margins to tell a near-tie"]
    if not gap <= limit:
        return [f"parted at position {at} where the reference's logit gap {gap:.4g} > {limit!r}"]
    return []


def _flip_failures(gate: Mapping[str, Any], metrics: Mapping[str, Any]) -> list:
    """``logit_gap_max`` on a logits stage: the rows whose top-1 flips where the reference's
    margin exceeds the limit, the first :data:`FLIPS_NAMED` named with their margins
    (``top1_flips``: ``[(row, margin), ...]``); a NaN ``logit_gap`` (non-finite logits) never
    passes."""
    limit = float(gate["logit_gap_max"])
    clear = [(row, margin) for row, margin in metrics["top1_flips"] if not margin <= limit]
    if clear:
        named = ", ".join(f"{row} ({margin:.4g})" for row, margin in clear[:FLIPS_NAMED])
        more = f" and {len(clear) - FLIPS_NAMED} more" if len(clear) > FLIPS_NAMED else ""
        return [f"top-1 flips at {len(clear)} row(s) where the reference's margin > {limit!r}: "
                f"row (margin) {named}{more}"]
    gap = metrics.get("logit_gap")
    if gap is not None and not gap <= limit:
        return [f"logit_gap {_shown('<=', float(gap), limit)} > {limit!r}"]
    return []


def _non_finite_failures(metrics: Mapping[str, Any]) -> list[str]:
    failures = []
    if metrics.get("non_finite"):
        where = metrics.get("argmax")
        at = f" (first at {where})" if where else ""
        what = "candidate margins" if "exact" in metrics else "candidate"  # a document's
        failures.append(f"{metrics['non_finite']} non-finite value(s) in {what}{at}")
    if metrics.get("ref_non_finite"):
        failures.append(f"reference holds {metrics['ref_non_finite']} non-finite value(s)")
    return failures


def _expected_failure(stage: str, gates: Mapping[str, Any]) -> dict[str, Any] | None:
    for entry in gates.get("expected_failures", []):
        if fnmatchcase(stage, entry["stage"]):
            return entry
    return None


def status(
    stage: str,
    gates: Mapping[str, Any],
    *,
    availability: str = "ok",
    metrics: Mapping[str, Any] | None = None,
    problems: tuple[str, ...] = (),
    rule: str | None = None,
) -> Verdict:
    """THE place a stage's status is computed.

    Args:
        stage: the candidate's stage name (the reference's for a stage the candidate lacks).
        gates: resolved gates of the cell (:func:`~.gate_lists.resolve_gates`).
        availability: ``ok`` (compared), or ``unavailable`` / ``crashed`` / ``missing``, which
            become the status with ``problems`` as the reason.
        metrics: the stage's metrics (``compare`` computes them); ``None`` for a metric that does
            not apply. Besides the summary columns it may hold ``ref_non_finite`` (count in the
            reference), and for documents ``exact`` and ``differing`` (the fields that differ);
            a document's ``non_finite`` counts the NaN decision margins of the candidate;
            ``not_measured`` (``{metric: why}``) names the metrics left out because the
            candidate does not write their field (its ``omits``): their thresholds are not read.
        problems: reasons that fail the stage outright (shape, layout or kind mismatch).
        rule: for a row that no gate list judges (``storage``, ``stored_weights``: a quantized
            cell's file against what was asked, its bytes against ggml's quantizer), the text
            of its fixed rule, the ``gate`` column; ``problems`` alone decide it.

    Returns:
        pass, fail, or xfail (fails while an expected failure is declared); a declared
        expected failure that passes is ``fail`` (stale), or ``pass`` with the declaration in
        its reason where it is declared ``strict: false``. Non-finite values fail a stage before
        any threshold is read. A stage not compared keeps its availability as status, and its
        gate text if one matches (none needed: a stage only the candidate dumps is missing, not
        a config error).

    Raises:
        AudioparityError: no gate matches a compared stage, or a threshold does not apply to it.
    """
    if availability in NOT_COMPARED:
        matching = [gate_text(e) for e in gates["gates"] if fnmatchcase(stage, e["stage"])]
        return Verdict(availability, matching[0] if matching else "", "; ".join(problems))
    if availability != "ok":
        raise AudioparityError(f"stage {stage!r}: unknown availability {availability!r}")
    gate = {} if rule is not None else gate_for(stage, gates)
    text = rule if rule is not None else gate_text(gate)
    metrics = metrics or {}
    note = ""
    if problems or rule is not None:
        failures = list(problems)
    else:
        missed = _threshold_failures(stage, gate, metrics)
        failures = _non_finite_failures(metrics) or missed
        note = spread_note(gate, metrics)
    declared = _expected_failure(stage, gates)
    if note:
        failures = [f"{note}: {failure}" for failure in failures[:1]] + failures[1:]
    if failures:
        if declared:
            return Verdict("xfail", text, f"expected ({declared['reason']}): {'; '.join(failures)}")
        return Verdict("fail", text, "; ".join(failures))
    if declared and declared.get("strict", True):
        stale = f"{STALE} (stale declaration: {declared['reason']})"
        return Verdict("fail", text, stale)
    if declared:
        return Verdict("pass", text, "; ".join(filter(None, [
            f"passed; declared as a possible failure ({declared['reason']})", note])))
    return Verdict("pass", text, note)
