"""The workflow's config checked against the registered families and adapters: a sweep plan
(:class:`Sweep`) of families, models, cases, backends and candidates, the cells they make, the
wildcard constraints, and each reference job's plan.

Every refusal is one line (an :class:`~audioparity.contract.errors.AudioparityError`), raised in the
order the config is read: the top-level keys, the families and their options, the fixtures,
the backends, the models and cases, the candidates.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from audioparity.compare.gate_lists import unmeasured_lists
from audioparity.compare.plan import CellKey
from audioparity.compare.precision import check_targets
from audioparity.compare.targets import target_gates
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.contract.spec import IMPLEMENTATION, FamilySpec
from audioparity.contract.vocabulary import (
    BACKENDS,
    FRESH,
    MIXES,
    RECIPE_SEPARATOR,
    WEIGHT_TYPES,
    InputKind,
)
from audioparity.dumping.storage import BITS_PER_WEIGHT, EMULATED_TYPES
from audioparity.dumping.weight_files import read_recipe, read_recipe_document
from audioparity.workflow import paths
from audioparity.workflow.references import Reference, read_references

#: Top-level config keys that are settings; every other is a family's section.
SETTINGS = ("families", "fixtures", "environments", "cluster")
#: The backend every other one is compared with, stage by stage, where a family sweeps it.
BASELINE_BACKEND = "cpu"
#: The ``backend`` and ``weight_type`` labels of a comparison between two references (each
#: computes in float32 with torch on the CPU).
REFERENCE_BACKEND, REFERENCE_WEIGHT_TYPE = "torch", "f32"
#: A name of the config (a model, a case, a candidate, a fixture): a path component.
NAME = "[A-Za-z0-9][A-Za-z0-9_.-]*"
FIXTURES = "results/fixtures"


def check_keys(config: Mapping[str, Any], known: Mapping[str, Any]) -> None:
    """Refuse a top-level key that is neither a setting nor a registered family (a misspelt
    family section), before the schema would read it as one.

    Raises:
        AudioparityError: names the key and the registered families.
    """
    for key in config:
        if key not in SETTINGS and key not in known:
            raise AudioparityError(f"config: {key!r} is neither {' nor '.join(SETTINGS)} nor "
                                   f"a registered family ({', '.join(known)})")


@dataclass(frozen=True)
class Backend:
    """A backend of a family's sweep: a ggml backend, or a named setting of one (``env``: the
    environment variables its dumps run with)."""

    name: str
    backend: str
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Candidate:
    """A candidate of a family's sweep: its config entry, checked, and its adapter.

    Attributes:
        adapter_name: what the entry's ``adapter`` names (a shipped adapter, a path, an entry
            point); ``adapter``: the adapter it loads.
        options: the adapter's options, defaults filled in (for the family's own port, the
            family's options with the entry's overriding the section's).
        replay: the reference replays its blocks (rule reference_replay).
        models, weight_types: those it runs (default all of the family's).
    """

    name: str
    adapter_name: str
    adapter: Any
    options: dict[str, Any]
    replay: bool
    models: list[str]
    weight_types: list[str]


@dataclass
class FamilyPlan:
    """One family's part of the sweep."""

    family: Family
    section: dict[str, Any]
    models: dict[str, str] = field(default_factory=dict)
    cases: dict[str, str] = field(default_factory=dict)
    #: case name -> what is said in its audio (the case's ``text``), where the config gives it.
    known_texts: dict[str, str] = field(default_factory=dict)
    backends: dict[str, Backend] = field(default_factory=dict)
    candidates: dict[str, Candidate] = field(default_factory=dict)
    #: model name -> the fixture directory a rule builds it in, or None (a file of the user's).
    fixtures: dict[str, str | None] = field(default_factory=dict)
    #: name -> reference, the primary first.
    references: dict[str, Reference] = field(default_factory=dict)

    @property
    def spec(self) -> FamilySpec:
        return self.family.spec

    @property
    def primary(self) -> Reference:
        """The reference every cell is judged against."""
        return next(iter(self.references.values()))

    @property
    def others(self) -> list[Reference]:
        """The references besides the primary, each compared with it."""
        return list(self.references.values())[1:]

    def option_values(self, side: str, options: Mapping[str, Any] | None = None,
                      reference: Reference | None = None) -> list[str]:
        """The command-line arguments of the family options ``side``'s command takes, from
        ``options`` (default the section's), the reference side's implementation that of
        ``reference`` (default the primary)."""
        reference = reference or self.primary
        values = {**self.section["options"], **(options or {}), **reference.options,
                  IMPLEMENTATION: reference.implementation}
        return [arg for option in self.spec.options_for(side)
                for arg in option.argv(values[option.name])]

    @property
    def emulated(self) -> list[str]:
        """The weight types of the sweep that get a quantization-aware reference (recipes'
        too; not a mix, whose cells are judged only against the file a tool wrote): the
        reference job dumps each case again as ggml's CPU backend computes with them."""
        return [t for t in self.section["weight_types"] if emulated(t) and t not in MIXES]

    def recipe_file(self, model: str, weight_type: str) -> str | None:
        """The file of the recipe weight type ``<type>+<name>`` of ``model`` names: the
        section's ``recipes.<name>.file``, or the one rule precision searches for; None for a
        plain weight type."""
        base, _, name = weight_type.partition(RECIPE_SEPARATOR)
        if not name:
            return None
        entry = self.section["recipes"][name]
        return entry.get("file") or paths.PRECISION.format(
            family=self.spec.name, model=model, weight_type=weight_type)

    def calibration_cases(self, weight_type: str) -> dict[str, str]:
        """The cases (name -> file) the recipe of ``<type>+<name>`` is searched on (rule
        precision): the recipe entry's ``calibration`` (case names, or how many of the
        sweep's first cases; default :data:`CALIBRATION_CASES`). Every case of the sweep
        verifies it (its cells' row ``recipe``), so the search stays bounded as the sweep
        grows."""
        entry = self.section["recipes"][weight_type.partition(RECIPE_SEPARATOR)[2]]
        chosen = entry.get("calibration", CALIBRATION_CASES)
        names = list(self.cases)[:chosen] if isinstance(chosen, int) else chosen
        return {name: self.cases[name] for name in names}

    def reuses(self, candidate: str) -> bool:
        """Whether the candidate's cases are also run again in one process and compared with
        their fresh runs (rule compare_fresh): the section's ``reuse`` is on and its adapter
        runs several cases in one process."""
        return self.section["reuse"] and self.candidates[candidate].adapter.several_cases

    def weights(self, candidate: str, weight_type: str) -> bool:
        """Whether the candidate's cells of ``weight_type`` map the model's weights converted
        once (rule ggml_weights): the family's own port, where the family converts them, at a
        weight type it makes (a mix is a tool's own)."""
        return (self.candidates[candidate].adapter.family_port and self.spec.converts_weights
                and weight_type not in MIXES)


def emulated(weight_type: str) -> bool:
    """Whether cells of ``weight_type`` (a recipe's ``<type>+<name>`` too, and a mix) are
    compared with a quantization-aware reference."""
    return weight_type.partition(RECIPE_SEPARATOR)[0] in EMULATED_TYPES or weight_type in MIXES


#: How many of the sweep's first cases a recipe is searched on where its entry does not say
#: (``calibration``).
CALIBRATION_CASES = 3
#: The type a recipe's entry keeps its weights in where it does not say (``wide``).
WIDE = "q8_0"


def _check_recipes(plan: FamilyPlan) -> None:
    """Every recipe weight type names a recipe of the section, whose file exists, and a
    searched recipe's calibration names cases of the sweep.

    Raises:
        AudioparityError: the first weight type without its recipe, a missing file, bad
            targets, or a calibration case the sweep lacks.
    """
    family, recipes = plan.spec.name, plan.section.get("recipes", {})
    for weight_type in plan.section["weight_types"]:
        name = weight_type.partition(RECIPE_SEPARATOR)[2]
        if name and name not in recipes:
            raise AudioparityError(f"config {family}.weight_types {weight_type!r}: no recipe "
                                   f"{name!r} in {family}.recipes ({', '.join(recipes) or 'none'})")
    for name, entry in recipes.items():
        if "file" in entry and not os.path.isfile(entry["file"]):
            raise AudioparityError(f"config {family}.recipes {name!r}: {entry['file']} does not "
                                   "exist (audioparity precision writes one)")
        if "targets" in entry:
            try:
                check_targets(plan.spec, entry["targets"])
            except AudioparityError as err:
                raise AudioparityError(f"config {family}.recipes {name!r}: {err}") from None
        calibration = entry.get("calibration")
        unknown = ([case for case in calibration if case not in plan.cases]
                   if isinstance(calibration, list) else [])
        if unknown:
            raise AudioparityError(f"config {family}.recipes {name!r}: calibration case "
                                   f"{unknown[0]!r} is not a case of the sweep "
                                   f"({', '.join(plan.cases)})")
    for weight_type in plan.section["weight_types"]:
        base, _, name = weight_type.partition(RECIPE_SEPARATOR)
        if name and "file" in recipes[name]:
            read_recipe(Path(recipes[name]["file"]), weight_type)
            targets = read_recipe_document(Path(recipes[name]["file"])).get("targets")
            if targets is not None:  # a recipe's own targets: its cells judge them
                targets = targets if isinstance(targets, list) else [targets]
                try:
                    check_targets(plan.spec, targets)
                    target_gates(targets)
                except AudioparityError as err:
                    raise AudioparityError(f"recipe {recipes[name]['file']}: {err}") from None
        elif name and BITS_PER_WEIGHT[wide := recipes[name].get("wide", WIDE)] <= (
                BITS_PER_WEIGHT[base]):
            raise AudioparityError(f"config {family}.recipes {name!r}: wide {wide} is no wider "
                                   f"than {base} (weight type {weight_type})")


def _check_families(config: dict, known: Mapping[str, Family]) -> dict[str, Family]:
    """The swept families, each with its section; their options and every fixture entry
    checked against the specs, defaults filled in (in ``config``)."""
    swept = {}
    for name in config["families"]:
        if name not in known:
            raise AudioparityError(f"config families: unknown family {name!r}; registered: "
                                   f"{', '.join(known)}")
        if name not in config:
            raise AudioparityError(f"config families: {name!r} is listed but has no {name}: "
                                   "section")
        swept[name] = known[name]
    for name, family in swept.items():
        config[name]["options"] = family.spec.check_options(config[name]["options"],
                                                            f"config {name}.options")
    for name, entries in config["fixtures"].items():
        if name not in known:
            raise AudioparityError(f"config fixtures: unknown family {name!r}; registered: "
                                   f"{', '.join(known)}")
        for fixture, entry in entries.items():
            entries[fixture] = known[name].spec.check_options(
                entry, f"config fixtures.{name}.{fixture}", fixture=True)
    return swept


def _backends(family: str, section: Mapping[str, Any]) -> dict[str, Backend]:
    """``{family}.backends``: a ggml backend by its name, or a named setting of one. Names are
    unique and no setting takes another backend's name."""
    settings: dict[str, Backend] = {}
    for entry in section["backends"]:
        entry = {"name": entry, "backend": entry} if isinstance(entry, str) else entry
        name = entry["name"]
        if name in settings:
            raise AudioparityError(f"config {family}.backends: the name {name!r} is used twice")
        if name in BACKENDS and name != entry["backend"]:
            raise AudioparityError(f"config {family}.backends {name!r}: a setting of "
                                   f"{entry['backend']} cannot be named after the {name} "
                                   "backend")
        settings[name] = Backend(name, entry["backend"], dict(entry.get("env", {})))
    return settings


def _check_unmeasured(family: str, section: Mapping[str, Any]) -> None:
    """``{family}.unmeasured_gates`` names lists of the section's ``gates``, each with why
    (:func:`~audioparity.compare.gate_lists.unmeasured_lists`), in one line where it does not."""
    try:
        unmeasured_lists(section)
    except AudioparityError as err:
        raise AudioparityError(f"config {family}.{err}") from None


def fixture_dir(config: Mapping[str, Any], spec: FamilySpec, path: str) -> str | None:
    """The fixture directory ``path`` lies in (results/fixtures/<family>/<name>), or None when
    it is no fixture's. A fixture must be declared in the config, and the path must name its
    model (the spec's ``fixture_model`` inside the directory).

    Raises:
        AudioparityError: under results/fixtures/ but not a declared fixture's model.
    """
    parts = Path(path).parts
    if Path(path).is_absolute() or parts[:2] != tuple(FIXTURES.split("/")):
        return None
    family = spec.name
    if len(parts) < 4 or parts[2] != family or parts[3] not in config["fixtures"].get(family,
                                                                                        {}):
        raise AudioparityError(f"config {family}: {path} is under {FIXTURES}/ but names no "
                               f"fixture the config declares (fixtures: {family}: <name>)")
    folder = "/".join(parts[:4])
    model = spec.fixture_model
    if Path(path) != Path(folder, model):
        raise AudioparityError(f"config {family}: {path} is not the model of fixture {folder}; "
                               f"expected {os.path.join(folder, model) if model else folder}")
    return folder


def _named_paths(config: Mapping[str, Any], plan: FamilyPlan, key: str) -> dict[str, str]:
    """``{name: path}`` of ``{family}.{key}`` (models or cases). Names must be unique; paths
    must exist unless a fixture rule builds them."""
    family = plan.spec.name
    named = {}
    for entry in plan.section[key]:
        name, path = entry["name"], entry["path"]
        if name in named:
            raise AudioparityError(f"config {family}.{key}: the name {name!r} is used twice")
        built = fixture_dir(config, plan.spec, path) if key == "models" else None
        if key == "models":
            plan.fixtures[name] = built
        if not built and not os.path.exists(path):
            raise AudioparityError(f"config {family}.{key} {name!r}: {path} does not exist "
                                   f"(relative paths are read from {os.getcwd()})")
        named[name] = path
    return named


def _known_texts(plan: FamilyPlan) -> dict[str, str]:
    """``{case: text}`` of the cases that give what is said in their audio (``text``); only
    a family whose input is audio takes one."""
    texts = {entry["name"]: entry["text"] for entry in plan.section["cases"] if "text" in entry}
    if texts and plan.spec.input != InputKind.AUDIO:
        raise AudioparityError(f"config {plan.spec.name}.cases {next(iter(texts))!r}: a known "
                               f"text is what is said in an audio case; {plan.spec.name}'s "
                               f"cases are {plan.spec.input}")
    return texts


def _candidate(plan: FamilyPlan, entry: Mapping[str, Any],
               load_adapter: Callable[[str], Any]) -> Candidate:
    """One entry of ``{family}.candidates``: its adapter loaded and serving the family, its
    options checked, its models and weight types the family's, ``replay`` only where the
    family replays."""
    family, spec = plan.spec.name, plan.spec
    where = f"config {family}.candidates {entry['name']!r}"
    try:
        adapter = load_adapter(entry["adapter"])
    except AudioparityError as err:
        raise AudioparityError(f"{where}: {err}") from None
    if family not in adapter.families:
        raise AudioparityError(f"{where}: adapter {adapter.name!r} implements "
                               f"{', '.join(adapter.families)}, not {family}")
    for key, known in (("models", plan.models), ("weight_types", plan.section["weight_types"])):
        unknown = sorted(set(entry.get(key, ())) - set(known))
        if unknown:
            raise AudioparityError(f"{where}: {key} {unknown} are not in {family}.{key}")
    if adapter.family_port:  # the family's options, these overriding the section's
        options = spec.check_options({**plan.section["options"], **entry["options"]},
                                     f"{where}.options")
    else:
        options = adapter.check_options(entry["options"], f"{where}.options")
    replay = entry.get("replay", adapter.replays and spec.replays)
    if replay and not spec.replays:
        raise AudioparityError(f"{where}: replay is set, but family {family} has no replay "
                               "entry point")
    return Candidate(entry["name"], entry["adapter"], adapter, options, bool(replay),
                     list(entry.get("models") or plan.models),
                     list(entry.get("weight_types") or plan.section["weight_types"]))


def _candidates(plan: FamilyPlan, load_adapter: Callable[[str], Any]) -> dict[str, Candidate]:
    candidates: dict[str, Candidate] = {}
    for entry in plan.section["candidates"]:
        if entry["name"] in candidates:
            raise AudioparityError(f"config {plan.spec.name}.candidates: the name "
                                   f"{entry['name']!r} is used twice")
        candidates[entry["name"]] = _candidate(plan, entry, load_adapter)
    return candidates


def alternatives(values: Iterator[str] | list[str]) -> str:
    """A regular expression matching exactly ``values`` (none: nothing)."""
    return "|".join(re.escape(str(v)) for v in sorted(set(values))) or "(?!)"


class Sweep:
    """The config checked into the sweep's plan (module docstring).

    Args:
        config: the workflow's config, validated against config/schema.yaml (defaults
            filled in); family options and fixture entries get their defaults here too.
        known: the registered families (:func:`audioparity.models.registry.registered`).
        load_adapter: finds a candidate's adapter by what its entry names
            (:func:`audioparity.candidates.load_adapter`).

    Raises:
        AudioparityError: the first problem, in one line.
    """

    def __init__(self, config: dict, known: Mapping[str, Family],
                 load_adapter: Callable[[str], Any]) -> None:
        self.config = config
        self.families = {name: FamilyPlan(family, config[name])
                         for name, family in _check_families(config, known).items()}
        for name, plan in self.families.items():
            plan.backends = _backends(name, plan.section)
            _check_unmeasured(name, plan.section)
        for plan in self.families.values():
            plan.models = _named_paths(config, plan, "models")
            plan.cases = _named_paths(config, plan, "cases")
            plan.known_texts = _known_texts(plan)
        for plan in self.families.values():
            _check_recipes(plan)
            plan.candidates = _candidates(plan, load_adapter)
            plan.references = read_references(plan, config)

    def cells(self) -> Iterator[CellKey]:
        """Every cell of the sweep, from the config alone: family x candidate x model x
        backend x weight type x case, against the reference, for a backend other than the
        baseline (where the family sweeps it) against the baseline, and for a candidate that
        :meth:`~FamilyPlan.reuses` against its fresh run (not at a mix, which it makes none
        of); then each reference besides the
        primary against the primary, model x case."""
        for name, plan in self.families.items():
            for reference in plan.others:
                for model in reference.models:
                    for case in plan.cases:
                        yield CellKey(name, model, reference.name, REFERENCE_BACKEND,
                                   REFERENCE_WEIGHT_TYPE, case, plan.primary.name)
            baseline = BASELINE_BACKEND in plan.backends
            for candidate, entry in plan.candidates.items():
                for model in entry.models:
                    for backend in plan.backends:
                        for weight_type in entry.weight_types:
                            for case in plan.cases:
                                cell = CellKey(name, model, candidate, backend, weight_type, case)
                                yield cell
                                if backend != BASELINE_BACKEND and baseline:
                                    yield cell._replace(against=BASELINE_BACKEND)
                                if plan.reuses(candidate) and weight_type not in MIXES:
                                    yield cell._replace(against=FRESH)

    def result(self, cell: CellKey) -> str:
        """The file that holds a cell's result: its compare with the reference; against the
        baseline, the drill-down's rows for the family's own port, else the plain compare;
        against its fresh run, the folder of its model's cases (rule compare_fresh); a
        reference's, its compare with the primary."""
        if cell.backend == REFERENCE_BACKEND:
            return paths.COMPARE_REFERENCE.format(family=cell.family, model=cell.model,
                                                  reference=cell.candidate, case=cell.case)
        if cell.against == "reference":
            return paths.fill(paths.COMPARE, cell._asdict())
        if cell.against == FRESH:  # one folder holds every case of the candidate's cell
            return paths.fill(paths.COMPARE_FRESH, cell._asdict())
        if self.families[cell.family].candidates[cell.candidate].adapter.family_port:
            return paths.fill(paths.DRILLDOWN, cell._asdict())
        return paths.fill(paths.COMPARE_BACKEND, cell._asdict())

    def reference_dirs(self) -> list[str]:
        """The reference job's directory of every model of the sweep (the checkpoints)."""
        return [paths.REFERENCE.format(family=name, model=model)
                for name, plan in self.families.items() for model in plan.models]

    def weights_files(self) -> list[str]:
        """The converted weights of every model, candidate and weight type that maps them."""
        return [paths.WEIGHTS.format(family=name, model=model, candidate=candidate,
                                     weight_type=weight_type)
                for name, plan in self.families.items()
                for candidate, entry in plan.candidates.items()
                for model in entry.models for weight_type in entry.weight_types
                if plan.weights(candidate, weight_type)]

    def reference_plan(self, family: str, digest: Callable[[str], str]) -> str:
        """What each reference job of ``family`` dumps, as the text of its plan file
        (:data:`~.paths.REFERENCE_PLAN`): its cases (name -> path), the content ``digest`` of
        each case's file, and its emulated weight types. The plan is the job's one input for
        its cases, so it reruns when a case is added, moved or edited (not touched), and
        asking for the reference costs a job no pass over every case."""
        plan = self.families[family]
        return json.dumps({"cases": plan.cases, "emulate": plan.emulated,
                           "digests": {name: digest(path) for name, path in plan.cases.items()}},
                          sort_keys=True) + "\n"

    def plan_files(self, digest: Callable[[str], str]) -> dict[str, str]:
        """``{path: text}`` of every reference job's plan (:meth:`reference_plan`)."""
        texts = {name: self.reference_plan(name, digest) for name in self.families}
        return {paths.REFERENCE_PLAN.format(family=name, model=model): texts[name]
                for name, plan in self.families.items() for model in plan.models}

    def constraints(self) -> dict[str, str]:
        """The wildcard constraints: the sweep's own names of each (a case any name, but one
        ending ``.json`` only where the sweep has it, so that a drill-down's folder and its
        ``<case>.json`` never match one path: matching many cases by name would cost every
        path match a pass over them)."""
        plans = self.families.values()
        cases = [case for plan in plans for case in plan.cases]
        json_cases = [case for case in cases if case.endswith(".json")]
        case = rf"{NAME}(?<!\.json)" + (f"|{alternatives(json_cases)}" if json_cases else "")
        return {
            "family": alternatives(self.families),
            "model": alternatives(m for plan in plans for m in plan.models),
            "case": f"(?:{case})",
            "candidate": alternatives(c for plan in plans for c in plan.candidates),
            "reference": alternatives(r.name for plan in plans for r in plan.others),
            "backend": alternatives(b for plan in plans for b in plan.backends),
            "weight_type": alternatives([*WEIGHT_TYPES, *MIXES, *(
                t for plan in plans for t in plan.section["weight_types"])]),
            "name": NAME,
        }
