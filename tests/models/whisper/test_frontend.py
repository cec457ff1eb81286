"""The numpy log-mel frontend against transformers' own ``WhisperFeatureExtractor`` (the torch
path it takes when torch is installed), step by step and end to end."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.compare.metrics import cosine, max_rel, nmse
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.audio import load_audio
from audioparity.models.whisper import frontend
from audioparity.models.whisper.config import FeatureExtractorConfig

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: What a float32 port agrees to (measured: NMSE 2.1e-13 on the clip, 1.2e-13 on jfk.wav, with
#: the largest error where a frame's energy is near the FFT's float32 noise floor).
NMSE_LIMIT = 1e-11


def extractor_mel(samples: np.ndarray, config: FeatureExtractorConfig) -> np.ndarray:
    """``WhisperFeatureExtractor(...)(samples)``, transposed to ``[T, n_mels]``."""
    extractor = transformers.WhisperFeatureExtractor(
        feature_size=config.feature_size, sampling_rate=config.sampling_rate,
        hop_length=config.hop_length, chunk_length=config.chunk_length, n_fft=config.n_fft)
    features = extractor(samples, sampling_rate=config.sampling_rate, return_tensors="np")
    return features["input_features"][0].T


def noise(seconds: float, seed: int = 0, rate: int = 16000) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(rate * seconds))).astype(np.float32)


def test_the_extractor_takes_the_torch_path_here():
    """The reference computes with ``_torch_extract_fbank_features`` when torch is installed
    (what the frontend mirrors); the numpy path gives other values."""
    assert transformers.is_torch_available()
    extractor = transformers.WhisperFeatureExtractor()
    samples = noise(2.0)[None]
    padded = np.pad(samples, ((0, 0), (0, extractor.n_samples - samples.shape[1])))
    through_call = extractor(samples[0], sampling_rate=16000, return_tensors="np")
    np.testing.assert_array_equal(through_call["input_features"],
                                  extractor._torch_extract_fbank_features(padded))


@pytest.mark.parametrize("case", ["clip", "noise"])
def test_mel_matches_the_feature_extractor(clip_wav, case):
    config = FeatureExtractorConfig()
    samples = load_audio(clip_wav).samples if case == "clip" else noise(7.3)
    ours, reference = frontend.mel_features(samples, config), extractor_mel(samples, config)
    assert ours.shape == reference.shape == (3000, 80)
    assert ours.dtype == np.float32
    assert nmse(ours, reference) < NMSE_LIMIT, nmse(ours, reference)
    assert cosine(ours, reference) > 1 - NMSE_LIMIT
    assert max_rel(ours, reference) < 1e-4


@pytest.mark.parametrize("seconds", [0.0001, 3.0, 30.0, 31.7])
def test_every_length_is_padded_or_trimmed_to_the_window(seconds):
    """T = n_samples // hop = 3000 frames whatever the length: short audio is padded with
    silence, audio past 30 s is cut (the extractor's truncation)."""
    config = FeatureExtractorConfig()
    samples = noise(seconds, seed=1)
    ours = frontend.mel_features(samples, config)
    assert ours.shape == (config.nb_max_frames, config.feature_size) == (3000, 80)
    assert nmse(ours, extractor_mel(samples, config)) < NMSE_LIMIT
    if seconds > 30:
        np.testing.assert_array_equal(ours, frontend.mel_features(samples[:480_000], config))
        assert "trimmed" in frontend.trim_note(samples.size, config)
    else:
        assert frontend.trim_note(samples.size, config) is None


def test_other_settings_follow_the_extractor():
    """128 mel bins (large-v3), a 10 s window, another hop, n_fft and padding value."""
    config = FeatureExtractorConfig(feature_size=128, chunk_length=10, hop_length=128,
                                    n_fft=512)
    samples = noise(4.2, seed=2)
    ours = frontend.mel_features(samples, config)
    assert ours.shape == (10 * 16000 // 128, 128)
    assert nmse(ours, extractor_mel(samples, config)) < NMSE_LIMIT


def test_padding_value_pads_the_tail():
    x = np.ones(5, np.float32)
    np.testing.assert_array_equal(frontend.pad_or_trim(x, 8, 0.5), [1] * 5 + [0.5] * 3)
    np.testing.assert_array_equal(frontend.pad_or_trim(np.arange(10, dtype=np.float32), 4),
                                  [0, 1, 2, 3])


def test_mel_filters_are_the_extractors_exactly():
    for mels, n_fft in ((80, 400), (128, 400), (40, 512)):
        extractor = transformers.WhisperFeatureExtractor(feature_size=mels, n_fft=n_fft)
        ours = frontend.mel_filter_bank(n_fft // 2 + 1, mels, 16000)
        np.testing.assert_array_equal(ours, extractor.mel_filters.T)
        # and transformers' own function, named
        reference = transformers.audio_utils.mel_filter_bank(
            num_frequency_bins=n_fft // 2 + 1, num_mel_filters=mels, min_frequency=0.0,
            max_frequency=8000.0, sampling_rate=16000, norm="slaney", mel_scale="slaney")
        np.testing.assert_array_equal(ours, reference.T)


def test_window_is_torchs_periodic_hann():
    ours = frontend.hann_window(400)
    reference = torch.hann_window(400).numpy()
    assert ours.dtype == np.float32
    assert np.abs(ours - reference).max() <= 2.0**-24  # one ulp below 1
    assert np.count_nonzero(ours != reference) < 40
    symmetric = torch.hann_window(400, periodic=False).numpy()
    assert np.abs(ours - symmetric).max() > 1e-5


def test_stft_power_matches_torch_stft_with_reflect_padding():
    x = noise(0.5, seed=3)
    window = torch.hann_window(400)
    stft = torch.stft(torch.from_numpy(x), 400, 160, window=window, return_complex=True)
    reference = (stft[..., :-1].abs() ** 2).T.numpy()
    ours = frontend.stft_power(x, 400, 160, frontend.hann_window(400))
    assert ours.shape == reference.shape == (x.size // 160, 201)
    assert nmse(ours, reference) < 1e-12
    # zero padding instead of reflection changes the first and last frames
    zero_padded = torch.stft(torch.from_numpy(x), 400, 160, window=window, pad_mode="constant",
                             return_complex=True)
    edge = (zero_padded[..., :-1].abs() ** 2).T.numpy()
    assert nmse(ours[:1], edge[:1]) > 1e-3


def test_log_mel_and_dynamic_range_match_torch_in_float64():
    """The floor, the log10, the 80 dB range and the scaling, on values spanning the floor."""
    rng = np.random.default_rng(4)
    power = (10.0 ** rng.uniform(-14, 2, (50, 201))).astype(np.float32)
    filters = frontend.mel_filter_bank(201, 80, 16000).astype(np.float32)
    ours = frontend.dynamic_range(frontend.log_mel(power, filters))
    mel = torch.from_numpy(filters).double() @ torch.from_numpy(power).double().T
    log_spec = torch.clamp(mel, min=1e-10).log10()
    log_spec = torch.maximum(log_spec, log_spec.max() - 8.0)
    reference = ((log_spec + 4.0) / 4.0).T.numpy()
    assert np.abs(ours - reference).max() < 1e-5
    assert ours.min() == pytest.approx(ours.max() - 2.0, abs=1e-6)  # 8 log10 units / 4


def test_mismatched_shapes_are_refused():
    with pytest.raises(AudioparityError, match="mel filters have 200 frequency bins"):
        frontend.log_mel(np.ones((3, 201), np.float32), np.ones((80, 200), np.float32))
    with pytest.raises(AudioparityError, match="window of 399 samples"):
        frontend.stft_power(np.ones(1000, np.float32), 400, 160, np.ones(399, np.float32))
