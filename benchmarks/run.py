"""``make bench``: the ggml ports against their PyTorch/NeMo references on full-size shapes.

For each model (random weights, real architecture shapes; :mod:`checkpoints`): the reference at
each thread count, then the ggml port at each weight type and thread count, on the same inputs,
each measurement in its own process (:mod:`measure`), so that the peak RSS reported for it
(``ru_maxrss`` of that child, from ``os.wait4``) is its own. Then the memory check: the
project's own ggml dump commands run on the benchmark checkpoints, their peak RSS against the
bytes of their weights plus activations.

Parts timed (median, min and max of ``--reps`` calls after one warm-up call): Parakeet-TDT
``encoder`` (mel -> enc_out, ~10 s of speech) and ``decoder`` (greedy TDT of enc_out); MOSS
``prefill`` (``--rows`` prompt rows) and ``step`` (one cached row after the prefill).

Before each measurement the runner waits (at most ``--wait-quiet`` s) for other processes to go
quiet, and it records the CPU they used meanwhile (``others_cores``), which the tables show: a
2-thread timing on a 2-core machine is meaningless while another process holds a core.

Outputs (``--out``, default ``benchmarks/results``): ``bench.json`` (every child's full result,
the machine, the arguments), ``bench.csv`` (one row per measurement and part), ``bench.md`` (the
tables: times, ratios ggml/torch, parity, memory, the acceptance targets of issue 5; built by
:mod:`tables`), and ``logs/`` (each child's stderr). At the end it prints the ratio table and
the acceptance lines.

Usage::

    python benchmarks/run.py                 # full: Parakeet v3 shape, MOSS 1.7B shape
    python benchmarks/run.py --small         # MOSS with the Qwen3-0.6B shape (less memory)
    python benchmarks/run.py --quick         # 2 threads only, fewer repetitions
    python benchmarks/run.py --size tiny --out bench-tiny  # checks the scripts (tiny shapes)
    python benchmarks/run.py --ggml-path DIR   # another ggml-python build (see builds.py)
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from checkpoints import SIZES  # noqa: E402
from measure import RESULT_MARK  # noqa: E402
from tables import MIB, acceptance, ratio_table, write_outputs  # noqa: E402

log = logging.getLogger("audioparity.bench")

WEIGHT_TYPES = ("f32", "f16", "bf16", "q8_0")
#: The speech clip tiled to ``--seconds`` for the Parakeet input (the project's own recording).
CLIP = ROOT / "resources" / "speech" / "clip.wav"
#: Prompt of the MOSS memory dumps.
MOSS_PROMPT = ROOT / "resources" / "moss" / "en_instruction.json"
#: MOSS shape of the memory dumps: the dump's loader holds a float32 copy of every weight, so a
#: 1.7B dump at f32 needs ~21 GB; the 0.6B shape shows the same ratios in ~8 GB.
MEMORY_MOSS_SHAPE = {"full": "0.6b", "small": "0.6b", "tiny": "tiny"}
VERSIONED = ("torch", "nemo_toolkit", "transformers", "numpy", "ggml-python")
#: ``--size`` -> Parakeet shape name.
PARAKEET_SHAPES_NAME = {size: parakeet for size, (parakeet, _) in SIZES.items()}


@dataclass
class Child:
    """A finished child process: its parsed result, peak RSS, wall time, and the CPU time other
    processes used meanwhile (``others_cores``: their busy CPU seconds per wall second, from
    ``/proc/stat`` minus the child's own ``ru_utime + ru_stime``; 0 on a quiet machine)."""

    result: dict | None
    peak_rss_mib: float
    seconds: float
    returncode: int
    log: Path
    others_cores: float


def busy_cpu_seconds() -> float:
    """CPU seconds spent busy by the whole machine since boot (``/proc/stat``, all but idle and
    iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


@dataclass
class Plan:
    """What one run measures."""

    size: str
    threads: list[int]
    weight_types: list[str]
    models: list[str]
    reps: dict[str, int]
    steps: int
    rows: int
    seconds: float
    wait_quiet_s: float = 0.0
    threadpool: bool = False
    build: str = "default"
    pythonpath: str = ""
    accel: str = ""
    env: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)


def wait_for_quiet(limit_s: float, threshold: float = 0.2, window_s: float = 2.0) -> float:
    """Wait (at most ``limit_s``) until the machine spent under ``threshold`` cores busy over
    ``window_s`` (this process sleeps meanwhile, so the busy time is other processes'); returns
    the seconds waited."""
    start = time.perf_counter()
    while time.perf_counter() - start < limit_s:
        busy = busy_cpu_seconds()
        time.sleep(window_s)
        if (busy_cpu_seconds() - busy) / window_s < threshold:
            break
    return time.perf_counter() - start


def run_child(cmd: list[str], log_path: Path, threads: int, pythonpath: str = "",
              timeout: float = 1800.0, extra_env: dict | None = None) -> Child:
    """Run ``cmd`` with ``threads`` for every thread pool, stdout to a temp file and stderr to
    ``log_path``; wait for it with ``os.wait4`` to read its own ``ru_maxrss``."""
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads),
               OPENBLAS_NUM_THREADS=str(threads), GGML_NO_BACKTRACE="1",
               TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore", **(extra_env or {}))
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath, env.get("PYTHONPATH")) if p)
    start, busy = time.perf_counter(), busy_cpu_seconds()
    with tempfile.TemporaryFile() as out, open(log_path, "ab") as err:
        err.write(f"\n$ {' '.join(cmd)}\n".encode())
        err.flush()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=ROOT)
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.perf_counter() - start > timeout:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.1)
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        lines = out.read().decode(errors="replace").splitlines()
    result = next((json.loads(line[len(RESULT_MARK):]) for line in reversed(lines)
                   if line.startswith(RESULT_MARK)), None)
    seconds = time.perf_counter() - start
    others = busy_cpu_seconds() - busy - usage.ru_utime - usage.ru_stime
    return Child(result, usage.ru_maxrss / 1024, seconds, proc.returncode, log_path,
                 max(others, 0.0) / seconds)


def machine_info() -> dict:
    """CPU model, cores, memory, load, library versions, git state."""
    cpu, features = platform.processor(), []
    try:
        lscpu = dict(line.split(":", 1) for line in subprocess.run(
            ["lscpu"], capture_output=True, text=True, check=True).stdout.splitlines()
            if ":" in line)
        cpu = (f"{lscpu['Model name'].strip()} (family {lscpu['CPU family'].strip()}, "
               f"model {lscpu['Model'].strip()})")
        features = [flag for flag in lscpu.get("Flags", "").split()
                    if flag.startswith(("avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni",
                                        "amx"))]
    except (OSError, subprocess.CalledProcessError, KeyError):
        pass
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    git = subprocess.run(["git", "-C", str(ROOT), "describe", "--always", "--dirty"],
                         capture_output=True, text=True).stdout.strip()
    return {
        "cpu": cpu, "cpu_features": features, "cores": os.cpu_count(),
        "memory_gib": round(int(meminfo["MemTotal"].split()[0]) / 2**20, 1),
        "memory_available_gib_at_start": round(
            int(meminfo["MemAvailable"].split()[0]) / 2**20, 1),
        "python": platform.python_version(), "platform": platform.platform(),
        "versions": versions, "git": git,
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],
    }


def ensure_checkpoint(family: str, shape: str, cache: Path, log_dir: Path) -> Path:
    """The cached checkpoint of ``family``/``shape`` (seed 0), built in a child if absent."""
    path = cache / (f"parakeet-{shape}-s0.nemo" if family == "parakeet" else f"moss-{shape}-s0")
    if not path.exists():
        log.info("building %s %s checkpoint -> %s", family, shape, path)
        child = run_child([sys.executable, str(HERE / "checkpoints.py"), family, "--shape",
                           shape, "--output", str(path)], log_dir / "checkpoints.log", 2,
                          timeout=3600)
        if child.returncode or not path.exists():
            raise SystemExit(f"building {path} failed (rc {child.returncode}); see {child.log}")
        log.info("built %s in %.0f s", path.name, child.seconds)
    return path


def prepare_inputs(work: Path, plan: Plan, moss_model: Path | None) -> None:
    """The shared inputs: ``audio.wav`` (the clip tiled to ``plan.seconds``), and for MOSS
    ``rows.npy`` ``[rows, 1+n_vq]`` and ``step_rows.npy`` ``[steps+1, 1+n_vq]`` (seeded random
    text ids and audio codes)."""
    import soundfile

    samples, rate = soundfile.read(CLIP, dtype="float32")
    n = int(plan.seconds * rate)
    soundfile.write(work / "audio.wav", np.tile(samples, -(-n // len(samples)))[:n], rate)
    if moss_model is not None:
        cfg = json.loads((moss_model / "config.json").read_text())
        vocab, codes = cfg["language_config"]["vocab_size"], cfg["audio_vocab_size"]
        rng = np.random.default_rng(0)

        def draw(n_rows: int) -> np.ndarray:
            return np.concatenate([rng.integers(0, vocab, (n_rows, 1)),
                                   rng.integers(0, codes, (n_rows, cfg["n_vq"]))], axis=1)

        np.save(work / "rows.npy", draw(plan.rows))
        np.save(work / "step_rows.npy", draw(plan.steps + 1))


def measure(spec: dict, log_dir: Path, plan: Plan) -> dict:
    """One :mod:`measure` child; its result with ``peak_rss_mib`` and ``wall_s`` added."""
    name = "_".join(str(spec.get(k, "")) for k in ("kind", "weight_type", "threads") if
                    spec.get(k) is not None)
    waited = wait_for_quiet(plan.wait_quiet_s) if plan.wait_quiet_s else 0.0
    if waited > 5:
        log.info("waited %.0f s for other processes to quieten", waited)
    child = run_child([sys.executable, str(HERE / "measure.py"), json.dumps(spec)],
                      log_dir / f"{plan.build}_{name}.log", spec["threads"], plan.pythonpath,
                      extra_env=plan.env)
    if child.result is None:
        log.error("%s failed (rc %d); see %s", name, child.returncode, child.log)
        return {"spec": spec, "error": f"rc {child.returncode}", "peak_rss_mib": child.peak_rss_mib}
    child.result.update(spec=spec, peak_rss_mib=round(child.peak_rss_mib, 1),
                        wall_s=round(child.seconds, 1), others_cores=round(child.others_cores, 2))
    parts = ", ".join(f"{part} {statistics.median(ms):.1f} ms"
                      for part, ms in child.result["parts"].items())
    log.info("%-30s %s | peak %.0f MiB | %.0f s | others %.2f cores", name, parts,
             child.peak_rss_mib, child.seconds, child.others_cores)
    return child.result


def run_model(family: str, model: Path, work: Path, log_dir: Path, plan: Plan,
              torch_side: bool = True) -> list[dict]:
    """The reference at each thread count, then ggml at each weight type and thread count."""
    results = []
    base = {"model": str(model), "work": str(work), "reps": plan.reps[family]}
    if family == "moss":
        base["steps"] = plan.steps
    if torch_side:
        for threads in plan.threads:
            results.append(measure({"kind": f"{family}_torch", **base, "threads": threads},
                                   log_dir, plan))
    for weight_type in plan.weight_types:
        for threads in plan.threads:
            results.append(measure({"kind": f"{family}_ggml", **base, "threads": threads,
                                    "weight_type": weight_type, "accel": plan.accel,
                                    "threadpool": plan.threadpool, "build": plan.build},
                                   log_dir, plan))
    return results


def memory_check(plan: Plan, cache: Path, work: Path, log_dir: Path,
                 parakeet: Path | None, results: list[dict]) -> list[dict]:
    """Peak RSS of the project's ggml dump commands vs the bytes of weights + activations.

    Parakeet: ``audioparity reference parakeet-tdt`` once, then ``audioparity ggml
    parakeet-tdt`` at f32 and q8_0 (2 threads); the bytes come from the timing children of the
    same model and type. MOSS (shape :data:`MEMORY_MOSS_SHAPE`): ``audioparity ggml
    moss-voicegen`` at f32 and q8_0, and a timing child of the same shape for its bytes.
    """
    threads = max(plan.threads)
    exe = str(Path(sys.executable).with_name("audioparity"))
    rows = []
    scratch = Path(tempfile.mkdtemp(prefix="dumps_", dir=work))

    def dump(cmd: list[str], name: str) -> Child:
        child = run_child(cmd, log_dir / f"memory_{name}.log", threads, plan.pythonpath,
                          extra_env=plan.env)
        log.info("memory: %-28s peak %.0f MiB | %.0f s | rc %d", name, child.peak_rss_mib,
                 child.seconds, child.returncode)
        return child

    def bytes_of(kind: str, weight_type: str, source: list[dict]) -> dict | None:
        for r in source:
            spec = r.get("spec", {})
            if (spec.get("kind") == kind and spec.get("weight_type") == weight_type
                    and spec.get("threads") == threads and "bytes" in r):
                return r
        return None

    if parakeet is not None:
        audio = work / "audio.wav"
        ref = scratch / "parakeet_ref"
        nemo = dump([exe, "reference", "parakeet-tdt", "--model", str(parakeet), "--audio",
                     str(audio), "--output-dir", str(ref), "--threads", str(threads)],
                    "parakeet_reference")
        rows.append({"model": f"parakeet {PARAKEET_SHAPES_NAME[plan.size]}",
                     "process": "reference dump (NeMo)", "weight_type": "f32",
                     "peak_rss_mib": round(nemo.peak_rss_mib), "rc": nemo.returncode})
        for weight_type in ("f32", "q8_0"):
            child = dump([exe, "ggml", "parakeet-tdt", "--model", str(parakeet), "--audio",
                          str(audio), "--reference-dir", str(ref), "--output-dir",
                          str(scratch / f"parakeet_{weight_type}"), "--weight-type",
                          weight_type, "--threads", str(threads)], f"parakeet_{weight_type}")
            rows.append(_memory_row(f"parakeet {PARAKEET_SHAPES_NAME[plan.size]}", weight_type,
                                    child, bytes_of("parakeet_ggml", weight_type, results)))
    if "moss" in plan.models:
        shape = MEMORY_MOSS_SHAPE[plan.size]
        moss = ensure_checkpoint("moss", shape, cache, log_dir)
        moss_work = Path(tempfile.mkdtemp(prefix="moss_mem_", dir=work))
        prepare_inputs(moss_work, plan, moss)
        # the ggml dump's generation steps follow the reference's rows (teacher-forced)
        moss_ref = scratch / "moss_ref"
        reference = dump([exe, "reference", "moss-voicegen", "--model", str(moss), "--prompt",
                          str(MOSS_PROMPT), "--output-dir", str(moss_ref), "--threads",
                          str(threads), "--generate-rows", "4"], f"moss_{shape}_reference")
        rows.append({"model": f"moss {shape}", "process": "reference dump (PyTorch)",
                     "weight_type": "f32", "peak_rss_mib": round(reference.peak_rss_mib),
                     "rc": reference.returncode})
        for weight_type in ("f32", "q8_0"):
            timing = measure({"kind": "moss_ggml", "model": str(moss), "work": str(moss_work),
                              "reps": 1, "steps": plan.steps, "threads": threads,
                              "weight_type": weight_type, "accel": ""}, log_dir, plan)
            child = dump([exe, "ggml", "moss-voicegen", "--model", str(moss), "--prompt",
                          str(MOSS_PROMPT), "--reference-dir", str(moss_ref), "--output-dir",
                          str(scratch / f"moss_{weight_type}"),
                          "--weight-type", weight_type, "--threads", str(threads),
                          "--generate-rows", "4"], f"moss_{shape}_{weight_type}")
            rows.append(_memory_row(f"moss {shape}", weight_type, child, timing))
    return rows


def _memory_row(model: str, weight_type: str, child: Child, timing: dict | None) -> dict:
    row = {"model": model, "process": "ggml dump", "weight_type": weight_type,
           "peak_rss_mib": round(child.peak_rss_mib), "rc": child.returncode}
    if timing and "bytes" in timing:
        b = timing["bytes"]
        needed = (b["weights"] + b["compute"] + b.get("kv_cache", 0)) / MIB
        baseline = timing["rss_stages_mib"].get("imported", {}).get("VmRSS", 0.0)
        row.update(weights_mib=round(b["weights"] / MIB),
                   activations_mib=round((b["compute"] + b.get("kv_cache", 0)) / MIB),
                   ratio=round(child.peak_rss_mib / needed, 2), interpreter_mib=round(baseline),
                   ratio_less_interpreter=round((child.peak_rss_mib - baseline) / needed, 2),
                   timing_child_peak_mib=timing.get("peak_rss_mib"))
    return row


def failures(results: list[dict], memory: list[dict]) -> list[str]:
    """The measurements that failed: a child without a result, a memory dump with an exit code
    other than 0."""
    failed = ["_".join(str(r["spec"].get(k)) for k in ("kind", "weight_type", "threads")
                       if k in r["spec"]) for r in results if "error" in r]
    return failed + [f"{r['model']} {r['process']} {r['weight_type']}" for r in memory
                     if r.get("rc")]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--small", action="store_const", const="small", dest="size",
                        help="MOSS with the Qwen3-0.6B shape (same as --size small)")
    parser.add_argument("--quick", action="store_true",
                        help="2 threads only, 2 repetitions, 4 steps")
    parser.add_argument("--threads", default=None, help="comma list (default 1,2)")
    parser.add_argument("--types", default=",".join(WEIGHT_TYPES))
    parser.add_argument("--models", default="parakeet,moss")
    parser.add_argument("--reps", type=int, default=None, help="repetitions per part")
    parser.add_argument("--steps", type=int, default=None, help="timed MOSS decode steps")
    parser.add_argument("--rows", type=int, default=128, help="MOSS prefill rows")
    parser.add_argument("--seconds", type=float, default=9.9, help="Parakeet audio seconds")
    parser.add_argument("--no-memory", action="store_true", help="skip the memory check")
    parser.add_argument("--backend", choices=("cpu", "cuda", "vulkan"), default="cpu",
                        help="the ggml backend the ggml parts run on (the references stay on "
                        "the CPU; make setup-cuda / setup-vulkan)")
    parser.add_argument("--ggml-path", type=Path, default=None, metavar="DIR",
                        help="put DIR (a `pip install --target` of another ggml-python build, "
                             "e.g. from benchmarks/builds.py) first on the ggml side's PYTHONPATH")
    parser.add_argument("--threadpool", action="store_true",
                        help="ggml: one persistent CPU threadpool per process (not what the "
                             "project's Runtime does; for comparison)")
    add_run_arguments(parser)
    return parser.parse_args(argv)


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark runner shares: ``--wait-quiet``, ``--cache`` (checkpoints
    and inputs kept between runs) and ``--out`` (the results folder)."""
    parser.add_argument("--wait-quiet", type=float, default=30.0, metavar="S",
                        help="before each measurement, wait up to S seconds until other "
                             "processes use < 0.2 cores (0: do not wait)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--out", type=Path, default=HERE / "results")


def make_plan(args: argparse.Namespace) -> Plan:
    threads = [int(t) for t in (args.threads or ("2" if args.quick else "1,2")).split(",")]
    reps = args.reps or (2 if args.quick else None)
    return Plan(size=args.size, threads=threads, weight_types=args.types.split(","),
                models=args.models.split(","),
                reps={"parakeet": reps or 4, "moss": reps or 3},
                steps=args.steps or (4 if args.quick else 6), rows=args.rows,
                seconds=args.seconds, wait_quiet_s=args.wait_quiet,
                threadpool=args.threadpool, accel=args.backend if args.backend != "cpu" else "",
                pythonpath=str(args.ggml_path or ""),
                build=(args.ggml_path.name if args.ggml_path else "venv")
                + ("+threadpool" if args.threadpool else ""))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    plan = make_plan(args)
    start = time.perf_counter()
    machine = machine_info()
    args.cache.mkdir(parents=True, exist_ok=True)
    log_dir = args.out / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    parakeet_shape, moss_shape = SIZES[plan.size]
    models = {}
    if "parakeet" in plan.models:
        models["parakeet"] = ensure_checkpoint("parakeet", parakeet_shape, args.cache, log_dir)
    if "moss" in plan.models:
        models["moss"] = ensure_checkpoint("moss", moss_shape, args.cache, log_dir)
    results: list[dict] = []
    memory: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="audioparity_bench_", dir=args.cache) as tmp:
        work = Path(tmp)
        prepare_inputs(work, plan, models.get("moss"))
        for family, model in models.items():
            results += run_model(family, model, work, log_dir, plan)
        if not args.no_memory:
            memory = memory_check(plan, args.cache, work, log_dir, models.get("parakeet"),
                                  results)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    machine["total_s"] = round(time.perf_counter() - start)
    records = write_outputs(args.out, machine, plan, results, memory)
    log.info("wrote %s (%.0f s)", args.out / "bench.md", machine["total_s"])
    print("\n".join(["", *ratio_table(records, plan.weight_types), "",
                      *acceptance(records)]))
    failed = failures(results, memory)
    if failed:
        raise SystemExit(f"{len(failed)} measurement(s) failed: {', '.join(failed)}; see "
                         f"{log_dir}")


if __name__ == "__main__":
    main()
