"""Long audio at full size: NeMo and the ggml port on clips past NeMo's position table.

Parakeet-TDT at the v3 shape (random weights, :mod:`checkpoints`), one clip per ``--minutes``
(default 7 and 10: 5250 and 7500 encoder frames, past the 5000 of NeMo's table), made of
jfk.wav and espeak-ng speech. For each: the reference dump and the ggml dump (f32, weights
converted once and mapped), each in its own process timed with ``/usr/bin/time`` (wall, peak
RSS); then the stages compared (NMSE, max_abs) and the decodes. A side that refuses the clip
(too long for the memory) is reported with its one error line.

Usage::

    python benchmarks/long_audio.py --minutes 7,10 --threads 2
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import ensure_checkpoint  # noqa: E402
from sweep import JFK, RATE, VOICES, espeak  # noqa: E402

log = logging.getLogger("audioparity.bench")
STAGES = ("mel_features", "pre_encode", "pos_emb", "layer_0", "layer_0_isolated",
          "layer_23_isolated", "enc_out")


def long_clip(seconds: float, path: Path) -> None:
    """``seconds`` of speech: jfk.wav and each espeak-ng voice in turn, cut to length."""
    import soundfile

    jfk, _ = soundfile.read(JFK, dtype="float32")
    pieces = [jfk, *(espeak(voice, text) for voice, text in VOICES.items())]
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
    """NMSE and max_abs of the stages both dumps hold, and whether the decodes agree."""
    from audioparity.compare.metrics import max_abs, nmse

    rows = {}
    for stage in STAGES:
        ours = ggml / f"{stage}.npy"
        truth = reference / f"{stage.removesuffix('_isolated')}.npy"
        if ours.is_file() and truth.is_file():
            a, b = np.load(ours), np.load(truth)
            rows[stage] = {"shape": list(b.shape), "nmse": nmse(a, b), "max_abs": max_abs(a, b)}
    decodes = [json.loads((d / "decode.json").read_text())["ids"] for d in (reference, ggml)
               if (d / "decode.json").is_file()]
    rows["decode_equal"] = len(decodes) == 2 and decodes[0] == decodes[1]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", default="7,10")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--cache", type=Path, default=Path(os.environ.get(
        "AUDIOPARITY_BENCH_CACHE", Path.home() / ".cache" / "audioparity" / "bench")))
    parser.add_argument("--out", type=Path, default=HERE / "results")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    work = args.cache / "long_audio"
    work.mkdir(parents=True, exist_ok=True)
    model = ensure_checkpoint("parakeet", "v3", args.cache, work)
    weights = work / "f32.gguf"
    if not weights.exists():
        subprocess.run(["audioparity", "weights", "parakeet-tdt", "--model", str(model),
                        "--weight-type", "f32", "--output", str(weights)], check=True)
    results = {}
    for minutes in (float(m) for m in args.minutes.split(",")):
        name = f"{minutes:g}min"
        audio = work / f"{name}.wav"
        long_clip(minutes * 60, audio)
        reference, ggml = work / f"{name}-reference", work / f"{name}-ggml"
        for folder in (reference, ggml):
            subprocess.run(["rm", "-rf", str(folder)], check=True)
        log.info("%s: reference", name)
        ref = timed(["audioparity", "reference", "parakeet-tdt", "--model", str(model),
                     "--audio", str(audio), "--output-dir", str(reference), "--threads",
                     str(args.threads)], work / f"{name}-reference.log")
        log.info("%s: reference %s", name, ref)
        entry = {"seconds": minutes * 60, "reference": ref}
        if ref["exit"] == 0:
            log.info("%s: ggml", name)
            entry["ggml"] = timed(["audioparity", "ggml", "parakeet-tdt", "--model", str(model),
                                   "--audio", str(audio), "--reference-dir", str(reference),
                                   "--output-dir", str(ggml), "--weight-type", "f32",
                                   "--threads", str(args.threads), "--weights-file",
                                   str(weights)], work / f"{name}-ggml.log")
            log.info("%s: ggml %s", name, entry["ggml"])
            if entry["ggml"]["exit"] == 0:
                entry["stages"] = compare(reference, ggml)
                entry["frames"] = entry["stages"].get("enc_out", {}).get("shape", [0])[0]
        results[name] = entry
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "long_audio.json").write_text(json.dumps(results, indent=1) + "\n")
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
