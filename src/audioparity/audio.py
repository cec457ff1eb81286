"""Reading speech for both sides of a comparison, so reference and ggml see the same samples."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import soundfile as sf

from audioparity.errors import AudioparityError


@dataclass(frozen=True)
class Audio:
    """Mono float32 samples in [-1, 1] at ``sample_rate`` Hz, plus what was done to get them.

    Attributes:
        samples: ``[L]`` float32, L samples.
        sample_rate: Hz.
        notes: human-readable remarks (downmix, resample) for the log and the manifest.
    """

    samples: np.ndarray
    sample_rate: int
    notes: tuple[str, ...] = field(default=())

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def load_audio(path: str | os.PathLike, sample_rate: int = 16000) -> Audio:
    """Read an audio file with soundfile, downmix to mono and resample to ``sample_rate`` (soxr).

    Integer PCM is scaled to [-1, 1) as soundfile does (``dtype="float32"``); multi-channel audio
    is averaged over channels; other rates are resampled with soxr's high-quality filter. Each of
    these is recorded in ``notes``.

    Raises:
        AudioparityError: the file is missing, not audio, or holds no samples.
    """
    try:
        data, rate = sf.read(os.fspath(path), dtype="float32", always_2d=True)
    except (sf.LibsndfileError, RuntimeError, OSError) as err:
        raise AudioparityError(f"{path}: cannot read audio ({err})") from err
    if data.shape[0] == 0:
        raise AudioparityError(f"{path}: audio holds no samples")
    notes = []
    if data.shape[1] > 1:
        notes.append(f"downmixed {data.shape[1]} channels to mono by averaging")
    samples = data.mean(axis=1, dtype=np.float32)
    if rate != sample_rate:
        import soxr

        samples = soxr.resample(samples, rate, sample_rate, quality="HQ").astype(np.float32)
        notes.append(f"resampled {rate} Hz to {sample_rate} Hz with soxr (HQ)")
    return Audio(np.ascontiguousarray(samples), sample_rate, tuple(notes))
