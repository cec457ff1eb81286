"""Reading speech for both sides of a comparison, so reference and ggml see the same samples."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from audioparity.contract.errors import AudioparityError

log = logging.getLogger("audioparity")

#: Sample rates accepted, in Hz: from telephone-band audio far below 8 kHz to 768 kHz studio
#: audio. A header outside is corrupt, and resampling it could ask for gigabytes.
MIN_RATE, MAX_RATE = 1000, 768_000
#: Largest sample magnitude accepted: a quarter of float32's range, so the downmix, soxr's
#: filter overshoot and the float32 rounding cannot overflow. Real float PCM sits near [-1, 1].
MAX_MAGNITUDE = float(np.finfo(np.float32).max) / 4


@dataclass(frozen=True)
class Audio:
    """Mono float32 samples at ``sample_rate`` Hz, plus what the file held and what was done.

    Attributes:
        samples: ``[L]`` float32, L samples (integer PCM in [-1, 1); float PCM as stored).
        sample_rate: Hz.
        notes: human-readable remarks (format, downmix, resample) for the log and the manifest.
        source: the file as read: ``format``, ``subtype`` (e.g. ``PCM_24``, ``FLOAT``),
            ``channels``, ``sample_rate`` (Hz) and ``frames``; a manifest field of every dump.
    """

    samples: np.ndarray
    sample_rate: int
    notes: tuple[str, ...] = field(default=())
    source: dict[str, Any] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        return len(self.samples) / self.sample_rate


def _read(path: Path) -> tuple[np.ndarray, dict[str, Any], str]:
    """``[frames, channels]`` float64 samples, the ``source`` record (see :class:`Audio`) and a
    description of the subtype (e.g. ``"Signed 24 bit PCM"``).

    Raises:
        AudioparityError: not a file, or libsndfile cannot decode it.
    """
    if not path.is_file():
        raise AudioparityError(f"{path}: no such file; expected an audio file")
    try:
        with open(path, "rb"):  # the OS's reason (permission) before libsndfile's "System error"
            pass
        with sf.SoundFile(os.fspath(path)) as handle:
            data = _frames(handle)
            source = {"format": handle.format, "subtype": handle.subtype,
                      "channels": handle.channels, "sample_rate": handle.samplerate,
                      "frames": data.shape[0]}
            return data, source, handle.subtype_info
    except sf.LibsndfileError as err:
        raise AudioparityError(
            f"{path}: cannot read audio (libsndfile: {err.error_string})"
        ) from err
    except (sf.SoundFileError, RuntimeError, OSError, ValueError) as err:
        raise AudioparityError(f"{path}: cannot read audio ({err})") from err
    except MemoryError:
        raise AudioparityError(f"{path}: its samples do not fit in memory as float64; expected "
                               "audio this machine can hold") from None


#: Frames read at a time: memory follows the samples a file holds, not the count its header
#: declares (a damaged FLAC header may declare billions).
READ_BLOCK = 1 << 20


def _frames(handle: sf.SoundFile) -> np.ndarray:
    """Every frame ``handle`` decodes, ``[frames, channels]`` float64, read block by block."""
    blocks = []
    while True:
        block = handle.read(READ_BLOCK, dtype="float64", always_2d=True)
        blocks.append(block)
        if len(block) < READ_BLOCK:
            break
    return np.concatenate(blocks) if len(blocks) > 1 else blocks[0]


def _check_samples(path: Path, data: np.ndarray, rate: int, kind: str) -> None:
    """Raise unless ``data`` (``[frames, channels]``, float64) read at ``rate`` Hz is audio the
    model can take: a plausible rate, some frames, every sample finite and within float32."""
    if not MIN_RATE <= rate <= MAX_RATE:
        raise AudioparityError(f"{path}: sample rate {rate} Hz; expected {MIN_RATE} to "
                               f"{MAX_RATE} Hz (a corrupt header?)")
    if data.shape[0] == 0:
        raise AudioparityError(f"{path}: holds no audio samples ({kind})")
    bad = ~np.isfinite(data)
    if bad.any():
        first = int(np.flatnonzero(bad.any(axis=1))[0])
        raise AudioparityError(
            f"{path}: {int(bad.sum())} NaN or infinite samples (first at frame {first}); "
            "expected finite PCM"
        )
    peak = float(np.abs(data).max())
    if peak > MAX_MAGNITUDE:
        raise AudioparityError(
            f"{path}: a sample of magnitude {peak:.3g}; expected at most {MAX_MAGNITUDE:.3g} "
            "(float32 range; a corrupt float file?)"
        )


def load_audio(path: str | os.PathLike, sample_rate: int = 16000, min_samples: int = 1,
               purpose: str = "the model") -> Audio:
    """Read an audio file with soundfile, downmix to mono and resample to ``sample_rate`` (soxr).

    Every subtype libsndfile decodes is accepted: 8-bit (unsigned), 16-, 24- and 32-bit
    integer PCM are scaled to [-1, 1) as soundfile scales them (``x / 2**(bits-1)``; unsigned
    8-bit ``(x - 128) / 128``); float and double PCM are taken as stored. The arithmetic runs in
    float64 and the result is rounded to float32 once: the channel mean (a downmix), then soxr's
    high-quality (``HQ``) resampler for any other rate. The subtype, a downmix and a resample are
    logged and recorded in ``notes``.

    Args:
        path: audio file.
        sample_rate: the model's rate in Hz.
        min_samples: fewest samples (after resampling) the caller can use.
        purpose: what needs ``min_samples``, for the message (e.g. ``"one encoder frame"``).

    Raises:
        AudioparityError: the file is missing or not audio, has a sample rate outside
            :data:`MIN_RATE`..:data:`MAX_RATE`, holds no samples, fewer than ``min_samples``,
            or NaN/infinite samples (float PCM).
    """
    path = Path(path)
    data, source, kind = _read(path)
    rate = source["sample_rate"]
    _check_samples(path, data, rate, kind)
    notes = [f"read {source['format']} {source['subtype']} ({kind}), {data.shape[1]} "
             f"channel(s) at {rate} Hz, {data.shape[0]} frames"]
    samples = data[:, 0]
    if data.shape[1] > 1:
        notes.append(f"downmixed {data.shape[1]} channels to mono by averaging")
        samples = data.mean(axis=1)
    if rate != sample_rate:
        import soxr

        samples = soxr.resample(samples, rate, sample_rate, quality="HQ")
        notes.append(f"resampled {rate} Hz to {sample_rate} Hz with soxr (HQ)")
    samples = np.ascontiguousarray(samples, dtype=np.float32)
    if samples.size < min_samples:
        raise AudioparityError(
            f"{path}: {samples.size} samples at {sample_rate} Hz "
            f"({1000 * samples.size / sample_rate:.1f} ms); {purpose} needs at least "
            f"{min_samples} samples ({1000 * min_samples / sample_rate:.1f} ms)"
        )
    for note in notes:
        log.info("audio %s: %s", path, note)
    return Audio(samples, sample_rate, tuple(notes), source)
