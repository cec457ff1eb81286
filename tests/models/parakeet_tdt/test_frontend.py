"""The numpy mel frontend against NeMo's own ``AudioToMelSpectrogramPreprocessor`` (eval, no
dither), built from the fixture's (v3's) preprocessor settings."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.audio import load_audio
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


def resample(samples: np.ndarray, rate: int, to: int) -> np.ndarray:
    """soxr HQ, as :func:`audioparity.dumping.audio.load_audio` resamples a file for the model."""
    import soxr

    return soxr.resample(samples.astype(np.float64), rate, to, quality="HQ").astype(np.float32)


def telephone(samples: np.ndarray) -> np.ndarray:
    """``samples`` (16 kHz) through an 8 kHz file, as the workflow feeds an 8 kHz clip to a
    16 kHz model: nothing above 4 kHz, the top mel bins nearly constant."""
    return resample(resample(samples, 16000, 8000), 8000, 16000)


def tone_after_silence() -> np.ndarray:
    t = np.arange(3 * 16000) / 16000
    return np.concatenate([np.zeros(16000), 0.3 * np.sin(2 * np.pi * 440 * t)]).astype(np.float32)


def nmse64(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64), b.astype(np.float64)
    return float(((a - b) ** 2).sum() / (b * b).sum())


#: Band-limited inputs: telephone speech through a 16 kHz model, speech resampled for a
#: 22.05 kHz model (nothing above 8 kHz of its 11 kHz band), one tone after silence.
BAND_LIMITED = {
    "telephone": ({}, telephone),
    "22khz_model": ({"sample_rate": 22050, "n_fft": None},
                    lambda clip: resample(clip, 16000, 22050)),
    "tone": ({}, lambda clip: tone_after_silence()),
}


@pytest.mark.parametrize("case", list(BAND_LIMITED))
def test_normalisation_holds_on_band_limited_audio(clip_wav, case):
    """Near-constant mel bins (std about 1e-5 at a mean of -16.6) amplify the rounding of the
    per-feature statistics. The truth is NeMo's ``normalize_batch`` in float64 of NeMo's own
    log-mel; NeMo's float32 output is off it by its own float32 noise. The port's normalisation
    of the same log-mel must be at least as close to the truth, and the port's whole mel
    within that noise of NeMo's output (plain float32 sums over frames put it 50x and 20x
    NeMo's noise away on the telephone clip and the 22.05 kHz model)."""
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor
    from nemo.collections.asr.parts.preprocessing.features import normalize_batch

    from audioparity.models.parakeet_tdt.frontend import normalize_per_feature

    overrides, make = BAND_LIMITED[case]
    settings = {**SETTINGS, **overrides}
    samples = np.asarray(make(load_audio(clip_wav).samples), dtype=np.float32)
    modules = {normalize: AudioToMelSpectrogramPreprocessor(
        **{**settings, "normalize": normalize}).eval() for normalize in ("per_feature", None)}
    for module in modules.values():
        module.featurizer.dither = 0.0
    nemo, n = nemo_mel(modules["per_feature"], samples)
    log_mel, _ = nemo_mel(modules[None], samples)
    lengths = torch.tensor([n])
    truth = normalize_batch(torch.from_numpy(log_mel.T.astype(np.float64))[None], lengths,
                            "per_feature")[0][0].T.numpy()
    nemo_noise = nmse64(nemo, truth)
    assert nmse64(normalize_per_feature(log_mel), truth) <= nemo_noise, nemo_noise
    featurizer = modules["per_feature"].featurizer
    ours = mel_features(samples, PreprocessorConfig(**settings), filterbank=featurizer.fb.numpy(),
                        window=featurizer.window.numpy())
    # 1e-10: the mel gate's allowance for the FFT's noise (numpy's against torch's)
    assert nmse64(ours, nemo) <= 2 * nemo_noise + 1e-10, (nmse64(ours, nemo), nemo_noise)


def mel_gate() -> dict:
    """The f32 gates' mel_features entry, as config/config.yaml declares it."""
    import yaml

    from tests import REPO

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    entry = next(e for e in config["parakeet_tdt"]["gates"]["default"]
                 if e["stage"] == "mel_features")
    return {"gates": [{**entry, "from": "default"}], "expected_failures": []}


def f32_sums_frame_by_frame(log_mel: np.ndarray) -> np.ndarray:
    """The old normalisation: the mean and the squared deviations summed in float32, one
    frame after another, as a C++ loop sums them."""
    x = log_mel.astype(np.float32)
    total = np.zeros(x.shape[1], np.float32)
    for row in x:
        total += row
    centred = x - total / np.float32(x.shape[0])
    squares = np.zeros(x.shape[1], np.float32)
    for row in centred:
        squares += row * row
    std = np.sqrt(squares / np.float32(x.shape[0] - 1))
    return centred / (std + np.float32(1e-5))


@pytest.mark.parametrize("case", ["clip", "telephone"])
def test_mel_gate_passes_the_port_and_fails_planted_frontend_bugs(clip_wav, case):
    """The mel gate against NeMo on the clip and on the clip through an 8 kHz file: the port
    passes (on the 8 kHz clip judged by the spread NMSE, its near-constant bins named in the
    reason), and an f16 rounding of the mel, pre-emphasis where the model has none, and the
    statistics summed in float32 frame by frame each fail (the last only on the band-limited
    clip: on normal audio its noise grows past a minute, config/config.yaml)."""
    from nemo.collections.asr.modules import AudioToMelSpectrogramPreprocessor

    from audioparity.compare.gates import status
    from audioparity.compare.stage import tensor_metrics

    samples = load_audio(clip_wav).samples
    if case == "telephone":
        samples = telephone(samples)
    gates = mel_gate()
    candidates = {}
    for preemph in (0.97, None):  # the fixture's, and a model without pre-emphasis
        settings = {**SETTINGS, "preemph": preemph}
        modules = {normalize: AudioToMelSpectrogramPreprocessor(
            **{**settings, "normalize": normalize}).eval() for normalize in ("per_feature", None)}
        for module in modules.values():
            module.featurizer.dither = 0.0
        nemo, _ = nemo_mel(modules["per_feature"], samples)
        featurizer = modules["per_feature"].featurizer
        ours = mel_features(samples, PreprocessorConfig(**settings),
                            filterbank=featurizer.fb.numpy(), window=featurizer.window.numpy())
        wrong = {**settings, "preemph": 0.97 if preemph is None else None}
        log_mel, _ = nemo_mel(modules[None], samples)
        candidates[preemph] = (nemo, {
            "port": ours,
            "f16 mel": ours.astype(np.float16).astype(np.float32),
            "wrong preemph": mel_features(samples, PreprocessorConfig(**wrong),
                                          filterbank=featurizer.fb.numpy(),
                                          window=featurizer.window.numpy()),
            "f32 sums": f32_sums_frame_by_frame(log_mel),
        })
    for preemph, (nemo, planted) in candidates.items():
        verdicts = {name: status("mel_features", gates,
                                 metrics=tensor_metrics("tensor", cand, nemo))
                    for name, cand in planted.items()}
        assert verdicts["port"].status == "pass", (preemph, verdicts["port"])
        assert ("near-constant features" in verdicts["port"].reason) == (case == "telephone")
        for name in ("f16 mel", "wrong preemph") + (("f32 sums",) if case == "telephone" else ()):
            assert verdicts[name].status == "fail", (preemph, name, verdicts[name])
