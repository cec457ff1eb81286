"""The ``audioparity`` command line (DESIGN.md, "CLI contract").

Exit codes: 0 done, 1 failed (one line on stderr), 2 usage. The ggml dump's options mirror the
C++ dump tools', so an external binary with the same command line can replace ours.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from pathlib import Path

from audioparity.errors import AudioparityError

WEIGHT_TYPES = ("native", "f32", "f16", "bf16", "q8_0")
CONV_WEIGHT_TYPES = ("f32", "f16")
BACKENDS = ("cpu", "cuda", "vulkan")

log = logging.getLogger("audioparity")


def _choice(valid: tuple[str, ...], what: str):
    def parse(value: str) -> str:
        if value not in valid:
            raise argparse.ArgumentTypeError(
                f"unknown {what} {value!r}; valid: {', '.join(valid)}"
            )
        return value

    return parse


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="audioparity", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    fixture = sub.add_parser("fixture", help="build a tiny seeded model (tests, default run)")
    fixture_sub = fixture.add_subparsers(dest="family", required=True)
    p = fixture_sub.add_parser("parakeet-tdt", help="tiny v3-shaped Parakeet-TDT .nemo")
    p.add_argument("--output", required=True, type=Path, help="path of the .nemo to write")
    p.add_argument("--seed", type=int, default=0)
    p = fixture_sub.add_parser("moss-voicegen", help="tiny MOSS checkpoint directory")
    p.add_argument("--output", required=True, type=Path, help="checkpoint directory to write")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--massive-activation", action="store_true",
                   help="one huge activation channel beyond the f16 range (attention sink)")

    reference = sub.add_parser("reference", help="dump reference activations (PyTorch/NeMo)")
    reference_sub = reference.add_subparsers(dest="family", required=True)
    p = reference_sub.add_parser("parakeet-tdt", help="NeMo EncDecRNNTBPEModel, CPU, eval")
    p.add_argument("--model", required=True, type=Path, help=".nemo file")
    p.add_argument("--audio", required=True, type=Path, action="append",
                   help="audio file (resampled to 16 kHz); repeat it, with --output-dir, to "
                   "dump several files from one model load")
    p.add_argument("--output-dir", required=True, type=Path, action="append",
                   help="dump directory, one per --audio, in the same order")
    p.add_argument("--threads", type=int, default=1)

    p = reference_sub.add_parser("moss-voicegen", help="MossTTSDelay model in PyTorch (float32)")
    p.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--prompt", required=True, type=Path, action="append",
                   help="JSON: text, instruction, language; repeat it, with --output-dir, to "
                   "dump several prompts from one model load")
    p.add_argument("--output-dir", required=True, type=Path, action="append",
                   help="dump directory, one per --prompt, in the same order")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--generate-rows", type=int, default=16, help="rows of greedy generation")

    ggml = sub.add_parser("ggml", help="dump activations from the built-in ggml port")
    ggml_sub = ggml.add_subparsers(dest="family", required=True)
    p = ggml_sub.add_parser("parakeet-tdt", help="ggml Parakeet-TDT encoder and TDT decoder")
    p.add_argument("--model", required=True, type=Path, help=".nemo file or HF Parakeet directory")
    p.add_argument("--audio", required=True, type=Path)
    p.add_argument("--reference-dir", required=True, type=Path,
                   help="reference dump: inputs of the isolated layers and of decoder replay")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--matmul-weight-type", default="native",
                   type=_choice(WEIGHT_TYPES, "weight type"))
    p.add_argument("--conv-weight-type", default="f32",
                   type=_choice(CONV_WEIGHT_TYPES, "conv weight type"))
    p.add_argument("--backend", default="cpu", type=_choice(BACKENDS, "backend"))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--flash-attention", type=int, choices=(0, 1), default=0)
    p.add_argument("--threads", type=int, default=1)

    p = ggml_sub.add_parser("moss-voicegen", help="ggml MOSS backbone: prefill, cached step, heads")
    p.add_argument("--model", required=True, type=Path, help="checkpoint directory")
    p.add_argument("--prompt", required=True, type=Path)
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--weight-type", default="native", type=_choice(WEIGHT_TYPES, "weight type"))
    p.add_argument("--backend", default="cpu", type=_choice(BACKENDS, "backend"))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--kv-cache-type", default="f32", type=_choice(("f32", "f16"), "KV cache type"))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--generate-rows", type=int, default=16)

    compare = sub.add_parser("compare", help="compare a candidate dump with a reference dump")
    compare.add_argument("--reference", required=True, type=Path)
    compare.add_argument("--candidate", required=True, type=Path)
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

    sub.add_parser("doctor", help="which backends are built in, library versions")
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


def _run(args: argparse.Namespace) -> int:
    moss = getattr(args, "family", None) == "moss-voicegen"
    if args.command == "fixture" and moss:
        from audioparity.models.moss_voicegen.fixture import build_fixture

        build_fixture(args.output, seed=args.seed, massive_activation=args.massive_activation)
    elif args.command == "fixture":
        from audioparity.models.parakeet_tdt.fixture import build_fixture

        build_fixture(args.output, seed=args.seed)
    elif args.command == "reference" and moss:
        from audioparity.models.moss_voicegen.reference import dump_reference

        dump_reference(args.model, _cases(args.prompt, args.output_dir, "--prompt"),
                       threads=args.threads, generate_rows=args.generate_rows)
    elif args.command == "reference":
        from audioparity.models.parakeet_tdt.reference import dump_reference

        dump_reference(args.model, _cases(args.audio, args.output_dir, "--audio"),
                       threads=args.threads)
    elif args.command == "ggml" and moss:
        from audioparity.models.moss_voicegen.dump import dump_ggml

        dump_ggml(
            args.model, args.prompt, args.output_dir, weight_type=args.weight_type,
            backend=args.backend, device=args.device, kv_cache_type=args.kv_cache_type,
            threads=args.threads, generate_rows=args.generate_rows,
        )
    elif args.command == "ggml":
        from audioparity.models.parakeet_tdt.dump import dump_ggml

        dump_ggml(
            args.model, args.audio, args.reference_dir, args.output_dir,
            matmul_weight_type=args.matmul_weight_type, conv_weight_type=args.conv_weight_type,
            backend=args.backend, device=args.device,
            flash_attention=bool(args.flash_attention), threads=args.threads,
        )
    elif args.command == "compare":
        from audioparity.compare import compare_cell

        compare_cell(args.reference, args.candidate, _load_gates(args.gates),
                     _labels(args.label), args.output)
    elif args.command == "report":
        if args.what == "summary":
            from audioparity.report.summary import write_summary

            write_summary(args.cells, args.output)
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
    elif args.command == "doctor":
        from audioparity.ggml import doctor

        print(json.dumps(doctor(), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``audioparity`` console script; returns the exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    os.environ.setdefault("GGML_NO_BACKTRACE", "1")
    try:
        return _run(args)
    except AudioparityError as err:
        print(f"audioparity: error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
