"""The ``audioparity`` command line (docs/design.md, "Command line").

``fixture``, ``reference`` and ``ggml`` have one subcommand per model family, built from the
family's spec (:mod:`audioparity.families`): the same flags for every family, plus its own
options. Exit codes: 0 done, 1 failed (one line on stderr), 2 usage.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from audioparity.errors import AudioparityError
from audioparity.families import REPLAY, WEIGHTS, FamilySpec, registered
from audioparity.storage import EMULATED_TYPES
from audioparity.vocabulary import BACKENDS, WEIGHT_TYPES

log = logging.getLogger("audioparity")


def _value(what: str, kind: type = str, choices: tuple = (), minimum: int | None = None):
    """An argparse type: the text as ``kind``, one of ``choices`` if given, at least
    ``minimum`` if given; otherwise a usage error naming ``what``."""

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            expected = {int: "an integer", float: "a number"}.get(kind, kind.__name__)
            raise argparse.ArgumentTypeError(f"{what} {text!r}: expected {expected}") from None
        if choices and value not in choices:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {text!r}; valid: {', '.join(map(str, choices))}")
        if minimum is not None and value < minimum:
            raise argparse.ArgumentTypeError(f"{what} {value}: expected at least {minimum}")
        return value

    return parse


def _add_options(parser: argparse.ArgumentParser, spec: FamilySpec, side: str) -> None:
    """The family's options the command of ``side`` takes (:meth:`FamilySpec.options_for`)."""
    for option in spec.options_for(side):
        if isinstance(option.default, bool):
            parser.add_argument(option.flag, action="store_true", help=option.help)
        else:
            kind = _value(option.name.replace("_", " "), type(option.default), option.choices,
                          option.minimum)
            parser.add_argument(option.flag, default=option.default, type=kind,
                                help=f"{option.help} (default {option.default})")


def _ggml_arguments(p: argparse.ArgumentParser, spec: FamilySpec) -> None:
    """The arguments of one ggml dump of ``spec``'s port (``ggml`` and ``drilldown`` take them)."""
    p.set_defaults(spec=spec)
    p.add_argument("--model", required=True, type=Path, help=spec.model)
    p.add_argument(spec.input_flag, dest="input", required=True, type=Path,
                   metavar=spec.input.upper(), help=f"{spec.input} file")
    if spec.ggml_reads_reference:
        p.add_argument("--reference-dir", required=True, type=Path,
                       help="reference dump of the same model and input: what the "
                       "teacher-forced stages are fed")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--weight-type", default="native",
                   type=_value("weight type", choices=WEIGHT_TYPES),
                   help="storage type of the matmul weights; native: the checkpoint's")
    p.add_argument("--backend", default="cpu", type=_value("backend", choices=BACKENDS))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    _add_options(p, spec, "ggml")


def _family_commands(sub) -> None:
    """``fixture``, ``reference``, ``ggml``, ``replay`` and ``drilldown``, each with one
    subcommand per registered family."""
    specs = registered().values()
    fixture = sub.add_parser("fixture", help="build a tiny seeded model (tests, default run)")
    reference = sub.add_parser("reference", help="dump reference activations (PyTorch/NeMo)")
    ggml = sub.add_parser("ggml", help="dump activations from the built-in ggml port")
    weights = sub.add_parser(WEIGHTS, help="convert a model's weights once per weight type into "
                             "a GGUF file that ggml dumps map (--weights-file)")
    replay = sub.add_parser(REPLAY, help="the reference's blocks run on a candidate's own "
                            "inputs to them (docs/candidates.md, \"Replay\")")
    drilldown = sub.add_parser("drilldown", help="run the port's graphs node by node on two "
                               "backends; name the first op that breaks (drilldown.json)")
    fixture_sub, reference_sub, ggml_sub, weights_sub, replay_sub, drilldown_sub = (
        command.add_subparsers(dest="family", required=True, metavar="FAMILY")
        for command in (fixture, reference, ggml, weights, replay, drilldown))
    for spec in specs:
        p = fixture_sub.add_parser(spec.command, help=f"tiny seeded {spec.title}")
        p.set_defaults(spec=spec)
        where = f"; the model is {spec.fixture_model} inside" if spec.fixture_model else ""
        p.add_argument("--output", required=True, type=Path,
                       help=f"fixture directory to write{where}")
        p.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
        _add_options(p, spec, "fixture")

        p = reference_sub.add_parser(spec.command, help=spec.title)
        p.set_defaults(spec=spec)
        p.add_argument("--model", required=True, type=Path, help=spec.model)
        p.add_argument(spec.input_flag, dest="inputs", required=True, type=Path,
                       action="append", metavar=spec.input.upper(),
                       help=f"{spec.input} file; repeat it, with --output-dir, to dump several "
                       "from one model load")
        p.add_argument("--output-dir", required=True, type=Path, action="append",
                       help=f"dump directory, one per {spec.input_flag}, in the same order")
        p.add_argument("--threads", type=int, default=1)
        p.add_argument("--emulate", action="append", default=[], choices=EMULATED_TYPES,
                       metavar="WEIGHT_TYPE",
                       help="also dump each case as ggml's CPU backend computes it with the "
                       "matmul weights in this type, to <output-dir>@<type>; repeatable "
                       f"({', '.join(EMULATED_TYPES)})")
        p.add_argument("--cache-dir", type=Path,
                       help="keep each dump here too, and restore from it the dumps of the "
                       "cases it holds instead of computing them (the workflow's "
                       "results/cache/reference/<family>/<model>)")
        p.add_argument("--code-digest", default="",
                       help="with --cache-dir: a digest of the code that computes the dumps "
                       "(the workflow hashes the reference job's source files); another "
                       "digest computes every case again")
        _add_options(p, spec, "reference")

        p = ggml_sub.add_parser(spec.command, help=f"{spec.title}: the ggml port")
        _ggml_arguments(p, spec)
        if WEIGHTS in spec.entry_points:
            p.add_argument("--weights-file", type=Path,
                           help=f"the weights converted once (`audioparity {WEIGHTS} "
                           f"{spec.command}` at the same types), mapped instead of read from "
                           "--model")
            p = weights_sub.add_parser(spec.command, help=f"{spec.title}: convert the weights")
            p.set_defaults(spec=spec)
            p.add_argument("--model", required=True, type=Path, help=spec.model)
            p.add_argument("--weight-type", default="native",
                           type=_value("weight type", choices=WEIGHT_TYPES),
                           help="storage type of the matmul weights; native: the checkpoint's")
            p.add_argument("--output", required=True, type=Path, help="the GGUF file to write")
            _add_options(p, spec, WEIGHTS)

        p = drilldown_sub.add_parser(spec.command, help=f"{spec.title}: drill into a cell")
        _ggml_arguments(p, spec)
        p.add_argument("--against", default="cpu", type=_value("backend", choices=BACKENDS),
                       help="the backend it is compared with (default cpu)")
        p.add_argument("--cell", type=Path, help="the cell's comparison with --against "
                       "(audioparity compare): drill only if a stage fails there")
        p.add_argument("--cell-output", type=Path,
                       help="the cell's rows again, the failing ones with first_bad_op")
        p.add_argument("--phase", action="append", default=[],
                       help="only the graphs of this dump stage (encoder, layers_isolated, "
                       "...); repeatable")

        if REPLAY in spec.entry_points:
            p = replay_sub.add_parser(spec.command, help=f"{spec.title}: replay a candidate")
            p.set_defaults(spec=spec)
            p.add_argument("--model", required=True, type=Path, help=spec.model)
            p.add_argument(spec.input_flag, dest="input", required=True, type=Path,
                           metavar=spec.input.upper(), help=f"{spec.input} file of the case")
            p.add_argument("--candidate-dir", required=True, type=Path,
                           help="the candidate's dump of the case")
            p.add_argument("--output-dir", required=True, type=Path)
            p.add_argument("--threads", type=int, default=1)
            p.add_argument("--emulate", choices=EMULATED_TYPES, metavar="WEIGHT_TYPE",
                           help="replay as ggml's CPU backend computes with the matmul weights "
                           f"in this type ({', '.join(EMULATED_TYPES)}): a quantized cell's")


def _options(args: argparse.Namespace, side: str) -> dict:
    """The family options of ``side`` as parsed, by name."""
    return {option.name: getattr(args, option.name) for option in args.spec.options_for(side)}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="audioparity", description="Does a ggml port of an audio model compute what its "
        "PyTorch/NeMo reference computes? Dumps, comparisons and reports (docs/design.md).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    _family_commands(sub)

    compare = sub.add_parser("compare", help="compare a candidate dump with a reference dump")
    compare.add_argument("--reference", required=True, type=Path)
    compare.add_argument("--candidate", required=True, type=Path)
    compare.add_argument("--replay", type=Path,
                         help="the reference's replay of the candidate (`audioparity replay`)")
    compare.add_argument("--cost-reference", type=Path,
                         help="where --reference is quantization-aware (<case>@<weight type>): "
                         "the float32 reference, to measure the weight type's cost against")
    compare.add_argument("--gates", required=True,
                         help="gates for this cell: a JSON object, or a .json/.yaml file")
    compare.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                         help="cell labels copied into every row (family, model, case, ...)")
    compare.add_argument("--output", required=True, type=Path, help="cell result (.json)")

    report = sub.add_parser("report", help="summary table and HTML report")
    report_sub = report.add_subparsers(dest="what", required=True)
    p = report_sub.add_parser("summary", help="merge cell results into summary.csv")
    p.add_argument("cells", nargs="+", type=Path, help="cell .json files from `compare`")
    p.add_argument("--output", required=True, type=Path)
    p = report_sub.add_parser("html", help="self-contained index.html from summary.csv")
    p.add_argument("--summary", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p = report_sub.add_parser("check", help="exit 1 when a cell fails, crashed or went missing "
                              "against the reference without a declaration; print culprits")
    p.add_argument("summary", type=Path, help="summary.csv")

    guard = sub.add_parser(
        "guard", help="run a dump command; record a crash as a `crashed` dump instead of failing"
    )
    guard.add_argument("--output-dir", required=True, type=Path, help="the command's dump dir")
    guard.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                       help="manifest fields of a crashed dump (backend, weight_type, ...)")
    guard.add_argument("dump_command", nargs=argparse.REMAINDER, help="-- COMMAND ...")

    determinism = sub.add_parser(
        "determinism", help="byte-compare two dumps of the same inputs, or run a dump twice"
    )
    determinism_sub = determinism.add_subparsers(dest="mode", required=True)
    p = determinism_sub.add_parser("compare", help="compare two finished dump directories")
    p.add_argument("dumps", nargs=2, type=Path, metavar="DUMP")
    p = determinism_sub.add_parser(
        "run", help="run a dump command twice ({output_dir} -> WORK_DIR/run_1, run_2), compare"
    )
    p.add_argument("--work-dir", required=True, type=Path, help="holds run_1/ and run_2/")
    p.add_argument("dump_command", nargs=argparse.REMAINDER,
                   help="-- COMMAND ... {output_dir} ...")

    candidate = sub.add_parser(
        "candidate", help="a third-party candidate through its adapter (docs/candidates.md)")
    candidate_sub = candidate.add_subparsers(dest="step", required=True)
    p = candidate_sub.add_parser("convert", help="the candidate's own model files, once per "
                                 "model and weight type")
    p.add_argument("--adapter", required=True)
    p.add_argument("--options", default="{}", help="the candidate's options, a JSON object")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--weight-type", required=True, type=_value("weight type",
                                                               choices=WEIGHT_TYPES))
    p.add_argument("--output-dir", required=True, type=Path)
    p = candidate_sub.add_parser("run", help="one cell: run the candidate, read what it writes "
                                 "into a dump")
    p.add_argument("--family", required=True)
    p.add_argument("--adapter", required=True)
    p.add_argument("--options", default="{}", help="the candidate's options, a JSON object")
    p.add_argument("--model", required=True, type=Path,
                   help="the candidate's converted model folder (or the model)")
    p.add_argument("--audio", "--prompt", dest="case", required=True, type=Path)
    p.add_argument("--reference-dir", type=Path, help="the reference dump of the case")
    p.add_argument("--family-options", default="{}",
                   help="the family's options of the config, a JSON object")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--weight-type", required=True, type=_value("weight type",
                                                               choices=WEIGHT_TYPES))
    p.add_argument("--backend", default="cpu", type=_value("backend", choices=BACKENDS))
    p.add_argument("--threads", type=int, default=1)

    ports = sub.add_parser("ports", help="build the third-party ports from their snapshots")
    ports.add_argument("--source", required=True, type=Path, help="folder of .tar.gz snapshots")
    ports.add_argument("--cache", required=True, type=Path, help="where the builds stay")
    ports.add_argument("--jobs", type=int, default=2)
    ports.add_argument("--vulkan", action="store_true",
                       help="also the Vulkan build of each port that has one (make setup-vulkan)")

    digest = sub.add_parser(
        "digest", help="write DUMP.sha256 beside each dump: the hash of what later stages read")
    digest.add_argument("dumps", nargs="+", type=Path, metavar="DUMP")

    export = sub.add_parser("export", help="write a dump in another tool's format: f32json "
                            "(transcribe.cpp's .f32 + .json), seed (the family's seed tool's "
                            "inputs)")
    export.add_argument("dump", type=Path, metavar="DUMP")
    export.add_argument("--format", required=True, dest="export_format",
                        metavar="f32json|seed",
                        type=_value("export format", choices=("f32json", "seed")))
    export.add_argument("--output-dir", required=True, type=Path,
                        help="a new (or empty) folder to write")

    check = sub.add_parser(
        "check-dump", help="check a candidate's dump (or, with --adapter, a tool's raw folder) "
        "against a family's dump contract: every problem one line on stdout")
    check.add_argument("check_dir", type=Path, metavar="DIR")
    check.add_argument("--family", required=True, help="the family's name (parakeet_tdt)")
    check.add_argument("--adapter", help="the candidate's adapter: DIR is its tool's raw output "
                       "(f32json, npy); omitted: DIR is a dump of the contract")

    p = sub.add_parser("doctor", help="which backends are built in, their devices, library "
                       "versions")
    p.add_argument("--backend", type=_value("backend", choices=BACKENDS),
                   help="also fail (exit 1) unless this backend is built in and has a device")
    p = sub.add_parser("repro", help="rerun a drill-down's saved graph (its repro/ folder) node "
                       "by node on a backend against another")
    p.add_argument("folder", type=Path)
    p.add_argument("--backend", required=True, type=_value("backend", choices=BACKENDS))
    p.add_argument("--against", default="cpu", type=_value("backend", choices=BACKENDS))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    return parser


def _load_gates(text: str) -> dict:
    if text.lstrip().startswith("{"):
        return json.loads(text)
    path = Path(text)
    if not path.is_file():
        raise AudioparityError(f"--gates {text}: neither a JSON object nor a file")
    if path.suffix in (".yaml", ".yml"):
        import yaml

        return yaml.safe_load(path.read_text())
    return json.loads(path.read_text())


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


def _run_twice(args: argparse.Namespace) -> list[Path]:
    """Run the dump command of ``determinism run`` twice; the two output directories."""
    import subprocess

    from audioparity.guard import describe_exit

    command = args.dump_command[1:] if args.dump_command[:1] == ["--"] else args.dump_command
    if not any("{output_dir}" in arg for arg in command):
        raise AudioparityError("determinism run: the command after -- must contain {output_dir}")
    outputs = [args.work_dir / f"run_{i}" for i in (1, 2)]
    for i, output in enumerate(outputs, 1):
        argv = [arg.replace("{output_dir}", str(output)) for arg in command]
        log.info("determinism: run %d of 2: %s", i, " ".join(argv))
        returncode = subprocess.run(argv).returncode
        if returncode != 0:
            raise AudioparityError(
                f"determinism run: run {i} of {argv[0]} failed ({describe_exit(returncode)})"
            )
    return outputs


def _determinism(a: Path, b: Path) -> int:
    """Print every difference between dumps ``a`` and ``b`` on stdout (one per line).

    Raises:
        AudioparityError: they differ (the count, in one line), or either is not a dump.
    """
    from audioparity.artifacts import dump_differences

    differences = dump_differences(a, b)
    for line in differences:
        print(line)
    if differences:
        raise AudioparityError(f"{a} and {b} differ: {len(differences)} difference(s), listed "
                               "on stdout")
    files = sum(1 for p in Path(a).iterdir() if p.is_file())
    print(f"identical: {a} and {b} ({files} files, manifests less seconds)")
    return 0


def _cases(inputs: list[Path], output_dirs: list[Path], option: str) -> list[tuple[Path, Path]]:
    """Pair each repeated ``option`` with its ``--output-dir``; the counts must match."""
    if len(inputs) != len(output_dirs):
        raise AudioparityError(f"reference: {len(inputs)} {option} but {len(output_dirs)} "
                               f"--output-dir; give one --output-dir per {option}, in order")
    return list(zip(inputs, output_dirs, strict=True))


def _reference(args: argparse.Namespace) -> None:
    """Dump the reference of every case, restoring from ``--cache-dir`` the dumps it holds
    (:class:`~audioparity.dump_cache.DumpCache`): the model is loaded only when a case is left
    to compute, and the dumps it writes are stored, even those written before an error."""
    cases = _cases(args.inputs, args.output_dir, args.spec.input_flag)
    options = _options(args, "reference")
    compute = args.spec.entry_point("reference")
    if args.cache_dir is None:
        compute(args.model, cases, threads=args.threads, emulate=args.emulate, **options)
        return
    from audioparity.dump_cache import DumpCache

    cache = DumpCache(args.cache_dir, args.model, {
        "family": args.spec.command, "code": args.code_digest, "threads": args.threads,
        "options": options})
    todo, emulate = cache.restore(cases, args.emulate)
    try:
        if todo:
            compute(args.model, todo, threads=args.threads, emulate=emulate, **options)
    finally:
        cache.store(todo, emulate)
    cache.prune()


def _run(args: argparse.Namespace) -> int:
    if args.command == "fixture":
        args.spec.entry_point("fixture")(args.output, seed=args.seed, **_options(args, "fixture"))
    elif args.command == "reference":
        _reference(args)
    elif args.command == "ggml":
        reference = {"reference_dir": args.reference_dir} if args.spec.ggml_reads_reference else {}
        weights_file = getattr(args, "weights_file", None)
        weights = {"weights_file": weights_file} if weights_file else {}
        args.spec.entry_point("ggml")(
            args.model, args.input, args.output_dir, weight_type=args.weight_type,
            backend=args.backend, device=args.device, threads=args.threads, **reference,
            **weights, **_options(args, "ggml"))
    elif args.command == WEIGHTS:
        args.spec.entry_point(WEIGHTS)(args.model, args.output, weight_type=args.weight_type,
                                       **_options(args, WEIGHTS))
    elif args.command == "drilldown":
        from audioparity.drilldown import drill_cell

        drill_cell(args.spec, model=args.model, case=args.input,
                   reference_dir=getattr(args, "reference_dir", None),
                   weight_type=args.weight_type, backend=args.backend, against=args.against,
                   device=args.device, threads=args.threads, options=_options(args, "ggml"),
                   output_dir=args.output_dir, cell=args.cell, cell_output=args.cell_output,
                   phases=args.phase)
    elif args.command == "repro":
        from audioparity.drilldown import rerun_repro

        print(rerun_repro(args.folder, args.backend, args.against, args.device, args.threads))
    elif args.command == REPLAY:
        args.spec.entry_point(REPLAY)(args.model, args.input, args.candidate_dir,
                                      args.output_dir, threads=args.threads,
                                      emulate=args.emulate)
    elif args.command == "candidate":
        from audioparity.candidates import running

        options = _json_object(args.options, "--options")
        if args.step == "convert":
            running.convert(args.adapter, args.model, args.weight_type, args.output_dir, options)
        else:
            running.run_candidate(args.adapter, args.family, options, args.model, args.case,
                                  args.output_dir, reference_dir=args.reference_dir,
                                  weight_type=args.weight_type, backend=args.backend,
                                  threads=args.threads, family_options=_json_object(
                                      args.family_options, "--family-options"))
    elif args.command == "ports":
        from audioparity.candidates.running import build_ports

        for name, tree in build_ports(args.source, args.cache, args.jobs,
                                      vulkan=args.vulkan).items():
            print(f"{name}: {tree}")
    elif args.command == "digest":
        from audioparity.artifacts import write_digest

        for dump in args.dumps:
            write_digest(dump)
    elif args.command == "compare":
        from audioparity.compare import compare_cell

        compare_cell(args.reference, args.candidate, _load_gates(args.gates),
                     _labels(args.label), args.output, replay_dir=args.replay,
                     cost_dir=args.cost_reference)
    elif args.command == "report":
        if args.what == "summary":
            from audioparity.report.summary import write_summary

            write_summary(args.cells, args.output)
        elif args.what == "check":
            from audioparity.report.culprit import check
            from audioparity.report.summary import read_summary

            code, lines = check(read_summary(args.summary).to_dict("records"))
            print("\n".join(lines))
            return code
        else:
            from audioparity.report.html import write_html

            write_html(args.summary, args.output)
    elif args.command == "guard":
        from audioparity.guard import run_guarded

        command = args.dump_command[1:] if args.dump_command[:1] == ["--"] else args.dump_command
        if not command:
            raise AudioparityError("guard: no command given after --")
        return run_guarded(command, args.output_dir, _labels(args.field))
    elif args.command == "determinism":
        dumps = args.dumps if args.mode == "compare" else _run_twice(args)
        return _determinism(*dumps)
    elif args.command == "export":
        from audioparity.export import export_dump

        for name in export_dump(args.dump, args.export_format, args.output_dir):
            print(args.output_dir / name)
    elif args.command == "check-dump":
        from audioparity.candidates.check import check

        checked = check(args.check_dir, args.family, args.adapter)
        for line in checked.problems:
            print(line)
        if checked.problems:
            raise AudioparityError(f"{args.check_dir}: {len(checked.problems)} problem(s) "
                                   f"against the dump contract of {args.family}, listed on "
                                   "stdout")
        print(f"ok: {args.check_dir}: {checked.checked}")
    elif args.command == "doctor":
        from audioparity.ggml import doctor

        report = doctor()
        print(json.dumps(report, indent=2))
        if args.backend:
            from audioparity.ggml.runtime import check_backend

            print(check_backend(args.backend, report), file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``audioparity`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("gguf").setLevel(logging.WARNING)  # a line per file it writes
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        return _run(args)
    except AudioparityError as err:
        print(f"audioparity: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
