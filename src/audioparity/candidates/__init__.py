"""Candidates: implementations judged against the reference. An adapter says how to build, feed,
run and read one kind of candidate: data (an :class:`Adapter` named ``ADAPTER``) plus a few small
functions, in one module of this package; a candidate is a config entry naming an adapter and its
options (docs/candidates.md). :func:`registered` finds the adapters.

An adapter module defines, besides ``ADAPTER``:

- ``run(model, case, output, *, spec, family_options, options, weight_type, backend, threads,
  reference)``: the candidate's commands for one cell, in order, each ``(argv, environment
  additions)``; they write their raw output into ``output`` (a folder) or on stdout;
- ``prepare(reference, folder, *, options)`` (optional): files its commands read from the
  reference dump, written into ``folder`` (the seeds' ``--nemo-dir`` wants rank-3 tensors);
  ``run`` then gets that folder as ``reference``;
- ``convert(model, weight_type, output, *, options)`` (when ``ADAPTER.converts``): the commands
  that write the candidate's own model files into the folder ``output``, once per model and
  weight type;
- ``inputs(options)`` (optional): the files its jobs depend on, when they are not its
  :class:`Port`'s products under the option ``root`` (:meth:`Adapter.port_files`);
- ``parse(stdout, stderr, model, options=...)`` (optional): ``(name, document)``, a document the
  candidate printed (its decode).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
import re
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from audioparity.errors import AudioparityError
from audioparity.families import Option, concrete, family, match_name

#: How a candidate hands over what it computed: our dump contract (``dump``), transcribe.cpp's
#: ``<name>.f32`` + ``<name>.json`` files (``f32json``), ``<name>.npy`` and ``<name>.json``
#: files without a manifest (``npy``, the seeds' tools), or only a decode it prints
#: (``tokens``).
OUTPUTS = ("dump", "f32json", "npy", "tokens")


@dataclass(frozen=True)
class TensorMap:
    """A tensor (or JSON document) a candidate writes, and the stage of the family's contract it
    is.

    Attributes:
        source: the candidate's name (``enc.block.{i}.out``, ``{i}`` a layer index), or several
            names stacked along a new axis 1 per layer (``("dec.lstm.{i}.h.0",
            "dec.lstm.{i}.c.0")`` makes ``[layers, 2, H]``).
        stage: the stage (``layer_{i}``).
        layout: the candidate's axes when they are the stage's transposed (``[n_mels, T]`` for a
            stage ``[T, n_mels]``); "" when they are the stage's.
        drop_frames: frames the candidate keeps beyond the reference's, dropped from the end
            before comparing (a convention, named in ``why``).
        view: what of the stage the candidate's tensor holds, applied to the reference before
            the two are compared: ``("row", k)`` (row k only), ``("log_softmax",)`` (over the
            last axis, all classes together).
        omits: fields of a document stage the candidate does not write (the seeds'
            ``decoder_tokens.json`` has no ``text``): left out of the comparison, and named in
            the cell's reason.
        why: the convention behind ``drop_frames``, ``view`` or ``omits``, one line for the
            cell's reason.
    """

    source: str | tuple[str, ...]
    stage: str
    layout: str = ""
    drop_frames: int = 0
    view: tuple[tuple, ...] = ()
    omits: tuple[str, ...] = ()
    why: str = ""

    def sources(self) -> tuple[str, ...]:
        return self.source if isinstance(self.source, tuple) else (self.source,)

    def match(self, name: str) -> tuple[int, int | None] | None:
        """``(index in sources, layer or None)`` when ``name`` is one of this map's sources."""
        for index, source in enumerate(self.sources()):
            matched, layer = match_name(source, name)
            if matched:
                return index, layer
        return None

    def concrete(self, layer: int | None) -> str:
        """The stage a file of layer ``layer`` maps onto (``layer_3`` for ``layer_{i}``)."""
        return concrete(self.stage, layer)


#: The file a port's Vulkan build leaves in its tree (``build_ports(..., vulkan=True)``).
VULKAN_MARK = ".vulkan"


@dataclass(frozen=True)
class Port:
    """How to build a port from a source snapshot (a ``.tar.gz`` of its repository).

    Attributes:
        archive: the snapshot's file name pattern in the ports folder (``transcribe.cpp-*.tar.gz``);
            for a ``download``, its source package's file name by default (the package's name
            normalized as the package index names source files, PEP 625: ``llama-cpp-python==
            0.3.36`` gives ``llama_cpp_python-0.3.36.tar.gz``).
        commands: argv lists run in the unpacked tree, in order (``{jobs}``: parallel jobs).
        products: files the build must leave, relative to the tree (the binaries).
        vulkan: CMake arguments that add the Vulkan backend to the first command (the
            configure step), for ``make ports`` after ``make setup-vulkan``; empty: none.
        vulkan_patch: a patch (``-p1``, in ``candidates/patches/``) the Vulkan build applies to
            the unpacked tree first, kept outside the snapshot.
        download: a source package on the package index (``name==version``) fetched into the
            cache (``pip download --no-binary :all:``) when the ports folder has no
            ``archive``; ``download_sha256`` is the file's digest, checked.
        drivers: files of ``candidates/drivers/`` (ours, against the port's public API) copied
            into the tree's ``drivers/`` before the commands run; they are part of the tree's
            key, so editing one rebuilds.
        vendors: ``(adapter, folder, destination)``: the folder of another port's source
            archive unpacked into the tree at ``destination`` before the commands run (a
            submodule the snapshot leaves empty); that archive is part of the tree's key.
    """

    commands: tuple[tuple[str, ...], ...]
    products: tuple[str, ...]
    archive: str = ""
    vulkan: tuple[str, ...] = ()
    vulkan_patch: str | None = None
    download: str | None = None
    download_sha256: str | None = None
    drivers: tuple[str, ...] = ()
    vendors: tuple[tuple[str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.archive and self.download:
            name, _, version = self.download.partition("==")
            normalized = re.sub(r"[-_.]+", "_", name).lower()
            object.__setattr__(self, "archive", f"{normalized}-{version}.tar.gz")
        if not self.archive:
            raise ValueError("Port: an archive pattern, or a download to name it, is required")


@dataclass(frozen=True)
class Adapter:
    """What the tool knows of one kind of candidate (module docstring).

    Attributes:
        name: the module's name and a candidate entry's ``adapter``.
        title: one line naming the implementation.
        families: the families it implements.
        output: how it hands over what it computed (:data:`OUTPUTS`).
        weight_types, backends: the cells it can compute; others get an ``unavailable`` dump
            saying so.
        options: settings of a candidate entry (``options``): paths, a profile, ...
        tensors: how the files it writes map onto the family's stages (``f32json``, ``npy``).
        unmapped: names of files it writes that no stage of the contract holds (sub-block taps,
            ``{i}`` a layer): kept under ``raw/``, named in the dump's notes as not compared; a
            file neither mapped nor declared here is a problem (``audioparity check-dump``).
        converts: it needs its own model files, made by ``convert`` once per model and weight
            type.
        reads_reference: its commands read the reference dump of the case (``prepare``, or a
            ``{reference}`` field).
        inputs: stages of the reference dump it takes as its input (llama.cpp is fed the
            reference's ``input_embeddings``): ``unavailable`` in its cells, saying so.
        family_port: it is the family's own ggml port (``audioparity ggml <family>``): its
            cells run the family's ``ggml`` entry point, and read the reference when the spec
            says so (``ggml_reads_reference``).
        replays: by default the reference replays its blocks (``audioparity replay``): for a
            candidate whose dump holds the stages but no isolated forms.
        port: how ``make ports`` builds it, for a third-party port; None for ours.
        notes: what a reader of its cells should know (conventions, limits), one line each.
    """

    name: str
    title: str
    families: tuple[str, ...]
    output: str
    weight_types: tuple[str, ...]
    backends: tuple[str, ...] = ("cpu",)
    options: tuple[Option, ...] = ()
    tensors: tuple[TensorMap, ...] = ()
    unmapped: tuple[str, ...] = ()
    converts: bool = False
    reads_reference: bool = False
    inputs: tuple[str, ...] = ()
    family_port: bool = False
    replays: bool = True
    port: Port | None = None
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.output not in OUTPUTS:
            raise ValueError(f"adapter {self.name!r}: output {self.output!r}; expected one of "
                             f"{', '.join(OUTPUTS)}")
        if self.inputs and not self.reads_reference:
            raise ValueError(f"adapter {self.name!r}: inputs {list(self.inputs)} from a reference "
                             "it does not read (reads_reference)")

    def check_options(self, values: Any, where: str) -> dict[str, Any]:
        """``values`` (a candidate entry's ``options``) checked, with the defaults filled in.

        Raises:
            AudioparityError: an unknown key or a value of another type (one line).
        """
        if not isinstance(values, dict):
            raise AudioparityError(f"{where}: expected an object of options")
        known = {option.name: option for option in self.options}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise AudioparityError(f"{where}: unknown option(s) {unknown} of adapter "
                                   f"{self.name!r}; valid: {sorted(known)}")
        for name, value in values.items():
            kind = type(known[name].default)
            if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
                raise AudioparityError(f"{where}[{name!r}]: {value!r}; expected "
                                       f"{kind.__name__}")
            if known[name].choices and value not in known[name].choices:
                raise AudioparityError(f"{where}[{name!r}]: {value!r}; expected one of "
                                       f"{', '.join(map(str, known[name].choices))}")
        return {**{name: option.default for name, option in known.items()}, **values}

    def port_files(self, options: dict[str, Any]) -> list[str]:
        """The built port's files its jobs depend on (:attr:`Port.products` under the option
        ``root``), so that rebuilding the port reruns its conversions and cells; [] without a
        port."""
        if self.port is None:
            return []
        return [str(Path(options["root"]) / product) for product in self.port.products]

    def declares_unmapped(self, name: str) -> bool:
        """Whether ``name`` is one of the files it declares :attr:`unmapped`."""
        return any(match_name(pattern, name)[0] for pattern in self.unmapped)

    def tensor_map(self, name: str) -> tuple[TensorMap, int, int | None] | None:
        """``(map, index in its sources, layer)`` of a tensor the candidate wrote, or None."""
        for mapping in self.tensors:
            found = mapping.match(name)
            if found is not None:
                return (mapping, *found)
        return None


@functools.cache
def _modules() -> dict[str, ModuleType]:
    modules = {}
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda i: i.name):
        module = importlib.import_module(f"{__name__}.{info.name}")
        adapter = getattr(module, "ADAPTER", None)
        if isinstance(adapter, Adapter):
            if adapter.name != info.name:
                raise AudioparityError(f"{module.__file__}: ADAPTER is named {adapter.name!r}, "
                                       f"not {info.name!r}")
            _check_stages(adapter, module.__file__)
            modules[adapter.name] = module
    return modules


def _check_stages(adapter: Adapter, where: str) -> None:
    """Raise unless every stage the adapter's tensor maps name is a stage (or a form of one) of
    each family it implements."""
    for name in adapter.families:
        spec = family(name)
        for mapping in adapter.tensors:
            if spec.locate(mapping.concrete(0)) is None:
                raise AudioparityError(
                    f"{where}: TensorMap {mapping.source!r} maps onto {mapping.stage!r}, no stage "
                    f"of {name}; expected one of {', '.join(s.name for s in spec.stages)}")


def registered() -> dict[str, Adapter]:
    """Every adapter: the ``ADAPTER`` of each module of this package, by name."""
    return {name: module.ADAPTER for name, module in _modules().items()}


def adapter_module(name: str) -> ModuleType:
    """The module of adapter ``name`` (its functions: module docstring).

    Raises:
        AudioparityError: no adapter of that name (the message lists them).
    """
    modules = _modules()
    if name not in modules:
        raise AudioparityError(f"unknown adapter {name!r}; registered: {', '.join(modules)}")
    return modules[name]
