"""The cost of a precision search (``audioparity precision``) against one float32 reference pass.

On the trained Parakeet (``resources/models/parakeet-tdt-espeak``) and its two shipped cases, for
each ``--types`` weight type: the search's wall time, how many trials it ran, the recipe it found
(weights kept wide, bits per weight against uniform and all-wide), whether our port verified it;
and, in the same run, the wall time of one float32 reference pass of the same cases (the model
loaded, each case dumped), so the search is given as a ratio of it. The budget the search is held
to: 30 minutes on 2 cores for this model.

With ``--tiny`` (checks the script: tests/test_benchmarks.py): the tiny random Parakeet of
:mod:`checkpoints` and the project clip alone.

Usage::

    python benchmarks/precision.py --types q4_0,q2_K --threads 2
    python benchmarks/precision.py --tiny --types q4_0 --targets '[...]' --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from run import ensure_checkpoint  # noqa: E402

TRAINED = REPO / "resources" / "models" / "parakeet-tdt-espeak" / "model.nemo"
CASES = (REPO / "resources" / "speech" / "clip.wav", REPO / "resources" / "speech" / "heldout.wav")
#: What the recipe must keep: each case's transcript as the float32 reference's.
TARGETS = [{"stage": "decode", "wer_max": 0.0}]
#: The program the searches run: the venv's ``audioparity``, beside this interpreter.
AUDIOPARITY = str(Path(sys.executable).with_name("audioparity"))


def wall(argv: list[str]) -> float:
    """Seconds ``argv`` takes; it must exit 0."""
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} exited {done.returncode}: "
                         f"{done.stderr.strip().splitlines()[-1:]}")
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", default="q4_0,q2_K")
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    parser.add_argument("--tiny", action="store_true", help="the tiny random Parakeet, one case")
    parser.add_argument("--targets", default=json.dumps(TARGETS),
                        help="the gate entries the recipe must meet (JSON)")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint("parakeet", "tiny", args.cache, args.out) if args.tiny else TRAINED
    cases = CASES[:1] if args.tiny else CASES
    inputs = [arg for case in cases for arg in ("--audio", str(case))]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as work:
        reference = wall([AUDIOPARITY, "reference", "parakeet-tdt", "--model", str(model),
                          *(arg for i, case in enumerate(cases)
                            for arg in ("--audio", str(case), "--output-dir", f"{work}/r{i}")),
                          "--threads", str(args.threads)])
        for weight_type in args.types.split(","):
            output = Path(work) / f"{weight_type}.json"
            seconds = wall([AUDIOPARITY, "precision", "parakeet-tdt", "--model", str(model),
                            *inputs, "--weight-type", weight_type, "--targets",
                            args.targets, "--output", str(output), "--threads",
                            str(args.threads)])
            recipe = json.loads(output.read_text())
            results[weight_type] = {
                "seconds": round(seconds, 1), "ratio_to_reference": round(seconds / reference, 1),
                "trials": recipe["search"]["trials"], "wide": sorted(recipe["overrides"]),
                "bits_per_weight": recipe["bits_per_weight"],
                "verified": recipe["verified"]["passed"]}
            print(f"{weight_type}: {seconds:.1f} s ({seconds / reference:.1f}x one float32 "
                  f"reference pass of {reference:.1f} s), {results[weight_type]['trials']} "
                  f"trials, {len(recipe['overrides'])} kept {recipe['wide']}, "
                  f"{recipe['bits_per_weight']['recipe']:.3f} bits per weight "
                  f"(uniform {recipe['bits_per_weight']['uniform']:.3f})")
    (args.out / "precision.json").write_text(json.dumps(
        {"model": "tiny" if args.tiny else "parakeet-tdt-espeak", "threads": args.threads,
         "cases": [c.name for c in cases], "reference_seconds": round(reference, 1),
         "types": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
