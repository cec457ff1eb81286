"""The weight types of a sweep: their costs against bits per weight, the Pareto front, and the
report's "Weight types" section, on the synthetic sweep of tests/report/sweep.py."""

from __future__ import annotations

import html
import math
import re
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from audioparity.report.plots import place_labels
from audioparity.report.weight_types import pareto_front, sweeps
from tests.report.sweep import FALLBACKS, sweep_rows


def frame(rows: list[dict]) -> pd.DataFrame:
    """Summary rows as read_summary gives them: every value a string, '' where empty."""
    return pd.DataFrame([{k: "" if v is None else str(v) for k, v in r.items()} for r in rows],
                        dtype=object)


def test_the_pareto_front_is_what_no_other_point_beats_on_both_axes():
    """a (2, 5) has the fewest bits; b (4, 3) beats c (4, 4) at equal bits and d (8, 3) with
    fewer; e (8, 1) is the cheapest; f's cost is NaN, g's size infinite: on no front."""
    points = {"a": (2, 5), "b": (4, 3), "c": (4, 4), "d": (8, 3), "e": (8, 1),
              "f": (1, math.nan), "g": (math.inf, 0)}
    assert pareto_front(points) == ["a", "b", "e"]
    assert pareto_front({"x": (4, 1), "y": (4, 1)}) == ["x", "y"]  # neither beats the other
    assert pareto_front({}) == []


def test_the_sweeps_front_of_enc_out_and_of_the_decode():
    """tests/report/sweep.py's enc_out NMSE against bits, by hand: by increasing bits q2_K
    (2e-2), q3_K (4e-3), mxfp4 (2e-3), then at 4.5 bits q4_K (4e-4) beats iq4_nl and q4_0;
    q4_K+recipe (4.9, 1.5e-4) beats q4_1 (5, 9e-4); q5_K beats q5_0 (same bits) and q5_1;
    q6_K, q8_0, f16 (f16 beats bf16 at 16 bits), f32 each cheaper than all smaller. WER: 0 from
    4.5 bits on, so iq4_nl and q4_K (equal) end the front and every larger type is beaten."""
    (ours,) = [s for s in sweeps(frame(sweep_rows()))
               if s.labels["candidate"] == "audioparity" and s.labels["backend"] == "cpu"]
    nmse, wer, _ = ours.costs
    points = {w: (ours.bits[w], v) for w, v in nmse.values.items()}
    assert pareto_front(points) == ["q2_K", "q3_K", "mxfp4", "q4_K", "q4_K+recipe", "q5_K",
                                    "q6_K", "q8_0", "f16", "f32"]
    points = {w: (ours.bits[w], v) for w, v in wer.values.items()}
    assert pareto_front(points) == ["q2_K", "q3_K", "mxfp4", "iq4_nl", "q4_K"]


def test_a_sweep_costs_each_weight_type_at_the_last_stage_of_each_kind():
    rows = sweep_rows()
    # heldout's q4_K enc_out costs twice clip's; transcribe_cpp's q5_0 enc_out lacks one case
    for row in rows:
        if (row["case"], row["weight_type"], row["stage"]) == ("heldout", "q4_K", "enc_out"):
            row["cost_nmse"] = 8e-4
        if (row["candidate"], row["case"], row["weight_type"], row["stage"]) == (
                "transcribe_cpp", "clip", "q5_0", "enc_out"):
            row["cost_nmse"] = ""
    found = {(s.labels["candidate"], s.labels["backend"]): s for s in sweeps(frame(rows))}
    # our port first, then the others naturally, as the summary orders them
    assert list(found) == [("audioparity", "cpu"), ("audioparity", "vulkan"), ("port_a", "cpu"),
                           ("port_b", "cpu"), ("transcribe_cpp", "cpu"), ("whisper_cpp", "cpu")]
    ours = found["audioparity", "cpu"]
    assert ours.cases == ["clip", "heldout"] and len(ours.weight_types) == 16
    assert ours.weight_types[:4] == ["f32", "f16", "bf16", "q8_0"]
    assert ours.weight_types[-1] == "q4_K+recipe"  # not in the vocabulary: after it
    nmse, wer, kl = ours.costs
    # joint_logits follows the reference's own path: no cost, not the last logits stage
    assert (nmse.stage, wer.stage, kl.stage) == ("enc_out", "decode", "ctc_logits")
    assert (nmse.title, wer.title, kl.title) == ("NMSE of enc_out", "WER of decode",
                                                 "KL of ctc_logits")
    assert nmse.values["q4_K"] == pytest.approx(6e-4)  # (4e-4 + 8e-4) / 2
    assert nmse.values["f32"] == 1e-14  # compared with the float32 reference: its own nmse
    assert wer.values["q2_K"] == 0.75 and kl.values["q8_0"] == pytest.approx(1e-4)
    assert found["transcribe_cpp", "cpu"].costs[0].values["q5_0"] is None
    assert ours.bits["q4_K"] == 4.5 and ours.bits["f32"] == 32.0
    assert (ours.fallbacks["q4_K"], ours.fallback_lines["q4_K"]) == (2, list(FALLBACKS))
    assert (ours.fallbacks["q8_0"], ours.fallback_lines["q8_0"]) == (0, [])
    crashed = found["port_b", "cpu"]
    assert [m.values["q2_K"] for m in crashed.costs] == [None, None, None]
    assert crashed.statuses["q2_K"] == Counter({"pass": 2, "crashed": 2, "missing": 14})


def test_the_trunks_last_tensor_stage_is_costed_not_a_heads_state():
    """A transducer's lstm_state_0 comes after enc_out in pipeline order, but it is the
    prediction network's state after the blank, the same for any audio."""
    rows = [r for r in sweep_rows() if r["candidate"] == "audioparity"
            and r["backend"] == "cpu" and r["stage"] == "enc_out"]
    rows += [{**r, "stage": "lstm_state_0", "cost_nmse": 0.5} for r in rows]
    (sweep,) = sweeps(frame(rows))
    assert [(m.stage, m.metric) for m in sweep.costs] == [("enc_out", "nmse")]


def test_a_generation_is_costed_by_its_token_mismatch():
    """A document without text (MOSS's generation) has no WER: 1 − token match instead, though
    the prompt before it, a document with a text, has a WER."""
    rows = [r for r in sweep_rows() if r["candidate"] == "audioparity"
            and r["backend"] == "cpu" and r["stage"] == "decode"]
    for row in rows:
        row.update(family="moss_voicegen", stage="generation", wer="", cost_wer="")
    rows += [{**r, "stage": "prompt", "wer": 0.0, "cost_wer": 0.0} for r in rows]
    (sweep,) = sweeps(frame(rows))
    (cost,) = sweep.costs
    assert cost.title == "1 − token match of generation"
    assert cost.values["q2_K"] == pytest.approx(0.75) and cost.values["f16"] == 0.0


def test_labels_are_placed_apart():
    """Three points at one place: the first label right above it, the second right below, the
    third (too long to fit in between) left above."""
    offsets = place_labels([(0.5, 0.5, "q4_K"), (0.5, 0.5, "q4_0"), (0.5, 0.5, "iq4_nl")])
    assert offsets[:2] == [(4, 2), (4, -9)]
    assert offsets[2][0] < 0 and offsets[2][1] == 2


def test_the_weight_types_section_has_a_plot_and_a_table_per_sweep(sweep_page: Path):
    page = sweep_page.read_text()
    section = page[page.index('id="weight-types"'):page.index('id="backends-against-the-cpu"')]
    blocks = re.findall(r'<div class="sweep" data-candidate="([^"]+)" data-backend="([^"]+)">',
                        section)
    assert blocks == [("audioparity", "cpu"), ("audioparity", "vulkan"), ("port_a", "cpu"),
                      ("port_b", "cpu"), ("transcribe_cpp", "cpu"), ("whisper_cpp", "cpu")]
    assert section.count('<img alt="cost against bits per weight') == 6
    ours = section[:section.index('data-candidate="audioparity" data-backend="vulkan"')]
    head = re.search(r"<thead><tr>(.*?)</tr></thead>", ours).group(1)
    assert re.findall(r"<th>([^<]+)</th>", head) == [
        "weight type", "bits per weight", "NMSE of enc_out", "WER of decode", "KL of ctc_logits",
        "stages", "fallbacks"]
    q4_k = re.search(r'<tr data-candidate="audioparity" data-backend="cpu" '
                     r'data-weight-type="q4_K">(.*?)</tr>', ours, re.S).group(1)
    cells = re.findall(r"<td[^>]*>(.*?)</td>", q4_k, re.S)
    assert cells[:5] == ["q4_K", "4.5", "0.0004", "0", "0.004"]
    assert 'class="num front" title="on the Pareto front">0.0004<' in q4_k
    assert cells[5] == "pass 18/18" and "2 tensors</summary>" in cells[6]
    assert all(html.escape(line) in cells[6] for line in FALLBACKS)
    q4_0 = re.search(r'data-weight-type="q4_0">(.*?)</tr>', ours, re.S).group(1)
    assert '<td class="num" title="">0.0008</td>' in q4_0  # beaten by q4_K: not bold
    port_b = section[section.index('data-candidate="port_b"'):]
    assert re.search(r'data-weight-type="q2_K">.*?<td class="st-crashed" '
                     r'title="pass 2, crashed 2, missing 14">crashed 2/18</td>', port_b, re.S)


def test_a_family_this_install_lacks_has_its_stage_kinds_read_from_their_metrics():
    """A summary from elsewhere: "out" has an NMSE only (a tensor), "head" a KL (logits),
    "text" a token match (a document); its crashed cell's empty rows do not change that."""
    rows = [r for r in sweep_rows() if r["candidate"] == "port_b" and r["backend"] == "cpu"
            and r["stage"] in ("enc_out", "ctc_logits", "decode")]
    names = {"enc_out": "out", "ctc_logits": "head", "decode": "text"}
    for row in rows:
        row.update(family="somebody_elses", stage=names[row["stage"]])
    (sweep,) = sweeps(frame(rows))
    assert [(m.stage, m.metric) for m in sweep.costs] == [("out", "nmse"), ("text", "wer"),
                                                           ("head", "kl")]
    assert sweep.costs[0].values["q2_K"] is None and sweep.costs[0].values["q3_K"] == 4e-3
