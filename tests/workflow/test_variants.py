"""config/examples/variants.yaml as CI runs it: every Parakeet variant NeMo ships (xscaling,
biases, 1024 pieces, local attention, RNNT, CTC, TDT+CTC) and the shapes none of them has
(subsampling x2, x4 and x16, striding, kernel 31, head dimensions 8 and 80, subsampling channels
-1, preemph null, max_symbols 2), built by NeMo, on the clip at f32 and q8_0, each q8_0 cell
against its q8_0 reference. The example also runs jfk.wav, which CI leaves to a run on demand
(`make run SNAKEMAKE_ARGS="--configfile config/examples/variants.yaml"`): its 138 encoder frames
take the same ops as the clip's 39."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
import pytest
import yaml

from tests import REPO
from tests.workflow import workdir as wd

pytestmark = pytest.mark.slow


def test_every_variant_passes_at_f32_and_nothing_fails_undeclared(tmp_path):
    sweep = yaml.safe_load((REPO / "config/examples/variants.yaml").read_text())
    sweep["parakeet_tdt"]["cases"] = [{"name": "clip",
                                       "path": str(REPO / "resources/speech/clip.wav")}]
    workdir = wd.make_workdir(tmp_path / "run", sweep)
    wd.run_to_completion(workdir)
    summary = workdir / "results/report/summary.csv"
    rows = pd.read_csv(summary, dtype=str, keep_default_na=False)

    models = {model["name"] for model in sweep["parakeet_tdt"]["models"]}
    assert {"v3", "sub2", "sub16_head8", "head80", "striding", "symbols2"} <= models
    assert set(rows["model"]) == models and set(rows["case"]) == {"clip"}
    assert set(rows["status"]) <= {"pass", "xfail"}, rows[rows["status"] != "pass"][
        ["model", "case", "weight_type", "stage", "status", "reason"]]
    f32 = rows[rows["weight_type"] == "f32"]
    assert set(f32["status"]) == {"pass"} and len(f32) > 100
    # the heads each model has: a CTC-only model has no transducer stages, the hybrid both
    stages = {model: set(rows.loc[rows["model"] == model, "stage"]) for model in models}
    assert "ctc_logits" in stages["ctc"] and "joint_logits" not in stages["ctc"]
    assert {"ctc_logits", "joint_logits", "ctc_decode", "decode"} <= stages["tdt_ctc"]
    assert "ctc_logits" not in stages["rnnt"]
    # at q8_0, the decoders fed the reference's own inputs are exact against the q8_0 reference
    # and far from the f32 one somewhere (their cost)
    replays = rows[(rows["weight_type"] == "q8_0") & (rows["against"] == "reference")
                   & rows["stage"].str.endswith("decoder_replay")]
    assert set(replays["status"]) == {"pass"} and set(replays["token_match"]) == {"1.0"}
    assert min(float(v) for v in replays["cost_token_match"]) < 0.9
    check = subprocess.run([sys.executable, "-m", "audioparity.cli", "report", "check",
                            str(summary)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
