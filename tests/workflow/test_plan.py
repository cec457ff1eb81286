"""The config checked into a sweep plan (audioparity.workflow.plan): each refusal in one line,
the cells, the wildcard constraints and the reference jobs' plans; no Snakemake involved."""

from __future__ import annotations

import copy
import json
import re

import pytest

from audioparity.candidates import load_adapter
from audioparity.contract.errors import AudioparityError
from audioparity.models.registry import registered
from audioparity.workflow.plan import CellKey, Sweep, check_keys
from tests import REPO

CLIP = str(REPO / "resources/speech/clip.wav")
FIXTURE = "results/fixtures/parakeet_tdt/tiny/model.nemo"


class Tool:
    """A third-party adapter as the workflow sees one."""

    name, title, families, output = "tool", "a tool", ("parakeet_tdt",), "f32json"
    weight_types, backends, options, tensors = ("f32",), ("cpu",), (), ()
    converts, reads_reference, family_port, replays, port = True, False, False, True, None
    several_cases = False

    def check_options(self, values, where):
        if values:
            raise AudioparityError(f"{where}: unknown option(s) {sorted(values)}")
        return {}

    def files(self, options):
        return ["ports/tool/bin/tool"]


def adapters(name: str):
    if name == "tool":
        return Tool()
    return load_adapter(name)


def section(**overrides) -> dict:
    """A parakeet_tdt section as config/schema.yaml leaves it (defaults filled in)."""
    return {"models": [{"name": "tiny", "path": FIXTURE}],
            "cases": [{"name": "clip", "path": CLIP}], "backends": ["cpu"],
            "weight_types": ["f32", "q8_0"],
            "candidates": [{"name": "audioparity", "adapter": "audioparity", "options": {}}],
            "options": {}, "gates": {"default": [{"stage": "*", "cosine_min": 0.9}]},
            "expected_failures": [], "extra_expected_failures": [], "reuse": True,
            "reuse_bounds": [], **overrides}


def config(**overrides) -> dict:
    return {"families": ["parakeet_tdt"], "fixtures": {"parakeet_tdt": {"tiny": {}}},
            "parakeet_tdt": section(**overrides)}


def sweep(value: dict) -> Sweep:
    return Sweep(value, registered(), adapters)


@pytest.fixture(autouse=True)
def in_checkout(monkeypatch):
    monkeypatch.chdir(REPO)


def test_a_key_neither_a_setting_nor_a_family_is_refused():
    with pytest.raises(AudioparityError) as refused:
        check_keys({"families": [], "parakeet_tdd": {}}, registered())
    assert str(refused.value) == ("config: 'parakeet_tdd' is neither families nor fixtures nor "
                                  "environments nor cluster nor a registered family "
                                  "(parakeet_tdt, moss_voicegen, whisper)")


def bad(**changes) -> dict:
    value = config()
    for key, change in changes.items():
        target = value if key in ("families", "fixtures") else value["parakeet_tdt"]
        target[key] = change
    return value


REFUSED = [
    (bad(families=["parakeet_tdt", "wav2vec"]),
     "config families: unknown family 'wav2vec'; registered: parakeet_tdt, moss_voicegen, "
     "whisper"),
    ({"families": ["whisper"], "fixtures": {}},
     "config families: 'whisper' is listed but has no whisper: section"),
    (bad(options={"flash_attention": 2}),
     "config parakeet_tdt.options['flash_attention']: 2 is not one of [0, 1]"),
    (bad(fixtures={"wav2vec": {}}),
     "config fixtures: unknown family 'wav2vec'; registered: parakeet_tdt, moss_voicegen, "
     "whisper"),
    (bad(backends=["cpu", "cpu"]), "config parakeet_tdt.backends: the name 'cpu' is used twice"),
    (bad(backends=["cpu", {"name": "vulkan", "backend": "cuda"}]),
     "config parakeet_tdt.backends 'vulkan': a setting of cuda cannot be named after the "
     "vulkan backend"),
    (bad(unmeasured_gates={"q8_0@cuda": "copied"}),
     "config parakeet_tdt.unmeasured_gates 'q8_0@cuda': names no gate list of the section (its "
     "backends' lists: none)"),
    (bad(gates={"default": [{"stage": "*", "cosine_min": 0.9}],
                "q8_0@vulkan": [{"stage": "*", "cosine_min": 0.5}]},
         unmeasured_gates={"*@vulkan": " "}),
     "config parakeet_tdt.unmeasured_gates '*@vulkan': say why they are unmeasured, got ' '"),
    (bad(cases=[{"name": "a", "path": CLIP}] * 2),
     "config parakeet_tdt.cases: the name 'a' is used twice"),
    (bad(cases=[{"name": "a", "path": "no/such.wav"}]),
     f"config parakeet_tdt.cases 'a': no/such.wav does not exist (relative paths are read from "
     f"{REPO})"),
    (bad(models=[{"name": "tiny", "path": "results/fixtures/parakeet_tdt/tiny.nemo"}]),
     "config parakeet_tdt: results/fixtures/parakeet_tdt/tiny.nemo is under results/fixtures/ "
     "but names no fixture the config declares (fixtures: parakeet_tdt: <name>)"),
    (bad(models=[{"name": "tiny", "path": "results/fixtures/parakeet_tdt/tiny/other.nemo"}]),
     "config parakeet_tdt: results/fixtures/parakeet_tdt/tiny/other.nemo is not the model of "
     "fixture results/fixtures/parakeet_tdt/tiny; expected "
     "results/fixtures/parakeet_tdt/tiny/model.nemo"),
    (bad(candidates=[{"name": "t", "adapter": "tool", "options": {}}] * 2),
     "config parakeet_tdt.candidates: the name 't' is used twice"),
    (bad(candidates=[{"name": "t", "adapter": "no_such_adapter", "options": {}}]),
     "config parakeet_tdt.candidates 't': unknown adapter 'no_such_adapter'"),
    (bad(candidates=[{"name": "t", "adapter": "openmoss", "options": {}}]),
     "config parakeet_tdt.candidates 't': adapter 'openmoss' implements moss_voicegen, not "
     "parakeet_tdt"),
    (bad(candidates=[{"name": "t", "adapter": "tool", "options": {}, "models": ["big"]}]),
     "config parakeet_tdt.candidates 't': models ['big'] are not in parakeet_tdt.models"),
    (bad(candidates=[{"name": "t", "adapter": "tool", "options": {"x": 1}}]),
     "config parakeet_tdt.candidates 't'.options: unknown option(s) ['x']"),
    (bad(candidates=[{"name": "t", "adapter": "audioparity",
                      "options": {"flash_attention": 3}}]),
     "config parakeet_tdt.candidates 't'.options['flash_attention']: 3 is not one of [0, 1]"),
    (bad(weight_types=["f32", "q4_0+nope"]),
     "config parakeet_tdt.weight_types 'q4_0+nope': no recipe 'nope' in parakeet_tdt.recipes "
     "(none)"),
    (bad(weight_types=["q4_0+mine"], recipes={"mine": {"file": "no/such.json"}}),
     "config parakeet_tdt.recipes 'mine': no/such.json does not exist"),
    (bad(weight_types=["q4_0+r"], recipes={"r": {"targets": [{"stage": "nope"}]}}),
     "config parakeet_tdt.recipes 'r': precision: target stage 'nope' matches no stage of "
     "parakeet_tdt"),
    (bad(weight_types=["q4_0+mine"], recipes={"mine": {"file": "resources/README.md"}}),
     "recipe resources/README.md: unreadable"),
    (bad(weight_types=["q4_0+r"], recipes={"r": {"targets": [{"stage": "decode"}],
                                                 "calibration": ["clip", "nope"]}}),
     "config parakeet_tdt.recipes 'r': calibration case 'nope' is not a case of the sweep "
     "(clip)"),
    (bad(weight_types=["q4_0+mine"], recipes={"mine": {"file": str(
        REPO / "tests/standins/recipe-bad-targets.json")}}),
     "recipe " + str(REPO / "tests/standins/recipe-bad-targets.json") + ": precision: target "
     "stage 'nope' matches no stage of parakeet_tdt"),
    (bad(weight_types=["q8_0+r"], recipes={"r": {"targets": [{"stage": "decode"}]}}),
     "config parakeet_tdt.recipes 'r': wide q8_0 is no wider than q8_0 (weight type q8_0+r)"),
]


def test_a_recipe_weight_type_is_emulated_and_names_its_file(tmp_path):
    """q4_0+recipe is searched by rule precision per model; a recipe of the user's is its file,
    read when the sweep is planned; both are quantization-aware cells, and the wildcard
    constraint admits them."""
    mine = tmp_path / "mine.json"
    mine.write_text(json.dumps({"base": "q4_K", "overrides": {}}))
    targets = [{"stage": "decode", "wer_max": 0.0}]
    plan = sweep(config(weight_types=["f32", "q4_0", "q4_0+recipe", "q4_K+mine"],
                        recipes={"recipe": {"targets": targets}, "mine": {"file": str(mine)}}))
    family = plan.families["parakeet_tdt"]
    assert family.emulated == ["q4_0", "q4_0+recipe", "q4_K+mine"]
    assert family.recipe_file("tiny", "q4_0+recipe") == (
        "results/precision/parakeet_tdt/tiny/q4_0+recipe.json")
    assert family.recipe_file("tiny", "q4_K+mine") == str(mine)
    assert family.recipe_file("tiny", "q4_0") is None
    assert re.fullmatch(plan.constraints()["weight_type"], "q4_0+recipe")


def test_a_recipe_is_searched_on_its_calibration_cases_only():
    """The search runs on a bounded subset (default the sweep's first three cases, or the
    entry's count or names), so it does not grow with the sweep; every case verifies it."""
    cases = [{"name": f"c{i}", "path": CLIP} for i in range(10)]
    targets = [{"stage": "decode", "wer_max": 0.0}]
    recipes = {"recipe": {"targets": targets}, "two": {"targets": targets, "calibration": 2},
               "named": {"targets": targets, "calibration": ["c7", "c3"]}}
    family = sweep(config(cases=cases, recipes=recipes,
                          weight_types=["q4_0+recipe", "q4_0+two", "q4_0+named"])
                   ).families["parakeet_tdt"]
    assert list(family.calibration_cases("q4_0+recipe")) == ["c0", "c1", "c2"]
    assert list(family.calibration_cases("q4_0+two")) == ["c0", "c1"]
    assert list(family.calibration_cases("q4_0+named")) == ["c7", "c3"]


@pytest.mark.parametrize(("value", "message"), REFUSED)
def test_a_bad_config_is_refused_in_one_line(value, message):
    with pytest.raises(AudioparityError) as refused:
        sweep(copy.deepcopy(value))
    assert str(refused.value).startswith(message)
    assert "\n" not in str(refused.value)


def test_replay_where_the_family_has_no_replayed_stage_is_refused(monkeypatch):
    """Every shipped family replays: whisper's table is given none of its replayed forms."""
    import dataclasses

    from audioparity.models.registry import family

    whisper = type(family("whisper"))
    monkeypatch.setattr(whisper, "spec", dataclasses.replace(whisper.spec, stages=tuple(
        dataclasses.replace(stage, replayed=None) for stage in whisper.spec.stages)))
    value = {"families": ["whisper"], "fixtures": {"whisper": {"tiny": {}}},
             "whisper": {
                 **section(), "models": [{"name": "tiny",
                                          "path": "results/fixtures/whisper/tiny"}],
                 "candidates": [{"name": "t", "adapter": "audioparity", "options": {},
                                 "replay": True}]}}
    with pytest.raises(AudioparityError, match="replay is set, but family whisper "
                                               "has no replay"):
        sweep(value)


def test_defaults_are_filled_in_and_a_candidate_of_our_port_takes_the_familys_options():
    value = config(options={"flash_attention": 1},
                   candidates=[{"name": "audioparity", "adapter": "audioparity", "options": {}},
                               {"name": "plain", "adapter": "audioparity",
                                "options": {"flash_attention": 0}},
                               {"name": "t", "adapter": "tool", "options": {}}])
    plan = sweep(value).families["parakeet_tdt"]
    assert value["fixtures"]["parakeet_tdt"]["tiny"]["seed"] == 0
    assert plan.section["options"]["flash_attention"] == 1
    assert plan.candidates["audioparity"].options["flash_attention"] == 1
    assert plan.candidates["plain"].options["flash_attention"] == 0
    assert plan.candidates["t"].options == {}
    assert plan.candidates["t"].replay and not plan.candidates["audioparity"].replay
    assert plan.candidates["t"].models == ["tiny"]
    assert plan.fixtures == {"tiny": "results/fixtures/parakeet_tdt/tiny"}
    assert plan.emulated == ["q8_0"]
    assert plan.weights("audioparity", "q8_0") and not plan.weights("t", "q8_0")
    assert not plan.weights("audioparity", "q4_K_M")  # a tool's mix: our port makes none


def test_the_cells_cover_the_sweep_and_another_backend_is_also_compared_with_the_cpu():
    plan = sweep(config(backends=["cpu", {"name": "vk", "backend": "vulkan"}],
                        candidates=[{"name": "audioparity", "adapter": "audioparity",
                                     "options": {}},
                                    {"name": "t", "adapter": "tool", "options": {},
                                     "weight_types": ["f32"]}]))
    cells = list(plan.cells())
    # per backend, vk against cpu, and our port (it runs several cases in one process)
    # against its fresh run on each backend; the tool runs one case per process
    assert len(cells) == (2 + 1 + 2) * 2 + (2 + 1) * 1
    assert CellKey("parakeet_tdt", "tiny", "t", "vk", "f32", "clip", "cpu") in cells
    assert CellKey("parakeet_tdt", "tiny", "audioparity", "vk", "q8_0", "clip", "fresh") in cells
    assert not any(cell.candidate == "t" and cell.against == "fresh" for cell in cells)
    results = {plan.result(cell) for cell in cells}
    assert "results/compare_fresh/parakeet_tdt/tiny/audioparity/vk/q8_0" in results
    assert len(list(sweep(config(reuse=False)).cells())) == 2  # f32, q8_0 on cpu
    assert "results/drilldown/parakeet_tdt/tiny/audioparity/vk/q8_0/clip.json" in results
    assert "results/compare_backends/parakeet_tdt/tiny/t/vk/f32/clip.json" in results
    assert "results/compare/parakeet_tdt/tiny/t/cpu/f32/clip.json" in results
    assert plan.weights_files() == [
        f"results/weights/parakeet_tdt/tiny/audioparity/{t}.gguf" for t in ("f32", "q8_0")]
    assert plan.reference_dirs() == ["results/reference/parakeet_tdt/tiny"]


def test_the_constraints_name_the_sweeps_own_values_and_any_case_but_a_json_one():
    value = config(cases=[{"name": "clip", "path": CLIP}, {"name": "x.json", "path": CLIP}])
    constraints = sweep(value).constraints()
    assert re.fullmatch(constraints["family"], "parakeet_tdt")
    assert not re.fullmatch(constraints["model"], "tiny.plan.json")
    case = re.compile(constraints["case"])
    assert case.fullmatch("clip") and case.fullmatch("any-other_1.2")
    assert case.fullmatch("x.json") and not case.fullmatch("y.json")
    drilldown = re.compile(rf"results/drilldown/(?P<case>{constraints['case']})\.json")
    assert drilldown.fullmatch("results/drilldown/clip.json")["case"] == "clip"
    folder = re.compile(rf"results/drilldown/(?P<case>{constraints['case']})")
    assert not folder.fullmatch("results/drilldown/clip.json")


def test_a_reference_jobs_plan_names_its_cases_their_content_and_its_emulated_types():
    plans = sweep(config()).plan_files(lambda path: f"digest of {path}")
    assert list(plans) == ["results/reference/parakeet_tdt/tiny.plan.json"]
    assert json.loads(plans["results/reference/parakeet_tdt/tiny.plan.json"]) == {
        "cases": {"clip": CLIP}, "digests": {"clip": f"digest of {CLIP}"}, "emulate": ["q8_0"]}


def test_a_known_text_is_kept_for_an_audio_case_and_refused_for_a_prompt():
    spoken = config(cases=[{"name": "clip", "path": CLIP, "text": "what was said"}])
    assert sweep(spoken).families["parakeet_tdt"].known_texts == {"clip": "what was said"}
    prompt = str(REPO / "resources/moss/en_instruction.json")
    moss = section(models=[{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
                   cases=[{"name": "en", "path": prompt, "text": "hello"}])
    value = {"families": ["moss_voicegen"], "fixtures": {"moss_voicegen": {"tiny": {}}},
             "moss_voicegen": moss}
    with pytest.raises(AudioparityError, match="config moss_voicegen.cases 'en': a known "
                                               "text is what is said in an audio case"):
        sweep(value)
