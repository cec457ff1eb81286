"""Long audio at full size: NeMo and the ggml port on clips past NeMo's position table.

Parakeet-TDT at the v3 shape (random weights, :mod:`checkpoints`), one clip per ``--minutes``
(default 7 and 10: 5250 and 7500 encoder frames, past the 5000 of NeMo's table), made of
jfk.wav and espeak-ng speech. For each: the reference dump and the ggml dump (f32, weights
converted once and mapped), each in its own process timed with ``/usr/bin/time`` (wall, peak
RSS); then every stage judged as the workflow judges a cell, under the default config's f32
gates scaled by its ``length_scaling`` rule (NMSE, max_abs, max_rel, status), and the decodes;
with ``--plant-f16 K`` a third dump, layer K's output rounded to f16, judged the same way: a
single f16 rounding must fail at any length. Both sides compute attention
in chunks of query rows past a clip of about a minute and a half; the reference's manifest
note on its chunks is kept (``attention``). A side that refuses the clip (too long for the
memory) is reported with its one error line. ``--reference-only`` times the reference alone;
``--reuse-reference`` keeps a reference dump and its figures from an earlier run of the same
length (a 30-minute reference takes about half an hour on two cores).

With ``--tiny`` (checks the script: tests/test_benchmarks.py): the tiny shape, and clips of
the project clip alone (no espeak-ng, no jfk.wav); give short ``--minutes``.

Usage::

    python benchmarks/long_audio.py --minutes 7,10 --threads 2 --plant-f16 11
    python benchmarks/long_audio.py --tiny --minutes 0.05 --out DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import ensure_checkpoint  # noqa: E402
from sweep import CLIP, JFK, RATE, VOICES, check_sources, espeak  # noqa: E402

log = logging.getLogger("audioparity.bench")
#: The family (:func:`audioparity.models.registry.family`) and the stages compared: the first
#: layer's, and the last layer's isolated form (``{last}``: the model's last layer).
FAMILY = "parakeet_tdt"
STAGES = ("mel_features", "pre_encode", "pos_emb", "layer_0", "layer_0_isolated",
          "layer_{last}", "layer_{last}_isolated", "enc_out", "decode_logits")
ROOT = HERE.parent
#: The program the dumps run: the venv's ``audioparity``, beside this interpreter.
AUDIOPARITY = str(Path(sys.executable).with_name("audioparity"))


def long_clip(seconds: float, path: Path, mixed: bool = True) -> None:
    """``seconds`` of speech: jfk.wav and each espeak-ng voice in turn, cut to length; without
    ``mixed``, the project clip repeated."""
    import soundfile

    if mixed:
        jfk, _ = soundfile.read(JFK, dtype="float32")
        pieces = [jfk, *(espeak(voice, text) for voice, text in VOICES.items())]
    else:
        pieces = [soundfile.read(CLIP, dtype="float32")[0]]
    n = int(seconds * RATE)
    tiled = np.concatenate(pieces * (n // sum(len(p) for p in pieces) + 1))
    soundfile.write(path, tiled[:n], RATE)


def timed(argv: list[str], log_file: Path) -> dict:
    """Run ``argv`` under ``/usr/bin/time``: exit code, wall s, peak RSS MB, last stderr line."""
    with open(log_file, "w") as err:
        code = subprocess.run(["/usr/bin/time", "-f", "TIME %e %M", *argv], stderr=err,
                              stdout=subprocess.DEVNULL).returncode
    lines = log_file.read_text().splitlines()
    wall, rss = next(line.split()[1:] for line in reversed(lines) if line.startswith("TIME "))
    message = next((line for line in reversed(lines) if line.startswith("audioparity: error")),
                   "") if code else ""
    message = message.replace(f"{log_file.parent}/", "")  # no path of this machine in results
    return {"exit": code, "wall_s": float(wall), "peak_rss_mb": round(int(rss) / 1024),
            "message": message}


def compare(reference: Path, ggml: Path, output: Path) -> dict:
    """The ggml dump against the reference as the workflow judges a cell: every stage under
    the default config's f32 gates of the family (config/config.yaml, its ``length_scaling``
    rule applied to the clip's length), the rows written to ``output``. Returns, for
    :data:`STAGES`, each stage's shape, NMSE, max_abs, max_rel, status and gate; every stage
    that does not pass, with its reason (``failing``); and whether the decodes agree."""
    import yaml

    from audioparity.compare.cell import compare_cell
    from audioparity.compare.gate_lists import resolve_gates
    from audioparity.compare.plan import CellDumps, CellKey
    from audioparity.dumping.artifacts import Dump

    section = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())[FAMILY]
    gates = resolve_gates(section, CellKey(FAMILY, "v3", "audioparity", "cpu", "f32", ""))
    labels = {"family": FAMILY, "model": "v3", "case": output.stem, "candidate": "audioparity",
              "backend": "cpu", "weight_type": "f32"}
    compare_cell(CellDumps(reference, ggml), gates, labels, output)
    rows = {row["stage"]: row for row in json.loads(output.read_text())}
    truth = Dump(reference)
    last = int(Dump(ggml).manifest["n_layers"]) - 1
    result = {}
    for stage in (name.format(last=last) for name in STAGES):
        if stage in rows:
            base = truth.manifest["tensors"].get(stage.removesuffix("_isolated"), {})
            result[stage] = {"shape": base.get("shape"), **{
                key: rows[stage][key] for key in ("nmse", "max_abs", "max_rel", "status",
                                                  "gate")}}
    result["failing"] = {stage: row["reason"] for stage, row in rows.items()
                         if row["status"] != "pass"}
    result["decode_equal"] = rows.get("decode", {}).get("status") == "pass"
    return result


#: ``python -c PLANT <layer> <audioparity arguments>``: the ggml port with one conformer
#: layer's output rounded to f16 and back, in every graph that computes that layer (end to
#: end and isolated): one f16 rounding inside an f32 path.
PLANT = """
import sys
import ggml
from audioparity.cli import main
from audioparity.models.parakeet_tdt import encoder
layer, original = int(sys.argv.pop(1)), encoder.conformer_layer
def planted(ctx, w, index, *args, **kwargs):
    out = original(ctx, w, index, *args, **kwargs)
    if index != layer:
        return out
    return ggml.ggml_cast(ctx, ggml.ggml_cast(ctx, out, ggml.GGML_TYPE_F16), ggml.GGML_TYPE_F32)
encoder.conformer_layer = planted
sys.exit(main(sys.argv[1:]))
"""


def attention_note(reference: Path) -> str:
    """The reference manifest's note on how its attention was chunked, or ``one chunk``."""
    from audioparity.dumping.artifacts import Dump

    notes = Dump(reference).manifest.get("notes", [])
    return next((note for note in notes if note.startswith("attention:")), "one chunk")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", default="7,10")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--plant-f16", type=int, metavar="K",
                        help="also dump the port with layer K's output rounded to f16")
    parser.add_argument("--reference-only", action="store_true",
                        help="the reference's dump alone: its wall time and memory at each length")
    parser.add_argument("--reuse-reference", action="store_true",
                        help="keep the reference dump and figures of an earlier run of a length")
    parser.add_argument("--tiny", action="store_true",
                        help="check the script: the tiny shape, clips of the project clip alone")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def one_clip(minutes: float, model: Path, weights: Path, work: Path, args,
             earlier: dict | None = None) -> dict:
    """The reference and ggml dumps of one clip of ``minutes``, timed, and their stages
    compared (:func:`compare`) when both succeeded; with ``--plant-f16 K``, a third dump with
    layer K rounded to f16 (:data:`PLANT`), compared the same way (``planted``). With
    ``--reuse-reference``, the reference dump and figures of ``earlier`` (this length's entry
    from an earlier run) are kept when both exist; otherwise the reference runs."""
    name = f"{minutes:g}min"
    audio = work / f"{name}.wav"
    reference = work / f"{name}-reference"
    reuse = (args.reuse_reference and earlier and earlier["reference"]["exit"] == 0
             and audio.exists() and (reference / "manifest.json").exists())
    if reuse:
        ref = earlier["reference"]
        log.info("%s: reference kept from an earlier run %s", name, ref)
    else:
        long_clip(minutes * 60, audio, mixed=not args.tiny)
        shutil.rmtree(reference, ignore_errors=True)
        log.info("%s: reference", name)
        ref = timed([AUDIOPARITY, "reference", "parakeet-tdt", "--model", str(model), "--audio",
                     str(audio), "--output-dir", str(reference), "--threads",
                     str(args.threads)], work / f"{name}-reference.log")
        log.info("%s: reference %s", name, ref)
    entry = {"seconds": minutes * 60, "reference": ref}
    if ref["exit"] != 0:
        return entry
    entry["attention"] = attention_note(reference)
    programs = {} if args.reference_only else {"ggml": [AUDIOPARITY]}
    if args.plant_f16 is not None and not args.reference_only:
        programs["planted"] = [sys.executable, "-c", PLANT, str(args.plant_f16)]
    for side, program in programs.items():
        dump = work / f"{name}-{side}"
        shutil.rmtree(dump, ignore_errors=True)
        log.info("%s: %s", name, side)
        run = timed([*program, "ggml", "parakeet-tdt", "--model", str(model), "--audio",
                     str(audio), "--reference-dir", str(reference), "--output-dir", str(dump),
                     "--weight-type", "f32", "--threads", str(args.threads), "--weights-file",
                     str(weights)], work / f"{name}-{side}.log")
        log.info("%s: %s %s", name, side, run)
        entry[side] = run
        if run["exit"] == 0:
            entry[f"{side}_stages" if side == "planted" else "stages"] = compare(
                reference, dump, work / f"{name}-{side}.json")
    if "stages" in entry:
        entry["frames"] = entry["stages"]["enc_out"]["shape"][0]
        log.info("%s: failing %s", name, sorted(entry["stages"]["failing"]))
    if "planted_stages" in entry:
        log.info("%s: planted layer %d, failing %s", name, args.plant_f16,
                 sorted(entry["planted_stages"]["failing"]))
    return entry


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    check_sources(mixed=not args.tiny)
    shape = "tiny" if args.tiny else "v3"
    work = args.cache / ("long_audio_tiny" if args.tiny else "long_audio")
    work.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint("parakeet", shape, args.cache, work)
    weights = work / "f32.gguf"
    if not weights.exists():
        subprocess.run([AUDIOPARITY, "weights", "parakeet-tdt", "--model", str(model),
                        "--weight-type", "f32", "--output", str(weights)], check=True)
    # the lengths run before keep their entries: a long run can be made one length at a time
    out = args.out / "long_audio.json"
    results = json.loads(out.read_text()) if out.exists() else {}
    for minutes in (float(m) for m in args.minutes.split(",")):
        name = f"{minutes:g}min"
        results[name] = one_clip(minutes, model, weights, work, args, results.get(name))
        args.out.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
