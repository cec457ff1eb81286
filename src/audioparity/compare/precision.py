"""Which matmul weights must stay wider for a weight type to pass its targets: the search
behind ``audioparity precision``, after Polygraphy's ``debug precision`` (rank, then bisect).

Every trial runs the quantization-aware reference
(:func:`~audioparity.dumping.emulation.emulating`): what ggml's CPU backend computes with those
storage types, without a port; the search never runs a port's code. By hand, the recipe found is
then verified by our ggml port itself (:func:`verify`); in a sweep, every cell of the recipe's
weight type verifies it on its own dump (:func:`~audioparity.compare.targets.recipe_row`).
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from audioparity.compare.targets import target_gates, target_rows, unmet
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.contract.vocabulary import RECIPE_SEPARATOR
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.emulation import emulating, matmul_modules
from audioparity.dumping.storage import (
    BITS_PER_WEIGHT,
    EMULATED_TYPES,
    matmul_input,
    min_term,
    storage_or_fallback,
    storage_record,
    stored,
)
from audioparity.dumping.weight_files import Recipe

log = logging.getLogger("audioparity")

#: Rows of a module's input kept for its sensitivity: the first calls' rows, up to this many.
CAPTURED_ROWS = 4096

#: Promoted weights the search tries to demote again one by one (each a trial) after the
#: bisection; a longer list keeps the bisection's answer.
PRUNE_LIMIT = 64


def _captured_inputs(modules: Sequence[tuple[str, Any, str]], run: Callable[[], None]
                     ) -> dict[str, list[np.ndarray]]:
    """What each of ``modules`` (:func:`~audioparity.dumping.emulation.matmul_modules`) was fed
    while ``run()`` ran, up to :data:`CAPTURED_ROWS` rows: a linear's or conv's input rows
    (channels last), an LSTM's input and output sequences side by side, nothing of an
    embedding."""
    import torch

    captured: dict[str, list[np.ndarray]] = {}

    def capture(name: str, kind: str):
        def hook(mod, args, output):
            rows = captured.setdefault(name, [])
            if sum(len(r) for r in rows) >= CAPTURED_ROWS:
                return
            x = args[0].detach().float()
            if kind == "conv":
                x = torch.movedim(x, 1, -1)
            if kind == "lstm":
                inputs = x if not mod.batch_first else x.transpose(0, 1)
                out = output[0].detach().float()
                out = out if not mod.batch_first else out.transpose(0, 1)
                rows.append(np.concatenate([inputs.reshape(-1, inputs.shape[-1]).numpy(),
                                            out.reshape(-1, out.shape[-1]).numpy()], axis=1))
            elif kind != "embedding":
                rows.append(x.reshape(-1, x.shape[-1]).numpy())
        return hook

    hooks = [mod.register_forward_hook(capture(name, kind)) for name, mod, kind in modules]
    try:
        with torch.inference_mode():
            run()
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def sensitivities(module: Any, run: Callable[[], None], weight_type: str,
                  keep: Sequence[str] = (), prefix: str = "") -> dict[str, float]:
    """Each matmul weight's sensitivity to ``weight_type``: the NMSE its matmul's output takes
    when that weight alone is stored as ``weight_type`` and its input rounded as the CPU
    backend rounds it, on the inputs the float32 model fed it while ``run()`` ran (up to
    :data:`CAPTURED_ROWS` rows each). Local to the matmul, so one float32 pass serves every
    weight. An embedding's is its stored rows' NMSE; an LSTM's matrices take the NMSE of their
    gate pre-activations on the layer's input and output sequence (layer 0; higher layers'
    inputs are the layer below's outputs, which the hook does not see, so they take their
    weights' NMSE).

    Returns:
        weight name (``<module>.weight``, ``<lstm>.weight_hh_l0``, less ``prefix``: as the port
        names it) -> NMSE, largest first; a weight two modules share (tied embeddings) once.
    """
    modules = list(matmul_modules(module, keep))
    captured = _captured_inputs(modules, run)
    found: dict[str, float] = {}
    seen: set[int] = set()  # a weight two modules share (tied embeddings) is measured once
    for name, mod, kind in modules:
        if kind != "lstm":
            if id(mod.weight) in seen:
                continue
            seen.add(id(mod.weight))
        inputs = captured.get(name)
        x = np.concatenate(inputs)[:CAPTURED_ROWS] if inputs else None
        if kind == "lstm":
            for param, weight in mod.named_parameters():
                if not param.startswith("weight_"):
                    continue
                w = weight.detach().numpy()
                if x is not None and param.endswith("_l0"):
                    half = mod.input_size if param.startswith("weight_ih") else None
                    part = x[:, :half] if half is not None else x[:, mod.input_size:]
                    found[f"{name}.{param}"] = _weight_nmse(w, weight_type, part)
                else:
                    found[f"{name}.{param}"] = _weight_nmse(w, weight_type)
            continue
        w = mod.weight.detach().numpy()
        w = w.reshape(w.shape[0], -1)
        found[f"{name}.weight"] = _weight_nmse(w, weight_type,
                                               None if kind == "embedding" else x)
    named = {name.removeprefix(prefix): value for name, value in found.items()}
    return dict(sorted(named.items(), key=lambda item: -item[1]))


def _weight_nmse(w: np.ndarray, weight_type: str, x: np.ndarray | None = None) -> float:
    """NMSE of weight ``w`` ``[out, K]`` stored as ``weight_type`` (or its fallback,
    :func:`~audioparity.dumping.storage.storage_or_fallback`) against float64: of ``x @ w.T`` as
    ggml's CPU computes it (input rounded, q8_1's :func:`~audioparity.dumping.storage.min_term`
    added) where its inputs ``x`` are known, else of the stored values themselves."""
    storage = storage_or_fallback("w", weight_type, w.shape, [])
    w_stored = stored(w, storage)
    if x is None:
        return _nmse(w_stored, w)
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    quantized = matmul_input(x, storage).astype(np.float64) @ w_stored.T
    term = min_term(x, w_stored, storage)
    return _nmse(quantized if term is None else quantized + term, exact)


def _nmse(a: np.ndarray, b: np.ndarray) -> float:
    power = float(np.sum(np.square(b, dtype=np.float64)))
    return float(np.sum(np.square(a - b, dtype=np.float64)) / power) if power else 0.0


@dataclass
class Trial:
    """One trial: the weights kept wide, whether every target passed, what each measured."""

    wide: tuple[str, ...]
    passed: bool
    rows: list[dict[str, Any]] = field(default_factory=list)


class Search:
    """A recipe search for one model, its cases, a weight type and a wider type.

    Args:
        family: the model's family.
        model: its checkpoint.
        cases: the case files (audio or prompts) the targets are measured on.
        weight_type: the type most weights take (one of the emulated block types).
        wide: the type a promoted weight takes (``q8_0``, ``f16``, ``f32``).
        targets: gate entries (the config's gate syntax) on the family's stages, judged against
            the float32 reference's dump of the same case: what the recipe must meet.
        options: the reference side's options.
    """

    def __init__(self, family: Family, model: Path, cases: Sequence[Path], weight_type: str,
                 wide: str, targets: Sequence[Mapping[str, Any]],
                 options: Mapping[str, Any], workdir: Path) -> None:
        from audioparity.dumping.driver import open_cases, side_options

        if weight_type not in EMULATED_TYPES or RECIPE_SEPARATOR in weight_type:
            raise AudioparityError(f"precision: weight type {weight_type!r}; expected one of "
                                   f"{', '.join(EMULATED_TYPES)}")
        check_targets(family.spec, targets)
        if BITS_PER_WEIGHT[wide] <= BITS_PER_WEIGHT[weight_type]:
            raise AudioparityError(f"precision: --wide {wide} ({BITS_PER_WEIGHT[wide]:g} bits per "
                                   f"weight) is no wider than {weight_type} "
                                   f"({BITS_PER_WEIGHT[weight_type]:g})")
        self.family, self.model = family, Path(model)
        self.weight_type, self.wide = weight_type, wide
        target_gates(targets)
        self.options = side_options(family, "reference", options)
        self.config, self.cases = open_cases(family, self.model, list(cases), self.options)
        self.targets = [dict(t) for t in targets]
        self.workdir = Path(workdir)
        self.trials: list[Trial] = []
        self.loaded = None

    def _dump_dir(self, label: str, case_index: int) -> Path:
        return self.workdir / label / f"case{case_index}"

    def _dump(self, label: str) -> list[Path]:
        from audioparity.dumping.driver import reference_case

        dirs = []
        for index, case in enumerate(self.cases):
            folder = self._dump_dir(label, index)
            shutil.rmtree(folder, ignore_errors=True)
            reference_case(self.family, self.loaded, case, folder)
            dirs.append(folder)
        return dirs

    def start(self) -> dict[str, float]:
        """Load the reference, dump the float32 cases (the targets' reference) and measure each
        weight's sensitivity on them (:func:`sensitivities`)."""
        self.loaded = self.family.load_reference(self.model, self.config, self.options)
        self.module = self.loaded.module
        self.keep = self.family.reference_keeps
        self.reference = []
        return sensitivities(self.module, lambda: self.reference.extend(self._dump("float32")),
                             self.weight_type, self.keep, self.family.reference_prefix)

    def recipe(self, wide: Sequence[str], name: str = "recipe") -> Recipe:
        return Recipe(name, self.weight_type, dict.fromkeys(wide, self.wide))

    def trial(self, wide: Sequence[str]) -> Trial:
        """The targets measured with the weights of ``wide`` kept wide, every other matmul
        weight at the weight type: the emulated reference's dump of every case against the
        float32 reference's."""
        with emulating(self.module, self.recipe(wide), self.keep,
                       self.family.reference_prefix):
            dumps = self._dump("trial")
        rows = [row for case, ref, cand in zip(self.cases, self.reference, dumps, strict=True)
                for row in self.measure(Dump(ref), Dump(cand), case.path.stem)]
        found = Trial(tuple(wide), all(r["status"] == "pass" for r in rows), rows)
        self.trials.append(found)
        log.info("precision: %d wide: %s", len(wide), "pass" if found.passed else "fail")
        return found

    def measure(self, reference: Dump, candidate: Dump, case: str) -> list[dict[str, Any]]:
        """The target stages of ``candidate`` against ``reference`` (dumps of ``case``)
        (:func:`~audioparity.compare.targets.target_rows`)."""
        return target_rows(reference, candidate, self.targets, self.family.spec, case)


def check_targets(spec: Any, targets: Sequence[Mapping[str, Any]]) -> None:
    """Refuse targets that name no stage of the family (``spec``: its
    :class:`~audioparity.contract.spec.FamilySpec`), before any model is loaded.

    Raises:
        AudioparityError: no targets, an entry without ``stage``, or a stage pattern that
            matches none of the family's stages (the message lists them).
    """
    from audioparity.contract.spec import concrete

    if not targets:
        raise AudioparityError("precision: no targets: give gate entries on the stages the "
                               "recipe must meet (--targets)")
    names = [concrete(stage.name, 0) for stage in spec.stages]
    for target in targets:
        pattern = target.get("stage") if isinstance(target, Mapping) else None
        if not isinstance(pattern, str):
            raise AudioparityError(f"precision: target {target!r}: expected a gate entry with a "
                                   "stage")
        if not any(_matches(pattern, name) for name in names):
            raise AudioparityError(f"precision: target stage {pattern!r} matches no stage of "
                                   f"{spec.name} ({', '.join(s.name for s in spec.stages)})")


def _matches(pattern: str, name: str) -> bool:
    from fnmatch import fnmatchcase

    return fnmatchcase(name, pattern)


def bisect(search: Search, ranked: Sequence[str], prune_limit: int = PRUNE_LIMIT
           ) -> tuple[tuple[str, ...], dict[str, Trial]]:
    """The fewest weights, taken from the front of ``ranked`` (most sensitive first), that make
    every target pass when kept wide: the uniform weight type first (no weight wide), then all of
    them, then bisection over how many (assuming more wide weights never hurt), then each
    promoted weight (least sensitive first, up to ``prune_limit`` of them) demoted again where
    the targets still pass without it. Where the targets fail even with every matmul weight
    kept wide (the wide type itself, or something other than the weights, misses them), that
    is the answer: every weight wide, its trial failing.

    Returns:
        The weights kept wide, and the trials ``uniform``, ``wide`` (every weight) and
        ``recipe`` (whose ``passed`` says whether the targets are met).
    """
    uniform = search.trial(())
    if uniform.passed:
        return (), {"uniform": uniform, "wide": uniform, "recipe": uniform}
    everything = search.trial(tuple(ranked))
    if not everything.passed:
        return tuple(ranked), {"uniform": uniform, "wide": everything, "recipe": everything}
    low, high, best = 0, len(ranked), everything
    while high - low > 1:
        middle = (low + high) // 2
        found = search.trial(tuple(ranked[:middle]))
        if found.passed:
            high, best = middle, found
        else:
            low = middle
    wide = list(ranked[:high])
    if len(wide) <= prune_limit:
        for weight in reversed(ranked[:high]):
            fewer = [w for w in wide if w != weight]
            found = search.trial(tuple(fewer))
            if found.passed:
                wide, best = fewer, found
    return tuple(wide), {"uniform": uniform, "wide": everything, "recipe": best}


@contextmanager
def _workdir(path: Path | None):
    if path is not None:
        Path(path).mkdir(parents=True, exist_ok=True)
        yield Path(path)
        return
    with tempfile.TemporaryDirectory(prefix="audioparity-precision-") as folder:
        yield Path(folder)


@dataclass(frozen=True)
class SearchSettings:
    """What a recipe search (:func:`find_recipe`) looks for and how it runs, as ``audioparity
    precision`` takes it.

    Attributes:
        weight_type: the type most weights take (one of the emulated block types).
        wide: the type a promoted weight takes (``q8_0``, ``f16``, ``f32``).
        targets: gate entries (the config's gate syntax) on the family's stages, judged against
            the float32 reference's dump of the same case: what the recipe must meet.
        options: the reference side's options.
        ggml_options: our ggml port's options, to verify the recipe found with (:func:`verify`);
            None: not verified here (a sweep verifies it in every cell of its weight type).
        name: the recipe's name.
        threads: the reference's torch threads, and the verifying port's.
        workdir: where the trials' dumps are written; None: a temporary folder, removed after.
    """

    weight_type: str
    wide: str
    targets: Sequence[Mapping[str, Any]]
    options: Mapping[str, Any]
    ggml_options: Mapping[str, Any] | None = None
    name: str = "recipe"
    threads: int = 1
    workdir: Path | None = None


def find_recipe(family: Family, model: Path, cases: Sequence[Path], how: SearchSettings
                ) -> dict[str, Any]:
    """The recipe document of ``audioparity precision``: which matmul weights of ``model`` to
    keep ``how.wide`` so that, with every other at ``how.weight_type``, the targets pass on
    ``cases``; found on the quantization-aware reference (:func:`sensitivities`, then
    :func:`bisect`). Targets that no recipe meets are a result, not an error: every matmul
    weight is then kept wide, and ``search.met`` is false with the targets missed. With
    ``how.ggml_options`` the recipe is also verified by our ggml port on the CPU
    (:func:`verify`) and its bits per weight as our port stores it are given.

    Returns:
        ``{"name", "family", "model", "base", "wide", "overrides", "targets", "cases",
        "trials": {uniform, recipe, wide} (rows), "search": {"met", "unmet", "trials",
        "seconds"}, "sensitivity", "forms"}``, with ``how.ggml_options`` also ``"verified":
        {"passed", "rows"}`` and ``"bits_per_weight": {uniform, recipe, wide}``; ``base`` and
        ``overrides`` are what :func:`~audioparity.dumping.weight_files.read_recipe` reads.

    Raises:
        AudioparityError: bad inputs (a weight type, wide type, target, model or case).
    """
    from audioparity.dumping.threads import torch_threads

    weight_type, wide, ggml_options = how.weight_type, how.wide, how.ggml_options
    name, threads = how.name, how.threads
    start = time.perf_counter()
    with _workdir(how.workdir) as folder, torch_threads(threads):
        search = Search(family, model, cases, weight_type, wide, how.targets, how.options,
                        folder)
        sensitivity = search.start()
        ranked = list(sensitivity)
        chosen, trials = bisect(search, ranked)
        seconds = time.perf_counter() - start
        recipe = search.recipe(chosen, name)
        checked = ({} if ggml_options is None else
                   {"verified": verify(search, recipe, ggml_options, folder, threads)})
    if ggml_options is not None:
        checked["bits_per_weight"] = {
            label: bits_per_weight(family, Path(model), search.config, r, ggml_options)
            for label, r in (("uniform", weight_type), ("recipe", recipe),
                             ("wide", search.recipe(ranked)))}
    best = trials["recipe"]
    missed = None if best.passed else (f"with all {len(ranked)} matmul weights kept {wide}, "
                                       f"{unmet(best.rows)}")
    return {
        "name": name, "family": family.spec.name, "model": str(model), "base": weight_type,
        "wide": wide, "overrides": dict(recipe.overrides), "targets": search.targets,
        "cases": [str(c) for c in cases],
        "trials": {label: {"wide": len(t.wide), "passed": t.passed, "rows": t.rows}
                   for label, t in trials.items()},
        "search": {"met": best.passed, "unmet": missed, "trials": len(search.trials),
                   "seconds": round(seconds, 1)},
        **checked,
        "sensitivity": sensitivity,
        "forms": forms(recipe),
    }


def verify(search: Search, recipe: Recipe, ggml_options: Mapping[str, Any], folder: Path,
           threads: int) -> dict[str, Any]:
    """Our ggml port on the CPU with ``recipe`` (:func:`~audioparity.dumping.driver.dump_ggml`),
    each case's targets judged against the float32 reference: ``{"passed", "rows"}`` (by hand; a
    sweep judges every cell of the recipe's weight type the same way, its row ``recipe``)."""
    from audioparity.dumping.driver import RunSettings, dump_ggml

    rows = []
    for index, (case, reference) in enumerate(zip(search.cases, search.reference, strict=True)):
        output = folder / "verify" / f"case{index}"
        shutil.rmtree(output, ignore_errors=True)
        dump_ggml(search.family, search.model, case.path, output,
                  RunSettings(recipe, "cpu", ggml_options, threads=threads),
                  reference if search.family.spec.ggml_reads_reference else None)
        rows.extend(search.measure(Dump(reference), Dump(output), case.path.stem))
    return {"passed": all(r["status"] == "pass" for r in rows), "rows": rows}


def bits_per_weight(family: Family, model: Path, config: Any, weight_type: str | Recipe,
                    ggml_options: Mapping[str, Any]) -> float:
    """Bits per weight of every graph weight of ``model`` as our ggml port stores them at
    ``weight_type`` (:func:`~audioparity.dumping.driver.storage_types`, fallbacks included)."""
    from audioparity.dumping.driver import side_options, storage_types

    checkpoint = family.weights(Path(model), config)
    try:
        storage, notes = storage_types(family, checkpoint.shapes, checkpoint.native,
                                       weight_type, side_options(family, "ggml", ggml_options))
        return storage_record(checkpoint.shapes, storage, notes)["bits_per_weight"]
    finally:
        checkpoint.close()


def forms(recipe: Recipe) -> dict[str, Any]:
    """The recipe as the quantizers take it: ours (the weight type and ``--recipe``), and
    ``name=type`` pairs of the checkpoint's tensor names, the form of llama.cpp's
    ``llama-quantize --tensor-type`` (a candidate's adapter maps the names to its own)."""
    return {
        "audioparity": ["--weight-type", recipe.weight_type, "--recipe",
                        f"{recipe.weight_type}=<this file>"],
        "tensor_type": [f"{weight}={type_}" for weight, type_ in recipe.overrides.items()],
    }


def write_recipe(document: Mapping[str, Any], output: Path) -> None:
    """The recipe document as JSON at ``output``, atomically (no partial file is left)."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_name(f".{output.name}.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(output)
