"""The contract of a model family: its table (:class:`FamilySpec`: stages, options, input) and
its code (:class:`Family`: one method per thing a side computes). docs/adding-a-family.md walks
through writing one; :mod:`audioparity.dumping.driver` runs every family's code the same way.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import INPUT_KINDS, SIDES, STAGE_KINDS, Side, StageKind

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


#: The attribute :func:`runs_in` marks a method with.
RUNS_IN = "runs_in"


def runs_in(*sides: str) -> Callable[[Callable], Callable]:
    """Mark a :class:`Family` method as code the jobs of ``sides`` run (the
    :data:`~audioparity.contract.vocabulary.SIDES`, :data:`WEIGHTS`, :data:`REPLAY`), whence
    :data:`SIDE_METHODS`."""

    def mark(method: Callable) -> Callable:
        setattr(method, RUNS_IN, frozenset(sides))
        return method

    return mark


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
        for index, stage in enumerate(self.stages):
            found = stage.match(name)
            if found is not None:
                return Located(index, stage, *found)
        return None

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


@functools.lru_cache(maxsize=1 << 16)
def natural_key(text: str) -> tuple:
    """Sort key that orders digit runs numerically: ``layer_2`` < ``layer_10``."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text))


@dataclass
class Case:
    """One case (an audio file, a prompt) read and checked for a dump, by either side.

    Attributes:
        model: the model it runs on (a file or a checkpoint directory).
        config: the family's config of that model (:meth:`Family.config`).
        options: the family's options (config ``options``; a candidate entry's).
        path: the case's file.
        data: what the family read of it (an :class:`~audioparity.dumping.audio.Audio`, a prompt).
        notes: lines for the dump's manifest (a resample, a trim to a window).
        fields: manifest fields (``{"audio": the file's format}``).
    """

    model: Path
    config: Any
    options: Mapping[str, Any]
    path: Path
    data: Any
    notes: list[str] = field(default_factory=list)
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Phase:
    """Yielded by a family's dump before the work that computes a stage: ``name`` is that
    stage (or form: ``layer_3_isolated``), the first in pipeline order of those the work
    computes when one pass computes several (one graph: ``conv_out`` for an encoder's taps).
    The driver checks the contract declares it, times the work until the next phase into the
    manifest's ``seconds[name]`` (the summary's ``seconds`` of that stage) and names it as
    running: the stage a crash meanwhile is charged to, the stage a drill-down's graphs are
    labelled with (:meth:`~audioparity.dumping.artifacts.DumpWriter.timed`)."""

    name: str


@dataclass(frozen=True)
class Note:
    """Yielded by a family's dump: one line for the manifest's ``notes``."""

    text: str


@dataclass(frozen=True)
class Fields:
    """Yielded by a family's dump: manifest fields it learns while it runs (the decoding
    settings a reference used)."""

    values: Mapping[str, Any]


@dataclass(frozen=True)
class Skipped:
    """Yielded by a family's replay for a replayed form it cannot compute, with why (the
    candidate lacks its input): the compare reports it ``missing`` with that reason."""

    stage: str
    why: str


#: What a family's dump yields: ``(name, value)`` for a stage (an array for a tensor or logits
#: stage, a mapping for a document) or a document's margins (``<document>_margins``), and
#: :class:`Phase`, :class:`Note`, :class:`Fields`, :class:`Skipped`.
Outputs = Iterator[tuple[str, Any] | Phase | Note | Fields | Skipped]


#: The folder of a family's package that holds its reference implementations, one module
#: each, named after its library (``models/parakeet_tdt/references/nemo.py``).
REFERENCES = "references"


def reference_names(package: str, primary: str) -> tuple[str, ...]:
    """The reference implementations of the family package ``package``: the modules of its
    :data:`REFERENCES` folder, ``primary`` first and the others sorted, found without importing
    them (so without torch).

    Raises:
        ValueError: ``primary`` is not one of them.
    """
    import importlib.util
    import pkgutil

    found = importlib.util.find_spec(f"{package}.{REFERENCES}")
    names = sorted(info.name for info in pkgutil.iter_modules(
        found.submodule_search_locations if found else ()) if not info.name.startswith("_"))
    if primary not in names:
        raise ValueError(f"{package}: no {REFERENCES}/{primary}.py among {names}")
    return (primary, *(name for name in names if name != primary))


class ReferenceLibrary:
    """One reference implementation of a family: a library's run of the model (NeMo,
    transformers, openai-whisper, a checkpoint's remote code), the class of the module
    ``models/<family>/references/<name>.py`` (:func:`reference_names`). As a candidate's
    adapter is all a port adds, this is all another reference adds: :meth:`check` refuses what
    the library cannot run, the constructor loads the model once for every case, and
    :meth:`stages` yields a case's stages (:data:`Outputs`; one the library cannot compute as
    :class:`Skipped`, with why). Its library is imported inside its methods, so :meth:`check`
    runs before torch is.

    Attributes:
        name: the implementation's name (its module's: ``nemo``), a config ``references``
            entry's ``implementation`` and its dumps' ``producer``.
        options: the reference side's option values it was loaded with.
    """

    name: ClassVar[str]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.name = cls.__module__.rpartition(".")[2]

    def __init__(self, model: Path, config: Any, options: Mapping[str, Any]) -> None:
        self.options = options

    @classmethod
    def check(cls, model: Path, config: Any, cases: list[Case], *, emulates: bool) -> None:
        """Refuse, before the library is imported, what it could not run, beyond what the
        family refuses for every implementation (:meth:`Family.check_reference`); ``emulates``:
        a quantization-aware reference is asked of it.

        Raises:
            AudioparityError: one line naming the model or the case.
        """

    @property
    def module(self) -> Any:
        """The torch module the quantization-aware references round, its parameters named as
        the family's port names its weights (:attr:`Family.reference_prefix` before them)."""
        raise NotImplementedError

    def stages(self, case: Case) -> Outputs:
        """The reference's stages of one case, each phase timed by the driver."""
        raise NotImplementedError

    def replay(self, case: Case, candidate: Any) -> Outputs:
        """The reference's blocks on a candidate dump's own inputs (the replayed forms), for
        a family whose stages have them.

        Raises:
            AudioparityError: this implementation has no replay (:meth:`replays`).
        """
        raise AudioparityError(f"replay: the {self.name} reference has no replay")

    @classmethod
    def replays(cls) -> bool:
        """Whether the implementation replays (overrides :meth:`replay`)."""
        return cls.replay is not ReferenceLibrary.replay


@dataclass
class CheckpointWeights:
    """A model's graph weights as its checkpoint holds them, planned from the headers and read
    only when :attr:`blocks` is iterated.

    Attributes:
        shapes: graph name -> the numpy shape the graphs use.
        native: graph name -> the checkpoint's dtype (``f32``, ``f16``, ``bf16``).
        blocks: yields ``(name, first row, rows)`` float arrays, each checked finite, in any
            order, until every row of every weight was given (and whatever else of the
            checkpoint must be checked has been read).
        buffers: host-side arrays the dump reads that are no graph weights (a frontend's
            filterbank).
        close: releases the checkpoint.
    """

    shapes: Mapping[str, tuple[int, ...]]
    native: Mapping[str, str]
    blocks: Any
    buffers: Mapping[str, np.ndarray] = field(default_factory=dict)
    close: Any = lambda: None


class Family:
    """A model family's code: what its fixture builder, reference dump, ggml dump and replay
    compute. Each method's imports are its own (lazy), so the workflow knows which code each
    side runs (:data:`SIDE_METHODS`) and the reference side never imports ggml.

    A dump method (:meth:`ggml`, a reference implementation's
    :meth:`ReferenceLibrary.stages` and :meth:`ReferenceLibrary.replay`) yields its stages
    (:data:`Outputs`); :mod:`audioparity.dumping.driver` opens the model and the runtime, uploads
    the weights, writes the dump, times the phases and checks each stage against :attr:`spec`.
    """

    #: The table: stages, options, input kind (:class:`FamilySpec`).
    spec: ClassVar[FamilySpec]
    #: The distributions whose versions a reference dump's manifest records (those of every
    #: implementation: one not installed is recorded as such).
    reference_versions: ClassVar[tuple[str, ...]] = ("torch", "transformers")
    #: The distributions whose versions a ggml dump's manifest records.
    ggml_versions: ClassVar[tuple[str, ...]] = ("ggml-python",)
    #: Modules of the reference model that the port keeps in float32, left float32 by the
    #: quantization-aware references (:func:`audioparity.dumping.emulation.emulating`).
    reference_keeps: ClassVar[tuple[str, ...]] = ()
    #: What the reference model's parameter names carry before the checkpoint's weight names
    #: (``model.`` for a transformers model whose checkpoint the port reads without it): the
    #: quantization-aware references name each weight as the port does, so recipes and stored
    #: weights match on both sides.
    reference_prefix: ClassVar[str] = ""

    # -- both sides ---------------------------------------------------------------------------

    @runs_in(Side.REFERENCE, Side.GGML, WEIGHTS, REPLAY)
    def config(self, model: Path) -> Any:
        """The model's config, read without torch or ggml.

        Raises:
            AudioparityError: unreadable or unsupported.
        """
        raise NotImplementedError

    @runs_in(Side.REFERENCE, Side.GGML, REPLAY)
    def open_case(self, model: Path, config: Any, path: Path, options: Mapping[str, Any]
                  ) -> Case:
        """Read and check one case's file as both sides do, with the same message.

        Raises:
            AudioparityError: unreadable or unusable (too short, a prompt with a bad field).
        """
        raise NotImplementedError

    @runs_in(Side.REFERENCE, Side.GGML, REPLAY)
    def heads(self, config: Any) -> tuple[str, ...]:
        """The output heads of this model (:attr:`Stage.head`); () for a family without."""
        return ()

    @runs_in(Side.REFERENCE, Side.GGML, REPLAY)
    def manifest_fields(self, config: Any, options: Mapping[str, Any]) -> dict[str, Any]:
        """Manifest fields of either side's dump beyond the driver's (which records the cell,
        the case's fields and the side's options): ``n_layers``."""
        return {}

    @runs_in(Side.FIXTURE)
    def fixture(self, output: Path, *, seed: int, **options: Any) -> None:
        """Build a tiny seeded model at ``output`` (:attr:`FamilySpec.fixture_model`)."""
        raise NotImplementedError

    # -- the reference side -------------------------------------------------------------------

    @runs_in(Side.REFERENCE)
    def check_reference(self, model: Path, config: Any, cases: list[Case], *,
                        emulates: bool) -> None:
        """Refuse, before torch is imported, what no reference implementation could run: the
        checkpoint's tensors (present, shaped, finite), the memory the cases need
        (:meth:`ReferenceLibrary.check` adds an implementation's own).

        Raises:
            AudioparityError: one line naming the model or the case.
        """

    def library(self, options: Mapping[str, Any]) -> type[ReferenceLibrary]:
        """The class of the reference implementation ``options`` name (:data:`IMPLEMENTATION`,
        default the primary): the one :class:`ReferenceLibrary` of its module.

        Raises:
            AudioparityError: an implementation the family does not have, or a module with
                other than one such class.
        """
        import importlib

        name = options.get(IMPLEMENTATION, self.spec.references[0])
        if name not in self.spec.references:
            raise AudioparityError(f"--{IMPLEMENTATION} {name}: {self.spec.name} has "
                                   f"{', '.join(self.spec.references)}")
        module = importlib.import_module(f"{type(self).__module__}.{REFERENCES}.{name}")
        found = [value for value in vars(module).values() if isinstance(value, type)
                 and issubclass(value, ReferenceLibrary) and value.__module__ == module.__name__]
        if len(found) != 1:
            raise AudioparityError(f"{module.__file__}: defines {len(found)} ReferenceLibrary "
                                   "classes; expected one")
        return found[0]

    def load_reference(self, model: Path, config: Any, options: Mapping[str, Any]
                       ) -> ReferenceLibrary:
        """The reference implementation ``options`` name (:meth:`library`), its model loaded
        once for every case."""
        return self.library(options)(model, config, options)

    # -- the ggml side ------------------------------------------------------------------------

    @runs_in(Side.REFERENCE, Side.GGML, WEIGHTS)
    def weights(self, model: Path, config: Any) -> CheckpointWeights:
        """The model's graph weights, planned from the checkpoint's headers.

        Raises:
            AudioparityError: unreadable, a missing tensor, a shape other than the config's.
        """
        raise NotImplementedError

    @runs_in(Side.REFERENCE, Side.GGML, WEIGHTS)
    def weight_kind(self, name: str, shape: tuple[int, ...]) -> str:
        """How graph weight ``name`` is stored: :data:`MATMUL` (in the cell's weight type),
        :data:`FLOAT32`, or the name of the option that gives its storage type."""
        raise NotImplementedError

    @runs_in(Side.GGML)
    def ggml(self, runtime: Any, weights: Any, case: Case, reference: Any) -> Outputs:
        """The port's stages of one case on ``runtime``, with the uploaded ``weights`` and the
        reference dump (None unless :attr:`FamilySpec.ggml_reads_reference`)."""
        raise NotImplementedError

    def export_seed(self, dump: Any, folder: Path) -> list[str]:
        """The seed tool's inputs of a dump, written into ``folder``; the files' names.

        Raises:
            AudioparityError: the family has no seed tool.
        """
        raise AudioparityError(f"family {self.spec.name} has no seed tool to export to")


#: The methods each side's job runs, besides the driver: the code a job depends on is what
#: these import (docs/design.md, "Reruns"); read from :class:`Family`'s marks (:func:`runs_in`).
SIDE_METHODS: dict[str, tuple[str, ...]] = {
    side: tuple(name for name, member in vars(Family).items()
                if side in getattr(member, RUNS_IN, ()))
    for side in (*SIDES, WEIGHTS, REPLAY)}


def implements(family: Family, method: str) -> bool:
    """Whether ``family`` overrides :class:`Family`'s ``method`` (an optional one)."""
    return getattr(type(family), method) is not getattr(Family, method)
