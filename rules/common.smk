# Input functions, wildcard constraints and the code each rule depends on.
import ast
import json
import os
import re
import shlex
import sys
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from audioparity.cli import BACKENDS, WEIGHT_TYPES
from audioparity.compare.gates import resolve_gates


validate(config, "../config/schema.yaml")

# Jobs find the `audioparity` command installed beside the Python that runs Snakemake (the
# project's .venv) when PATH has none, so `.venv/bin/snakemake` works without activating the
# venv; one earlier on PATH (an activated or conda environment) still comes first.
shell.prefix(f'set -euo pipefail; export PATH="$PATH":{shlex.quote(os.path.dirname(sys.executable))}; ')

#: Families present in the config, by their config key (= the `family` column of summary.csv).
FAMILIES = {name: config[name] for name in config["families"]}


def _named_paths(family, key):
    """{name: path} of config `family.key` (models or cases). Names must be unique; paths must
    exist unless a fixtures rule builds them (results/fixtures/...)."""
    paths = {}
    for entry in FAMILIES[family][key]:
        name, path = entry["name"], entry["path"]
        if name in paths:
            raise WorkflowError(f"config {family}.{key}: the name {name!r} is used twice")
        if not path.startswith("results/fixtures/") and not os.path.exists(path):
            raise WorkflowError(
                f"config {family}.{key} {name!r}: {path} does not exist "
                f"(relative paths are read from {os.getcwd()})"
            )
        paths[name] = path
    return paths


#: {family: {"models": {name: path}, "cases": {name: path}}}
PATHS = {
    family: {key: _named_paths(family, key) for key in ("models", "cases")} for family in FAMILIES
}
def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in sorted(set(values))) or "(?!)"


wildcard_constraints:
    family=_alternatives(FAMILIES),
    model=_alternatives(m for f in PATHS.values() for m in f["models"]),
    case=_alternatives(c for f in PATHS.values() for c in f["cases"]),
    backend=_alternatives(BACKENDS),
    weight_type=_alternatives(WEIGHT_TYPES),


PACKAGE = Path(workflow.basedir) / "src" / "audioparity"


def _module_file(name):
    """The file of module `name` ("audioparity.x.y"), or None when `name` is no module of ours."""
    base = PACKAGE.joinpath(*name.split(".")[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


def _imported_modules(path, package):
    """Names of the audioparity modules `path` imports, at any depth of its code (lazy imports
    inside functions included)."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def src_files(*modules):
    """Source files a job runs: `modules` ("models.parakeet_tdt.dump") and every audioparity
    module they import, transitively, with the packages' __init__ files on the way; plus
    cli.py, the entry point (whose per-command imports are not followed: it dispatches).

    Paths are relative to the working directory, so they read src/audioparity/... from the
    repository and lead back to this checkout from another --directory. Listed as inputs, they
    make an edit rerun exactly the jobs that run the edited code.
    """
    todo = [f"audioparity.{module}" for module in modules]
    files = {PACKAGE / "cli.py"}
    while todo:
        name = todo.pop()
        parts = name.split(".")
        for depth in range(1, len(parts) + 1):
            path = _module_file(".".join(parts[:depth]))
            if path is None or path in files:
                continue
            files.add(path)
            package = ".".join(parts[:depth]) if path.name == "__init__.py" else ".".join(
                parts[: depth - 1]
            )
            todo.extend(n for n in _imported_modules(path, package) if n.startswith("audioparity"))
    return sorted(os.path.relpath(path) for path in files)


#: The modules each stage runs; src_files() adds what they import.
ENTRY_POINTS = {
    "parakeet_tdt_fixture": ["models.parakeet_tdt.fixture"],
    "parakeet_tdt_reference": ["models.parakeet_tdt.reference"],
    "parakeet_tdt_ggml": ["guard", "models.parakeet_tdt.dump"],
    "moss_voicegen_fixture": ["models.moss_voicegen.fixture"],
    "moss_voicegen_reference": ["models.moss_voicegen.reference"],
    "moss_voicegen_ggml": ["guard", "models.moss_voicegen.dump"],
    "compare": ["compare"],
    "report_summary": ["report.summary"],
    "report_html": ["report.html"],
}


def code(stage):
    """`src_files` of the stage's entry points (a key of ENTRY_POINTS)."""
    return src_files(*ENTRY_POINTS[stage])


def get_model(wildcards):
    """Model path (a .nemo file or a checkpoint directory) of {family}/{model}."""
    return PATHS[wildcards.family]["models"][wildcards.model]


def get_case(wildcards):
    """Input file (audio or prompt) of {family}/{case}."""
    return PATHS[wildcards.family]["cases"][wildcards.case]


def family_model(family):
    """Input function: the path of model {model} of `family`."""
    return lambda wildcards: PATHS[family]["models"][wildcards.model]


def family_cases(family):
    """The input files (audio or prompts) of every case of `family`, in config order."""
    return list(PATHS[family]["cases"].values())


def reference_dirs(family):
    """Output of a reference job: one dump directory per case of `family`, same order."""
    return [
        directory(f"results/reference/{family}/{{model}}/{case}") for case in PATHS[family]["cases"]
    ]


def case_options(option):
    """Params function: `option FILE --output-dir DIR` for each case of the job, shell-quoted."""

    def get(wildcards, input, output):
        return " ".join(
            f"{option} {shlex.quote(path)} --output-dir {shlex.quote(folder)}"
            for path, folder in zip(input.cases, output, strict=True)
        )

    get.__name__ = "get_case_options"
    return get


def get_fixture_options(wildcards):
    """Command-line options of fixture {family}/{name} (config `fixtures`): `--seed N` and the
    flags set true, e.g. `--massive-activation`."""
    options = dict(config["fixtures"][wildcards.family][wildcards.name])
    flags = [f"--{key.replace('_', '-')}" for key, on in options.items() if on is True]
    return " ".join([f"--seed {options.pop('seed')}", *flags])


def get_gates(wildcards):
    """The gates and expected failures that apply to one cell, as JSON for `audioparity compare`."""
    gates = resolve_gates(
        FAMILIES[wildcards.family],
        model=wildcards.model,
        backend=wildcards.backend,
        weight_type=wildcards.weight_type,
    )
    return json.dumps(gates, sort_keys=True)


def family_setting(key):
    """Input function returning the config value `key` of the job's {family}."""

    def get(wildcards):
        return FAMILIES[wildcards.family][key]

    get.__name__ = f"get_{key}"
    return get


def print_outcome(summary, report):
    """After a successful run: the stages per status, and where the report is."""
    if not os.path.exists(summary):
        return
    import pandas as pd

    counts = pd.read_csv(summary)["status"].value_counts()
    line = ", ".join(f"{count} {status}" for status, count in counts.items())
    print(f"audioparity: {line}; report: {os.path.abspath(report)}")


def all_cells():
    """Every compare result of the sweep: family x model x case x backend x weight type."""
    return [
        f"results/compare/{family}/{model}/{backend}/{weight_type}/{case}.json"
        for family, section in FAMILIES.items()
        for model in PATHS[family]["models"]
        for case in PATHS[family]["cases"]
        for backend in section["backends"]
        for weight_type in section["weight_types"]
    ]
