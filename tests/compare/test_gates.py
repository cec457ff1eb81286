"""Gates (resolution, statuses, reasons) and compare_cell on synthetic dump directories."""

from __future__ import annotations

import json
import math
import re
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import yaml

from audioparity.compare.cell import COLUMNS, compare_cell
from audioparity.compare.gate_lists import check_resolved, resolve_gates
from audioparity.compare.gates import THRESHOLDS, gate_for, status, unmeasured_mark
from audioparity.compare.plan import CellDumps, CellKey
from audioparity.compare.scaling import (
    GAIN_LIMIT,
    LENGTH_SCALED,
    carry_noise,
    for_length,
    noise_floor,
)
from audioparity.compare.targets import recipe_row
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.models.registry import spec_of
from tests import REPO

SECTION = {
    "gates": {
        "default": [
            {"stage": "mel_features", "cosine_min": 0.99999},
            {"stage": "layer_*_isolated", "nmse_max": 1e-10},
            {"stage": "layer_*", "cosine_min": 0.99999, "nmse_max": 1e-8},
            {"stage": "joint_logits", "cosine_min": 0.99999, "top1_min": 1.0},
            {"stage": "decoder_replay", "exact": True},
            {"stage": "decode", "exact": True, "wer_max": 0.0},
        ],
        "f16": [{"stage": "layer_*", "cosine_min": 0.999, "std_ratio_tol": 0.01}],
    },
    "expected_failures": [
        {"stage": "enc_out", "weight_type": "f16", "reason": "activations overflow f16"},
        {"stage": "layer_1", "backend": "vulkan", "reason": "lavapipe rounding"},
        {"stage": "decode", "model": "big-*", "reason": "not for tiny"},
    ],
    "models": ["ignored: other keys of the family section"],
}
#: The cell the gates of a test are resolved for, unless it says otherwise.
CELL = CellKey("parakeet_tdt", "tiny", "audioparity", "cpu", "f32", "")


def gates_for(**cell: str) -> dict:
    """Resolved gates, round-tripped through JSON as the workflow passes them."""
    return json.loads(json.dumps(resolve_gates(SECTION, CELL._replace(**cell))))


def test_extra_expected_failures_add_to_the_list_a_later_config_would_replace():
    extra = {**SECTION, "extra_expected_failures": [
        {"stage": "joint_logits", "weight_type": "f16", "reason": "a port's own"}]}
    chosen = resolve_gates(extra, CELL._replace(weight_type="f16"))["expected_failures"]
    assert chosen == [{"stage": "enc_out", "reason": "activations overflow f16"},
                      {"stage": "joint_logits", "reason": "a port's own"}]
    with pytest.raises(AudioparityError, match="extra_expected_failures"):
        resolve_gates({**SECTION, "extra_expected_failures": {"stage": "x"}}, CELL)


def test_weight_type_entries_come_before_default():
    gates = gates_for(weight_type="f16")
    assert [(g["from"], g["stage"]) for g in gates["gates"]][:2] == [
        ("f16", "layer_*"), ("default", "mel_features"),
    ]
    verdict = status("layer_3", gates, metrics={"cosine": 0.9995, "nmse": 1e-4, "std_ratio": 1.0})
    assert verdict == ("pass", "f16/layer_*: cosine>=0.999, |1-std_ratio|<=0.01", "")


def test_a_block_type_takes_its_own_list_then_quantized_then_default():
    """q4_K@cpu, quantized@cpu, q4_K, quantized, default; a recipe's type takes its base's; a
    float type never takes quantized's."""
    section = {"gates": {name: [{"stage": name, "nmse_max": 1.0}] for name in (
        "default", "quantized", "q4_K", "q4_K@cpu", "quantized@cpu", "f16")}}
    cell = CellKey("f", "m", "c", "cpu", "q4_K+recipe", "x")
    froms = [g["from"] for g in resolve_gates(section, cell)["gates"]]
    assert froms == ["q4_K@cpu", "quantized@cpu", "q4_K", "quantized", "default"]
    froms = [g["from"] for g in resolve_gates(section, cell._replace(weight_type="f16"))[
        "gates"]]
    assert froms == ["f16", "default"]


def test_first_matching_pattern_wins():
    gates = gates_for()
    assert status("layer_2_isolated", gates, metrics={"nmse": 1e-9}).gate == (
        "default/layer_*_isolated: nmse<=1e-10"
    )
    assert status("layer_2", gates, metrics={"cosine": 1.0, "nmse": 0.0}).status == "pass"
    # a weight type with no list of its own takes default only
    assert [g["from"] for g in gates_for(weight_type="q8_0")["gates"]] == ["default"] * 6


def test_expected_failures_are_chosen_by_cell():
    assert gates_for()["expected_failures"] == []
    assert gates_for(weight_type="f16")["expected_failures"] == [
        {"stage": "enc_out", "reason": "activations overflow f16"}
    ]
    chosen = gates_for(backend="vulkan", model="big-v3")["expected_failures"]
    assert [e["stage"] for e in chosen] == ["layer_1", "decode"]


def test_reason_names_the_threshold_and_the_value():
    gates = gates_for()
    verdict = status("mel_features", gates, metrics={"cosine": 0.9981})
    assert verdict.status == "fail"
    assert verdict.reason == "cosine 0.9981 < 0.99999"
    # enough digits to show the value is below the limit, not a rounded "0.99999 < 0.99999"
    assert status("mel_features", gates, metrics={"cosine": 0.9999899}).reason == (
        "cosine 0.9999899 < 0.99999"
    )
    both = status("layer_0", gates, metrics={"cosine": 0.5, "nmse": 0.25})
    assert both.reason == "cosine 0.5 < 0.99999; nmse 0.25 > 1e-08"
    f16 = gates_for(weight_type="f16")
    tol = status("layer_0", f16, metrics={"cosine": 1.0, "std_ratio": 1.02})
    assert tol.reason == "std_ratio 1.02 outside 1 ± 0.01"


def test_a_nan_metric_or_non_finite_value_never_passes():
    gates = gates_for()
    assert status("mel_features", gates, metrics={"cosine": math.nan}).reason == (
        "cosine NaN < 0.99999"
    )
    verdict = status(
        "mel_features", gates, metrics={"cosine": math.nan, "non_finite": 3, "argmax": "4,1"}
    )
    assert verdict == ("fail", "default/mel_features: cosine>=0.99999",
                       "3 non-finite value(s) in candidate (first at 4,1)")
    verdict = status("mel_features", gates, metrics={"cosine": math.nan, "ref_non_finite": 2})
    assert verdict.reason == "reference holds 2 non-finite value(s)"


def test_declared_failure_is_xfail_and_stale_declaration_fails():
    gates = gates_for(backend="vulkan")
    failing = status("layer_1", gates, metrics={"cosine": 0.9, "nmse": 1e-9})
    assert failing.status == "xfail"
    assert failing.reason == "expected (lavapipe rounding): cosine 0.9 < 0.99999"
    passing = status("layer_1", gates, metrics={"cosine": 1.0, "nmse": 0.0})
    assert passing.status == "fail"
    assert passing.reason == (
        "declared expected failure passed (stale declaration: lavapipe rounding)"
    )


def test_a_declaration_that_is_not_strict_lets_the_stage_pass_or_xfail():
    section = {**SECTION, "expected_failures": [
        {"stage": "decode", "reason": "a near-tie re-routes", "strict": False}]}
    gates = json.loads(json.dumps(resolve_gates(section, CELL)))
    assert gates["expected_failures"] == [
        {"stage": "decode", "reason": "a near-tie re-routes", "strict": False}]
    passing = status("decode", gates, metrics={"exact": True, "wer": 0.0})
    assert passing == ("pass", "default/decode: wer<=0.0, exact",
                       "passed; declared as a possible failure (a near-tie re-routes)")
    failing = status("decode", gates, metrics={"exact": False, "wer": 0.2})
    assert failing.status == "xfail" and failing.reason.startswith("expected (a near-tie")
    # strict is the default: the same declaration without it goes stale on a pass
    strict = {**section, "expected_failures": [{"stage": "decode", "reason": "r"}]}
    assert status("decode", resolve_gates(strict, CELL), metrics={"exact": True, "wer": 0.0}
                  ).status == "fail"
    with pytest.raises(AudioparityError, match=r"expected_failures\[0\].*strict must be true"):
        resolve_gates({**SECTION, "expected_failures": [
            {"stage": "decode", "reason": "r", "strict": "no"}]}, CELL)


def test_kl_gate_applies_to_logits():
    gates = {"gates": [{"stage": "*logits", "from": "f16", "kl_max": 1e-6},
                       {"stage": "*", "from": "default", "kl_max": 1e-6}],
             "expected_failures": []}
    assert status("audio_logits", gates, metrics={"kl": 5e-7}) == (
        "pass", "f16/*logits: kl<=1e-06", ""
    )
    assert status("audio_logits", gates, metrics={"kl": 2e-6}).reason == "kl 2e-06 > 1e-06"
    assert status("audio_logits", gates, metrics={"kl": math.nan}).reason == "kl NaN > 1e-06"
    with pytest.raises(AudioparityError, match="kl_max.*stage 'last_hidden'"):
        status("last_hidden", gates, metrics={"cosine": 1.0, "kl": None})


def test_exact_reason_gives_the_divergence_and_the_reference_logit_gap():
    gates = {"gates": [{"stage": "generation", "exact": True}], "expected_failures": []}
    metrics = {"exact": False, "differing": ["rows", "stopped"], "first_divergence": 3,
               "logit_gap": 0.012345678}
    assert status("generation", gates, metrics=metrics).reason == (
        "not exact: rows, stopped differ (first divergence at position 3, "
        "reference logit gap 0.01235)"
    )
    metrics.update(differing=["rules"], first_divergence=None, logit_gap=None)
    assert status("generation", gates, metrics=metrics).reason == "not exact: rules differ"


def test_stage_without_gate_is_a_config_error():
    with pytest.raises(AudioparityError, match="no entry matches stage 'pos_emb'"):
        status("pos_emb", gates_for(), metrics={"cosine": 1.0})


def test_threshold_that_does_not_apply_is_a_config_error():
    gates = {"gates": [{"stage": "*", "top1_min": 1.0}], "expected_failures": []}
    with pytest.raises(AudioparityError, match="top1_min.*stage 'layer_0'"):
        status("layer_0", gates, metrics={"cosine": 1.0, "top1": None})
    gates = {"gates": [{"stage": "*", "exact": True}], "expected_failures": []}
    with pytest.raises(AudioparityError, match="exact.*stage 'enc_out'"):
        status("enc_out", gates, metrics={"cosine": 1.0})


@pytest.mark.parametrize("availability", ["unavailable", "crashed", "missing"])
def test_not_compared_statuses_keep_their_message(availability):
    verdict = status("enc_out", gates_for(weight_type="f16"), availability=availability,
                     problems=("signal 6: GGML_ASSERT(...) failed",))
    assert verdict.status == availability  # declared xfail does not mask it
    assert verdict.reason == "signal 6: GGML_ASSERT(...) failed"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"stage": "x", "cosine_mn": 0.9}, "unknown key.*cosine_mn"),
        ({"cosine_min": 0.9}, "needs a 'stage'"),
        ({"stage": "x"}, "sets no threshold"),
        ({"stage": "x", "exact": False}, "sets no threshold"),
        ({"stage": "x", "nmse_max": "1e-8"}, "nmse_max must be a number"),
        ({"stage": "x", "kl_max": None}, "kl_max must be a number"),
        ({"stage": "x", "exact": "yes"}, "exact must be true or false"),
    ],
)
def test_malformed_gate_entries_are_named(entry, message):
    with pytest.raises(AudioparityError, match=rf"default\[0\]: .*{message}"):
        resolve_gates({"gates": {"default": [entry]}}, CELL)


def test_expected_failure_needs_a_reason():
    section = {"gates": SECTION["gates"], "expected_failures": [{"stage": "enc_out"}]}
    with pytest.raises(AudioparityError, match=r"expected_failures\[0\].*'reason'"):
        resolve_gates(section, CELL)


#: A section whose CUDA list is a copy of its Vulkan list, marked so.
COPIED = "copied from the Vulkan lists (lavapipe)"
UNMEASURED_SECTION = {"gates": {"default": [{"stage": "*", "nmse_max": 1e-12}],
                                "q8_0": [{"stage": "*", "nmse_max": 1e-6}],
                                "q8_0@vulkan": [{"stage": "*", "nmse_max": 1e-3}],
                                "q8_0@cuda": [{"stage": "*", "nmse_max": 1e-3}]},
                      "unmeasured_gates": {"*@cuda": COPIED}}


@pytest.mark.parametrize(("backend", "ggml_backend", "weight_type", "gate"), [
    ("cuda", "cuda", "q8_0", f"q8_0@cuda/*: nmse<=0.001 (unmeasured on cuda: {COPIED})"),
    ("cuda-strict", "cuda", "q8_0", f"q8_0@cuda/*: nmse<=0.001 (unmeasured on cuda: {COPIED})"),
    ("cuda-strict", "cuda", "f32", "default/*: nmse<=1e-12"),  # the CPU's float32 gates
    ("vulkan", "vulkan", "q8_0", "q8_0@vulkan/*: nmse<=0.001"),
    ("cpu", "cpu", "q8_0", "q8_0/*: nmse<=1e-06"),
])
def test_a_list_no_device_of_its_backend_measured_marks_the_gate_of_each_row_it_judges(
        backend, ggml_backend, weight_type, gate):
    """A setting takes its ggml backend's lists; the entries of an unmeasured one judge as
    the Vulkan list's do, and their gate text says they are unmeasured, which the report
    reads back."""
    for against in ("reference", "cpu"):
        gates = json.loads(json.dumps(resolve_gates(
            UNMEASURED_SECTION, CELL._replace(backend=backend, weight_type=weight_type,
                                              against=against), ggml_backend=ggml_backend)))
        check_resolved(gates)
        verdict = status("enc_out", gates, metrics={"nmse": 1e-13})
        assert verdict == ("pass", gate, "")
        assert unmeasured_mark(verdict.gate) == (
            f"unmeasured on cuda: {COPIED}" if ggml_backend == "cuda" and weight_type == "q8_0"
            else None)
        assert status("enc_out", gates, availability="unavailable").gate == gate


@pytest.mark.parametrize(("named", "message"), [
    ({"*@cdua": "why"}, r"'\*@cdua': name a backend's gate lists, <weight type>@<cpu\|cuda\|"),
    ({"cuda": "why"}, "'cuda': name a backend's gate lists"),
    ({"*@cuda": " "}, r"'\*@cuda': say why they are unmeasured, got ' '"),
    ({"f16@cuda": "why"}, r"'f16@cuda': names no gate list of the section \(its backends' lists: "
                          r"q8_0@vulkan, q8_0@cuda\)"),
    (["*@cuda"], ": expected a mapping of gate list -> why"),
])
def test_a_malformed_unmeasured_gates_entry_is_named(named, message):
    with pytest.raises(AudioparityError, match=f"^unmeasured_gates.*{message}"):
        resolve_gates({**UNMEASURED_SECTION, "unmeasured_gates": named}, CELL)


def test_resolved_gates_with_an_unmeasured_mark_the_report_cannot_read_are_refused():
    gates = {"gates": [{"stage": "*", "nmse_max": 1.0, "from": "q8_0@cuda",
                        "unmeasured": "copied"}], "expected_failures": []}
    with pytest.raises(AudioparityError, match=r"gates\[0\]: unmeasured must read"):
        check_resolved(gates)


# --- compare_cell on synthetic dumps ----------------------------------------------------------

DECODE = {"ids": [5, 9, 9, 2], "frames": [0, 3, 3, 7], "durations": [3, 0, 4, 1], "text": "a b c"}
RNG = np.random.default_rng(0)
REFERENCE = {
    "mel_features": (RNG.normal(size=(8, 4)).astype(np.float32), "[T, n_mels]"),
    "layer_0": (RNG.normal(size=(4, 6)).astype(np.float32), "[T, D]"),
    "layer_1": (RNG.normal(size=(4, 6)).astype(np.float32), "[T, D]"),
    "joint_logits": (RNG.normal(size=(5, 7)).astype(np.float32), "[steps, V+1+n_durations]"),
}


def write_dump(path: Path, tmp: Path, tensors: dict, documents: dict, **fields) -> Path:
    model, audio = tmp / "model.bin", tmp / "clip.wav"
    model.write_bytes(b"m")
    audio.write_bytes(b"a")
    status_ = fields.pop("status", None)
    with DumpWriter(path, producer="test", model=model, inputs={"audio": audio},
                    fields=fields) as writer:
        for name, (array, layout) in tensors.items():
            writer.add_tensor(name, array, layout)
        for name, document in documents.items():
            writer.add_json(name, document)
        if status_:
            writer.set_status(*status_)
        writer.manifest["seconds"].update({name: 0.5 for name in tensors})
    return path


@pytest.fixture
def reference_dir(tmp_path: Path) -> Path:
    return write_dump(tmp_path / "ref", tmp_path, REFERENCE, {"decode": DECODE})


LABELS = {"family": "parakeet_tdt", "model": "tiny", "case": "clip", "candidate": "audioparity",
          "backend": "cpu",
          "weight_type": "f32"}


def run_cell(reference_dir: Path, candidate_dir: Path, tmp_path: Path) -> dict[str, dict]:
    output = tmp_path / "cells" / "cell.json"
    compare_cell(CellDumps(reference_dir, candidate_dir), gates_for(), LABELS, output)
    text = output.read_text()
    rows = json.loads(text, parse_constant=lambda token: pytest.fail(f"non-JSON {token}"))
    assert all(list(row) == list(COLUMNS) for row in rows)
    assert not list(output.parent.glob(".*tmp"))
    return {row["stage"]: row for row in rows}


def test_compare_cell_rows(reference_dir: Path, tmp_path: Path):
    layer_0, _ = REFERENCE["layer_0"]
    logits, _ = REFERENCE["joint_logits"]
    nan_layer = REFERENCE["layer_1"][0].copy()
    nan_layer[2, 3] = np.nan
    mel, _ = REFERENCE["mel_features"]
    candidate = {  # mel: one frame more than the reference's 8, the 8 equal
        "mel_features": (np.concatenate([mel, np.zeros((1, 4), np.float32)]), "[T, n_mels]"),
        "layer_0": (layer_0, "[T, D]"),
        "layer_0_isolated": (layer_0 + np.float32(1e-3), "[T, D]"),
        "layer_1": (nan_layer, "[T, D]"),
        "joint_logits": (logits, "[V+1+n_durations, steps]"),
        "extra": (np.zeros(3, np.float32), "[D]"),
    }
    replay = {**DECODE, "ids": [5, 9, 8, 2], "text": "a b d"}
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, candidate,
                               {"decode": DECODE, "decoder_replay": replay})
    rows = run_cell(reference_dir, candidate_dir, tmp_path)

    assert rows["layer_0"]["status"] == "pass"
    assert rows["layer_0"]["cosine"] == pytest.approx(1.0, abs=1e-15)
    assert rows["layer_0"]["nmse"] == 0.0
    assert rows["layer_0"]["top1"] is None and rows["layer_0"]["token_match"] is None
    assert rows["layer_0"]["seconds"] == 0.5
    assert {k: rows["layer_0"][k] for k in LABELS} == LABELS
    # isolated layer: compared with reference layer_0; 1e-3 offsets everywhere
    isolated = rows["layer_0_isolated"]
    assert isolated["status"] == "fail" and isolated["max_abs"] == pytest.approx(1e-3, rel=1e-3)
    assert isolated["reason"].startswith("nmse ") and isolated["reason"].endswith(" > 1e-10")
    assert rows["mel_features"]["status"] == "fail"
    assert rows["mel_features"]["reason"] == ("frames: 9 (candidate) != 8 (reference); the "
                                              "metrics are over the first 8")
    assert rows["mel_features"]["cosine"] == pytest.approx(1.0, abs=1e-12)  # the common frames
    assert rows["layer_1"]["status"] == "fail"
    assert rows["layer_1"]["non_finite"] == 1 and rows["layer_1"]["argmax"] == "2,3"
    assert rows["layer_1"]["cosine"] == "nan"
    assert rows["joint_logits"]["status"] == "fail"
    assert rows["joint_logits"]["reason"] == (
        "layout [V+1+n_durations, steps] (candidate) != [steps, V+1+n_durations] (reference)"
    )
    assert rows["joint_logits"]["top1"] == 1.0  # same shape: metrics still computed
    assert rows["decode"]["status"] == "pass"
    assert rows["decode"]["token_match"] == 1.0 and rows["decode"]["wer"] == 0.0
    replayed = rows["decoder_replay"]
    assert replayed["status"] == "fail"
    assert replayed["token_match"] == 0.75 and replayed["first_divergence"] == 2
    assert replayed["wer"] == pytest.approx(1 / 3)
    assert replayed["reason"] == "not exact: ids, text differ (first divergence at position 2)"
    assert rows["extra"]["status"] == "missing"
    assert "no reference stage 'extra'" in rows["extra"]["reason"]
    assert rows["extra"]["gate"] == ""  # not compared: no gate needed


@pytest.mark.parametrize(("shape", "reason", "measured"), [
    ((7, 6), "frames: 7 (candidate) != 4 (reference); the metrics are over the first 4", True),
    ((2, 6), "frames: 2 (candidate) != 4 (reference); the metrics are over the first 2", True),
    ((4, 7), "shape [4, 7] (candidate) != [4, 6] (reference)", False),
    ((5, 7), "shape [5, 7] (candidate) != [4, 6] (reference)", False),
])
def test_frames_alone_are_measured_over_the_common_ones_another_shape_is_not(
        reference_dir: Path, tmp_path: Path, shape, reason, measured):
    layer_0, _ = REFERENCE["layer_0"]
    array = np.zeros(shape, np.float32)
    common = tuple(min(a, b) for a, b in zip(shape, layer_0.shape, strict=True))
    array[:common[0], :common[1]] = layer_0[:common[0], :common[1]]
    tensors = {**REFERENCE, "layer_0": (array, "[T, D]")}
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, tensors, {"decode": DECODE})
    row = run_cell(reference_dir, candidate_dir, tmp_path)["layer_0"]
    assert (row["status"], row["reason"]) == ("fail", reason)
    if measured:
        assert row["cosine"] == pytest.approx(1.0, abs=1e-12) and row["max_abs"] == 0.0
    else:
        assert row["cosine"] is None


def test_reference_stage_absent_from_candidate_is_missing(reference_dir: Path, tmp_path: Path):
    tensors = {k: v for k, v in REFERENCE.items() if k != "layer_1"}
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, tensors, {"decode": DECODE})
    rows = run_cell(reference_dir, candidate_dir, tmp_path)
    assert rows["layer_1"]["status"] == "missing"
    assert rows["layer_1"]["reason"].startswith("not in the candidate dump")
    assert {r["status"] for s, r in rows.items() if s != "layer_1"} == {"pass"}


def test_absent_candidate_dir_makes_every_stage_missing(reference_dir: Path, tmp_path: Path):
    rows = run_cell(reference_dir, tmp_path / "nowhere", tmp_path)
    assert set(rows) == {*REFERENCE, "decode"}
    assert {r["status"] for r in rows.values()} == {"missing"}
    assert rows["decode"]["reason"] == f"no candidate dump at {tmp_path / 'nowhere'}"


def test_unavailable_candidate(reference_dir: Path, tmp_path: Path):
    message = "backend cuda is not built in"
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, {}, {},
                               status=("unavailable", message))
    rows = run_cell(reference_dir, candidate_dir, tmp_path)
    assert {(r["status"], r["reason"]) for r in rows.values()} == {("unavailable", message)}
    assert rows["layer_0"]["gate"] == "default/layer_*: cosine>=0.99999, nmse<=1e-08"


def test_a_crashed_candidate_without_stages_crashed_first_and_missing_after(reference_dir,
                                                                            tmp_path):
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, {}, {},
                               status=("crashed", "killed by SIGABRT"))
    rows = run_cell(reference_dir, candidate_dir, tmp_path)
    first = min(rows, key=lambda stage: spec_of("parakeet_tdt").stage_key(stage))
    assert (rows[first]["status"], rows[first]["reason"]) == ("crashed", "killed by SIGABRT")
    assert {r["status"] for stage, r in rows.items() if stage != first} == {"missing"}
    assert all(f"the dump crashed in {first} (killed by SIGABRT)" in r["reason"]
               for stage, r in rows.items() if stage != first)


def test_a_crashed_candidate_keeps_what_it_finished(reference_dir, tmp_path):
    """A dump that died in its decoder: the finished stages are compared, the stage it was
    computing is crashed, the ones after it are missing (counted as such)."""
    reference = Dump(reference_dir)
    finished = {name: (reference.tensor(name), reference.layout(name))
                for name in reference.tensor_names}
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, finished, {},
                               status=("crashed", "exit code 1: RuntimeError"))
    manifest = json.loads((candidate_dir / "manifest.json").read_text())
    manifest["crashed_in"] = "decode"
    (candidate_dir / "manifest.json").write_text(json.dumps(manifest))
    rows = run_cell(reference_dir, candidate_dir, tmp_path)
    assert rows["decode"]["status"] == "crashed"
    assert {rows[name]["status"] for name in finished} == {"pass"}
    assert all(r["status"] in ("pass", "crashed", "missing") for r in rows.values())


def test_a_crashed_tool_is_charged_at_the_first_stage_it_exposes(reference_dir, tmp_path):
    """A third-party tool that died after the mel names no stage it was computing: the crash
    is charged to the first stage it lacks in pipeline order of those it writes, not to one it
    never exposes (recorded as it died), which stays ``unavailable``."""
    mel = {"mel_features": REFERENCE["mel_features"]}
    candidate_dir = write_dump(tmp_path / "cand", tmp_path, mel, {},
                               status=("crashed", "port failed (exit code 3): GGML_ASSERT"),
                               not_exposed={"layer_{i}": "it does not expose it"})
    rows = run_cell(reference_dir, candidate_dir, tmp_path)
    assert {stage: row["status"] for stage, row in rows.items()} == {
        "mel_features": "pass", "layer_0": "unavailable", "layer_1": "unavailable",
        "joint_logits": "crashed", "decode": "missing"}
    assert rows["joint_logits"]["reason"] == "port failed (exit code 3): GGML_ASSERT"
    assert rows["decode"]["reason"] == ("not computed: the dump crashed in joint_logits (port "
                                        "failed (exit code 3): GGML_ASSERT)")


def test_a_crashed_port_against_another_backend_lists_each_isolated_form_once(tmp_path):
    """Against the CPU's dump of the same port (which holds the isolated forms as stages of
    its own), the forms a crashed port owed are its baseline's rows, not added again."""
    layer, _ = REFERENCE["layer_0"]
    baseline = write_dump(tmp_path / "cpu", tmp_path, {
        "layer_0": (layer, "[T, D]"), "layer_0_isolated": (layer, "[T, D]")}, {})
    crashed = write_dump(tmp_path / "cand", tmp_path, {}, {}, status=("crashed", "SIGABRT"))
    for folder in (baseline, crashed):  # both dumps of our ggml port
        manifest = json.loads((folder / "manifest.json").read_text())
        (folder / "manifest.json").write_text(json.dumps({**manifest, "producer": "ggml"}))
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(baseline, crashed), gates_for(), {**LABELS, "against": "cpu"}, output)
    stages = [row["stage"] for row in json.loads(output.read_text())]
    assert sorted(stages) == ["layer_0", "layer_0_isolated"]


def test_compare_cell_rejects_unresolved_gates(reference_dir: Path, tmp_path: Path):
    with pytest.raises(AudioparityError, match="as resolve_gates returns"):
        compare_cell(CellDumps(reference_dir, reference_dir), SECTION["gates"], LABELS,
                     tmp_path / "c.json")


def _moss_like_cell(tmp_path: Path, labels: dict, gates: list) -> dict[str, dict]:
    """The rows of a cell whose candidate flips the top-1 of row 0 of ``audio_logits`` and
    parts from the reference's ``generation`` at row 1."""
    hidden = RNG.normal(size=16).astype(np.float32)
    logits = RNG.normal(size=(4, 9)).astype(np.float32)
    logits[:, -1] = -np.inf  # the pad logit, masked on both sides
    generation = {"rows": [[1, 2, 3], [4, 5, 6]]}
    reference = write_dump(tmp_path / "ref", tmp_path,
                           {"last_hidden": (hidden, "[H]"), "audio_logits": (logits, "[n_vq, V]")},
                           {"generation": generation})
    flipped = logits.copy()
    flipped[0, :-1] = flipped[0, :-1][::-1]  # row 0's argmax moves
    candidate = write_dump(tmp_path / "cand", tmp_path,
                           {"last_hidden": (hidden, "[H]"), "audio_logits": (flipped, "[n_vq, V]")},
                           {"generation": {"rows": [[1, 2, 3], [4, 5, 7]]}})
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(reference, candidate), {"gates": gates, "expected_failures": []}, labels,
                 output)
    return {r["stage"]: r for r in json.loads(output.read_text())}


def test_moss_like_stages_compare_by_the_kind_their_spec_declares(tmp_path: Path):
    gates = [{"stage": "*logits", "top1_min": 1.0}, {"stage": "*hidden", "nmse_max": 0},
             {"stage": "generation", "exact": True}]
    rows = _moss_like_cell(tmp_path, {**LABELS, "family": "moss_voicegen"}, gates)
    assert rows["last_hidden"]["status"] == "pass" and rows["last_hidden"]["top1"] is None
    assert rows["audio_logits"]["non_finite"] == 0 and rows["audio_logits"]["top1"] == 0.75
    assert rows["audio_logits"]["reason"] == (
        "top1 0.75 < 1.0; top-1 differs in row(s) 0 of audio_logits")
    assert rows["generation"]["token_match"] == 0.5
    assert rows["generation"]["reason"] == "not exact: rows differ (first divergence at position 1)"


def test_a_stage_of_a_family_this_install_does_not_know_compares_as_a_tensor(tmp_path: Path):
    """Its name says nothing: a stage named like logits gets no top-1 or KL, and a gate that
    asks for them is a config error."""
    labels = {**LABELS, "family": "somebody_elses"}
    gates = [{"stage": "*logits", "nmse_max": 1.0}, {"stage": "*hidden", "nmse_max": 0},
             {"stage": "generation", "exact": True}]
    (tmp_path / "tensor").mkdir()
    (tmp_path / "top1").mkdir()
    rows = _moss_like_cell(tmp_path / "tensor", labels, gates)
    assert rows["audio_logits"]["top1"] is None and rows["audio_logits"]["kl"] is None
    assert rows["audio_logits"]["nmse"] > 0 and rows["audio_logits"]["status"] == "pass"
    with pytest.raises(AudioparityError, match=r"sets top1_min, which does not apply to stage "
                       r"'audio_logits'"):
        _moss_like_cell(tmp_path / "top1", labels, [{"stage": "*logits", "top1_min": 1.0},
                                                    *gates[1:]])


def _document_metrics(exact, first_divergence=None, logit_gap=None):
    return {"exact": exact, "first_divergence": first_divergence, "logit_gap": logit_gap,
            "token_match": 1.0 if exact else 0.5, "non_finite": 0, "differing": ["rows"]}


@pytest.mark.parametrize(
    ("metrics", "expected"),
    [
        (_document_metrics(True), "pass"),
        (_document_metrics(False, 6, 5.6e-4), "pass"),  # parted at a near-tie
        (_document_metrics(False, 2, 0.3), "fail"),  # parted where the reference was sure
        (_document_metrics(False, 2, None), "fail"),  # parted, nothing to judge it by
    ],
)
def test_logit_gap_max_lets_documents_part_only_at_a_near_tie(metrics, expected):
    gates = {"gates": [{"stage": "generation", "logit_gap_max": 0.05}], "expected_failures": []}
    verdict = status("generation", gates, metrics=metrics)
    assert verdict.status == expected, verdict.reason


def _decode_logits(flips: dict[int, tuple[float, float]], steps: int = 8) -> tuple:
    """Hand-built teacher-forced logits ``[steps, 4]``: the reference's row ``r`` picks class 0
    over class 1 by margin 2 (``flips`` gives some rows ``(margin, candidate's excess)``: the
    reference's margin there, and how far the candidate puts class 1 above class 0 instead)."""
    ref = np.tile(np.array([3.0, 1.0, 0.0, -1.0]), (steps, 1))
    cand = ref + 1e-4  # float noise that flips nothing
    for row, (margin, excess) in flips.items():
        ref[row, 1] = ref[row, 0] - margin
        cand[row, 1] = cand[row, 0] + excess
    return cand, ref


@pytest.mark.parametrize(
    ("flips", "expected"),
    [
        ({}, "pass"),
        ({2: (0.004, 0.001)}, "pass"),  # one near tie flipped: costs its own step only
        ({2: (0.004, 0.001), 5: (0.008, 0.002)}, "pass"),  # every flip a near tie
        ({2: (0.004, 0.001), 6: (0.5, 0.1)}, "fail"),  # a later step flips where sure
        ({1: (0.3, 0.01)}, "fail"),  # a clear margin flipped by a small error
    ],
)
def test_logit_gap_max_on_a_logits_stage_judges_every_step(flips, expected):
    """A teacher-forced decode whose candidate flips at a near tie at step 2 passes: the
    steps after it are fed the reference's choice and judged each on its own; any other step
    flipped at a clear margin fails, however late."""
    from audioparity.compare.stage import tensor_metrics

    cand, ref = _decode_logits(flips)
    metrics = tensor_metrics("logits", cand, ref)
    assert metrics["top1"] == 1 - len(flips) / 8
    assert metrics["logit_gap"] == pytest.approx(max((m for m, _ in flips.values()), default=0))
    gates = {"gates": [{"stage": "decode_logits", "from": "q8_0", "logit_gap_max": 0.01}],
             "expected_failures": []}
    verdict = status("decode_logits", gates, metrics=metrics)
    assert verdict.status == expected, verdict.reason
    assert verdict.gate == "q8_0/decode_logits: near ties only: logit_gap<=0.01"


def test_a_failing_logits_logit_gap_names_the_clear_flips_and_their_margins():
    flips = {1: (0.003, 0.001), **{row: (0.25 * row, 0.5) for row in range(2, 9)}}
    metrics = {"cosine": 1.0, "top1": 0.2, "logit_gap": 2.0, "non_finite": 0,
               "top1_flips": sorted((row, margin) for row, (margin, _) in flips.items())}
    gates = {"gates": [{"stage": "*logits", "logit_gap_max": 0.01}], "expected_failures": []}
    assert status("joint_logits", gates, metrics=metrics).reason == (
        "top-1 flips at 7 row(s) where the reference's margin > 0.01: row (margin) 2 (0.5), "
        "3 (0.75), 4 (1), 5 (1.25), 6 (1.5) and 2 more")


def test_logit_gap_max_on_a_tensor_stage_is_a_config_error():
    gates = {"gates": [{"stage": "*", "logit_gap_max": 0.05}], "expected_failures": []}
    with pytest.raises(AudioparityError, match="applies to documents and logits"):
        status("last_hidden", gates, metrics={"max_rel": 1e-7, "non_finite": 0})


def test_against_a_backend_every_stage_meets_its_namesake_and_no_declaration_applies(tmp_path):
    """A Vulkan cell against the CPU cell: layer_0_isolated is compared with the CPU's
    layer_0_isolated (with the reference, it is compared with layer_0), and an expected failure
    of the section explains differences from the reference only."""
    rng = np.random.default_rng(3)
    layer, isolated = (rng.standard_normal((4, 8)).astype(np.float32) for _ in range(2))

    def dump(name: str, isolated_values: np.ndarray) -> Path:
        source = tmp_path / "clip.wav"
        source.write_bytes(b"")
        with DumpWriter(tmp_path / name, producer="ggml", model=source) as writer:
            writer.add_tensor("layer_0", layer, "[T, D]")
            writer.add_tensor("layer_0_isolated", isolated_values, "[T, D]")
        return tmp_path / name

    cpu, vulkan = dump("cpu", isolated), dump("vulkan", isolated * np.float32(1 + 1e-3))
    section = {"gates": {"default": [{"stage": "layer_*", "nmse_max": 1e-10}]},
               "expected_failures": [{"stage": "layer_0_isolated", "reason": "declared"}]}
    for against in ("reference", "cpu"):
        gates = resolve_gates(section, CELL._replace(backend="vulkan", against=against))
        assert len(gates["expected_failures"]) == (against == "reference")
    gates = resolve_gates(section, CELL._replace(backend="vulkan", against="cpu"))
    labels = {"family": "parakeet_tdt", "model": "tiny", "case": "clip",
              "candidate": "audioparity", "backend": "vulkan", "weight_type": "f32",
              "against": "cpu"}
    compare_cell(CellDumps(cpu, vulkan), gates, labels, tmp_path / "cell.json")
    rows = {row["stage"]: row for row in json.loads((tmp_path / "cell.json").read_text())}
    assert rows["layer_0"]["status"] == "pass" and rows["layer_0"]["nmse"] == 0.0
    isolated_row = rows["layer_0_isolated"]
    assert isolated_row["status"] == "fail" and isolated_row["against"] == "cpu"
    assert isolated_row["nmse"] == pytest.approx(1e-6, rel=1e-3)  # against its namesake


def test_two_dumps_of_a_candidate_holding_a_view_are_compared_as_they_are(tmp_path):
    """transcribe.cpp dumps its first joint step, log-softmaxed: against the reference the view
    is applied to the reference's joint_logits; against the same port on the CPU, which holds the
    same view, it is not applied again."""
    view = [["row", 0], ["log_softmax"]]
    row0 = np.log(np.full(6, 1 / 6, np.float32))

    def dump(name: str, values: np.ndarray) -> Path:
        source = tmp_path / "clip.wav"
        source.write_bytes(b"")
        with DumpWriter(tmp_path / name, producer="transcribe_cpp", model=source) as writer:
            writer.add_tensor("joint_logits", values, "view row(0) log_softmax() of [steps, C]")
            writer.manifest["conventions"] = {"joint_logits": {"view": view, "why": "first"}}
        return tmp_path / name

    cpu, vulkan = dump("cpu", row0), dump("vulkan", row0 + np.float32(1e-7))
    gates = {"gates": [{"stage": "joint_logits", "nmse_max": 1e-10, "from": "default"}],
             "expected_failures": []}
    labels = {"family": "parakeet_tdt", "model": "m", "case": "c", "candidate": "t",
              "backend": "vulkan", "weight_type": "f32", "against": "cpu"}
    compare_cell(CellDumps(cpu, vulkan), gates, labels, tmp_path / "cell.json")
    (row,) = json.loads((tmp_path / "cell.json").read_text())
    assert row["status"] == "pass" and row["nmse"] < 1e-10, row


def test_a_quantized_cell_is_measured_against_its_own_reference_and_costed_against_f32(
        reference_dir: Path, tmp_path: Path):
    """With ``cost_dir``: the metrics and the verdict against the (quantization-aware)
    reference, the cost columns against the float32 one, computed here in float64, but for a
    stage on the reference's own path."""
    emulated = {name: (array + np.float32(1e-3) * RNG.normal(size=array.shape).astype(np.float32),
                       layout) for name, (array, layout) in REFERENCE.items()}
    emulated_dir = write_dump(tmp_path / "emulated", tmp_path, emulated, {"decode": DECODE})
    candidate = write_dump(tmp_path / "cand", tmp_path, emulated, {"decode": DECODE})
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(emulated_dir, candidate, cost=reference_dir), gates_for(),
                 {**LABELS, "weight_type": "q8_0"}, output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    layer, ref = emulated["layer_0"][0].astype(np.float64), REFERENCE["layer_0"][0]
    assert rows["layer_0"]["nmse"] == 0.0 and rows["layer_0"]["status"] == "pass"
    expected = np.sum((layer - ref) ** 2) / np.sum(ref.astype(np.float64) ** 2)
    assert rows["layer_0"]["cost_nmse"] == pytest.approx(expected, rel=1e-9)
    assert 0.999 < rows["layer_0"]["cost_cosine"] < 1.0
    assert rows["decode"]["cost_token_match"] == 1.0 and rows["decode"]["cost_nmse"] is None
    # joint rows follow the reference's own greedy path: no distance from another reference
    assert rows["joint_logits"]["nmse"] == 0.0 and rows["joint_logits"]["cost_nmse"] is None
    without = tmp_path / "plain.json"
    compare_cell(CellDumps(emulated_dir, candidate), gates_for(), LABELS, without)
    assert all(row[c] is None for row in json.loads(without.read_text())
               for c in ("cost_nmse", "cost_cosine", "cost_token_match"))


RECIPE = {"base": "q4_0", "wide": "q8_0", "overrides": {"encoder.layers.0.w.weight": "q8_0"},
          "targets": [{"stage": "decode", "wer_max": 0.0}], "search": {"met": True}}


def test_a_recipe_cell_verifies_its_targets_on_its_own_dump_against_float32(
        reference_dir: Path, tmp_path: Path):
    """The row `recipe`: the recipe's targets on the candidate's dump against the float32
    reference. A candidate that computes what its quantization-aware reference computes
    passes every stage, and the recipe's row still fails where that decode is not float32's,
    naming the stage, the case and the value; a search that met no targets fails every cell's
    row, saying so."""
    moved = {**DECODE, "ids": [5, 9, 8, 2], "text": "a b d"}
    emulated = write_dump(tmp_path / "emulated", tmp_path, REFERENCE, {"decode": moved})
    candidate = write_dump(tmp_path / "cand", tmp_path, REFERENCE, {"decode": moved})
    labels = {**LABELS, "weight_type": "q4_0+recipe"}

    def rows(reference, cand, recipe):
        output = tmp_path / "cell.json"
        compare_cell(CellDumps(reference, cand, cost=reference_dir), gates_for(), labels, output,
                     extra=partial(recipe_row, recipe=recipe))
        return {row["stage"]: row for row in json.loads(output.read_text())}

    missed = rows(emulated, candidate, RECIPE)
    assert missed["decode"]["status"] == "pass"
    assert missed["recipe"]["status"] == "fail"
    assert missed["recipe"]["reason"].startswith("not verified: decode of clip: wer 0.33")
    assert missed["recipe"]["gate"] == "the recipe's targets, against the float32 reference"
    met = rows(reference_dir, reference_dir, RECIPE)["recipe"]
    assert met["status"] == "pass" and met["reason"].startswith("1 weight(s) kept q8_0")
    unmet = {**RECIPE, "search": {"met": False, "unmet": "with all 9 matmul weights kept q8_0, "
                                  "decode of clip: wer 0.1 > 0"}}
    failed = rows(reference_dir, reference_dir, unmet)["recipe"]
    assert failed["status"] == "fail" and failed["reason"] == (
        "its search met no recipe on its calibration cases: with all 9 matmul weights kept "
        "q8_0, decode of clip: wer 0.1 > 0")
    assert "recipe" not in rows(reference_dir, reference_dir, {**RECIPE, "targets": []})


def test_a_threshold_on_a_field_the_candidate_omits_is_not_read_and_any_other_is_an_error():
    gates = {"gates": [{"stage": "prompt", "exact": True, "wer_max": 0.0, "from": "default"}],
             "expected_failures": []}
    omitted = {"exact": True, "differing": [], "wer": None,
               "not_measured": {"wer": "the candidate writes no text"}}
    assert status("prompt", gates, metrics=omitted).status == "pass"
    assert status("prompt", gates, metrics={**omitted, "exact": False,
                                            "differing": ["rows"]}).status == "fail"
    with pytest.raises(AudioparityError, match="sets wer_max, which does not apply"):
        status("prompt", gates, metrics={"exact": True, "differing": [], "wer": None})


def test_every_stage_kind_has_a_comparison():
    from audioparity.compare.stage import ARRAY_METRICS, COMPARE
    from audioparity.contract.vocabulary import STAGE_KINDS

    assert set(COMPARE) == set(STAGE_KINDS)
    assert set(ARRAY_METRICS) == {kind for kind in STAGE_KINDS if kind != "document"}


def test_the_config_schema_takes_every_threshold_and_nothing_else():
    """A threshold gates.py knows but the schema lacks would be refused in a user's config
    before any run; one the schema takes but gates.py lacks would fail every compare job."""
    schema = yaml.safe_load((REPO / "config/schema.yaml").read_text())
    assert set(schema["definitions"]["gate"]["properties"]) == {"stage", *THRESHOLDS}
    scaling = schema["definitions"]["family"]["properties"]["length_scaling"]
    assert set(scaling["properties"]["entries"]["additionalProperties"]["properties"]) == {
        "measured_at", "frames_of", *LENGTH_SCALED}
    unmeasured = schema["definitions"]["family"]["properties"]["unmeasured_gates"]
    assert re.fullmatch(unmeasured["propertyNames"]["pattern"], "*@cuda")
    assert not re.fullmatch(unmeasured["propertyNames"]["pattern"], "*@cdua")


#: A rule scaling the f32 bounds of two entries of SECTION by the case's mel frames.
LENGTH_RULE = {"frames_of": "mel_features",
               "entries": {"layer_*": {"measured_at": 2, "nmse_max": 2},
                           "mel_features": {"measured_at": 2, "nmse_max": 1}}}


def test_length_scaling_multiplies_the_named_default_bounds_by_the_length_ratio():
    section = {**SECTION, "gates": {**SECTION["gates"], "default": [
        *SECTION["gates"]["default"], {"stage": "enc_out", "nmse_max": 1e-9}]}}
    section["gates"]["default"][0] = {"stage": "mel_features", "nmse_max": 1e-10}
    gates = json.loads(json.dumps(resolve_gates({**section, "length_scaling": LENGTH_RULE},
                                                CELL._replace(weight_type="f16"))))
    scaled = for_length(gates, {"mel_features": 8})  # 4x the measured length
    by_origin = {(e["from"], e["stage"]): e for e in scaled["gates"]}
    assert by_origin["default", "layer_*"]["nmse_max"] == pytest.approx(1e-8 * 16)
    assert by_origin["default", "mel_features"]["nmse_max"] == pytest.approx(1e-10 * 4)
    assert by_origin["default", "layer_*"]["cosine_min"] == 0.99999  # not named: as written
    assert by_origin["default", "enc_out"]["nmse_max"] == 1e-9  # not in the rule
    assert "nmse_max" not in by_origin["f16", "layer_*"]  # a weight type's own list: as written
    assert gate_for("layer_3", scaled)["from"] == "f16"
    assert by_origin["default", "layer_*_isolated"]["nmse_max"] == 1e-10  # not named
    verdict = status("mel_features", scaled, metrics={"nmse": 3e-10})
    assert verdict.status == "pass" and verdict.gate.endswith("(scaled to 8 frames)")
    assert status("mel_features", gates, metrics={"nmse": 3e-10}).status == "fail"
    # at or below the measured length, and without a length, the bounds are as written
    assert for_length(gates, {"mel_features": 2})["gates"] == gates["gates"]
    assert for_length(gates, None)["gates"] == gates["gates"]


def test_an_entry_s_own_frames_of_scales_it_by_that_stage_s_length():
    """A position table's noise grows with its own rows, which the subsampling sets, not with
    the mel's frames: an entry naming its own stage scales by that stage alone."""
    rule = {**LENGTH_RULE, "entries": {
        **LENGTH_RULE["entries"],
        "layer_*": {"frames_of": "layer_0", "measured_at": 2, "nmse_max": 2}}}
    gates = json.loads(json.dumps(resolve_gates({**SECTION, "length_scaling": rule}, CELL)))
    scaled = for_length(gates, {"mel_features": 2, "layer_0": 8})
    assert gate_for("layer_0", scaled)["nmse_max"] == pytest.approx(1e-8 * 16)
    assert "length" not in gate_for("mel_features", scaled)  # the mel at its measured length
    assert gate_for("layer_0", for_length(gates, {"mel_features": 8}))["nmse_max"] == 1e-8
    with pytest.raises(AudioparityError, match="frames_of must name a stage"):
        resolve_gates({**SECTION, "length_scaling": {**rule, "entries": {
            "layer_*": {"frames_of": "", "measured_at": 2, "nmse_max": 2}}}}, CELL)


def test_a_scaled_bound_is_rounded_up_never_down():
    gates = json.loads(json.dumps(resolve_gates({**SECTION, "length_scaling": {
        **LENGTH_RULE, "entries": {"layer_*": {"measured_at": 3, "nmse_max": 2}}}}, CELL)))
    scaled = gate_for("layer_0", for_length(gates, {"mel_features": 7}))["nmse_max"]
    assert scaled >= 1e-8 * (7 / 3) ** 2 and scaled == pytest.approx(5.5e-8)


@pytest.mark.parametrize(("rule", "message"), [
    ({**LENGTH_RULE, "entries": {"enc_*": {"measured_at": 2, "nmse_max": 1}}},
     "names no entry of the default list"),
    ({**LENGTH_RULE, "entries": {"layer_*": {"measured_at": 2, "cosine_min": 1}}},
     "expected measured_at, optionally frames_of, and exponents of"),
    ({**LENGTH_RULE, "entries": {"layer_*": {"measured_at": 2, "nmse_max": -1}}},
     "an exponent from 0 to 4"),
    ({**LENGTH_RULE, "entries": {"layer_*": {"measured_at": 0, "nmse_max": 1}}},
     "measured_at must be a length"),
    ({**LENGTH_RULE, "entries": {"layer_*": {"nmse_max": 1, "max_abs_max": 1}}},
     "measured_at must be a length"),
    ({"frames_of": "mel_features"}, "expected frames_of and entries"),
])
def test_a_malformed_length_rule_is_named(rule, message):
    with pytest.raises(AudioparityError, match=message):
        resolve_gates({**SECTION, "length_scaling": rule}, CELL)


def test_compare_cell_reads_the_length_from_the_reference(tmp_path: Path):
    """The reference's mel_features has 8 frames, 4x the rule's 2: layer_0 off by an NMSE
    between its bound and 16x it passes, and its gate says it was scaled."""
    layer, _ = REFERENCE["layer_0"]
    noise = RNG.normal(size=layer.shape).astype(np.float32)
    noise *= np.sqrt(4e-8 * np.sum(layer.astype(np.float64) ** 2) / np.sum(noise ** 2.0))
    reference = write_dump(tmp_path / "ref", tmp_path, {
        "mel_features": REFERENCE["mel_features"], "layer_0": REFERENCE["layer_0"]}, {})
    candidate = write_dump(tmp_path / "cand", tmp_path, {
        "mel_features": REFERENCE["mel_features"], "layer_0": (layer + noise, "[T, D]")}, {})
    rows = {}
    for name, section in (("plain", SECTION), ("scaled", {**SECTION,
                                                          "length_scaling": LENGTH_RULE})):
        output = tmp_path / f"{name}.json"
        compare_cell(CellDumps(reference, candidate), resolve_gates(section, CELL), LABELS,
                     output)
        rows[name] = {r["stage"]: r for r in json.loads(output.read_text())}["layer_0"]
    assert 1e-8 < rows["plain"]["nmse"] < 16e-8
    assert rows["plain"]["status"] == "fail" and rows["scaled"]["status"] == "pass"
    assert rows["scaled"]["gate"].endswith("nmse<=1.6e-07 (scaled to 8 frames)")


#: The reference's noise floor on a band-limited case: layer_0 run again on the exact mel.
FLOOR = {"from": "mel_features", "mel_nmse": 1e-6, "moved": ["decode"],
         "stages": {"layer_0": {"nmse": 1e-5, "max_rel": 1e-3, "cosine": 1 - 5e-6}}}
#: The mel's gate, judged on its spread measures where the reference has near-constant bins.
SPREAD_MEL = {"stage": "mel_features", "cosine_min": 0.99999, "nmse_max": 1e-10,
              "spread_nmse_max": 1e-10, "spread_max_rel_max": 1e-4}
CARRYING = {**SECTION, "gates": {**SECTION["gates"], "default": [
    SPREAD_MEL, *SECTION["gates"]["default"][1:]]},
    "carried_noise": {"from": "mel_features", "gain": 10}}


def test_carried_noise_raises_a_floored_stage_s_bounds_to_the_gain_times_its_floor():
    gates = json.loads(json.dumps(resolve_gates(CARRYING, CELL)))
    near = {"near_constant": 3}
    floor = noise_floor(gates, {"noise_floor": FLOOR}, "mel_features", "pass", near)
    assert floor == FLOOR
    layer = gate_for("layer_0", carry_noise(gates, "layer_0", floor))
    assert layer["nmse_max"] == pytest.approx(1e-4)
    assert layer["cosine_min"] == pytest.approx(1 - 5e-5)
    assert "max_rel_max" not in layer  # a bound the entry does not set is not added
    assert status("layer_0", carry_noise(gates, "layer_0", floor),
                  metrics={"nmse": 5e-5, "cosine": 1 - 2.5e-5}).gate.endswith(
        "(carries mel_features' noise: the reference's own, x10)")
    # stages the floor does not name keep their bounds: an isolated form, another layer
    for stage in ("layer_0_isolated", "layer_1"):
        assert carry_noise(gates, stage, floor) == gates
    # never tightened: a floor under the bound leaves it as written
    small = {**FLOOR, "stages": {"layer_0": {"nmse": 1e-12, "max_rel": 0, "cosine": 1.0}}}
    assert gate_for("layer_0", carry_noise(gates, "layer_0", small)) == gate_for("layer_0",
                                                                                 gates)
    # a mel that fails, whose features all vary, or another stage: no floor
    for stage, verdict, metrics in (("mel_features", "fail", near),
                                    ("mel_features", "pass", {"near_constant": 0}),
                                    ("layer_0", "pass", near), ("mel_features", "pass", None)):
        assert noise_floor(gates, {"noise_floor": FLOOR}, stage, verdict, metrics) is None
    # a reference without a floor, gates without the rule
    assert noise_floor(gates, {}, "mel_features", "pass", near) is None
    plain = json.loads(json.dumps(resolve_gates({**CARRYING, "carried_noise": None}, CELL)))
    assert noise_floor(plain, {"noise_floor": FLOOR}, "mel_features", "pass", near) is None


@pytest.mark.parametrize(("rule", "message"), [
    ({"from": "mel_features", "gain": 0.5}, "a gain from 1 to 100"),
    ({"from": "mel_features", "gain": 1000}, "a gain from 1 to 100"),
    ({"from": "", "gain": 10}, "from must name a stage"),
    ({"from": "mel_features"}, "expected from and gain"),
])
def test_a_malformed_carried_rule_is_named(rule, message):
    with pytest.raises(AudioparityError, match=message):
        resolve_gates({**CARRYING, "carried_noise": rule}, CELL)


def _normalised(frames: np.ndarray) -> np.ndarray:
    """Each column of ``frames`` to mean 0 and unbiased std 1, as per-feature normalisation."""
    centred = frames - frames.mean(axis=0)
    return (centred / centred.std(axis=0, ddof=1)).astype(np.float32)


def _off_by(array: np.ndarray, nmse: float) -> np.ndarray:
    """``array`` plus random noise of that NMSE."""
    noise = RNG.normal(size=array.shape)
    noise *= np.sqrt(nmse * np.sum(array.astype(np.float64) ** 2) / np.sum(noise ** 2))
    return (array + noise).astype(np.float32)


def test_compare_cell_judges_the_end_to_end_layers_against_the_reference_s_floor(
        tmp_path: Path):
    """A mel whose first bin is near-constant (its normalised std 0.5: a raw spread of 1e-5),
    off by amplified float32 noise there, passes on its spread measures; layer_0 off by 5x the
    reference's floor then passes under the floor (against 1e-8 fails without it), and
    layer_0_isolated off as much still fails: its bounds are its own. A mel that fails its
    spread measures carries nothing."""
    mel = _normalised(RNG.normal(size=(16, 4)))
    mel[:, 0] *= 0.5
    noisy = mel.copy()
    noisy[:, 0] += RNG.normal(size=16).astype(np.float32) * 2e-4
    layer = REFERENCE["layer_0"][0]
    off = _off_by(layer, 5 * FLOOR["stages"]["layer_0"]["nmse"])
    reference = write_dump(tmp_path / "ref", tmp_path, {"mel_features": (mel, "[T, n_mels]"),
                                                        "layer_0": (layer, "[T, D]")}, {},
                           noise_floor=FLOOR)
    rows = {}
    for name, mel_candidate, section in (
            ("plain", noisy, {**CARRYING, "carried_noise": None}),
            ("carried", noisy, CARRYING),
            ("bad mel", _off_by(mel, 1e-6), CARRYING)):
        candidate = write_dump(tmp_path / f"cand {name}", tmp_path, {
            "mel_features": (mel_candidate, "[T, n_mels]"), "layer_0": (off, "[T, D]"),
            "layer_0_isolated": (off, "[T, D]")}, {})
        output = tmp_path / f"{name}.json"
        compare_cell(CellDumps(reference, candidate), resolve_gates(section, CELL), LABELS,
                     output)
        rows[name] = {r["stage"]: r for r in json.loads(output.read_text())}
        assert rows[name]["layer_0_isolated"]["status"] == "fail"
    for name in ("plain", "carried"):
        assert rows[name]["mel_features"]["status"] == "pass", rows[name]["mel_features"]
        assert rows[name]["mel_features"]["nmse"] > 1e-10  # its plain bound, not read
    assert rows["plain"]["layer_0"]["status"] == "fail"
    assert rows["carried"]["layer_0"]["status"] == "pass", rows["carried"]["layer_0"]
    assert "the reference's own" in rows["carried"]["layer_0"]["gate"]
    assert rows["bad mel"]["mel_features"]["status"] == "fail"
    assert rows["bad mel"]["layer_0"]["status"] == "fail"


def test_the_schema_takes_the_carried_rule_as_scaling_reads_it():
    schema = yaml.safe_load((REPO / "config/schema.yaml").read_text())
    rule = schema["definitions"]["family"]["properties"]["carried_noise"]
    assert set(rule["properties"]) == {"from", "gain"}
    assert rule["properties"]["gain"]["maximum"] == GAIN_LIMIT
