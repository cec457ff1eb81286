"""The Parakeet-TDT mel frontend in numpy float32, as a C++ runtime computes it (no torch).

Mirrors NeMo's ``AudioToMelSpectrogramPreprocessor`` -> ``FilterbankFeatures.forward``
(``nemo/collections/asr/parts/preprocessing/features.py``) in eval mode (no dither), one
utterance, step by step:

1. :func:`preemphasis`: ``y[0] = x[0]``, ``y[n] = x[n] - preemph * x[n-1]``.
2. :func:`stft_power`: ``torch.stft(center=True, pad_mode="constant")`` with the ``win_length``
   window zero-padded, centred, into ``n_fft``; then ``|X|^mag_power`` (the power spectrum).
3. :func:`mel_filterbank`: the slaney mel filterbank NeMo builds with ``librosa.filters.mel``
   (used only when the checkpoint does not carry ``preprocessor.featurizer.fb``).
4. :func:`log_mel`: ``log(fb @ power + guard)`` (``log_zero_guard_type`` ``add`` or ``clamp``).
5. :func:`normalize_per_feature`: NeMo's ``normalize_batch(..., "per_feature")`` over the
   valid frames.

Precision: every step up to the log-mel runs in float32, as NeMo does on CPU; the per-feature
normalisation runs in float64 (see :func:`normalize_per_feature`). The FFT is numpy's pocketfft
(``np.fft.rfft``), which since numpy 2.0 computes a float32 input in single precision and
returns complex64, the precision of ``torch.stft`` on float32 input. NeMo takes
``sqrt(re^2 + im^2)`` and raises it to ``mag_power``; here the power spectrum is computed as
``(re^2 + im^2) ** (mag_power / 2)`` directly (for ``mag_power = 2`` that skips the
sqrt-then-square round trip, a difference of at most an ulp).

Frame count: with ``center=True`` the STFT yields ``L // hop + 1`` frames; NeMo reports
``L // hop`` valid frames (``get_seq_len``) and zeroes the last one. :func:`mel_features` returns
the valid frames only, ``[T, n_mels]`` with ``T = L // hop``.
"""

from __future__ import annotations

import numpy as np

from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.config import PreprocessorConfig

#: NeMo's ``CONSTANT`` added to the per-feature std (``features.py``).
STD_EPS = np.float32(1e-5)


def preemphasis(samples: np.ndarray, coefficient: float) -> np.ndarray:
    """Pre-emphasis filter, NeMo ``FilterbankFeatures.forward`` ("do preemphasis").

    Args:
        samples: ``[L]`` float32 samples.
        coefficient: ``preemph`` (0.97 for Parakeet).

    Returns:
        ``[L]`` float32: ``y[0] = x[0]``, ``y[n] = x[n] - coefficient * x[n-1]`` (the product is
        rounded to float32 first, as torch computes ``x - preemph * x``).
    """
    x = np.asarray(samples, dtype=np.float32)
    out = np.empty_like(x)
    out[:1] = x[:1]
    out[1:] = x[1:] - np.float32(coefficient) * x[:-1]
    return out


def hann_window(win_length: int) -> np.ndarray:
    """Symmetric Hann window, ``torch.hann_window(win_length, periodic=False)``.

    Computed in float64 and rounded to float32 (torch computes it in float32; the two agree to
    an ulp). Used only when the checkpoint does not carry ``preprocessor.featurizer.window``.

    Returns:
        ``[win_length]`` float32.
    """
    n = np.arange(win_length, dtype=np.float64)
    return (0.5 - 0.5 * np.cos(2.0 * np.pi * n / (win_length - 1))).astype(np.float32)


def stft_power(x: np.ndarray, n_fft: int, hop_length: int, window: np.ndarray,
               mag_power: float = 2.0) -> np.ndarray:
    """Power spectrogram, ``torch.stft(x, n_fft, hop_length, win_length, window, center=True,
    pad_mode="constant")`` followed by ``|X| ** mag_power`` (NeMo ``FilterbankFeatures.stft``).

    The signal is zero-padded by ``n_fft // 2`` on both sides; frame ``m`` covers padded samples
    ``[m * hop, m * hop + n_fft)``. A window shorter than ``n_fft`` is zero-padded on both sides
    by ``(n_fft - win_length) // 2`` on the left, as ``torch.stft`` does.

    Args:
        x: ``[L]`` float32 (pre-emphasised) samples.
        n_fft: FFT size.
        hop_length: hop in samples.
        window: ``[win_length]`` float32, ``win_length <= n_fft``.
        mag_power: exponent of the magnitude (2: power spectrum).

    Returns:
        ``[L // hop_length + 1, n_fft // 2 + 1]`` float32 (frames x frequency bins).

    Raises:
        AudioparityError: the window is longer than ``n_fft``.
    """
    window = np.asarray(window, dtype=np.float32).reshape(-1)
    if window.size > n_fft:
        raise AudioparityError(f"STFT window of {window.size} samples exceeds n_fft={n_fft}")
    left = (n_fft - window.size) // 2
    full_window = np.zeros(n_fft, dtype=np.float32)
    full_window[left:left + window.size] = window
    padded = np.pad(np.asarray(x, dtype=np.float32), n_fft // 2, mode="constant")
    n_frames = 1 + (padded.size - n_fft) // hop_length
    frames = np.lib.stride_tricks.sliding_window_view(padded, n_fft)[::hop_length][:n_frames]
    spectrum = np.fft.rfft(frames * full_window, n=n_fft, axis=-1)  # complex64 from float32
    power = spectrum.real * spectrum.real + spectrum.imag * spectrum.imag
    if mag_power != 2.0:
        power = power ** np.float32(mag_power / 2.0)
    return power.astype(np.float32, copy=False)


def mel_filterbank(config: PreprocessorConfig) -> np.ndarray:
    """The mel filterbank NeMo builds in ``FilterbankFeatures.__init__``:
    ``librosa.filters.mel(sr, n_fft, n_mels=features, fmin=lowfreq, fmax=highfreq or sr / 2,
    norm=mel_norm)`` (slaney mel scale and area normalisation for Parakeet).

    Returns:
        ``[n_mels, n_fft // 2 + 1]`` float32.
    """
    import librosa

    return librosa.filters.mel(
        sr=config.sample_rate, n_fft=_n_fft(config), n_mels=config.features,
        fmin=config.lowfreq, fmax=config.highfreq or config.sample_rate / 2,
        norm=config.mel_norm,
    ).astype(np.float32)


def log_mel(power: np.ndarray, filterbank: np.ndarray, guard_type: str = "add",
            guard_value: float = 2.0**-24) -> np.ndarray:
    """Mel energies and their log, NeMo ``torch.log(fb @ x + guard)`` (``log_zero_guard_type``
    ``add``) or ``torch.log(clamp(fb @ x, min=guard))`` (``clamp``).

    Args:
        power: ``[frames, n_fft // 2 + 1]`` float32.
        filterbank: ``[n_mels, n_fft // 2 + 1]`` float32.

    Returns:
        ``[frames, n_mels]`` float32.

    Raises:
        AudioparityError: an unknown guard type, or a filterbank whose width is not the number of
            frequency bins.
    """
    if filterbank.shape[-1] != power.shape[-1]:
        raise AudioparityError(
            f"mel filterbank has {filterbank.shape[-1]} frequency bins, the STFT "
            f"{power.shape[-1]}"
        )
    mel = power @ np.asarray(filterbank, dtype=np.float32).T
    guard = np.float32(guard_value)
    if guard_type == "add":
        return np.log(mel + guard)
    if guard_type == "clamp":
        return np.log(np.maximum(mel, guard))
    raise AudioparityError(f"log_zero_guard_type={guard_type!r}: expected 'add' or 'clamp'")


def normalize_per_feature(features: np.ndarray) -> np.ndarray:
    """NeMo ``normalize_batch(x, seq_len, "per_feature")`` on the valid frames of one utterance,
    computed in float64 and rounded once to float32.

    Per mel bin: ``(x - mean) / (std + 1e-5)`` with the mean and the unbiased std (ddof=1) over
    time; a single frame has std 0 (NeMo replaces its NaN by 0).

    NeMo computes this in float32 (``torch.sum`` over time, whose summation order depends on
    the CPU's vector width or on the GPU). Where a mel bin is nearly constant (audio with
    nothing above some frequency: telephone speech resampled to 16 kHz, a model whose band
    exceeds the audio's), its std is a few float32 ulps of its mean (std about 1e-5 at a mean of
    -16.6), and the normalisation divides the rounding of the mean and of the sums by that
    std: such a bin of NeMo's output carries float32 noise of order 1 however it is summed. In
    float64 the result is the correctly rounded normalisation of the given log-mel, which is
    what NeMo's output approximates; a plain float32 sum over frames (numpy's sequential sum
    along a strided axis) drifts much further from it (on telephone speech 0.09 NMSE against
    NeMo's 0.002).

    Args:
        features: ``[T, n_mels]`` float32, valid frames only.

    Returns:
        ``[T, n_mels]`` float32.
    """
    x = np.asarray(features, dtype=np.float64)
    n = x.shape[0]
    centred = x - x.mean(axis=0)
    if n > 1:
        std = np.sqrt((centred * centred).sum(axis=0) / (n - 1))
    else:
        std = np.zeros(x.shape[1])
    return (centred / (std + float(STD_EPS))).astype(np.float32)


def mel_features(samples: np.ndarray, config: PreprocessorConfig, *,
                 filterbank: np.ndarray | None = None,
                 window: np.ndarray | None = None) -> np.ndarray:
    """Log-mel features of one utterance, NeMo ``AudioToMelSpectrogramPreprocessor`` in eval
    mode (dither off).

    Args:
        samples: ``[L]`` float32 mono samples at ``config.sample_rate``.
        config: the model's ``preprocessor`` config.
        filterbank: ``[n_mels, n_fft // 2 + 1]`` (or NeMo's stored ``[1, n_mels, bins]``) from the
            checkpoint's ``preprocessor.featurizer.fb``; built with :func:`mel_filterbank` when
            None.
        window: ``[win_length]`` from ``preprocessor.featurizer.window``; the symmetric Hann
            window when None.

    Returns:
        ``[T, n_mels]`` float32, the valid frames only, ``T = L // hop_length``.

    Raises:
        AudioparityError: a setting this frontend does not implement (normalisation other than
            ``per_feature``, frame splicing, ``exact_pad``, a window other than ``hann`` without a
            stored window), fewer samples than one hop, or a stored filterbank of the wrong shape.
    """
    _check_supported(config, window)
    x = np.asarray(samples, dtype=np.float32).reshape(-1)
    n_valid = x.size // config.hop_length
    if n_valid < 1:
        raise AudioparityError(
            f"audio of {x.size} samples is shorter than one hop ({config.hop_length} samples)"
        )
    n_fft = _n_fft(config)
    if filterbank is None:
        filterbank = mel_filterbank(config)
    filterbank = np.asarray(filterbank, dtype=np.float32)
    if filterbank.ndim == 3 and filterbank.shape[0] == 1:
        filterbank = filterbank[0]
    if filterbank.shape != (config.features, n_fft // 2 + 1):
        raise AudioparityError(
            f"preprocessor.featurizer.fb: shape {list(filterbank.shape)}, expected "
            f"[{config.features}, {n_fft // 2 + 1}]"
        )
    if window is None:
        window = hann_window(config.win_length)
    if config.preemph:
        x = preemphasis(x, config.preemph)
    power = stft_power(x, n_fft, config.hop_length, window, config.mag_power)
    features = power[:n_valid]
    if config.log:
        features = log_mel(features, filterbank, config.log_zero_guard_type,
                           config.log_zero_guard_value)
    else:
        features = features @ filterbank.T
    return normalize_per_feature(features)


def _n_fft(config: PreprocessorConfig) -> int:
    """``n_fft`` or, as NeMo defaults it, the next power of two of the window length."""
    return config.n_fft or 1 << (config.win_length - 1).bit_length()


def _check_supported(config: PreprocessorConfig, window: np.ndarray | None) -> None:
    unsupported = []
    if config.normalize != "per_feature":
        unsupported.append(f"normalize={config.normalize!r} (only 'per_feature')")
    if config.frame_splicing != 1:
        unsupported.append(f"frame_splicing={config.frame_splicing} (only 1)")
    if config.exact_pad:
        unsupported.append("exact_pad=True (only centred STFT)")
    if window is None and config.window != "hann":
        unsupported.append(f"window={config.window!r} without a stored window (only 'hann')")
    if unsupported:
        raise AudioparityError("preprocessor: " + "; ".join(unsupported) + " not implemented")
