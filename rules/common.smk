# Glue between the rules and the workflow's logic, which lives in the package with its tests
# (src/audioparity/workflow/): the config checked into the sweep's plan, the wildcard
# constraints, and the input and resource functions that need Snakemake itself (checkpoints,
# --resources). The rules name the rest directly: JOBS (inputs), COMMANDS (params), paths.
import inspect
import os
import shlex
import sys
from pathlib import Path

from snakemake.common import overwrite_function_params
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from audioparity.contract.errors import AudioparityError
from audioparity.models.registry import registered
from audioparity.report.summary import write_cell_list
from audioparity.workflow import paths, start
from audioparity.workflow.outcome import outcome, record_run
from audioparity.workflow.plan import (
    BASELINE_BACKEND,
    REFERENCE_BACKEND,
    REFERENCE_WEIGHT_TYPE,
    check_keys,
)

try:
    check_keys(config, registered())
except AudioparityError as err:
    raise WorkflowError(str(err)) from None
validate(config, "../config/schema.yaml")
try:
    COMMANDS = start(config, Path(workflow.basedir) / "src")
except AudioparityError as err:
    raise WorkflowError(str(err)) from None
JOBS = COMMANDS.jobs
SWEEP = JOBS.sweep

# Jobs find the `audioparity` command installed beside the Python that runs Snakemake (the
# project's .venv) when PATH has none, so `.venv/bin/snakemake` works without activating the
# venv; one earlier on PATH (an activated or conda environment) still comes first.
shell.prefix(f'set -euo pipefail; export PATH="$PATH":{shlex.quote(os.path.dirname(sys.executable))}; ')


wildcard_constraints:
    **SWEEP.constraints(),


def _named_once(function):
    """`function` with its parameters read once: Snakemake reads those of each input, params
    and resource function again for every job (inspect.signature) otherwise."""
    target = getattr(function, "__func__", function)  # a bound method's function
    overwrite_function_params(target, inspect.signature(function).parameters)
    return function


for _owner in (JOBS, COMMANDS):
    for _name, _member in inspect.getmembers(_owner, callable):
        if not _name.startswith("_") and not inspect.isclass(_member):
            _named_once(_member)


def side_code(side):
    """The code input of a job of {family}'s `side` (JOBS.side_code)."""
    return _named_once(JOBS.side_code(side))


def report_code(module):
    """The code input of a report step (JOBS.report_code)."""
    return _named_once(JOBS.report_code(module))


def family_options(side):
    """The family options of `side`, as flags (COMMANDS.family_options)."""
    return _named_once(COMMANDS.family_options(side))


#: (family, model) of the reference checkpoints known done: asked once each, not per job.
_REFERENCES_DONE = set()


@_named_once
def reference_of(wildcards):
    """Inputs that bring case {case}'s reference dump, once the reference checkpoint of
    {family}/{model} is done (JOBS.reference_inputs)."""
    key = (wildcards.family, wildcards.model)
    if key not in _REFERENCES_DONE:  # raises until it is done; once done, it stays done
        checkpoints.reference_dump.get(family=wildcards.family, model=wildcards.model)
        _REFERENCES_DONE.add(key)
    return JOBS.reference_inputs(wildcards, ancient)


@_named_once
def ggml_inputs(wildcards):
    """A candidate's dump: model, case, code, port, weights; the reference where it reads it."""
    inputs = JOBS.ggml_inputs(wildcards)
    if JOBS.reads_reference(wildcards):
        inputs.update(reference_of(wildcards))
    return inputs


@_named_once
def compare_inputs(wildcards):
    """A compare: the reference, the candidate's dump, its replay, the code, the cost's digest."""
    return {**reference_of(wildcards), **JOBS.compare_inputs(wildcards)}


@_named_once
def reference_compare_inputs(wildcards):
    """Another reference against the primary: the primary's dump of the case, the other's."""
    return {**reference_of(wildcards), **JOBS.reference_compare_inputs(wildcards)}


@_named_once
def drilldown_inputs(wildcards):
    """A drill-down: the cell against the baseline, what our port's dump reads."""
    inputs = JOBS.drilldown_inputs(wildcards)
    if SWEEP.families[wildcards.family].spec.ggml_reads_reference:
        inputs.update(reference_of(wildcards))
    return inputs


def memory_mb(side, copies=1):
    """Resource function: the memory (MiB) a job of `side` needs (JOBS.memory_mb); a job that
    would not fit --resources mem_mb is refused in one line before it starts."""

    def get(wildcards, input):
        limit = workflow.global_resources.get("mem_mb")
        limit = getattr(limit, "value", limit)  # a snakemake Resource, or a plain number
        try:
            return JOBS.memory_mb(side, wildcards, input.get("model"), limit, copies)
        except AudioparityError as err:
            raise WorkflowError(str(err)) from None

    get.__name__ = f"memory_{side}"
    return _named_once(get)


def gpu_resources():
    """Resource functions of the jobs that run a cell's ggml backend: for each entry of the
    config's cluster.gpu_resources (the executor's names: slurm_partition, gres, ...), its value
    for a cell on a backend other than the CPU (JOBS.on_gpu; Vulkan's too), unset for a CPU
    cell, which then goes where the cluster sends a job without it (docs/cluster.md); none
    without the entry (a local run)."""

    def resource(name, value):
        def get(wildcards):
            return value if JOBS.on_gpu(wildcards) else None

        get.__name__ = f"gpu_{name}"
        return _named_once(get)

    return {name: resource(name, value)
            for name, value in config["cluster"]["gpu_resources"].items()}


def _after_references():
    """Return once every reference job is done (its checkpoint). An input function that calls
    this is evaluated again after a reference job runs, as the compares are; so the report
    rules rerun after a reference job only if a compare did (rather than because a compare was
    planned before the reference digests were known)."""
    for family, plan in SWEEP.families.items():
        for model in plan.models:
            if (family, model) not in _REFERENCES_DONE:
                checkpoints.reference_dump.get(family=family, model=model)
                _REFERENCES_DONE.add((family, model))


def cell_files():
    """Every cell's result (SWEEP.result; a folder holding several once), in the sweep's
    order."""
    return list(dict.fromkeys(SWEEP.result(cell) for cell in SWEEP.cells()))


@_named_once
def all_cells(wildcards):
    """Every cell's result (cell_files), once every reference job is done."""
    _after_references()
    return cell_files()


def write_cell_files(output, log):
    """Rule report_cells: the list of every cell's result, one a line (the summary reads it:
    a sweep's are too many for a command line), and how many in the log."""
    count = write_cell_list(cell_files(), output)
    Path(log).write_text(f"{count} cell files listed in {output}\n")


@_named_once
def summary_input(wildcards):
    """summary.csv, once every reference job is done."""
    _after_references()
    return paths.SUMMARY


@_named_once
def reference_dirs(wildcards):
    """The reference job's directory of every model of the sweep (the checkpoints)."""
    return SWEEP.reference_dirs()


@_named_once
def weights_files(wildcards):
    """The converted weights of the sweep (rule ggml_weights), started beside the reference
    jobs instead of after them (the dumps that read them wait for the references)."""
    return SWEEP.weights_files()


def print_outcome(summary, report):
    """After a successful run: the stages per status, and where the report is."""
    for line in outcome(summary, report):
        print(line)
