"""config/examples/band-limited.yaml as CI runs it: the clip through 8 kHz into the trained 16 kHz
model, at f32 and q8_0. NeMo's reference records its own float32 noise on the case (its
noise_floor); the end-to-end stages are held to ten times it, the isolated forms to their own
bounds, and the transcript is NeMo's."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import yaml

from tests import REPO
from tests.workflow import workdir as wd

pytestmark = pytest.mark.slow

END_TO_END = ("pre_encode", "layer_0", "layer_1", "enc_out", "decode_logits")


def test_band_limited_speech_passes_against_the_reference_s_own_noise(tmp_path):
    sweep = yaml.safe_load((REPO / "config/examples/band-limited.yaml").read_text())
    section = sweep["parakeet_tdt"]
    for entry in (*section["models"], *section["cases"]):
        entry["path"] = str(REPO / entry["path"])
    workdir = wd.make_workdir(tmp_path / "run", sweep)
    wd.run_to_completion(workdir)
    rows = pd.read_csv(workdir / "results/report/summary.csv", dtype=str,
                       keep_default_na=False)
    judged = rows[rows["against"] == "reference"]
    assert set(judged["status"]) == {"pass"}, judged[judged["status"] != "pass"][
        ["weight_type", "stage", "status", "reason"]]
    f32 = judged[judged["weight_type"] == "f32"].set_index("stage")
    # the mel on its spread measures, its plain NMSE far beyond the plain bound (1e-10)
    assert "near-constant features (28 of 128 bins" in f32.loc["mel_features", "reason"]
    assert float(f32.loc["mel_features", "nmse"]) > 1e-5
    # each end-to-end stage within 10x the reference's own floor, and over its plain bound
    manifest = json.loads((workdir / "results/reference/parakeet_tdt/espeak/clip-8k/"
                           "manifest.json").read_text())
    floor = manifest["noise_floor"]
    assert floor["from"] == "mel_features" and floor["moved"] == []
    for stage in END_TO_END:
        nmse = float(f32.loc[stage, "nmse"])
        assert nmse < 10 * floor["stages"][stage]["nmse"] and nmse > 1e-6, stage
        assert f32.loc[stage, "gate"].endswith("(carries mel_features' noise: the "
                                               "reference's own, x10)")
    for stage in ("layer_0_isolated", "layer_1_isolated", "joint_logits"):
        assert "carries" not in f32.loc[stage, "gate"] and float(f32.loc[stage, "nmse"]) < 1e-12
    assert f32.loc["decode", "token_match"] == "1.0"
