"""How float32 noise grows with a clip's length, in the Parakeet stages computed before any
weight: ``mel_features`` and ``pos_emb``, from 1 s to 30 min.

For each length (``--seconds``, default 1 s to 30 min) the clip of
:func:`long_audio.long_clip` (jfk.wav and espeak-ng speech) goes through NeMo's
``AudioToMelSpectrogramPreprocessor`` at the v3 settings (128 mels, 25 ms windows, 10 ms hop,
per-feature normalisation, dither off) in float32, its recipe in float64 (:func:`float64_mel`),
and the port's numpy
frontend (:func:`audioparity.models.parakeet_tdt.frontend.mel_features`, float32) with NeMo's
filterbank and window; likewise NeMo's ``RelPositionalEncoding`` (d_model 1024) and the port's
:func:`~audioparity.models.parakeet_tdt.positions.rel_pos_encoding` against float64 sinusoids.
Printed and written (``length_noise.json``): NMSE, max_abs and max_rel of the port against NeMo
(what a sweep gates), and of each against float64 (whose error grows), per length, NeMo's
mel features rounded to f16 (the error a fault would add), and the
exponent ``p`` of the NMSE's growth fitted over lengths of a minute and more,
``NMSE(T) ~ T^p``. The stages after them carry this noise: ``benchmarks/long_audio.py`` runs
the model at full size.

With ``--tiny`` (tests/test_benchmarks.py): the project clip alone, short lengths.

Usage::

    python benchmarks/length_noise.py
    python benchmarks/length_noise.py --tiny --seconds 1,4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from long_audio import long_clip  # noqa: E402
from sweep import check_sources  # noqa: E402

log = logging.getLogger("audioparity.bench")
#: Clip lengths (s): 1 s to 30 min.
SECONDS = (1, 10, 60, 180, 420, 600, 1800)
#: parakeet-tdt-0.6b-v3's preprocessor (its model_config.yaml) and encoder width.
V3_PREPROCESSOR = {"sample_rate": 16000, "normalize": "per_feature", "window_size": 0.025,
                   "window_stride": 0.01, "window": "hann", "features": 128, "n_fft": 512,
                   "log": True, "frame_splicing": 1, "dither": 0.0, "pad_to": 0,
                   "pad_value": 0.0}
D_MODEL = 1024
#: The stages measured, and the comparisons of each.
STAGES = ("mel_features", "pos_emb")
PAIRS = ("port_vs_nemo", "nemo_vs_f64", "port_vs_f64")
#: Lengths from which the growth exponent is fitted: the short clips sit at the noise floor.
FIT_FROM_SECONDS = 60


def errors(got: np.ndarray, truth: np.ndarray) -> dict:
    """NMSE, max_abs and max_rel (max_abs over the reference's peak) of ``got`` against
    ``truth`` (float64)."""
    got, truth = got.astype(np.float64), truth.astype(np.float64)
    worst = float(np.max(np.abs(got - truth)))
    return {"nmse": float(np.sum((got - truth) ** 2) / np.sum(truth ** 2)), "max_abs": worst,
            "max_rel": worst / float(np.max(np.abs(truth)))}


def mel_errors(samples: np.ndarray) -> dict:
    """The three mel computations of ``samples`` ([L] float32, 16 kHz), compared."""
    import torch
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    from audioparity.models.parakeet_tdt.config import PreprocessorConfig
    from audioparity.models.parakeet_tdt.frontend import mel_features

    nemo = AudioToMelSpectrogramPreprocessor(**V3_PREPROCESSOR).eval()
    featurizer = nemo.featurizer
    with torch.no_grad():
        f32, n = nemo(input_signal=torch.from_numpy(samples)[None],
                      length=torch.tensor([samples.size]))
    n = int(n[0])
    f32 = f32[0, :, :n].T.numpy()  # [T, n_mels]
    f64 = float64_mel(samples, featurizer)[:n]
    config = PreprocessorConfig(**{k: v for k, v in V3_PREPROCESSOR.items()})
    ours = mel_features(samples, config, filterbank=featurizer.fb.float().numpy(),
                        window=featurizer.window.float().numpy())
    return {"frames": n, "port_vs_nemo": errors(ours, f32), "nemo_vs_f64": errors(f32, f64),
            "port_vs_f64": errors(ours, f64),
            "f16_rounding": errors(f32.astype(np.float16), f32)}


def float64_mel(samples: np.ndarray, featurizer) -> np.ndarray:
    """NeMo's ``FilterbankFeatures.forward`` (eval, one utterance) in float64: pre-emphasis,
    the centred STFT with its window, the power spectrum, its filterbank, ``log(x + 2^-24)``,
    per-feature normalisation (unbiased std, ``+ 1e-5``). ``[T + 1, n_mels]``, every frame
    (NeMo keeps ``T = L // hop``); NeMo's own code keeps its window and STFT in float32."""
    import torch

    x = torch.from_numpy(samples.astype(np.float64))
    x = torch.cat((x[:1], x[1:] - featurizer.preemph * x[:-1]))
    spec = torch.stft(x, featurizer.n_fft, hop_length=featurizer.hop_length,
                      win_length=featurizer.win_length, window=featurizer.window.double(),
                      center=True, pad_mode="constant", return_complex=True)
    mel = torch.log(featurizer.fb[0].double() @ spec.abs().pow(2) + 2.0 ** -24)
    valid = mel[:, :samples.size // featurizer.hop_length]
    mean, std = valid.mean(dim=1, keepdim=True), valid.std(dim=1, keepdim=True)
    return ((mel - mean) / (std + 1e-5)).T.numpy()


def pos_emb_errors(n_frames: int) -> dict:
    """NeMo's and the port's relative position table of ``n_frames`` encoder frames,
    compared."""
    import torch
    from nemo.collections.asr.parts.submodules.multi_head_attention import RelPositionalEncoding

    from audioparity.models.parakeet_tdt.positions import rel_pos_encoding

    table = RelPositionalEncoding(d_model=D_MODEL, dropout_rate=0.0, max_len=n_frames)
    table.extend_pe(n_frames, device=torch.device("cpu"), dtype=torch.float32)
    with torch.no_grad():
        _, nemo = table(torch.zeros(1, n_frames, D_MODEL))
    nemo = nemo[0].numpy()
    positions = np.arange(n_frames - 1, -n_frames, -1, dtype=np.float64)[:, None]
    angles = positions * np.exp(np.arange(0, D_MODEL, 2) * -(np.log(10000.0) / D_MODEL))
    truth = np.empty((2 * n_frames - 1, D_MODEL))
    truth[:, 0::2], truth[:, 1::2] = np.sin(angles), np.cos(angles)
    ours = rel_pos_encoding(n_frames, D_MODEL)
    return {"rows": int(nemo.shape[0]), "port_vs_nemo": errors(ours, nemo),
            "nemo_vs_f64": errors(nemo, truth), "port_vs_f64": errors(ours, truth)}


def growth(rows: list[dict], stage: str, key: str) -> float | None:
    """The exponent ``p`` of ``NMSE ~ T^p`` over the lengths from :data:`FIT_FROM_SECONDS`
    (least squares in log-log); None with fewer than two such lengths."""
    points = [(r["frames"], r[stage][key]["nmse"]) for r in rows
              if r["seconds"] >= FIT_FROM_SECONDS and r[stage][key]["nmse"] > 0]
    if len(points) < 2:
        return None
    x, y = np.log([p[0] for p in points]), np.log([p[1] for p in points])
    return float(np.polyfit(x, y, 1)[0])


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", default=",".join(map(str, SECONDS)))
    parser.add_argument("--tiny", action="store_true",
                        help="check the script: clips of the project clip alone")
    parser.add_argument("--out", type=Path, default=HERE / "results")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    import soundfile

    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    check_sources(mixed=not args.tiny)
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for seconds in (float(s) for s in args.seconds.split(",")):
            audio = Path(work) / "clip.wav"
            long_clip(seconds, audio, mixed=not args.tiny)
            samples, _ = soundfile.read(audio, dtype="float32")
            row = {"seconds": seconds, **mel_errors(samples)}
            row["pos_emb"] = pos_emb_errors((row["frames"] + 7) // 8)  # v3: 8x subsampling
            row["mel_features"] = {k: row.pop(k) for k in (*PAIRS, "f16_rounding")}
            rows.append(row)
            log.info("%g s: %d mel frames: mel port/nemo NMSE %.2g, pos_emb %.2g", seconds,
                     row["frames"], row["mel_features"]["port_vs_nemo"]["nmse"],
                     row["pos_emb"]["port_vs_nemo"]["nmse"])
    fits = {stage: {key: growth(rows, stage, key) for key in PAIRS} for stage in STAGES}
    print(f"{'length':>8} {'frames':>7} | mel_features NMSE: port/nemo nemo/f64 port/f64 | "
          "pos_emb NMSE: port/nemo nemo/f64 port/f64")
    for row in rows:
        print(f"{row['seconds']:>7g}s {row['frames']:>7d} | " + " | ".join(
            " ".join(f"{row[stage][k]['nmse']:9.2e}" for k in PAIRS) for stage in STAGES))
    print("growth exponent p (NMSE ~ T^p, from 1 min):", json.dumps(fits))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "length_noise.json").write_text(
        json.dumps({"lengths": rows, "growth": fits}, indent=1) + "\n")


if __name__ == "__main__":
    main()
