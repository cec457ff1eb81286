"""Reference-side replay localises a block fault as the isolated forms do.

Our own port dumps both: its isolated layers (the port's layer on NeMo's input) and, replayed by
NeMo, its replayed layers (NeMo's layer on the port's input). On a clean port both local errors
are float32 noise; with a fault planted in one layer both spike at that layer alone, by the same
amount.
"""

from __future__ import annotations

import json

import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.plan import CellDumps
from audioparity.dumping.driver import ReplaySettings, dump_replay
from tests import config_gates
from tests.models.parakeet_tdt import PARAKEET
from tests.models.parakeet_tdt.test_planted_bugs import BUGS
from tests.planted import planted_dump

pytestmark = pytest.mark.slow

#: The local error of a correct float32 layer: NMSE well below this (measured ~1e-13).
FLOAT_NOISE = 1e-10


@pytest.fixture(scope="module")
def rows(parakeet_model, clip_wav, parakeet_reference, tmp_path_factory):
    """{bug: {stage: row}} for the clean port and the layer-1 fault, each dumped with its
    isolated forms, replayed through NeMo and compared under the f32 gates."""
    result = {}
    for bug in ("clean", "layer_1_norm_bias_dropped"):
        root = tmp_path_factory.mktemp(bug)
        dump = planted_dump(root, "parakeet_tdt", BUGS[bug], parakeet_model, clip_wav,
                            parakeet_reference)
        dump_replay(PARAKEET, parakeet_model, clip_wav, dump.path, root / "replay",
                    ReplaySettings({}))
        cell = root / "cell.json"
        compare_cell(CellDumps(parakeet_reference, dump.path, replay=root / "replay"),
                     config_gates("parakeet_tdt", "f32"), {"family": "parakeet_tdt"}, cell)
        result[bug] = {row["stage"]: row for row in json.loads(cell.read_text())}
    return result


def test_replay_writes_every_block_of_a_full_dump(rows):
    clean = rows["clean"]
    replayed = sorted(stage for stage in clean if stage.endswith("_replayed"))
    assert replayed == ["decode_replayed", "layer_0_replayed", "layer_1_replayed",
                        "layer_2_replayed", "pre_encode_replayed"]
    assert {clean[stage]["status"] for stage in replayed} == {"pass"}


def test_replayed_and_isolated_local_errors_agree_on_a_clean_port(rows):
    clean = rows["clean"]
    for layer in range(3):
        isolated = clean[f"layer_{layer}_isolated"]["nmse"]
        replayed = clean[f"layer_{layer}_replayed"]["nmse"]
        assert isolated < FLOAT_NOISE and replayed < FLOAT_NOISE, (layer, isolated, replayed)


def test_a_one_layer_fault_spikes_at_that_layer_in_both(rows):
    faulty = rows["layer_1_norm_bias_dropped"]
    assert faulty["layer_1_replayed"]["status"] == "fail"
    assert faulty["layer_1_isolated"]["status"] == "fail"
    for layer in (0, 2):
        assert faulty[f"layer_{layer}_replayed"]["nmse"] < FLOAT_NOISE
        assert faulty[f"layer_{layer}_isolated"]["nmse"] < FLOAT_NOISE
    isolated = faulty["layer_1_isolated"]["nmse"]
    replayed = faulty["layer_1_replayed"]["nmse"]
    assert isolated > 1e4 * FLOAT_NOISE
    assert abs(replayed / isolated - 1) < 0.1, (isolated, replayed)
