"""The Whisper log-mel frontend in numpy float32, as a C++ runtime computes it (no torch).

Mirrors what ``WhisperFeatureExtractor.__call__`` runs when torch is installed (as it is in every
reference job): ``pad`` to ``n_samples``, then ``_torch_extract_fbank_features``
(transformers ``models/whisper/feature_extraction_whisper.py``), one utterance, step by step:

1. :func:`pad_or_trim`: the samples cut or padded (``padding_value``) to ``n_samples``
   (``chunk_length`` seconds; 480 000 at 16 kHz).
2. :func:`stft_power`: ``torch.stft(x, n_fft, hop_length, window=torch.hann_window(n_fft))``
   with torch's defaults ``center=True, pad_mode="reflect"``, then ``stft[..., :-1].abs() ** 2``:
   the last frame dropped, the magnitude taken and squared.
3. :func:`mel_filter_bank`: the extractor's filters (transformers ``mel_filter_bank``, slaney
   scale and norm, 0 to 8000 Hz), built here because ``preprocessor_config.json`` does not
   store them; float64, rounded to float32 as the torch path rounds them.
4. :func:`log_mel`: ``log10(clamp(filters @ power, min=1e-10))``.
5. :func:`dynamic_range`: ``maximum(x, max(x) - 8)`` over the whole utterance, then
   ``(x + 4) / 4``.

Precision: every step runs in float32, as the torch path does on CPU. The FFT is numpy's
pocketfft (``np.fft.rfft``), which since numpy 2.0 computes a float32 input in single precision
(complex64), the precision of ``torch.stft`` on float32 input; the magnitude is ``np.abs``
(a float32 ``hypot``, as torch's ``abs`` of complex64) squared.

Frame count: the centred STFT of ``n_samples`` gives ``n_samples // hop + 1`` frames, the last
one dropped: ``T = n_samples // hop_length`` (3000 for 30 s), whatever the audio's length.
"""

from __future__ import annotations

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.models.whisper.config import FeatureExtractorConfig

#: The floor of the mel energies before the log (``torch.clamp(mel, min=1e-10)``).
LOG_FLOOR = np.float32(1e-10)
#: Dynamic range kept below the utterance's peak, in log10 units (80 dB).
DYNAMIC_RANGE = np.float32(8.0)
#: Upper edge of the mel filters: ``WhisperFeatureExtractor`` fixes ``max_frequency=8000.0``.
MAX_FREQUENCY = 8000.0


def pad_or_trim(samples: np.ndarray, n_samples: int, padding_value: float = 0.0) -> np.ndarray:
    """The first ``n_samples`` samples, padded at the end with ``padding_value`` when shorter
    (``SequenceFeatureExtractor.pad``, ``padding="max_length"``, ``truncation=True``, right
    side).

    Args:
        samples: ``[L]`` float32.

    Returns:
        ``[n_samples]`` float32.
    """
    x = np.asarray(samples, dtype=np.float32).reshape(-1)[:n_samples]
    return np.pad(x, (0, n_samples - x.size), constant_values=np.float32(padding_value))


def hann_window(n_fft: int) -> np.ndarray:
    """Periodic Hann window, ``torch.hann_window(n_fft)`` (``periodic=True``), as torch computes
    it in float32 (``hamming_window``: ``arange(n) * (2 pi / n)``, ``cos``, ``* -0.5``,
    ``+ 0.5``): the angle rounded to float32, its cosine correctly rounded (evaluated in float64),
    the rest in float32. Agrees with torch to one float32 ulp (where torch's float32 ``cos`` is
    not correctly rounded); computed exactly instead, the window differs from torch's by up to
    4 ulps, 1e-4 relative near its ends, where ``0.5 - 0.5 cos`` cancels.

    Returns:
        ``[n_fft]`` float32.
    """
    angles = np.arange(n_fft, dtype=np.float32) * np.float32(2.0 * np.pi / n_fft)
    cosines = np.cos(angles.astype(np.float64)).astype(np.float32)
    return cosines * np.float32(-0.5) + np.float32(0.5)


def stft_power(x: np.ndarray, n_fft: int, hop_length: int, window: np.ndarray) -> np.ndarray:
    """Power spectrogram, ``torch.stft(x, n_fft, hop_length, window=window, center=True,
    pad_mode="reflect")[..., :-1].abs() ** 2``.

    The signal is reflect-padded by ``n_fft // 2`` on both sides (mirrored about its first and
    last sample, those samples not repeated); frame ``m`` covers padded samples
    ``[m * hop, m * hop + n_fft)``; the last frame is dropped.

    Args:
        x: ``[L]`` float32 samples, ``L > n_fft // 2``.
        window: ``[n_fft]`` float32.

    Returns:
        ``[L // hop_length, n_fft // 2 + 1]`` float32 (frames x frequency bins).

    Raises:
        AudioparityError: the window is not ``n_fft`` long, or the signal too short to reflect.
    """
    window = np.asarray(window, dtype=np.float32).reshape(-1)
    if window.size != n_fft:
        raise AudioparityError(f"STFT window of {window.size} samples; expected n_fft={n_fft}")
    x = np.asarray(x, dtype=np.float32).reshape(-1)
    if x.size <= n_fft // 2:
        raise AudioparityError(f"STFT of {x.size} samples: reflect padding needs more than "
                               f"n_fft // 2 = {n_fft // 2}")
    padded = np.pad(x, n_fft // 2, mode="reflect")
    n_frames = x.size // hop_length  # 1 + L // hop frames, the last one dropped
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:n_frames]
    spectrum = np.fft.rfft(frames * window, n=n_fft, axis=-1)  # complex64 from float32
    magnitude = np.abs(spectrum)
    return magnitude * magnitude


def _hertz_to_mel(freq: np.ndarray) -> np.ndarray:
    """Slaney mel scale (transformers ``hertz_to_mel(..., mel_scale="slaney")``): linear
    (3 / 200 mel per Hz) below 1 kHz, logarithmic above."""
    freq = np.asarray(freq, dtype=np.float64)
    mels = 3.0 * freq / 200.0
    log_region = freq >= 1000.0
    mels[log_region] = 15.0 + np.log(freq[log_region] / 1000.0) * (27.0 / np.log(6.4))
    return mels


def _mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_hertz_to_mel` (transformers ``mel_to_hertz``, slaney)."""
    mels = np.asarray(mels, dtype=np.float64)
    freq = 200.0 * mels / 3.0
    log_region = mels >= 15.0
    freq[log_region] = 1000.0 * np.exp(np.log(6.4) / 27.0 * (mels[log_region] - 15.0))
    return freq


def mel_filter_bank(num_frequency_bins: int, num_mel_filters: int, sampling_rate: int,
                    min_frequency: float = 0.0,
                    max_frequency: float = MAX_FREQUENCY) -> np.ndarray:
    """The extractor's mel filters, transformers ``mel_filter_bank(..., norm="slaney",
    mel_scale="slaney")`` in float64: triangles between ``num_mel_filters + 2`` points evenly
    spaced on the slaney mel scale, over FFT bins at ``linspace(0, sampling_rate // 2, bins)``
    Hz, each scaled by ``2 / (upper - lower edge in Hz)`` (area normalisation).

    Returns:
        ``[num_mel_filters, num_frequency_bins]`` float64 (transformers returns the transpose).
    """
    mel_freqs = np.linspace(_hertz_to_mel(np.array([min_frequency]))[0],
                            _hertz_to_mel(np.array([max_frequency]))[0], num_mel_filters + 2)
    filter_freqs = _mel_to_hertz(mel_freqs)
    fft_freqs = np.linspace(0, sampling_rate // 2, num_frequency_bins)
    filter_diff = np.diff(filter_freqs)
    slopes = filter_freqs[None, :] - fft_freqs[:, None]
    down = -slopes[:, :-2] / filter_diff[:-1]
    up = slopes[:, 2:] / filter_diff[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    filters *= 2.0 / (filter_freqs[2:num_mel_filters + 2] - filter_freqs[:num_mel_filters])
    return np.ascontiguousarray(filters.T)


def log_mel(power: np.ndarray, filters: np.ndarray) -> np.ndarray:
    """Mel energies and their log, ``torch.clamp(mel_filters.T @ power, min=1e-10).log10()``,
    time-major.

    Args:
        power: ``[T, n_fft // 2 + 1]`` float32.
        filters: ``[n_mels, n_fft // 2 + 1]`` float32.

    Returns:
        ``[T, n_mels]`` float32.

    Raises:
        AudioparityError: filters whose width is not the number of frequency bins.
    """
    if filters.shape[-1] != power.shape[-1]:
        raise AudioparityError(f"mel filters have {filters.shape[-1]} frequency bins, the STFT "
                               f"{power.shape[-1]}")
    mel = power @ np.asarray(filters, dtype=np.float32).T
    return np.log10(np.maximum(mel, LOG_FLOOR))


def dynamic_range(log_spec: np.ndarray) -> np.ndarray:
    """``torch.maximum(x, x.max() - 8.0)`` over the whole utterance, then ``(x + 4.0) / 4.0``:
    at most 80 dB below the peak, scaled to about [-1, 1].

    Args:
        log_spec: ``[T, n_mels]`` float32.

    Returns:
        ``[T, n_mels]`` float32.
    """
    clamped = np.maximum(log_spec, log_spec.max() - DYNAMIC_RANGE)
    return (clamped + np.float32(4.0)) / np.float32(4.0)


def trim_note(n_samples: int, config: FeatureExtractorConfig) -> str | None:
    """The manifest note for audio of ``n_samples`` samples longer than the extractor's window
    (both sides trim it, :func:`pad_or_trim`), or None."""
    if n_samples <= config.n_samples:
        return None
    return (f"audio of {n_samples} samples ({n_samples / config.sampling_rate:.2f} s) trimmed "
            f"to n_samples={config.n_samples} ({config.chunk_length} s)")


def mel_features(samples: np.ndarray, config: FeatureExtractorConfig) -> np.ndarray:
    """Log-mel features of one utterance, ``WhisperFeatureExtractor(samples)`` transposed to
    time-major (the extractor returns ``[n_mels, T]``).

    Args:
        samples: ``[L]`` float32 mono samples at ``config.sampling_rate``, any length (trimmed
            or padded to ``n_samples``).
        config: the checkpoint's feature extractor settings.

    Returns:
        ``[nb_max_frames, feature_size]`` float32 (``[3000, 80]`` for Whisper's defaults).
    """
    x = pad_or_trim(samples, config.n_samples, config.padding_value)
    power = stft_power(x, config.n_fft, config.hop_length, hann_window(config.n_fft))
    filters = mel_filter_bank(config.n_fft // 2 + 1, config.feature_size,
                              config.sampling_rate).astype(np.float32)
    return dynamic_range(log_mel(power, filters))
