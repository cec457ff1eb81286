"""compare_cell on MOSS-shaped dumps: head logits (top-1, KL over the finite entries), the
``prompt`` and ``generation`` documents with the generation's auxiliary margins, non-finite
values (fail, or xfail when declared), and the real massive-activation fixture at f16."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from audioparity.compare.cell import COLUMNS, compare_cell
from audioparity.compare.documents import document_metrics
from audioparity.compare.plan import CellDumps
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import DumpWriter
from tests import RESOURCES

INF = math.inf
N_VQ, PAD = 3, 8  # 3 codebooks of 8 codes; code 8 is the pad, its logit -inf
RNG = np.random.default_rng(7)
LABELS = {"family": "moss_voicegen", "model": "tiny", "case": "en", "backend": "cpu",
          "weight_type": "f16"}
GATES = [
    {"stage": "prompt", "exact": True, "wer_max": 0.0},
    {"stage": "*hidden", "max_rel_max": 1e-3},
    {"stage": "*_logits", "top1_min": 1.0, "kl_max": 1e-6},
    {"stage": "generation", "exact": True},
]


def generation(rows: list[list[int]]) -> dict:
    return {"rows": rows, "requested_rows": 5, "stopped": False, "n_vq": N_VQ,
            "audio_pad_code": PAD, "rules": "greedy"}


def prompt(text: str, ids: list[int]) -> dict:
    return {"text": text, "rows": [[i, PAD, PAD, PAD] for i in ids]}


ROWS = [[3, PAD, PAD, PAD], [5, 1, PAD, PAD], [5, 2, 4, PAD], [5, 7, 0, 6], [6, 3, 3, 1]]
#: The reference's decision margins: +inf where the rules forced the value.
MARGINS = np.array([[0.4, INF, INF, INF], [0.2, 0.6, INF, INF], [0.3, 0.03, 0.5, INF],
                    [0.1, 0.2, 0.3, 0.7], [0.9, 0.8, 0.05, 0.4]], np.float32)
AUDIO_LOGITS = RNG.normal(size=(N_VQ, PAD + 1)).astype(np.float32)
AUDIO_LOGITS[:, PAD] = -np.inf
REFERENCE = {
    "last_hidden": (RNG.normal(size=16).astype(np.float32), "[H]"),
    "text_logits": (RNG.normal(size=12).astype(np.float32), "[V_text]"),
    "audio_logits": (AUDIO_LOGITS, "[n_vq, audio_vocab_size+1]"),
    "generation_margins": (MARGINS, "[rows, 1+n_vq]"),
}
DOCUMENTS = {"prompt": prompt("<|im_start|>user say a b c<|im_end|>", [1, 9, 10, 11, 2]),
             "generation": generation(ROWS)}


def write_dump(path: Path, tensors: dict, documents: dict) -> Path:
    """A dump directory with these tensors ``{name: (array, layout)}`` and JSON documents."""
    path.parent.mkdir(parents=True, exist_ok=True)
    source = path.parent / "prompt.json"
    source.write_text("{}")
    with DumpWriter(path, producer="test", model=source, inputs={"prompt": source},
                    fields={"family": "moss_voicegen"}) as writer:
        for name, (array, layout) in tensors.items():
            writer.add_tensor(name, array, layout)
        for name, document in documents.items():
            writer.add_json(name, document)
    return path


def compare(tmp_path: Path, tensors: dict | None = None, documents: dict | None = None,
            expected_failures: tuple = (), reference: Path | None = None) -> dict[str, dict]:
    """The rows of the cell comparing a candidate (REFERENCE with these replacements)."""
    reference = reference or write_dump(tmp_path / "ref", REFERENCE, DOCUMENTS)
    candidate = write_dump(tmp_path / "cand", {**REFERENCE, **(tensors or {})},
                           {**DOCUMENTS, **(documents or {})})
    output = tmp_path / "cell.json"
    gates = {"gates": GATES, "expected_failures": list(expected_failures)}
    compare_cell(CellDumps(reference, candidate), gates, LABELS, output)
    rows = json.loads(output.read_text())
    assert all(list(row) == list(COLUMNS) for row in rows)
    return {row["stage"]: row for row in rows}


def test_identical_dumps_pass_and_margins_are_no_stage(tmp_path: Path):
    rows = compare(tmp_path)
    assert set(rows) == {"prompt", "last_hidden", "text_logits", "audio_logits", "generation"}
    assert {row["status"] for row in rows.values()} == {"pass"}
    assert rows["generation"]["token_match"] == 1.0 and rows["generation"]["non_finite"] == 0
    assert rows["generation"]["first_divergence"] is None
    assert rows["generation"]["logit_gap"] is None
    assert rows["audio_logits"]["kl"] == 0.0 and rows["audio_logits"]["non_finite"] == 0


def test_logits_report_top1_and_kl_over_the_finite_entries(tmp_path: Path):
    cand = AUDIO_LOGITS.copy()
    cand[1, :PAD] += np.linspace(0.0, 0.01, PAD, dtype=np.float32)  # tilts row 1, argmax kept

    def kl_row(p_logits, q_logits):  # KL(p || q) written out, float64, the pad logit left out
        p = [math.exp(float(x)) for x in p_logits[:PAD]]
        q = [math.exp(float(x)) for x in q_logits[:PAD]]
        p = [x / sum(p) for x in p]
        q = [x / sum(q) for x in q]
        return sum(a * math.log(a / b) for a, b in zip(p, q, strict=True))

    expected = max(kl_row(r, c) for r, c in zip(AUDIO_LOGITS, cand, strict=True))
    assert expected > 1e-6
    row = compare(tmp_path, {"audio_logits": (cand, "[n_vq, audio_vocab_size+1]")})[
        "audio_logits"]
    assert row["non_finite"] == 0 and row["top1"] == 1.0
    assert row["kl"] == pytest.approx(expected, rel=1e-6)
    assert row["status"] == "fail" and row["reason"].startswith("kl ")


def test_generation_reports_first_divergent_row_and_the_reference_logit_gap(tmp_path: Path):
    # row 2 differs in codes 0 and 1 (reference margins 0.03 and 0.5); later rows follow it
    diverged = [*ROWS[:2], [5, 3, 5, PAD], [5, 7, 1, 6], [6, 3, 3, 1]]
    margins = MARGINS.copy()
    margins[2:, 1:] += 1.0  # the candidate's own margins do not enter the gap
    rows = compare(tmp_path, {"generation_margins": (margins, "[rows, 1+n_vq]")},
                   {"generation": generation(diverged)})
    row = rows["generation"]
    assert "generation_margins" not in rows
    assert row["status"] == "fail"
    assert row["first_divergence"] == 2 and row["token_match"] == 3 / 5
    assert row["logit_gap"] == pytest.approx(0.03, rel=1e-6)  # float32 margins
    assert row["non_finite"] == 0
    assert row["reason"] == (
        "not exact: rows differ (first divergence at position 2, reference logit gap 0.03)"
    )


def test_generation_that_stops_early_gaps_over_the_whole_missing_row(tmp_path: Path):
    short = {**generation(ROWS[:3]), "stopped": True}
    row = compare(tmp_path, {"generation_margins": (MARGINS[:3], "[rows, 1+n_vq]")},
                  {"generation": short})["generation"]
    assert row["first_divergence"] == 3
    assert row["logit_gap"] == pytest.approx(0.1, rel=1e-6)  # smallest margin of row 3
    assert row["reason"].startswith("not exact: rows, stopped differ")


def test_prompt_rows_exact_and_wer_on_text(tmp_path: Path):
    other = prompt("<|im_start|>user say a B c<|im_end|>", [1, 9, 12, 11, 2])
    row = compare(tmp_path, documents={"prompt": other})["prompt"]
    assert row["status"] == "fail"
    assert row["token_match"] == 4 / 5 and row["first_divergence"] == 2
    # one word of the reference's 5 (whitespace-separated, special tokens attached) differs
    assert row["wer"] == pytest.approx(1 / 5)
    assert row["logit_gap"] is None and row["non_finite"] is None
    assert row["reason"] == (
        "wer 0.2 > 0.0; not exact: rows, text differ (first divergence at position 2)"
    )


def test_a_field_the_candidate_omits_is_compared_nowhere_and_its_metric_is_not_measured():
    ref = prompt("<|im_start|>user say a b c<|im_end|>", [1, 9, 10, 11, 2])
    rows_only = {"rows": ref["rows"]}
    metrics = document_metrics(rows_only, ref, omits=["text"])
    assert metrics["exact"] and metrics["token_match"] == 1.0 and metrics["wer"] is None
    assert metrics["not_measured"] == {"wer": "the candidate writes no text"}
    # without the declaration the missing text is a difference, and wer still not computable
    undeclared = document_metrics(rows_only, ref)
    assert undeclared["differing"] == ["text"] and "not_measured" not in undeclared
    # omitting a list field leaves the sequence metrics to the others
    partial = document_metrics({"text": ref["text"]}, ref, omits=["rows"])
    assert partial["exact"] and partial["token_match"] is None and partial["wer"] == 0.0


NAN_HIDDEN = REFERENCE["last_hidden"][0].copy()
NAN_HIDDEN[3] = np.nan
NAN_LOGITS = AUDIO_LOGITS.copy()
NAN_LOGITS[2, :PAD] = np.nan
NAN_MARGINS = MARGINS.copy()
NAN_MARGINS[:, 0] = np.nan  # every text decision taken on NaN logits, the rows still identical
NON_FINITE = {"last_hidden": (NAN_HIDDEN, "[H]"),
              "audio_logits": (NAN_LOGITS, "[n_vq, audio_vocab_size+1]"),
              "generation_margins": (NAN_MARGINS, "[rows, 1+n_vq]")}
OVERFLOW = "activations exceed the f16 range"


@pytest.mark.parametrize("declared", [False, True], ids=["undeclared", "declared"])
def test_non_finite_values_fail_or_xfail_when_declared(tmp_path: Path, declared: bool):
    expected = [{"stage": s, "reason": OVERFLOW} for s in ("*hidden", "*logits", "generation")]
    rows = compare(tmp_path, NON_FINITE, expected_failures=expected if declared else ())
    failures = {
        "last_hidden": "1 non-finite value(s) in candidate (first at 3)",
        "audio_logits": "8 non-finite value(s) in candidate (first at 2,0)",
        "generation": "5 non-finite value(s) in candidate margins (first at 0,0)",
    }
    for stage, failure in failures.items():
        row = rows[stage]
        assert row["non_finite"] == int(failure.split()[0])
        assert row["status"] == ("xfail" if declared else "fail"), stage
        assert row["reason"] == (f"expected ({OVERFLOW}): {failure}" if declared else failure)
    assert rows["audio_logits"]["kl"] == "nan" and rows["audio_logits"]["top1"] == "nan"
    assert rows["generation"]["token_match"] == 1.0  # identical rows, still no pass
    # text_logits is clean: declaring it would be stale, and not declaring it passes
    assert rows["text_logits"]["status"] == ("fail" if declared else "pass")


def test_nan_in_the_reference_margins_fails_the_document(tmp_path: Path):
    reference = write_dump(tmp_path / "ref", {**REFERENCE, **NON_FINITE}, DOCUMENTS)
    row = compare(tmp_path, reference=reference)["generation"]
    assert row["status"] == "fail"
    assert "reference holds 5 non-finite value(s)" in row["reason"]


def test_reference_margins_that_do_not_fit_the_document_are_an_error(tmp_path: Path):
    reference = write_dump(tmp_path / "ref", {
        **REFERENCE, "generation_margins": (MARGINS[:, :3], "[rows, 1+n_vq]")}, DOCUMENTS)
    with pytest.raises(AudioparityError, match=r"ref: generation_margins: margins of shape "
                                               r"\[5, 3\] do not fit .* 5 positions of 4 values"):
        compare(tmp_path, reference=reference)


def test_margins_attach_to_any_document_by_name(tmp_path: Path):
    decode = {"ids": [4, 7, 7, 2], "text": "a b"}
    reference = write_dump(tmp_path / "ref", {
        "decode_margins": (np.array([1.0, 0.25, 2.0, 0.5], np.float32), "[steps]"),
        "enc_margins": (np.zeros(3, np.float32), "[T]"),  # no `enc` document: a stage
    }, {"decode": decode})
    candidate = write_dump(tmp_path / "cand", {"enc_margins": (np.zeros(3, np.float32), "[T]")},
                           {"decode": decode, "decoder_replay": {**decode, "ids": [4, 7, 8, 2]}})
    output = tmp_path / "cell.json"
    gates = {"gates": [{"stage": "decode*", "exact": True},
                       {"stage": "enc_margins", "nmse_max": 0}], "expected_failures": []}
    # decoder_replay is Parakeet's isolated form of decode (its spec)
    compare_cell(CellDumps(reference, candidate), gates, {**LABELS, "family": "parakeet_tdt"},
                 output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    assert set(rows) == {"decode", "decoder_replay", "enc_margins"}
    assert rows["decoder_replay"]["logit_gap"] == 2.0  # one margin per step, at step 2
    assert rows["decoder_replay"]["non_finite"] is None  # the candidate has no margins
    assert rows["enc_margins"]["status"] == "pass"


def test_massive_activation_fixture_at_f16_is_xfail_only_when_declared(tmp_path: Path,
                                                                       fixture_model):
    from audioparity.dumping.driver import RunSettings, dump_ggml, dump_reference
    from audioparity.models.registry import family

    moss = family("moss_voicegen")
    request = RESOURCES / "moss" / "en_instruction.json"
    model = fixture_model("moss_voicegen", massive_activation=True)
    dump_reference(moss, model, [(request, tmp_path / "ref")], options={"generate_rows": 4})
    for weight_type in ("f32", "f16"):
        dump_ggml(moss, model, request, tmp_path / weight_type,
                  RunSettings(weight_type, "cpu", {"kv_cache_type": "f32", "generate_rows": 4}),
                  tmp_path / "ref")
    limits = {"f32": (1e-5, 1e-9), "f16": (1e-2, 1e-4)}  # max_rel, kl

    def gates(weight_type: str) -> list[dict]:
        max_rel, kl = limits[weight_type]
        return [{"stage": "prompt", "exact": True},
                {"stage": "input_embeddings", "max_rel_max": max_rel},
                {"stage": "*hidden", "max_rel_max": max_rel},
                {"stage": "layer_*", "max_rel_max": max_rel},
                {"stage": "*_logits", "max_rel_max": max_rel, "top1_min": 1.0, "kl_max": kl},
                {"stage": "generation", "exact": True}]

    declared = [{"stage": s, "reason": OVERFLOW}
                for s in ("layer_*", "*hidden", "*_logits", "generation")]

    def cell(weight_type: str, expected: list) -> dict[str, dict]:
        output = tmp_path / f"{weight_type}_{len(expected)}.json"
        compare_cell(CellDumps(tmp_path / "ref", tmp_path / weight_type),
                     {"gates": gates(weight_type), "expected_failures": expected}, LABELS, output)
        return {row["stage"]: row for row in json.loads(output.read_text())}

    assert {row["status"] for row in cell("f32", []).values()} == {"pass"}
    undeclared, with_reason = cell("f16", []), cell("f16", declared)
    overflowing = [s for s, row in undeclared.items() if row["non_finite"]]
    assert {"last_hidden", "text_logits", "audio_logits", "generation"} <= set(overflowing)
    assert {undeclared[s]["status"] for s in overflowing} == {"fail"}
    assert {with_reason[s]["status"] for s in overflowing} == {"xfail"}
    assert all(with_reason[s]["reason"].startswith(f"expected ({OVERFLOW}): ")
               for s in overflowing)
    assert with_reason["prompt"]["status"] == with_reason["input_embeddings"]["status"] == "pass"
