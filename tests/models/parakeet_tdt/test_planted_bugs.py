"""The harness catches real port bugs at the right stage and layer.

Each test plants one bug, of a kind port authors report, in a copy of the ggml port (the
package copied to a temporary directory, one source line replaced), runs the ggml dump from that
copy against the NeMo reference of the shipped clip, compares with the default config's f32
gates, and checks which stages fail: the planted stage and those downstream of it, never those
upstream. The clean copy passes everything, so a failure is the bug's doing.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from audioparity.compare import compare_cell, resolve_gates
from tests import REPO

PORT = "models/parakeet_tdt"
pytestmark = pytest.mark.slow

#: (file, exact original text, replacement): each must match the source exactly once.
BUGS = {
    "clean": [],
    # LayerNorm of the conv module in layer 1 loses its bias (beta).
    "layer_1_norm_bias_dropped": [(
        "encoder.py",
        '        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], eps)',
        '        if index == 1 and name == "norm_conv":\n'
        '            scale = w[f"{p}{name}.weight"]\n'
        '            return ggml.ggml_mul(ctx, ggml.ggml_norm(ctx, t, eps), scale)\n'
        '        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], eps)',
    )],
    # rel_shift reads one relative position too far.
    "rel_shift_off_by_one": [(
        "encoder.py",
        "(2 * n_frames - 2) * es, bd.contents.nb[2], (n_frames - 1) * es)",
        "(2 * n_frames - 2) * es, bd.contents.nb[2], n_frames * es)",
    )],
    # LSTM gates taken as f, i, g, o instead of torch's i, f, g, o.
    "lstm_gate_order": [
        ("decoder.py", "i = ggml.ggml_sigmoid(ctx, gate(0))", "i = ggml.ggml_sigmoid(ctx, gate(1))"),  # noqa: E501
        ("decoder.py", "f = ggml.ggml_sigmoid(ctx, gate(1))", "f = ggml.ggml_sigmoid(ctx, gate(0))"),  # noqa: E501
    ],
    # The mel frontend forgets NeMo's per-feature normalisation.
    "no_per_feature_normalization": [(
        "frontend.py", "    return normalize_per_feature(features)", "    return features",
    )],
}


def planted_copy(root: Path, bug: str) -> Path:
    """A copy of the package under `root`/src with `bug` planted; returns the src directory."""
    src = root / "src"
    shutil.copytree(REPO / "src" / "audioparity", src / "audioparity",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for file, old, new in BUGS[bug]:
        path = src / "audioparity" / PORT / file
        text = path.read_text()
        assert text.count(old) == 1, f"{file}: the line to plant {bug!r} in has changed"
        path.write_text(text.replace(old, new))
    return src


@pytest.fixture(scope="module")
def f32_gates() -> dict:
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    return resolve_gates(config["parakeet_tdt"], model="tiny", backend="cpu", weight_type="f32")


@pytest.fixture(scope="module")
def statuses(parakeet_model, clip_wav, parakeet_reference, f32_gates, tmp_path_factory):
    """Run every planted copy once; {bug: {stage: status}}."""
    results = {}
    for bug in BUGS:
        root = tmp_path_factory.mktemp(bug)
        env = {**os.environ, "PYTHONPATH": str(planted_copy(root, bug))}
        dump = root / "dump"
        subprocess.run(
            [sys.executable, "-m", "audioparity.cli", "ggml", "parakeet-tdt",
             "--model", str(parakeet_model), "--audio", str(clip_wav),
             "--reference-dir", str(parakeet_reference), "--output-dir", str(dump),
             "--weight-type", "f32", "--threads", "1"],
            check=True, env=env, capture_output=True,
        )
        cell = root / "cell.json"
        compare_cell(parakeet_reference, dump, f32_gates, {"family": "parakeet_tdt", "bug": bug},
                     cell)
        rows = json.loads(cell.read_text())
        results[bug] = {row["stage"]: row["status"] for row in rows}
    return results


def failing(statuses: dict[str, str]) -> set[str]:
    return {stage for stage, status in statuses.items() if status != "pass"}


def test_clean_copy_passes_every_stage(statuses):
    assert failing(statuses["clean"]) == set()


def test_dropped_norm_bias_is_caught_at_the_planted_layer(statuses):
    got = statuses["layer_1_norm_bias_dropped"]
    isolated = sorted(s for s in got if s.endswith("_isolated"))
    assert [s for s in isolated if got[s] != "pass"] == ["layer_1_isolated"]
    assert got["layer_0"] == "pass" and got["pre_encode"] == "pass"
    assert got["layer_1"] == "fail" and got["enc_out"] == "fail"


def test_rel_shift_off_by_one_fails_every_layer_but_nothing_before(statuses):
    got = statuses["rel_shift_off_by_one"]
    assert {got[s] for s in ("mel_features", "pre_encode", "pos_emb")} == {"pass"}
    assert got["layer_0_isolated"] == "fail" and got["enc_out"] == "fail"


def test_lstm_gate_order_fails_the_decoder_not_the_encoder(statuses):
    got = statuses["lstm_gate_order"]
    assert got["enc_out"] == "pass" and got["layer_2_isolated"] == "pass"
    assert {"lstm_state_0", "joint_logits", "decoder_replay"} <= failing(got)


def test_missing_per_feature_normalization_fails_at_mel_features(statuses):
    got = statuses["no_per_feature_normalization"]
    assert got["mel_features"] == "fail"
    assert all(got[s] == "pass" for s in got if s.endswith("_isolated"))
