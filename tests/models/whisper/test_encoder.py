"""The ggml Whisper encoder against transformers: every block against the module it mirrors
(a small random ``WhisperEncoder`` in float64), the config and checkpoint readers, and the whole
encoder on the tiny fixture against the reference dump, at f32 and q8_0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import ggml
import numpy as np
import pytest

from audioparity.compare.metrics import cosine, max_rel, nmse
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import RunSettings, storage_types, upload_weights
from audioparity.dumping.emulation import emulated_dir
from audioparity.ggml import Runtime
from audioparity.models.whisper import Whisper
from audioparity.models.whisper import encoder as enc
from audioparity.models.whisper.checkpoint import (
    check_weights,
    expected_shapes,
    read_weights,
)
from audioparity.models.whisper.config import load_config, parse_config
from audioparity.models.whisper.fixture import redraw_weights
from tests.models.whisper import gate

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

#: A small encoder whose sizes are pairwise different; 37 positions (74 mel frames): no length
#: is a multiple of the sgemm padding (16), and ``in * k`` of conv1 (3 * 19 = 57) neither.
SMALL = {"num_mel_bins": 19, "d_model": 48, "encoder_layers": 2, "encoder_attention_heads": 4,
         "encoder_ffn_dim": 80, "max_source_positions": 37, "vocab_size": 16,
         "decoder_layers": 1, "decoder_attention_heads": 4, "decoder_ffn_dim": 32,
         "max_target_positions": 8, "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2,
         "decoder_start_token_id": 3, "begin_suppress_tokens": None}
#: Float32 port against a float64 module (measured below 1e-13 for every block).
LIMIT = 1e-11


#: The generation config of :data:`SMALL`: its prompt and end tokens.
GENERATION = {"decoder_start_token_id": 3, "eos_token_id": 2, "no_timestamps_token_id": 15}


def small_config(**overrides) -> dict:
    return {"model_type": "whisper", **SMALL, **overrides}


@pytest.fixture(scope="module")
def module():
    """A float64 transformers ``WhisperEncoder`` of :data:`SMALL` with the fixture's draws."""
    config = transformers.WhisperConfig(**SMALL)
    config._attn_implementation = "eager"
    model = transformers.WhisperModel(config)
    redraw_weights(model, seed=5)
    return model.encoder.double().eval()


#: A 1 s window of 74 mel frames (hop 216), what :data:`SMALL` takes.
FEATURES = {"feature_size": SMALL["num_mel_bins"], "chunk_length": 1, "hop_length": 216}


@pytest.fixture(scope="module")
def config():
    return parse_config(small_config(), FEATURES, GENERATION)


def arrays(module) -> dict[str, np.ndarray]:
    """The encoder module's weights under their ``WhisperModel`` names (``encoder.*``)."""
    return {"encoder." + name: value.detach().float().numpy()
            for name, value in module.state_dict().items()}


def run_block(weights: dict[str, np.ndarray], inputs: dict[str, np.ndarray], build) -> np.ndarray:
    """``build(ctx, weights, *inputs)`` in one f32 graph; its output as a 2-D array."""
    with Runtime("cpu", threads=1) as rt:
        uploaded = rt.upload(weights, dict.fromkeys(weights, "f32"))
        with rt.graph() as g:
            tensors = [g.input(name, value.astype(np.float32)) for name, value in inputs.items()]
            g.output("y", build(g.ctx, uploaded, *tensors), ndim=2)
            return g.compute()["y"]


def assert_float32_close(candidate: np.ndarray, reference: np.ndarray, limit: float = LIMIT):
    assert candidate.shape == reference.shape
    assert nmse(candidate, reference) < limit, nmse(candidate, reference)
    assert cosine(candidate, reference) > 1 - limit


def test_gelu_is_the_exact_erf_form_and_tanh_fails_the_f32_gate():
    """``ggml_gelu_erf`` is ``nn.functional.gelu`` to float32 rounding; ``ggml_gelu`` (tanh)
    is off by more than the f32 gates of config.yaml allow."""
    x = np.random.default_rng(0).standard_normal((200, 64)) * 2.0
    exact = torch.nn.functional.gelu(torch.from_numpy(x)).numpy()
    erf = run_block({}, {"x": x}, lambda ctx, w, t: enc.gelu(ctx, t))
    tanh = run_block({}, {"x": x}, lambda ctx, w, t: ggml.ggml_gelu(ctx, t))
    limit = gate("f32", "layer_0")["nmse_max"]
    assert nmse(erf, exact) < limit / 1000
    assert nmse(tanh, exact) > 10 * limit


@pytest.mark.parametrize("n_in, n_out, stride, length", [(5, 7, 1, 33), (19, 48, 1, 74),
                                                        (48, 48, 2, 74), (16, 8, 2, 31)])
def test_conv1d_matches_torch_conv1d(n_in, n_out, stride, length):
    rng = np.random.default_rng(n_in)
    conv = torch.nn.Conv1d(n_in, n_out, 3, stride=stride, padding=1).double()
    x = rng.standard_normal((n_in, length))
    with torch.no_grad():
        reference = conv(torch.from_numpy(x)[None])[0].T.numpy()  # [T', out]
    weights = {"c.weight": conv.weight.detach().float().numpy(),
               "c.bias": conv.bias.detach().float().numpy()}
    out = run_block(weights, {"x": x}, lambda ctx, w, t: enc.conv1d(ctx, w, "c", t, stride, 1))
    assert out.shape == ((length - 1) // stride + 1, n_out)
    assert_float32_close(out, reference)


def test_conv_stack_matches_whisper_convs(module):
    mel = np.random.default_rng(1).standard_normal((74, SMALL["num_mel_bins"]))
    with torch.no_grad():
        x = torch.from_numpy(mel.T.copy())[None]
        gelu = torch.nn.functional.gelu
        reference = gelu(module.conv2(gelu(module.conv1(x))))[0].T.numpy()
    out = run_block(arrays(module), {"mel": mel}, lambda ctx, w, t: enc.conv_stack(ctx, w, t))
    assert out.shape == (37, SMALL["d_model"])
    assert_float32_close(out, reference)


@pytest.mark.parametrize("n_frames", [1, 37])
def test_self_attention_matches_whisper_attention(module, config, n_frames):
    x = np.random.default_rng(2).standard_normal((n_frames, SMALL["d_model"]))
    attention = module.layers[1].self_attn
    with torch.no_grad():
        reference = attention(hidden_states=torch.from_numpy(x)[None])[0][0].numpy()
    out = run_block(arrays(module), {"x": x}, lambda ctx, w, t: enc.self_attention(
        ctx, w, "encoder.layers.1.self_attn.", config.encoder, t))
    assert_float32_close(out, reference)


def test_encoder_layer_matches_whisper_layer(module, config):
    x = np.random.default_rng(3).standard_normal((37, SMALL["d_model"]))
    with torch.no_grad():
        reference = module.layers[0](torch.from_numpy(x)[None], None)[0].numpy()
    out = run_block(arrays(module), {"x": x},
                    lambda ctx, w, t: enc.encoder_layer(ctx, w, 0, config.encoder, t))
    assert_float32_close(out, reference)


def test_encoder_matches_whisper_end_to_end_and_layer_by_layer(module, config):
    """Every tap of :meth:`Encoder.forward` and every isolated layer against the module's own
    outputs (``hidden_states``: the layers' input, then each layer's output but the last, whose
    place ``last_hidden_state`` takes)."""
    mel = np.random.default_rng(4).standard_normal((74, SMALL["num_mel_bins"]))
    taps = {}
    module.conv2.register_forward_hook(lambda m, a, out: taps.__setitem__("conv2", out))
    module.layers[1].register_forward_hook(lambda m, a, out: taps.__setitem__("layer_1", out))
    with torch.no_grad():
        result = module(torch.from_numpy(mel.T.copy())[None], output_hidden_states=True)
        conv_out = torch.nn.functional.gelu(taps["conv2"])[0].T.numpy()
    hidden = [h[0].numpy() for h in result.hidden_states]
    weights = arrays(module)
    with Runtime("cpu", threads=1) as rt:
        encoder = enc.Encoder(rt.upload(weights, dict.fromkeys(weights, "f32")), config, rt)
        out = encoder.forward(mel.astype(np.float32))
        isolated = encoder.layers_isolated([conv_out, hidden[1]])
    np.testing.assert_allclose(hidden[0], conv_out + weights["encoder.embed_positions.weight"],
                               atol=1e-12)
    assert_float32_close(out["conv_out"], conv_out)
    assert_float32_close(out["layer_0"], hidden[1])
    assert_float32_close(out["layer_1"], taps["layer_1"][0].numpy())
    assert_float32_close(out["enc_out"], result.last_hidden_state[0].numpy())
    assert_float32_close(isolated[0], hidden[1])
    assert_float32_close(isolated[1], taps["layer_1"][0].numpy())


def test_encoder_refuses_inputs_it_cannot_take(module, config):
    weights = arrays(module)
    with Runtime("cpu", threads=1) as rt:
        encoder = enc.Encoder(rt.upload(weights, dict.fromkeys(weights, "f32")), config, rt)
        with pytest.raises(AudioparityError, match=r"shape \[74, 20\]; expected \[T, 19\]"):
            encoder.forward(np.zeros((74, 20), np.float32))
        with pytest.raises(AudioparityError, match="76 frames give 38 encoder frames"):
            encoder.forward(np.zeros((76, 19), np.float32))
        with pytest.raises(AudioparityError, match="1 layer inputs for 2 layers"):
            encoder.layers_isolated([np.zeros((37, 48), np.float32)])


# --- config and checkpoint ---------------------------------------------------------------------

@pytest.mark.parametrize("key, value, message", [
    ("activation_function", "gelu_new", "activation_function='gelu_new' is not supported"),
    ("model_type", "wav2vec2", "model_type='wav2vec2'; expected 'whisper'"),
    ("d_model", "64", "'d_model' is \"64\"; expected an integer"),
    ("encoder_attention_heads", 5, "d_model=48 is not a multiple of encoder_attention_heads=5"),
    ("max_source_positions", 40, "gives 74 mel frames; WhisperEncoder takes exactly"),
])
def test_config_refuses_what_the_port_does_not_implement(key, value, message):
    with pytest.raises(AudioparityError, match=message):
        parse_config(small_config(**{key: value}), FEATURES, GENERATION)


@pytest.mark.parametrize("key, value, message", [
    ("feature_size", 80, "feature_size=80; expected num_mel_bins=19"),
    ("dither", 1e-4, "dither=0.0001 is not supported"),
])
def test_config_refuses_feature_extractor_settings(key, value, message):
    with pytest.raises(AudioparityError, match=message):
        parse_config(small_config(), {**FEATURES, key: value}, GENERATION)


def test_defaults_are_whisper_configs_and_extractors():
    """Keys left out take the transformers classes' defaults (save_pretrained omits them)."""
    config = parse_config({"model_type": "whisper"}, {}, {
        "decoder_start_token_id": 50258, "eos_token_id": 50257, "no_timestamps_token_id": 50363})
    hf, extractor = transformers.WhisperConfig(), transformers.WhisperFeatureExtractor()
    for key in ("num_mel_bins", "d_model", "encoder_layers", "encoder_attention_heads",
                "encoder_ffn_dim", "max_source_positions", "activation_function",
                "scale_embedding"):
        assert getattr(config.encoder, key) == getattr(hf, key), key
    for key in ("vocab_size", "decoder_layers", "decoder_attention_heads", "decoder_ffn_dim",
                "max_target_positions", "tie_word_embeddings"):
        assert getattr(config.decoder, key) == getattr(hf, key), key
    for key in ("feature_size", "sampling_rate", "hop_length", "chunk_length", "n_fft",
                "padding_value", "dither", "n_samples", "nb_max_frames"):
        assert getattr(config.feature_extractor, key) == getattr(extractor, key), key
    assert config.n_frames == 1500


def test_scale_embedding_is_accepted_because_whisper_does_not_apply_it(module):
    """``WhisperEncoder`` computes ``embed_scale`` and never uses it: the same weights give the
    same output with ``scale_embedding`` true (if transformers starts applying it, this fails and
    the config must refuse it until the port follows)."""
    config = transformers.WhisperConfig(**SMALL, scale_embedding=True)
    config._attn_implementation = "eager"
    scaled = transformers.WhisperModel(config).encoder.double().eval()
    scaled.load_state_dict(module.state_dict())
    assert scaled.embed_scale != 1.0
    mel = torch.from_numpy(np.random.default_rng(6).standard_normal((1, 19, 74)))
    with torch.no_grad():
        assert torch.equal(scaled(mel).last_hidden_state, module(mel).last_hidden_state)
    assert parse_config(small_config(scale_embedding=True), FEATURES,
                        GENERATION).encoder.scale_embedding


@pytest.fixture(scope="module")
def whisper_model_dir(tmp_path_factory):
    """A small ``WhisperModel`` (keys ``encoder.*``, ``decoder.*``) saved in bfloat16, and its
    state dict."""
    config = transformers.WhisperConfig(**SMALL)
    model = transformers.WhisperModel(config)
    redraw_weights(model, seed=7)
    model = model.to(torch.bfloat16)
    directory = tmp_path_factory.mktemp("whisper_model")
    model.save_pretrained(directory)
    transformers.WhisperFeatureExtractor(**FEATURES).save_pretrained(directory)
    (directory / "generation_config.json").write_text(json.dumps(GENERATION))
    return directory, {k: v.float() for k, v in model.state_dict().items()}


def plan(model: Path, weight_type: str) -> tuple[dict[str, str], list[str]]:
    """The storage types the driver gives the checkpoint's weights, and its notes."""
    whisper = Whisper()
    weights = whisper.weights(model, load_config(model))
    return storage_types(whisper, weights.shapes, weights.native, weight_type, {})


def uploaded(runtime: Runtime, model: Path, weight_type: str):
    """The checkpoint's weights uploaded by the driver at ``weight_type``."""
    return upload_weights(Whisper(), runtime, model, load_config(model),
                          RunSettings(weight_type, runtime.backend_name, {}))[0]


def test_a_whisper_model_checkpoint_reads_like_a_conditional_generation_one(whisper_model_dir):
    directory, state = whisper_model_dir
    config = load_config(directory)
    weights = read_weights(directory, config)
    assert list(weights) == list(expected_shapes(config))
    assert set(weights) == set(state)
    for name, value in weights.items():
        np.testing.assert_array_equal(value, state[name].numpy(), err_msg=name)
    storage, _ = plan(directory, "native")
    assert storage["encoder.layers.1.fc1.weight"] == "bf16"
    assert storage["decoder.layers.0.encoder_attn.k_proj.weight"] == "bf16"
    assert storage["decoder.embed_tokens.weight"] == "bf16"  # also the tied proj_out
    assert storage["encoder.conv1.weight"] == "f32"
    assert storage["decoder.embed_positions.weight"] == "f32"
    assert storage["encoder.layers.1.self_attn.q_proj.bias"] == "f32"


def test_q8_0_falls_back_to_f16_for_rows_it_cannot_hold(whisper_model_dir):
    directory, _ = whisper_model_dir
    storage, notes = plan(directory, "q8_0")
    # d_model 48 is no multiple of 32: every matmul weight with 48-wide rows stays f16
    assert storage["encoder.layers.0.self_attn.k_proj.weight"] == "f16"
    assert storage["encoder.layers.0.fc2.weight"] == "f16"  # rows of 80
    assert "encoder.layers.0.fc1.weight [80, 48]: q8_0 -> f16 (rows of 48 values, blocks of 32)" \
        in notes
    whisper = Whisper()
    assert storage_types(whisper, {"encoder.layers.0.fc1.weight": (256, 64)}, {}, "q8_0",
                         {}) == ({"encoder.layers.0.fc1.weight": "q8_0"}, [])


@pytest.mark.parametrize("damage, message", [
    ("drop", r"missing tensor 'encoder.layers.1.fc1.weight'; expected shape \[80, 48\]"),
    ("reshape", r"tensor 'encoder.layers.1.fc1.weight' has shape \[40, 96\], "
                r"expected \[80, 48\]"),
    ("nan", r"tensor 'encoder.layers.1.fc1.weight' \[80, 48\] holds 1 NaN and 0 infinite"),
    ("rename", r"holds neither of 'model.encoder.conv1.weight'"),
])
def test_damaged_checkpoint_names_the_tensor_and_shapes(whisper_model_dir, tmp_path, damage,
                                                        message):
    from safetensors.torch import load_file, save_file

    directory, _ = whisper_model_dir
    for name in ("config.json", "preprocessor_config.json", "generation_config.json"):
        shutil.copy(directory / name, tmp_path / name)
    state = load_file(directory / "model.safetensors")
    key = "encoder.layers.1.fc1.weight"
    if damage == "drop":
        del state[key]
    elif damage == "reshape":
        state[key] = state[key].reshape(40, 96)
    elif damage == "nan":
        state[key] = state[key].clone()
        state[key][3, 4] = float("nan")
    else:
        state = {"whisper." + k: v for k, v in state.items()}
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    config = load_config(tmp_path)
    with pytest.raises(AudioparityError, match=message):
        check_weights(tmp_path, config)
    with pytest.raises(AudioparityError, match=message), Runtime("cpu") as rt:
        uploaded(rt, tmp_path, "f32")


def test_a_missing_preprocessor_config_is_named(whisper_model_dir, tmp_path):
    directory, _ = whisper_model_dir
    shutil.copy(directory / "config.json", tmp_path / "config.json")
    shutil.copy(directory / "generation_config.json", tmp_path / "generation_config.json")
    with pytest.raises(AudioparityError, match="preprocessor_config.json: no such file"):
        load_config(tmp_path)
    (tmp_path / "preprocessor_config.json").write_text(json.dumps([1]))
    with pytest.raises(AudioparityError, match="expected a JSON object, got list"):
        load_config(tmp_path)


# --- the tiny fixture against its reference dump -----------------------------------------------

@pytest.fixture(scope="module")
def reference(whisper_reference) -> Dump:
    return Dump(whisper_reference)


def encoder_taps(model, reference: Dump, weight_type: str) -> dict[str, np.ndarray]:
    """The ggml encoder at ``weight_type`` on the reference's mel, end to end and isolated."""
    config = load_config(model)
    with Runtime("cpu", threads=1) as rt:
        encoder = enc.Encoder(uploaded(rt, model, weight_type), config, rt)
        taps = encoder.forward(reference.tensor("mel_features"))
        inputs = [reference.tensor("conv_out")] + [
            reference.tensor(f"layer_{i}") for i in range(config.n_layers - 1)]
        for i, out in enumerate(encoder.layers_isolated(inputs)):
            taps[f"layer_{i}_isolated"] = out
    return taps


def within(weight_type: str, name: str, candidate: np.ndarray, reference: np.ndarray) -> bool:
    entry = gate(weight_type, name)
    return (cosine(candidate, reference) >= entry.get("cosine_min", -1.0)
            and nmse(candidate, reference) <= entry["nmse_max"]
            and max_rel(candidate, reference) <= entry.get("max_rel_max", np.inf))


def test_f32_encoder_matches_the_reference_dump(whisper_model, reference):
    taps = encoder_taps(whisper_model, reference, "f32")
    assert set(taps) == {"conv_out", "layer_0", "layer_1", "enc_out", "layer_0_isolated",
                         "layer_1_isolated"}
    for name, out in taps.items():
        ref = reference.tensor(name.removesuffix("_isolated"))
        assert out.shape == ref.shape == (1500, 64), name
        assert within("f32", name, out, ref), (name, nmse(out, ref))
        assert nmse(out, ref) < 1e-11, name  # measured <= 4.3e-12 (conv_out)


def test_q8_0_encoder_meets_its_gates_against_the_q8_0_reference(whisper_model, whisper_reference,
                                                                 reference):
    """Against the q8_0 reference (torch computing as ggml's CPU does at q8_0) within the q8_0
    gates, and far closer to it than to the float32 reference, whose distance (the cost) is
    well above the f32 port's."""
    emulated = Dump(emulated_dir(whisper_reference, "q8_0"))
    taps = encoder_taps(whisper_model, emulated, "q8_0")
    f32 = encoder_taps(whisper_model, reference, "f32")
    for name, out in taps.items():
        stage = name.removesuffix("_isolated")
        own, f32_ref = emulated.tensor(stage), reference.tensor(stage)
        assert within("q8_0", name, out, own), (name, nmse(out, own))
        if name != "conv_out":  # f32 kernels: conv_out does not change
            assert nmse(out, f32_ref) > 100 * nmse(f32[name], f32_ref), name
            assert nmse(out, own) < nmse(out, f32_ref) / 10, name
    np.testing.assert_array_equal(taps["conv_out"], f32["conv_out"])
