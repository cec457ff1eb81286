"""Finding an adapter by what a config entry's ``adapter`` names: a shipped adapter's name, a
path to a ``.py`` file of the user's (relative to the working directory), or an entry point of
the group :data:`ENTRY_POINTS` of an installed distribution."""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import importlib.util
import inspect
import sys
from pathlib import Path
from types import ModuleType

from audioparity.candidates.adapter import OUTPUTS, Adapter
from audioparity.contract.errors import AudioparityError
from audioparity.contract.vocabulary import StageKind

#: The entry-point group of adapters that installed distributions provide.
ENTRY_POINTS = "audioparity.adapters"


@functools.cache
def registered() -> dict[str, Adapter]:
    """Every adapter that ships with the tool, by name, each checked (:func:`check_adapter`)."""
    from audioparity.candidates.audioparity import Audioparity
    from audioparity.candidates.command import CommandTool
    from audioparity.candidates.llama_cpp import LlamaCpp
    from audioparity.candidates.openmoss import Openmoss
    from audioparity.candidates.parakeet_dump_cpp import ParakeetDumpCpp
    from audioparity.candidates.transcribe_cpp import TranscribeCpp
    from audioparity.candidates.whisper_cpp import WhisperCpp
    from audioparity.candidates.whisper_cpp_whisper import WhisperCppWhisper

    adapters = [Audioparity(), CommandTool(), TranscribeCpp(), WhisperCpp(), WhisperCppWhisper(),
                ParakeetDumpCpp(), LlamaCpp(), Openmoss()]
    for adapter in adapters:
        check_adapter(adapter, inspect.getfile(type(adapter)))
    return {adapter.name: adapter for adapter in adapters}


def load_adapter(name: str) -> Adapter:
    """The adapter a config entry's ``adapter`` names: a shipped adapter (:func:`registered`),
    a ``.py`` file (a path, relative to the working directory) that defines one
    :class:`Adapter` subclass or instance, or an entry point of the group
    :data:`ENTRY_POINTS` (a subclass, an instance, or a module defining one). Each is loaded
    once and checked (:func:`check_adapter`).

    Raises:
        AudioparityError: nothing of that name, a file that cannot be imported or defines no
            adapter or several, or an adapter that fails its checks (one line: what was given,
            where it was looked for, what was expected).
    """
    shipped = registered()
    if name in shipped:
        return shipped[name]
    if name.endswith(".py") or "/" in name:
        return _from_path(str(Path(name).resolve()), name)
    return _from_entry_point(name, tuple(shipped))


@functools.cache
def _from_path(path: str, given: str) -> Adapter:
    file = Path(path)
    expected = "a .py file that defines one Adapter subclass (docs/candidates.md)"
    if file.suffix != ".py" or not file.is_file():
        what = ("a folder" if file.is_dir() else "not a .py file" if file.exists()
                else "no such file")
        raise AudioparityError(f"adapter {given!r}: {what}: {file} (a path is relative to "
                               f"the working directory {Path.cwd()}); expected {expected}")
    module_name = f"audioparity_adapter_{file.stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as err:  # the user's code: whatever it raises is named in one line
        del sys.modules[module_name]
        raise AudioparityError(f"adapter {given!r}: importing {file} failed: "
                               f"{type(err).__name__}: {' '.join(str(err).split())}") from None
    adapter = _defined_in(module, f"adapter {given!r}: {file}", expected)
    check_adapter(adapter, str(file))
    return adapter


def _from_entry_point(name: str, shipped: tuple[str, ...]) -> Adapter:
    found = importlib.metadata.entry_points(group=ENTRY_POINTS).select(name=name)
    if not found:
        names = sorted(importlib.metadata.entry_points(group=ENTRY_POINTS).names)
        installed = f"; entry points: {', '.join(names)}" if names else ""
        raise AudioparityError(
            f"unknown adapter {name!r}: not one of the shipped adapters ({', '.join(shipped)}), "
            f"not a path to a .py file, and no entry point {name!r} in the group "
            f"{ENTRY_POINTS}{installed}; expected one of these")
    return _load_entry_point(next(iter(found)))


@functools.cache
def _load_entry_point(entry: importlib.metadata.EntryPoint) -> Adapter:
    where = f"adapter {entry.name!r}: entry point {entry.value} ({ENTRY_POINTS})"
    try:
        value = entry.load()
    except Exception as err:  # the user's code
        raise AudioparityError(f"{where}: loading it failed: {type(err).__name__}: "
                               f"{' '.join(str(err).split())}") from None
    if isinstance(value, ModuleType):
        adapter = _defined_in(value, where, "a module that defines one Adapter subclass")
    elif isinstance(value, type) and issubclass(value, Adapter):
        adapter = value()
    elif isinstance(value, Adapter):
        adapter = value
    else:
        raise AudioparityError(f"{where}: a {type(value).__name__}; expected an Adapter "
                               "subclass, an instance of one, or a module defining one")
    check_adapter(adapter, where)
    return adapter


def _defined_in(module: ModuleType, where: str, expected: str) -> Adapter:
    """The one adapter ``module`` defines: an :class:`Adapter` subclass of its own
    (instantiated), or else an instance."""
    classes = [value for value in vars(module).values() if isinstance(value, type)
               and issubclass(value, Adapter) and value.__module__ == module.__name__]
    instances = [value for value in vars(module).values() if isinstance(value, Adapter)]
    if len(classes) == 1:
        return classes[0]()
    if not classes and len(instances) == 1:
        return instances[0]
    found = (f"{len(classes)} Adapter subclasses" if classes
             else f"{len(instances)} Adapter instances" if instances else "no Adapter")
    raise AudioparityError(f"{where}: defines {found}; expected {expected}")


def check_adapter(adapter: Adapter, where: str) -> None:
    """Refuse an adapter whose data do not hold together: no name or title, an output not of
    :data:`OUTPUTS`, reference inputs without reading the reference, ``converts`` without
    :meth:`Adapter.convert`, ``several_cases`` on a third-party port, a printed document
    without :meth:`Adapter.parse` (or a ``tokens`` adapter without one), or a tensor map,
    printed document, input or ``unexposed`` entry naming no stage of a family it implements.

    Raises:
        AudioparityError: one line naming ``where`` and what was expected.
    """
    if not adapter.name or not adapter.title:
        raise AudioparityError(f"{where}: adapter {type(adapter).__name__} has no name or no "
                               "title; expected both")
    label = f"{where}: adapter {adapter.name!r}"
    if adapter.output not in OUTPUTS:
        raise AudioparityError(f"{label}: output {adapter.output!r}; expected one of "
                               f"{', '.join(OUTPUTS)}")
    if adapter.inputs and not adapter.reads_reference:
        raise AudioparityError(f"{label}: inputs {[m.stage for m in adapter.inputs]} from a "
                               "reference it does not read; expected reads_reference = True")
    for data, declared, method in (("converts", adapter.converts, "convert"),
                                   ("printed", adapter.printed is not None, "parse")):
        if declared != adapter.overrides(method):
            defined = "defined" if adapter.overrides(method) else "not defined"
            raise AudioparityError(f"{label}: {data} is {'set' if declared else 'not set'} but "
                                   f"{method} is {defined}; expected both or neither")
    if adapter.several_cases and not adapter.family_port:
        raise AudioparityError(f"{label}: several_cases is set, but only the family's own port "
                               "runs several cases in one process (run takes one case); "
                               "expected several_cases = False")
    if adapter.output == "tokens" and adapter.printed is None:
        raise AudioparityError(f"{label}: output 'tokens' and nothing printed; expected printed, "
                               "the document its tool prints")
    if not adapter.families:
        raise AudioparityError(f"{label}: no families; expected the families it implements")
    for name in adapter.families:
        _check_stages(adapter, label, name)


def _check_stages(adapter: Adapter, label: str, family_name: str) -> None:
    """Refuse a map, printed document, input or ``unexposed`` entry of ``adapter`` that names
    no stage of family ``family_name`` (a printed one, no document stage)."""
    from audioparity.models.registry import family

    try:
        spec = family(family_name).spec
    except AudioparityError as err:
        raise AudioparityError(f"{label}: {err}") from None
    stages = ", ".join(stage.name for stage in spec.stages)
    printed = (adapter.printed,) if adapter.printed is not None else ()
    for mapping in (*adapter.tensors, *printed, *adapter.inputs):
        if spec.locate(mapping.concrete(0)) is None:
            raise AudioparityError(
                f"{label}: TensorMap {mapping.source!r} maps onto {mapping.stage!r}, no stage "
                f"of {family_name}; expected one of {stages}")
    for mapping in printed:
        if spec.locate(mapping.stage).stage.kind != StageKind.DOCUMENT:
            raise AudioparityError(f"{label}: printed maps onto {mapping.stage!r}, not a "
                                   f"document of {family_name}; expected a document stage")
    for mapping in adapter.tensors if adapter.output == "f32json" else ():
        if spec.locate(mapping.concrete(0)).stage.kind == StageKind.DOCUMENT:
            raise AudioparityError(f"{label}: TensorMap {mapping.source!r} maps a .f32 file "
                                   f"onto the document {mapping.stage!r}; expected a document "
                                   "it prints as printed")
    for stage in adapter.unexposed:
        if stage not in {s.name for s in spec.stages}:
            raise AudioparityError(f"{label}: names {stage!r} as unexposed, no stage of "
                                   f"{family_name}; expected one of {stages}")
