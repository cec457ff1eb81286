"""A dense fault far below the quantized NMSE bounds fails the one isolated layer it sits in.

At q8_0 float32 noise flips a rounding of a matmul's quantized input now and then, which moves
the rows it reaches by up to one step of the type: the isolated layers' NMSE bound leaves room
for that (2e-6). Their ``median_row_nmse_max`` does not need to: the flips leave most rows at the
float32 floor, and an error spread over the tensor lifts every row. Layer 1's output scaled by
1 + 1e-4 (NMSE 1e-8 in every row, 200 times below the NMSE bound) fails ``layer_1_isolated``;
the end-to-end stages, whose bounds are tolerances, and every other teacher-forced stage pass.
"""

from __future__ import annotations

import pytest

from tests.planted import Patch, planted_rows

pytestmark = pytest.mark.slow

#: Layer 1's output scaled by 1 + 1e-4: a dense error of NMSE 1e-8 (a norm's epsilon off, a
#: scale rounded) in one layer.
DENSE: list[Patch] = [(
    "encoder.py",
    '    return ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))',
    '    out = ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))\n'
    "    return ggml.ggml_scale(ctx, out, 1 + 1e-4) if index == 1 else out",
)]


@pytest.fixture(scope="module")
def rows(whisper_model, clip_wav, whisper_reference, tmp_path_factory):
    """{"clean"|"dense": {stage: row}} of the q8_0 dumps against the quantization-aware
    reference, under the default config's q8_0 gates."""
    return {name: planted_rows(tmp_path_factory.mktemp(name), "whisper", patches,
                               whisper_model, clip_wav, whisper_reference, "q8_0")
            for name, patches in (("clean", []), ("dense", DENSE))}


def test_clean_isolated_layers_pass_at_the_float32_floor(rows):
    clean = rows["clean"]
    assert {stage: row["status"] for stage, row in clean.items() if row["status"] != "pass"} == {}
    for stage in ("layer_0_isolated", "layer_1_isolated"):
        assert clean[stage]["median_row_nmse"] < 2e-13


def test_a_dense_fault_at_nmse_1e_8_fails_its_isolated_layer_only(rows):
    dense = rows["dense"]
    failing = {stage for stage, row in dense.items() if row["status"] != "pass"}
    assert failing == {"layer_1_isolated"}
    row = dense["layer_1_isolated"]
    # the planted scale's own NMSE, (1e-4)² in every row, over the float32 floor
    assert row["median_row_nmse"] == pytest.approx(1e-8, rel=0.05)
    assert row["nmse"] < 2e-6  # the NMSE bound alone passes it
    assert "median_row_nmse" in row["reason"]
