"""Reference-side replay of a MOSS candidate localises a one-layer fault.

Our ggml port, clean and with a fault planted in decoder layer 0, is replayed by torch: each
torch layer on the port's own input to it. End to end, the fault shows at layer 0 and every
layer after it; replayed, at layer 0 alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.plan import CellDumps
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import ReplaySettings, dump_replay
from audioparity.models.moss_voicegen.references.remote_code import layer_inputs
from tests import config_gates
from tests.models.moss_voicegen import F32_GATE, FAMILY, PROMPT, options
from tests.planted import Patch, planted_dump

pytestmark = pytest.mark.slow

#: A fault in decoder layer 0 only: its post-attention RMSNorm with eps 1 instead of the
#: config's (a wrong constant in one block).
LAYER_0_FAULT: list[Patch] = [(
    "backbone.py",
    'ctx, x, w[p + "post_attention_layernorm.weight"], eps)))',
    'ctx, x, w[p + "post_attention_layernorm.weight"], eps if layer != 0 else 1.0)))',
)]
#: The local error of a correct float32 layer (max_rel; measured ~3e-7).
FLOAT_NOISE = 2e-6


@pytest.fixture(scope="module")
def rows(moss_model, moss_references, tmp_path_factory):
    """{port: {stage: row}} for the clean port and the layer-0 fault, each replayed through
    torch and compared under the f32 gates."""
    reference = moss_references[PROMPT.stem].path
    result = {}
    for name, patches in (("clean", []), ("layer_0_fault", LAYER_0_FAULT)):
        root = tmp_path_factory.mktemp(name)
        dump = planted_dump(root, "moss_voicegen", patches, moss_model, PROMPT, reference)
        dump_replay(FAMILY, moss_model, PROMPT, dump.path, root / "replay",
                    ReplaySettings(options("reference")))
        cell = root / "cell.json"
        compare_cell(CellDumps(reference, dump.path, replay=root / "replay"),
                     config_gates("moss_voicegen", "f32"), {"family": "moss_voicegen"}, cell)
        result[name] = {row["stage"]: row for row in json.loads(cell.read_text())}
    return result


def test_a_clean_port_replays_to_float32_noise(rows):
    clean = rows["clean"]
    for layer in (0, 1):
        assert clean[f"layer_{layer}_replayed"]["status"] == "pass"
        assert clean[f"layer_{layer}_replayed"]["max_rel"] < FLOAT_NOISE


def test_a_one_layer_fault_spikes_at_that_layer_alone_when_replayed(rows):
    faulty = rows["layer_0_fault"]
    # end to end, every layer from the faulty one on fails: the stages alone cannot tell
    # whether layer 1 is right
    assert faulty["layer_0"]["status"] == faulty["layer_1"]["status"] == "fail"
    assert faulty["layer_1"]["max_rel"] > 1e3 * F32_GATE
    assert faulty["layer_0_replayed"]["status"] == "fail"
    assert faulty["layer_0_replayed"]["max_rel"] > 1e3 * F32_GATE
    assert faulty["layer_1_replayed"]["status"] == "pass"
    assert faulty["layer_1_replayed"]["max_rel"] < FLOAT_NOISE


def test_layer_inputs_say_why_a_layer_is_not_replayed(moss_references, tmp_path):
    """Each layer's input is the candidate's tensor before it; one missing or misshapen skips
    that layer with its reason, a missing input_embeddings falls back to the reference's."""
    from audioparity.dumping.artifacts import DumpWriter

    ref = moss_references[PROMPT.stem]
    rows_, hidden = ref.tensor("layer_0").shape
    with DumpWriter(tmp_path / "cand", producer="external") as writer:
        writer.add_tensor("layer_0", np.zeros((rows_ - 1, hidden), np.float32), "[S, H]")
    inputs, skipped, notes = layer_inputs(Dump(tmp_path / "cand"), 3, (rows_, hidden))
    assert inputs == {}
    assert skipped == {
        "layer_1_replayed": f"the candidate's layer_0 is {[rows_ - 1, hidden]}, the "
                            f"reference's input there is {[rows_, hidden]}",
        "layer_2_replayed": "the candidate dump has no layer_1"}
    assert notes == ["layer_0 replayed on the reference's input_embeddings: the candidate "
                     "dump has none"]


def test_a_replay_names_what_it_skipped_and_why(moss_model, moss_references, tmp_path):
    """A candidate without ``layer_0`` gets ``layer_0_replayed`` on its own input embeddings
    and ``layer_1_replayed`` skipped, the reason in the manifest."""
    from audioparity.dumping.artifacts import DumpWriter

    ref = moss_references[PROMPT.stem]
    with DumpWriter(tmp_path / "cand", producer="external") as writer:
        for name in ("input_embeddings", "layer_1"):
            writer.add_tensor(name, ref.tensor(name), ref.layout(name))
    dump_replay(FAMILY, moss_model, PROMPT, tmp_path / "cand", tmp_path / "replay",
                ReplaySettings(options("reference")))
    replay = Dump(tmp_path / "replay")
    assert replay.tensor_names == ["layer_0_replayed"]
    assert replay.manifest["skipped"] == {"layer_1_replayed": "the candidate dump has no layer_0"}
    # the reference's own input to layer 0 gives the reference's own layer 0
    np.testing.assert_array_equal(replay.tensor("layer_0_replayed"), ref.tensor("layer_0"))
