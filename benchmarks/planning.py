"""Planning cost: the CPU time ``snakemake -n`` spends before the first job of a sweep.

Each size is a scratch copy of the workflow (Snakefile, rules, config, src, ...) whose sweep is
the default tiny Parakeet fixture over N copies of the project's clip as cases, at every weight
type of the default config on the CPU backend: two jobs per case and weight type (the ggml dump
and its compare), plus the weights and the report. The reference dumps are already present: one
directory per case and quantization-aware type with its digest, dated after everything the
reference job reads, so the reference checkpoint is done and every cell is planned. Planning
reads only their names and time stamps, so they are empty.

For each size the dry run (``snakemake -n --quiet rules``, in its own process, as a user runs it)
is timed by the CPU its process used (``ru_utime + ru_stime`` of the child), the least of
``--reps`` runs, and the jobs it plans are counted from its job table; the table gives the CPU
per job and, between sizes, the CPU each added job costs. ``--finished`` also times the dry
run of a finished default sweep (nothing to do); ``--profile`` runs each dry run under cProfile
and lists where its time goes.

Results: ``--out`` (default ``benchmarks/results``) ``planning.json`` and ``planning.md`` (the
table of BENCHMARKS.md, "Planning").

Usage::

    python benchmarks/planning.py                             # about 1,000, 10,000, 100,000 jobs
    python benchmarks/planning.py --jobs 1000,10000 --reps 3  # the least of 3 runs each
    python benchmarks/planning.py --jobs 40 --out DIR         # seconds: checks the script
    python benchmarks/planning.py --finished DIR              # DIR: a finished sweep's results/
    python benchmarks/planning.py --repo OTHER                # another checkout (before/after)
    python benchmarks/planning.py --profile                   # where each dry run's time goes
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import pstats
import re
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

#: What a copy of the workflow holds (tests/workflow/workdir.py copies the same, and the
#: resources the default config names).
TREE = ("Snakefile", "rules", "config", "envs", "src", "docs", "resources")
CLIP = ROOT / "resources" / "speech" / "clip.wav"
FAMILY, MODEL = "parakeet_tdt", "tiny"
FIXTURE = f"results/fixtures/{FAMILY}/{MODEL}"
#: The default config's weight types: each case is two jobs per weight type.
WEIGHT_TYPES = ("native", "f32", "f16", "bf16", "q8_0")
#: The weight types that have a quantization-aware reference (audioparity.dumping.storage).
EMULATED = ("f16", "bf16", "q8_0")


def copy_tree(repo: Path, workdir: Path) -> None:
    """The workflow of checkout ``repo`` copied into ``workdir`` (files keep their times)."""
    workdir.mkdir(parents=True)
    for item in TREE:
        source = repo / item
        if source.is_dir():
            shutil.copytree(source, workdir / item,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(source, workdir / item)


def environment(workdir: Path) -> dict[str, str]:
    """The copy's src/ first on the Python path; the venv's commands on PATH."""
    return {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(workdir),
            "PYTHONPATH": str(workdir / "src"), "GGML_NO_BACKTRACE": "1"}


def snakemake(workdir: Path, *args: str, profile: Path | None = None,
              timeout: float | None = None) -> tuple[subprocess.CompletedProcess, float, float]:
    """Run Snakemake in ``workdir``: (the process, its CPU seconds, its wall seconds).

    Raises:
        RuntimeError: Snakemake failed (its output's tail).
    """
    runner = ["-m", "cProfile", "-o", str(profile)] if profile else []
    command = [sys.executable, *runner, "-m", "snakemake", "--directory", str(workdir),
               "--snakefile", str(workdir / "Snakefile"), *args]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(command, env=environment(workdir), capture_output=True, text=True,
                            timeout=timeout)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise RuntimeError(f"snakemake {' '.join(args)} failed:\n{result.stdout[-3000:]}\n"
                           f"{result.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result, cpu, wall


def job_table(output: str) -> dict[str, int]:
    """{rule: jobs} of Snakemake's job table, with ``total``."""
    return {rule: int(count) for rule, count in
            re.findall(r"^(\w+)\s+(\d+)\s*$", output, flags=re.M)}


def build_fixture(repo: Path, folder: Path) -> Path:
    """The tiny Parakeet fixture built by ``repo``'s own command into ``folder``."""
    model = folder / "model.nemo"
    if not model.is_file():
        main = "import sys; from audioparity.cli import main; sys.exit(main(sys.argv[1:]))"
        subprocess.run([sys.executable, "-c", main, "fixture", "parakeet-tdt",
                        "--output", str(folder), "--seed", "0"], check=True,
                       env={**environment(repo), "PYTHONPATH": str(repo / "src")},
                       capture_output=True)
    return model


def sweep_config(cases: int) -> dict:
    """The tiny Parakeet fixture over ``cases`` copies of the clip (the default config's weight
    types, gates and backend), against NeMo alone."""
    return {"families": [FAMILY], FAMILY: {
        "references": [{"name": "nemo", "implementation": "nemo"}],
        "models": [{"name": MODEL, "path": f"{FIXTURE}/model.nemo"}],
        "cases": [{"name": f"clip-{i:06d}", "path": str(CLIP)} for i in range(cases)],
        "weight_types": list(WEIGHT_TYPES)}}


def present_references(workdir: Path, cases: int) -> None:
    """Each case's reference dumps (float32 and quantization-aware) with their digests, dated
    after everything the reference job reads (the fixture after its code): the checkpoint is
    done."""
    reference = workdir / "results" / "reference" / FAMILY / MODEL
    for i in range(cases):
        for suffix in ("", *(f"@{t}" for t in EMULATED)):
            dump = reference / f"clip-{i:06d}{suffix}"
            dump.mkdir(parents=True)
            dump.with_name(f"{dump.name}.sha256").write_text(f"{'0' * 64}\n")
    now = time.time()
    os.utime(workdir / FIXTURE, (now + 1, now + 1))
    os.utime(reference, (now + 2, now + 2))


def prepare(repo: Path, workdir: Path, model: Path, cases: int) -> None:
    """The scratch copy of one size, ready to plan: its fixture built, its reference present."""
    copy_tree(repo, workdir)
    (workdir / "sweep.yaml").write_text(yaml.safe_dump(sweep_config(cases)))
    (workdir / FIXTURE).mkdir(parents=True)
    shutil.copy(model, workdir / FIXTURE / "model.nemo")
    # planning the reference job alone writes what it reads that the workflow writes (its plan,
    # its code input), to be dated before its dumps
    snakemake(workdir, "--configfile", str(workdir / "sweep.yaml"), "-n", "--quiet", "all",
              "--", f"results/reference/{FAMILY}/{MODEL}")
    present_references(workdir, cases)


def profile_lines(path: Path, limit: int = 25) -> list[str]:
    """The functions with the most cumulative and own time of a cProfile run."""
    lines = []
    for key in ("cumulative", "tottime"):
        out = io.StringIO()
        stats = pstats.Stats(str(path), stream=out)
        stats.strip_dirs().sort_stats(key).print_stats(limit)
        lines.append(f"by {key}:\n{out.getvalue().split('ncalls', 1)[-1]}")
    return lines


def measure_size(repo: Path, work: Path, model: Path, jobs: int, args) -> dict:
    """One size: ~``jobs`` jobs planned, the least CPU and wall seconds of ``args.reps`` dry
    runs (the first parses what changed since the last run; the others find it parsed)."""
    cases = max(1, round(jobs / (2 * len(WEIGHT_TYPES))))
    workdir = work / f"cases-{cases}"
    shutil.rmtree(workdir, ignore_errors=True)
    prepare(repo, workdir, model, cases)
    profile = args.out / f"planning-{cases}.prof" if args.profile else None
    runs = []
    try:
        for rep in range(args.reps):
            result, cpu, wall = snakemake(workdir, "--configfile", str(workdir / "sweep.yaml"),
                                          "-n", "--quiet", "rules", timeout=args.timeout,
                                          profile=profile if rep == args.reps - 1 else None)
            runs.append((cpu, wall))
    except subprocess.TimeoutExpired:
        return {"cases": cases, "jobs": None, "cpu_s": None, "wall_s": None,
                "timeout_s": args.timeout}
    planned = job_table(result.stdout + result.stderr)
    cpu, wall = min(runs)
    row = {"cases": cases, "jobs": planned.get("total", 0), "rules": planned,
           "cpu_s": round(cpu, 2), "wall_s": round(wall, 2),
           "runs_cpu_s": [round(run[0], 2) for run in runs],
           "ms_per_job": round(1000 * cpu / max(1, planned.get("total", 0)), 2)}
    if profile:
        row["profile"] = profile_lines(profile)
    print(json.dumps({k: v for k, v in row.items() if k != "profile"}), file=sys.stderr,
          flush=True)
    if not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def measure_finished(repo: Path, work: Path, finished: Path, reps: int) -> dict:
    """The default sweep with nothing to do: ``finished`` (a finished sweep's results/) copied
    beside the workflow, its time stamps brought in order (``--touch``), then dry runs."""
    workdir = work / "finished"
    shutil.rmtree(workdir, ignore_errors=True)
    copy_tree(repo, workdir)
    shutil.copytree(finished, workdir / "results", symlinks=True)
    snakemake(workdir, "--touch", "--cores", "1", "--quiet")
    runs = []
    for _ in range(reps):
        result, cpu, wall = snakemake(workdir, "-n", "--quiet", "rules")
        runs.append((cpu, wall, job_table(result.stdout + result.stderr).get("total", 0)))
    runs.sort()
    return {"cpu_s": [round(r[0], 2) for r in runs], "wall_s": [round(r[1], 2) for r in runs],
            "jobs": runs[0][2]}


def machine() -> dict:
    cpu = next((line.split(":", 1)[1].strip() for line in
                Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    from importlib.metadata import version

    return {"cpu": cpu, "cores": os.cpu_count(), "python": platform.python_version(),
            "snakemake": version("snakemake")}


def markdown(report: dict) -> str:
    lines = [f"{report['label']}. Machine: {report['machine']['cpu']}, "
             f"{report['machine']['cores']} cores; Python {report['machine']['python']}, "
             f"Snakemake {report['machine']['snakemake']}.", ""]
    if report.get("finished"):
        finished = report["finished"]
        lines += [f"Finished default sweep, nothing to do: CPU {finished['cpu_s']} s "
                  f"(wall {finished['wall_s']} s).", ""]
    lines += ["| cases | jobs planned | CPU s | wall s | CPU ms per job | ms per job added |",
              "|---|---|---|---|---|---|"]
    before = None
    for row in report["sizes"]:
        if row["jobs"] is None:
            lines.append(f"| {row['cases']} | - | over {row['timeout_s']} | - | - | - |")
            continue
        added = ("-" if before is None else
                 f"{1000 * (row['cpu_s'] - before['cpu_s']) / (row['jobs'] - before['jobs']):.2f}")
        lines.append(f"| {row['cases']} | {row['jobs']} | {row['cpu_s']} | {row['wall_s']} | "
                     f"{row['ms_per_job']} | {added} |")
        before = row
    for row in report["sizes"]:
        for block in row.get("profile", ()):
            lines += ["", f"Profile, {row['cases']} cases, {block.splitlines()[0]}", "```",
                      *block.splitlines()[1:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", default="1000,10000,100000",
                        help="about how many jobs each size plans, comma-separated")
    parser.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose workflow "
                        "is planned (default this one)")
    parser.add_argument("--label", help="what the tables call the checkout (default its path)")
    parser.add_argument("--fixture", type=Path, help="a built tiny Parakeet model.nemo "
                        "(default: built by the checkout's `audioparity fixture`)")
    parser.add_argument("--finished", type=Path, help="a finished default sweep's results/: "
                        "also time its dry run with nothing to do")
    parser.add_argument("--reps", type=int, default=1, help="dry runs of each size (and 3 at "
                        "least of --finished); the least CPU time is reported")
    parser.add_argument("--timeout", type=float, help="give up a size after this many seconds")
    parser.add_argument("--profile", action="store_true", help="cProfile each dry run")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    repo, work = args.repo.resolve(), args.out / "planning-work"
    model = args.fixture or build_fixture(repo, work / "fixture")
    report = {"label": args.label or ("this checkout" if repo == ROOT else str(repo)),
              "machine": machine(), "sizes": []}
    if args.finished:
        report["finished"] = measure_finished(repo, work, args.finished, max(3, args.reps))
    for jobs in (int(n) for n in args.jobs.split(",")):
        report["sizes"].append(row := measure_size(repo, work, model, jobs, args))
        print(json.dumps({k: v for k, v in row.items() if k != "profile"}), flush=True)
        (args.out / "planning.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "planning.md").write_text(markdown(report))
    print(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
