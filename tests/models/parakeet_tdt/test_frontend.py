"""The numpy mel frontend against NeMo's own ``AudioToMelSpectrogramPreprocessor`` (eval, no
dither), built from the fixture's (v3's) preprocessor settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audioparity.audio import load_audio
from audioparity.errors import AudioparityError
from audioparity.models.parakeet_tdt.config import PreprocessorConfig
from audioparity.models.parakeet_tdt.fixture import fixture_config
from audioparity.models.parakeet_tdt.frontend import mel_features, mel_filterbank

torch = pytest.importorskip("torch")

SETTINGS = {k: v for k, v in fixture_config(Path("."))["preprocessor"].items() if k != "_target_"}


@pytest.fixture(scope="module")
def nemo_preprocessor():
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    module = AudioToMelSpectrogramPreprocessor(**SETTINGS).eval()
    module.featurizer.dither = 0.0
    return module


def nemo_mel(module, samples: np.ndarray) -> tuple[np.ndarray, int]:
    """NeMo's features ``[T, n_mels]`` (valid frames) and the length it reports."""
    with torch.inference_mode():
        features, length = module(input_signal=torch.from_numpy(samples)[None],
                                  length=torch.tensor([samples.size]))
    n = int(length[0])
    return features[0, :, :n].T.numpy(), n


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    a, b = a.astype(np.float64), b.astype(np.float64)
    cosine = float((a * b).sum() / np.sqrt((a * a).sum() * (b * b).sum()))
    return cosine, float(np.abs(a - b).max()), float(((a - b) ** 2).sum() / (b * b).sum())


def noise(seconds: float, extra: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (0.1 * rng.standard_normal(int(16000 * seconds) + extra)).astype(np.float32)


@pytest.mark.parametrize("stored", [True, False], ids=["checkpoint-fb", "librosa-fb"])
def test_mel_matches_nemo_on_speech(nemo_preprocessor, clip_wav, stored):
    samples = load_audio(clip_wav).samples
    reference, n_frames = nemo_mel(nemo_preprocessor, samples)
    featurizer = nemo_preprocessor.featurizer
    ours = mel_features(
        samples, PreprocessorConfig(**SETTINGS),
        filterbank=featurizer.fb.numpy() if stored else None,
        window=featurizer.window.numpy() if stored else None,
    )
    assert ours.dtype == np.float32
    assert ours.shape == (n_frames, SETTINGS["features"]) == (samples.size // 160, 128)
    cosine, max_abs, nmse = agreement(ours, reference)
    assert cosine >= 0.99999, (cosine, max_abs, nmse)
    assert nmse < 1e-9, (cosine, max_abs, nmse)


@pytest.mark.parametrize("extra", [0, 37, 159])
def test_mel_matches_nemo_on_noise_and_frame_count(nemo_preprocessor, extra):
    samples = noise(1.5, extra)
    reference, n_frames = nemo_mel(nemo_preprocessor, samples)
    ours = mel_features(samples, PreprocessorConfig(**SETTINGS))
    assert ours.shape[0] == n_frames == samples.size // 160
    cosine, max_abs, nmse = agreement(ours, reference)
    assert cosine >= 0.99999, (cosine, max_abs, nmse)


def test_librosa_filterbank_equals_nemo_buffer(nemo_preprocessor):
    stored = nemo_preprocessor.featurizer.fb.numpy()[0]
    np.testing.assert_array_equal(mel_filterbank(PreprocessorConfig(**SETTINGS)), stored)


def test_unsupported_settings_and_short_audio_raise():
    with pytest.raises(AudioparityError, match="normalize"):
        mel_features(noise(0.5, 0), PreprocessorConfig(**{**SETTINGS, "normalize": "all_features"}))
    with pytest.raises(AudioparityError, match="shorter than one hop"):
        mel_features(np.zeros(100, np.float32), PreprocessorConfig(**SETTINGS))
    with pytest.raises(AudioparityError, match="featurizer.fb"):
        mel_features(noise(0.5, 0), PreprocessorConfig(**SETTINGS),
                     filterbank=np.ones((64, 257), np.float32))
