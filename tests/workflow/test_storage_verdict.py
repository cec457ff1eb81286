"""A third-party port's quantized cells judged in three parts, through the workflow, with faults
planted in real ports (tests/standins/planted/): transcribe.cpp on the trained Parakeet, its
source patched so that layer 1 is wrong when its weights are q4_K; its quantizer made to write
F16 when asked for q4_K; one byte of one block of its q8_0 file changed. Each fault is named in
its own part: the arithmetic (that block's replayed form alone), the storage, the quantizer."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from audioparity.candidates import load_adapter
from audioparity.candidates.ports import build_ports
from audioparity.compare.cell import compare_cell
from audioparity.compare.gate_lists import resolve_gates
from audioparity.compare.plan import CellDumps, CellKey
from audioparity.report.culprit import check
from tests.workflow.workdir import make_workdir, run_to_completion

REPO = Path(__file__).resolve().parents[2]
PORTS = REPO / ".ports"
SOURCE = Path(os.environ.get("PORTS_SOURCE", REPO.parent / "shared/ports"))
PLANTED = REPO / "tests/standins/planted"
ESPEAK = REPO / "resources/models/parakeet-tdt-espeak/model.nemo"


def planted_port() -> Path:
    """transcribe.cpp built with the layer-1 fault (cached beside the other ports)."""
    if not (PORTS / "transcribe_cpp").is_dir() or not SOURCE.is_dir():
        message = f"{PORTS} has no built ports or {SOURCE} no snapshots: run `make ports`"
        if os.environ.get("AUDIOPARITY_REQUIRE_PORTS"):
            pytest.fail(message)
        pytest.skip(message)
    adapter = load_adapter(str(PLANTED / "transcribe_cpp_layer_1_q4_K.py"))
    return build_ports(SOURCE, PORTS.resolve(), adapters=[adapter])[adapter.name]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    root = str(planted_port())
    plain = str(PORTS / "transcribe_cpp")
    section = {
        "models": [{"name": "espeak", "path": str(ESPEAK)}],
        "cases": [{"name": "clip", "path": str(REPO / "resources/speech/clip.wav")}],
        "weight_types": ["q8_0", "q4_K", "q4_K_M"], "recipes": {},
        "references": [{"name": "nemo", "implementation": "nemo"}],
        "candidates": [
            {"name": "layer-1-at-q4_K",
             "adapter": str(PLANTED / "transcribe_cpp_layer_1_q4_K.py"),
             "options": {"root": root}, "weight_types": ["q8_0", "q4_K_M"]},
            {"name": "silent-f16", "adapter": str(PLANTED / "transcribe_cpp_silent_f16.py"),
             "options": {"root": plain}, "weight_types": ["q4_K"], "replay": False},
            {"name": "changed-byte", "adapter": str(PLANTED / "transcribe_cpp_changed_byte.py"),
             "options": {"root": plain}, "weight_types": ["q8_0"], "replay": False}],
    }
    workdir = make_workdir(tmp_path_factory.mktemp("storage") / "run",
                           {"families": ["parakeet_tdt"], "parakeet_tdt": section})
    run_to_completion(workdir)
    summary = pd.read_csv(workdir / "results/report/summary.csv", dtype=str,
                          keep_default_na=False)
    return workdir, summary[summary.against == "reference"]


def cell(summary: pd.DataFrame, candidate: str, weight_type: str) -> dict[str, pd.Series]:
    rows = summary[(summary.candidate == candidate) & (summary.weight_type == weight_type)]
    return {row.stage: row for row in rows.itertuples()}


def test_a_fault_at_q4_k_in_one_block_fails_that_block_alone(sweep):
    """At q8_0 the planted port is transcribe.cpp itself: every block replayed passes against
    the storage-matched reference, its quantizer's bytes are ggml's, and its 1x1 convolutions
    kept f16 are named in the storage verdict. At q4_K_M its layer 1 alone fails replayed, the
    culprit its own error."""
    _, summary = sweep
    q8_0, q4_k_m = (cell(summary, "layer-1-at-q4_K", t) for t in ("q8_0", "q4_K_M"))
    for rows in (q8_0, q4_k_m):
        assert rows["layer_0_replayed"].status == "pass", rows["layer_0_replayed"].reason
        assert rows["stored_weights"].status == "pass", rows["stored_weights"].reason
        assert rows["storage"].status == "fail"
        assert "unquantized where" in rows["storage"].reason
        assert "4 f16 (encoder.layers.0.conv.pointwise_conv1.weight" in rows["storage"].reason
    assert q8_0["layer_1_replayed"].status == "pass", q8_0["layer_1_replayed"].reason
    assert q4_k_m["layer_1_replayed"].status == "fail"
    assert float(q4_k_m["layer_1_replayed"].nmse) > 1e-7
    assert "layer_1_replayed (fail, its own error)" in q4_k_m["layer_1"].culprit
    assert "asked q4_K (a mix)" in q4_k_m["storage"].reason


def test_the_storage_matched_reference_is_what_judges_the_ports_arithmetic(sweep):
    """The same q8_0 cell against the quantization-aware reference of our storage policy (the
    reference the port was judged by before): its blocks fail there, for its 1x1 convolutions
    stored f16, while the storage-matched reference passes them."""
    workdir, summary = sweep
    section = yaml.safe_load((REPO / "config/config.yaml").read_text())["parakeet_tdt"]
    gates = resolve_gates({"gates": section["gates"]},
                          CellKey("parakeet_tdt", "espeak", "layer-1-at-q4_K", "cpu", "q8_0", ""))
    output = workdir / "ours.json"
    results = workdir / "results"
    compare_cell(CellDumps(results / "reference/parakeet_tdt/espeak/clip@q8_0",
                           results / "ggml/parakeet_tdt/espeak/layer-1-at-q4_K/cpu/q8_0/clip",
                           replay=results / "replay/parakeet_tdt/espeak/layer-1-at-q4_K/cpu/"
                                            "q8_0/clip"),
                 gates, {"family": "parakeet_tdt", "weight_type": "q8_0"}, output)
    before = {row["stage"]: row for row in json.loads(output.read_text())}
    after = cell(summary, "layer-1-at-q4_K", "q8_0")
    assert before["stored_weights"]["status"] == "fail"
    assert before["pre_encode"]["status"] == "fail" and after["pre_encode"].status == "pass"


def test_a_quantizer_that_keeps_f16_is_named_in_the_storage_verdict(sweep):
    """Asked q4_K, it wrote F16: the storage part fails saying so, weight by weight; its bytes
    are ggml's f16 and its arithmetic on them passes."""
    workdir, summary = sweep
    rows = cell(summary, "silent-f16", "q4_K")
    assert rows["storage"].status == "fail"
    assert rows["storage"].reason.startswith("asked q4_K: 0 of 33 matmul weights as asked; ")
    assert "unquantized where q4_K fits: 24 f16 (" in rows["storage"].reason
    assert rows["stored_weights"].status == "pass"
    for stage in ("layer_0", "layer_1", "enc_out", "decode"):
        assert rows[stage].status == "pass", (stage, rows[stage].reason)
    assert float(rows["storage"].bits_per_weight) > 16  # its cost: f16 throughout, norms f32
    code, lines = check(pd.read_csv(workdir / "results/report/summary.csv", dtype=str,
                                    keep_default_na=False).to_dict("records"))
    assert code == 1
    assert any(line.startswith("parakeet_tdt/espeak/clip/silent-f16/cpu/q4_K: storage (fail")
               for line in lines), lines


def test_one_changed_byte_fails_stored_weights_naming_the_tensor_and_block(sweep):
    """One byte of block 7 of layer 1's first feed-forward weight changed: stored_weights names
    that weight and block; the reference computes with the port's bytes, so its stages are
    judged on their arithmetic alone and pass."""
    _, summary = sweep
    rows = cell(summary, "changed-byte", "q8_0")
    assert rows["stored_weights"].status == "fail"
    assert rows["stored_weights"].reason.startswith(
        "stored weight encoder.layers.1.feed_forward1.linear1.weight: block 7 of ")
    assert "(q8_0, 32 values each) differs from ggml's quantization of the checkpoint" in \
        rows["stored_weights"].reason
    for stage in ("layer_0", "layer_1", "enc_out", "decode"):
        assert rows[stage].status == "pass", (stage, rows[stage].reason)
