"""Model families declare themselves: each package under :mod:`audioparity.models` exports one
:class:`FamilySpec` named ``SPEC`` (data: names, stages, options, entry points), and everything
that serves every family (the CLI, the workflow's rules, the compare and the report) reads it
from :func:`registered`. docs/adding-a-family.md walks through writing one.
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from audioparity.errors import AudioparityError
from audioparity.vocabulary import INPUT_KINDS, SIDES, STAGE_KINDS

#: The placeholder of a per-layer stage name: ``layer_{i}`` is ``layer_0``, ``layer_1``, ...
LAYER = "{i}"

def match_name(pattern: str, name: str) -> tuple[bool, int | None]:
    """Whether ``name`` is ``pattern`` with its :data:`LAYER` placeholder (if any) a layer
    number, and that number: ``("layer_{i}", "layer_3")`` -> ``(True, 3)``,
    ``("enc_out", "enc_out")`` -> ``(True, None)``."""
    found = re.fullmatch(re.escape(pattern).replace(re.escape(LAYER), r"(\d+)"), name)
    if found is None:
        return False, None
    return True, int(found.group(1)) if found.groups() else None


def concrete(pattern: str, layer: int | None) -> str:
    """``pattern`` for layer ``layer`` (``layer_{i}``, 3 -> ``layer_3``); itself when it has no
    :data:`LAYER` or ``layer`` is None."""
    return pattern if layer is None else pattern.replace(LAYER, str(layer))


#: The forms of a stage, in report order: the stage itself (``""``), its teacher-forced form
#: (the candidate's block on the reference's input) and its replayed form (the reference's
#: block on the candidate's input); :class:`Stage`.
FORMS = ("", "isolated", "replayed")

#: The optional entry point of a family: the reference replaying a candidate's blocks.
REPLAY = "replay"
#: The optional entry point that converts a model's weights once per weight type into a file
#: its ggml dumps map (``save_weights(model, output, weight_type, **options)``).
WEIGHTS = "weights"


@dataclass(frozen=True)
class Stage:
    """One stage of a family's dump contract (docs/design.md, "Dump contract").

    Attributes:
        name: the tensor or document name both sides dump; ``layer_{i}`` stands for one stage
            per layer (``layer_0``, ``layer_1``, ...).
        kind: ``tensor`` (a ``.npy``) or ``document`` (a ``.json``).
        layout: a tensor's axes in the reference's notation, batch dropped (``[T, D]``); a
            document's fields (``{ids, frames, durations, text}``).
        description: what it holds, for the docs and ``--help``.
        isolated: the name of its teacher-forced form, dumped by the ggml side only and compared
            against this stage: the block run alone on the reference's input
            (``layer_{i}_isolated``, ``decoder_replay``); None when it has none.
        replayed: the name of its replayed form, written by the family's ``replay`` entry point
            for a candidate without isolated forms: the reference's block run on the
            candidate's own input to it (``layer_{i}_replayed``: NeMo's layer i on the
            candidate's layer i-1), compared against the candidate's stage; None when the
            reference cannot replay it.
        head: for a family whose models have different output heads (Parakeet's transducer
            and CTC decoders), the head the stage belongs to; a dump holds every stage of each
            head its model has and none of another (None: every model has the stage).
        reference_path: its rows follow the reference's own decisions (Parakeet's joint rows
            along the reference's greedy path), so it has no distance from another reference
            that decided otherwise: a quantized cell's cost (``cost_*``) is left empty.
    """

    name: str
    kind: str
    layout: str
    description: str
    isolated: str | None = None
    replayed: str | None = None
    head: str | None = None
    reference_path: bool = False

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage {self.name!r}: kind {self.kind!r}; expected one of "
                             f"{', '.join(STAGE_KINDS)}")

    def match(self, name: str) -> tuple[int | None, str] | None:
        """``(layer number or None, form)`` when ``name`` is this stage (form ``""``) or one of
        its :data:`FORMS` (``layer_3_replayed`` -> ``(3, "replayed")``), else None."""
        for form in FORMS:
            pattern = getattr(self, form) if form else self.name
            if pattern is None:
                continue
            matched, layer = match_name(pattern, name)
            if matched:
                return layer, form
        return None

    def concrete(self, layer: int | None) -> str:
        """This stage's name for layer ``layer`` (the name itself when it is not per layer)."""
        return concrete(self.name, layer)


@dataclass(frozen=True)
class Option:
    """A family-specific setting: a key of the family's config section (``options``) and a flag
    of the commands of the sides that take it.

    Attributes:
        name: the config key (``conv_weight_type``); the flag is ``--conv-weight-type``.
        default: its value when the config does not set it (``bool`` makes a flag without value).
        help: one line for ``--help`` and the docs.
        sides: the commands that take it (:data:`~audioparity.vocabulary.SIDES`, and
            :data:`WEIGHTS` for one the weight conversion takes).
        choices: the values allowed (empty: any of the default's type).
        minimum: the least value of an integer option.
    """

    name: str
    default: bool | int | float | str
    help: str
    sides: tuple[str, ...] = ("ggml",)
    choices: tuple = ()
    minimum: int | None = None

    def __post_init__(self) -> None:
        if not set(self.sides) <= {*SIDES, WEIGHTS}:
            raise ValueError(f"option {self.name!r}: sides {self.sides}; expected some of "
                             f"{(*SIDES, WEIGHTS)}")

    @property
    def flag(self) -> str:
        """The command-line flag, ``--`` and the name with dashes."""
        return "--" + self.name.replace("_", "-")

    def schema(self) -> dict[str, Any]:
        """The JSON Schema of the option's config value (its default included)."""
        kind = {bool: "boolean", int: "integer", float: "number", str: "string"}[
            type(self.default)]
        schema: dict[str, Any] = {"type": kind, "default": self.default,
                                  "description": self.help}
        if self.choices:
            schema["enum"] = list(self.choices)
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        return schema

    def argv(self, value: bool | int | float | str) -> list[str]:
        """The option's command-line arguments for ``value`` (a flag alone for true)."""
        if isinstance(self.default, bool):
            return [self.flag] if value else []
        return [self.flag, str(value)]


@dataclass(frozen=True)
class FamilySpec:
    """What the tool knows of a model family: data, read by the CLI, the rules, the compare
    and the report; the family's own code is reached only through :attr:`entry_points`.

    Attributes:
        name: the family package's name, its config section and the ``family`` column of
            summary.csv (``parakeet_tdt``).
        command: its subcommand of ``audioparity fixture|reference|ggml`` (``parakeet-tdt``).
        title: one line naming the model and the reference it is checked against.
        input: what a case is, :data:`~audioparity.vocabulary.INPUT_KINDS`: ``audio`` (a file
            soundfile reads, flag ``--audio``) or ``prompt`` (a JSON file, ``--prompt``).
        model: what ``--model`` takes, for ``--help``.
        stages: the dump contract, in pipeline order (summary and report rows follow it).
        entry_points: ``{side: "module:function"}`` for ``fixture``, ``reference`` and ``ggml``,
            and optionally :data:`REPLAY` and :data:`WEIGHTS` (signatures in
            docs/adding-a-family.md).
        options: family-specific settings (config section ``options``, command flags).
        fixture_model: where a fixture's model lies inside its directory (``model.nemo``); ""
            when the directory is the model (a checkpoint directory).
        ggml_reads_reference: the ggml dump takes the reference dump (``--reference-dir``) for
            its teacher-forced stages.
    """

    name: str
    command: str
    title: str
    input: str
    model: str
    stages: tuple[Stage, ...]
    entry_points: dict[str, str]
    options: tuple[Option, ...] = ()
    fixture_model: str = ""
    ggml_reads_reference: bool = False

    def __post_init__(self) -> None:
        if self.input not in INPUT_KINDS:
            raise ValueError(f"family {self.name!r}: input {self.input!r}; expected one of "
                             f"{', '.join(INPUT_KINDS)}")
        if not set(SIDES) <= set(self.entry_points) <= {*SIDES, REPLAY, WEIGHTS}:
            raise ValueError(f"family {self.name!r}: entry_points {sorted(self.entry_points)}; "
                             f"expected {list(SIDES)} and optionally {REPLAY!r}, {WEIGHTS!r}")
        if any(stage.replayed for stage in self.stages) != (REPLAY in self.entry_points):
            raise ValueError(f"family {self.name!r}: stages with a replayed form need a "
                             f"{REPLAY!r} entry point, and it needs them")

    @property
    def input_flag(self) -> str:
        """The flag that names a case's file: ``--audio`` or ``--prompt``."""
        return f"--{self.input}"

    def options_for(self, side: str) -> tuple[Option, ...]:
        """The options the command of ``side`` takes."""
        return tuple(option for option in self.options if side in option.sides)

    def options_schema(self, fixture: bool = False) -> dict[str, Any]:
        """The JSON Schema of the config's ``options`` object of the family (the options of its
        reference and ggml dumps), or with ``fixture`` of a fixture's entry (``seed`` and the
        fixture builder's options): each option's type, choices and default; nothing else."""
        options = [o for o in self.options if ("fixture" in o.sides) == fixture]
        properties = {option.name: option.schema() for option in options}
        if fixture:
            properties["seed"] = {"type": "integer", "minimum": 0, "default": 0,
                                  "description": "seed of the weights"}
        return {"type": "object", "additionalProperties": False, "properties": properties}

    def check_options(self, values: Any, where: str, fixture: bool = False) -> dict[str, Any]:
        """``values`` (a config ``options`` object, or a fixture's entry with ``fixture``)
        checked against :meth:`options_schema`, with the defaults of the options it omits.

        Raises:
            AudioparityError: a value of another type or outside the choices, or an unknown key
                (one line naming ``where``, the key and what was expected).
        """
        import jsonschema

        schema = self.options_schema(fixture)
        error = jsonschema.exceptions.best_match(
            jsonschema.Draft202012Validator(schema).iter_errors(values))
        if error is not None:
            key = "".join(f"[{part!r}]" for part in error.absolute_path)
            raise AudioparityError(f"{where}{key}: {error.message}")
        defaults = {name: option["default"] for name, option in schema["properties"].items()}
        return {**defaults, **values}

    def locate(self, name: str) -> tuple[int, Stage, int | None, str] | None:
        """``(index, stage, layer, form)`` of a concrete stage name (``layer_3_isolated``
        -> the ``layer_{i}`` stage, 3, ``"isolated"``), or None when the contract has no such
        stage."""
        for index, stage in enumerate(self.stages):
            found = stage.match(name)
            if found is not None:
                return (index, stage, *found)
        return None

    def reference_stage(self, name: str) -> str:
        """The reference stage a candidate stage compares against: an isolated form's stage
        (``layer_3_isolated`` -> ``layer_3``, ``decoder_replay`` -> ``decode``), any other name
        itself."""
        found = self.locate(name)
        if found is None or not found[3]:
            return name
        _, stage, layer, _ = found
        return stage.concrete(layer)

    def stage_key(self, name: str) -> tuple:
        """Pipeline-order sort key of a stage name: the contract's order, layers by number, a
        stage's isolated and replayed forms right after it; names the contract lacks after all
        of them, in natural order."""
        found = self.locate(name)
        if found is None:
            return (len(self.stages), natural_key(name), False)
        index, _, layer, form = found
        return (index, (layer if layer is not None else -1,), FORMS.index(form))

    def entry_point(self, side: str) -> Callable[..., Any]:
        """The function of ``side`` (:attr:`entry_points`), imported now (it may import torch,
        NeMo or ggml)."""
        module, _, function = self.entry_points[side].partition(":")
        return getattr(importlib.import_module(module), function)


def natural_key(text: str) -> tuple:
    """Sort key that orders digit runs numerically: ``layer_2`` < ``layer_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


@functools.cache
def registered() -> dict[str, FamilySpec]:
    """Every family: the ``SPEC`` of each package under :mod:`audioparity.models`, by name.

    Raises:
        AudioparityError: a package without a :class:`FamilySpec` ``SPEC``, or one whose name
            differs from its package's, or two with the same command.
    """
    import audioparity.models as models

    specs: dict[str, FamilySpec] = {}
    for info in sorted(pkgutil.iter_modules(models.__path__), key=lambda i: i.name):
        if not info.ispkg:
            continue
        module = importlib.import_module(f"{models.__name__}.{info.name}")
        spec = getattr(module, "SPEC", None)
        if not isinstance(spec, FamilySpec) or spec.name != info.name:
            raise AudioparityError(f"{module.__file__}: a family package exports SPEC, a "
                                   f"FamilySpec named {info.name!r}")
        if any(other.command == spec.command for other in specs.values()):
            raise AudioparityError(f"{module.__file__}: command {spec.command!r} is taken")
        specs[spec.name] = spec
    return specs


def family(name: str) -> FamilySpec:
    """The spec of family ``name``.

    Raises:
        AudioparityError: no family of that name (the message lists the registered ones).
    """
    specs = registered()
    if name not in specs:
        hint = next((f" ({spec.name!r} is the family of the command {name!r})"
                     for spec in specs.values() if spec.command == name), "")
        raise AudioparityError(f"unknown family {name!r}; registered: {', '.join(specs)}{hint}")
    return specs[name]


def _form_of(stage: str) -> tuple[str, int]:
    """``(stage, form index)`` of a name by the suffix convention ``<stage>_<form>``
    (:data:`FORMS`), for a family this install does not know (a summary or dumps from
    elsewhere)."""
    for index, form in enumerate(FORMS[1:], 1):
        suffix = f"_{form}"
        if stage.endswith(suffix) and stage != suffix:
            return stage.removesuffix(suffix), index
    return stage, 0


def stage_key(family_name: str, stage: str) -> tuple:
    """:meth:`FamilySpec.stage_key` of a family's stage; for a family not registered here,
    natural order with layer numbers numeric and ``<stage>_isolated``, ``<stage>_replayed``
    after ``<stage>``."""
    spec = registered().get(family_name)
    if spec is not None:
        return spec.stage_key(stage)
    base, form = _form_of(stage)
    return (0, natural_key(base), form)


def reference_stage(family_name: str | None, stage: str) -> str:
    """:meth:`FamilySpec.reference_stage` of a family's stage; for a family not registered here,
    ``<stage>_isolated`` and ``<stage>_replayed`` belong to ``<stage>``, any other name is its
    own."""
    spec = registered().get(family_name or "")
    if spec is not None:
        return spec.reference_stage(stage)
    return _form_of(stage)[0]


def on_reference_path(family_name: str | None, stage: str) -> bool:
    """Whether a family's stage follows the reference's own decisions (:attr:`Stage.
    reference_path`); False for a stage or family not registered here."""
    spec = registered().get(family_name or "")
    found = spec.locate(stage) if spec is not None else None
    return found is not None and found[1].reference_path


def isolated_form(family_name: str | None, stage: str) -> str | None:
    """The isolated (teacher-forced) form of a family's stage (``layer_3`` ->
    ``layer_3_isolated``, ``decode`` -> ``decoder_replay``), None when the stage has none, is
    itself a form, or the family is not registered here."""
    spec = registered().get(family_name or "")
    found = spec.locate(stage) if spec is not None else None
    if found is None or found[3] or found[1].isolated is None:
        return None
    return concrete(found[1].isolated, found[2])


def replayed_form(family_name: str | None, stage: str) -> str | None:
    """The replayed form of a family's stage (``layer_3`` -> ``layer_3_replayed``), None when
    the stage has none, is itself a form, or the family is not registered here."""
    spec = registered().get(family_name or "")
    found = spec.locate(stage) if spec is not None else None
    if found is None or found[3] or found[1].replayed is None:
        return None
    return concrete(found[1].replayed, found[2])
