"""The report's "Needs attention": the rows that need it, grouped under their cause."""

from __future__ import annotations

import re
from pathlib import Path

from audioparity.report.attention import Covered, causes, compact, general
from tests.report.sweep import CRASH, STAGES, sweep_rows

LABELS = {"family": "parakeet_tdt", "model": "tiny", "candidate": "a", "backend": "cpu",
          "weight_type": "q4_K"}


def row(case: str, stage: str, status: str, reason: str = "", culprit: str = "",
        **labels) -> dict:
    return {**LABELS, "against": "reference", "case": case, "stage": stage, "status": status,
            "reason": reason, "culprit": culprit, **labels}


def test_rows_without_a_culprit_are_grouped_by_status_and_reason():
    """Cases a and b miss x and y for one reason R: one line, both cases; c misses x only: a
    line of its own; a fail with the same reason is another cause; q8_0's miss another line."""
    rows = [row("a", "x", "missing", "R"), row("a", "y", "missing", "R"),
            row("b", "x", "missing", "R"), row("b", "y", "missing", "R"),
            row("c", "x", "missing", "R"), row("a", "z", "fail", "R"), row("a", "w", "pass"),
            row("a", "x", "missing", "R", weight_type="q8_0"), row("a", "v", "xfail", "S")]
    (missing, failing) = causes(rows)
    assert (missing.text, missing.status, missing.stages) == ("missing: R", "missing", 6)
    assert [(c.labels["weight_type"], c.cases, c.stages) for c in missing.covered] == [
        ("q4_K", ["a", "b"], ["x", "y"]), ("q4_K", ["c"], ["x"]), ("q8_0", ["a"], ["x"])]
    assert missing.covered[0].rows == [("a", "x", "missing", "R"), ("a", "y", "missing", "R"),
                                       ("b", "x", "missing", "R"), ("b", "y", "missing", "R")]
    assert (failing.text, failing.status) == ("fail: R", "fail")
    assert failing.covered == [Covered(LABELS, ["a"], ["z"], [("a", "z", "fail", "R")],
                                       ["fail: R"])]


def test_cells_missing_one_bound_share_a_cause_whatever_they_measured():
    """q4_K and q5_0 break at pre_encode against the same bounds, each with its own values (the
    heldout case of q4_K too: one line with both cases); q2_K breaks at another stage, and
    q8_0 at pre_encode against another bound: two causes more."""
    def cell(weight_type: str, case: str, culprit: str) -> list[dict]:
        return [row(case, stage, "fail", "r", culprit, weight_type=weight_type)
                for stage in ("pre_encode", "enc_out")]

    bound = "pre_encode (fail): nmse {} > 5e-10; max_rel {} > 5e-05"
    rows = [*cell("q4_K", "clip", bound.format("2.9e-08", "0.0002")),
            *cell("q4_K", "heldout", bound.format("3.1e-08", "0.0003")),
            *cell("q5_0", "clip", bound.format("3.5e-08", "0.0004")),
            *cell("q2_K", "clip", "layer_0_isolated (fail, its own error): nmse 2e-08 > 5e-12"),
            *cell("q8_0", "clip", "pre_encode (fail): nmse 2e-09 > 1e-09")]
    found = causes(rows)
    assert [c.text for c in found] == [
        "pre_encode (fail): nmse > 5e-10; max_rel > 5e-05",
        "layer_0_isolated (fail, its own error): nmse > 5e-12",
        "pre_encode (fail): nmse > 1e-09"]
    assert [(c.labels["weight_type"], c.cases) for c in found[0].covered] == [
        ("q4_K", ["clip", "heldout"]), ("q5_0", ["clip"])]
    assert found[0].covered[0].culprits == [bound.format("2.9e-08", "0.0002"),
                                           bound.format("3.1e-08", "0.0003")]
    assert found[0].stages == 6


def test_what_a_cell_measured_is_left_out_of_its_cause_its_bounds_kept():
    assert general("decode (fail): wer 0.5 > 0.0; not exact: ids, text differ (first divergence "
                   "at position 4, reference logit gap 0.0025)") == (
        "decode (fail): wer > 0.0; not exact: ids, text differ")
    assert general("layer_1 (fail): std_ratio 1.02 outside 1 ± 0.01; cosine NaN < 0.99999") == (
        "layer_1 (fail): std_ratio outside 1 ± 0.01; cosine < 0.99999")
    assert general("enc_out (fail): 63 non-finite value(s) in candidate (first at 0,0); "
                   "reference holds 2 non-finite value(s)") == (
        "enc_out (fail): non-finite values in candidate; reference holds non-finite values")
    assert general("joint_logits (crashed): exit code -6") == "joint_logits (crashed): exit code -6"


def test_a_crashed_cell_is_one_cause_its_culprit_across_cases():
    """port_b crashed in layer_0 at q2_K on both cases: the crash and the 7 stages after it in
    each, one cause and one line; transcribe_cpp's failing decode another."""
    found = causes(sweep_rows())
    assert [(c.text, c.status, c.stages) for c in found] == [
        ("decode (fail, its inputs pass; no isolated form to tell its own error): wer > 0.0",
         "fail", 2),
        (f"layer_0 (crashed): {CRASH}", "crashed", 16)]
    (line,) = found[1].covered
    assert line.labels == {"family": "parakeet_tdt", "model": "tiny", "candidate": "port_b",
                           "backend": "cpu", "weight_type": "q2_K"}
    assert line.cases == ["clip", "heldout"] and line.stages == list(STAGES[1:])
    assert compact(line.stages) == "layer_0, layer_0_isolated, layer_1, layer_1_isolated, " \
                                   "enc_out, … (8)"


def test_compact_lists_a_few_names_and_counts_them():
    assert compact(["a", "b", "c"]) == "a, b, c (3)"
    assert compact([f"s{i}" for i in range(18)]) == "s0, s1, s2, s3, s4, … (18)"
    assert compact(list("abcdef")) == "a, b, c, d, e, f (6)"


def test_the_page_names_each_cause_once(sweep_page: Path):
    page = sweep_page.read_text()
    attention = page[page.index('id="needs-attention"'):page.index('id="status-matrix"')]
    assert attention.count('<div class="cause">') == 2
    # the cause once; on hover each case's culprit and each row's reason
    assert attention.count(CRASH) == 1 + 2 + 16
    assert re.search(r'<li data-candidate="port_b" data-backend="cpu" data-weight-type="q2_K" '
                     r'title="[^"]*">tiny · clip, heldout · port_b · cpu · q2_K — stages: '
                     r"layer_0, layer_0_isolated, layer_1, layer_1_isolated, enc_out, … \(8\)"
                     r"</li>", attention)
