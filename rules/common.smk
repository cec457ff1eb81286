# The config checked against the families' specs, wildcard constraints, input functions, and the
# code each rule depends on. One rule per stage serves every family; what differs between
# families is data, read from their specs (src/audioparity/models/<family>/__init__.py).
import ast
import functools
import hashlib
import json
import os
import re
import shlex
import sys
from pathlib import Path
from types import SimpleNamespace

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from audioparity.candidates import adapter_module
from audioparity.candidates import registered as candidate_adapters
from audioparity.compare.gates import resolve_gates
from audioparity.errors import AudioparityError
from audioparity.families import REPLAY, WEIGHTS, registered
from audioparity.memory import float_values, reference_bytes
from audioparity.storage import EMULATED_TYPES, emulated_dir
from audioparity.vocabulary import BACKENDS, WEIGHT_TYPES


SETTINGS = ("families", "fixtures")
FIXTURES = "results/fixtures"


def _known_keys():
    """Refuse a top-level config key that is neither a setting nor a registered family (a
    misspelt family section), before the schema would read it as one."""
    known = registered()
    for key in config:
        if key not in SETTINGS and key not in known:
            raise WorkflowError(f"config: {key!r} is neither {' nor '.join(SETTINGS)} nor a "
                                f"registered family ({', '.join(known)})")


_known_keys()
validate(config, "../config/schema.yaml")

# Jobs find the `audioparity` command installed beside the Python that runs Snakemake (the
# project's .venv) when PATH has none, so `.venv/bin/snakemake` works without activating the
# venv; one earlier on PATH (an activated or conda environment) still comes first.
shell.prefix(f'set -euo pipefail; export PATH="$PATH":{shlex.quote(os.path.dirname(sys.executable))}; ')

def _specs():
    """{family: spec} of the families the config sweeps, after checking that each has its
    section, and the family options and fixture entries against the specs (defaults filled
    in)."""
    known = registered()
    specs = {}
    for name in config["families"]:
        if name not in known:
            raise WorkflowError(f"config families: unknown family {name!r}; registered: "
                                f"{', '.join(known)}")
        if name not in config:
            raise WorkflowError(f"config families: {name!r} is listed but has no {name}: section")
        specs[name] = known[name]
    try:
        for name, spec in specs.items():
            config[name]["options"] = spec.check_options(config[name]["options"],
                                                         f"config {name}.options")
        for name, entries in config["fixtures"].items():
            if name not in known:
                raise WorkflowError(f"config fixtures: unknown family {name!r}; registered: "
                                    f"{', '.join(known)}")
            for fixture, entry in entries.items():
                entries[fixture] = known[name].check_options(
                    entry, f"config fixtures.{name}.{fixture}", fixture=True)
    except AudioparityError as err:
        raise WorkflowError(str(err)) from None
    return specs


#: {family: spec} of the swept families, and {family: config section}.
SPECS = _specs()
FAMILIES = {name: config[name] for name in SPECS}


def _backend_settings(family):
    """{name: {"backend": ggml backend, "env": {variable: value}}} of config {family}.backends:
    a ggml backend by its name, or a named setting of one (environment variables its dumps run
    with). Names are unique and no setting takes another backend's name."""
    settings = {}
    for entry in FAMILIES[family]["backends"]:
        entry = {"name": entry, "backend": entry} if isinstance(entry, str) else entry
        name = entry["name"]
        if name in settings:
            raise WorkflowError(f"config {family}.backends: the name {name!r} is used twice")
        if name in BACKENDS and name != entry["backend"]:
            raise WorkflowError(f"config {family}.backends {name!r}: a setting of "
                                f"{entry['backend']} cannot be named after the {name} backend")
        settings[name] = {"backend": entry["backend"], "env": dict(entry.get("env", {}))}
    return settings


#: {family: {backend name: {"backend": ggml backend, "env": {...}}}}
BACKEND_SETTINGS = {family: _backend_settings(family) for family in FAMILIES}
#: The backend every other one is compared with, stage by stage, where a family sweeps it.
BASELINE_BACKEND = "cpu"


def fixture_dir(family, path):
    """The fixture directory `path` lies in (results/fixtures/<family>/<name>), or None when it
    is no fixture's. A fixture must be declared in the config, and the path must name its model
    (the spec's `fixture_model` inside the directory).
    """
    parts = Path(path).parts
    if Path(path).is_absolute() or parts[:2] != tuple(FIXTURES.split("/")):
        return None
    if len(parts) < 4 or parts[2] != family or parts[3] not in config["fixtures"].get(family, {}):
        raise WorkflowError(f"config {family}: {path} is under {FIXTURES}/ but names no fixture "
                            f"the config declares (fixtures: {family}: <name>)")
    folder = "/".join(parts[:4])
    model = SPECS[family].fixture_model
    if Path(path) != Path(folder, model):
        raise WorkflowError(f"config {family}: {path} is not the model of fixture {folder}; "
                            f"expected {os.path.join(folder, model) if model else folder}")
    return folder


def _named_paths(family, key):
    """{name: path} of config `family.key` (models or cases). Names must be unique; paths must
    exist unless a fixture rule builds them."""
    paths = {}
    for entry in FAMILIES[family][key]:
        name, path = entry["name"], entry["path"]
        if name in paths:
            raise WorkflowError(f"config {family}.{key}: the name {name!r} is used twice")
        built = key == "models" and fixture_dir(family, path)
        if not built and not os.path.exists(path):
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


def _candidates(family):
    """{name: entry} of the family's candidates: names unique, each adapter registered, serving
    the family, its options checked (defaults filled in), its models the family's, `replay`
    (default: the adapter's) only where the family has a replay entry point."""
    entries = {}
    adapters = candidate_adapters()
    for entry in FAMILIES[family]["candidates"]:
        where = f"config {family}.candidates {entry['name']!r}"
        if entry["name"] in entries:
            raise WorkflowError(f"config {family}.candidates: the name {entry['name']!r} is "
                                "used twice")
        adapter = adapters.get(entry["adapter"])
        if adapter is None:
            raise WorkflowError(f"{where}: unknown adapter {entry['adapter']!r}; registered: "
                                f"{', '.join(adapters)}")
        if family not in adapter.families:
            raise WorkflowError(f"{where}: adapter {adapter.name!r} implements "
                                f"{', '.join(adapter.families)}, not {family}")
        for key, known in (("models", PATHS[family]["models"]),
                           ("weight_types", FAMILIES[family]["weight_types"])):
            unknown = sorted(set(entry.get(key, ())) - set(known))
            if unknown:
                raise WorkflowError(f"{where}: {key} {unknown} are not in {family}.{key}")
        try:
            if adapter.family_port:  # the family's options, these overriding the section's
                options = SPECS[family].check_options(
                    {**FAMILIES[family]["options"], **entry["options"]}, f"{where}.options")
            else:
                options = adapter.check_options(entry["options"], f"{where}.options")
        except AudioparityError as err:
            raise WorkflowError(str(err)) from None
        can_replay = REPLAY in SPECS[family].entry_points
        replay = entry.get("replay", adapter.replays and can_replay)
        if replay and not can_replay:
            raise WorkflowError(f"{where}: replay is set, but family {family} has no replay "
                                "entry point")
        entries[entry["name"]] = {
            **entry, "options": options, "replay": replay,
            "models": entry.get("models") or list(PATHS[family]["models"]),
            "weight_types": entry.get("weight_types") or FAMILIES[family]["weight_types"]}
    return entries


#: {family: {candidate name: entry}}
CANDIDATES = {family: _candidates(family) for family in FAMILIES}



def _alternatives(values):
    return "|".join(re.escape(str(v)) for v in sorted(set(values))) or "(?!)"


wildcard_constraints:
    family=_alternatives(FAMILIES),
    model=_alternatives(m for f in PATHS.values() for m in f["models"]),
    case=_alternatives(c for f in PATHS.values() for c in f["cases"]),
    candidate=_alternatives(c for f in CANDIDATES.values() for c in f),
    backend=_alternatives(b for f in BACKEND_SETTINGS.values() for b in f),
    weight_type=_alternatives(WEIGHT_TYPES),
    name="[A-Za-z0-9][A-Za-z0-9_.-]*",


PACKAGE = Path(workflow.basedir) / "src" / "audioparity"


def _module_file(name):
    """The file of module `name` ("audioparity.x.y"), or None when `name` is no module of ours."""
    base = PACKAGE.joinpath(*name.split(".")[1:])
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


@functools.cache
def _imported_modules(path, package):
    """Names of the audioparity modules `path` imports, at any depth of its code (lazy imports
    inside functions included); each file is parsed once per run."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            names.append(base)
            names.extend(f"{base}.{alias.name}" for alias in node.names)
    return tuple(names)


@functools.cache
def _src_files(modules):
    return tuple(_walk_imports(modules))


def src_files(*modules):
    """Source files a job runs: `modules` ("models.parakeet_tdt.dump") and every audioparity
    module they import, transitively, with the packages' __init__ files on the way; plus
    cli.py, the entry point (whose per-command imports are not followed: it dispatches).

    Paths are relative to the working directory, so they read src/audioparity/... from the
    repository and lead back to this checkout from another --directory. Listed as inputs, they
    make an edit rerun exactly the jobs that run the edited code.
    """
    return list(_src_files(modules))


def _walk_imports(modules):
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


def family_code(side):
    """Input function: the source files of the job's family on `side` (fixture, reference,
    ggml or replay: the module of the spec's entry point, and the crash guard around a ggml
    dump)."""

    def get(wildcards):
        entry = SPECS[wildcards.family].entry_points[side].partition(":")[0]
        extra = ("guard",) if side == "ggml" else ()
        return src_files(entry.removeprefix("audioparity."), *extra)

    get.__name__ = f"get_{side}_code"
    return get


def compare_code(wildcards):
    """The compare's source files and the job's family spec (isolated forms and their stages)."""
    return src_files("compare", f"models.{wildcards.family}")


def report_code(entry):
    """The source files of a report module and every swept family's spec (stage order)."""
    return src_files(entry, *(f"models.{family}" for family in SPECS))


def model_path(wildcards):
    """Path of model {model} of {family} (a file or a checkpoint directory)."""
    return PATHS[wildcards.family]["models"][wildcards.model]


def model_input(wildcards):
    """What a job on model {model} waits for: its fixture's directory when a rule builds it."""
    path = model_path(wildcards)
    return fixture_dir(wildcards.family, path) or path


def case_path(wildcards):
    """Input file (audio or prompt) of case {case} of {family}."""
    return PATHS[wildcards.family]["cases"][wildcards.case]


def case_paths(wildcards):
    """The input files of every case of {family}, in config order."""
    return list(PATHS[wildcards.family]["cases"].values())


def reference_dir(wildcards):
    """The reference job's directory of {family}/{model}: one dump per case."""
    return f"results/reference/{wildcards.family}/{wildcards.model}"


def emulated_types(family):
    """The weight types of {family}'s sweep that get a quantization-aware reference: the
    reference job dumps each case again as ggml's CPU backend computes with them."""
    return [t for t in FAMILIES[family]["weight_types"] if t in EMULATED_TYPES]


def _emulated(wildcards):
    """The cell's weight type where it is emulated, else None (f32, native; no weight type)."""
    weight_type = getattr(wildcards, "weight_type", None)
    return weight_type if weight_type in EMULATED_TYPES else None


def f32_reference_case(wildcards):
    """The float32 reference dump of case {case}."""
    return f"{reference_dir(wildcards)}/{wildcards.case}"


def reference_case(wildcards):
    """The reference dump a cell reads and is compared with: the float32 one, or for a
    quantized weight type its quantization-aware one, <case>@<weight type>."""
    return str(emulated_dir(f32_reference_case(wildcards), _emulated(wildcards)))


def reference_of(wildcards):
    """Inputs that bring case {case}'s reference dump: the reference directory, whose time
    stamp is ignored (ancient), and the case's content digest, which Snakemake compares by
    checksum. So a reference job that runs again (its code changed) reruns a dependent only
    where the dump it reads changed (docs/design.md, "Reruns")."""
    checkpoints.reference_dump.get(family=wildcards.family, model=wildcards.model)
    digest = f"{reference_case(wildcards)}.sha256"
    if not os.path.exists(digest):
        # the reference job of another sweep, which dumped other cases or weight types: its
        # plan is newer, so it reruns first, and this is evaluated again once it has
        return {"reference": reference_dir(wildcards)}
    return {"reference": ancient(reference_dir(wildcards)), "reference_digest": digest}


def _candidate(wildcards):
    """(config entry, adapter module) of candidate {candidate} of {family}."""
    entry = CANDIDATES[wildcards.family][wildcards.candidate]
    return entry, adapter_module(entry["adapter"])


def candidate_code(wildcards):
    """The source files a third-party candidate's jobs run: the adapter module and the code
    that runs it and reads what it writes (not the family's ggml port)."""
    entry, _ = _candidate(wildcards)
    return src_files("candidates.running", f"candidates.{entry['adapter']}")


def port_files(wildcards):
    """The built port's files (binaries, converter) a candidate's jobs depend on: rebuilding
    the port reruns its conversions and cells."""
    entry, port = _candidate(wildcards)
    if hasattr(port, "inputs"):
        return port.inputs(entry["options"])
    return port.ADAPTER.port_files(entry["options"])


def converted_model(wildcards):
    """The candidate's own model files for {model} at {weight_type} (rule candidate_model), or
    None when its adapter converts nothing or does not run that weight type."""
    entry, port = _candidate(wildcards)
    if not port.ADAPTER.converts or wildcards.weight_type not in port.ADAPTER.weight_types:
        return None
    return (f"results/candidates/{wildcards.family}/{wildcards.model}/{wildcards.candidate}/"
            f"{wildcards.weight_type}")


def weights_file(wildcards):
    """The GGUF file of {model}'s weights at {weight_type} that the family's own port maps
    (rule ggml_weights), or None for another candidate or a family without the entry point."""
    entry, port = _candidate(wildcards)
    if not port.ADAPTER.family_port or WEIGHTS not in SPECS[wildcards.family].entry_points:
        return None
    return (f"results/weights/{wildcards.family}/{wildcards.model}/{wildcards.candidate}/"
            f"{wildcards.weight_type}.gguf")


def weights_options(wildcards):
    """The weight conversion's options (those of the entry's options that change the
    weights: Parakeet's conv_weight_type), as flags."""
    entry, _ = _candidate(wildcards)
    return _quoted(arg for option in SPECS[wildcards.family].options_for(WEIGHTS)
                   for arg in option.argv(entry["options"][option.name]))


def ggml_backend(wildcards):
    """The ggml backend of backend {backend} of {family} (a setting's own backend)."""
    return BACKEND_SETTINGS[wildcards.family][wildcards.backend]["backend"]


def _with_env(argv, env):
    """`argv` as a shell command, run with the environment variables `env` when there are any."""
    return shlex.join([*(["env", *(f"{k}={v}" for k, v in env.items())] if env else []), *argv])


def candidate_options(wildcards):
    """The candidate's adapter options, as one JSON argument."""
    return shlex.quote(json.dumps(_candidate(wildcards)[0]["options"], sort_keys=True))


def ggml_inputs(wildcards):
    """Inputs of a candidate's dump: model (or its conversion), case, code, the port's files,
    and the reference when the candidate reads it (our port's teacher-forced stages)."""
    adapter = _candidate(wildcards)[1].ADAPTER
    if adapter.family_port:
        code, reads = family_code("ggml")(wildcards), SPECS[wildcards.family].ggml_reads_reference
    else:  # a tool of its own, run by `command` as is or through `candidate run`
        runner = candidate_code(wildcards) if adapter.output != "dump" else []
        code, reads = [*runner, *src_files("guard")], adapter.reads_reference
    inputs = {"model": converted_model(wildcards) or model_input(wildcards),
              "case": case_path(wildcards), "code": code, "port": port_files(wildcards)}
    if weights_file(wildcards):
        inputs["weights"] = weights_file(wildcards)
    if reads:
        inputs.update(reference_of(wildcards))
    return inputs


def candidate_dump(wildcards):
    """The candidate's dump of the cell."""
    return (f"results/ggml/{wildcards.family}/{wildcards.model}/{wildcards.candidate}/"
            f"{wildcards.backend}/{wildcards.weight_type}/{wildcards.case}")


def replay_dump(wildcards):
    """The reference's replay of the cell's candidate, where the candidate replays."""
    return candidate_dump(wildcards).replace("results/ggml/", "results/replay/", 1)


def compare_inputs(wildcards):
    """Inputs of a compare: the reference, the candidate's dump, its replay (when it replays),
    the compare's code; for a quantized cell, the float32 reference's digest too (its cost)."""
    inputs = {**reference_of(wildcards), "candidate": candidate_dump(wildcards),
              "code": compare_code(wildcards)}
    if _emulated(wildcards):
        inputs["cost_digest"] = f"{f32_reference_case(wildcards)}.sha256"
    if _candidate(wildcards)[0]["replay"]:
        inputs["replay"] = replay_dump(wildcards)
    return inputs


def replay_flag(wildcards, input):
    """`--replay DIR` when the compare has a replay input."""
    return f"--replay {shlex.quote(input.replay)}" if "replay" in input.keys() else ""


def cost_flag(wildcards):
    """`--cost-reference DIR` (the float32 reference) for a quantized cell."""
    return (f"--cost-reference {shlex.quote(f32_reference_case(wildcards))}"
            if _emulated(wildcards) else "")


def emulate_flag(wildcards):
    """`--emulate TYPE` for the replay of a quantized cell."""
    return f"--emulate {_emulated(wildcards)}" if _emulated(wildcards) else ""


def _quoted(values):
    return " ".join(shlex.quote(str(value)) for value in values)


def family_command(wildcards):
    """The family's subcommand of `audioparity fixture|reference|ggml` (parakeet-tdt)."""
    return SPECS[wildcards.family].command


def fixture_options(wildcards):
    """`--seed N` and the fixture options of config fixtures.{family}.{name}."""
    entry = config["fixtures"][wildcards.family][wildcards.name]
    spec = SPECS[wildcards.family]
    return _quoted(["--seed", entry["seed"], *(
        arg for option in spec.options_for("fixture") for arg in option.argv(entry[option.name]))])


def family_options(side):
    """Params function: the family options of `side` from its config section, as flags."""

    def get(wildcards):
        options = FAMILIES[wildcards.family]["options"]
        spec = SPECS[wildcards.family]
        return _quoted(arg for option in spec.options_for(side)
                       for arg in option.argv(options[option.name]))

    get.__name__ = f"get_{side}_options"
    return get


#: Resident memory (MiB) of a ggml-side job's process before the model: the Python stack.
BASE_MEMORY_MB = {"ggml": 600, "convert": 1000}
#: Bytes per weight of each storage type (q8_0: 34 per block of 32; native: float32, the worst
#: case of a checkpoint's own types).
STORAGE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q8_0": 34 / 32}


def memory_mb(side, copies=1):
    """Resource function: the memory (MiB) a job of `side` needs for its model (`input.model`,
    evaluated once the model exists), counted from its weights (`float_values`, the
    checkpoint's headers): on the reference side `reference_bytes` (the stack, the float32
    model, and a second float32 copy when the job emulates a weight type); on the ggml side
    and for a converter (`convert`) its base plus the weights in the cell's storage type;
    `copies` dumps in one job (a drill-down runs two). A job that would not fit the memory given
    to Snakemake (`--resources mem_mb=M`) is refused in one line before it starts: Snakemake
    would otherwise shrink its request to M silently."""

    def get(wildcards, input):
        model = input.get("model")
        if model is None or not os.path.exists(model):
            # asked while the job's inputs are not all known (a checkpoint pending) or not yet
            # built: Snakemake asks again before the job runs
            return BASE_MEMORY_MB["ggml"]
        weight_type = wildcards.get("weight_type")
        if side == "reference":  # a replay emulates its cell's type, a reference job its sweep's
            emulates = bool(_emulated(wildcards) if weight_type
                            else emulated_types(wildcards.family))
            need = reference_bytes(model, emulates) / 2**20
        else:
            need = (BASE_MEMORY_MB[side] + float_values(model) / 2**20
                    * STORAGE_BYTES.get(weight_type, STORAGE_BYTES["f32"]))
        need = int(copies * need) + 1
        limit = workflow.global_resources.get("mem_mb")
        limit = getattr(limit, "value", limit)  # a snakemake Resource, or a plain number
        if isinstance(limit, int | float) and need > limit:
            cell = (f"{wildcards.family}/{wildcards.model}" if weight_type is None
                    else f"{wildcards.family}/{wildcards.model}/{weight_type}")
            raise WorkflowError(f"{side} job of {cell} needs about {need} MB, more than "
                                f"--resources mem_mb={limit}: give it more memory")
        return need

    get.__name__ = f"memory_{side}"
    return get


def reference_plan(wildcards):
    """The file naming what the reference job of {family}/{model} dumps (:func:`_write_plans`)."""
    return f"{reference_dir(wildcards)}.plan.json"


def _write_plans():
    """Write each reference job's plan, its cases and emulated weight types, where it differs
    from the one on disk: a job input whose time stamp changes only when the plan does, so a
    sweep that needs other dumps from a model reruns its reference job first (a checkpoint
    with an output on disk is otherwise taken as done)."""
    for family in FAMILIES:
        plan = json.dumps({"cases": PATHS[family]["cases"],
                           "emulate": emulated_types(family)}, sort_keys=True) + "\n"
        for model in PATHS[family]["models"]:
            path = Path(f"results/reference/{family}/{model}.plan.json")
            if not path.is_file() or path.read_text() != plan:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(plan)


def reference_cases(wildcards, output):
    """`--audio FILE --output-dir DIR` (or `--prompt`) for each case of the reference job, and
    `--emulate TYPE` for each weight type it also dumps the cases for (:func:`emulated_types`)."""
    flag = SPECS[wildcards.family].input_flag
    return _quoted([*(arg for name, path in PATHS[wildcards.family]["cases"].items()
                      for arg in (flag, path, "--output-dir", f"{output[0]}/{name}")),
                    *(arg for t in emulated_types(wildcards.family) for arg in ("--emulate", t))])


def reference_cache(wildcards, input):
    """`--cache-dir` of the reference job of {family}/{model} and the digest of its code, so
    that a rerun for a new case restores the other cases' dumps (docs/design.md, "Reruns")."""
    digest = hashlib.sha256()
    for file in sorted(input.code):
        digest.update(f"{file}\0".encode())
        digest.update(Path(file).read_bytes())
    return _quoted(["--cache-dir", f"results/cache/reference/{wildcards.family}/{wildcards.model}",
                    "--code-digest", digest.hexdigest()])


def reference_dumps(wildcards, output):
    """The dump directories the reference job writes: one per case and emulated weight type."""
    return _quoted(emulated_dir(f"{output[0]}/{name}", weight_type)
                   for weight_type in (None, *emulated_types(wildcards.family))
                   for name in PATHS[wildcards.family]["cases"])


def ggml_command(wildcards, output, threads):
    """The candidate's dump command for one cell: a candidate whose adapter writes the dump
    contract itself runs its own commands (this project's port: `audioparity ggml <family>
    ...`); another runs through `audioparity candidate run`, which runs it and reads what it
    writes into a dump."""
    spec = SPECS[wildcards.family]
    entry, port = _candidate(wildcards)
    model = converted_model(wildcards) or model_path(wildcards)
    setting = BACKEND_SETTINGS[wildcards.family][wildcards.backend]
    if port.ADAPTER.output != "dump":
        reference = (["--reference-dir", reference_case(wildcards)]
                     if port.ADAPTER.reads_reference else [])
        return _with_env(["audioparity", "candidate", "run", "--family", wildcards.family,
                           "--adapter", entry["adapter"], "--options",
                           json.dumps(entry["options"], sort_keys=True), "--family-options",
                           json.dumps(FAMILIES[wildcards.family]["options"], sort_keys=True),
                           "--model", model,
                           spec.input_flag, case_path(wildcards), *reference, "--output-dir",
                           output[0], "--weight-type", wildcards.weight_type,
                           "--backend", setting["backend"], "--threads", str(threads)],
                         setting["env"])
    weights = weights_file(wildcards)
    try:
        commands = port.run(
            model, case_path(wildcards), output[0], spec=spec,
            family_options=FAMILIES[wildcards.family]["options"], options=entry["options"],
            weight_type=wildcards.weight_type, backend=setting["backend"], threads=threads,
            reference=reference_case(wildcards),
            **({"weights_file": weights} if weights else {}))
    except AudioparityError as err:
        raise WorkflowError(f"config {wildcards.family}.candidates "
                            f"{wildcards.candidate!r}: {err}") from None
    return " && ".join(_with_env(argv, {**env, **setting["env"]}) for argv, env in commands)


def get_gates(wildcards, against="reference"):
    """The gates and expected failures that apply to one cell compared with `against` (the
    reference, or the baseline backend), as JSON for `audioparity compare`."""
    gates = resolve_gates(
        FAMILIES[wildcards.family],
        model=wildcards.model,
        backend=wildcards.backend,
        weight_type=wildcards.weight_type,
        candidate=wildcards.candidate,
        case=wildcards.case,
        against=against,
        ggml_backend=ggml_backend(wildcards),
    )
    return json.dumps(gates, sort_keys=True)


def baseline_dump(wildcards):
    """The candidate's dump of the cell on the baseline backend (cpu)."""
    return (f"results/ggml/{wildcards.family}/{wildcards.model}/{wildcards.candidate}/"
            f"{BASELINE_BACKEND}/{wildcards.weight_type}/{wildcards.case}")


def backend_compare_inputs(wildcards):
    """Inputs of a comparison of the cell with the same candidate on the baseline backend."""
    return {"baseline": baseline_dump(wildcards), "candidate": candidate_dump(wildcards),
            "code": compare_code(wildcards)}


def drilldown_inputs(wildcards):
    """Inputs of a drill-down of the cell: its comparison with the baseline backend, and what
    a dump of the family's port on both backends reads (model, case, reference, code)."""
    code = sorted({*src_files("drilldown", "ggml.graphs"), *family_code("ggml")(wildcards)})
    inputs = {"cell": backend_cell(wildcards), "model": model_input(wildcards),
              "case": case_path(wildcards), "code": code}
    if SPECS[wildcards.family].ggml_reads_reference:
        inputs.update(reference_of(wildcards))
    return inputs


def backend_cell(wildcards):
    """The cell's comparison with the baseline backend (rule compare_backend)."""
    return (f"results/compare_backends/{wildcards.family}/{wildcards.model}/"
            f"{wildcards.candidate}/{wildcards.backend}/{wildcards.weight_type}/"
            f"{wildcards.case}.json")


def drilldown_command(wildcards, output, threads):
    """`audioparity drilldown <family> ...` for the cell, with the backend's settings."""
    spec = SPECS[wildcards.family]
    setting = BACKEND_SETTINGS[wildcards.family][wildcards.backend]
    options = _candidate(wildcards)[0]["options"]  # the family's own port: its family options
    flags = [arg for option in spec.options_for("ggml") for arg in option.argv(options[option.name])]
    reference = (["--reference-dir", reference_case(wildcards)] if spec.ggml_reads_reference
                 else [])
    return _with_env(["audioparity", "drilldown", spec.command, "--model", model_path(wildcards),
                      spec.input_flag, case_path(wildcards), *reference, "--weight-type",
                      wildcards.weight_type, "--backend", setting["backend"], "--against",
                      BASELINE_BACKEND, "--threads", str(threads), *flags, "--cell",
                      backend_cell(wildcards), "--cell-output", output.cell, "--output-dir",
                      output.folder], setting["env"])


def print_outcome(summary, report):
    """After a successful run: the stages per status, and where the report is."""
    if not os.path.exists(summary):
        return
    import pandas as pd

    rows = pd.read_csv(summary)
    parts = []
    for against, group in rows.groupby("against", sort=False):
        counts = ", ".join(f"{count} {status}"
                           for status, count in group["status"].value_counts().items())
        parts.append(counts if against == "reference" else f"against {against}: {counts}")
    print(f"audioparity: {'; '.join(parts)}; report: {os.path.abspath(report)}")
    failing = rows[(rows["against"] == "reference") & rows["status"].isin(
        ["fail", "crashed", "missing"])]
    for _, cell in failing.drop_duplicates(["family", "model", "case", "candidate", "backend",
                                            "weight_type"]).head(5).iterrows():
        print(f"audioparity: culprit of {cell['family']}/{cell['model']}/{cell['case']}/"
              f"{cell['candidate']}/{cell['backend']}/{cell['weight_type']}: {cell['culprit']}")


def _after_references():
    """Return once every reference job is done (its checkpoint). An input function that calls
    this is evaluated again after a reference job runs, as the compares are; so the report
    rules rerun after a reference job only if a compare did (rather than because a compare was
    planned before the reference digests were known)."""
    for family in FAMILIES:
        for model in PATHS[family]["models"]:
            checkpoints.reference_dump.get(family=family, model=model)


def reference_dirs(wildcards):
    """The reference job's directory of every model of the sweep (the checkpoints)."""
    return [f"results/reference/{family}/{model}" for family in FAMILIES
            for model in PATHS[family]["models"]]


def weights_files(wildcards):
    """The converted weights of every model, candidate and weight type of the sweep that maps
    them (rule ggml_weights), so that the conversions run beside the reference jobs instead of
    after them (the dumps that read them are known only once the references are done)."""
    cells = (SimpleNamespace(family=family, model=model, candidate=candidate, weight_type=type_)
             for family in FAMILIES for candidate, entry in CANDIDATES[family].items()
             for model in entry["models"] for type_ in entry["weight_types"])
    return [path for cell in cells if (path := weights_file(cell))]


def summary_input(wildcards):
    """summary.csv, once every reference job is done (:func:`_after_references`)."""
    _after_references()
    return "results/report/summary.csv"


def _cells():
    """(family, model, candidate, backend, weight type, case, against) of every cell of the
    sweep, from the config alone."""
    for family in FAMILIES:
        for candidate, entry in CANDIDATES[family].items():
            for model in entry["models"]:
                for backend in BACKEND_SETTINGS[family]:
                    for weight_type in entry["weight_types"]:
                        for case in PATHS[family]["cases"]:
                            yield family, model, candidate, backend, weight_type, case, "reference"
                            if backend != BASELINE_BACKEND and (
                                    BASELINE_BACKEND in BACKEND_SETTINGS[family]):
                                yield (family, model, candidate, backend, weight_type, case,
                                       BASELINE_BACKEND)


def sweep_cells(wildcards):
    """The sweep's cells as one JSON line (rule report_cells)."""
    return json.dumps([list(cell) for cell in _cells()])


def all_cells(wildcards):
    """Every compare result of the sweep: family x model x candidate x backend x weight type x
    case, against the reference and, for a backend other than the baseline (cpu, where the
    family sweeps it), against the baseline: the drill-down's rows for the family's own port,
    the plain comparison for another candidate. Once every reference job is done
    (:func:`_after_references`)."""
    _after_references()
    cells = []
    for family, model, candidate, backend, weight_type, case, against in _cells():
        cell = f"{family}/{model}/{candidate}/{backend}/{weight_type}/{case}"
        if against == "reference":
            cells.append(f"results/compare/{cell}.json")
        elif adapter_module(CANDIDATES[family][candidate]["adapter"]).ADAPTER.family_port:
            cells.append(f"results/drilldown/{cell}.json")
        else:
            cells.append(f"results/compare_backends/{cell}.json")
    return cells


_write_plans()
