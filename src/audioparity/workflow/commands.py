"""The arguments of each rule's command, from a job's wildcards (:mod:`.jobs`): shell words,
quoted. A candidate's dump always runs ``audioparity candidate run`` (our port in-process
through the driver, a third-party port through its adapter's commands), inside
``audioparity guard``, with its backend setting's environment variables.

What is the same for many jobs (a family's flags, the gates of a cell that differ only by a
case no expected failure names) is built once per run.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from collections.abc import Callable, Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any

from audioparity.compare.gate_lists import EXPECTED_LISTS, resolve_gates
from audioparity.compare.plan import CellKey
from audioparity.contract.spec import WEIGHTS
from audioparity.contract.vocabulary import RECIPE_SEPARATOR
from audioparity.workflow import paths
from audioparity.workflow.jobs import Jobs
from audioparity.workflow.plan import BASELINE_BACKEND, REFERENCE_WEIGHT_TYPE, WIDE


def quoted(values: Iterable[Any]) -> str:
    """``values`` as shell words."""
    return " ".join(shlex.quote(str(value)) for value in values)


def with_env(argv: list[str], env: Mapping[str, str]) -> str:
    """``argv`` as a shell command, run with the environment variables ``env`` when there are
    any."""
    return shlex.join([*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *argv])


def as_json(value: Any) -> str:
    """A JSON argument (keys sorted)."""
    return json.dumps(value, sort_keys=True)


class Commands:
    """The params of the sweep's rules (module docstring).

    Args:
        jobs: the sweep's jobs (:class:`~.jobs.Jobs`).
    """

    def __init__(self, jobs: Jobs) -> None:
        self.jobs = jobs
        self.sweep = jobs.sweep
        self._gates: dict[tuple, str] = {}
        self._cases: dict[tuple[str, str], tuple] = {}
        self._json: dict[tuple, tuple[str, str]] = {}

    def family_command(self, w: Any) -> str:
        """The family's subcommand of ``audioparity fixture|reference|replay|weights``."""
        return self.jobs.plan(w).spec.command

    def input_flag(self, w: Any) -> str:
        """``--audio`` or ``--prompt``: the flag of a case's file."""
        return self.jobs.plan(w).spec.input_flag

    def adapter(self, w: Any) -> str:
        """What the candidate's entry names as its adapter."""
        return self.jobs.candidate(w).adapter_name

    def fixture_options(self, w: Any) -> str:
        """``--seed N`` and the fixture options of config fixtures.{family}.{name}."""
        entry = self.sweep.config["fixtures"][w.family][w.name]
        spec = self.jobs.plan(w).spec
        return quoted(["--seed", entry["seed"], *(arg for option in spec.options_for("fixture")
                                                  for arg in option.argv(entry[option.name]))])

    def family_options(self, side: str) -> Callable[[Any], str]:
        """Params function: the family options of ``side`` from its config section, as
        flags."""

        def get(w: Any) -> str:
            return quoted(self.jobs.plan(w).option_values(side))

        get.__name__ = f"{side}_options"
        return get

    def weights_options(self, w: Any) -> str:
        """The weight conversion's options (those of the candidate's options that change the
        weights: Parakeet's ``conv_weight_type``), as flags."""
        options = self.jobs.candidate(w).options
        return quoted(arg for option in self.jobs.plan(w).spec.options_for(WEIGHTS)
                      for arg in option.argv(options[option.name]))

    def candidate_options(self, w: Any) -> str:
        """The candidate's adapter options, as one JSON argument."""
        return shlex.quote(self._options_json(w)[0])

    def cell_settings(self, w: Any) -> str:
        """What a cell's dump runs with besides its files: the candidate's and the family's
        options and the backend setting. A params function of the wildcards alone, so that
        Snakemake records it and reruns the cell when it changes (the command itself reads the
        job's output and threads, which Snakemake does not record)."""
        setting = self.jobs.plan(w).backends[w.backend]
        options, family_options = self._options_json(w)
        return f"{options} {family_options} {setting.backend} {as_json(setting.env)}"

    def _options_json(self, w: Any) -> tuple[str, str]:
        """The candidate's options and the family's, as JSON (built once per candidate)."""
        key = (w.family, w.candidate)
        if key not in self._json:
            plan = self.jobs.plan(w)
            self._json[key] = (as_json(plan.candidates[w.candidate].options),
                               as_json(plan.section["options"]))
        return self._json[key]

    # -- the reference job --------------------------------------------------------------------

    def reference_cases(self, w: Any, output: Any) -> str:
        """``--audio FILE --output-dir DIR`` (or ``--prompt``) for each case of the reference
        job, and ``--emulate TYPE`` for each weight type it also dumps the cases for."""
        plan = self.jobs.plan(w)
        flag = plan.spec.input_flag
        return quoted([*(arg for name, path in plan.cases.items()
                         for arg in (flag, path, "--output-dir", f"{output[0]}/{name}")),
                       *(arg for t in plan.emulated for arg in ("--emulate", t)),
                       *(arg for t in plan.emulated if plan.recipe_file(w.model, t)
                         for arg in ("--recipe", f"{t}={plan.recipe_file(w.model, t)}"))])

    def storage_reference_command(self, w: Any, output: Any, input: Any, threads: int) -> str:
        """``audioparity reference <family> --storage <weight type>=<file>`` of {candidate}'s
        cells at {weight_type} on {model}: every case, computed with the weights its model
        file stores, kept in a cache by the file's digest."""
        plan = self.jobs.plan(w)
        return quoted(["audioparity", "reference", plan.spec.command, "--model",
                       self.jobs.model_path(w),
                       *(arg for name, path in plan.cases.items()
                         for arg in (plan.spec.input_flag, path, "--output-dir",
                                     f"{output[0]}/{name}")),
                       "--storage", f"{w.weight_type}={self.jobs.storage_file(w)}",
                       "--threads", str(threads), "--cache-dir",
                       paths.REFERENCE_STORAGE_CACHE.format(family=w.family, model=w.model),
                       "--code-digest", self.jobs.code.digest_of(input.code),
                       *plan.option_values("reference")])

    def other_reference_command(self, w: Any, output: Any, threads: int) -> str:
        """``audioparity reference`` of reference {reference} on {model}: every case, float32,
        its implementation, with its environment's interpreter where it names one; a model it
        cannot run gives unavailable dumps saying why, not a failed sweep."""
        plan, reference = self.jobs.plan(w), self.jobs.reference_entry(w)
        python = self.jobs.environment_python(w)
        program = ["audioparity"] if python is None else [str(python), "-m", "audioparity.cli"]
        return quoted([*program, "reference", plan.spec.command, "--model",
                       self.jobs.model_path(w),
                       *(arg for name, path in plan.cases.items()
                         for arg in (plan.spec.input_flag, path, "--output-dir",
                                     f"{output[0]}/{name}")),
                       "--threads", str(threads), "--unavailable-on-error",
                       *plan.option_values("reference", reference=reference)])

    def recipe_flag(self, w: Any) -> list[str]:
        """``--recipe <type>+<name>=FILE`` for a job of a recipe weight type, else nothing."""
        recipe = self.jobs.recipe_file(w)
        return ["--recipe", f"{w.weight_type}={recipe}"] if recipe else []

    def recipe_option(self, w: Any) -> str:
        """:meth:`recipe_flag` quoted for a shell command."""
        return quoted(self.recipe_flag(w))

    def reference_dumps(self, w: Any, output: Any) -> str:
        """The dump directories the reference job writes: one per case and emulated type."""
        plan = self.jobs.plan(w)
        return quoted(paths.reference_dump(w.family, w.model, name, weight_type)
                      for weight_type in (None, *plan.emulated) for name in plan.cases)

    def reference_cache(self, w: Any, input: Any) -> str:
        """``--cache-dir`` of the reference job of {family}/{model} and the digest of its code
        (its code input's), so that a rerun for a new case restores the other cases' dumps
        (docs/design.md, "Reruns")."""
        return quoted(["--cache-dir", paths.REFERENCE_CACHE.format(family=w.family,
                                                                   model=w.model),
                       "--code-digest", self.jobs.code.digest_of(input.code)])

    def precision_command(self, w: Any, output: Any, threads: int) -> str:
        """``audioparity precision <family> --no-verify`` for the recipe of weight type
        {weight_type} (``<type>+<name>``) of {model}, on its calibration cases, with the recipe
        entry's wide type and targets and the reference's options: the search alone, which
        runs no port (every cell of the weight type verifies the recipe)."""
        plan = self.jobs.plan(w)
        base, _, name = w.weight_type.partition(RECIPE_SEPARATOR)
        entry = plan.section["recipes"][name]
        return quoted(["audioparity", "precision", plan.spec.command, "--model",
                       self.jobs.model_path(w),
                       *(arg for path in plan.calibration_cases(w.weight_type).values()
                         for arg in (plan.spec.input_flag, path)),
                       "--weight-type", base, "--wide", entry.get("wide", WIDE),
                       "--targets", as_json(entry["targets"]), "--name", name,
                       "--output", output[0], "--threads", str(threads), "--no-verify",
                       *plan.option_values("reference")])

    # -- a candidate's dump, a drill-down -----------------------------------------------------

    def ggml_command(self, w: Any, output: Any, threads: int) -> str:
        """``audioparity candidate run`` for one cell, with its backend setting's environment
        variables."""
        plan, setting = self.jobs.plan(w), self.jobs.plan(w).backends[w.backend]
        reference = (["--reference-dir", self.jobs.reference_case(w)]
                     if self.jobs.reads_reference(w) else [])
        return with_env(self._run_argv(w, threads, [plan.spec.input_flag,
                                                    self.jobs.case_path(w), *reference],
                                       ["--output-dir", output[0]]),
                        setting.env)

    def _run_argv(self, w: Any, threads: int, case: list[str] | tuple = (),
                  output: list[str] | tuple = ()) -> list[str]:
        """``audioparity candidate run`` for the cell's candidate, model, weight type and
        backend, with the arguments ``case`` (its file, its reference) and ``output`` (its
        dump) where given."""
        setting = self.jobs.plan(w).backends[w.backend]
        options, family_options = self._options_json(w)
        weights = self.jobs.weights_file(w)
        model = self.jobs.converted_model(w) or self.jobs.model_path(w)
        return ["audioparity", "candidate", "run", "--family", w.family, "--adapter",
                self.adapter(w), "--options", options, "--family-options", family_options,
                "--model", model, *case, *(["--weights-file", weights] if weights else []),
                *output, "--weight-type", w.weight_type, *self.recipe_flag(w), "--backend",
                setting.backend, "--threads", str(threads)]

    def fresh_command(self, w: Any, output: Any, threads: int) -> str:
        """``audioparity candidate reuse`` of the candidate's cell on every case of {model}
        (each fresh dump, in the config's order), with the config's ``reuse_bounds`` that
        match it and its backend setting's environment variables."""
        plan, setting = self.jobs.plan(w), self.jobs.plan(w).backends[w.backend]
        labels = [arg for key in ("family", "model", "candidate", "backend", "weight_type")
                  for arg in ("--label", f"{key}={getattr(w, key)}")]
        fresh = [arg for case in plan.cases
                 for arg in ("--fresh", f"{case}={paths.fill(paths.GGML, w, case=case)}")]
        return with_env(["audioparity", "candidate", "reuse", *fresh,
                         "--bounds", self.fresh_bounds(w), *labels, "--output-dir", output[0],
                         "--", *self._run_argv(w, threads)],
                        setting.env)

    def fresh_bounds(self, w: Any) -> str:
        """The section's ``reuse_bounds`` that match the cell (model, candidate, backend,
        weight type), as the JSON list ``audioparity candidate reuse --bounds`` takes:
        ``{stage, max_abs, reason}`` each, in the config's order."""
        cell = {"model": w.model, "candidate": w.candidate, "backend": w.backend,
                "weight_type": w.weight_type}
        return as_json([{key: entry[key] for key in ("stage", "max_abs", "reason")}
                        for entry in self.jobs.plan(w).section["reuse_bounds"]
                        if all(fnmatchcase(value, entry.get(key, "*"))
                               for key, value in cell.items())])

    def drilldown_command(self, w: Any, output: Any, threads: int) -> str:
        """``audioparity drilldown <family> ...`` for the cell, with the backend's settings."""
        plan, setting = self.jobs.plan(w), self.jobs.plan(w).backends[w.backend]
        spec, options = plan.spec, self.jobs.candidate(w).options
        flags = [arg for option in spec.options_for("ggml")
                 for arg in option.argv(options[option.name])]
        reference = (["--reference-dir", self.jobs.reference_case(w)]
                     if spec.ggml_reads_reference else [])
        return with_env(["audioparity", "drilldown", spec.command, "--model",
                         self.jobs.model_path(w), spec.input_flag, self.jobs.case_path(w),
                         *reference, "--weight-type", w.weight_type, *self.recipe_flag(w),
                         "--backend",
                         setting.backend, "--against", BASELINE_BACKEND, "--threads",
                         str(threads), *flags, "--cell", self.jobs.backend_cell(w),
                         "--cell-output", output.cell, "--output-dir", output.folder],
                        setting.env)

    # -- a compare ----------------------------------------------------------------------------

    def gates(self, w: Any, against: str = "reference") -> str:
        """The gates and expected failures of one cell compared with ``against`` (the
        reference, or the baseline backend), as JSON for ``audioparity compare``
        (:func:`~audioparity.compare.gate_lists.resolve_gates`; the cells that differ only by a
        case that no expected failure's ``case`` pattern tells apart share one)."""
        plan = self.jobs.plan(w)
        case = self._case_signature(w.family, w.case) if against == "reference" else ()
        key = (w.family, w.model, w.backend, w.weight_type, w.candidate, against, case)
        if key not in self._gates:
            cell = CellKey(w.family, w.model, w.candidate, w.backend, w.weight_type, w.case,
                           against)
            self._gates[key] = as_json(resolve_gates(
                plan.section, cell, ggml_backend=plan.backends[w.backend].backend))
        return self._gates[key]

    def _case_signature(self, family: str, case: str) -> tuple:
        """Which of the ``case`` patterns of ``family``'s expected failures match ``case``
        (all that the gates of a cell read of its case)."""
        key = (family, case)
        if key not in self._cases:
            section = self.sweep.families[family].section
            patterns = sorted({entry.get("case", "*") if isinstance(entry, Mapping)
                               and isinstance(entry.get("case", "*"), str) else repr(entry)
                               for name in EXPECTED_LISTS for entry in section.get(name) or []})
            self._cases[key] = tuple(fnmatchcase(case, pattern) for pattern in patterns)
        return self._cases[key]

    def reference_gates(self, w: Any) -> str:
        """The gates of reference {reference}'s comparison with the primary on case {case}:
        the family's float32 ones on the CPU, its declared differences as expected failures."""
        plan, reference = self.jobs.plan(w), self.jobs.reference_entry(w)
        return as_json(resolve_gates(
            {"gates": plan.section["gates"], "expected_failures": list(reference.differences)},
            CellKey(w.family, w.model, w.reference, BASELINE_BACKEND, REFERENCE_WEIGHT_TYPE,
                    w.case)))

    def backend_gates(self, w: Any) -> str:
        """The cell's gates against the baseline backend."""
        return self.gates(w, against=BASELINE_BACKEND)

    def replay_flag(self, w: Any, input: Any) -> str:
        """``--replay DIR`` when the compare has a replay input."""
        return f"--replay {shlex.quote(input.replay)}" if "replay" in input.keys() else ""

    def cost_flag(self, w: Any) -> str:
        """``--cost-reference DIR`` (the float32 reference) for a quantized cell, and
        ``--recipe FILE`` for a recipe's (its targets judged against it)."""
        recipe = self.jobs.recipe_file(w)
        return quoted([*(("--cost-reference", self.jobs.f32_reference_case(w))
                         if self.jobs.emulated(w) else ()),
                       *(("--recipe", recipe) if recipe else ())])

    def other_reference_flags(self, w: Any) -> str:
        """``--other-reference NAME=DUMP`` for each other reference of a float32 cell."""
        return quoted(arg for name, path in self.jobs.other_references(w).items()
                      for arg in ("--other-reference", f"{name}={path}"))

    def known_text_flag(self, w: Any) -> str:
        """``--known-text TEXT`` where the cell's case gives what is said in its audio."""
        text = self.jobs.plan(w).known_texts.get(w.case)
        return f"--known-text {shlex.quote(text)}" if text is not None else ""

    def emulate_flag(self, w: Any) -> str:
        """``--emulate TYPE`` for the replay of a quantized cell, ``--storage TYPE=FILE`` for
        one whose reference is storage-matched."""
        emulated = self.jobs.emulated(w)
        if emulated and self.jobs.storage_matched(w):
            return quoted(["--storage", f"{emulated}={self.jobs.storage_file(w)}"])
        return quoted(["--emulate", emulated, *self.recipe_flag(w)]) if emulated else ""

    def sweep_cells(self, w: Any) -> str:
        """The digest of the sweep's cells (rule report_cells' params: it writes their list
        again when they change); a digest, since a sweep may have 100,000."""
        cells = json.dumps([list(cell) for cell in self.sweep.cells()])
        return hashlib.sha256(cells.encode()).hexdigest()
