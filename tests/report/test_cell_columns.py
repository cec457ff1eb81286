"""The columns a cell gives the report's weight types: the cost of a logits stage (KL) and of a
decode (WER) against the float32 reference, and the storage the candidate's manifest states."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.plan import CellDumps
from audioparity.dumping.artifacts import DumpWriter
from audioparity.report.summary import write_summary
from tests.report.test_report import read_csv

GATES = {"gates": [{"stage": "ctc_logits", "nmse_max": 1.0, "from": "default"},
                   {"stage": "decode", "exact": True, "from": "default"}],
         "expected_failures": []}
LABELS = {"family": "parakeet_tdt", "model": "tiny", "case": "clip", "candidate": "audioparity",
          "backend": "cpu", "weight_type": "q4_K"}
STORAGE = {"bits_per_weight": 4.5, "types": {"q4_K": 6, "q5_0": 1, "f32": 1},
           "fallbacks": ["joint.pred [64, 640]: q4_K -> q5_0", "norm [64]: q4_K -> f32"]}


def dump(path: Path, logits: list[float], ids: list[int], text: str, **fields) -> Path:
    """A dump of Parakeet's CTC logits (one row) and a decode, with manifest ``fields``."""
    model, audio = path.parent / "model.bin", path.parent / "clip.wav"
    model.write_bytes(b"m")
    audio.write_bytes(b"a")
    with DumpWriter(path, producer="test", model=model, inputs={"audio": audio},
                    fields=fields) as writer:
        writer.add_tensor("ctc_logits", np.array([logits], np.float32), "[T, V+1]")
        writer.add_json("decode", {"ids": ids, "frames": list(range(len(ids))),
                                   "durations": [1] * len(ids), "text": text})
    return path


def test_a_quantized_cell_costs_its_logits_in_kl_and_its_decode_in_wer(tmp_path: Path):
    """Against the float32 reference: p = softmax(0, 0) = (1/2, 1/2), q = softmax(ln 3, 0) =
    (3/4, 1/4), KL(p ‖ q) = ½ ln(2/3) + ½ ln 2 = ½ ln(4/3); "a x c" against "a b c" is one
    substitution in three words. Against its own (emulated) reference the cell is exact."""
    f32 = dump(tmp_path / "f32", [0.0, 0.0], [1, 2, 3], "a b c")
    emulated = dump(tmp_path / "emulated", [math.log(3.0), 0.0], [1, 4, 3], "a x c")
    candidate = dump(tmp_path / "cand", [math.log(3.0), 0.0], [1, 4, 3], "a x c",
                     storage=STORAGE)
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(emulated, candidate, cost=f32), GATES, LABELS, output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    logits, decode = rows["ctc_logits"], rows["decode"]
    assert logits["kl"] == pytest.approx(0.0, abs=1e-12) and decode["wer"] == 0.0
    assert logits["cost_kl"] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    assert decode["cost_wer"] == pytest.approx(1 / 3) and decode["cost_kl"] is None
    assert logits["cost_wer"] is None
    for row in rows.values():
        assert row["bits_per_weight"] == 4.5 and row["fallbacks"] == 2
        assert row["fallback_tensors"] == ("joint.pred [64, 640]: q4_K -> q5_0; "
                                           "norm [64]: q4_K -> f32")

    write_summary([output], tmp_path / "summary.csv")
    (first, _) = read_csv(tmp_path / "summary.csv")
    assert (first["bits_per_weight"], first["fallbacks"]) == ("4.5", "2")


def test_a_dump_without_storage_leaves_its_columns_empty(tmp_path: Path):
    """An older dump (no manifest ``storage``), and a cell with no candidate dump at all."""
    reference = dump(tmp_path / "ref", [0.0, 0.0], [1, 2, 3], "a b c")
    older = dump(tmp_path / "older", [0.0, 0.0], [1, 2, 3], "a b c")
    for candidate in (older, tmp_path / "absent"):
        output = tmp_path / f"{candidate.name}.json"
        compare_cell(CellDumps(reference, candidate), GATES, {**LABELS, "weight_type": "f32"},
                     output)
        rows = json.loads(output.read_text())
        assert rows and all(row[c] is None for row in rows
                            for c in ("bits_per_weight", "fallbacks", "fallback_tensors",
                                      "cost_kl", "cost_wer"))


def test_each_stage_names_the_other_references_it_is_measurably_closer_to(tmp_path: Path):
    """The candidate decodes "a x c" as the older reference does, not as the primary; its
    logits are 1e-3 from the primary and 1e-4 from "newer" (NMSE 100x smaller: closer), 1e-3
    from "older" too (not closer). Each row names the references it is closer to, passing or
    not; a reference that parts from the primary with another frame count cannot be measured
    against, and is never named."""
    primary = dump(tmp_path / "primary", [0.0, 1.0], [1, 2, 3], "a b c")
    older = dump(tmp_path / "older", [0.0, 1.0], [1, 4, 3], "a x c")
    newer = dump(tmp_path / "newer", [0.0, 1.0 + 9e-4], [1, 5, 3], "a y c")
    candidate = dump(tmp_path / "cand", [0.0, 1.0 + 1e-3], [1, 4, 3], "a x c")
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(primary, candidate, others={"older": older, "newer": newer}), GATES,
                 {**LABELS, "weight_type": "f32"}, output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    assert rows["decode"]["status"] == "fail" and rows["decode"]["closer_to"] == "older"
    assert rows["ctc_logits"]["status"] == "pass" and rows["ctc_logits"]["closer_to"] == "newer"
    with DumpWriter(tmp_path / "frames", producer="test", model=tmp_path / "model.bin",
                    inputs={"audio": tmp_path / "clip.wav"}) as writer:
        writer.add_tensor("ctc_logits", np.array([[0.0, 1.001]] * 2, np.float32), "[T, V+1]")
    compare_cell(CellDumps(primary, candidate, others={"frames": tmp_path / "frames"}), GATES,
                 {**LABELS, "weight_type": "f32"}, output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    assert rows["ctc_logits"]["closer_to"] is None
