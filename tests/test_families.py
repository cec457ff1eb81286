"""Families declare themselves: every registered table is well formed, each family implements
what its table declares, its dumps hold exactly the stages it declares, its reference side imports
nothing of ggml, and the CLI and the config schema are built from the specs and the vocabulary."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import (
    REFERENCES,
    Family,
    ReferenceLibrary,
    implements,
    reference_names,
)
from audioparity.contract.spec import IMPLEMENTATION, FamilySpec, Option, Stage
from audioparity.contract.vocabulary import BACKENDS, MIXES, QUANTIZED, SIDES, WEIGHT_TYPES
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import RunSettings, dump_ggml, dump_reference
from audioparity.dumping.storage import EMULATED_TYPES
from audioparity.models.registry import family, registered, spec_of
from tests import MOSS_PROMPTS, REPO, RESOURCES

FAMILIES = list(registered().values())
#: One case input per input kind.
CASE = {"audio": RESOURCES / "speech" / "clip.wav", "prompt": MOSS_PROMPTS[0]}


def test_every_family_package_is_registered_under_its_own_name():
    models = REPO / "src/audioparity/models"
    packages = sorted(p.parent.name for p in models.glob("*/__init__.py"))
    assert sorted(registered()) == packages
    assert len({known.spec.command for known in FAMILIES}) == len(FAMILIES)
    for known in FAMILIES:
        assert type(known).__module__ == f"audioparity.models.{known.spec.name}"


@pytest.mark.parametrize("known", FAMILIES, ids=lambda f: f.spec.name)
def test_a_family_implements_what_its_table_declares(known: Family):
    """Every family implements the methods of every side, and each of its reference
    implementations is one :class:`ReferenceLibrary` that loads, dumps and gives its module;
    the primary replays exactly when a stage has a replayed form; importing the package and
    every reference module imports neither torch nor ggml."""
    required = ("config", "open_case", "fixture", "weights", "weight_kind", "ggml")
    assert [m for m in required if not implements(known, m)] == []
    libraries = [known.library({IMPLEMENTATION: name}) for name in known.spec.references]
    assert [library.name for library in libraries] == list(known.spec.references)
    for library in libraries:
        assert library.stages is not ReferenceLibrary.stages, library.name
        assert library.module is not ReferenceLibrary.module, library.name
    assert libraries[0].replays() == known.spec.replays
    modules = [f"{type(known).__module__}.{REFERENCES}.{name}" for name in known.spec.references]
    code = (f"import sys; import {', '.join(modules)}; "
            "print([m for m in sys.modules if m in ('ggml', 'torch') "
            "or m.startswith('audioparity.ggml')])")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert json.loads(result.stdout.replace("'", '"')) == []


def test_a_family_finds_its_reference_implementations_by_their_files(tmp_path, monkeypatch):
    """A module dropped into a family's ``references/`` is an implementation the family
    offers, by its file's name, primary first; a module without one ReferenceLibrary class
    is refused in one line when it is asked for."""
    package = tmp_path / "fam"
    (package / REFERENCES).mkdir(parents=True)
    (package / "__init__.py").write_text("")
    for name in ("transformers", "second_revision"):
        (package / REFERENCES / f"{name}.py").write_text(
            "from audioparity.contract.family import ReferenceLibrary\n\n\n"
            f"class {name.title().replace('_', '')}(ReferenceLibrary):\n    pass\n")
    (package / REFERENCES / "empty.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert reference_names("fam", "transformers") == ("transformers", "empty", "second_revision")
    with pytest.raises(ValueError, match="no references/nemo.py"):
        reference_names("fam", "nemo")

    class Fam(Family):
        spec = dataclasses.replace(family("whisper").spec,
                                   references=reference_names("fam", "transformers"))

    Fam.__module__ = "fam"
    assert Fam().library({IMPLEMENTATION: "second_revision"}).name == "second_revision"
    with pytest.raises(AudioparityError, match="empty.py: defines 0 ReferenceLibrary classes"):
        Fam().library({IMPLEMENTATION: "empty"})
    with pytest.raises(AudioparityError, match="--implementation nemo: whisper has "):
        Fam().library({IMPLEMENTATION: "nemo"})


def test_stage_names_map_to_their_spec_stage_and_sort_in_pipeline_order():
    parakeet = family("parakeet_tdt").spec
    assert parakeet.reference_stage("layer_12_isolated") == "layer_12"
    assert parakeet.reference_stage("decoder_replay") == "decode"
    assert parakeet.reference_stage("enc_out") == "enc_out"
    assert parakeet.reference_stage("unknown_isolated") == "unknown_isolated"
    names = ["decoder_replay", "layer_10", "decode", "layer_2_isolated", "mel_features",
             "zzz", "layer_2", "enc_out"]
    assert sorted(names, key=lambda n: spec_of("parakeet_tdt").stage_key(n)) == [
        "mel_features", "layer_2", "layer_2_isolated", "layer_10", "enc_out", "decode",
        "decoder_replay", "zzz"]
    # a family this install does not know: natural order, <stage>_isolated after <stage>
    assert sorted(["b_isolated", "a", "b"], key=lambda n: spec_of("other").stage_key(n)) == [
        "a", "b", "b_isolated"]


@pytest.mark.parametrize("known", registered().values(), ids=lambda f: f.spec.name)
def test_every_stage_is_fed_by_stages_of_its_own_contract(known: Family):
    """A typo in a stage's inputs or parts would silently leave it a source of the data flow
    (the culprits would name it for its inputs' faults): each resolves to a stage the contract
    has, for three layers."""
    spec = known.spec
    names = [name for stage in spec.stages for layer in range(3)
             for pattern in (stage.name, stage.isolated, stage.replayed) if pattern
             for name in [pattern.replace("{i}", str(layer))]]
    flow = spec.flow(names)
    for name, (inputs, parts) in [*flow.items(), *spec.flow(names, reference=True).items()]:
        assert set(inputs) | set(parts) <= set(names), (name, inputs, parts)
    assert flow["layer_0"][0] and flow["layer_2"][0][0] == "layer_1"
    assert any(inputs == ("layer_2",) for inputs, _ in flow.values())  # layer_{last}


def test_a_malformed_spec_is_refused_when_it_is_written():
    with pytest.raises(ValueError, match="kind 'array'"):
        Stage("x", "array", "[T]", "")
    with pytest.raises(ValueError, match="sides"):
        Option("x", 1, "", sides=("runtime",))
    with pytest.raises(ValueError, match="input 'video'"):
        FamilySpec("f", "f", "", "video", "", ())
    with pytest.raises(ValueError, match="only a document has margins"):
        Stage("x", "tensor", "[T]", "", margins="[positions]")


def test_options_are_checked_and_filled_with_their_defaults():
    spec = family("parakeet_tdt").spec
    assert spec.check_options({}, "x") == {"conv_weight_type": "f32", "flash_attention": 0,
                                           "attention_mask": 1}
    with pytest.raises(AudioparityError, match=r"^x\['flash_attention'\]: 2 is not one of"):
        spec.check_options({"flash_attention": 2}, "x")
    moss = family("moss_voicegen").spec
    assert moss.check_options({"massive_activation": True}, "x", fixture=True) == {
        "seed": 0, "massive_activation": True, "remote_code": False}


def test_the_stages_that_carry_the_mel_s_error_are_read_from_the_contract():
    """End-to-end stages fed through ``inputs`` from the mel; not the mel, the position table,
    the stages fed the reference's own inputs, a form or a document."""
    spec = family("parakeet_tdt").spec
    carried = [name for name in ("mel_features", "pre_encode", "pos_emb", "layer_0", "layer_11",
                                 "layer_0_isolated", "layer_0_replayed", "enc_out",
                                 "joint_logits", "lstm_state_0", "decode", "decode_logits",
                                 "ctc_logits", "ctc_logits_isolated", "decoder_replay")
               if spec.carries("mel_features", name)]
    assert carried == ["pre_encode", "layer_0", "layer_11", "enc_out", "decode_logits",
                       "ctc_logits"]
    assert not spec.carries("enc_out", "pre_encode") and spec.carries("enc_out", "ctc_logits")


def test_a_nullable_option_takes_null_from_the_config_and_the_command_line():
    """``preemph: null`` (NeMo: no pre-emphasis) is a value, not a missing one: the config
    schema takes it, the flag writes it as ``null`` and the command reads it back as None."""
    from audioparity.cli.arguments import parser

    spec = family("parakeet_tdt").spec
    preemph = next(option for option in spec.options if option.name == "preemph")
    assert spec.check_options({"preemph": None}, "x", fixture=True)["preemph"] is None
    with pytest.raises(AudioparityError, match=r"preemph'\]: 'none' is not of type"):
        spec.check_options({"preemph": "none"}, "x", fixture=True)
    assert preemph.argv(None) == ["--preemph", "null"]
    args = parser().parse_args(["fixture", "parakeet-tdt", "--output", "o",
                                      *preemph.argv(None)])
    assert args.preemph is None
    assert parser().parse_args(["fixture", "parakeet-tdt", "--output", "o"]).preemph \
        == 0.97
    flash = next(option for option in spec.options if option.name == "flash_attention")
    with pytest.raises(AudioparityError, match="None is not of type 'integer'"):
        spec.check_options({"flash_attention": None}, "x")  # not nullable
    assert not flash.nullable


def test_the_cli_has_each_familys_commands_and_options():
    for spec in (known.spec for known in FAMILIES):
        for side in SIDES:
            result = subprocess.run(
                [sys.executable, "-m", "audioparity.cli", side, spec.command, "--help"],
                capture_output=True, text=True, check=True)
            flags = {option.flag for option in spec.options_for(side)}
            assert all(flag in result.stdout for flag in flags), (side, flags)
            help_text = " ".join(result.stdout.split())
            for option in spec.options_for(side):  # the choices, which --help alone tells
                if option.choices:
                    assert "one of " + ", ".join(map(str, option.choices)) in help_text, (
                        side, option.name)
            if side != "fixture":
                assert spec.input_flag in result.stdout
        ggml = subprocess.run([sys.executable, "-m", "audioparity.cli", "ggml", spec.command,
                               "--help"], capture_output=True, text=True, check=True).stdout
        assert ("--reference-dir" in ggml) == spec.ggml_reads_reference
        assert ("--weights-file" in ggml) == spec.converts_weights


def test_the_schema_enums_are_the_vocabulary():
    schema = yaml.safe_load((REPO / "config/schema.yaml").read_text())
    definitions = schema["definitions"]
    assert definitions["backend"]["enum"] == list(BACKENDS)
    plain, mix, recipe = definitions["weight_types"]["items"]["anyOf"]
    assert plain["enum"] == list(WEIGHT_TYPES)
    assert mix["enum"] == list(MIXES)
    assert recipe["pattern"] == f"^({'|'.join(EMULATED_TYPES)})\\+[A-Za-z0-9_-]+$"
    names = "|".join(["default", QUANTIZED, *WEIGHT_TYPES])
    assert definitions["gates"]["propertyNames"]["pattern"] == (
        f"^({names})(@({'|'.join(BACKENDS)}))?$")


def test_the_default_config_sweeps_every_family():
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    assert sorted(config["families"]) == sorted(registered())


def assert_follows_spec(dump: Dump, spec: FamilySpec, side: str) -> None:
    """Every stage of ``spec`` in a reference dump, and in a ggml dump each with its isolated
    form; nothing else but a document's ``<name>_margins``; kinds and layouts as declared."""
    documents = set(dump.manifest["documents"])
    tensors = {n for n in dump.tensor_names if not (n.endswith("_margins")
                                                    and n.removesuffix("_margins") in documents)}
    found = set()
    for name in tensors | documents:
        located = spec.locate(name)
        assert located is not None, f"{side} dumps {name!r}, a stage {spec.name} lacks"
        stage, form = located.stage, located.form
        isolated = form == "isolated"
        assert (name in documents) == (stage.kind == "document"), name
        if name in tensors:
            assert dump.manifest["tensors"][name]["layout"] == stage.layout, name
        assert form in ("", "isolated"), f"{side} dumps a replayed form {name!r}"
        assert side == "ggml" or not isolated, f"the reference dumps an isolated form {name!r}"
        if name in tensors:
            assert dump.layout(name) == stage.layout, (name, dump.layout(name))
        found.add((stage.name, isolated))
    heads = {stage.head for stage in spec.stages if (stage.name, False) in found}
    stages = [stage for stage in spec.stages if stage.head in heads | {None}]
    expected = {(stage.name, False) for stage in stages}
    if side == "ggml":
        expected |= {(stage.name, True) for stage in stages if stage.isolated}
    assert found == expected


@pytest.mark.slow
@pytest.mark.parametrize("known", FAMILIES, ids=lambda f: f.spec.name)
def test_dumps_of_each_side_hold_exactly_the_declared_stages(known: Family, fixture_model,
                                                              tmp_path: Path):
    spec = known.spec
    model, case = fixture_model(spec.name), CASE[spec.input]

    def options(side: str) -> dict:
        return {option.name: option.default for option in spec.options_for(side)}

    dump_reference(known, model, [(case, tmp_path / "reference")], options=options("reference"))
    dump_ggml(known, model, case, tmp_path / "ggml", RunSettings("f32", "cpu", options("ggml")),
              tmp_path / "reference")
    for side in ("reference", "ggml"):
        dump = Dump(tmp_path / side)
        assert dump.manifest["family"] == spec.name
        assert_follows_spec(dump, spec, side)


@pytest.mark.parametrize("spec", [f.spec for f in FAMILIES], ids=lambda s: s.name)
def test_design_doc_lists_each_familys_stages_as_its_spec_declares(spec: FamilySpec):
    """docs/design.md keeps a stage table per family: every stage, with its isolated and
    replayed forms, its kind and its layout."""
    doc = (REPO / "docs/design.md").read_text()
    sections = {match.group(1): match.group(2) for match in re.finditer(
        r"^### Stages of .*?\(`(\w+)`.*?\n(.*?)(?=^#|\Z)", doc, flags=re.M | re.S)}
    assert spec.name in sections, f"docs/design.md has no '### Stages of ... (`{spec.name}`'"
    rows = {row.split("|")[1].strip(): [c.strip() for c in row.split("|")[2:4]]
            for row in sections[spec.name].splitlines() if row.startswith("| `")}
    for stage in spec.stages:
        forms = ", ".join(f"`{form}`" for form in (stage.isolated, stage.replayed) if form)
        name = f"`{stage.name}`" + (f" ({forms})" if forms else "")
        assert rows.get(name) == [stage.kind, f"`{stage.layout}`"], (name, rows.get(name))


def test_a_family_is_found_by_its_name_or_its_command_and_an_unknown_one_is_named():
    assert family("parakeet-tdt") is family("parakeet_tdt")
    with pytest.raises(AudioparityError, match=r"^unknown family 'parakeet'; registered: "
                                               r"parakeet_tdt, moss_voicegen, whisper$"):
        family("parakeet")
