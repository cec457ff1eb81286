"""summary.csv from synthetic cell files, and index.html from summary.csv alone."""

from __future__ import annotations

import base64
import csv
import html
import json
import re
from pathlib import Path

import pytest

from audioparity.cli import main
from audioparity.compare.cell import COLUMNS
from audioparity.contract.errors import AudioparityError
from audioparity.report.html import write_html
from audioparity.report.summary import (
    read_cell_list,
    shown_cases,
    write_cell_list,
    write_summary,
)


def row(stage: str, backend: str = "cpu", weight_type: str = "f32", model: str = "tiny",
        status: str = "pass", candidate: str = "audioparity", against: str = "reference",
        **values) -> dict:
    """A cell row as compare_cell writes it: every column, None where a metric does not apply."""
    base = {c: None for c in COLUMNS}
    base.update(family="parakeet_tdt", model=model, case="clip", candidate=candidate,
                backend=backend, against=against,
                weight_type=weight_type, stage=stage, status=status, gate=f"default/{stage}: x",
                reason="")
    return {**base, **values}


def write_cell(path: Path, rows: list[dict]) -> Path:
    path.write_text(json.dumps(rows))
    return path


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_summary_columns_and_row_order(tmp_path: Path):
    vulkan = write_cell(tmp_path / "vulkan.json", [
        row("layer_0", backend="vulkan", weight_type="q8_0"),
    ])
    cpu = write_cell(tmp_path / "cpu.json", [
        row("decode", weight_type="q8_0", token_match=1.0, wer=0.0),
        row("layer_10", weight_type="q8_0"),
        row("layer_2_isolated", weight_type="q8_0"),
        row("layer_2", weight_type="q8_0"),
        row("enc_out", weight_type="q8_0"),
        row("mel_features", weight_type="q8_0"),
        row("decoder_replay", weight_type="q8_0"),
        row("joint_logits", weight_type="q8_0"),
    ])
    f32 = write_cell(tmp_path / "f32.json", [row("enc_out"), row("enc_out", model="tiny10"),
                                             row("enc_out", model="tiny2")])
    other = write_cell(tmp_path / "other.json", [row("enc_out", candidate="a-port")])
    output = tmp_path / "report" / "summary.csv"
    write_summary([other, vulkan, cpu, f32], output)

    with open(output, newline="") as handle:
        header = next(csv.reader(handle))
    assert header == [
        "family", "model", "case", "candidate", "backend", "weight_type", "against", "stage",
        "status", "cosine", "std_ratio", "nmse", "median_row_nmse", "max_abs", "mean_abs",
        "max_rel", "non_finite",
        "argmax", "top1", "kl", "token_match", "first_divergence", "logit_gap", "wer",
        "wer_known", "ref_wer_known", "cost_nmse", "cost_cosine", "cost_token_match", "cost_kl",
        "cost_wer", "bits_per_weight", "fallbacks", "fallback_tensors", "gate", "reason",
        "closer_to", "seconds", "first_bad_op", "culprit",
    ]
    order = [(r["model"], r["candidate"], r["backend"], r["weight_type"], r["stage"])
             for r in read_csv(output)]
    ours = "audioparity"
    assert order == [
        ("tiny", ours, "cpu", "f32", "enc_out"),
        ("tiny", ours, "cpu", "q8_0", "mel_features"),
        ("tiny", ours, "cpu", "q8_0", "layer_2"),
        ("tiny", ours, "cpu", "q8_0", "layer_2_isolated"),
        ("tiny", ours, "cpu", "q8_0", "layer_10"),
        ("tiny", ours, "cpu", "q8_0", "enc_out"),
        ("tiny", ours, "cpu", "q8_0", "joint_logits"),
        ("tiny", ours, "cpu", "q8_0", "decode"),
        ("tiny", ours, "cpu", "q8_0", "decoder_replay"),
        ("tiny", ours, "vulkan", "q8_0", "layer_0"),
        ("tiny", "a-port", "cpu", "f32", "enc_out"),  # this project's port first
        ("tiny2", ours, "cpu", "f32", "enc_out"),
        ("tiny10", ours, "cpu", "f32", "enc_out"),
    ]
    assert not list(output.parent.glob(".*tmp"))


def test_the_page_reads_rows_in_the_summarys_order_whatever_stages_the_families_have():
    """in_summary_order ranks each column's values apart; a stage outside a family's contract
    (a quantized cell's `storage`, a recipe's `recipe`) keys past that family's stages, and is
    never compared with another family's stage (the order of row_key, row by row)."""
    import pandas as pd

    from audioparity.report.summary import in_summary_order, row_key

    rows = [{**dict.fromkeys(COLUMNS, ""), "family": family, "model": "m", "case": "c",
             "candidate": "audioparity", "backend": "cpu", "weight_type": "f32",
             "against": "reference", "stage": stage, "status": "pass"}
            for family, stages in (
                ("whisper", ["decode", "layer_11", "storage", "mel_features", "enc_out"]),
                ("parakeet_tdt", ["recipe", "decode", "storage", "mel_features"]),
                ("moss_voicegen", ["generation", "recipe", "prompt"]))
            for stage in stages]
    ordered = in_summary_order(pd.DataFrame(rows, dtype=str))
    assert list(zip(ordered["family"], ordered["stage"], strict=True)) == [
        (row["family"], row["stage"]) for row in sorted(rows, key=row_key)]


def test_summary_values_keep_full_precision_and_mark_non_finite(tmp_path: Path):
    cell = write_cell(tmp_path / "c.json", [
        row("enc_out", status="fail", cosine="nan", nmse=1.2345678901234567e-09, non_finite=3,
            argmax="4,1", max_rel="inf", reason="3 non-finite value(s) in candidate"),
    ])
    write_summary([cell], tmp_path / "summary.csv")
    (values,) = read_csv(tmp_path / "summary.csv")
    assert values["cosine"] == "nan" and values["max_rel"] == "inf"
    assert float(values["nmse"]) == 1.2345678901234567e-09
    assert values["non_finite"] == "3" and values["argmax"] == "4,1"
    assert values["token_match"] == "" and values["seconds"] == ""


def test_summary_rejects_duplicates_and_unlabelled_rows(tmp_path: Path):
    first = write_cell(tmp_path / "a.json", [row("enc_out")])
    second = write_cell(tmp_path / "b.json", [row("enc_out")])
    with pytest.raises(AudioparityError, match=r"b\.json: row .*'enc_out'.* is also in .*a\.json"):
        write_summary([first, second], tmp_path / "summary.csv")
    unlabelled = write_cell(tmp_path / "c.json", [row("enc_out", model=None)])
    with pytest.raises(AudioparityError, match=r"c\.json: row 0 has no value for model"):
        write_summary([unlabelled], tmp_path / "summary.csv")
    lacking = write_cell(tmp_path / "d.json", [{k: v for k, v in row("x").items() if k != "gate"}])
    with pytest.raises(AudioparityError, match=r"d\.json: row 0 lacks column\(s\) gate"):
        write_summary([lacking], tmp_path / "summary.csv")


def test_summary_reads_its_cells_from_a_list_file(tmp_path: Path, capsys):
    """`report summary --cells-from LIST` (rule report_cells writes the list): one path a line,
    a folder standing for its cells, besides any named on the command line."""
    cells = tmp_path / "cells"
    (cells / "fresh").mkdir(parents=True)
    first = write_cell(cells / "a b.json", [row("enc_out")])
    fresh = [write_cell(cells / "fresh" / f"{case}.json",
                        [row("enc_out", case=case, against="fresh")]) for case in ("x", "y")]
    named = write_cell(cells / "q8_0.json", [row("enc_out", weight_type="q8_0")])
    listed = tmp_path / "cells.txt"
    assert write_cell_list([first, cells / "fresh", first], listed) == 2
    assert listed.read_text() == f"{first}\n{cells / 'fresh'}\n"
    assert read_cell_list(listed) == [first, cells / "fresh"]
    output = tmp_path / "summary.csv"
    assert main(["report", "summary", str(named), "--cells-from", str(listed),
                 "--output", str(output)]) == 0
    write_summary([named, first, *fresh], tmp_path / "direct.csv")
    assert output.read_text() == (tmp_path / "direct.csv").read_text()
    assert len(read_csv(output)) == 4
    assert main(["report", "summary", "--output", str(output)]) == 1
    assert "no cell files" in capsys.readouterr().err
    with pytest.raises(AudioparityError, match="line break"):
        write_cell_list(["a\nb.json"], listed)


def test_the_cases_a_capped_section_shows_put_those_needing_attention_first():
    """The matrix and the plots show a few cases of a model (a sweep of a thousand cases would
    make a page no browser opens): a failing case before the passing ones, each in order."""
    import pandas as pd

    cases = [("m", "c0", "pass"), ("m", "c1", "pass"), ("m", "c2", "fail"),
             ("n", "c0", "pass"), ("m", "c3", "missing"), ("m", "c1", "pass")]
    frame = pd.DataFrame([{"family": "parakeet_tdt", "model": m, "case": c, "status": s}
                          for m, c, s in cases])
    shown, left = shown_cases(frame, 2)
    assert shown.tolist() == [False, False, True, True, True, False] and left == 2
    assert shown_cases(frame, 5)[0].all() and shown_cases(frame, 5)[1] == 0


def synthetic_summary(path: Path) -> Path:
    """A summary.csv written directly (no cells): layers, isolated layers, several types."""
    rows = []
    for backend in ("cpu", "vulkan"):
        for k, weight_type in enumerate(("f32", "f16", "q8_0")):
            scale = 10.0 ** (-12 + 4 * k)
            for layer in range(3):
                for suffix, growth in (("", layer + 1), ("_isolated", 1)):
                    nmse = scale * growth
                    rows.append(row(f"layer_{layer}{suffix}", backend, weight_type,
                                    cosine=1 - nmse / 2, nmse=nmse))
            rows.append(row("enc_out", backend, weight_type, cosine=1 - scale, nmse=2 * scale))
            rows.append(row("decode", backend, weight_type, token_match=1.0, wer=0.0,
                            first_divergence=None))
    rows.append(row("enc_out", "cuda", "f32", status="unavailable",
                    reason="backend cuda is not built in"))
    rows.append(row("joint_logits", "cpu", "q8_0", status="fail", cosine=0.98, nmse=0.04,
                    top1=0.75, kl=0.0123456, reason="cosine 0.98 < 0.999 <&>"))
    rows.append(row("generation", "cpu", "q8_0", status="fail", token_match=0.25,
                    first_divergence=4, logit_gap=0.00251, reason="not exact: rows differ"))
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerows({k: "" if v is None else v for k, v in r.items()} for r in rows)
    return path


def test_html_is_self_contained_and_built_from_the_csv_alone(tmp_path: Path):
    summary = synthetic_summary(tmp_path / "summary.csv")
    output = tmp_path / "report" / "index.html"
    write_html(summary, output)
    page = output.read_text()

    assert not re.search(r"""(src|href)\s*=\s*["']?\s*(https?:)?//""", page, re.IGNORECASE)
    assert not re.search(r"url\(|@import|<script[^>]*\bsrc|<link", page, re.IGNORECASE)
    assert page.count("<script>") == 1  # the filters', inline
    images = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(images) == 3  # per-layer curves for cpu and vulkan, key stages by weight type
    assert all(base64.b64decode(i).startswith(b"\x89PNG\r\n\x1a\n") for i in images)
    assert '<table class="matrix">' in page
    # the failing cell carries its reason (escaped) as tooltip, and is listed under attention
    assert 'title="joint_logits — fail\ncosine 0.98 &lt; 0.999 &lt;&amp;&gt;' in page
    assert page.count("cosine 0.98 &lt; 0.999 &lt;&amp;&gt;") >= 3  # tooltip, attention, table
    # every metric that applies is in the tooltip, kl and the logit gap included
    assert re.search(r'title="joint_logits — fail\n[^"]*top1 0\.75[^"]*\bkl 0\.0123"', page)
    assert re.search(r'title="generation — fail\n[^"]*first_divergence 4[^"]*logit_gap 0\.00251"',
                     page)
    assert "2 of 51 stages need attention" in page
    assert ">unavailable<" in page and ">n/a<" in page


def test_html_rejects_a_csv_with_other_columns(tmp_path: Path):
    bad = tmp_path / "summary.csv"
    bad.write_text("family,model\nparakeet_tdt,tiny\n")
    with pytest.raises(AudioparityError, match="columns .* differ"):
        write_html(bad, tmp_path / "index.html")


def test_declared_failures_are_grouped_per_model_backend_and_weight_type(tmp_path: Path):
    reason = "expected (activations beyond the f16 range): 64 non-finite value(s)"
    rows = [row(stage, weight_type="f16", status="xfail", reason=reason, case=case,
                family="moss_voicegen")
            for case in ("en", "zh") for stage in ("last_hidden", "generation")]
    write_summary([write_cell(tmp_path / "cell.json", rows)], tmp_path / "s.csv")
    write_html(tmp_path / "s.csv", tmp_path / "index.html")
    text = (tmp_path / "index.html").read_text()
    assert "Declared expected failures (4 stages)" in text
    assert text.count("last_hidden, generation") == 1 and "en, zh" in text


def test_matrix_groups_columns_by_candidate_then_backend(tmp_path: Path):
    rows = [row("enc_out"), row("enc_out", weight_type="q8_0"),
            row("enc_out", candidate="a-port"), row("layer_0", candidate="a-port")]
    write_summary([write_cell(tmp_path / "cell.json", rows)], tmp_path / "s.csv")
    write_html(tmp_path / "s.csv", tmp_path / "index.html")
    text = (tmp_path / "index.html").read_text()
    head = text[text.index('<table class="matrix">'):text.index("</thead>")]
    assert re.findall(r'colspan="(\d)">([\w-]+)</th>', head) == [
        ("2", "audioparity"), ("1", "a-port"),  # candidates, ours first
        ("2", "cpu"), ("1", "cpu"),  # backends of each
        ("1", "f32"), ("1", "q8_0"), ("1", "f32"),  # weight types
    ]
    assert "1 candidate" not in text and "2 candidates" in text


def test_backends_against_the_cpu_have_their_own_matrix_and_first_bad_ops(tmp_path: Path):
    op = "MUL_MAT #6 (encoder, feeds pre_encode, f32 [24, 9920]): NMSE 1e-07: not float32"
    rows = [row("pre_encode"), row("layer_0"),
            row("pre_encode", backend="vulkan"), row("layer_0", backend="vulkan"),
            row("pre_encode", backend="vulkan", against="cpu", status="fail", nmse=7e-7,
                first_bad_op=op),
            row("layer_0", backend="vulkan", against="cpu", status="fail", nmse=9e-7,
                first_bad_op=op)]
    write_summary([write_cell(tmp_path / "cell.json", rows)], tmp_path / "s.csv")
    write_html(tmp_path / "s.csv", tmp_path / "index.html")
    text = (tmp_path / "index.html").read_text()
    main = text[text.index('id="status-matrix"'):text.index('id="backends-against-the-cpu"')]
    backends = text[text.index('id="backends-against-the-cpu"'):text.index('id="per-layer-error"')]
    assert "7.0e-07" not in main and "7.0e-07" in backends  # each comparison in its own matrix
    # one line per failing cell: its first failing stage in pipeline order, and the op
    assert "First bad op of each cell that fails (1)" in backends
    assert backends.count(html.escape(op)) == 1 and ">pre_encode<" in backends
    assert "Against the CPU backend, 2 of 2 stages of other backends fail" in text
    assert "All 4 stages pass" in text  # the headline counts the reference comparisons


def test_a_cell_judged_by_an_unmeasured_list_is_marked_in_the_summary_and_the_page(
        tmp_path: Path):
    """q8_0 on cuda takes q8_0@cuda, a copy of the Vulkan list the section marks unmeasured:
    its rows (against the reference and the CPU) say so in their gate column, and the page
    marks its cells and says why, once under the matrix; the cpu and vulkan cells, and the
    cuda cell at f32 (the CPU's float32 gates), pass unmarked."""
    from audioparity.compare.gate_lists import resolve_gates
    from audioparity.compare.gates import status
    from audioparity.compare.plan import CellKey

    why = "copied from the Vulkan lists (lavapipe)"
    section = {"gates": {"default": [{"stage": "*", "nmse_max": 1e-12}],
                         "q8_0": [{"stage": "*", "nmse_max": 1e-6}],
                         "q8_0@vulkan": [{"stage": "*", "nmse_max": 1e-3}],
                         "q8_0@cuda": [{"stage": "*", "nmse_max": 1e-3}]},
               "unmeasured_gates": {"*@cuda": why}}
    rows = []
    for backend, weight_type, nmse in (("cpu", "q8_0", 2e-7), ("vulkan", "q8_0", 3e-4),
                                       ("cuda", "q8_0", 4e-4), ("cuda", "f32", 5e-13)):
        for against in ("reference", "cpu")[:1 + (backend != "cpu")]:
            gates = resolve_gates(section, CellKey("parakeet_tdt", "tiny", "audioparity",
                                                   backend, weight_type, "", against))
            verdict = status("enc_out", gates, metrics={"nmse": nmse})
            rows.append(row("enc_out", backend=backend, weight_type=weight_type,
                            against=against, status=verdict.status, nmse=nmse,
                            gate=verdict.gate))
    write_summary([write_cell(tmp_path / "cell.json", rows)], tmp_path / "s.csv")
    marked = {(r["backend"], r["weight_type"], r["against"]): r["gate"].endswith(
        f" (unmeasured on cuda: {why})") for r in read_csv(tmp_path / "s.csv")}
    assert marked == {("cpu", "q8_0", "reference"): False,
                      ("vulkan", "q8_0", "reference"): False, ("vulkan", "q8_0", "cpu"): False,
                      ("cuda", "q8_0", "reference"): True, ("cuda", "q8_0", "cpu"): True,
                      ("cuda", "f32", "reference"): False, ("cuda", "f32", "cpu"): False}

    write_html(tmp_path / "s.csv", tmp_path / "index.html")
    text = (tmp_path / "index.html").read_text()
    cells = re.findall(r'<td class="st-pass( unmeasured)?[^"]*" data-candidate="audioparity" '
                       r'data-backend="(\w+)" data-weight-type="(\w+)"[^>]*>([^<]*)(.*?)</td>',
                       text)
    # the status matrix's cells, then those of the matrix against the CPU
    assert [(backend, weight_type, bool(css), "unmeasured</small>" in rest)
            for css, backend, weight_type, _, rest in cells] == [
        ("cpu", "q8_0", False, False), ("cuda", "f32", False, False),
        ("cuda", "q8_0", True, True), ("vulkan", "q8_0", False, False),
        ("cuda", "f32", False, False), ("cuda", "q8_0", True, True),
        ("vulkan", "q8_0", False, False)]
    line = f"cuda · q8_0: gates unmeasured on cuda: {html.escape(why)}"
    assert text.count(line) == 2 and "vulkan · q8_0" not in text  # one line per matrix
    assert ("Of the 4 stages that pass, 1 passed on gates no device of their backend has "
            "measured") in text


def test_a_quantized_cell_shows_its_cost_and_the_tightest_bounds_it_would_pass(tmp_path: Path):
    cell = write_cell(tmp_path / "q8_0.json", [
        row("layer_0_isolated", weight_type="q8_0", nmse=2.5e-12, cosine=1 - 1.2e-12,
            cost_nmse=6.3e-05, cost_cosine=0.99997,
            gate="q8_0/layer_*_isolated: cosine>=0.999, nmse<=2e-05"),
        row("decode", weight_type="q8_0", token_match=1.0, cost_token_match=0.5,
            gate="q8_0/decode: token_match>=0.9"),
    ])
    summary = tmp_path / "summary.csv"
    write_summary([cell], summary)
    write_html(summary, tmp_path / "index.html")
    page = (tmp_path / "index.html").read_text()
    assert '2.5e-12<br><small class="cost">f32 6.3e-05</small>' in page
    assert '100%<br><small class="cost">f32 50%</small>' in page
    assert "would pass down to cosine&gt;=1−1.2e-12, nmse&lt;=2.5e-12" in page
    assert "the weight type&#x27;s cost): nmse 6.3e-05, cosine 1−3e-05" in page


def test_per_layer_stages_are_those_their_family_spec_declares_per_layer():
    from audioparity.report.plots import per_layer

    assert per_layer("parakeet_tdt", "layer_3_isolated") == (3, "isolated")
    assert per_layer("moss_voicegen", "layer_0_replayed") == (0, "replayed")
    assert per_layer("whisper", "layer_12") == (12, "")
    assert per_layer("parakeet_tdt", "lstm_state_0") is None  # numbered, but not per layer
    assert per_layer("parakeet_tdt", "enc_out") is None
    assert per_layer("somebody_elses", "layer_3") is None  # a family this install lacks
