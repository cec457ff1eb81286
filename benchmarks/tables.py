"""The tables of :mod:`run` and :mod:`builds`: the children's results flattened into one record
per measured part (``bench.csv``), and the Markdown of ``bench.md`` (times and ratios ggml /
torch, the acceptance targets, the processes, the memory of the dumps).
"""

from __future__ import annotations

import csv
import json
import statistics
from pathlib import Path
from typing import TYPE_CHECKING

from checkpoints import SIZES

if TYPE_CHECKING:
    from run import Plan

MIB = 2**20


def _stats(ms: list[float]) -> dict:
    return {"n": len(ms), "median_ms": statistics.median(ms), "min_ms": min(ms),
            "max_ms": max(ms)}


def flatten(results: list[dict]) -> list[dict]:
    """One record per (child, part) with its statistics, peak RSS and parity figures."""
    records = []
    for r in results:
        if "parts" not in r:
            continue
        spec = r["spec"]
        impl = "torch" if spec["kind"].endswith("_torch") else "ggml"
        for part, ms in r["parts"].items():
            records.append({
                "model": spec["kind"].split("_")[0], "impl": impl,
                "build": spec.get("build", "") if impl == "ggml" else "",
                "weight_type": spec.get("weight_type", "f32") if impl == "ggml" else "f32",
                "threads": spec["threads"], "part": part, **_stats(ms),
                "peak_rss_mib": r["peak_rss_mib"], "others_cores": r.get("others_cores"),
                **{f"parity_{k}": v for k, v in r.get("parity", {}).items()},
                **{f"{k}_mib": round(v / MIB, 1) for k, v in r.get("bytes", {}).items()},
            })
    return records


def _fmt_ms(record: dict) -> str:
    return (f"{record['median_ms']:.0f} ({record['min_ms']:.0f}–{record['max_ms']:.0f})"
            if record["median_ms"] >= 10 else
            f"{record['median_ms']:.2f} ({record['min_ms']:.2f}–{record['max_ms']:.2f})")


def _baseline(records: list[dict], model: str, part: str, threads: int) -> dict | None:
    """The torch record a ggml part is compared with (torch is always float32; MOSS
    ``prefill`` is the same-work prefill)."""
    return next((r for r in records if r["impl"] == "torch" and r["model"] == model
                 and r["part"] == part and r["threads"] == threads), None)


#: Other processes' CPU use (cores) above which a measurement is flagged as disturbed.
NOISY_CORES = 0.25


def _ggml(records: list[dict], model: str, part: str, threads: int,
          weight_type: str) -> dict | None:
    return next((r for r in records if r["impl"] == "ggml" and r["model"] == model
                 and r["part"] == part and r["threads"] == threads
                 and r["weight_type"] == weight_type), None)


def ratio_table(records: list[dict], weight_types: list[str]) -> list[str]:
    """Markdown: torch ms, then ggml ms and ggml/torch per weight type, and the most CPU other
    processes used during any of the row's measurements."""
    head = ["model", "part", "threads", "torch ms (min–max)",
            *[f"ggml {t} ms" for t in weight_types], *[f"{t} ratio" for t in weight_types],
            "other load (cores)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    keys = sorted({(r["model"], r["part"], r["threads"]) for r in records if r["impl"] == "ggml"})
    for model, part, threads in keys:
        torch_rec = _baseline(records, model, part, threads)
        cells = [model, part, str(threads), _fmt_ms(torch_rec) if torch_rec else "–"]
        ratios, others = [], [torch_rec["others_cores"] if torch_rec else 0.0]
        for t in weight_types:
            g = _ggml(records, model, part, threads, t)
            cells.append(_fmt_ms(g) if g else "–")
            ratios.append(f"{g['median_ms'] / torch_rec['median_ms']:.2f}"
                          if g and torch_rec else "–")
            others.append(g["others_cores"] if g else 0.0)
        lines.append("| " + " | ".join(cells + ratios + [f"{max(others):.2f}"]) + " |")
    for r in (r for r in records if r["part"] == "prefill_upstream"):
        lines.append(f"\nMOSS torch prefill as the reference dump runs it (upstream's forward: "
                     f"heads on all rows), {r['threads']} thread(s): {_fmt_ms(r)} ms.")
    return lines


#: The parts whose matmuls have a right-hand side of many rows (the rest: one row a step).
MANY_ROWS = ("encoder", "prefill")


def kernel(part: str, weight_type: str, features: set[str]) -> str:
    """The CPU matmul kernel a part's weight matmuls run in ggml 0.15.3 (the ggml of
    ggml-python 0.0.45), by the CPU features its build uses (:func:`audioparity.ggml.doctor`'s
    ``cpu_features``): llamafile's tinyBLAS (``ggml-cpu/llamafile/sgemm.cpp``), which ggml tries
    first for a right-hand side of at least 2 rows, else ggml's ``vec_dot`` of the weight type
    (``ggml-cpu/vec.cpp``, ``arch/x86/quants.c``), one dot product per output value. A build
    with ``setup/patches/ggml-python-cpu-gemm.patch`` runs q8_0 with 8 or more rows in its
    tinyBLAS_Q8_0_R8 (feature ``q8_0_r8``) and, on AVX2 without AVX-512, f32 with 12 or more
    rows in its tinyBLAS_F32_R16 (feature ``f32_r16``). An f16, bf16 or q8_0 weight's
    activations are first converted to its ``vec_dot_type`` (f16, bf16, q8_0 blocks), which is
    the rounding the quantization-aware reference emulates."""
    width = "AVX-512" if "avx512" in features else "AVX2" if "avx2" in features else "SSE"
    vnni = "VNNI dpbusd" if {"avx512_vnni", "avx_vnni"} & features else "maddubs"
    bf16 = "avx512_bf16" in features
    if part in MANY_ROWS and "llamafile" in features:
        return {"f32": "tinyBLAS_F32_R16 f32 (patched), 16 rows packed, 6x16 AVX2 FMA tile"
                if "f32_r16" in features else f"tinyBLAS f32, {width} FMA",
                "f16": f"tinyBLAS f16, {width} (both sides widened to f32 per load)",
                "bf16": "tinyBLAS bf16, AVX512-BF16 vdpbf16ps" if bf16
                else f"tinyBLAS bf16, {width} (widened to f32)",
                "q8_0": f"tinyBLAS_Q8_0_R8 q8_0 x q8_0 (patched), 8 rows packed, 256-bit {vnni}, "
                        "f32 scale per block of 8 rows" if "q8_0_r8" in features else
                        f"tinyBLAS_Q0_AVX q8_0 x q8_0, 256-bit {vnni}, f32 scale per block"
                }.get(weight_type, f"vec_dot_{weight_type}")
    return {"f32": f"vec_dot_f32, {width}", "f16": f"vec_dot_f16, {width} (F16C)",
            "bf16": "vec_dot_bf16, AVX512-BF16" if bf16 else f"vec_dot_bf16, {width}",
            "q8_0": f"vec_dot_q8_0_q8_0, 256-bit {vnni}"}.get(weight_type,
                                                              f"vec_dot_{weight_type}")


def build_features(results: list[dict]) -> set[str]:
    """The CPU features the ggml children's build uses (:func:`measure._build_info`)."""
    return next((set(r["info"]["cpu_features"]) for r in results
                 if "cpu_features" in r.get("info", {})), set())


def kernel_table(records: list[dict], weight_types: list[str], features: set[str]) -> list[str]:
    """Markdown: the kernel (:func:`kernel`) of each part and weight type measured."""
    parts = sorted({(r["model"], r["part"]) for r in records if r["impl"] == "ggml"})
    lines = ["| model | part | " + " | ".join(weight_types) + " |",
             "|---|---|" + "---|" * len(weight_types)]
    for model, part in parts:
        lines.append(f"| {model} | {part} | "
                     + " | ".join(kernel(part, t, features) for t in weight_types) + " |")
    return lines


def process_table(results: list[dict]) -> list[str]:
    """Markdown: per process, its peak RSS, buffers, load time and parity figures."""
    lines = ["| process | threads | peak RSS MiB | weights MiB | activations MiB | load s | "
             "other load (cores) | parity |", "|---" * 8 + "|"]
    for r in results:
        spec, b = r["spec"], r.get("bytes")
        name = spec["kind"] + (f" {spec['weight_type']}" if "weight_type" in spec else "")
        buffers = ["–", "–"] if not b else [
            f"{b['weights'] / MIB:.0f}", f"{(b['compute'] + b.get('kv_cache', 0)) / MIB:.0f}"]
        parity = ", ".join(f"{k} {v:.6g}" if isinstance(v, float) else f"{k} {v}"
                           for k, v in r.get("parity", {}).items()) or "–"
        load = r.get("seconds", {}).get("load")
        cells = [name, str(spec["threads"]), f"{r.get('peak_rss_mib', 0):.0f}", *buffers,
                 f"{load:.1f}" if load is not None else r.get("error", "–"),
                 f"{r.get('others_cores', float('nan')):.2f}", parity]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def acceptance(records: list[dict]) -> list[str]:
    """The issue-5 targets at 2 threads, met or not (flagged when other processes disturbed
    the measurements)."""
    targets = [("parakeet", "encoder", "f32", 1.0), ("parakeet", "encoder", "q8_0", 0.6),
               ("moss", "prefill", "f32", 1.0), ("moss", "step", "q8_0", 0.6)]
    lines = []
    for model, part, weight_type, limit in targets:
        torch_rec = _baseline(records, model, part, 2)
        g = _ggml(records, model, part, 2, weight_type)
        if not (torch_rec and g):
            lines.append(f"- {model} {part} {weight_type}: not measured")
            continue
        ratio = g["median_ms"] / torch_rec["median_ms"]
        others = max(g["others_cores"] or 0.0, torch_rec["others_cores"] or 0.0)
        noisy = (f" (other processes used up to {others:.2f} cores meanwhile: not conclusive)"
                 if others > NOISY_CORES else "")
        lines.append(f"- {model} {part}, ggml {weight_type} / torch f32, 2 threads: "
                     f"**{ratio:.2f}** (target ≤ {limit}) — "
                     f"{'met' if ratio <= limit else 'MISSED'}{noisy}")
    return lines


def memory_table(rows: list[dict]) -> list[str]:
    lines = ["| model | process | weights | peak RSS MiB | weights MiB | activations MiB | "
             "peak / (weights + activations) | interpreter MiB | same, less the interpreter |",
             "|---" * 9 + "|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['process']} | {r['weight_type']} | "
                     f"{r['peak_rss_mib']} | {r.get('weights_mib', '–')} | "
                     f"{r.get('activations_mib', '–')} | {r.get('ratio', '–')} | "
                     f"{r.get('interpreter_mib', '–')} | {r.get('ratio_less_interpreter', '–')} |")
    return lines


def write_raw(out: Path, prefix: str, machine: dict, plan: Plan, results: list[dict],
              memory: list[dict]) -> list[dict]:
    """``{prefix}.json`` (everything) and ``{prefix}.csv`` (:func:`flatten`); returns the
    records."""
    records = flatten(results)
    out.mkdir(parents=True, exist_ok=True)
    home = str(Path.home())  # paths under it are written from ~, as the results are shared
    (out / f"{prefix}.json").write_text(json.dumps(
        {"machine": machine, "plan": plan.__dict__, "results": results, "memory": memory},
        indent=1).replace(home, "~") + "\n")
    fields = list(dict.fromkeys(k for r in records for k in r))
    with open(out / f"{prefix}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        for record in records:
            writer.writerow({k: (f"{v:.4g}" if isinstance(v, float) else
                                 v.replace(home, "~") if isinstance(v, str) else v)
                             for k, v in record.items()})
    return records


def header(title: str, machine: dict, plan: Plan) -> list[str]:
    """Markdown title, machine and plan lines."""
    v = machine["versions"]
    return [
        f"# {title}", "",
        f"Machine: {machine['cpu']} [{' '.join(machine.get('cpu_features', []))}], "
        f"{machine['cores']} cores, {machine['memory_gib']} GiB; "
        f"load average (1, 5, 15 min) at start {machine['loadavg_start']}, at end "
        f"{machine.get('loadavg_end')}; {machine.get('total_s')} s in all. torch {v['torch']}, "
        f"nemo_toolkit {v['nemo_toolkit']}, transformers {v['transformers']}, numpy "
        f"{v['numpy']}, ggml-python {v['ggml-python']}; git {machine['git']}.", "",
        f"Shapes: Parakeet {SIZES[plan.size][0]}, MOSS {SIZES[plan.size][1]}; "
        f"{plan.seconds:g} s of audio, {plan.rows} prompt rows, {plan.steps} timed steps; "
        f"repetitions {plan.reps} (median, min–max after one warm-up).", "",
    ]


def write_outputs(out: Path, machine: dict, plan: Plan, results: list[dict],
                  memory: list[dict]) -> list[dict]:
    """``bench.json``, ``bench.csv`` and ``bench.md``; returns the records (:func:`flatten`)."""
    records = write_raw(out, "bench", machine, plan, results, memory)
    lines = [
        *header(f"Benchmark ({plan.size}, ggml build {plan.build})", machine, plan),
        "## Times and ratios (ggml / torch)", "", *ratio_table(records, plan.weight_types), "",
        "## Kernels (the weight matmuls', by this build's CPU features)", "",
        *kernel_table(records, plan.weight_types, build_features(results)), "",
        "## Acceptance (issue 5, 2 threads)", "", *acceptance(records), "",
        "## Processes (peak RSS, parity with the reference)", "", *process_table(results), "",
    ]
    if memory:
        lines += ["## Memory of the ggml dumps", "", *memory_table(memory), ""]
    (out / "bench.md").write_text("\n".join(lines))
    return records


