"""The harness catches real port bugs at the right stage and layer.

Each test plants one bug, of a kind port authors report, in a copy of the ggml port (the
package copied to a temporary directory, one source line replaced), runs the ggml dump from that
copy against the NeMo reference of the shipped clip, compares with the default config's f32
gates, and checks which stages fail: the planted stage and those downstream of it, never those
upstream. The clean copy passes everything, so a failure is the bug's doing.
"""

from __future__ import annotations

import pytest

from tests.planted import Patch, failing, planted_statuses

pytestmark = pytest.mark.slow

BUGS: dict[str, list[Patch]] = {
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


@pytest.fixture(scope="module")
def statuses(parakeet_model, clip_wav, parakeet_reference, tmp_path_factory):
    """Run every planted copy once; {bug: {stage: status}} under the config's f32 gates."""
    return {bug: planted_statuses(tmp_path_factory.mktemp(bug), "parakeet_tdt", patches,
                                  parakeet_model, clip_wav, parakeet_reference)
            for bug, patches in BUGS.items()}


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
