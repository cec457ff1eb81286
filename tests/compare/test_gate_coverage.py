"""Every gate list holds each form of a stage to a bound of its own, and every float32 tensor
gate bounds NMSE: what config/config.yaml and the example configs with gates must give every
family, at every weight type the schema allows and on every backend.

An isolated form (the candidate's block on the reference's input) and a replayed one (the
reference's block on the candidate's input) measure one block's own error; a pattern that also
covers the end-to-end stage (``layer_*`` matches ``layer_3`` and ``layer_3_isolated``) holds
them to the compounded error of every block before, up to 40 times looser. A bound on max_rel
alone lets a dense error through (a wrong RMSNorm epsilon raises NMSE 44-fold under it).
"""

from __future__ import annotations

import copy
from fnmatch import fnmatchcase

import pytest
import yaml
from snakemake.utils import update_config

from audioparity.compare.gate_lists import resolve_gates
from audioparity.compare.gates import gate_for, gate_text
from audioparity.compare.plan import CellKey
from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import FORMS, concrete
from audioparity.contract.vocabulary import BACKENDS, OUR_PORT, WEIGHT_TYPES, StageKind
from audioparity.models.registry import registered
from tests import REPO

#: The layer a per-layer stage is named for (any layer: the patterns match by ``*``).
LAYER = 3


def _sections() -> dict[tuple[str, str], dict]:
    """``{(config, family): section}``: each family's section of the default config, and of
    each example that sets the family's gates, laid over the default as ``--configfile`` lays
    it (Snakemake's recursive update: a weight type's list replaces the default's)."""
    base = yaml.safe_load((REPO / "config/config.yaml").read_text())
    sections = {("config.yaml", family): base[family] for family in registered()}
    for example in sorted((REPO / "config/examples").glob("*.yaml")):
        given = yaml.safe_load(example.read_text()) or {}
        merged = copy.deepcopy(base)
        update_config(merged, given)
        sections.update({(f"examples/{example.name}", family): merged[family]
                         for family in registered() if "gates" in (given.get(family) or {})})
    return sections


SECTIONS = _sections()


def _forms(family: str) -> list[tuple[str, str]]:
    """``(form's name, its stage's name)`` of every isolated and replayed form of ``family``'s
    stages, per-layer ones for layer :data:`LAYER`."""
    return [(concrete(pattern, LAYER), stage.concrete(LAYER))
            for stage in registered()[family].spec.stages
            for pattern in (stage.pattern(form) for form in FORMS[1:]) if pattern]


def _cells():
    for weight_type in WEIGHT_TYPES:
        for backend in BACKENDS:
            yield weight_type, backend


@pytest.mark.parametrize(("config", "family"), SECTIONS, ids=[f"{c}:{f}" for c, f in SECTIONS])
def test_every_form_takes_a_gate_of_its_own(config: str, family: str):
    """At every weight type and backend, the entry a form's name takes must not also match its
    stage's name: that entry is the end-to-end bound, not the form's."""
    section = SECTIONS[config, family]
    fallbacks = []
    for weight_type, backend in _cells():
        gates = resolve_gates(section, CellKey(family, "*", OUR_PORT, backend, weight_type, ""))
        for form, stage in _forms(family):
            try:
                entry = gate_for(form, gates)
            except AudioparityError:
                fallbacks.append(f"{weight_type}@{backend}: {form} has no gate")
                continue
            if fnmatchcase(stage, entry["stage"]):
                fallbacks.append(f"{weight_type}@{backend}: {form} takes {gate_text(entry)}, "
                                 f"{stage}'s")
    assert not fallbacks, "\n".join(sorted(set(fallbacks)))


def _tensor_stages(family: str) -> list[str]:
    """Every tensor and logits stage of ``family`` and its forms, per-layer ones for layer
    :data:`LAYER`."""
    names = []
    for stage in registered()[family].spec.stages:
        if stage.kind == StageKind.DOCUMENT:
            continue
        names.extend(concrete(pattern, LAYER)
                     for pattern in (stage.pattern(form) for form in FORMS) if pattern)
    return names


@pytest.mark.parametrize(("config", "family"), SECTIONS, ids=[f"{c}:{f}" for c, f in SECTIONS])
def test_every_float32_tensor_gate_bounds_nmse(config: str, family: str):
    """At f32, on every backend, each tensor and logits stage takes an entry with ``nmse_max``."""
    section = SECTIONS[config, family]
    unbounded = []
    for backend in BACKENDS:
        gates = resolve_gates(section, CellKey(family, "*", OUR_PORT, backend, "f32", ""))
        for stage in _tensor_stages(family):
            entry = gate_for(stage, gates)
            if "nmse_max" not in entry:
                unbounded.append(f"f32@{backend}: {stage} takes {gate_text(entry)}")
    assert not unbounded, "\n".join(sorted(set(unbounded)))


def test_a_pattern_covering_a_stage_and_its_form_is_found():
    """The check can fail: ``layer_*`` alone gives layer 3's isolated form layer 3's bound."""
    section = {"gates": {"default": [{"stage": "layer_*", "nmse_max": 1.0}]}}
    gates = resolve_gates(section, CellKey("f", "m", OUR_PORT, "cpu", "f32", ""))
    entry = gate_for("layer_3_isolated", gates)
    assert fnmatchcase("layer_3", entry["stage"])
    section["gates"]["default"].insert(0, {"stage": "layer_*_isolated", "nmse_max": 1.0})
    gates = resolve_gates(section, CellKey("f", "m", OUR_PORT, "cpu", "f32", ""))
    assert not fnmatchcase("layer_3", gate_for("layer_3_isolated", gates)["stage"])
