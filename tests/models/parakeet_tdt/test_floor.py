"""NeMo against itself (models/parakeet_tdt/floor.py): the exact mel against a float64 numpy
normalisation of NeMo's own log-mel, and the noise floor recorded where, and only where, the
audio is band-limited."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.dumping.audio import load_audio
from tests import REPO

pytest.importorskip("nemo.collections.asr")

CLIP_8K = REPO / "resources/speech/clip-8k.wav"


@pytest.fixture(scope="module")
def model(fixture_model):
    from audioparity.models.parakeet_tdt.references.nemo import restore_model

    return restore_model(fixture_model("parakeet_tdt"))


def _floor(model, config, samples):
    """:func:`noise_floor` of the fixture on ``samples``, as its reference dump computes it."""
    from functools import partial

    from audioparity.models.parakeet_tdt import ParakeetTdt
    from audioparity.models.parakeet_tdt.floor import ReferenceRun, noise_floor
    from audioparity.models.parakeet_tdt.references.nemo import _stages_on, preprocessor

    features, length = preprocessor(model, samples)
    rerun = partial(_stages_on, model, config, length)
    return noise_floor(model, ReferenceRun(samples, features, length, rerun(features)), rerun,
                       partial(ParakeetTdt.spec.carries, "mel_features"))


def test_the_exact_mel_is_the_float64_normalisation_of_nemo_s_log_mel(model):
    import torch

    from audioparity.models.parakeet_tdt.floor import exact_features
    from audioparity.models.parakeet_tdt.references.nemo import preprocessor

    samples = load_audio(CLIP_8K).samples
    features, length = preprocessor(model, samples)
    featurizer = model.preprocessor.featurizer
    featurizer.normalize = None
    try:
        log_mel, _ = preprocessor(model, samples)
    finally:
        featurizer.normalize = "per_feature"
    n = int(length[0])
    x = log_mel[0, :, :n].numpy().astype(np.float64)
    truth = (x - x.mean(axis=1, keepdims=True)) / (x.std(axis=1, ddof=1, keepdims=True) + 1e-5)
    exact = exact_features(model, samples, features, length)
    assert exact.dtype == torch.float32 and exact.shape == features.shape
    np.testing.assert_allclose(exact[0, :, :n].numpy(), truth, rtol=0, atol=1e-5)
    # NeMo's own float32 normalisation is far from it in the near-constant bins
    assert np.abs(features[0, :, :n].numpy() - truth).max() > 1e-2
    assert np.array_equal(exact[:, :, n:], features[:, :, n:])  # padding as NeMo's


def test_the_floor_is_measured_on_band_limited_audio_only(model, fixture_model, clip_wav):
    from audioparity.models.parakeet_tdt.config import load_config
    from audioparity.models.parakeet_tdt.floor import EXACT_MEL_NMSE

    config = load_config(fixture_model("parakeet_tdt"))

    assert _floor(model, config, load_audio(clip_wav).samples) is None
    floor = _floor(model, config, load_audio(CLIP_8K).samples)
    assert floor["from"] == "mel_features" and floor["mel_nmse"] > 1e3 * EXACT_MEL_NMSE
    assert set(floor["stages"]) >= {"pre_encode", "layer_0", "layer_2", "enc_out"}
    # not the stages fed the reference's own inputs, nor the position table
    assert not {"pos_emb", "joint_logits", "lstm_state_0"} & set(floor["stages"])
    for name, measured in floor["stages"].items():
        assert 1e-6 < measured["nmse"] < 1e-1, name
        assert 0.9 < measured["cosine"] < 1.0 and measured["max_rel"] > 0, name
    # the random fixture's own decode moves on the exact mel: a decode moved has no floor
    assert ("decode" in floor["moved"]) == ("decode_logits" not in floor["stages"])
