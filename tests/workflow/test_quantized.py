"""The default sweep's quantized types beyond q8_0, end to end on the CPU: the trained Parakeet at
q4_0 and at its precision recipe (rule precision, then every job of the recipe's type), MOSS at
q4_K, Whisper at q5_1 (the q8_1 input path). Every stage passes its gates against its
quantization-aware reference, every weight our port stored is the reference's, and the recipe
buys back the decode that q4_0 alone changes, for fewer bits than q8_0."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests import REPO
from tests.workflow import workdir as wd

pytestmark = pytest.mark.slow


def test_the_default_quantized_types_end_to_end(tmp_path):
    default = yaml.safe_load((REPO / "config/config.yaml").read_text())
    sweep = {
        "parakeet_tdt": {"weight_types": ["f32", "q8_0", "q4_0", "q4_0+recipe"]},
        "moss_voicegen": {"weight_types": ["f32", "q4_K"],
                          "cases": default["moss_voicegen"]["cases"][:1]},
        "whisper": {"weight_types": ["f32", "q5_1"]},
    }
    assert {t for s in sweep.values() for t in s["weight_types"]} - {"f32", "q8_0"} <= {
        t for name in sweep for t in default[name]["weight_types"]}, "the default sweep's types"
    workdir = wd.make_workdir(tmp_path / "run", sweep)
    (workdir / "resources").symlink_to(REPO / "resources")
    wd.run_to_completion(workdir)
    rows = pd.read_csv(workdir / "results/report/summary.csv", dtype=str, keep_default_na=False)
    failing = rows[~rows["status"].isin(["pass", "xfail"])]
    assert failing.empty, failing[["family", "weight_type", "case", "stage", "reason"]]
    # the default config's other references ran beside: transformers' Parakeet and MOSS's
    # transformers path agree with the primaries to float32 noise; NeMo 2.4.1 parts as declared
    others = rows[rows["backend"] == "torch"]
    assert set(zip(others["family"], others["candidate"], strict=True)) == {
        ("parakeet_tdt", "transformers"), ("parakeet_tdt", "nemo-2.4.1"),
        ("moss_voicegen", "transformers")}
    assert set(others[others["candidate"] == "transformers"]["status"]) == {"pass"}
    assert "xfail" in set(others[others["candidate"] == "nemo-2.4.1"]["status"])
    quantized = rows[rows["weight_type"].isin(["q8_0", "q4_0", "q4_0+recipe", "q4_K", "q5_1"])]
    stored = quantized[quantized["stage"] == "stored_weights"]
    assert set(stored["family"]) == {"parakeet_tdt", "moss_voicegen", "whisper"}
    assert (stored["status"] == "pass").all()
    assert (quantized["bits_per_weight"] != "").all()

    recipe = json.loads((workdir / "results/precision/parakeet_tdt/espeak/q4_0+recipe.json")
                        .read_text())
    assert recipe["search"]["met"] and recipe["overrides"] and "verified" not in recipe
    # every cell of the recipe's type verifies it on its own dump, against float32
    verified = rows[(rows["weight_type"] == "q4_0+recipe") & (rows["stage"] == "recipe")]
    assert set(verified["case"]) == {"clip", "heldout"}
    assert set(verified["status"]) == {"pass"}, verified["reason"]
    decode = rows[(rows["family"] == "parakeet_tdt") & (rows["stage"] == "decode")
                  & (rows["against"] == "reference")]
    cost = {(r.weight_type, r.case): float(r.cost_wer) for r in decode.itertuples()
            if r.cost_wer != ""}
    assert cost[("q4_0", "clip")] > 0, "q4_0 alone changes clip's words"
    assert cost[("q4_0+recipe", "clip")] == cost[("q4_0+recipe", "heldout")] == 0
    bits = {r.weight_type: float(r.bits_per_weight) for r in decode.itertuples()}
    assert bits["q4_0"] < bits["q4_0+recipe"] < bits["q8_0"]

    # a port edit reruns the port's dumps and the compares, never the recipe's search nor a
    # reference dump (the search runs no port; the references read the recipe it wrote)
    before = wd.planned_jobs(workdir)
    assert before == {}, before
    with wd.edited(workdir / "src/audioparity/models/parakeet_tdt/decoder.py"):
        after = wd.planned_jobs(workdir)
    assert after.get("ggml_dump") and after.get("compare_cell"), after
    assert not {"precision", "reference_dump", "reference_other", "reference_replay",
                "reference_storage"} & set(after), after
