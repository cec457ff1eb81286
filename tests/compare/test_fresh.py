"""A case run again against its fresh run (audioparity.compare.fresh, audioparity.compare.reuse):
identical or it fails, a NaN equal to a NaN at the same place, a stated bound with its reason,
and a run that died recorded as such."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from audioparity.compare.fresh import array_difference, fresh_rows
from audioparity.compare.reuse import reuse_order
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import DumpWriter

LABELS = {"family": "moss_voicegen", "model": "tiny", "case": "en", "candidate": "audioparity",
          "backend": "cpu", "weight_type": "f32"}
HIDDEN = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)


def dump(path: Path, hidden: np.ndarray, rows: list | None = None) -> Path:
    source = path.parent / "prompt.json"
    source.write_text("{}")
    with DumpWriter(path, producer="test", model=source, inputs={"prompt": source},
                    fields={"family": "moss_voicegen"}) as writer:
        writer.add_tensor("probe_hidden", hidden, "[3, H]")
        writer.add_json("prompt", {"text": "a", "rows": rows or [[1, 2]]})
    return path


def test_the_order_runs_each_case_once_after_another_or_after_itself():
    assert reuse_order(["a", "b"]) == ["b", "a", "b"]
    assert reuse_order(["a", "b", "c"]) == ["c", "b", "a", "c"]
    assert reuse_order(["a"]) == ["a", "a"]
    with pytest.raises(AudioparityError, match="no case"):
        reuse_order([])


def test_identical_passes_and_one_ulp_off_fails():
    assert array_difference(HIDDEN.copy(), HIDDEN)[1] == ""
    off = HIDDEN.copy()
    off[1, 2] = np.nextafter(off[1, 2], np.float32(2))
    metrics, why = array_difference(off, HIDDEN)
    assert why.startswith("max_abs") and metrics["argmax"] == "1,2"
    assert 0 < metrics["max_abs"] < 1e-6
    assert array_difference(off, HIDDEN, bound=1e-6)[1] == ""


def test_a_nan_where_the_fresh_run_has_one_is_identical_and_elsewhere_fails():
    fresh = HIDDEN.copy()
    fresh[0, 1] = np.nan
    assert array_difference(fresh.copy(), fresh) == (
        {"max_abs": 0.0, "non_finite": 0, "argmax": None}, "")
    number = HIDDEN.copy()
    metrics, why = array_difference(number, fresh, bound=1.0)  # no bound excuses a NaN
    assert metrics["non_finite"] == 1 and "NaN" in why and "[0,1]" in why
    metrics, why = array_difference(fresh, number, bound=1.0)
    assert metrics["non_finite"] == 1 and why


def test_another_shape_or_dtype_fails():
    assert "shape" in array_difference(HIDDEN[:2], HIDDEN)[1]
    assert "float64" in array_difference(HIDDEN.astype(np.float64), HIDDEN)[1]


def test_rows_against_the_fresh_run(tmp_path):
    fresh = dump(tmp_path / "fresh", HIDDEN)
    same = fresh_rows(fresh, dump(tmp_path / "same", HIDDEN.copy()), LABELS)
    assert {(r["stage"], r["status"], r["against"], r["gate"]) for r in same} == {
        ("probe_hidden", "pass", "fresh", "identical"), ("prompt", "pass", "fresh", "identical")}
    rows = {r["stage"]: r for r in fresh_rows(fresh, dump(tmp_path / "leak", HIDDEN + 0.5,
                                                           [[1, 3]]), LABELS)}
    assert rows["probe_hidden"]["status"] == "fail"
    assert rows["probe_hidden"]["max_abs"] == pytest.approx(0.5, abs=1e-6)
    assert rows["prompt"]["status"] == "fail" and "rows" in rows["prompt"]["reason"]
    bounded = fresh_rows(fresh, tmp_path / "leak", LABELS,
                         [{"stage": "*hidden", "max_abs": 0.6, "reason": "a test"}])
    assert bounded[0]["status"] == "pass" and bounded[0]["gate"] == "max_abs<=0.6 (a test)"


def test_a_run_that_died_is_crashed_where_it_died_and_never_run_is_missing(tmp_path):
    fresh = dump(tmp_path / "fresh", HIDDEN)
    partial = dump(tmp_path / "partial", HIDDEN.copy())
    manifest = json.loads((partial / "manifest.json").read_text())
    del manifest["documents"]
    (partial / "manifest.json").write_text(json.dumps({**manifest, "running": "prompt"}))
    partial.rename(tmp_path / "died.partial")
    rows = fresh_rows(fresh, tmp_path / "died", LABELS, died="signal SIGABRT (6): abort")
    assert [(r["stage"], r["status"]) for r in rows] == [("probe_hidden", "pass"),
                                                          ("prompt", "crashed")]
    assert "SIGABRT" in rows[1]["reason"]
    never = fresh_rows(fresh, tmp_path / "never", LABELS, died="signal SIGSEGV (11): x")
    assert {r["status"] for r in never} == {"missing"}


@pytest.mark.parametrize("running", ["prompt", None])
def test_a_run_that_died_is_crashed_in_the_stage_it_was_computing(tmp_path, running):
    """A run again that died before writing a stage: the stage its manifest names as running
    is crashed, whatever the order of the fresh dump's stages (tensors first); one that names
    none is charged to the first stage it lacks in pipeline order, prompt too."""
    fresh = dump(tmp_path / "fresh", HIDDEN)
    partial = dump(tmp_path / "partial", HIDDEN.copy())
    manifest = json.loads((partial / "manifest.json").read_text())
    manifest.update(tensors={}, documents={}, running=running)
    (partial / "manifest.json").write_text(json.dumps(manifest))
    partial.rename(tmp_path / "died.partial")
    rows = fresh_rows(fresh, tmp_path / "died", LABELS, died="exit code 1: RuntimeError: boom")
    assert [(r["stage"], r["status"]) for r in rows] == [("probe_hidden", "missing"),
                                                          ("prompt", "crashed")]
    assert rows[1]["reason"] == "the run again died here: exit code 1: RuntimeError: boom"
    assert rows[0]["reason"] == ("not computed: the run again died in prompt (exit code 1: "
                                 "RuntimeError: boom)")
