"""Long audio at full size: NeMo and the ggml port on clips past NeMo's position table.

Parakeet-TDT at the v3 shape (random weights, :mod:`checkpoints`), one clip per ``--minutes``
(default 7 and 10: 5250 and 7500 encoder frames, past the 5000 of NeMo's table), made of
jfk.wav and espeak-ng speech. For each: the reference dump and the ggml dump (f32, weights
converted once and mapped), each in its own process timed with ``/usr/bin/time`` (wall, peak
RSS); then the stages compared (NMSE, max_abs) and the decodes. Both sides compute attention
in chunks of query rows past a clip of about a minute and a half; the reference's manifest
note on its chunks is kept (``attention``). A side that refuses the clip (too long for the
memory) is reported with its one error line.

With ``--tiny`` (checks the script: tests/test_benchmarks.py): the tiny shape, and clips of
the project clip alone (no espeak-ng, no jfk.wav); give short ``--minutes``.

Usage::

    python benchmarks/long_audio.py --minutes 7,10 --threads 2
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
#: The family (:func:`audioparity.families.family`) and the stages compared: the first layer's,
#: and the last layer's isolated form (``{last}``: the model's last layer).
FAMILY = "parakeet_tdt"
STAGES = ("mel_features", "pre_encode", "pos_emb", "layer_0", "layer_0_isolated",
          "layer_{last}_isolated", "enc_out")
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


def compare(reference: Path, ggml: Path) -> dict:
    """NMSE and max_abs of the stages both dumps hold (a candidate stage against its reference
    stage, :meth:`FamilySpec.reference_stage`), and whether the decodes agree."""
    from audioparity.artifacts import Dump
    from audioparity.compare.metrics import max_abs, nmse
    from audioparity.families import family

    spec = family(FAMILY).spec
    ours, truth = Dump(ggml), Dump(reference)
    last = int(ours.manifest["n_layers"]) - 1
    rows = {}
    for stage in (name.format(last=last) for name in STAGES):
        base = spec.reference_stage(stage)
        if ours.has(stage) and truth.has(base):
            a, b = ours.tensor(stage), truth.tensor(base)
            rows[stage] = {"shape": list(b.shape), "nmse": nmse(a, b), "max_abs": max_abs(a, b)}
    decodes = [dump.json("decode")["ids"] for dump in (truth, ours) if dump.has("decode")]
    rows["decode_equal"] = len(decodes) == 2 and decodes[0] == decodes[1]
    return rows


def attention_note(reference: Path) -> str:
    """The reference manifest's note on how its attention was chunked, or ``one chunk``."""
    from audioparity.artifacts import Dump

    notes = Dump(reference).manifest.get("notes", [])
    return next((note for note in notes if note.startswith("attention:")), "one chunk")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", default="7,10")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--tiny", action="store_true",
                        help="check the script: the tiny shape, clips of the project clip alone")
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def one_clip(minutes: float, model: Path, weights: Path, work: Path, args) -> dict:
    """The reference and ggml dumps of one clip of ``minutes``, timed, and their stages
    compared when both succeeded."""
    name = f"{minutes:g}min"
    audio = work / f"{name}.wav"
    long_clip(minutes * 60, audio, mixed=not args.tiny)
    reference, ggml = work / f"{name}-reference", work / f"{name}-ggml"
    for folder in (reference, ggml):
        shutil.rmtree(folder, ignore_errors=True)
    log.info("%s: reference", name)
    ref = timed([AUDIOPARITY, "reference", "parakeet-tdt", "--model", str(model), "--audio",
                 str(audio), "--output-dir", str(reference), "--threads", str(args.threads)],
                work / f"{name}-reference.log")
    log.info("%s: reference %s", name, ref)
    entry = {"seconds": minutes * 60, "reference": ref}
    if ref["exit"] == 0:
        entry["attention"] = attention_note(reference)
        log.info("%s: ggml", name)
        entry["ggml"] = timed([AUDIOPARITY, "ggml", "parakeet-tdt", "--model", str(model),
                               "--audio", str(audio), "--reference-dir", str(reference),
                               "--output-dir", str(ggml), "--weight-type", "f32", "--threads",
                               str(args.threads), "--weights-file", str(weights)],
                              work / f"{name}-ggml.log")
        log.info("%s: ggml %s", name, entry["ggml"])
        if entry["ggml"]["exit"] == 0:
            entry["stages"] = compare(reference, ggml)
            entry["frames"] = entry["stages"].get("enc_out", {}).get("shape", [0])[0]
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
    results = {}
    for minutes in (float(m) for m in args.minutes.split(",")):
        results[f"{minutes:g}min"] = one_clip(minutes, model, weights, work, args)
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "long_audio.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
