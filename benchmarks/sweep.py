"""``make bench-sweep``: the whole workflow at real scale, its wall time against the compute it
holds.

Parakeet-TDT at the v3 shape (random weights, :mod:`checkpoints`) over clips of 2-30 s of speech
made here (espeak-ng in several languages, slices of jfk.wav, the project clip), every weight
type, CPU; MOSS at the 1.7B shape over prompts made from the shipped ones. Each size of the
sweep (``--clips 8,16,32``) runs cold, in its own results folder, through ``snakemake --cores
N`` as a user runs it. For each run:

- ``wall``: Snakemake's wall time;
- ``compute``: the sum, over every dump of the run, of the seconds its manifest gives to its
  stages, less the import and the model load (reference: encoder, decoding, ...; ggml: mel,
  encoder, ...; MOSS: prefill, generate, step): the work a sweep cannot avoid;
- ``wall / compute``: how much the workflow adds (process starts, imports, loads, compares,
  the report), less what the cores run side by side;
- peak memory: the machine's used memory at its highest during the run, less before it, and
  the largest resident set of any one job (Snakemake's benchmark files);
- ``verdict``: per family, what its cells' verdicts cost against their graphs' compute
  (:mod:`verdict_floor`).

The largest Parakeet sweep then grows by one 16 s clip: the wall time of that second run, the
jobs it ran per rule, and how many cases its reference job restored from its cache.

Results: ``--out`` (default ``benchmarks/results``) ``sweep.json`` and ``sweep.md`` (the
tables of BENCHMARKS.md, "Sweeps").

Usage::

    python benchmarks/sweep.py                                # the issue's plan (hours)
    python benchmarks/sweep.py --clips 4,8 --weight-types f32,q8_0 --prompts 0   # minutes
    python benchmarks/sweep.py --tiny --out DIR          # checks the script (tiny shapes)
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from run import ensure_checkpoint, machine_info  # noqa: E402
from verdict_floor import benchmark_row, verdict_costs  # noqa: E402

from audioparity.dumping.memory import host_free_bytes  # noqa: E402

log = logging.getLogger("audioparity.bench")

JFK = ROOT.parent / "shared" / "data" / "jfk.wav"
CLIP = ROOT / "resources" / "speech" / "clip.wav"
RATE = 16000
#: espeak-ng voices and a sentence in each (public domain text of this project).
VOICES = {
    "en": "A port is right when every stage computes what the reference computes.",
    "de": "Ein Modell wird Schicht fuer Schicht mit der Referenz verglichen.",
    "fr": "Chaque couche du modele est comparee a la reference, une a une.",
    "es": "Cada capa del modelo se compara con la referencia, una por una.",
    "it": "Ogni strato del modello viene confrontato con il riferimento.",
    "nl": "Elke laag van het model wordt met de referentie vergeleken.",
}
#: Compute stages of each side's manifest: everything but these.
NOT_COMPUTE = {"import", "load"}


def espeak(voice: str, text: str) -> np.ndarray:
    """``text`` spoken by espeak-ng's ``voice``, float32 at 16 kHz (resampled with soxr)."""
    import soundfile
    import soxr

    wav = subprocess.run(["espeak-ng", "-v", voice, "--stdout", text], capture_output=True,
                         check=True).stdout
    samples, rate = soundfile.read(io.BytesIO(wav), dtype="float32")
    return soxr.resample(samples, rate, RATE).astype(np.float32)


def make_clips(n: int, folder: Path, lengths: list[float] | None = None,
               mixed: bool = True) -> list[dict]:
    """``n`` clips with lengths spread evenly over 2-30 s (a seeded order; or ``lengths``, in
    seconds), each a mix of a jfk.wav slice, the project clip and espeak-ng speech in turn, cut
    to its length; without ``mixed``, the project clip alone, repeated (needs neither jfk.wav
    nor espeak-ng)."""
    import soundfile

    folder.mkdir(parents=True, exist_ok=True)
    jfk = soundfile.read(JFK, dtype="float32")[0] if mixed else None
    clip, _ = soundfile.read(CLIP, dtype="float32")
    if lengths is None:
        lengths = np.random.default_rng(0).permutation(np.linspace(2.0, 30.0, n))
    cases = []
    for i, seconds in enumerate(lengths):
        pieces, total, k = [], 0, 0
        while total < seconds * RATE:
            piece = _piece(i, k, seconds, jfk, clip) if mixed else clip
            pieces.append(piece)
            total += len(piece)
            k += 1
        path = folder / f"c{i:02d}.wav"
        soundfile.write(path, np.concatenate(pieces)[: int(seconds * RATE)], RATE)
        cases.append({"name": f"c{i:02d}", "path": str(path)})
    return cases


def _piece(i: int, k: int, seconds: float, jfk: np.ndarray, clip: np.ndarray) -> np.ndarray:
    """Piece ``k`` of clip ``i`` (``seconds`` long): a slice of jfk.wav, the project clip or an
    espeak-ng sentence, in turn."""
    kind = (i + k) % 3
    if kind == 0:
        start = (i * 7919) % (len(jfk) - 2 * RATE)
        return jfk[start:start + int(min(8, seconds) * RATE)]
    if kind == 1:
        return clip
    voices = list(VOICES)
    voice = voices[(i + k) % len(voices)]
    return espeak(voice, VOICES[voice])


def make_prompts(n: int, folder: Path) -> list[dict]:
    """``n`` MOSS prompts: the shipped prompts' instructions and languages with new texts."""
    folder.mkdir(parents=True, exist_ok=True)
    shipped = [json.loads(p.read_text()) for p in sorted((ROOT / "resources/moss").glob("*.json"))]
    texts = list(VOICES.values())
    cases = []
    for i in range(n):
        prompt = dict(shipped[i % len(shipped)])
        if prompt.get("language") != "Chinese":
            prompt["text"] = " ".join(texts[(i + j) % len(texts)] for j in range(1 + i % 3))
        path = folder / f"p{i:02d}.json"
        path.write_text(json.dumps(prompt, ensure_ascii=False) + "\n")
        cases.append({"name": f"p{i:02d}", "path": str(path)})
    return cases


def sweep_config(parakeet: Path | None, clips: list[dict], moss: Path | None,
                 prompts: list[dict], weight_types: list[str]) -> dict:
    """The default config (its gates and options) with the benchmark's models and cases, judged
    against the primary reference alone (the others are a constant cost per model)."""
    config = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
    config["fixtures"] = {}
    config["families"] = []
    for family, model, cases in (("parakeet_tdt", parakeet, clips),
                                 ("moss_voicegen", moss, prompts)):
        if model is None or not cases:
            config.pop(family, None)
            continue
        config["families"].append(family)
        name = (model.stem if model.is_file() else model.name).replace(".", "_")
        config[family].update(models=[{"name": name, "path": str(model)}],
                              cases=cases, weight_types=weight_types, backends=["cpu"],
                              references=config[family]["references"][:1])
    config.pop("whisper", None)
    return config


class MemoryWatch:
    """The machine's used memory (MemTotal - MemAvailable) sampled every 0.2 s: its peak."""

    def __init__(self) -> None:
        self.baseline = self.peak = self._used()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    @staticmethod
    def _used() -> int:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return (int(info["MemTotal"].split()[0]) - int(info["MemAvailable"].split()[0])) * 1024

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used())

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def compute_seconds(results: Path) -> dict[str, float]:
    """Per family and side, the seconds the dumps' manifests give to their compute stages."""
    totals: dict[str, float] = {}
    for side in ("reference", "ggml"):
        for manifest in (results / side).rglob("manifest.json"):
            document = json.loads(manifest.read_text())
            family = manifest.relative_to(results / side).parts[0]
            seconds = sum(v for k, v in document.get("seconds", {}).items()
                          if k not in NOT_COMPUTE)
            key = f"{family}/{side}"
            totals[key] = totals.get(key, 0.0) + seconds
    return totals


def job_peak_rss(results: Path) -> tuple[float, str]:
    """The largest ``max_rss`` (MB) of Snakemake's benchmark files, and its job."""
    best = (0.0, "")
    for tsv in (results / "benchmarks").rglob("*.tsv"):
        try:
            rss = float(benchmark_row(tsv)["max_rss"])
        except (KeyError, ValueError):
            continue
        best = max(best, (rss, str(tsv.relative_to(results / "benchmarks"))))
    return best


def snakemake(work: Path, config: dict, cores: int, mem_mb: int | None, log_name: str
              ) -> float:
    """Run the workflow on ``config`` in ``work`` (``--resources mem_mb``); its wall seconds.
    Its output goes to ``work/<log_name>``."""
    (work / "sweep.yaml").write_text(yaml.safe_dump(config, allow_unicode=True))
    argv = [sys.executable, "-m", "snakemake", "--directory", str(work), "--snakefile",
            str(ROOT / "Snakefile"), "--configfile", str(work / "sweep.yaml"), "--cores",
            str(cores), *(["--resources", f"mem_mb={mem_mb}"] if mem_mb else [])]
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    start = time.perf_counter()
    with open(work / log_name, "w") as out:
        code = subprocess.run(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                              ).returncode
    if code:
        raise SystemExit(f"the sweep in {work} failed (exit {code}); see {work}/{log_name}")
    return time.perf_counter() - start


def add_a_case(work: Path, config: dict, family: str, case: dict, cores: int,
               mem_mb: int | None) -> dict:
    """Run the workflow again with ``case`` added to ``family``'s cases: its wall time, the jobs
    it ran per rule, and how many cases its reference job restored from its cache."""
    grown = yaml.safe_load(yaml.safe_dump(config))
    grown[family]["cases"].append(case)
    wall = snakemake(work, grown, cores, mem_mb, "snakemake-add-a-case.log")
    text = (work / "snakemake-add-a-case.log").read_text()
    rules = {}
    for rule in re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):", text, re.M):
        rules[rule] = rules.get(rule, 0) + 1
    restored = [re.search(r"(\d+ of \d+ case\(s\) restored)", log.read_text())
                for log in (work / "logs/reference_dump").rglob("*.log")]
    return {"wall_s": round(wall, 1), "jobs": rules,
            "reference": [m[1] for m in restored if m]}


def run_sweep(work: Path, config: dict, cores: int, mem_mb: int | None,
              keep: bool = False, add: tuple[str, dict] | None = None) -> dict:
    """One cold run of the workflow on ``config`` in ``work`` (``--resources mem_mb``): wall,
    compute, memory; then, with ``add`` (a family and a case), :func:`add_a_case`. The run's
    folder is removed after unless ``keep``."""
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    with MemoryWatch() as memory:
        wall = snakemake(work, config, cores, mem_mb, "snakemake.log")
    compute = compute_seconds(work / "results")
    rss, job = job_peak_rss(work / "results")
    result = {"wall_s": round(wall, 1), "compute_s": {k: round(v, 1) for k, v in compute.items()},
              "compute_total_s": round(sum(compute.values()), 1),
              "wall_over_compute": round(wall / max(sum(compute.values()), 1e-9), 2),
              "peak_used_mb": round((memory.peak - memory.baseline) / 2**20),
              "peak_job_rss_mb": round(rss), "peak_job": job,
              "verdict": verdict_costs(work / "results")["families"]}
    if add:
        result["add_a_case"] = add_a_case(work, config, *add, cores, mem_mb)
    if not keep:  # full-size dumps: about 0.5 GB per clip and weight type, references included
        shutil.rmtree(work)
    return result


def table(runs: list[dict]) -> str:
    """The Markdown tables of the runs."""
    lines = ["| sweep | cases | weight types | wall s | compute s | wall / compute | "
             "wall per case vs first | peak used MB | largest job RSS MB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        lines.append(f"| {run['family']} | {run['cases']} | {run['weight_types']} | "
                     f"{run['wall_s']} | {run['compute_total_s']} | {run['wall_over_compute']} | "
                     f"{run.get('wall_per_case_vs_first', '')} | {run['peak_used_mb']} | "
                     f"{run['peak_job_rss_mb']} ({run['peak_job']}) |")
    for run in runs:
        verdict = run["verdict"][run["family"]]
        lines.append(f"\n{run['family']}, {run['cases']} cases: {verdict['cells']} verdicts "
                     f"cost {verdict['cost_s']} s against {verdict['floor_s']} s of graph "
                     f"compute ({verdict['cost_over_floor']}x; verdict_floor.py)")
    for run in runs:
        if "add_a_case" in run:
            added = run["add_a_case"]
            jobs = ", ".join(f"{rule} {n}" for rule, n in sorted(added["jobs"].items()))
            lines.append(f"\n{run['family']}, {run['cases']} cases, one case added: wall "
                         f"{added['wall_s']} s; jobs: {jobs}; reference: "
                         f"{'; '.join(added['reference'])}")
    return "\n".join(lines) + "\n"


#: ``--tiny``: the defaults of a short run that checks the script (tests/test_benchmarks.py).
TINY = {"clips": "1", "prompts": 1, "weight_types": "f32", "moss_shape": "tiny",
        "parakeet_shape": "tiny"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clips", default="8,16,32", help="Parakeet sweep sizes, in order")
    parser.add_argument("--prompts", type=int, default=16, help="MOSS prompts (0: no MOSS)")
    parser.add_argument("--weight-types", default="native,f32,f16,bf16,q8_0")
    parser.add_argument("--moss-shape", default="1.7b", choices=("1.7b", "0.6b", "tiny"))
    parser.add_argument("--parakeet-shape", default="v3", choices=("v3", "tiny"))
    parser.add_argument("--tiny", action="store_true",
                        help="check the script: tiny shapes, one clip of the project clip alone "
                             "(no espeak-ng, no jfk.wav), one prompt, f32, unless given")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--mem-mb", type=int, default=None,
                        help="the memory the jobs may share (--resources mem_mb; default: 95 %% "
                             "of what the machine has free at the start), so that a model's "
                             "reference and its conversions are not run side by side beyond it")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--work", type=Path, default=None,
                        help="where the runs go (default: a folder under --cache)")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--keep", action="store_true",
                        help="keep each run's results (tens of GB at the full plan)")
    args = parser.parse_args(argv)
    if args.tiny:  # the tiny defaults, under the flags given
        parser.set_defaults(**TINY)
        args = parser.parse_args(argv)
    return args


def check_sources(mixed: bool) -> None:
    """Exit with one line when the clips' sources are missing (espeak-ng, jfk.wav)."""
    if not mixed:
        return
    if shutil.which("espeak-ng") is None:
        raise SystemExit("benchmarks: no espeak-ng for the clips (apt-get install espeak-ng; "
                         "make bench-sweep installs it; --tiny needs none)")
    if not JFK.is_file():
        raise SystemExit(f"benchmarks: no {JFK} (the clips slice it; --tiny needs none)")


def sweep_plan(args: argparse.Namespace, sizes: list[int], work: Path, parakeet: Path | None,
               moss: Path | None) -> list[tuple[str, int, dict, tuple[str, dict] | None]]:
    """``(family, cases, config, case to add or None)`` of each run: a Parakeet run per size
    (the largest grows by one clip of the mean length), then MOSS over the prompts."""
    weight_types, mixed = args.weight_types.split(","), not args.tiny
    runs = []
    for n in sizes:
        clips = make_clips(n, work / "inputs" / f"clips{n}", mixed=mixed)
        add = None
        if n == max(sizes):
            added = make_clips(1, work / "inputs" / "added", lengths=[16.0], mixed=mixed)[0]
            add = ("parakeet_tdt", {**added, "name": "added"})
        runs.append(("parakeet_tdt", n, sweep_config(parakeet, clips, None, [], weight_types),
                     add))
    if args.prompts:
        prompts = make_prompts(args.prompts, work / "inputs" / "prompts")
        runs.append(("moss_voicegen", args.prompts,
                     sweep_config(None, [], moss, prompts, weight_types), None))
    return runs


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    check_sources(mixed=not args.tiny)
    sizes = [int(n) for n in args.clips.split(",") if n]
    mem_mb = args.mem_mb or int(0.95 * (host_free_bytes() or 0) / 2**20) or None
    weight_types = args.weight_types.split(",")
    work = args.work or args.cache / "sweep"
    logs = args.out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    parakeet = ensure_checkpoint("parakeet", args.parakeet_shape, args.cache, logs) \
        if sizes else None
    moss = ensure_checkpoint("moss", args.moss_shape, args.cache, logs) if args.prompts else None
    runs = []
    for family, n, config, add in sweep_plan(args, sizes, work, parakeet, moss):
        log.info("sweep %s: %d cases x %d weight types (cores %d, mem_mb %s)", family, n,
                 len(weight_types), args.cores, mem_mb)
        result = run_sweep(work / f"{family}-{n}", config, args.cores, mem_mb, args.keep, add)
        result.update(family=family, cases=n, weight_types=len(weight_types), mem_mb=mem_mb)
        log.info("sweep %s %d: wall %.0f s, compute %.0f s, ratio %.2f, peak %d MB", family, n,
                 result["wall_s"], result["compute_total_s"], result["wall_over_compute"],
                 result["peak_used_mb"])
        runs.append(result)
        write_results(args.out, args.cores, weight_types, runs)  # a later run may fail: hours
    print(table(runs))


def write_results(out: Path, cores: int, weight_types: list[str], runs: list[dict]) -> None:
    """``sweep.json`` and ``sweep.md`` of the runs so far, with each Parakeet run's wall time
    per clip against the first's (the growth)."""
    growth = [r for r in runs if r["family"] == "parakeet_tdt"]
    for run in growth:
        run["wall_per_case_vs_first"] = round(
            (run["wall_s"] / run["cases"]) / (growth[0]["wall_s"] / growth[0]["cases"]), 2)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(
        {"machine": machine_info(), "cores": cores, "weight_types": weight_types, "runs": runs},
        indent=1) + "\n")
    (out / "sweep.md").write_text(table(runs))


if __name__ == "__main__":
    main()
