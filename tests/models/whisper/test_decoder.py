"""The ggml Whisper decoder against transformers: a small random ``WhisperDecoder`` and its tied
``proj_out`` in float64 (every layer's output and the logits, in one graph and through the KV
cache one token at a time), the isolated layers, and the greedy decode against the same rules
run on the float64 module."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.ggml import Runtime
from audioparity.models.whisper.config import parse_config
from audioparity.models.whisper.decoder import Decoder
from audioparity.models.whisper.decoding import greedy
from audioparity.models.whisper.fixture import redraw_weights
from tests.models.whisper.test_encoder import (
    FEATURES,
    GENERATION,
    SMALL,
    assert_float32_close,
    small_config,
)

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: A two-layer decoder (the SMALL encoder's width); 37 encoder frames.
DECODER = {**SMALL, "decoder_layers": 2}
TOKENS = [3, 15, 7, 9, 4, 4, 11, 0]
POSITION_GAIN = 8.0


@pytest.fixture(scope="module")
def model():
    """A float64 ``WhisperForConditionalGeneration`` of :data:`DECODER`, the fixture's draws."""
    config = transformers.WhisperConfig(**DECODER)
    config._attn_implementation = "eager"
    net = transformers.WhisperForConditionalGeneration(config)
    redraw_weights(net, seed=11)
    with torch.no_grad():  # positions that outweigh the tokens: a decode that moves
        net.model.decoder.embed_positions.weight.mul_(POSITION_GAIN)
    return net.double().eval()


@pytest.fixture(scope="module")
def config():
    return parse_config(small_config(decoder_layers=2), FEATURES, GENERATION)


@pytest.fixture(scope="module")
def enc_out():
    return np.random.default_rng(6).standard_normal((37, SMALL["d_model"]))


def reference(model, enc_out, tokens) -> dict[str, np.ndarray]:
    """The float64 module's decoder layers (hooks) and logits on ``tokens``, no cache."""
    taps = {}
    handles = [layer.register_forward_hook(
        lambda m, a, out, n=i: taps.__setitem__(f"decoder_layer_{n}", out[0].numpy()))
        for i, layer in enumerate(model.model.decoder.layers)]
    with torch.no_grad():
        out = model(encoder_outputs=(torch.from_numpy(enc_out)[None],),
                    decoder_input_ids=torch.tensor([tokens]))
    for handle in handles:
        handle.remove()
    return {**taps, "logits": out.logits[0].numpy()}


def weights(model) -> dict[str, np.ndarray]:
    """The module's weights under ``WhisperModel`` names, ``proj_out`` left out (tied)."""
    return {name.removeprefix("model."): value.detach().float().numpy()
            for name, value in model.state_dict().items() if not name.startswith("proj_out")}


def test_decoder_matches_whisper_decoder_in_one_graph_and_step_by_step(model, config, enc_out):
    expected = reference(model, enc_out, TOKENS)
    arrays = weights(model)
    with Runtime("cpu", threads=1) as rt:
        decoder = Decoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        decoder.encoder_output(enc_out)
        whole = decoder.forward(TOKENS, 0)
        stepped = decoder.teacher_forced(TOKENS, 2)
    for name in ("decoder_layer_0", "decoder_layer_1", "logits"):
        assert whole[name].shape == expected[name].shape, name
        assert_float32_close(whole[name], expected[name])
        assert_float32_close(stepped[name], expected[name])


def test_isolated_layers_match_whisper_decoder_layers(model, config, enc_out):
    expected = reference(model, enc_out, TOKENS)
    arrays = weights(model)
    with Runtime("cpu", threads=1) as rt:
        decoder = Decoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        decoder.encoder_output(enc_out)
        isolated = decoder.layers_isolated(TOKENS, [expected["decoder_layer_0"]])
        with pytest.raises(AudioparityError, match="2 decoder layer inputs for layers 1 .. 1"):
            decoder.layers_isolated(TOKENS, [expected["decoder_layer_0"]] * 2)
    assert_float32_close(isolated[0], expected["decoder_layer_0"])
    assert_float32_close(isolated[1], expected["decoder_layer_1"])


def test_greedy_decode_is_the_float64_modules(model, config, enc_out):
    """The same rules (:func:`~audioparity.models.whisper.decoding.greedy`) over the float64
    module without a cache (the whole sequence each step) choose the same tokens."""
    def forward64(ids: list[int]) -> np.ndarray:
        forward64.tokens += ids
        return reference(model, enc_out, forward64.tokens)["logits"][-1]

    forward64.tokens = []
    expected = greedy(config, [3, 15], forward64)
    arrays = weights(model)
    with Runtime("cpu", threads=1) as rt:
        decoder = Decoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        decoder.encoder_output(enc_out)
        got = decoder.greedy([3, 15])
    assert got.ids == expected.ids and got.stopped == expected.stopped
    assert len(set(got.ids)) > 1  # a decode that moves, not one token repeated
    np.testing.assert_allclose(got.margins, expected.margins, rtol=1e-4, atol=1e-5)


def test_decoder_refuses_inputs_it_cannot_take(model, config, enc_out):
    arrays = weights(model)
    with Runtime("cpu", threads=1) as rt:
        decoder = Decoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        with pytest.raises(AudioparityError, match="no encoder output"):
            decoder.forward([3], 0)
        with pytest.raises(AudioparityError, match=r"enc_out has shape \[36, 48\]"):
            decoder.encoder_output(enc_out[:36])
        decoder.encoder_output(enc_out)
        with pytest.raises(AudioparityError, match=r"ids in \[0, 16\)"):
            decoder.forward([3, 16], 0)
        with pytest.raises(AudioparityError, match="7 cached \\+ 2 new tokens exceed "
                                                   "max_target_positions=8"):
            decoder.forward([3, 4], 7)
