"""One driver for every family's dumps: it reads and checks the inputs, opens the reference
model or the ggml runtime, stores and uploads the weights under one storage policy, runs the
family's dump method (:class:`~audioparity.contract.family.Family`), and writes what it yields into
an atomic dump directory, each stage checked against the family's contract and laid out as it
declares (docs/design.md, "Dump contract").
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import (
    Case,
    Family,
    Fields,
    Note,
    Outputs,
    Phase,
    ReferenceLibrary,
    Skipped,
)
from audioparity.contract.spec import FLOAT32, IMPLEMENTATION, MATMUL, FamilySpec, Stage
from audioparity.contract.vocabulary import RECIPE_SEPARATOR, StageKind
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.emulation import emulating, emulations
from audioparity.dumping.provenance import model_record
from audioparity.dumping.storage import (
    EMULATED_TYPES,
    StoredWeights,
    block_hashes,
    storage_or_fallback,
    storage_record,
)
from audioparity.dumping.threads import torch_threads
from audioparity.dumping.weight_files import FileStorage, Recipe, type_name

log = logging.getLogger("audioparity")

#: A tensor named ``<document><MARGINS>`` holds the decision margins of that document.
MARGINS = "_margins"
#: Manifest fields of a ggml dump that the runtime and the weights' load give
#: (:func:`~audioparity.ggml.open_runtime`, phase ``load``): the same for every case of one
#: process (:func:`dump_ggml_cases`).
_RUNTIME_FIELDS = ("ggml_build", "backend_env", "device_description", "device_properties")


def side_options(family: Family, side: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options of ``side`` (``reference``, ``ggml``, ``weights``): those given, and the
    table's defaults of the others. A dump's manifest records them."""
    return {**{o.name: o.default for o in family.spec.options_for(side)}, **options}


def open_cases(family: Family, model: Path, paths: Sequence[Path],
               options: Mapping[str, Any]) -> tuple[Any, list[Case]]:
    """The model's config and each case read and checked (:meth:`Family.open_case`), as both
    sides do first, before torch or ggml is imported.

    Raises:
        AudioparityError: an unreadable config or case (the first, in that order).
    """
    config = family.config(Path(model))
    return config, [family.open_case(Path(model), config, Path(p), options) for p in paths]


def _declared(family: Family, heads: Sequence[str], name: str, value: Any) -> str:
    """The layout of output ``name`` by the contract: a stage, one of its forms, or a
    document's margins.

    Raises:
        AudioparityError: the contract declares no such stage for this model's heads, or the
            value is not what its kind holds (a mapping for a document, an array otherwise).
    """
    spec = family.spec
    margins = name.endswith(MARGINS) and spec.locate(name.removesuffix(MARGINS))
    found = margins or spec.locate(name)
    if not found or (margins and not found.stage.margins):
        raise AudioparityError(f"family {spec.name}: the dump yielded {name!r}, which its "
                               f"contract does not declare")
    stage = found.stage
    if stage.head is not None and stage.head not in heads:
        raise AudioparityError(f"family {spec.name}: the dump yielded {name!r} of the "
                               f"{stage.head} head, which this model does not have")
    document = stage.kind == StageKind.DOCUMENT and not margins
    if document != isinstance(value, Mapping) or not (document or isinstance(value, np.ndarray)):
        raise AudioparityError(f"family {spec.name}: {name!r} is a {type(value).__name__}; "
                               f"expected {'a mapping' if document else 'an array'}")
    return stage.margins if margins else stage.layout


def write_outputs(writer: DumpWriter, family: Family, heads: Sequence[str],
                  outputs: Outputs) -> None:
    """Write what a family's dump method yields into ``writer``: stages (checked and laid out
    by the contract, :func:`_declared`), phases (each a stage of the contract, timed into
    ``seconds`` and named running: where a crash is charged), notes, fields, and the stages
    it skipped, with why (manifest ``skipped``: a replayed form without its input, a stage a
    reference implementation cannot dump).

    Raises:
        AudioparityError: a stage or a phase the contract does not declare (:func:`_declared`).
    """
    with ExitStack() as phase:
        for item in outputs:
            if isinstance(item, Phase):
                if family.spec.locate(item.name) is None:
                    raise AudioparityError(f"family {family.spec.name}: the dump named phase "
                                           f"{item.name!r}, which is no stage of its contract")
                phase.close()
                phase.enter_context(writer.timed(item.name))
            elif isinstance(item, Note):
                writer.note(item.text)
            elif isinstance(item, Fields):
                writer.manifest.update(item.values)
            elif isinstance(item, Skipped):
                writer.manifest.setdefault("skipped", {})[item.stage] = item.why
                writer.note(f"{item.stage} skipped: {item.why}")
            else:
                name, value = item
                layout = _declared(family, heads, name, value)
                if isinstance(value, Mapping):
                    writer.add_json(name, value)
                else:
                    writer.add_tensor(name, value, layout)


def _owed(family: Family, heads: Sequence[str], forms: Sequence[str]) -> list[tuple[Stage, str]]:
    """``(stage, form)`` of every stage form a dump of the model's ``heads`` must hold."""
    return [(stage, form) for stage in family.spec.stages_of(heads) for form in forms
            if stage.pattern(form) is not None]


def check_complete(family: Family, heads: Sequence[str], dump: Mapping[str, Any],
                   forms: Sequence[str], where: Path) -> None:
    """Raise unless ``dump`` (a manifest) holds every stage ``forms`` of the model's heads
    declares, at least one layer of a per-layer one, or says why it skipped it.

    Raises:
        AudioparityError: the first stage missing (a family that declares what it does not
            compute).
    """
    names = {*dump.get("tensors", {}), *dump.get("documents", {}), *dump.get("skipped", {})}
    written = {(found.stage.name, found.form) for found in map(family.spec.locate, names)
               if found is not None}
    for stage, form in _owed(family, heads, forms):
        pattern = stage.pattern(form)
        if (stage.name, form) not in written:
            raise AudioparityError(f"{where}: family {family.spec.name} declares {pattern!r} "
                                   "but its dump did not write it")


def dump_reference(family: Family, model: Path, cases: Sequence[tuple[Path, Path]], *,
                   options: Mapping[str, Any], threads: int = 1,
                   emulate: Sequence[str | Recipe] | FileStorage = ()) -> None:
    """The reference's dump of each ``(case file, dump directory)``, loading the model once for
    all (:meth:`Family.load_reference`: the implementation ``options`` name), and again for each
    weight type of ``emulate`` as ggml's CPU backend computes with it
    (:func:`~audioparity.dumping.emulation.emulations`) into ``<directory>@<type>``; or, where
    ``emulate`` is a candidate's stored weights (:class:`FileStorage`), only as ggml's CPU
    backend computes with those, into each directory (the storage-matched reference).

    Every input is checked first, before torch is imported: the config, each case, then the
    implementation's :meth:`~audioparity.contract.family.ReferenceLibrary.check` and
    :meth:`Family.check_reference` (the checkpoint, the memory), and each recipe's overrides
    against the model's matmul weights (:func:`check_recipe`).

    Raises:
        AudioparityError: no cases, or an input the family refuses. A failing case's directory
            is not left behind; an input error leaves none at all.
    """
    spec, options = family.spec, side_options(family, "reference", options)
    if not cases:
        raise AudioparityError(f"reference {spec.command}: no {spec.input} file given")
    spec.check_implementation_options(options, f"reference {spec.command}")
    model = Path(model)
    config, opened = open_cases(family, model, [path for path, _ in cases], options)
    emulates = isinstance(emulate, FileStorage) or bool(emulate)
    family.library(options).check(model, config, opened, emulates=emulates)
    family.check_reference(model, config, opened, emulates=emulates)
    recipes = [] if isinstance(emulate, FileStorage) else [
        recipe for recipe in emulate if isinstance(recipe, Recipe)]
    if recipes:
        checkpoint = family.weights(model, config)
        checkpoint.close()
        for recipe in recipes:
            check_recipe(family, checkpoint.shapes, recipe)
    with torch_threads(threads):
        start = time.perf_counter()
        loaded = family.load_reference(model, config, options)
        seconds = {"load": round(time.perf_counter() - start, 4)}
        log.info("reference %s: loaded %s in %.1f s, for %d case(s)", spec.command, model,
                 seconds["load"], len(cases))
        fields = {"family": spec.name, "threads": threads, "cases_per_load": len(cases),
                  **options, **family.manifest_fields(config, options)}
        for variant in emulations(loaded.module, emulate,
                                  keep=family.reference_keeps, prefix=family.reference_prefix):
            for case, (_, output_dir) in zip(opened, cases, strict=True):
                recorded = replace(case, fields={**fields, **variant.fields, **case.fields})
                reference_case(family, loaded, recorded, variant.dump_dir(output_dir), seconds,
                               variant.stored)


def unavailable_reference(family: Family, model: Path, cases: Sequence[tuple[Path, Path]],
                          options: Mapping[str, Any], why: str) -> None:
    """An ``unavailable`` dump, saying ``why``, for each ``(case file, dump directory)`` whose
    directory is not there yet: another reference that cannot run the model (an
    implementation that cannot express it), whose comparison with the primary then says so on
    every stage instead of stopping the sweep."""
    options = side_options(family, "reference", options)
    for path, output_dir in cases:
        if Path(output_dir).exists():
            continue
        with DumpWriter(output_dir, producer=options[IMPLEMENTATION], model=Path(model),
                        inputs={family.spec.input: Path(path)},
                        fields={"family": family.spec.name, **options}) as writer:
            writer.set_status("unavailable", why)


def reference_case(family: Family, loaded: ReferenceLibrary, case: Case, output_dir: Path,
                   seconds: Mapping[str, float] | None = None,
                   stored: StoredWeights | None = None) -> None:
    """One case of the loaded reference (:meth:`ReferenceLibrary.stages`) dumped into
    ``output_dir``, as the model computes now: float32, or within
    :func:`~audioparity.dumping.emulation.emulating`, whose ``stored`` weights the dump records.
    The manifest's fields are ``case.fields`` (a caller that loaded the model for several cases
    adds what the load records, :func:`dump_reference`); ``seconds`` are the load's (the
    manifest's ``seconds``, each stage's added as it is timed).

    Raises:
        AudioparityError: the reference yielded what its family's contract does not declare,
            or not all that it declares (:func:`write_outputs`, :func:`check_complete`).
    """
    start = time.perf_counter()
    with DumpWriter(output_dir, producer=case.options[IMPLEMENTATION], model=case.model,
                    inputs={family.spec.input: case.path}, fields=case.fields,
                    versions=family.reference_versions) as writer:
        if stored is not None and stored.types:
            writer.add_storage(stored.record(), stored.hashes)
        for note in case.notes:
            writer.note(note)
        writer.manifest["seconds"].update(seconds or {})
        heads = family.heads(case.config)
        write_outputs(writer, family, heads, loaded.stages(case))
        check_complete(family, heads, writer.manifest, ("",), output_dir)
    log.info("reference %s: wrote %s in %.1f s", family.spec.command, output_dir,
             time.perf_counter() - start)


def storage_types(family: Family, shapes: Mapping[str, tuple[int, ...]],
                  native: Mapping[str, str], weight_type: str | Recipe,
                  options: Mapping[str, Any]) -> tuple[dict[str, str], list[str]]:
    """The storage type of every graph weight (:meth:`Family.weight_kind`): a matmul weight's
    is the weight type (``native``: the checkpoint's dtype; a :class:`~audioparity.dumping.storage.
    Recipe`: the one it gives that weight), a float32 one's ``f32``, any other's the option
    the kind names; a block type that cannot hold a weight's rows falls back
    (:func:`~audioparity.dumping.storage.storage_or_fallback`), one note each.

    Raises:
        AudioparityError: an unknown weight type, or a kind the family has no option for.
    """
    from audioparity.contract.vocabulary import WEIGHT_TYPES

    recipe = weight_type if isinstance(weight_type, Recipe) else Recipe.uniform(weight_type)
    if recipe.base not in WEIGHT_TYPES or (recipe.overrides and recipe.base == "native"):
        raise AudioparityError(f"unknown weight type {type_name(weight_type)!r}; valid: "
                               f"{', '.join(WEIGHT_TYPES)}")
    storage: dict[str, str] = {}
    notes: list[str] = []
    for name, shape in shapes.items():
        kind = family.weight_kind(name, shape)
        if kind == MATMUL:
            wanted = native[name] if recipe.base == "native" else recipe.storage(name)
        elif kind == FLOAT32:
            wanted = "f32"
        elif kind in options:
            wanted = options[kind]
        else:
            raise AudioparityError(f"family {family.spec.name}: weight {name} is stored by "
                                   f"option {kind!r}, which was not given")
        storage[name] = storage_or_fallback(name, wanted, shape, notes)
    check_recipe(family, shapes, recipe)
    return storage, notes


def check_recipe(family: Family, shapes: Mapping[str, tuple[int, ...]], recipe: Recipe) -> None:
    """Refuse a recipe whose overrides name a weight that is no matmul weight among ``shapes``
    (the model's graph weights, :meth:`Family.weight_kind`).

    Raises:
        AudioparityError: the first such weight, and how many there are.
    """
    unused = sorted(set(recipe.overrides) - {n for n in shapes
                                             if family.weight_kind(n, shapes[n]) == MATMUL})
    if unused:
        raise AudioparityError(f"recipe {recipe.weight_type}: {unused[0]} is no matmul weight "
                               f"of this model ({len(unused)} override(s) name none)")


@dataclass(frozen=True)
class RunSettings:
    """How one cell runs, as ``audioparity ggml`` and ``audioparity candidate run`` take it: the
    weight type (or recipe) its weights are stored in, the backend, device and threads of its
    runtime, the options of what runs it (the family's ggml options; a candidate's, its
    entry's) and the converted weights file to map (None: convert in the process). One ggml
    process opens its runtime and uploads the weights so once for all its cases."""

    weight_type: str | Recipe
    backend: str
    options: Mapping[str, Any]
    device: int = 0
    threads: int = 1
    weights_file: Path | None = None


def upload_weights(family: Family, runtime: Any, model: Path, config: Any, how: RunSettings
                   ) -> tuple[Any, dict[str, Any]]:
    """The model's graph weights in ``runtime``, each in its storage type
    (:func:`storage_types` of ``how.weight_type`` and ``how.options``): streamed from the
    checkpoint a block at a time (:meth:`Runtime.load`), or mapped from ``how.weights_file``
    (:func:`save_weights` of the same model, type and options) when it names one; and the
    manifest's ``storage`` field (:func:`~audioparity.dumping.storage.storage_record`: bits per
    weight, tensors per type, the fallbacks) with the checkpoint's own dtypes. The backend,
    device and threads of ``how`` are not read: ``runtime`` was opened with them.

    Raises:
        AudioparityError: an unreadable checkpoint or a weight holding NaN or infinity, or a
            weights file that does not hold these shapes and types.
    """
    checkpoint = family.weights(Path(model), config)
    try:
        storage, notes = storage_types(family, checkpoint.shapes, checkpoint.native,
                                       how.weight_type, how.options)
        if how.weights_file is not None:
            weights = runtime.map(Path(how.weights_file), checkpoint.shapes, storage)
        else:
            weights = runtime.load(checkpoint.shapes, storage, checkpoint.blocks())
    finally:
        checkpoint.close()
    weights.buffers = dict(checkpoint.buffers)
    record = storage_record(checkpoint.shapes, storage, notes)
    record["checkpoint_dtypes"] = sorted(set(checkpoint.native.values()))
    return weights, record


def stored_weights(weights: Any) -> StoredWeights:
    """Each weight's storage type and :func:`~audioparity.dumping.storage.block_hashes` of the bytes
    its backend holds (read back: what the graphs compute with)."""
    from audioparity.ggml.bindings import tensor_bytes

    found = StoredWeights()
    for name in weights:
        storage = weights.storage(name)
        found.types[name] = storage
        found.hashes[name] = block_hashes(tensor_bytes(weights[name]), storage,
                                          weights.shape(name))
    return found


def save_weights(family: Family, model: Path, output: Path, *, weight_type: str | Recipe,
                 options: Mapping[str, Any]) -> None:
    """The model's graph weights at ``weight_type``, checked and converted once, written to the
    GGUF file ``output`` (:meth:`Weights.save`) for every dump of the model to map.

    Raises:
        AudioparityError: as :func:`upload_weights` streaming them.
    """
    from audioparity.ggml import Runtime

    model, options = Path(model), side_options(family, "weights", options)
    with Runtime("cpu") as runtime:
        weights, _ = upload_weights(family, runtime, model, family.config(model),
                                    RunSettings(weight_type, "cpu", options))
        weights.save(Path(output), model_record(model))


def _reference_for(family: Family, reference_dir: Path | None, heads: Sequence[str]
                   ) -> Dump | None:
    """The reference dump a ggml dump reads (None when the family reads none), checked ``ok``
    and holding every stage of the model's heads.

    Raises:
        AudioparityError: unreadable, not ``ok``, or lacking a stage.
    """
    if not family.spec.ggml_reads_reference:
        return None
    if reference_dir is None:
        raise AudioparityError(f"ggml {family.spec.command}: --reference-dir is required")
    reference = Dump(reference_dir)
    if reference.status != "ok":
        raise AudioparityError(f"{reference.path}: reference dump has status "
                               f"{reference.status!r}")
    lacking = [stage.name for stage in family.spec.stages_of(heads)
               if not any(map(stage.match, [*reference.tensor_names,
                                            *reference.manifest.get("documents", {})]))]
    if lacking:
        raise AudioparityError(f"{reference.path}: reference dump lacks {', '.join(lacking)}")
    return reference


def dump_ggml(family: Family, model: Path, case_path: Path, output_dir: Path,
              settings: RunSettings, reference_dir: Path | None = None) -> None:
    """The family's ggml port on one case into ``output_dir``: :func:`dump_ggml_cases` of that
    one case.

    Raises:
        AudioparityError: as :func:`dump_ggml_cases`.
    """
    dump_ggml_cases(family, model, [(case_path, output_dir, reference_dir)], settings)


def dump_ggml_cases(family: Family, model: Path,
                    runs: Sequence[tuple[Path, Path, Path | None]],
                    settings: RunSettings) -> None:
    """The family's ggml port (:meth:`Family.ggml`) on each ``(case file, dump directory,
    reference dump or None)`` of ``runs``, in their order, in this process: the config, every
    case and every reference dump checked first, then the runtime opened and the weights
    uploaded once (phase ``load``, recorded in every dump; a backend not built into this ggml
    gives each dump ``unavailable`` and returns normally), then each case's stages written
    into its directory. A case may come more than once, each time into its own directory: the
    runtime, the weights and whatever the port keeps between cases are reused, which the
    workflow's check of a reused run against a fresh one reads (:mod:`audioparity.compare.reuse`).
    Each dump's manifest says how many cases this process ran before it (``runs_before``).

    Raises:
        AudioparityError: no runs, or an input the family or the driver refuses; nothing is
            left at a dump directory then (those written before a refusal stay).
    """
    spec, model, start = family.spec, Path(model), time.perf_counter()
    if not runs:
        raise AudioparityError(f"ggml {spec.command}: no {spec.input} file given")
    options = side_options(family, "ggml", settings.options)
    settings = replace(settings, options=options)
    weight_type, backend = settings.weight_type, settings.backend
    config, cases = open_cases(family, model, [path for path, _, _ in runs], options)
    heads = family.heads(config)
    references = [_reference_for(family, reference_dir, heads) for _, _, reference_dir in runs]
    fields = {"family": spec.name, "backend": backend, "device": settings.device,
              "weight_type": type_name(weight_type), "threads": settings.threads, **options,
              **({"recipe": dict(weight_type.overrides)} if isinstance(weight_type, Recipe)
                 else {}),
              **family.manifest_fields(config, options)}
    forms = ("", "isolated") if spec.ggml_reads_reference else ("",)
    with ExitStack() as held:
        loaded: Loaded | None = None
        for index, (case, reference, (_, output_dir, _)) in enumerate(
                zip(cases, references, runs, strict=True)):
            inputs = {spec.input: case.path,
                      **({"reference": reference.path} if reference else {})}
            with DumpWriter(output_dir, producer="ggml", model=model, inputs=inputs,
                            fields={**fields, **case.fields, "runs_before": index},
                            versions=family.ggml_versions,
                            weights=settings.weights_file) as writer:
                for note in case.notes:
                    writer.note(note)
                if loaded is None:
                    loaded = _load(writer, family, model, config, settings)
                    if loaded is None:  # the backend is not built: so is every later dump
                        _unavailable(spec, model, fields, writer.manifest["message"],
                                     [(later.path, run[1]) for later, run in
                                      zip(cases[index + 1:], runs[index + 1:], strict=True)])
                        return
                    held.enter_context(loaded.runtime)
                loaded.record_into(writer)
                write_outputs(writer, family, heads,
                              family.ggml(loaded.runtime, loaded.weights, case, reference))
                check_complete(family, heads, writer.manifest, forms, Path(output_dir))
            log.info("ggml %s [%s | %s | %s %s]: wrote %s in %.1f s", spec.command, model.name,
                     case.path.stem, backend, type_name(weight_type), output_dir,
                     time.perf_counter() - start)
            start = time.perf_counter()


@dataclass(frozen=True)
class Loaded:
    """The runtime and weights a ggml process opened once for all its cases, and what its
    first dump recorded of them: the storage ``record`` and ``stored`` weights, the runtime's
    manifest fields (``shared``) and the load's seconds, copied into every later dump."""

    runtime: Any
    weights: Any
    record: dict[str, Any]
    stored: StoredWeights
    shared: dict[str, Any]
    load_seconds: float

    def record_into(self, writer: DumpWriter) -> None:
        """Write what every dump of the process records of the load into ``writer``."""
        writer.manifest.update(self.shared)
        writer.manifest["seconds"]["load"] = self.load_seconds
        writer.add_storage({**self.record, **self.stored.record()}, self.stored.hashes)


def _load(writer: DumpWriter, family: Family, model: Path, config: Any, how: RunSettings
          ) -> Loaded | None:
    """Open the runtime (:func:`~audioparity.ggml.open_runtime`, recorded in ``writer``) and
    upload the weights in phase ``load``; None where the backend is not built (``writer``'s
    dump then says ``unavailable``)."""
    from audioparity.ggml import open_runtime

    runtime = open_runtime(writer, how.backend, how.device, how.threads)
    if runtime is None:
        return None
    with writer.timed("load"):
        weights, record = upload_weights(family, runtime, model, config, how)
        # what a quantization-aware reference stored too: its stored_weights row
        stored = (stored_weights(weights) if type_name(how.weight_type).partition(
            RECIPE_SEPARATOR)[0] in EMULATED_TYPES else StoredWeights())
    # what open_runtime recorded: the same for every later case
    shared = {key: writer.manifest[key] for key in _RUNTIME_FIELDS if key in writer.manifest}
    return Loaded(runtime, weights, record, stored, shared, writer.manifest["seconds"]["load"])


def _unavailable(spec: FamilySpec, model: Path, fields: Mapping[str, Any], why: str,
                 later: Sequence[tuple[Path, Path]]) -> None:
    """Each ``(case file, dump directory)`` of ``later`` written ``unavailable`` with ``why``."""
    for case_path, output_dir in later:
        with DumpWriter(output_dir, producer="ggml", model=model,
                        inputs={spec.input: case_path}, fields=fields) as unavailable:
            unavailable.set_status("unavailable", why)


@dataclass(frozen=True)
class ReplaySettings:
    """How a replay runs, as ``audioparity replay`` takes it: the reference side's ``options``
    (those given; :func:`side_options` fills in the rest), its torch ``threads``, and what it
    emulates (``emulate``): a weight type (or recipe) to replay as ggml's CPU backend computes
    with it (our port's quantized cell's replay), a candidate's stored weights (a third-party
    port's), or None (float32)."""

    options: Mapping[str, Any]
    threads: int = 1
    emulate: str | Recipe | FileStorage | None = None


def dump_replay(family: Family, model: Path, case_path: Path, candidate_dir: Path,
                output_dir: Path, how: ReplaySettings) -> None:
    """The reference's blocks on a candidate's own inputs (:meth:`ReferenceLibrary.replay` of
    the implementation ``how.options`` name), written into ``output_dir`` as a dump of
    replayed forms; each one it cannot compute is named in the manifest's ``skipped`` with why.
    A candidate dump (``candidate_dir``, of the case file ``case_path``) that is not ``ok``
    gives a replay of its status.

    Raises:
        AudioparityError: an unreadable model, case or candidate dump, or an implementation
            that does not replay.
    """
    spec, options = family.spec, side_options(family, "reference", how.options)
    threads, emulate = how.threads, how.emulate
    library = family.library(options)
    if not library.replays():
        others = [name for name in spec.references
                  if family.library({IMPLEMENTATION: name}).replays()]
        raise AudioparityError(f"replay {spec.command}: the {library.name} reference has no "
                               f"replay; replay with --{IMPLEMENTATION} {' or '.join(others)}")
    config, (case,) = open_cases(family, Path(model), [case_path], options)
    candidate = Dump(candidate_dir)
    fields = {"family": spec.name, "threads": threads, "replay": True,
              **({"emulates": {"weight_type": type_name(emulate), "backend": "cpu",
                               **({"storage": str(emulate.path)}
                                  if isinstance(emulate, FileStorage) else {})}}
                 if emulate else {}),
              **options, **family.manifest_fields(config, options)}
    with DumpWriter(output_dir, producer=options[IMPLEMENTATION], model=case.model,
                    inputs={spec.input: case.path, "candidate": candidate.path}, fields=fields,
                    versions=family.reference_versions) as writer:
        if candidate.status != "ok":
            writer.set_status(candidate.status, f"the candidate dump is {candidate.status}: "
                              "nothing to replay")
            return
        with torch_threads(threads), ExitStack() as stack:
            with writer.timed("load"):
                loaded = family.load_reference(case.model, config, options)
                if emulate:
                    for note in stack.enter_context(
                            emulating(loaded.module, emulate, family.reference_keeps,
                                      family.reference_prefix)).notes:
                        writer.note(note)
            heads = family.heads(config)
            write_outputs(writer, family, heads, loaded.replay(case, candidate))
        check_complete(family, heads, writer.manifest, ("replayed",), Path(output_dir))
    log.info("replay %s: %s: %d replayed, %d not", spec.command, candidate_dir,
             len(writer.manifest["tensors"]) + len(writer.manifest["documents"]),
             len(writer.manifest.get("skipped", {})))
