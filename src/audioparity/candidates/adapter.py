"""The adapter protocol: :class:`Adapter`, the base class of every port adapter, and the data it
declares (:class:`TensorMap`, :class:`Port`). docs/candidates.md walks through writing one."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import LAYER, FamilySpec, Option, concrete, match_name
from audioparity.dumping.storage import matrix_shape
from audioparity.dumping.weight_files import StoredTensor

#: How a candidate hands over what it computed: our dump contract (``dump``), transcribe.cpp's
#: ``<name>.f32`` + ``<name>.json`` files (``f32json``), ``<name>.npy`` and ``<name>.json``
#: files without a manifest (``npy``, the seeds' tools), or only a decode it prints
#: (``tokens``).
OUTPUTS = ("dump", "f32json", "npy", "tokens")

#: The file a port's Vulkan build leaves in its tree (``build_ports(..., vulkan=True)``).
VULKAN_MARK = ".vulkan"

#: One command of a candidate: its argv, and the environment variables it gets on top of the
#: ``audioparity`` process's own.
Command = tuple[list[str], dict[str, str]]


@dataclass(frozen=True)
class ToolCall:
    """One cell of a candidate, as its adapter's commands are made for it (:meth:`Adapter.run`).

    Attributes:
        model: the folder :meth:`Adapter.convert` wrote (the model of the config, for an
            adapter that converts nothing).
        case: the case's file (audio or prompt).
        output: the folder its commands write their raw output into.
        spec: the family's table.
        family_options: the family's options (the config section's).
        options: the entry's options, checked against the adapter's.
        weight_type, backend, threads: the cell's.
        reference: what :meth:`Adapter.prepare` gave (by default the case's reference dump), or
            None.
    """

    model: Path
    case: Path
    output: Path
    spec: FamilySpec
    family_options: Mapping[str, Any]
    options: Mapping[str, Any]
    weight_type: str
    backend: str
    threads: int
    reference: Path | None


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


@dataclass(frozen=True)
class WeightName:
    """A tensor of a port's model file and the checkpoint's weight it holds (its adapter's
    weight map, :attr:`Adapter.weights`).

    Attributes:
        source: its name in the port's file, ``{i}`` a layer
            (``enc.blocks.{i}.ff1.linear1.weight``).
        checkpoint: the checkpoint's name of that weight, ``{i}`` the same layer
            (``encoder.layers.{i}.feed_forward1.linear1.weight``).
        gates: where the port keeps the checkpoint's rows in groups of another order: group k
            of the port's rows holds the checkpoint's group ``gates[k]`` (whisper.cpp's LSTM,
            ``(0, 1, 3, 2)``: torch's gates i, f, g, o as i, f, o, g); () for the same order.
        offset: the checkpoint's ``{i}`` is the port's plus this (openmoss's
            ``moss.audio_head.{i}`` is the checkpoint's ``lm_heads.{i+1}``).
    """

    source: str
    checkpoint: str
    gates: tuple[int, ...] = ()
    offset: int = 0

    def __post_init__(self) -> None:
        if self.gates and sorted(self.gates) != list(range(len(self.gates))):
            raise ValueError(f"WeightName {self.source}: gates {self.gates} is no permutation")
        if (LAYER in self.source) != (LAYER in self.checkpoint):
            raise ValueError(f"WeightName {self.source}: {LAYER} on one side only")

    def port_name(self, weight: str) -> str | None:
        """The port's name of checkpoint weight ``weight`` where this map names it, else
        None."""
        matched, layer = match_name(self.checkpoint, weight)
        if not matched:
            return None
        return concrete(self.source, None if layer is None else layer - self.offset)

    def checkpoint_tensor(self, tensor: StoredTensor) -> StoredTensor | None:
        """``tensor`` of the port's file as this checkpoint weight, its rows in the
        checkpoint's order (bytes moved whole rows at a time: ggml stores each row on its
        own); None when ``tensor`` is not this map's."""
        matched, layer = match_name(self.source, tensor.name)
        if not matched:
            return None
        data = tensor.data
        if self.gates and data is not None:
            rows = matrix_shape(tensor.shape)[0]
            if rows % len(self.gates):
                raise AudioparityError(f"{tensor.name}: {rows} rows do not split into "
                                       f"{len(self.gates)} gates")
            groups = np.asarray(data).reshape(len(self.gates), -1)
            data = np.concatenate([groups[self.gates.index(j)] for j in range(len(self.gates))])
        return StoredTensor(concrete(self.checkpoint, None if layer is None
                                     else layer + self.offset), tensor.shape, tensor.type, data)


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
        patches: patches (``-p1``; a path, or a name in ``candidates/patches/``) every build
            of it applies to the unpacked tree first, part of the tree's key (a test's port
            with a fault planted in its source).
        download: a source package on the package index (``name==version``) fetched into the
            cache (``pip download --no-binary :all:``) when the ports folder has no
            ``archive``; ``download_sha256`` is the file's digest, checked.
        drivers: files of ``candidates/drivers/`` (ours, against the port's public API) copied
            into the tree's ``drivers/`` before the commands run; they are part of the tree's
            key, so editing one rebuilds.
        vendors: ``(adapter, folder, destination)``: the folder of another port's source
            archive unpacked into the tree at ``destination`` before the commands run (a
            submodule the snapshot leaves empty); that archive is part of the tree's key.
        assets: ``(package, sha256, folder, destination)``: a source package of the package
            index (``name==version``, fetched once into the cache as ``download`` is, without
            its dependencies, and checked against ``sha256``) whose ``folder`` is unpacked
            into the tree at ``destination`` before the commands run (data files a converter
            reads: whisper.cpp's wants ``whisper/assets/mel_filters.npz`` of OpenAI's
            ``openai-whisper``); its digest is part of the tree's key.
    """

    commands: tuple[tuple[str, ...], ...]
    products: tuple[str, ...]
    archive: str = ""
    vulkan: tuple[str, ...] = ()
    vulkan_patch: str | None = None
    patches: tuple[str, ...] = ()
    download: str | None = None
    download_sha256: str | None = None
    drivers: tuple[str, ...] = ()
    vendors: tuple[tuple[str, str, str], ...] = ()
    assets: tuple[tuple[str, str, str, str], ...] = ()

    def __post_init__(self) -> None:
        if not self.archive and self.download:
            object.__setattr__(self, "archive", source_file(self.download))
        if not self.archive:
            raise ValueError("Port: an archive pattern, or a download to name it, is required")


def source_file(package: str) -> str:
    """The file name of the source package ``name==version`` on the package index: the name
    normalized as PEP 625 says (``llama-cpp-python==0.3.36`` gives
    ``llama_cpp_python-0.3.36.tar.gz``)."""
    name, _, version = package.partition("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}.tar.gz"


class _EveryFamily:
    """The value of :attr:`Adapter.families` for an adapter that serves every registered family
    (:data:`EVERY_FAMILY`), read when asked (the families register after the adapters load)."""

    def __get__(self, adapter: Adapter | None, owner: type) -> tuple[str, ...]:
        from audioparity.models.registry import registered

        return tuple(registered())


#: :attr:`Adapter.families` of an adapter that serves every registered family.
EVERY_FAMILY = _EveryFamily()


def ggml_flags(spec: FamilySpec, values: Mapping[str, Any]) -> list[str]:
    """The family's ggml options as ``audioparity ggml`` flags, each from ``values``."""
    return [arg for option in spec.options_for("ggml") for arg in option.argv(values[option.name])]


class Adapter:
    """One kind of candidate: how to build, feed, run and read it (docs/candidates.md). A
    subclass declares the data below as class attributes and overrides the methods its port
    needs; :func:`~audioparity.candidates.load_adapter` hands out an instance. Keyword
    arguments of the constructor override the class's data (one instance, another setting).

    Attributes:
        name: the adapter's name: a registered adapter's is what a config entry's ``adapter``
            names; a user's adapter's is named in messages and manifests.
        title: one line naming the implementation.
        families: the families it implements (its tensor maps must name their stages).
        output: how it hands over what it computed (:data:`OUTPUTS`).
        weight_types, backends: the cells it can compute; others get an ``unavailable`` dump
            saying so (:meth:`cannot_run`).
        options: settings of a candidate entry (``options``): paths, a profile, ...
        tensors: how the files it writes map onto the family's stages (``f32json``, ``npy``).
        unmapped: names of files it writes that no stage of the contract holds (sub-block taps,
            ``{i}`` a layer): kept under ``raw/``, named in the dump's notes as not compared; a
            file neither mapped nor declared here is a problem (``audioparity check-dump``).
        printed: the document its tool prints (on stdout or stderr) rather than writes: a map
            from the name it prints it under to its stage (its ``omits`` and ``why`` as for a
            file); :meth:`parse` reads it. None: it prints none.
        unexposed: ``{stage: why}``: stages of its families it does not expose, and why, for
            the cells' reasons (:meth:`unavailable`).
        converts: it needs its own model files, made by :meth:`convert` once per model and
            weight type.
        reads_reference: its commands read the reference dump of the case (:meth:`prepare`,
            or a ``{reference}`` field).
        inputs: stages of the reference dump it takes as its input (llama.cpp is fed the
            reference's ``input_embeddings``), each a map from the file its tool reads
            (:meth:`prepare` writes it) to the reference's stage: ``unavailable`` in its cells,
            saying so.
        family_port: it is the family's own ggml port: its cells run the family's ggml dump
            through :func:`audioparity.dumping.driver.dump_ggml`, in the ``audioparity`` process.
        several_cases: its candidate runs several cases in one process (the runtime, the
            weights and whatever it keeps between cases reused), so the workflow checks each
            case run again there against its fresh run (:mod:`audioparity.compare.reuse`). Only the
            family's own port: :meth:`run` takes one case, and the shipped third-party tools,
            as their adapters drive them, take one input per run.
        replays: by default the reference replays its blocks (``audioparity replay``): for a
            candidate whose dump holds the stages but no isolated forms.
        port: how ``make ports`` builds it, for a third-party port; None for ours.
        notes: what a reader of its cells should know (conventions, limits), one line each.
        unquantized: regular expressions (each matching a whole name) of the 2-D tensors of its
            model file that its quantizer leaves as converted by design (positional tables and
            biases, a depthwise kernel): not matmul weights it was asked to quantize, so never a
            fallback (:meth:`requested_type`).
        weights: its weight map: which checkpoint weight each tensor of its model file holds
            (:class:`WeightName`); a tensor it does not name keeps its own name. A
            quantized cell's reference computes with the file's bytes through it (the
            storage-matched reference) and its quantizer is judged weight by weight.
    """

    name: str = ""
    title: str = ""
    families: tuple[str, ...] = ()
    output: str = "dump"
    weight_types: tuple[str, ...] = ()
    backends: tuple[str, ...] = ("cpu",)
    options: tuple[Option, ...] = ()
    tensors: tuple[TensorMap, ...] = ()
    unmapped: tuple[str, ...] = ()
    printed: TensorMap | None = None
    unexposed: Mapping[str, str] = {}
    converts: bool = False
    reads_reference: bool = False
    inputs: tuple[TensorMap, ...] = ()
    family_port: bool = False
    several_cases: bool = False
    replays: bool = True
    port: Port | None = None
    notes: tuple[str, ...] = ()
    unquantized: tuple[str, ...] = ()
    weights: tuple[WeightName, ...] = ()

    #: The data a constructor's keyword arguments may set.
    FIELDS = ("name", "title", "families", "output", "weight_types", "backends", "options",
              "tensors", "unmapped", "printed", "unexposed", "converts", "reads_reference",
              "inputs", "family_port", "several_cases", "replays", "port", "notes",
              "unquantized", "weights")

    def __init__(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(self.FIELDS))
        if unknown:
            raise TypeError(f"Adapter: unknown field(s) {unknown}; expected some of "
                            f"{', '.join(self.FIELDS)}")
        for key, value in fields.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} adapter {self.name!r}>"

    # -- what the tool asks of it -----------------------------------------------------------

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

    def files(self, options: Mapping[str, Any]) -> list[str]:
        """The files its jobs depend on, so that rebuilding the port reruns its conversions and
        cells: by default its :attr:`Port.products` under the option ``root``; [] without a
        port."""
        if self.port is None:
            return []
        return [str(self.root(options) / product) for product in self.port.products]

    def cannot_run(self, options: Mapping[str, Any], weight_type: str, backend: str
                   ) -> str | None:
        """Why it cannot compute a cell of ``weight_type`` on ``backend`` (the cell's
        ``unavailable`` dump says so), or None when it can: by default, a weight type or
        backend it does not declare."""
        missing = [f"{what} {value}" for what, value, known in (
            ("weight type", weight_type, self.weight_types), ("backend", backend, self.backends))
            if value not in known]
        if not missing:
            return None
        return (f"{self.title} has no {' or '.join(missing)} here (it runs "
                f"{', '.join(self.weight_types)} on {', '.join(self.backends)})")

    def unavailable(self, stage: str) -> str | None:
        """Why it exposes nothing of ``stage`` (a stage of the family's spec), for the cell's
        reason, or None when its author gives none (the cell then says it "does not expose
        it"): by default its :attr:`unexposed` entry, or for a stage of :attr:`inputs`, that it
        takes the stage from the reference."""
        if any(mapping.stage == stage for mapping in self.inputs):
            return f"{self.title} takes it from the reference as its input"
        why = self.unexposed.get(stage)
        return f"{self.title} does not expose it: {why}" if why else None

    # -- its commands -------------------------------------------------------------------------

    def convert(self, model: Path, weight_type: str, output: Path, *,
                options: Mapping[str, Any]) -> list[list[str]]:
        """The commands that write its own model files for ``model`` at ``weight_type`` into
        the folder ``output`` (when :attr:`converts`).

        Raises:
            AudioparityError: it converts nothing.
        """
        raise AudioparityError(f"adapter {self.name!r} converts no model")

    def prepare(self, reference: Path | None, folder: Path, *, options: Mapping[str, Any]
                ) -> Path | None:
        """What :meth:`run` gets as ``reference``: by default the reference dump of the case
        itself; an adapter whose tool wants other files writes them from the dump into the new
        folder ``folder`` and returns it."""
        return reference

    def run(self, call: ToolCall) -> list[Command]:
        """Its commands for one cell (:class:`ToolCall`), in order; they write their raw output
        into the folder ``call.output`` or on stdout.

        Raises:
            AudioparityError: it runs no commands of its own (the family's port).
        """
        raise AudioparityError(f"adapter {self.name!r} has no commands to run")

    def parse(self, stdout: str, stderr: str, model: Path | None, *,
              options: Mapping[str, Any]) -> dict:
        """The document the candidate printed (:attr:`printed`: its decode) from its commands'
        stdout and stderr. ``model`` is what :meth:`run` got; None when ``check-dump`` reads a
        raw folder, which has none: the parse then checks what was printed, and may leave out
        what only the model tells (transcribe.cpp's token ids).

        Raises:
            AudioparityError: what it printed cannot be read; it prints no document.
        """
        raise AudioparityError(f"adapter {self.name!r} reads no printed document")

    # -- its model file -------------------------------------------------------------------------

    def model_files(self, model: Path, options: Mapping[str, Any], weight_type: str
                    ) -> list[Path]:
        """The files of its own model that its run reads at ``weight_type``, in the folder
        ``model`` :meth:`convert` wrote: the cell's manifest records their storage (``storage``:
        bits per weight, tensors per type, fallbacks, each weight's type and hashes), and its
        quantized cells' reference computes with the weights they store. [] (the default): it
        names none."""
        return []

    def model_tensors(self, path: Path) -> list[StoredTensor]:
        """The tensors of its model file ``path``, each with its bytes: by default a GGUF
        file's, through ``gguf.GGUFReader``; a legacy ggml file's through
        :func:`~audioparity.candidates.model_file.ggml_bin_tensors` and its header."""
        from audioparity.candidates.model_file import gguf_tensors

        return gguf_tensors(path)

    def checkpoint_tensor(self, tensor: StoredTensor) -> StoredTensor:
        """``tensor`` of its model file as the checkpoint's weight it holds: as the first of
        :attr:`weights` that names it maps it (:meth:`WeightName.checkpoint_tensor`), or under
        its own name where none does (a file that names it as the checkpoint does; a tensor
        that is no weight of the checkpoint is named so by the reference that reads it)."""
        return next((found for entry in self.weights
                     if (found := entry.checkpoint_tensor(tensor)) is not None), tensor)

    def port_name(self, weight: str) -> str:
        """The name its model file gives checkpoint weight ``weight`` (:attr:`weights` read
        backwards; its own name where no entry names it)."""
        return next((name for entry in self.weights
                     if (name := entry.port_name(weight)) is not None), weight)

    def recipe_options(self, recipe: Any, options: Mapping[str, Any]) -> dict[str, Any] | None:
        """Its options under which its quantizer writes ``recipe`` (a
        :class:`~audioparity.dumping.weight_files.Recipe`: every matmul weight at its base type but
        those its overrides name) in its own syntax, its conversion and cells then run at the base
        type with them; None (the default) where its quantizer has no per-tensor types: its cells of
        a recipe are ``unavailable``, saying so."""
        return None

    def requested_type(self, tensor: Any, weight_type: str, options: Mapping[str, Any]
                       ) -> str | None:
        """The type its quantizer is asked for ``tensor`` (a
        :class:`~audioparity.dumping.weight_files.StoredTensor` of its model file) in a cell of
        ``weight_type``, or None for a tensor it leaves alone: by default ``weight_type`` for
        a matmul weight, a 2-D tensor that no :attr:`unquantized` pattern names. A matmul weight
        stored as another type is a fallback, recorded with why."""
        from audioparity.candidates.model_file import matches

        if len(tensor.shape) != 2 or matches(self.unquantized, tensor.name):
            return None
        return weight_type

    # -- helpers ------------------------------------------------------------------------------

    def root(self, options: Mapping[str, Any]) -> Path:
        """The built port's folder, the option ``root``."""
        return Path(options["root"])

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


    def overrides(self, method: str) -> bool:
        """Whether this adapter's class overrides :class:`Adapter`'s ``method``."""
        return getattr(type(self), method) is not getattr(Adapter, method)
