"""What one verdict costs against its floor: a finished run's cells, each (clip, weight type) of
our port or another candidate, from the run's own records.

A cell's verdict takes:

- ``reference``: its share of the model's reference job (the job's wall seconds over the
  reference dumps it wrote: the clip at float32 and at each quantization-aware type);
- ``candidate``: the wall seconds of its ggml dump job, split by the dump's manifest into the
  candidate pass (the stages a port computes on its own), the isolated pass (on the
  reference's inputs or decisions: the ``isolated`` and ``replayed`` forms and the stages on
  the reference's path) and the rest (process start, imports, weights, writing);
- ``compare``: the wall seconds of its compare job.

Its floor is what no workflow can save: the seconds its graphs spent in the backend's compute
(the dump manifest's ``graph_seconds``: ``ggml_backend_sched_graph_compute``, waiting for the
device), beside the reference's own forward (its manifest's stage seconds, load left out). The
ratio ``cost / floor`` is how far the workflow is from the speed of its graphs; for the
default sweep's tiny fixtures it is the price of a process per job.

Usage::

    python benchmarks/verdict_floor.py --results results --label "make run"
    python benchmarks/verdict_floor.py --results DIR --label after --out benchmarks/results

Writes ``verdict_floor.json`` (the runs by label, each with its cells) under ``--out`` and prints
the table of BENCHMARKS.md, "The verdict's floor". ``sweep.py`` reports the same of each of its
runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from audioparity.dumping.artifacts import GRAPH_SECONDS
from audioparity.models.registry import spec_of

HERE = Path(__file__).resolve().parent

#: The manifest stage that is no pass of the model: loading the weights.
LOAD = "load"


def benchmark_row(tsv: Path) -> dict[str, str]:
    """The first row of a Snakemake benchmark file (tab-separated: ``s``, ``max_rss``, ...),
    by column name."""
    header, row = tsv.read_text().splitlines()[:2]
    return dict(zip(header.split("\t"), row.split("\t"), strict=False))


def job_seconds(tsv: Path) -> float:
    """The wall seconds (``s``) of a Snakemake benchmark file."""
    return float(benchmark_row(tsv)["s"])


def _manifest(folder: Path) -> dict:
    return json.loads((folder / "manifest.json").read_text())


def _passes(family: str, seconds: dict[str, float]) -> tuple[float, float]:
    """A ggml dump's stage seconds as (candidate pass, isolated pass: the forms and the
    reference-path stages of the family's spec), load left out."""
    spec = spec_of(family)
    own = isolated = 0.0
    for stage, value in seconds.items():
        if stage == LOAD:
            continue
        found = spec.locate(stage)
        if found is not None and (found.form or found.stage.reference_path):
            isolated += value
        else:
            own += value
    return own, isolated


def reference_share(results: Path, reference: Path) -> float:
    """The wall seconds of the reference job that wrote ``reference``, over the dumps it wrote."""
    model_dir = reference.parent
    rel = model_dir.relative_to(results / "reference")
    dumps = sum(1 for d in model_dir.iterdir() if (d / "manifest.json").is_file())
    return job_seconds(results / "benchmarks" / "reference_dump" / f"{rel}.tsv") / max(dumps, 1)


def cell_cost(results: Path, dump: Path) -> dict:
    """One cell's verdict, from its ggml dump folder ``dump`` under ``results/ggml``.

    Raises:
        SystemExit: a record the cost needs is missing (a job that did not run here).
    """
    rel = dump.relative_to(results / "ggml")
    manifest = _manifest(dump)
    family = rel.parts[0]
    try:
        ggml_job = job_seconds(results / "benchmarks" / "ggml_dump" / f"{rel}.tsv")
        compare_job = job_seconds(results / "benchmarks" / "compare_cell" / f"{rel}.tsv")
        reference = Path(manifest["inputs"]["reference"]["path"])
        if not reference.is_absolute():
            reference = results.parent / reference
        ref_manifest = _manifest(reference)
        ref_share = reference_share(results, reference)
    except (OSError, KeyError) as err:
        raise SystemExit(f"{dump}: no record of {err} (a cell of a finished run?)") from err
    own, isolated = _passes(family, manifest.get("seconds", {}))
    graphs = sum(manifest.get(GRAPH_SECONDS, {}).values())
    reference_forward = sum(v for k, v in ref_manifest.get("seconds", {}).items() if k != LOAD)
    cost = ref_share + ggml_job + compare_job
    return {"cell": str(rel), "family": family, "weight_type": rel.parts[4],
            "reference_s": round(ref_share, 4), "reference_forward_s": round(reference_forward, 4),
            "candidate_job_s": ggml_job, "candidate_pass_s": round(own, 4),
            "isolated_pass_s": round(isolated, 4),
            "candidate_rest_s": round(ggml_job - own - isolated, 4), "compare_s": compare_job,
            "cost_s": round(cost, 4), "floor_s": round(graphs, 4),
            "cost_over_floor": round(cost / graphs, 1) if graphs else None}


def verdict_costs(results: Path) -> dict:
    """Every cell of the run under ``results`` (:func:`cell_cost`), and per family the totals
    and the median ratio.

    Raises:
        SystemExit: no ggml dump under ``results``, or a cell without its records.
    """
    dumps = sorted(m.parent for m in (results / "ggml").rglob("manifest.json")
                   if "graphs" not in m.relative_to(results / "ggml").parts)
    if not dumps:
        raise SystemExit(f"{results}: no ggml dumps (the results folder of a finished run?)")
    cells = [cell_cost(results, dump) for dump in dumps]
    families = {}
    for family in sorted({c["family"] for c in cells}):
        mine = [c for c in cells if c["family"] == family]
        total = {key: round(sum(c[key] for c in mine), 2)
                 for key in ("reference_s", "candidate_job_s", "candidate_pass_s",
                             "isolated_pass_s", "compare_s", "cost_s", "floor_s")}
        ratios = [c["cost_over_floor"] for c in mine if c["cost_over_floor"] is not None]
        families[family] = {"cells": len(mine), **total,
                            "cost_over_floor": round(total["cost_s"] / total["floor_s"], 1)
                            if total["floor_s"] else None,
                            "median_cell_ratio": statistics.median(ratios) if ratios else None}
    return {"families": families, "cells": cells}


def table(runs: dict[str, dict]) -> str:
    """The Markdown table of the runs by label."""
    lines = ["| run | family | cells | cost s | reference s | candidate job s (pass + isolated) "
             "| compare s | floor s | cost / floor |", "|---|---|---|---|---|---|---|---|---|"]
    for label, run in runs.items():
        for family, f in run["families"].items():
            lines.append(f"| {label} | {family} | {f['cells']} | {f['cost_s']} | "
                         f"{f['reference_s']} | {f['candidate_job_s']} ({f['candidate_pass_s']} "
                         f"+ {f['isolated_pass_s']}) | {f['compare_s']} | {f['floor_s']} | "
                         f"{f['cost_over_floor']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"),
                        help="the results folder of a finished run")
    parser.add_argument("--label", default="run", help="the run's name in the table")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    results = args.results.resolve()
    run = verdict_costs(results)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "verdict_floor.json"
    runs = json.loads(path.read_text()) if path.exists() else {}
    runs[args.label] = run
    path.write_text(json.dumps(runs, indent=1) + "\n")
    sys.stdout.write(table({args.label: run}))


if __name__ == "__main__":
    main()
