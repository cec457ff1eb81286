"""Every encoder position is compared with transformers: the shipped clip, padded to the 30 s
window as Whisper's frontend pads every input, gives all ``max_source_positions`` (1500) rows of
the position table, and a port whose table is wrong only past :data:`FAR` fails at the first
layer that adds it."""

from __future__ import annotations

import pytest

from audioparity.dumping.artifacts import Dump
from tests.planted import Patch, failing, planted_statuses

pytestmark = pytest.mark.slow

#: Positions past this one are the far ones.
FAR = 1024

#: The table read as a ring of FAR rows, as a port that holds FAR positions would: positions
#: FAR and after take rows 0, 1, ...
FAR_ROWS_WRAP: list[Patch] = [(
    "encoder.py",
    "    rows = ggml.ggml_view_2d(ctx, table, table.contents.ne[0], n_frames, "
    "table.contents.nb[1], 0)",
    "    def first(n):\n"
    "        return ggml.ggml_view_2d(ctx, table, table.contents.ne[0], n, table.contents.nb[1],"
    " 0)\n"
    f"    rows = ggml.ggml_concat(ctx, first({FAR}), first(n_frames - {FAR}), 1)",
)]


def test_the_clip_reaches_every_encoder_position(whisper_model, whisper_reference):
    import json

    positions = json.loads((whisper_model / "config.json").read_text())["max_source_positions"]
    shapes = Dump(whisper_reference).manifest["tensors"]
    assert shapes["conv_out"]["shape"][0] == shapes["enc_out"]["shape"][0] == positions > FAR


def test_a_table_wrong_only_past_1024_fails_at_layer_0(whisper_model, clip_wav,
                                                         whisper_reference, tmp_path):
    got = planted_statuses(tmp_path, "whisper", FAR_ROWS_WRAP, whisper_model, clip_wav,
                           whisper_reference)
    assert got["mel_features"] == got["conv_out"] == "pass"
    assert {"layer_0", "layer_0_isolated", "enc_out"} <= failing(got)
    assert got["layer_1_isolated"] == "pass"  # fed the reference's layer_0
