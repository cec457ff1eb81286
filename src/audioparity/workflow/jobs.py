"""What each job of the workflow reads, from its wildcards (any object with them as attributes:
Snakemake's, a namespace in the tests): the paths of its inputs, its code input
(:mod:`.code`), its memory. The reference dump a job reads is known only once the reference
checkpoint has run: the rules ask for it through the checkpoint (rules/common.smk) and then
:meth:`Jobs.reference_inputs`.

Per-job work is a few dictionary look-ups and string formats: what is the same for many jobs
(a code input, a family's settings) is computed once per run.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from audioparity.contract.vocabulary import MIXES, RECIPE_SEPARATOR
from audioparity.dumping.environments import RECORD, check_built
from audioparity.dumping.memory import BASE_MEMORY_MB, job_memory_mb, refuse_over_limit
from audioparity.workflow import paths
from audioparity.workflow.code import Code
from audioparity.workflow.plan import (
    BASELINE_BACKEND,
    Candidate,
    FamilyPlan,
    Reference,
    Sweep,
    emulated,
)


class Jobs:
    """The inputs of the sweep's jobs.

    Args:
        sweep: the plan (:class:`~.plan.Sweep`).
        code: the source files and their digests (:class:`~.code.Code`).
    """

    def __init__(self, sweep: Sweep, code: Code) -> None:
        self.sweep = sweep
        self.code = code

    # -- the sweep's names --------------------------------------------------------------------

    def plan(self, w: Any) -> FamilyPlan:
        return self.sweep.families[w.family]

    def candidate(self, w: Any) -> Candidate:
        return self.sweep.families[w.family].candidates[w.candidate]

    def model_path(self, w: Any) -> str:
        """Path of model {model} of {family} (a file or a checkpoint directory)."""
        return self.sweep.families[w.family].models[w.model]

    def model_input(self, w: Any) -> str:
        """What a job on model {model} waits for: its fixture's directory when a rule builds
        it."""
        plan = self.sweep.families[w.family]
        return plan.fixtures[w.model] or plan.models[w.model]

    def case_path(self, w: Any) -> str:
        """Input file (audio or prompt) of case {case} of {family}."""
        return self.sweep.families[w.family].cases[w.case]

    @staticmethod
    def emulated(w: Any) -> str | None:
        """The cell's weight type where its reference is quantization-aware (a recipe's too),
        else None (f32, native; a job without a weight type)."""
        weight_type = getattr(w, "weight_type", None)
        return weight_type if weight_type and emulated(weight_type) else None

    def recipe_file(self, w: Any) -> str | None:
        """The recipe file of {weight_type} when it is a recipe's ``<type>+<name>``, else
        None (:meth:`~.plan.FamilyPlan.recipe_file`)."""
        return self.plan(w).recipe_file(w.model, w.weight_type)

    def recipe_file_or_none(self, w: Any) -> list[str]:
        """Input function: the recipe file of {weight_type}, or none."""
        recipe = self.recipe_file(w)
        return [recipe] if recipe else []

    def recipe_inputs(self, w: Any) -> dict[str, str]:
        """``{"recipe": file}`` for a job of a recipe weight type, else ``{}``."""
        recipe = self.recipe_file(w)
        return {"recipe": recipe} if recipe else {}

    def reference_recipes(self, w: Any) -> list[str]:
        """The recipe files of the weight types the reference job of {family}/{model} emulates."""
        plan = self.plan(w)
        return [f for t in plan.emulated if (f := plan.recipe_file(w.model, t))]

    # -- the reference ------------------------------------------------------------------------

    @staticmethod
    def reference_dir(w: Any) -> str:
        """The reference job's directory of {family}/{model}: one dump per case."""
        return paths.REFERENCE.format(family=w.family, model=w.model)

    @staticmethod
    def reference_plan(w: Any) -> str:
        """The file naming what the reference job of {family}/{model} dumps."""
        return paths.REFERENCE_PLAN.format(family=w.family, model=w.model)

    def storage_matched(self, w: Any) -> bool:
        """Whether the cell's reference is storage-matched (rule reference_storage): a
        quantized cell of a third-party port that converts the model into a file of its own
        (:meth:`~audioparity.candidates.Adapter.model_files`), judged with the weights it
        stores; our port's quantized cells are judged with ``<case>@<weight type>``, the same
        arithmetic on the bytes ggml's quantizer writes (docs/quantization.md)."""
        if not self.emulated(w):
            return False
        adapter = self.candidate(w).adapter
        return (not adapter.family_port and adapter.overrides("model_files")
                and self.converted_model(w) is not None)

    def storage_file(self, w: Any) -> str:
        """The storage file the candidate's conversion of {model} at {weight_type} left."""
        from audioparity.candidates.model_file import STORAGE_FILE

        return os.path.join(paths.fill(paths.CANDIDATE_MODEL, w), STORAGE_FILE)

    def reference_case(self, w: Any) -> str:
        """The reference dump a cell reads and is compared with: the float32 one, for a
        quantized weight type its quantization-aware one, ``<case>@<weight type>``, or its
        storage-matched one (:meth:`storage_matched`); a mix's cell of a candidate that makes
        none (unavailable) the float32 one."""
        if self.storage_matched(w):
            return os.path.join(paths.fill(paths.REFERENCE_STORAGE, w), w.case)
        emulated = self.emulated(w)  # a mix's cell of a candidate that makes none: float32's
        return paths.reference_dump(w.family, w.model, w.case,
                                    emulated if emulated not in MIXES else None)

    @staticmethod
    def f32_reference_case(w: Any) -> str:
        """The float32 reference dump of case {case}."""
        return paths.reference_dump(w.family, w.model, w.case)

    def reference_inputs(self, w: Any, ancient: Callable[[str], Any]) -> dict[str, Any]:
        """Inputs that bring case {case}'s reference dump, once its checkpoint is done: the
        reference directory, whose time stamp is ignored (``ancient``), and the case's content
        digest, which Snakemake compares by checksum; so a reference job that runs again
        reruns a dependent only where the dump it reads changed (docs/design.md, "Reruns").
        Without the digest (another sweep's reference job, which dumped other cases: its plan
        is newer, so it reruns first), the directory alone."""
        if self.storage_matched(w):
            return {"reference": paths.fill(paths.REFERENCE_STORAGE, w)}
        digest = paths.digest(self.reference_case(w))
        if not os.path.exists(digest):
            return {"reference": self.reference_dir(w)}
        return {"reference": ancient(self.reference_dir(w)), "reference_digest": digest}

    def reads_reference(self, w: Any) -> bool:
        """Whether the candidate's dump reads the case's reference dump (our port's
        teacher-forced stages, a third-party port's inputs)."""
        adapter = self.candidate(w).adapter
        if adapter.family_port:
            return self.plan(w).spec.ggml_reads_reference
        return adapter.reads_reference

    # -- the other references -----------------------------------------------------------------

    def reference_entry(self, w: Any) -> Reference:
        """Reference {reference} of {family} (config ``references``)."""
        return self.plan(w).references[w.reference]

    def environment_python(self, w: Any) -> Path | None:
        """The interpreter of reference {reference}'s environment, None for the project's."""
        reference = self.reference_entry(w)
        if reference.environment is None:
            return None
        packages = self.sweep.config["environments"][reference.environment]["packages"]
        return check_built(reference.environment, packages)

    def storage_reference_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of the storage-matched reference of a candidate's cells at {weight_type}: the
        model, the cases' plan, the reference side's code, and the candidate's conversion."""
        return {"model": self.model_input(w), "plan": self.reference_plan(w),
                "code": self.side_code("reference")(w),
                "converted": paths.fill(paths.CANDIDATE_MODEL, w)}

    def other_reference_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of reference {reference}'s job on {model}: the model, the cases' plan, the
        reference side's code, and its environment's record (a rebuilt one reruns it)."""
        inputs = {"model": self.model_input(w), "plan": self.reference_plan(w),
                  "code": self.side_code("reference")(w)}
        python = self.environment_python(w)
        if python is not None:
            inputs["environment"] = str(python.parent.parent / RECORD)
        return inputs

    def reference_compare_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of reference {reference}'s comparison with the primary on case {case}, but
        the primary's dump: the other reference's job directory and the compare's code."""
        return {"other": paths.OTHER_REFERENCE.format(family=w.family, model=w.model,
                                                      reference=w.reference),
                "code": self.compare_code(w)}

    def primary_name(self, w: Any) -> str:
        """The name of {family}'s primary reference (the ``against`` of its comparisons)."""
        return self.plan(w).primary.name

    # -- a candidate's files ------------------------------------------------------------------

    @staticmethod
    def candidate_dump(w: Any) -> str:
        """The candidate's dump of the cell."""
        return paths.fill(paths.GGML, w)

    @staticmethod
    def replay_dump(w: Any) -> str:
        """The reference's replay of the cell's candidate."""
        return paths.fill(paths.REPLAY, w)

    @staticmethod
    def baseline_dump(w: Any) -> str:
        """The candidate's dump of the cell on the baseline backend (cpu)."""
        return paths.fill(paths.GGML, w, backend=BASELINE_BACKEND)

    @staticmethod
    def backend_cell(w: Any) -> str:
        """The cell's comparison with the baseline backend (rule compare_backend)."""
        return paths.fill(paths.COMPARE_BACKEND, w)

    def on_gpu(self, w: Any) -> bool:
        """Whether the cell's jobs run a ggml backend other than the CPU's (the baseline): a
        named setting by its backend (``vulkan-no-f16``: vulkan). Such a job goes to the config's
        GPU resources (``cluster.gpu_resources``; rules/common.smk, ``gpu_resources``)."""
        return self.plan(w).backends[w.backend].backend != BASELINE_BACKEND

    def converted_model(self, w: Any) -> str | None:
        """The candidate's own model files for {model} at {weight_type} (rule
        candidate_model), or None when its adapter converts nothing or does not run that
        weight type (a recipe's: its base type, where its quantizer writes recipes)."""
        adapter = self.candidate(w).adapter
        base, _, recipe = w.weight_type.partition(RECIPE_SEPARATOR)
        if (not adapter.converts or base not in adapter.weight_types
                or (recipe and not adapter.overrides("recipe_options"))):
            return None
        return paths.fill(paths.CANDIDATE_MODEL, w)

    def weights_file(self, w: Any) -> str | None:
        """The GGUF file of {model}'s weights at {weight_type} that the family's own port maps
        (rule ggml_weights), or None for another candidate or a family that converts none."""
        if not self.plan(w).weights(w.candidate, w.weight_type):
            return None
        return paths.fill(paths.WEIGHTS, w)

    def port_files(self, w: Any) -> list[str]:
        """The built port's files (binaries, converter) a candidate's jobs depend on:
        rebuilding the port reruns its conversions and cells."""
        entry = self.candidate(w)
        return list(entry.adapter.files(entry.options))

    # -- code inputs --------------------------------------------------------------------------

    def side_code(self, side: str) -> Callable[[Any], str]:
        """Input function: the code input of a job of {family}'s ``side``."""

        def get(w: Any) -> str:
            family = self.sweep.families[w.family].family
            return self.code.stamp(f"{w.family}/{side}", lambda: self.code.side(family, side))

        get.__name__ = f"{side}_code"
        return get

    def run_code(self, w: Any) -> str:
        """The code input of a candidate's dump (``audioparity candidate run``)."""
        entry, family = self.candidate(w), self.plan(w).family
        return self.code.stamp(f"{w.family}/{w.candidate}/run", lambda: self.code.candidate_run(
            family, entry.adapter, entry.adapter_name))

    def convert_code(self, w: Any) -> str:
        """The code input of a candidate's conversion (``audioparity candidate convert``)."""
        entry = self.candidate(w)
        return self.code.stamp(f"{w.family}/{w.candidate}/convert",
                               lambda: self.code.candidate_convert(entry.adapter,
                                                                   entry.adapter_name))

    def precision_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of the recipe search of {weight_type} on {model} (rule precision): the
        model, its calibration cases' files, the search's code; never a port's code, nor the
        sweep's other cases."""
        cases = list(self.plan(w).calibration_cases(w.weight_type).values())
        return {"model": self.model_input(w), "cases": cases, "code": self.precision_code(w)}

    def precision_code(self, w: Any) -> str:
        """The code input of a precision search of {family} (rule precision)."""
        family = self.plan(w).family
        return self.code.stamp(f"{w.family}/precision", lambda: self.code.precision(family))

    def compare_code(self, w: Any) -> str:
        """The code input of a compare of {family}."""
        family = self.plan(w).family
        return self.code.stamp(f"{w.family}/compare", lambda: self.code.compare(family))

    def drilldown_code(self, w: Any) -> str:
        """The code input of a drill-down of {family}."""
        family = self.plan(w).family
        return self.code.stamp(f"{w.family}/drilldown", lambda: self.code.drilldown(family))

    def report_code(self, module: str) -> Callable[[Any], str]:
        """Input function: the code input of a report step (``audioparity.report.html``)."""
        families = [plan.family for plan in self.sweep.families.values()]

        def get(w: Any) -> str:
            return self.code.stamp(f"report/{module.rpartition('.')[2]}",
                                   lambda: self.code.report(module, families))

        get.__name__ = f"{module.rpartition('.')[2]}_code"
        return get

    # -- inputs of the rules that take several ------------------------------------------------

    def ggml_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of a candidate's dump, but the reference: the model (or its conversion),
        the case, the code, the port's files, the converted weights it maps, the recipe of a
        recipe weight type (a third-party port's cell of one is unavailable, saying so)."""
        return {**self._cell_inputs(w), "case": self.case_path(w), "code": self.run_code(w)}

    def _cell_inputs(self, w: Any) -> dict[str, Any]:
        """What a candidate's dumps of the cell read but the case and the code: the model (or
        its conversion), the port's files, the converted weights it maps, the recipe."""
        inputs = {"model": self.converted_model(w) or self.model_input(w),
                  "port": self.port_files(w)}
        weights = self.weights_file(w)
        if weights:
            inputs["weights"] = weights
        inputs.update(self.recipe_inputs(w))
        return inputs

    def other_references(self, w: Any) -> dict[str, str]:
        """The other references' dumps of case {case} that a float32 cell of {model} is also
        measured against where it fails (name -> dump; none for a quantized cell, judged
        against its quantization-aware reference)."""
        if self.emulated(w):
            return {}
        return {reference.name: os.path.join(paths.OTHER_REFERENCE.format(
                    family=w.family, model=w.model, reference=reference.name), w.case)
                for reference in self.plan(w).others if w.model in reference.models}

    def compare_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of a compare, but the reference: the candidate's dump, its replay (when it
        replays), the code, the other references' jobs (:meth:`other_references`); for a
        quantized cell, the float32 reference's digest (its cost); for a recipe's, the recipe
        (its targets, the row ``recipe``)."""
        inputs = {"candidate": self.candidate_dump(w), "code": self.compare_code(w),
                  **self.recipe_inputs(w)}
        others = [os.path.dirname(path) for path in self.other_references(w).values()]
        if others:
            inputs["others"] = others
        if self.emulated(w):
            inputs["cost_digest"] = paths.digest(self.f32_reference_case(w))
        if self.candidate(w).replay:
            inputs["replay"] = self.replay_dump(w)
        return inputs

    def backend_compare_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of a comparison of the cell with the same candidate on the baseline."""
        return {"baseline": self.baseline_dump(w), "candidate": self.candidate_dump(w),
                "code": self.compare_code(w)}

    def fresh_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of a candidate's cases run again in one process (rule compare_fresh): what
        its dumps read but the case (:meth:`ggml_inputs`), its code, every case's file and
        fresh dump (the cell's own dump of it, which brought its reference)."""
        plan, entry = self.plan(w), self.candidate(w)
        code = self.code.stamp(f"{w.family}/{w.candidate}/reuse", lambda: self.code.reuse(
            plan.family, entry.adapter, entry.adapter_name))
        return {**self._cell_inputs(w), "code": code, "cases": list(plan.cases.values()),
                "fresh": [paths.fill(paths.GGML, w, case=case) for case in plan.cases]}

    def drilldown_inputs(self, w: Any) -> dict[str, Any]:
        """Inputs of a drill-down, but the reference: the cell's comparison with the baseline
        backend, and what a dump of the family's port reads (model, case, code)."""
        return {"cell": self.backend_cell(w), "model": self.model_input(w),
                "case": self.case_path(w), "code": self.drilldown_code(w),
                **self.recipe_inputs(w)}

    # -- memory -------------------------------------------------------------------------------

    def memory_mb(self, side: str, w: Any, model: str | None, limit: float | None,
                  copies: int = 1) -> int:
        """The memory (MiB) a job of ``side`` asks for
        (:func:`~audioparity.dumping.memory.job_memory_mb`: a replay emulates its cell's weight
        type, a reference job its sweep's), once its model exists; before, the ggml side's base
        (Snakemake asks again before the job runs).

        Raises:
            AudioparityError: it would not fit ``limit`` (``--resources mem_mb``).
        """
        if model is None or not os.path.exists(model):
            return BASE_MEMORY_MB["ggml"]
        weight_type = getattr(w, "weight_type", None)
        emulates = bool(self.emulated(w) if weight_type else self.plan(w).emulated)
        need = job_memory_mb(side, model, weight_type, emulates, copies)
        cell = "/".join(v for v in (w.family, w.model, weight_type) if v)
        refuse_over_limit(need, limit, f"{side} job of {cell}")
        return need
