"""One table per naming pair (checkpoints/renames.py): anchors, order, the derived direction, and
the Parakeet table read both ways over every parameter the port reads."""

from __future__ import annotations

import pytest

from audioparity.checkpoints.renames import Renames

TABLE = Renames((
    ("^encoder.pre.", "^encoder.sub."),
    (".linear_q.", ".q_proj."),
    (".bias_u$", ".u$"),
    ("^decoder.head.", "^head."),
    ("^ctc.head.", "^head."),
))


@pytest.mark.parametrize(("left", "right"), [
    ("encoder.pre.conv.weight", "encoder.sub.conv.weight"),
    ("encoder.layers.0.attn.linear_q.weight", "encoder.layers.0.attn.q_proj.weight"),
    ("encoder.layers.1.attn.bias_u", "encoder.layers.1.attn.u"),
    ("decoder.head.bias", "head.bias"),
    ("x.encoder.pre.y", "x.encoder.pre.y"),  # anchored at the start only
    ("x.bias_u.y", "x.bias_u.y"),  # anchored at the end only
])
def test_each_direction_renames_the_parts_it_anchors(left, right):
    assert TABLE.right(left) == right
    assert TABLE.left(right) == left


def test_a_part_two_namings_share_maps_back_to_the_first():
    assert TABLE.right("ctc.head.weight") == "head.weight"
    assert TABLE.left("head.weight") == "decoder.head.weight"


def test_a_pair_anchored_differently_is_refused():
    with pytest.raises(ValueError, match="anchored differently"):
        Renames((("^a.", "b."),))


@pytest.mark.parametrize("options", [{}, {"head": "ctc"}, {"head": "tdt_ctc"}, {"use_bias": True},
                                     {"subsampling": "striding"}, {"head": "rnnt"}])
def test_parakeet_s_table_reads_every_parameter_back(options, fixture_model):
    """Every NeMo name the port reads (expected_shapes of a fixture NeMo built) renamed to
    transformers' and back is itself; no two NeMo names of one model share a transformers one."""
    pytest.importorskip("nemo.collections.asr")
    from audioparity.models.parakeet_tdt.checkpoint import NEMO_TRANSFORMERS, expected_shapes
    from audioparity.models.parakeet_tdt.config import load_config

    names = expected_shapes(load_config(fixture_model("parakeet_tdt", **options)))
    renamed = {NEMO_TRANSFORMERS.right(name) for name in names}
    assert len(renamed) == len(names)
    if options.get("head") != "tdt_ctc":  # no hybrid in transformers: its CTC head is the CTC
        assert {NEMO_TRANSFORMERS.left(name) for name in renamed} == set(names)
