# Input functions, wildcard constraints and the code each rule depends on.
import json
import os
import re
from pathlib import Path

from snakemake.utils import validate

from audioparity.cli import BACKENDS, WEIGHT_TYPES
from audioparity.compare.gates import resolve_gates


validate(config, "../config/schema.yaml")

#: Families present in the config, by their config key (= the `family` column of summary.csv).
FAMILIES = {name: config[name] for name in config["families"]}
#: {family: {"models": {name: path}, "cases": {name: path}}}
PATHS = {
    family: {key: {entry["name"]: entry["path"] for entry in section[key]} for key in ("models", "cases")}
    for family, section in FAMILIES.items()
}
def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in sorted(set(values))) or "(?!)"


wildcard_constraints:
    family=_alternatives(FAMILIES),
    model=_alternatives(m for f in PATHS.values() for m in f["models"]),
    case=_alternatives(c for f in PATHS.values() for c in f["cases"]),
    backend=_alternatives(BACKENDS),
    weight_type=_alternatives(WEIGHT_TYPES),


def src_files(*modules):
    """Source files of the package a rule runs, relative to the working directory.

    `src_files("models/parakeet_tdt/encoder")` -> ["src/audioparity/models/parakeet_tdt/encoder.py"]
    when the workflow runs from the repository; from another --directory the paths lead back to
    this checkout. Listing them as inputs makes an edit rerun exactly the dependent jobs.
    """
    package = Path(workflow.basedir) / "src" / "audioparity"
    return [os.path.relpath(package / f"{module}.py") for module in modules]


#: Code behind each stage; editing one of these files reruns the jobs of that stage and after.
CODE = {
    "common": ["__init__", "cli", "errors", "artifacts"],
    "parakeet_tdt_fixture": ["models/parakeet_tdt/fixture"],
    "parakeet_tdt_reference": ["audio", "models/parakeet_tdt/reference"],
    "parakeet_tdt_ggml": [
        "audio",
        "guard",
        "ggml/__init__",
        "ggml/runtime",
        "ggml/ops",
        "models/parakeet_tdt/config",
        "models/parakeet_tdt/weights",
        "models/parakeet_tdt/frontend",
        "models/parakeet_tdt/encoder",
        "models/parakeet_tdt/decoder",
        "models/parakeet_tdt/dump",
        "models/parakeet_tdt/reference",
    ],
    "moss_voicegen_fixture": ["models/moss_tts_delay/fixture"],
    "moss_voicegen_reference": [
        "models/moss_tts_delay/config",
        "models/moss_tts_delay/text_processor",
        "models/moss_tts_delay/delay_pattern",
        "models/moss_tts_delay/reference",
        "models/moss_tts_delay/remote_code/configuration_moss_tts",
        "models/moss_tts_delay/remote_code/modeling_moss_tts",
    ],
    "moss_voicegen_ggml": [
        "guard",
        "ggml/__init__",
        "ggml/runtime",
        "ggml/ops",
        "models/moss_tts_delay/config",
        "models/moss_tts_delay/weights",
        "models/moss_tts_delay/text_processor",
        "models/moss_tts_delay/backbone",
        "models/moss_tts_delay/delay_pattern",
        "models/moss_tts_delay/reference",
        "models/moss_tts_delay/dump",
    ],
    "compare": ["compare/__init__", "compare/metrics", "compare/gates", "compare/cell"],
    "report_summary": ["report/__init__", "report/summary"],
    "report_html": ["report/__init__", "report/html"],
}


def code(stage):
    """`src_files` of the common modules plus those of `stage` (a key of CODE)."""
    return src_files(*CODE["common"], *CODE[stage])


def get_model(wildcards):
    """Model path (a .nemo file or a checkpoint directory) of {family}/{model}."""
    return PATHS[wildcards.family]["models"][wildcards.model]


def get_case(wildcards):
    """Input file (audio or prompt) of {family}/{case}."""
    return PATHS[wildcards.family]["cases"][wildcards.case]


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
