"""Third-party ports at the types their own tools write, judged before and after the
storage-matched reference.

Runs the workflow (in ``--work``) on the trained Parakeet (``resources/models/``; the clip, the
held-out sentence and jfk.wav) with transcribe.cpp at q8_0, q5_K_M and q4_K_M (its presets) and
whisper.cpp at q8_0, q5_0 and q4_0; on Whisper tiny.en (``--tiny-en``, converted as
config/examples/whisper-tiny-en.yaml says; left out when absent) with whisper.cpp at q8_0, q5_0
and q4_0 under that model's own gates (config/examples/quant.yaml); and on the tiny MOSS
fixture (its four prompts) with llama.cpp at q8_0 and q4_K_M. No expected failure is declared:
every verdict is the raw one. Then, for each quantized cell of a third-party port:

- **before**: its dump compared with our storage policy's quantization-aware reference of its
  weight type (a mix's base type), its replay redone as that reference computes
  (``--emulate``), a port fed by the reference (llama.cpp its input embeddings, whisper.cpp's
  Whisper its path) run again on that reference: what such a cell was judged by before the
  storage-matched reference;
- **after**: its rows of the run's summary.csv, against the storage-matched reference.

Prints one line per cell (the stages that fail before and after, the storage and quantizer
rows) and writes ``ports_storage.json`` into ``--out``.

With ``--tiny`` (checks the script: tests/test_benchmarks.py): the MOSS fixture alone, one
prompt, llama.cpp at q8_0.

Usage::

    python benchmarks/ports_storage.py --work results/ports-storage --out benchmarks/results
    python benchmarks/ports_storage.py --tiny --work W --out DIR
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))

from sweep import snakemake  # noqa: E402

from audioparity.candidates import load_adapter  # noqa: E402
from audioparity.compare.cell import compare_cell  # noqa: E402
from audioparity.compare.gate_lists import resolve_gates  # noqa: E402
from audioparity.compare.plan import CellDumps, CellKey  # noqa: E402
from audioparity.contract.vocabulary import MIXES, STORAGE_ROWS  # noqa: E402
from audioparity.models.registry import family as family_of  # noqa: E402

AUDIOPARITY = str(Path(sys.executable).with_name("audioparity"))
PORTS = REPO / ".ports"
JFK = REPO.parent / "shared" / "data" / "jfk.wav"
ESPEAK = REPO / "resources" / "models" / "parakeet-tdt-espeak" / "model.nemo"


def sweep_config(tiny: bool, tiny_en: Path) -> dict:
    """The workflow's config: each family's section, its ports and their types."""
    moss_cases = yaml.safe_load((REPO / "config/config.yaml").read_text())["moss_voicegen"][
        "cases"]
    config: dict = {"families": ["moss_voicegen"], "moss_voicegen": {
        "models": [{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
        "cases": moss_cases[:1] if tiny else moss_cases,
        "weight_types": ["q8_0"] if tiny else ["q8_0", "q4_K_M"],
        "candidates": [{"name": "llama.cpp", "adapter": "llama_cpp",
                        "options": {"root": str(PORTS / "llama_cpp")}}]}}
    if tiny:
        return config
    config["families"].insert(0, "parakeet_tdt")
    config["parakeet_tdt"] = {
        "models": [{"name": "espeak", "path": str(ESPEAK)}],
        "cases": [{"name": "clip", "path": str(REPO / "resources/speech/clip.wav")},
                  {"name": "heldout", "path": str(REPO / "resources/speech/heldout.wav")},
                  {"name": "jfk", "path": str(JFK)}],
        "weight_types": ["q8_0", "q5_0", "q4_0", "q5_K_M", "q4_K_M"], "recipes": {},
        "references": [{"name": "nemo", "implementation": "nemo"}],
        "candidates": [
            {"name": "transcribe.cpp", "adapter": "transcribe_cpp",
             "options": {"root": str(PORTS / "transcribe_cpp")},
             "weight_types": ["q8_0", "q5_K_M", "q4_K_M"]},
            {"name": "whisper.cpp", "adapter": "whisper_cpp",
             "options": {"root": str(PORTS / "whisper_cpp")},
             "weight_types": ["q8_0", "q5_0", "q4_0"]}]}
    if tiny_en.is_dir():
        whisper = yaml.safe_load((REPO / "config/examples/quant.yaml").read_text())["whisper"]
        whisper.update(models=[{"name": "tiny-en", "path": str(tiny_en)}],
                       cases=[{**whisper["cases"][0], "path": str(JFK)}],
                       weight_types=["q8_0", "q5_0", "q4_0"], recipes={},
                       references=[{"name": "transformers", "implementation": "transformers"}],
                       candidates=[{"name": "whisper.cpp", "adapter": "whisper_cpp_whisper",
                                    "options": {"root": str(PORTS / "whisper_cpp")}}])
        config["families"].append("whisper")
        config["whisper"] = whisper
    return config


def run(argv: list[str], cwd: Path) -> None:
    """Run ``argv`` in ``cwd``; it must exit 0."""
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd)
    if done.returncode:
        raise SystemExit(f"{' '.join(argv[:3])} exited {done.returncode}: "
                         f"{done.stderr.strip().splitlines()[-1:]}")


def before(workdir: Path, config: dict, cells: pd.DataFrame, scratch: Path) -> dict:
    """Each third-party quantized cell's failing stages against our storage policy's
    quantization-aware reference of its (base) weight type, its replay redone likewise, and a
    port that reads the reference (its input, its path) run again on that one."""
    from snakemake.utils import update_config

    merged = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(merged, config)  # as Snakemake reads --configfile over the default
    found = {}
    for (name, model), group in cells.groupby(["family", "model"]):
        section, spec = merged[name], family_of(name).spec
        model_path = next(m["path"] for m in section["models"] if m["name"] == model)
        cases = {c["name"]: c["path"] for c in section["cases"]}
        bases = sorted({MIXES.get(t, t) for t in group.weight_type})
        reference = scratch / "reference" / name / model
        if not reference.is_dir():
            run([AUDIOPARITY, "reference", spec.command, "--model", model_path,
                 *(a for case, path in cases.items()
                   for a in (spec.input_flag, path, "--output-dir", str(reference / case))),
                 *(a for t in bases for a in ("--emulate", t))], workdir)
        for cell in group.drop_duplicates(["candidate", "weight_type", "case"]).itertuples():
            where = f"{name}/{model}/{cell.candidate}/cpu/{cell.weight_type}/{cell.case}"
            dump = workdir / "results/ggml" / where
            base = MIXES.get(cell.weight_type, cell.weight_type)
            entry = next(c for c in section["candidates"] if c["name"] == cell.candidate)
            if load_adapter(entry["adapter"]).reads_reference:
                # fed the reference (its input embeddings, its path): fed that one instead
                dump = scratch / "ggml" / where
                if not dump.is_dir():
                    run([AUDIOPARITY, "candidate", "run", "--family", name, "--adapter",
                         entry["adapter"], "--options", json.dumps(entry.get("options", {})),
                         "--family-options", json.dumps(section.get("options", {})),
                         "--model", str(workdir / "results/candidates" / name / model
                                        / cell.candidate / cell.weight_type),
                         spec.input_flag, cases[cell.case], "--reference-dir",
                         str(reference / f"{cell.case}@{base}"), "--output-dir", str(dump),
                         "--weight-type", cell.weight_type], workdir)
            replay = None
            if (workdir / "results/replay" / where).is_dir():
                replay = scratch / "replay" / where
                if not replay.is_dir():
                    run([AUDIOPARITY, "replay", spec.command, "--model", model_path,
                         spec.input_flag, cases[cell.case], "--candidate-dir", str(dump),
                         "--output-dir", str(replay), "--emulate", base], workdir)
            gates = resolve_gates(section, CellKey(name, model, cell.candidate, "cpu",
                                                   cell.weight_type, cell.case))
            output = scratch / "compare" / f"{where}.json"
            output.parent.mkdir(parents=True, exist_ok=True)
            compare_cell(CellDumps(reference / f"{cell.case}@{base}", dump, replay=replay), gates,
                         {"family": name, "weight_type": cell.weight_type}, output)
            found[where] = json.loads(output.read_text())
    return found


def failing(rows: list[dict]) -> list[str]:
    """The stages (and their forms) that fail, the storage rows left out."""
    return [r["stage"] for r in rows if r["status"] == "fail" and r["stage"] not in STORAGE_ROWS]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", type=Path, required=True, help="the workflow's folder")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tiny", action="store_true", help="MOSS alone, one prompt, q8_0")
    parser.add_argument("--tiny-en", type=Path, default=REPO / "results/models/whisper-tiny-en")
    args = parser.parse_args(argv)
    config = sweep_config(args.tiny, args.tiny_en.resolve())
    args.work = args.work.resolve()
    args.work.mkdir(parents=True, exist_ok=True)
    if not (args.work / "resources").exists():  # the MOSS prompts the config names
        (args.work / "resources").symlink_to(REPO / "resources")
    snakemake(args.work, config, 2, None, "snakemake.log")
    summary = pd.read_csv(args.work / "results/report/summary.csv", dtype=str,
                          keep_default_na=False)
    cells = summary[(summary.against == "reference") & (summary.backend == "cpu")
                    & (summary.candidate != "audioparity")]
    was = before(args.work, config, cells, args.work / "before")
    result = {}
    for key, group in cells.groupby(["family", "model", "candidate", "weight_type", "case"]):
        where = f"{key[0]}/{key[1]}/{key[2]}/cpu/{key[3]}/{key[4]}"
        rows = group.to_dict("records")
        storage = {r["stage"]: f"{r['status']}: {r['reason']}" for r in rows
                   if r["stage"] in STORAGE_ROWS}
        result[where] = {"before": failing(was[where]), "after": failing(rows),
                         "bits_per_weight": rows[0]["bits_per_weight"], **storage}
        print(f"{where}: before {len(result[where]['before'])} failing "
              f"({', '.join(result[where]['before']) or '-'}); after "
              f"{len(result[where]['after'])} ({', '.join(result[where]['after']) or '-'}); "
              f"{result[where]['bits_per_weight']} bits per weight")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ports_storage.json").write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
