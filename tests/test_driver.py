"""The one dump driver: what a family yields is checked against its contract and laid out from
it, phases are timed, and the storage policy is the same for every family."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family, Fields, Note, Phase, Skipped
from audioparity.contract.spec import FLOAT32, MATMUL, FamilySpec, Stage
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.driver import check_complete, storage_types, write_outputs


class Toy(Family):
    """A family of two heads, for the driver's checks."""

    spec = FamilySpec(
        name="toy", command="toy", title="", input="audio", model="",
        stages=(
            Stage("enc_out", "tensor", "[T, D]", ""),
            Stage("layer_{i}", "tensor", "[T, D]", "", isolated="layer_{i}_isolated",
                  replayed="layer_{i}_replayed"),
            Stage("logits", "logits", "[T, V]", "", head="a"),
            Stage("decode", "document", "{ids}", "", head="a", margins="[positions]"),
            Stage("other", "tensor", "[T]", "", head="b"),
        ))

    def weight_kind(self, name: str, shape: tuple[int, ...]) -> str:
        if name.startswith("conv"):
            return "conv_weight_type"
        return MATMUL if len(shape) == 2 else FLOAT32


T_D = np.zeros((3, 4), np.float32)


def write(tmp_path: Path, outputs, heads=("a",)) -> Dump:
    with DumpWriter(tmp_path / "dump", producer="ggml") as writer:
        write_outputs(writer, Toy(), heads, iter(outputs))
    return Dump(tmp_path / "dump")


def test_stages_are_laid_out_from_the_contract_and_phases_timed(tmp_path):
    dump = write(tmp_path, [Phase("enc_out"), ("enc_out", T_D), ("layer_0", T_D),
                            Phase("layer_0_isolated"), ("layer_0_isolated", T_D), Note("a note"),
                            Fields({"n_layers": 1}), Phase("logits"), ("logits", T_D),
                            ("decode", {"ids": [1]}), ("decode_margins", np.ones(1, np.float32))])
    assert dump.layout("enc_out") == "[T, D]" and dump.layout("layer_0_isolated") == "[T, D]"
    assert dump.layout("logits") == "[T, V]" and dump.layout("decode_margins") == "[positions]"
    assert dump.json("decode") == {"ids": [1]}
    assert set(dump.manifest["seconds"]) == {"enc_out", "layer_0_isolated", "logits"}
    assert dump.manifest["notes"] == ["a note"] and dump.manifest["n_layers"] == 1


def test_a_phase_is_a_stage_of_the_contract(tmp_path):
    """A phase names the stage a crash in its work is charged to: a name the contract lacks
    (a group's, ``encoder``) would be charged to no row."""
    with pytest.raises(AudioparityError, match=re.escape(
            "family toy: the dump named phase 'encoder', which is no stage of its contract")):
        write(tmp_path, [Phase("encoder"), ("enc_out", T_D)])
    assert not (tmp_path / "dump").exists() and not (tmp_path / "dump.partial").exists()


def test_a_fault_keeps_the_stages_written_and_names_the_phase_it_was_in(tmp_path):
    """An exception (not a refused input) in a phase's work: the partial dump keeps the stages
    written before, its manifest naming that phase's stage as running (what the guard makes
    the crashed dump's ``crashed_in``)."""
    def outputs():
        yield Phase("enc_out")
        yield "enc_out", T_D
        yield Phase("layer_0_isolated")
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write(tmp_path, outputs())
    partial = Dump(tmp_path / "dump.partial")
    assert partial.tensor_names == ["enc_out"] and partial.manifest["running"] == "layer_0_isolated"
    assert set(partial.manifest["seconds"]) == {"enc_out"}


@pytest.mark.parametrize(("name", "value", "message"), [
    ("layer_0_output", T_D, "the dump yielded 'layer_0_output', which its contract does not "
                            "declare"),
    ("enc_out_margins", T_D, "the dump yielded 'enc_out_margins', which its contract does not "
                             "declare"),
    ("other", T_D, "the dump yielded 'other' of the b head, which this model does not have"),
    ("decode", T_D, "'decode' is a ndarray; expected a mapping"),
    ("enc_out", {"ids": []}, "'enc_out' is a dict; expected an array"),
])
def test_an_output_the_contract_does_not_declare_is_refused_and_no_complete_dump_is_left(
        tmp_path, name, value, message):
    """Refused once enc_out was written: no dump, the partial one keeps enc_out and the
    refusal's line for the guard (tests/test_artifacts.py)."""
    with pytest.raises(AudioparityError, match=re.escape(f"family toy: {message}")):
        write(tmp_path, [("enc_out", T_D), (name, value)])
    assert not (tmp_path / "dump").exists()
    manifest = json.loads((tmp_path / "dump.partial" / "manifest.json").read_text())
    assert list(manifest["tensors"]) == ["enc_out"]
    assert manifest["refused"].endswith(message)


def test_a_dump_must_hold_every_declared_stage_of_its_heads_or_say_why_it_skipped_it(tmp_path):
    manifest = {"tensors": {"enc_out": {}, "layer_0": {}, "logits": {}},
                "documents": {"decode": "decode.json"}}
    check_complete(Toy(), ("a",), manifest, ("",), tmp_path)
    with pytest.raises(AudioparityError, match="declares 'layer_{i}_isolated' but its dump did "
                       "not write it"):
        check_complete(Toy(), ("a",), manifest, ("", "isolated"), tmp_path)
    with pytest.raises(AudioparityError, match="declares 'other'"):
        check_complete(Toy(), ("a", "b"), manifest, ("",), tmp_path)
    check_complete(Toy(), (), {"skipped": {"layer_0_replayed": "no input"}}, ("replayed",),
                   tmp_path)


def test_a_skipped_replayed_form_is_recorded_with_why(tmp_path):
    dump = write(tmp_path, [Skipped("layer_0_replayed", "the candidate has no layer_0")])
    assert dump.manifest["skipped"] == {"layer_0_replayed": "the candidate has no layer_0"}
    assert dump.manifest["notes"] == ["layer_0_replayed skipped: the candidate has no "
                                      "layer_0"]


def test_one_storage_policy_serves_every_kind_with_the_block_fallback():
    shapes = {"w": (64, 64), "bias": (64,), "conv": (8, 1, 3), "odd": (4, 48)}
    native = dict.fromkeys(shapes, "bf16")
    storage, notes = storage_types(Toy(), shapes, native, "q8_0",
                                   {"conv_weight_type": "f16"})
    assert storage == {"w": "q8_0", "bias": "f32", "conv": "f16", "odd": "f16"}
    assert notes == ["odd [4, 48]: q8_0 -> f16 (rows of 48 values, blocks of 32)"]
    assert storage_types(Toy(), shapes, native, "native", {"conv_weight_type": "f32"})[0] == {
        "w": "bf16", "bias": "f32", "conv": "f32", "odd": "bf16"}
    with pytest.raises(AudioparityError, match="unknown weight type 'q4'"):
        storage_types(Toy(), shapes, native, "q4", {})
    with pytest.raises(AudioparityError, match="stored by option 'conv_weight_type', which was "
                       "not given"):
        storage_types(Toy(), shapes, native, "f32", {})
