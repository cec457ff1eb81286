"""A model family's table (:class:`FamilySpec`): its stages (:class:`Stage`, in pipeline order,
each with its forms, :class:`Form`), its options (:class:`Option`) and its input; read by every
part that names a stage. Its code is :mod:`.family`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, NamedTuple

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import INPUT_KINDS, SIDES, STAGE_KINDS, StageKind

#: The placeholder of a per-layer stage name: ``layer_{i}`` is ``layer_0``, ``layer_1``, ...
LAYER = "{i}"

class Form(StrEnum):
    """The forms of a stage, in report order: the stage itself (``""``), its teacher-forced
    form (the candidate's block on the reference's input) and its replayed form (the
    reference's block on the candidate's input); :meth:`Stage.pattern`."""

    STAGE = ""
    ISOLATED = "isolated"
    REPLAYED = "replayed"


FORMS = tuple(Form)

#: The last layer of a per-layer stage, in :attr:`Stage.inputs` (``layer_{last}``: the last
#: encoder layer feeds ``enc_out``); :data:`PREVIOUS` the previous one, and after ``|`` what the
#: first layer takes instead (``layer_{i-1}|pre_encode``).
LAST, PREVIOUS = "{last}", "{i-1}"

#: The side that writes a model's weights once per weight type for the ggml dumps to map.
WEIGHTS = "weights"
#: The side that replays a candidate's blocks in the reference (:meth:`ReferenceLibrary.replay`).
REPLAY = "replay"

#: The reference side's option naming its implementation (:attr:`FamilySpec.implementation`).
IMPLEMENTATION = "implementation"

#: What :meth:`Family.weight_kind` returns for a tensor stored in the cell's weight type
#: (``native``: the checkpoint's dtype), and for one always stored in float32. Any other kind
#: is the name of a family option whose value is the storage type (``conv_weight_type``).
MATMUL, FLOAT32 = "matmul", "f32"


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


class StageName(StrEnum):
    """A family's stage names, declared once: one subclass per family, beside its spec, whose
    members are the names its spec's stages and forms are written with (``layer_{i}`` for a
    per-layer stage, :data:`LAYER`) and the names its code yields and reads."""

    def at(self, layer: int) -> str:
        """This name for layer ``layer`` (``layer_{i}``, 3 -> ``layer_3``)."""
        return concrete(self.value, layer)

    @property
    def previous(self) -> str:
        """In :attr:`Stage.inputs`: the previous layer's (``layer_{i}`` -> ``layer_{i-1}``)."""
        return self.value.replace(LAYER, PREVIOUS)

    @property
    def last(self) -> str:
        """In :attr:`Stage.inputs`: the last layer's (``layer_{i}`` -> ``layer_{last}``)."""
        return self.value.replace(LAYER, LAST)

    def __repr__(self) -> str:
        """The name quoted as the string it is, so a message names a stage as ``'decode'``
        (check-dump's ``missing stage 'decode'``), not ``<Names.DECODE: 'decode'>``."""
        return repr(self.value)


@dataclass(frozen=True)
class Stage:
    """One stage of a family's dump contract (docs/design.md, "Dump contract").

    Attributes:
        name: the tensor or document name both sides dump; ``layer_{i}`` stands for one stage
            per layer (``layer_0``, ``layer_1``, ...).
        kind: :data:`~audioparity.contract.vocabulary.STAGE_KINDS`: ``tensor`` (a ``.npy``),
            ``logits`` (a ``.npy`` whose last axis is classes: top-1 and KL are measured too) or
            ``document`` (a ``.json``).
        layout: a tensor's axes in the reference's notation, batch dropped (``[T, D]``); a
            document's fields (``{ids, frames, durations, text}``).
        description: what it holds, for the docs and ``--help``.
        isolated: the name of its teacher-forced form, dumped by the ggml side only and compared
            against this stage: the block run alone on the reference's input
            (``layer_{i}_isolated``, ``decoder_replay``); None when it has none.
        replayed: the name of its replayed form, written by the family's replay for a
            candidate without isolated forms: the reference's block run on the candidate's own
            input to it (``layer_{i}_replayed``), compared against the candidate's stage; None
            when the reference cannot replay it.
        head: for a family whose models have different output heads (Parakeet's transducer
            and CTC decoders), the head the stage belongs to; a dump holds every stage of each
            head its model has and none of another (None: every model has the stage).
        reference_path: its rows follow the reference's own decisions (Parakeet's joint rows
            along the reference's greedy path), so it has no distance from another reference
            that decided otherwise: a quantized cell's cost (``cost_*``) is left empty.
        margins: a document's decision margins, the layout of its auxiliary tensor
            ``<name>_margins`` (``[positions]``); "" when it has none.
        inputs: the stages whose values it is computed from, in the data flow of the
            candidate's own pipeline: ``layer_{i-1}|pre_encode`` is the previous layer (the
            first layer's input after ``|``), ``layer_{last}`` the last layer. Its isolated and
            replayed forms take them from the reference, or the candidate's are the reference
            block's inputs: a failing input explains the stage, never its forms (the culprits,
            :mod:`audioparity.report.culprit`).
        parts: the stages that check a piece of its own computation on the reference's inputs
            (the prediction network's state for a transducer decode): a failing part explains
            the stage and its forms.
        reference_inputs: its inputs in a reference's own pipeline, where they are not
            ``inputs`` (None: they are): a stage the candidate computes on the reference's
            values (Parakeet's joint along the reference's greedy path, on the reference's
            ``enc_out``) is computed by another reference from its own (``("enc_out",)``), so
            that reference's comparison with the primary names what differs upstream, not
            the joint it feeds.
    """

    name: str
    kind: str
    layout: str
    description: str
    isolated: str | None = None
    replayed: str | None = None
    head: str | None = None
    reference_path: bool = False
    margins: str = ""
    inputs: tuple[str, ...] = ()
    parts: tuple[str, ...] = ()
    reference_inputs: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.kind not in STAGE_KINDS:
            raise ValueError(f"stage {self.name!r}: kind {self.kind!r}; expected one of "
                             f"{', '.join(STAGE_KINDS)}")
        if self.margins and self.kind != StageKind.DOCUMENT:
            raise ValueError(f"stage {self.name!r}: only a document has margins")

    def match(self, name: str) -> tuple[int | None, str] | None:
        """``(layer number or None, form)`` when ``name`` is this stage (form ``""``) or one of
        its :data:`FORMS` (``layer_3_replayed`` -> ``(3, "replayed")``), else None."""
        for form in FORMS:
            pattern = self.pattern(form)
            if pattern is None:
                continue
            matched, layer = match_name(pattern, name)
            if matched:
                return layer, form
        return None

    def pattern(self, form: str) -> str | None:
        """The name pattern of this stage's ``form`` (:class:`Form`): its own name, or its
        isolated or replayed form's (None where it has none)."""
        return {Form.STAGE: self.name, Form.ISOLATED: self.isolated,
                Form.REPLAYED: self.replayed}[Form(form)]

    def concrete(self, layer: int | None) -> str:
        """This stage's name for layer ``layer`` (the name itself when it is not per layer)."""
        return concrete(self.name, layer)


class Located(NamedTuple):
    """A concrete stage name found in a contract (:meth:`FamilySpec.locate`)."""

    index: int
    stage: Stage
    layer: int | None
    form: str

    @property
    def base(self) -> str:
        """The stage this name is a form of, for its layer (``layer_3_isolated`` ->
        ``layer_3``)."""
        return self.stage.concrete(self.layer)

    def form_name(self, form: str) -> str | None:
        """The name of this stage's ``form`` for its layer (None when it has none)."""
        pattern = self.stage.pattern(form)
        return None if pattern is None else concrete(pattern, self.layer)


@dataclass(frozen=True)
class Option:
    """A family-specific setting: a key of the family's config section (``options``) and a flag
    of the commands of the sides that take it.

    Attributes:
        name: the config key (``conv_weight_type``); the flag is ``--conv-weight-type``.
        default: its value when the config does not set it (``bool`` makes a flag without value).
        help: one line for ``--help`` and the docs.
        sides: the commands that take it (:data:`~audioparity.contract.vocabulary.SIDES`, and
            :data:`WEIGHTS` for one the weight conversion takes).
        choices: the values allowed (empty: any of the default's type).
        minimum: the least value of an integer option.
        implementations: the reference implementations it applies to (empty: all); another
            is refused a value other than the default.
        nullable: whether null is a value of it (a config's ``null``, the flag's ``null``;
            ``preemph: null``: no pre-emphasis).
    """

    name: str
    default: bool | int | float | str
    help: str
    sides: tuple[str, ...] = ("ggml",)
    choices: tuple = ()
    minimum: int | None = None
    implementations: tuple[str, ...] = ()
    nullable: bool = False

    #: How a null value reads on the command line.
    NULL = "null"

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
        schema: dict[str, Any] = {"type": [kind, "null"] if self.nullable else kind,
                                  "default": self.default, "description": self.help}
        if self.choices:
            schema["enum"] = [*self.choices, *([None] if self.nullable else [])]
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        return schema

    def argv(self, value: bool | int | float | str) -> list[str]:
        """The option's command-line arguments for ``value`` (a flag alone for true)."""
        if isinstance(self.default, bool):
            return [self.flag] if value else []
        return [self.flag, self.NULL if value is None else str(value)]


@dataclass(frozen=True)
class FamilySpec:
    """What the tool knows of a model family, as data: read by the CLI, the workflow, the
    compare and the report without importing the family's code.

    Attributes:
        name: the family package's name, its config section and the ``family`` column of
            summary.csv (``parakeet_tdt``).
        command: its subcommand of ``audioparity fixture|reference|ggml`` (``parakeet-tdt``).
        title: one line naming the model and the reference it is checked against.
        input: what a case is, :data:`~audioparity.contract.vocabulary.INPUT_KINDS`: ``audio`` (a
            file soundfile reads, flag ``--audio``) or ``prompt`` (a JSON file, ``--prompt``).
        model: what ``--model`` takes, for ``--help``.
        stages: the dump contract, in pipeline order (summary and report rows follow it).
        options: family-specific settings (config section ``options``, command flags).
        fixture_model: where a fixture's model lies inside its directory (``model.nemo``); ""
            when the directory is the model (a checkpoint directory).
        ggml_reads_reference: the ggml dump takes the reference dump (``--reference-dir``) for
            its teacher-forced stages.
        converts_weights: the ggml dumps map the model's weights converted once per weight
            type (:data:`WEIGHTS`).
        references: the reference implementations the family can dump with (a config
            ``references`` entry's ``implementation``, the reference dump's ``producer``), the
            default primary first: the modules of the family's :data:`REFERENCES` folder
            (:func:`reference_names`), each one :class:`ReferenceLibrary`.
    """

    name: str
    command: str
    title: str
    input: str
    model: str
    stages: tuple[Stage, ...]
    options: tuple[Option, ...] = ()
    fixture_model: str = ""
    ggml_reads_reference: bool = False
    converts_weights: bool = True
    references: tuple[str, ...] = ("torch",)
    #: :meth:`locate`'s answers by name (the report locates every row of a summary).
    _located: dict[str, Located | None] = field(default_factory=dict, init=False, repr=False,
                                                compare=False)

    def __post_init__(self) -> None:
        if not self.references:
            raise ValueError(f"family {self.name!r}: no reference implementation")
        if self.input not in INPUT_KINDS:
            raise ValueError(f"family {self.name!r}: input {self.input!r}; expected one of "
                             f"{', '.join(INPUT_KINDS)}")

    @property
    def input_flag(self) -> str:
        """The flag that names a case's file: ``--audio`` or ``--prompt``."""
        return f"--{self.input}"

    @property
    def replays(self) -> bool:
        """Whether a stage has a replayed form (the primary reference implements
        :meth:`ReferenceLibrary.replay`)."""
        return any(stage.replayed for stage in self.stages)

    @property
    def implementation(self) -> Option:
        """The option that picks the reference implementation (``--implementation``): every
        reference-side command takes it; the workflow sets it from a ``references`` entry, so
        the family's config ``options`` do not."""
        return Option(IMPLEMENTATION, self.references[0], "the reference implementation (a "
                      "config references entry's implementation)", sides=("reference",),
                      choices=self.references)

    def check_implementation_options(self, values: Mapping[str, Any], where: str) -> None:
        """Refuse an option set, away from its default, for a reference implementation it does
        not apply to (:attr:`Option.implementations`; ``values`` holds the implementation).

        Raises:
            AudioparityError: one line naming ``where``, the option and its implementations.
        """
        implementation = values.get(IMPLEMENTATION, self.references[0])
        for option in self.options_for("reference"):
            if (option.implementations and implementation not in option.implementations
                    and values.get(option.name, option.default) != option.default):
                raise AudioparityError(
                    f"{where}: {option.flag} {values[option.name]} is an option of the "
                    f"{' and '.join(option.implementations)} reference, not of "
                    f"{implementation}")

    def options_for(self, side: str) -> tuple[Option, ...]:
        """The options the command of ``side`` takes (the reference side's
        :attr:`implementation` last)."""
        found = tuple(option for option in self.options if side in option.sides)
        return (*found, self.implementation) if side == "reference" else found

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

    def carries(self, source: str, name: str) -> bool:
        """Whether the concrete stage ``name`` carries ``source``'s error end to end: a tensor
        or logits stage (not a form) whose ``inputs`` reach ``source`` through the contract
        (``mel_features`` -> ``pre_encode``, ``layer_3``, ``enc_out``, ``decode_logits``); a
        stage fed the reference's own inputs (``reference_inputs``) or none does not."""
        reached = {source.split("{")[0]}
        for stage in self.stages:
            if {part.split("{")[0] for entry in stage.inputs for part in entry.split("|")} \
                    & reached:
                reached.add(stage.name.split("{")[0])
        found = self.locate(name)
        return (found is not None and not found.form and found.stage.kind != StageKind.DOCUMENT
                and found.stage.name.split("{")[0] in reached - {source.split("{")[0]})

    def locate(self, name: str) -> Located | None:
        """Where a concrete stage name is in the contract (``layer_3_isolated`` -> the
        ``layer_{i}`` stage, layer 3, form ``isolated``), or None when it has no such stage."""
        if name not in self._located:
            self._located[name] = next(
                (Located(index, stage, *found) for index, stage in enumerate(self.stages)
                 if (found := stage.match(name)) is not None), None)
        return self._located[name]

    def stage_kind(self, name: str) -> str | None:
        """The kind of a concrete stage name (:class:`StageKind`), None when the contract has
        no such stage."""
        found = self.locate(name)
        return found.stage.kind if found is not None else None

    def on_reference_path(self, name: str) -> bool:
        """Whether a concrete stage name follows the reference's own decisions
        (:attr:`Stage.reference_path`); False when the contract has no such stage."""
        found = self.locate(name)
        return found is not None and found.stage.reference_path

    def form_of(self, name: str, form: str) -> str | None:
        """The ``isolated`` or ``replayed`` form of a concrete stage name (``layer_3`` ->
        ``layer_3_isolated``, ``decode`` -> ``decoder_replay``), None when the stage has none
        or is itself a form."""
        found = self.locate(name)
        return None if found is None or found.form else found.form_name(form)

    def stage(self, name: str) -> Stage:
        """The stage (not a form) of that name (``layer_{i}``, ``enc_out``).

        Raises:
            KeyError: the contract has no such stage.
        """
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise KeyError(f"family {self.name}: no stage {name!r}")

    def stages_of(self, heads: Iterable[str]) -> tuple[Stage, ...]:
        """The stages a model with these output ``heads`` has (those of no head, and its
        heads')."""
        heads = set(heads)
        return tuple(stage for stage in self.stages if stage.head is None or stage.head in heads)

    def reference_stage(self, name: str) -> str:
        """The reference stage a candidate stage compares against: an isolated form's stage
        (``layer_3_isolated`` -> ``layer_3``, ``decoder_replay`` -> ``decode``), any other name
        itself."""
        found = self.locate(name)
        return found.base if found is not None and found.form else name

    def stage_key(self, name: str) -> tuple:
        """Pipeline-order sort key of a stage name: the contract's order, layers by number, a
        stage's isolated and replayed forms right after it; names the contract lacks after all
        of them, in natural order."""
        found = self.locate(name)
        if found is None:
            return (len(self.stages), natural_key(name), False)
        layer = found.layer if found.layer is not None else -1
        return (found.index, (layer,), FORMS.index(found.form))

    def flow(self, names: Iterable[str], reference: bool = False
             ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """``{name: (inputs, parts)}`` of concrete stage names (:attr:`Stage.inputs`,
        :attr:`Stage.parts`), the layer placeholders resolved against the layers ``names``
        holds (``layer_{last}``: the highest ``layer_N``); a form (``layer_3_isolated``) has
        no inputs and its stage's parts. Names the contract lacks have neither. With
        ``reference``, the data flow of a reference's own pipeline
        (:attr:`Stage.reference_inputs`)."""
        names = list(names)
        last: dict[str, int] = {}
        for name in names:
            found = self.locate(name)
            if found is not None and found.layer is not None:
                last[found.stage.name] = max(found.layer, last.get(found.stage.name, -1))

        def resolve(pattern: str, layer: int | None) -> str | None:
            previous, _, first = pattern.partition("|")
            if PREVIOUS in previous:
                if layer is None or layer == 0:
                    return first or None
                return previous.replace(PREVIOUS, str(layer - 1))
            if LAST in previous:
                top = last.get(previous.replace(LAST, LAYER))
                return None if top is None else previous.replace(LAST, str(top))
            return concrete(previous, layer)

        found_flow = {}
        for name in names:
            found = self.locate(name)
            if found is None:
                found_flow[name] = ((), ())
                continue
            declared = found.stage.inputs
            if reference and found.stage.reference_inputs is not None:
                declared = found.stage.reference_inputs
            inputs = () if found.form else tuple(
                dict.fromkeys(n for p in declared if (n := resolve(p, found.layer))))
            parts = tuple(n for p in found.stage.parts if (n := resolve(p, found.layer)))
            found_flow[name] = (inputs, parts)
        return found_flow


@dataclass(frozen=True)
class UnknownFamily:
    """The stage names of a family this install does not know (a summary from elsewhere), read
    by the suffix convention ``<stage>_<form>`` (:data:`FORMS`); answers what
    :class:`FamilySpec` does of its names, with nothing located."""

    name: str
    #: None is known.
    stages: ClassVar[tuple[Stage, ...]] = ()

    @staticmethod
    def _form_of(name: str) -> tuple[str, int]:
        """``(stage, form index)`` of a name by the suffix convention."""
        for index, form in enumerate(FORMS[1:], 1):
            suffix = f"_{form}"
            if name.endswith(suffix) and name != suffix:
                return name.removesuffix(suffix), index
        return name, 0

    def locate(self, name: str) -> None:
        """Nothing: no stage is known."""
        return None

    def stage_kind(self, name: str) -> None:
        """Nothing: no stage's kind is known (a dump's file says whether it is a tensor)."""
        return None

    def on_reference_path(self, name: str) -> bool:
        """False: no stage is known to follow the reference's decisions."""
        return False

    def form_of(self, name: str, form: str) -> None:
        """Nothing: no stage is known to have forms."""
        return None

    def reference_stage(self, name: str) -> str:
        """``<stage>_isolated`` and ``<stage>_replayed`` belong to ``<stage>``, any other name
        is its own."""
        return self._form_of(name)[0]

    def stage_key(self, name: str) -> tuple:
        """Natural order, layer numbers numeric, a stage's forms right after it."""
        base, form = self._form_of(name)
        return (0, natural_key(base), form)

    def flow(self, names: Iterable[str], reference: bool = False
             ) -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
        """The pipeline read as a chain: each stage's input is the stage before it in
        :meth:`stage_key` order; a form has none, and no stage has parts."""
        names = list(names)
        bases = sorted({self._form_of(name)[0] for name in names}, key=self.stage_key)
        before = dict(zip(bases[1:], bases[:-1], strict=True))
        return {name: ((before[name],) if name in before else (), ()) for name in names}


#: What the compare and the report read of a family's stage names: its spec, or the suffix
#: convention for a family this install does not know.
AnySpec = FamilySpec | UnknownFamily


@functools.lru_cache(maxsize=1 << 16)
def natural_key(text: str) -> tuple:
    """Sort key that orders digit runs numerically: ``layer_2`` < ``layer_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))
