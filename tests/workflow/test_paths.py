"""The results-path scheme (audioparity.workflow.paths): one definition, which the rules use."""

from __future__ import annotations

import re
from types import SimpleNamespace

from audioparity.dumping.emulation import emulated_dir
from audioparity.workflow import paths
from tests import REPO

CELL = SimpleNamespace(family="parakeet_tdt", model="tiny", candidate="audioparity",
                       backend="vulkan", weight_type="q8_0", case="clip")


def test_a_cell_fills_each_pattern_from_its_wildcards():
    assert paths.fill(paths.GGML, CELL) == (
        "results/ggml/parakeet_tdt/tiny/audioparity/vulkan/q8_0/clip")
    assert paths.fill(paths.COMPARE, vars(CELL)) == (
        "results/compare/parakeet_tdt/tiny/audioparity/vulkan/q8_0/clip.json")
    assert paths.fill(paths.GGML, CELL, backend="cpu") == (
        "results/ggml/parakeet_tdt/tiny/audioparity/cpu/q8_0/clip")
    assert paths.fill(paths.WEIGHTS, CELL) == (
        "results/weights/parakeet_tdt/tiny/audioparity/q8_0.gguf")
    assert paths.log("ggml_dump", paths.CELL) == (
        "logs/ggml_dump/{family}/{model}/{candidate}/{backend}/{weight_type}/{case}.log")


def test_a_reference_dump_is_the_storage_modules_emulated_folder():
    for emulated in (None, "q8_0"):
        assert paths.reference_dump("moss_voicegen", "tiny", "en", emulated) == str(
            emulated_dir("results/reference/moss_voicegen/tiny/en", emulated))
    assert paths.digest("results/reference/a/b/c") == "results/reference/a/b/c.sha256"


def test_every_output_pattern_lies_under_results_and_names_only_cell_wildcards():
    """A cell's wildcards, a fixture's name, and another reference's name."""
    patterns = {name: value for name, value in vars(paths).items()
                if name.isupper() and isinstance(value, str) and value.startswith("results/")}
    assert {"FIXTURE", "REFERENCE", "GGML", "REPLAY", "COMPARE", "COMPARE_BACKEND",
            "DRILLDOWN", "WEIGHTS", "CANDIDATE_MODEL", "SUMMARY"} <= set(patterns)
    for name, pattern in patterns.items():
        assert set(re.findall(r"{(\w+)}", pattern)) <= {*paths.CELL_KEYS, "name",
                                                         "reference"}, name


def test_the_rules_spell_no_results_path_of_their_own():
    """The scheme is defined once: a rule file names results/ only in its comments."""
    for rules in (REPO / "rules").glob("*.smk"):
        code = [line.partition("#")[0] for line in rules.read_text().splitlines()]
        assert not [line for line in code if "results/" in line], rules.name
    snakefile = [line.partition("#")[0] for line in (REPO / "Snakefile").read_text().splitlines()]
    assert not [line for line in snakefile if "results/" in line]
