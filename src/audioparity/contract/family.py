"""The contract of a model family's code (:class:`Family`: one method per thing a side
computes; :class:`ReferenceLibrary`: one reference implementation) and what a dump method yields
(:data:`Outputs`); its table is :mod:`.spec`. docs/adding-a-family.md walks through writing one;
:mod:`audioparity.dumping.driver` runs every family's code the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import IMPLEMENTATION, REPLAY, WEIGHTS, FamilySpec
from audioparity.contract.vocabulary import SIDES, Side

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
