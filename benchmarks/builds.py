"""ggml-python build variants against each other: speed, and parity with the reference.

Each variant is ggml-python 0.0.45 compiled from its source package with its own ``CMAKE_ARGS``
(``pip wheel --no-deps --no-cache-dir``: pip's wheel cache would otherwise hand back a wheel
built with other flags), installed with ``pip install --no-deps --target`` into its own folder,
and put first on ``PYTHONPATH`` of the measurement processes, so the project's venv is never
touched. ``venv`` is the venv's own ggml-python (what ``make setup`` installed).

Variants (:data:`VARIANTS`): ``default`` (no CMake flags); ``llamafile``
(``-DGGML_LLAMAFILE=ON``: the CPU backend's matmuls go through llamafile's tinyBLAS kernels where
they apply); ``blas``
(``-DGGML_BLAS=ON`` with OpenBLAS, ``apt-get install libopenblas-dev``: ggml's BLAS backend,
which the measurement adds to the scheduler in front of the CPU backend as llama.cpp does,
taking the matmuls with >= 32 rows of f32 activations); ``llamafile-blas`` (both);
``llamafile-mkl`` (llamafile, and the BLAS backend on Intel MKL from pip, the sgemm torch's
CPU wheels use; :func:`mkl_prefix`, :data:`MKL_ENV`).

Measured at ``--threads`` (default 2): Parakeet encoder and decoder, MOSS prefill and step, at
f32 and q8_0 (``--types``), with the parity figures (``enc_out`` cosine vs NeMo, MOSS last hidden
max_rel vs torch) and the build flags each process found (with BLAS, the OpenBLAS kernel set:
:func:`openblas_coretype`). The torch baselines run once, with the venv. ``--tests`` runs the
parity tests and ``--sweep`` the default sweep (``config/config.yaml``, on a copy of the
workflow) per variant, and lists every cell whose status differs from the first variant's.
Writes ``builds.{json,csv,md}`` next to ``bench.*`` in ``--out``.

Usage::

    python benchmarks/builds.py                       # all variants, full shapes
    python benchmarks/builds.py --variants default,llamafile --size small
    python benchmarks/builds.py --models "" --tests --sweep --merge a.json --merge b.json
                                                      # re-render two runs' timings, add checks
"""

from __future__ import annotations

import argparse
import glob
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from checkpoints import SIZES  # noqa: E402
from run import (  # noqa: E402
    ROOT,
    Plan,
    add_run_arguments,
    ensure_checkpoint,
    failures,
    machine_info,
    prepare_inputs,
    run_model,
)
from tables import header, write_raw  # noqa: E402

log = logging.getLogger("audioparity.bench")

GGML_PYTHON = "ggml-python==0.0.45"
BLAS = "-DGGML_BLAS=ON -DGGML_BLAS_VENDOR=OpenBLAS"
#: MKL's single dynamic library (mkl_rt), found through MKLROOT (:func:`mkl_prefix`); the
#: runtime path to it is kept in the installed libraries.
MKL = ("-DGGML_BLAS=ON -DGGML_BLAS_VENDOR=Intel10_64_dyn "
       "-DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON")
#: Variant name -> CMAKE_ARGS (None: the venv's own build, whatever ``make setup`` built).
VARIANTS = {
    "venv": None,
    "default": "",
    "llamafile": "-DGGML_LLAMAFILE=ON",
    "blas": BLAS,
    "llamafile-blas": f"-DGGML_LLAMAFILE=ON {BLAS}",
    "llamafile-mkl": f"-DGGML_LLAMAFILE=ON {MKL}",
}
#: Environment of the measurements of MKL variants: MKL's threads on GNU OpenMP, the runtime
#: ggml's CPU backend uses, so both share one thread pool instead of spinning against each other.
MKL_ENV = {"MKL_THREADING_LAYER": "GNU"}
#: Parity tests run per variant with ``--tests``.
PARITY_TESTS = ("tests/models/parakeet_tdt/test_encoder.py",
                "tests/models/parakeet_tdt/test_decoder.py",
                "tests/models/moss_voicegen/test_dump.py", "tests/ggml/test_runtime.py")
#: What a copy of the workflow needs (``--sweep``), as tests/workflow_copy.py copies it.
WORKFLOW_FILES = ("Snakefile", "rules", "config", "envs", "src", "docs", "resources")


def install_variant(name: str, cache: Path, log_dir: Path) -> str:
    """The ``PYTHONPATH`` folder holding variant ``name`` (``""`` for the venv's build), built
    and installed on first use."""
    cmake_args = VARIANTS[name]
    if cmake_args is None:
        return ""
    target = cache / "ggml" / name
    if (target / "ggml").is_dir():
        return str(target)
    wheels = cache / "wheels" / name
    if not glob.glob(str(wheels / "ggml_python-*.whl")):
        log.info("building %s (CMAKE_ARGS=%s)", name, cmake_args)
        start = time.perf_counter()
        env = dict(os.environ, CMAKE_ARGS=cmake_args,
                   CMAKE_BUILD_PARALLEL_LEVEL=os.environ.get("CMAKE_BUILD_PARALLEL_LEVEL", "2"))
        if "mkl" in name:
            prefix = mkl_prefix(cache, log_dir)
            env.update(MKLROOT=str(prefix),
                       CMAKE_ARGS=f"{cmake_args} -DBLAS_INCLUDE_DIRS={prefix / 'include'}")
        with open(log_dir / f"build_{name}.log", "w") as out:
            subprocess.run([sys.executable, "-m", "pip", "wheel", GGML_PYTHON, "--no-deps",
                            "--no-cache-dir", "-w", str(wheels)], env=env, stdout=out,
                           stderr=subprocess.STDOUT, check=True)
        log.info("built %s in %.0f s", name, time.perf_counter() - start)
    wheel = glob.glob(str(wheels / "ggml_python-*.whl"))[0]
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target",
                    str(target), wheel], check=True)
    return str(target)


def mkl_prefix(cache: Path, log_dir: Path) -> Path:
    """MKL from pip (``mkl-devel``: libraries, headers) installed with ``--prefix`` into
    ``cache/mkl``, plus the unversioned library names CMake's FindBLAS looks for (the wheels
    ship ``libmkl_rt.so.N`` only)."""
    prefix = cache / "mkl"
    lib = prefix / "lib"
    if not (lib / "libmkl_rt.so").exists():
        with open(log_dir / "install_mkl.log", "w") as out:
            subprocess.run([sys.executable, "-m", "pip", "install", "--no-warn-script-location",
                            "--prefix", str(prefix), "mkl-devel"], stdout=out,
                           stderr=subprocess.STDOUT, check=True)
        for versioned in lib.glob("libmkl_*.so.*"):
            unversioned = lib / versioned.name.split(".so.")[0]
            link = unversioned.with_name(unversioned.name + ".so")
            if not link.exists():
                link.symlink_to(versioned.name)
    return prefix


def openblas_coretype(pythonpath: str, requested: str) -> str:
    """``OPENBLAS_CORETYPE`` for a BLAS variant: ``requested`` unless ``auto``; with ``auto``,
    ``COOPERLAKE`` (AVX-512 with bf16) or ``SKYLAKEX`` (AVX-512) when this CPU has AVX-512 but
    OpenBLAS picked kernels without it (an OpenBLAS older than the CPU falls back to
    ``Prescott``: Debian 12's 0.3.21 does on Sapphire/Emerald Rapids), else ``""``."""
    if requested != "auto":
        return requested
    probe = ("import ctypes, ggml; b = ctypes.CDLL('libopenblas.so.0'); "
             "b.openblas_get_corename.restype = ctypes.c_char_p; "
             "print(b.openblas_get_corename().decode())")
    env = dict(os.environ, PYTHONPATH=pythonpath)
    core = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True,
                          text=True).stdout.strip()
    flags = Path("/proc/cpuinfo").read_text()
    if "avx512f" not in flags or core.lower() in ("skylakex", "cooperlake", "sapphirerapids"):
        return ""
    log.info("OpenBLAS chose %s kernels on an AVX-512 CPU; setting OPENBLAS_CORETYPE", core)
    return "COOPERLAKE" if "avx512_bf16" in flags else "SKYLAKEX"


def parity_tests(pythonpath: str, log_dir: Path, name: str) -> str:
    """``pytest`` of :data:`PARITY_TESTS` with the variant first on the path: its last line."""
    env = dict(os.environ, GGML_NO_BACKTRACE="1")
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    with open(log_dir / f"tests_{name}.log", "w") as out:
        done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                               *PARITY_TESTS], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        out.write(done.stdout)
    return done.stdout.strip().splitlines()[-1] if done.stdout.strip() else f"rc {done.returncode}"


def default_sweep(pythonpath: str, name: str, scratch: Path, log_dir: Path) -> dict:
    """The default sweep (``config/config.yaml``, as ``make run``) on a copy of the workflow
    with variant ``name`` first on ``PYTHONPATH``: wall time, status counts, and the status of
    every cell (``family/model/case/backend/weight_type/stage``)."""
    import csv
    import shutil

    work = scratch / f"sweep_{name}"
    work.mkdir()
    for item in WORKFLOW_FILES:
        if (ROOT / item).is_dir():
            shutil.copytree(ROOT / item, work / item,
                            ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / item, work / item)
    env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "HOME": str(work),
           "GGML_NO_BACKTRACE": "1", "PYTHONPATH": pythonpath}
    start = time.perf_counter()
    with open(log_dir / f"sweep_{name}.log", "w") as out:
        done = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--directory",
                               str(work), "--snakefile", str(work / "Snakefile")], env=env,
                              stdout=out, stderr=subprocess.STDOUT)
    seconds = time.perf_counter() - start
    summary = work / "results" / "report" / "summary.csv"
    cells = {}
    if summary.exists():
        with open(summary) as handle:
            for row in csv.DictReader(handle):
                key = "/".join(row[k] for k in ("family", "model", "case", "backend",
                                                "weight_type", "stage"))
                cells[key] = row["status"]
    counts = {status: list(cells.values()).count(status) for status in sorted(set(cells.values()))}
    log.info("sweep %s: rc %d, %.0f s, %s", name, done.returncode, seconds, counts)
    return {"rc": done.returncode, "seconds": round(seconds), "counts": counts, "cells": cells}


def sweep_lines(sweeps: dict[str, dict]) -> list[str]:
    """Markdown: per variant the sweep's time and status counts, and every cell whose status
    differs from the first variant's."""
    lines = ["| variant | rc | seconds | statuses |", "|---|---|---|---|"]
    lines += [f"| {n} | {r['rc']} | {r['seconds']} | {r['counts']} |" for n, r in sweeps.items()]
    first = next(iter(sweeps.values()))["cells"]
    for name, result in list(sweeps.items())[1:]:
        changed = sorted(k for k in set(first) | set(result["cells"])
                         if first.get(k) != result["cells"].get(k))
        lines.append(f"\nCells whose status differs from {next(iter(sweeps))} under {name}: "
                     + (", ".join(f"{k} ({first.get(k)} -> {result['cells'].get(k)})"
                                  for k in changed) or "none") + ".")
    return lines


def comparison_table(records: list[dict], variants: list[str]) -> list[str]:
    """Markdown: per part and weight type, each variant's median ms and ratio to torch."""
    lines = ["| model | part | weights | torch ms | " + " | ".join(variants)
             + " | other load (cores) |", "|---" * (5 + len(variants)) + "|"]
    keys = sorted({(r["model"], r["part"], r["weight_type"], r["threads"]) for r in records
                   if r["impl"] == "ggml"})
    for model, part, weight_type, threads in keys:
        torch_rec = next((r for r in records if r["impl"] == "torch" and r["model"] == model
                          and r["part"] == part and r["threads"] == threads), None)
        cells = [model, f"{part} ({threads} thr)", weight_type,
                 f"{torch_rec['median_ms']:.0f}" if torch_rec else "–"]
        others = [torch_rec["others_cores"] if torch_rec else 0.0]
        for variant in variants:
            g = next((r for r in records if r["impl"] == "ggml" and r["build"] == variant
                      and r["model"] == model and r["part"] == part
                      and r["weight_type"] == weight_type and r["threads"] == threads), None)
            if g is None:
                cells.append("–")
                continue
            ratio = f" ({g['median_ms'] / torch_rec['median_ms']:.2f}x)" if torch_rec else ""
            cells.append(f"{g['median_ms']:.0f}{ratio}")
            others.append(g["others_cores"])
        lines.append("| " + " | ".join(cells) + f" | {max(others):.2f} |")
    return lines


def parity_table(results: list[dict], variants: list[str]) -> list[str]:
    lines = ["| variant | flags found | weights | parity |", "|---|---|---|---|"]
    for variant in variants:
        for r in results:
            spec = r.get("spec", {})
            if spec.get("build") != variant or "parity" not in r:
                continue
            info = r.get("info", {})
            flags = ", ".join(filter(None, ("llamafile" if info.get("llamafile") else None,
                                            info.get("blas") and f"BLAS {info['blas']}")))
            flags = flags or "none"
            if info.get("openblas_core"):
                flags += f" (OpenBLAS {info['openblas_core']})"
            parity = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                               for k, v in r["parity"].items())
            lines.append(f"| {variant} | {flags} | {spec['kind']} {spec['weight_type']} | "
                         f"{parity} |")
    return lines


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default="default,llamafile,blas,llamafile-blas",
                        help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--threads", default="2")
    parser.add_argument("--types", default="f32,q8_0")
    parser.add_argument("--models", default="parakeet,moss",
                        help="comma list; empty with --merge: only re-render merged results")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=9.9, help="Parakeet audio seconds")
    parser.add_argument("--tests", action="store_true", help="run the parity tests per variant")
    parser.add_argument("--sweep", action="store_true",
                        help="run the default sweep per variant and compare the cells' statuses")
    parser.add_argument("--merge", type=Path, metavar="JSON", action="append", default=[],
                        help="a previous builds.json (repeatable): its results for the models "
                             "not measured now (nor in an earlier --merge) are kept")
    parser.add_argument("--openblas-coretype", default="auto",
                        help="OPENBLAS_CORETYPE for BLAS variants ('auto': see openblas_coretype;"
                             " '': OpenBLAS's own choice)")
    add_run_arguments(parser)
    return parser.parse_args(argv)


def measure_variants(plan: Plan, args: argparse.Namespace, paths: dict[str, str],
                     log_dir: Path) -> list[dict]:
    """Every variant of ``paths`` on each model of the plan (the torch baselines once, with the
    first variant), on the same inputs (:func:`run.run_model`)."""
    shapes = dict(zip(("parakeet", "moss"), SIZES[args.size], strict=True))
    models = {family: ensure_checkpoint(family, shapes[family], args.cache, log_dir)
              for family in plan.models}
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="audioparity_builds_", dir=args.cache) as tmp:
        work = Path(tmp)
        prepare_inputs(work, plan, models.get("moss"))
        for family, model in models.items():
            for index, name in enumerate(paths):
                plan.build, plan.pythonpath = name, paths[name]
                plan.accel = "blas" if "blas" in name or "mkl" in name else ""
                if "mkl" in name:
                    plan.env = dict(MKL_ENV)
                else:
                    coretype = openblas_coretype(paths[name], args.openblas_coretype) \
                        if plan.accel else ""
                    plan.env = {"OPENBLAS_CORETYPE": coretype} if coretype else {}
                results += run_model(family, model, work, log_dir, plan, torch_side=index == 0)
    return results


def merge_previous(results: list[dict], covered: set[str], merges: list[Path]) -> list[str]:
    """Add to ``results`` the results of each earlier ``builds.json`` for the models not
    ``covered`` yet (now or by an earlier one); a line per file saying what it gave."""
    merged = []
    for path in merges:
        previous = json.loads(path.read_text())
        kept = [r for r in previous["results"] if r["spec"]["kind"].split("_")[0] not in covered]
        results += kept
        families = sorted({r["spec"]["kind"].split("_")[0] for r in kept})
        covered |= set(families)
        merged.append(f"{', '.join(families) or 'nothing'} from {path.name} (load average "
                      f"{previous['machine']['loadavg_start']} at its start, "
                      f"{previous['machine'].get('total_s')} s)")
    return merged


def write_builds(out: Path, machine: dict, plan: Plan, variants: list[str], results: list[dict],
                 merged: list[str], tests: dict[str, str], sweeps: dict[str, dict]) -> None:
    """``builds.json``, ``builds.csv`` and ``builds.md``."""
    plan.build = "+".join(variants)
    plan.extra = {"variants": {n: VARIANTS[n] for n in variants}, "tests": tests,
                  "sweeps": {n: {k: v for k, v in r.items() if k != "cells"}
                             for n, r in sweeps.items()}}
    records = write_raw(out, "builds", machine, plan, results, [])
    lines = [*header("ggml-python build variants", machine, plan),
             "Variants: " + "; ".join(f"{n}: `{VARIANTS[n] or 'no flags'}`"
                                      if VARIANTS[n] is not None else f"{n}: the venv's build"
                                      for n in variants) + ".", "",
             *([f"Timings merged: {'; '.join(merged)}.", ""] if merged else []),
             "## Times (ms, ratio ggml / torch)", "", *comparison_table(records, variants), "",
             "## Parity per build", "", *parity_table(results, variants), ""]
    if tests:
        lines += ["## Parity tests per build", "",
                  f"`pytest {' '.join(PARITY_TESTS)}` with the build first on the path (the "
                  "project's Runtime: CPU backend only, BLAS unused):", "",
                  *[f"- {n}: `{t}`" for n, t in tests.items()], ""]
    if sweeps:
        lines += ["## Default sweep per build (gates of config/config.yaml)", "",
                  *sweep_lines(sweeps), ""]
    (out / "builds.md").write_text("\n".join(lines))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    variants = args.variants.split(",")
    start = time.perf_counter()
    machine = machine_info()
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    args.cache.mkdir(parents=True, exist_ok=True)
    paths = {name: install_variant(name, args.cache, log_dir) for name in variants}
    plan = Plan(size=args.size, threads=[int(t) for t in args.threads.split(",")],
                weight_types=args.types.split(","),
                models=[m for m in args.models.split(",") if m],
                reps={"parakeet": args.reps, "moss": args.reps}, steps=args.steps, rows=128,
                seconds=args.seconds, wait_quiet_s=args.wait_quiet)
    results = measure_variants(plan, args, paths, log_dir)
    tests = {}
    if args.tests:
        for name in variants:
            tests[name] = parity_tests(paths[name], log_dir, name)
            log.info("tests %s: %s", name, tests[name])
    sweeps = {}
    if args.sweep:
        with tempfile.TemporaryDirectory(prefix="audioparity_sweeps_", dir=args.cache) as tmp:
            for name in variants:
                sweeps[name] = default_sweep(paths[name], name, Path(tmp), log_dir)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["total_s"] = round(time.perf_counter() - start)
    merged = merge_previous(results, set(plan.models), args.merge)
    write_builds(args.out, machine, plan, variants, results, merged, tests, sweeps)
    log.info("wrote %s (%.0f s)", args.out / "builds.md", machine["total_s"])
    failed = failures(results, [])
    if failed:
        raise SystemExit(f"{len(failed)} measurement(s) failed: {', '.join(failed)}; see "
                         f"{log_dir}")


if __name__ == "__main__":
    main()
