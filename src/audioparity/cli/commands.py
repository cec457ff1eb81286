"""What each ``audioparity`` subcommand does: one function each, given the parsed arguments;
exit code None or 0 done, otherwise the code."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from functools import partial
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.spec import WEIGHTS

log = logging.getLogger("audioparity")


def _options(args: argparse.Namespace, side: str) -> dict:
    """The family options of ``side`` as parsed, by name."""
    return {option.name: getattr(args, option.name) for option in args.spec.options_for(side)}


def _load_gates(text: str, flag: str = "--gates") -> Any:
    """Inline JSON (an object or a list) or a .json/.yaml file, parsed.

    Raises:
        AudioparityError: neither (the flag named).
    """
    if text.lstrip().startswith(("{", "[")):
        try:
            return json.loads(text)
        except ValueError as err:
            raise AudioparityError(f"{flag} {text[:60]!r}: not JSON ({err})") from None
    path = Path(text)
    if not path.is_file():
        raise AudioparityError(f"{flag} {text}: neither JSON nor a file")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(path.read_text())
    try:
        return json.loads(path.read_text())
    except ValueError as err:
        raise AudioparityError(f"{flag} {path}: not JSON ({err})") from None


def _json_object(text: str, flag: str) -> dict:
    """``text`` parsed as a JSON object.

    Raises:
        AudioparityError: not JSON, or not an object.
    """
    try:
        value = json.loads(text)
    except ValueError as err:
        raise AudioparityError(f"{flag} {text[:60]!r}: not JSON ({err})") from None
    if not isinstance(value, dict):
        raise AudioparityError(f"{flag}: expected a JSON object, got {type(value).__name__}")
    return value


def _labels(pairs: list[str]) -> dict[str, str]:
    labels = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise AudioparityError(f"--label {pair!r}: expected KEY=VALUE")
        labels[key] = value
    return labels


def _pairs(values: list[str], flag: str, form: str) -> dict[str, str]:
    """``NAME=PATH`` arguments of ``flag`` as name -> path.

    Raises:
        AudioparityError: one that is not of ``form`` (the flag named).
    """
    pairs = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not (name and sep and path):
            raise AudioparityError(f"{flag} {value!r}: expected {form}")
        pairs[name] = path
    return pairs


def _family(args: argparse.Namespace):
    """The family of a family command's subcommand (its spec is ``args.spec``)."""
    from audioparity.models.registry import family

    return family(args.spec.name)


def _recipes(args: argparse.Namespace) -> dict[str, Path]:
    """``--recipe <type>+<name>=FILE`` arguments as weight type -> file.

    Raises:
        AudioparityError: an argument without ``=``, or a weight type given twice.
    """
    found: dict[str, Path] = {}
    for text in getattr(args, "recipe", []):
        weight_type, separator, path = text.partition("=")
        if not separator or "+" not in weight_type or not path:
            raise AudioparityError(f"--recipe {text!r}: expected <type>+<name>=FILE")
        if weight_type in found:
            raise AudioparityError(f"--recipe {weight_type}: given twice")
        found[weight_type] = Path(path)
    return found


def _weight_type(args: argparse.Namespace, text: str | None):
    """A weight type as the driver takes it: the name, or for ``<type>+<name>`` the recipe read
    from the ``--recipe <type>+<name>=FILE`` given
    (:func:`~audioparity.dumping.weight_files.read_recipe`).

    Raises:
        AudioparityError: a recipe's weight type without its ``--recipe``, or a bad file.
    """
    from audioparity.contract.vocabulary import RECIPE_SEPARATOR
    from audioparity.dumping.weight_files import read_recipe

    if text is None or RECIPE_SEPARATOR not in text:
        return text
    recipes = _recipes(args)
    if text not in recipes:
        raise AudioparityError(f"weight type {text}: give its recipe as --recipe {text}=<file>")
    return read_recipe(recipes[text], text)


def _storage(args: argparse.Namespace):
    """The candidate's storage file of ``--storage <weight type>=FILE``
    (:class:`~audioparity.dumping.weight_files.FileStorage`), None without one.

    Raises:
        AudioparityError: not a GGUF file.
    """
    from audioparity.dumping.weight_files import FileStorage

    if getattr(args, "storage", None) is None:
        return None
    weight_type, path = args.storage
    if not path.is_file():
        raise AudioparityError(f"--storage {weight_type}={path}: no such file")
    return FileStorage.read(path, weight_type)


def _recipe_digests(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """``{"recipes": {weight type: {base, overrides}}}`` for a dump cache's key, or ``{}``: the
    recipe's content, never its file's other fields (the search's trials, timings), so a
    recipe found again the same restores its emulated dumps and a changed one computes them."""
    from audioparity.dumping.weight_files import read_recipe

    recipes = _recipes(args)
    if not recipes:
        return {}
    return {"recipes": {name: {"base": (recipe := read_recipe(path, name)).base,
                               "overrides": dict(sorted(recipe.overrides.items()))}
                        for name, path in sorted(recipes.items())}}


def precision(args: argparse.Namespace) -> None:
    from audioparity.compare.precision import SearchSettings, find_recipe, write_recipe

    targets = _load_gates(args.targets, "--targets")
    if isinstance(targets, dict):
        targets = targets.get("targets", targets.get("gates"))
    if not isinstance(targets, list):
        raise AudioparityError(f"--targets {args.targets}: expected a list of gate entries")
    document = find_recipe(_family(args), args.model, args.inputs, SearchSettings(
        args.weight_type, args.wide, targets, _options(args, "reference"),
        ggml_options=_options(args, "ggml") if args.verify else None, name=args.name,
        threads=args.threads, workdir=args.work_dir))
    write_recipe(document, args.output)
    search = document["search"]
    found = (f"{len(document['overrides'])} weight(s) kept {args.wide}" if search["met"] else
             f"targets NOT met: {search['unmet']}")
    bits = document.get("bits_per_weight")
    if bits:
        found += (f"; {bits['recipe']:.3f} bits per weight ({args.weight_type} uniform "
                  f"{bits['uniform']:.3f}, every matmul weight {args.wide} {bits['wide']:.3f})")
    if "verified" in document:
        verified = "pass" if document["verified"]["passed"] else "FAIL"
        found += f"; verified by the ggml port: {verified}"
    print(f"{args.output}: {found}; {search['trials']} trials in {search['seconds']:.0f} s",
          file=sys.stderr)


def fixture(args: argparse.Namespace) -> None:
    """Build the fixture; with ``--code`` (the digest of the code that builds it), copy it from
    the shared cache when that code, seed, options and libraries built it before
    (:func:`~audioparity.dumping.shared_cache.fixture_entry`), else build it and store it there."""
    from audioparity.dumping.shared_cache import cached_tree, fixture_entry

    family, options = _family(args), _options(args, "fixture")

    def build(output: Path) -> None:
        family.fixture(output, seed=args.seed, **options)

    if args.code is None:
        build(args.output)
        return
    entry = fixture_entry(args.spec.name, args.seed, options, args.code)
    if cached_tree(entry, args.output, build):
        log.info("fixture %s: copied from the shared cache (%s)", args.output, entry)


def reference(args: argparse.Namespace) -> None:
    """Dump the reference of every case, restoring from ``--cache-dir`` the dumps it holds
    (:class:`~audioparity.dumping.dump_cache.DumpCache`): the model is loaded only when a case is
    left to compute, and the dumps it writes are stored, even those written before an error."""
    from audioparity.dumping.driver import dump_reference

    if len(args.inputs) != len(args.output_dir):
        raise AudioparityError(f"reference: {len(args.inputs)} {args.spec.input_flag} but "
                               f"{len(args.output_dir)} --output-dir; give one --output-dir "
                               f"per {args.spec.input_flag}, in order")
    cases = list(zip(args.inputs, args.output_dir, strict=True))
    options = _options(args, "reference")
    storage = _storage(args)
    if storage is not None and args.emulate:
        raise AudioparityError("reference: --storage dumps the storage-matched reference only; "
                               "give --emulate in another run")

    def compute(todo, emulate) -> None:
        dump_reference(_family(args), args.model, todo, options=options, threads=args.threads,
                       emulate=storage or [_weight_type(args, t) for t in emulate])

    if args.unavailable_on_error:
        from audioparity.dumping.driver import unavailable_reference

        try:
            compute(cases, args.emulate)
        except AudioparityError as err:
            log.error("reference %s: %s; its dumps say unavailable", args.spec.command, err)
            unavailable_reference(_family(args), args.model, cases, options, str(err))
        return
    if args.cache_dir is None:
        compute(cases, args.emulate)
        return
    from audioparity.dumping.dump_cache import DumpCache

    folder = args.cache_dir if storage is None else args.cache_dir / storage.digest[:16]
    cache = DumpCache(folder, args.model, {
        "family": args.spec.command, "code": args.code_digest, "threads": args.threads,
        "options": options, **_recipe_digests(args),
        **({"storage": storage.digest} if storage else {})})
    todo, emulate = cache.restore(cases, args.emulate)
    try:
        if todo:
            compute(todo, emulate)
    finally:
        cache.store(todo, emulate)
    cache.prune()


def ggml(args: argparse.Namespace) -> None:
    from audioparity.dumping.driver import RunSettings, dump_ggml

    dump_ggml(_family(args), args.model, args.input, args.output_dir,
              RunSettings(_weight_type(args, args.weight_type), args.backend,
                           _options(args, "ggml"), args.device, args.threads,
                           getattr(args, "weights_file", None)),
              getattr(args, "reference_dir", None))


def weights(args: argparse.Namespace) -> None:
    from audioparity.dumping.driver import save_weights

    save_weights(_family(args), args.model, args.output,
                 weight_type=_weight_type(args, args.weight_type),
                 options=_options(args, WEIGHTS))


def replay(args: argparse.Namespace) -> None:
    from audioparity.dumping.driver import ReplaySettings, dump_replay

    storage = _storage(args)
    if storage is not None and args.emulate:
        raise AudioparityError("replay: give --emulate or --storage, not both")
    dump_replay(_family(args), args.model, args.input, args.candidate_dir, args.output_dir,
                ReplaySettings(_options(args, "reference"), args.threads,
                               storage or _weight_type(args, args.emulate)))


def drilldown(args: argparse.Namespace) -> None:
    from audioparity.compare.drilldown import Drill, drill_cell
    from audioparity.dumping.driver import RunSettings

    drill_cell(_family(args), args.model, args.input,
               RunSettings(args.weight_type, args.backend, _options(args, "ggml"), args.device,
                            args.threads),
               Drill(args.against, args.output_dir, args.cell, args.cell_output, args.phase),
               getattr(args, "reference_dir", None))


def convert_ct2(args: argparse.Namespace) -> None:
    """Write ``--output``, a transformers Whisper checkpoint, from a CTranslate2 one."""
    from audioparity.checkpoints.ctranslate2_whisper import write_whisper_checkpoint

    write_whisper_checkpoint(args.model, args.output)


def train_parakeet_tdt(args: argparse.Namespace) -> None:
    """Train the Parakeet-TDT of :mod:`audioparity.models.parakeet_tdt.training` into
    ``--output``."""
    from audioparity.models.parakeet_tdt.training import TrainingRun, train

    run = TrainingRun(train_count=args.train_count, heldout_count=args.heldout_count,
                      steps=args.steps, minutes=args.minutes,
                      checkpoint_every=args.checkpoint_every, threads=args.threads)
    train(args.output, seed=args.seed, run=run)


def repro(args: argparse.Namespace) -> None:
    from audioparity.compare.drilldown import rerun_repro

    print(rerun_repro(args.folder, args.backend, args.against, args.device, args.threads))


def candidate_convert(args: argparse.Namespace) -> None:
    from audioparity.candidates.running import convert

    convert(args.adapter, args.model, _weight_type(args, args.weight_type), args.output_dir,
            _json_object(args.options, "--options"))


def candidate_run(args: argparse.Namespace) -> None:
    """One case, or several in one process (each ``--audio|--prompt`` with its
    ``--output-dir`` and, where given, ``--reference-dir``, in order)."""
    from audioparity.candidates.running import CandidateEntry, run_candidate, run_candidate_cases
    from audioparity.dumping.driver import RunSettings

    references = args.reference_dir or []
    if len(args.output_dir) != len(args.case) or len(references) not in (0, len(args.case)):
        raise AudioparityError(f"candidate run: {len(args.case)} case(s), "
                               f"{len(args.output_dir)} --output-dir and {len(references)} "
                               "--reference-dir; give each case its own (references: all or "
                               "none)")
    port = CandidateEntry(args.adapter, args.family,
                _json_object(args.family_options, "--family-options"))
    settings = RunSettings(_weight_type(args, args.weight_type), args.backend,
                           _json_object(args.options, "--options"), threads=args.threads,
                           weights_file=args.weights_file)
    if len(args.case) == 1:
        run_candidate(port, args.model, args.case[0], args.output_dir[0], settings,
                      references[0] if references else None)
        return
    run_candidate_cases(port, args.model, list(zip(args.case, args.output_dir,
                                                   references or [None] * len(args.case),
                                                   strict=True)), settings)


def candidate_reuse(args: argparse.Namespace) -> None:
    from audioparity.compare.reuse import check_reuse

    command = (args.run_command[1:] if args.run_command[:1] == ["--"]
               else args.run_command)
    if not command:
        raise AudioparityError("candidate reuse: no `audioparity candidate run ...` given "
                               "after --")
    fresh = _pairs(args.fresh, "--fresh", "CASE=DIR")
    try:
        bounds = json.loads(args.bounds)
    except json.JSONDecodeError as err:
        raise AudioparityError(f"--bounds: not JSON ({err})") from None
    if not isinstance(bounds, list):
        raise AudioparityError(f"--bounds {args.bounds!r}: expected a JSON list")
    check_reuse(command, fresh, args.output_dir, _labels(args.label), bounds)


def ports(args: argparse.Namespace) -> None:
    from audioparity.candidates.ports import build_ports

    for name, tree in build_ports(args.source, args.cache, args.jobs,
                                  vulkan=args.vulkan).items():
        print(f"{name}: {tree}")


def environments(args: argparse.Namespace) -> None:
    """Build the union of the configs' ``environments``; one name given two package lists is
    refused."""
    import yaml

    from audioparity.dumping.environments import build_all

    wanted: dict[str, dict] = {}
    for path in args.configs:
        try:
            config = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as err:
            raise AudioparityError(f"{path}: cannot read it as YAML ({err})") from None
        for name, entry in (config.get("environments") or {}).items():
            if name in wanted and wanted[name] != entry:
                raise AudioparityError(f"{path}: environment {name!r} is defined otherwise in "
                                       "another config; give it another name")
            wanted[name] = entry
    build_all(wanted, args.cache)
    for name in wanted:
        print(f"{name}: {args.cache / name}")


def digest(args: argparse.Namespace) -> None:
    from audioparity.dumping.artifacts import write_digest

    for dump in args.dumps:
        write_digest(dump)


def compare(args: argparse.Namespace) -> None:
    from audioparity.compare.cell import compare_cell
    from audioparity.compare.plan import CellDumps

    others = _pairs(args.other_reference, "--other-reference", "NAME=DIR")
    extra = None
    if args.recipe is not None:
        from audioparity.compare.targets import recipe_row
        from audioparity.dumping.weight_files import read_recipe_document

        extra = partial(recipe_row, recipe=read_recipe_document(args.recipe))
    dumps = CellDumps(args.reference, args.candidate, replay=args.replay,
                      cost=args.cost_reference, others=others)
    compare_cell(dumps, _load_gates(args.gates), _labels(args.label), args.output,
                 known_text=args.known_text, extra=extra)


def report_summary(args: argparse.Namespace) -> None:
    from audioparity.report.summary import read_cell_list, write_summary

    if not args.cells and args.cells_from is None:
        raise AudioparityError("report summary: no cell files (name them, or a list of them "
                               "with --cells-from)")
    listed = read_cell_list(args.cells_from) if args.cells_from is not None else []
    write_summary([*args.cells, *listed], args.output)


def report_check(args: argparse.Namespace) -> int:
    from audioparity.report.culprit import check
    from audioparity.report.summary import read_summary
    from audioparity.workflow.outcome import stale

    try:
        why = stale(args.summary)
        rows = None if why else read_summary(args.summary).to_dict("records")
    except AudioparityError as err:  # a summary or list that cannot be read: not a result
        why = str(err)
    if why is None and not rows:
        why = f"{args.summary} has no cells"
    if why is not None:
        print(f"audioparity: error: {why}", file=sys.stderr)
        return 2
    code, lines = check(rows)
    print("\n".join(lines))
    return code


def bundle_pack(args: argparse.Namespace) -> None:
    from audioparity.workflow.bundle import pack

    manifest = pack(args.directory, args.configfile, args.backends, args.output, args.cores)
    print(f"bundle: {args.output}: {len(manifest['targets'])} results of "
          f"{', '.join(manifest['backends'])} to compute on a host with "
          f"{manifest['ggml_backend']} (unpack it there and run ./run)")


def bundle_collect(args: argparse.Namespace) -> int:
    from audioparity.workflow.bundle import RETURNED, collect

    missing = collect(args.bundle)
    print(f"bundle: {args.bundle / RETURNED} holds the results; {len(missing)} missing",
          file=sys.stderr)
    return 1 if missing else 0


def bundle_merge(args: argparse.Namespace) -> None:
    from audioparity.workflow.bundle import merge

    print("\n".join(merge(args.directory, args.returned)))


def report_html(args: argparse.Namespace) -> None:
    from audioparity.report.html import write_html

    write_html(args.summary, args.output)


def _command_after(args: argparse.Namespace) -> list[str]:
    """The command given after ``--``."""
    return args.dump_command[1:] if args.dump_command[:1] == ["--"] else args.dump_command


def guard(args: argparse.Namespace) -> int:
    from audioparity.dumping.guard import run_guarded

    command = _command_after(args)
    if not command:
        raise AudioparityError("guard: no command given after --")
    return run_guarded(command, args.output_dir, _labels(args.field))


def determinism_run(args: argparse.Namespace) -> int:
    """Run the dump command twice (``{output_dir}`` -> ``run_1``, ``run_2``), then compare."""
    import subprocess

    from audioparity.dumping.guard import describe_exit

    command = _command_after(args)
    if not any("{output_dir}" in arg for arg in command):
        raise AudioparityError("determinism run: the command after -- must contain {output_dir}")
    outputs = [args.work_dir / f"run_{i}" for i in (1, 2)]
    for i, output in enumerate(outputs, 1):
        argv = [arg.replace("{output_dir}", str(output)) for arg in command]
        log.info("determinism: run %d of 2: %s", i, " ".join(argv))
        returncode = subprocess.run(argv).returncode
        if returncode != 0:
            raise AudioparityError(
                f"determinism run: run {i} of {argv[0]} failed ({describe_exit(returncode)})")
    return _identical(*outputs)


def determinism_compare(args: argparse.Namespace) -> int:
    return _identical(*args.dumps)


def _identical(a: Path, b: Path) -> int:
    """Print every difference between dumps ``a`` and ``b`` on stdout (one per line).

    Raises:
        AudioparityError: they differ (the count, in one line), or either is not a dump.
    """
    from audioparity.dumping.artifacts import dump_differences

    differences = dump_differences(a, b)
    for line in differences:
        print(line)
    if differences:
        raise AudioparityError(f"{a} and {b} differ: {len(differences)} difference(s), listed "
                               "on stdout")
    files = sum(1 for p in Path(a).iterdir() if p.is_file())
    print(f"identical: {a} and {b} ({files} files, manifests less seconds)")
    return 0


def export(args: argparse.Namespace) -> None:
    from audioparity.dumping.export import export_dump

    for name in export_dump(args.dump, args.export_format, args.output_dir):
        print(args.output_dir / name)


def check_dump(args: argparse.Namespace) -> None:
    from audioparity.candidates.check import check

    checked = check(args.check_dir, args.family, args.adapter)
    for line in checked.problems:
        print(line)
    if checked.problems:
        raise AudioparityError(f"{args.check_dir}: {len(checked.problems)} problem(s) against "
                               f"the dump contract of {args.family}, listed on stdout")
    print(f"ok: {args.check_dir}: {checked.checked}")


def doctor(args: argparse.Namespace) -> None:
    from audioparity.ggml import doctor

    report = doctor()
    print(json.dumps(report, indent=2))
    if args.backend:
        from audioparity.ggml import check_backend

        print(check_backend(args.backend, report), file=sys.stderr)


