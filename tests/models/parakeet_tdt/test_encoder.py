"""The ggml Parakeet-TDT encoder against NeMo: every block against the NeMo module it mirrors
(small random float64 modules), the weight loaders (NeMo and Hugging Face layouts), and the whole
encoder on the tiny fixture against the NeMo reference dump."""

from __future__ import annotations

import logging
import math
import re

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import storage_types
from audioparity.ggml import Runtime
from audioparity.models.parakeet_tdt import encoder as enc
from audioparity.models.parakeet_tdt import positions
from audioparity.models.parakeet_tdt.checkpoint import expected_shapes, read_state
from audioparity.models.parakeet_tdt.config import (
    EncoderConfig,
    from_nemo_config,
    load_config,
)
from audioparity.models.parakeet_tdt.layout import fold_batch_norm, to_graph_layout
from audioparity.models.parakeet_tdt.subsampling import conv_subsampling
from tests.models.parakeet_tdt import PARAKEET, assert_rows_equal_within_noise, uploaded

torch = pytest.importorskip("torch")

D, HEADS, KERNEL, CHANNELS, MELS = 48, 4, 9, 12, 40
CFG = EncoderConfig(feat_in=MELS, n_layers=1, d_model=D, subsampling="dw_striding",
                    subsampling_factor=8, subsampling_conv_channels=CHANNELS, n_heads=HEADS,
                    conv_kernel_size=KERNEL, xscaling=False)

#: transformers' ``convert_nemo_to_hf.py`` (NEMO_TO_HF_WEIGHT_MAPPING + NEMO_TDT_WEIGHT_MAPPING),
#: the independent truth the Hugging Face loader must invert.
NEMO_TO_HF = {
    r"encoder\.pre_encode\.conv\.": r"encoder.subsampling.layers.",
    r"encoder\.pre_encode\.out\.": r"encoder.subsampling.linear.",
    r"encoder\.pos_enc\.": r"encoder.encode_positions.",
    r"encoder\.layers\.(\d+)\.conv\.batch_norm\.": r"encoder.layers.\1.conv.norm.",
    r"linear_([kv])": r"\1_proj",
    r"linear_out": r"o_proj",
    r"linear_q": r"q_proj",
    r"pos_bias_([uv])": r"bias_\1",
    r"linear_pos": r"relative_k_proj",
    r"decoder\.prediction\.embed\.": r"decoder.embedding.",
    r"decoder\.prediction\.dec_rnn\.lstm\.": r"decoder.lstm.",
    r"joint\.enc\.": r"encoder_projector.",
    r"joint\.pred\.": r"decoder.decoder_projector.",
    r"joint\.joint_net\.2\.": r"joint.head.",
}


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def nmse(candidate: np.ndarray, reference: np.ndarray) -> float:
    """Σ(a−b)²/Σb² (ggml's backend tests), float64."""
    diff = candidate.astype(np.float64) - reference.astype(np.float64)
    return float((diff**2).sum() / (reference.astype(np.float64) ** 2).sum())


def randomize(module, seed: int):
    """Seeded non-degenerate parameters: matrices N(0, 1/fan_in), norm weights 1 + 0.2 N,
    other vectors (biases, pos_bias_u/v) 0.2 N, BatchNorm statistics random. Float64, eval."""
    gen = torch.Generator().manual_seed(seed)
    module.double().eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            draw = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            if param.ndim >= 2:
                draw /= math.sqrt(param.numel() / param.shape[0])
            elif "norm" in name and name.endswith("weight"):
                draw = 1 + 0.2 * draw
            else:
                draw *= 0.2
            param.copy_(draw)
        for sub in module.modules():
            if isinstance(sub, torch.nn.BatchNorm1d):
                sub.running_mean.copy_(0.2 * torch.randn(sub.num_features, generator=gen))
                sub.running_var.copy_(0.5 + torch.rand(sub.num_features, generator=gen))
    return module


def graph_arrays(module, prefix: str) -> dict[str, np.ndarray]:
    """A NeMo module's float tensors under ``prefix``, in the layout the graphs use."""
    state = {prefix + k: v.detach().to(torch.float32).numpy()
             for k, v in module.state_dict().items() if v.is_floating_point()}
    return to_graph_layout(state, CFG.batch_norm_eps)


def run_block(arrays: dict[str, np.ndarray], inputs: dict[str, np.ndarray], build) -> np.ndarray:
    """Build ``build(ctx, weights, *inputs)`` in one f32 graph and return its ``[T, D]`` output."""
    with Runtime("cpu", threads=1) as rt:
        weights = rt.upload(arrays, dict.fromkeys(arrays, "f32"))
        with rt.graph() as g:
            tensors = [g.input(name, value.astype(np.float32)) for name, value in inputs.items()]
            g.output("y", build(g.ctx, weights, *tensors), ndim=2)
            return g.compute()["y"]


def assert_close_to_float64(candidate: np.ndarray, reference: np.ndarray, limit: float = 1e-10):
    assert candidate.shape == reference.shape
    assert nmse(candidate, reference) < limit, nmse(candidate, reference)
    assert cosine(candidate, reference) > 0.99999


@pytest.fixture(scope="module")
def nemo():
    """NeMo's submodules (importing them takes seconds)."""
    from nemo.collections.asr.parts.submodules import (
        conformer_modules,
        multi_head_attention,
        subsampling,
    )

    return conformer_modules, multi_head_attention, subsampling


def nemo_pos_emb(nemo, n_frames: int, d_model: int = D) -> np.ndarray:
    module = nemo[1].RelPositionalEncoding(d_model=d_model, dropout_rate=0.0, max_len=5000)
    module.extend_pe(n_frames, "cpu", torch.float32)
    _, pos_emb = module(torch.zeros(1, n_frames, d_model))
    return pos_emb[0].numpy()


@pytest.mark.parametrize("n_frames", [1, 2, 37, 400])
def test_rel_pos_encoding_matches_nemo(nemo, n_frames):
    host = positions.rel_pos_encoding(n_frames, D)
    ref = nemo_pos_emb(nemo, n_frames)
    assert host.shape == ref.shape == (2 * n_frames - 1, D)
    # one float32 ulp of the largest angle (see rel_pos_encoding), plus one ulp of the value
    assert np.abs(host - ref).max() <= n_frames * 2.0**-23 + 2.0**-23
    np.testing.assert_array_equal(host[n_frames - 1, 1::2], 1.0)  # position 0: cos = 1


def test_conv_subsampling_matches_nemo(nemo):
    module = randomize(nemo[2].ConvSubsampling(
        subsampling="dw_striding", subsampling_factor=8, feat_in=MELS, feat_out=D,
        conv_channels=CHANNELS, activation=torch.nn.ReLU()), seed=1)
    mel = np.random.default_rng(2).standard_normal((101, MELS))
    with torch.no_grad():
        ref, length = module(torch.from_numpy(mel)[None], torch.tensor([101]))
    out = run_block(graph_arrays(module, "encoder.pre_encode."), {"mel": mel},
                    lambda ctx, w, x: conv_subsampling(ctx, w, CFG, x))
    assert out.shape[0] == CFG.subsampled_length(101) == int(length[0]) == 13
    assert_close_to_float64(out, ref[0].numpy())


@pytest.mark.parametrize("subsampling", ["dw_striding", "striding"])
@pytest.mark.parametrize("factor", [2, 4, 8, 16])
def test_every_subsampling_matches_nemo_conformer_encoder(subsampling, factor):
    """Each subsampling the port claims, built by NeMo's ``ConformerEncoder`` (striding with
    ``subsampling_conv_channels: -1``, NeMo's d_model default) and read through the config: the
    checkpoint's subsampling tensors are the ones the port expects, and ``pre_encode`` and
    ``enc_out`` match NeMo's (x2 crashed in ggml_can_mul_mat before the flattening step)."""
    from nemo.collections.asr.modules import ConformerEncoder

    from audioparity.models.parakeet_tdt.checkpoint import expected_shapes

    channels = -1 if subsampling == "striding" else CHANNELS
    encoder_cfg = {"feat_in": MELS, "n_layers": 1, "d_model": D, "subsampling": subsampling,
                   "subsampling_factor": factor, "subsampling_conv_channels": channels,
                   "n_heads": HEADS, "conv_kernel_size": KERNEL, "att_context_size": [-1, -1],
                   "dropout": 0.0, "dropout_pre_encoder": 0.0, "dropout_emb": 0.0}
    module = randomize(ConformerEncoder(**encoder_cfg), seed=factor)
    taps = {}
    module.pre_encode.register_forward_hook(
        lambda mod, args, out: taps.__setitem__("pre_encode", out[0][0].numpy()))
    mel = np.random.default_rng(factor).standard_normal((101, MELS))
    with torch.no_grad():
        enc_out, length = module(audio_signal=torch.from_numpy(mel.T.copy())[None],
                                 length=torch.tensor([101]))
    config = from_nemo_config({
        "preprocessor": {}, "encoder": encoder_cfg,
        "decoder": {"vocab_size": 4, "prednet": {"pred_hidden": 8}},
        "joint": {"num_classes": 4, "jointnet": {"joint_hidden": 8, "encoder_hidden": D,
                                                 "pred_hidden": 8}},
    })
    assert config.encoder.subsampling_conv_channels == module.pre_encode._conv_channels
    ours = {k: v for k, v in expected_shapes(config).items() if ".pre_encode." in k}
    assert ours == {f"encoder.{k}": tuple(v.shape) for k, v in module.state_dict().items()
                    if k.startswith("pre_encode.")}
    arrays = graph_arrays(module, "encoder.")
    with Runtime("cpu", threads=1) as rt:
        weights = rt.upload(arrays, dict.fromkeys(arrays, "f32"))
        out = enc.Encoder(weights, config, rt).forward(mel.astype(np.float32))
    assert out["enc_out"].shape[0] == config.encoder.subsampled_length(101) == int(length[0])
    assert_close_to_float64(out["pre_encode"], taps["pre_encode"])
    assert_close_to_float64(out["enc_out"], enc_out[0].T.numpy())


def shifted_windows(chunks):
    """A planted fault of the chunking: each window after the first starts one factor later and
    keeps one frame less of its start, so the frame it keeps first reads the window's zero
    padding instead of the frames before it."""
    def planted(cfg, n_mel_frames, n_mels):
        for index, (frames, kept) in enumerate(chunks(cfg, n_mel_frames, n_mels)):
            shift = cfg.subsampling_factor if index else 0
            yield (slice(frames.start + shift, frames.stop),
                   slice(kept.start - bool(shift), kept.stop - bool(shift)))
    return planted


@pytest.mark.parametrize("subsampling", ["dw_striding", "striding"])
@pytest.mark.parametrize("factor", [2, 4, 8, 16])
@pytest.mark.parametrize("n_mel", [101, 96, 7])
def test_pre_encode_in_chunks_is_the_whole_clip_s(subsampling, factor, n_mel, monkeypatch):
    """The subsampling in chunks of 1, 2 or 3 output frames (the budget shrunk to their size),
    for lengths that are and are not multiples of the factor: each window starts on a multiple
    of the factor and drops the frame its padding reached, so every frame equals the one graph
    of the whole clip's within float32 summation noise (a chunk's matmuls block its frames
    otherwise), and NeMo's float64 output as closely; within the budget it is that graph, bit
    for bit. A window one factor late breaks the bound."""
    from nemo.collections.asr.modules import ConformerEncoder

    from audioparity.dumping import memory
    from audioparity.models.parakeet_tdt import subsampling as sub

    encoder_cfg = {"feat_in": MELS, "n_layers": 1, "d_model": D, "subsampling": subsampling,
                   "subsampling_factor": factor, "subsampling_conv_channels": CHANNELS,
                   "n_heads": HEADS, "conv_kernel_size": KERNEL, "att_context_size": [-1, -1]}
    module = randomize(ConformerEncoder(**encoder_cfg), seed=factor)
    config = from_nemo_config({
        "preprocessor": {}, "encoder": encoder_cfg,
        "decoder": {"vocab_size": 4, "prednet": {"pred_hidden": 8}},
        "joint": {"num_classes": 4, "jointnet": {"joint_hidden": 8, "encoder_hidden": D,
                                                 "pred_hidden": 8}},
    })
    mel = np.random.default_rng(n_mel).standard_normal((n_mel, MELS))
    with torch.no_grad():
        nemo_out, _ = module.pre_encode(torch.from_numpy(mel)[None], torch.tensor([n_mel]))
    arrays = graph_arrays(module, "encoder.")
    n_out = config.encoder.subsampled_length(n_mel)
    with Runtime("cpu", threads=1) as rt:
        encoder = enc.Encoder(rt.upload(arrays, dict.fromkeys(arrays, "f32")), config, rt)
        whole = encoder.pre_encode(mel.astype(np.float32))
        assert len(list(sub.pre_encode_chunks(config.encoder, n_mel, MELS))) == 1
        for rows in (1, 2, 3):
            monkeypatch.setattr(memory, "SUBSAMPLING_CHUNK_BYTES",
                                rows * sub.row_bytes(config.encoder, MELS))
            chunks = list(sub.pre_encode_chunks(config.encoder, n_mel, MELS))
            assert len(chunks) == -(-n_out // rows)
            assert chunks[0][0].start == 0 and chunks[-1][0].stop == n_mel
            assert all(frames.start % factor == 0 for frames, _ in chunks)
            chunked = encoder.pre_encode(mel.astype(np.float32))
            assert_rows_equal_within_noise(chunked, whole)
            assert_close_to_float64(chunked, nemo_out[0].numpy())
        if n_out > 1:  # in chunks of one frame
            monkeypatch.setattr(memory, "SUBSAMPLING_CHUNK_BYTES",
                                sub.row_bytes(config.encoder, MELS))
            monkeypatch.setattr(enc, "pre_encode_chunks", shifted_windows(sub.pre_encode_chunks))
            with pytest.raises(AssertionError):
                assert_rows_equal_within_noise(encoder.pre_encode(mel.astype(np.float32)), whole)
    assert_close_to_float64(whole, nemo_out[0].numpy())


@pytest.fixture(scope="module", params=[False, True], ids=["no_bias", "bias"])
def layer(request, nemo):
    """A float64 NeMo ConformerLayer with random weights, with and without linear/conv biases."""
    module = nemo[0].ConformerLayer(d_model=D, d_ff=4 * D, n_heads=HEADS,
                                    conv_kernel_size=KERNEL, dropout=0.0, dropout_att=0.0,
                                    use_bias=request.param)
    return randomize(module, seed=3)


def layer_inputs(nemo, n_frames: int = 23):
    x = np.random.default_rng(4).standard_normal((n_frames, D))
    return x, nemo_pos_emb(nemo, n_frames).astype(np.float64)


def test_feed_forward_matches_nemo(nemo, layer):
    x, _ = layer_inputs(nemo)
    with torch.no_grad():
        ref = layer.feed_forward1(torch.from_numpy(x)).numpy()
    out = run_block(graph_arrays(layer.feed_forward1, "ff."), {"x": x},
                    lambda ctx, w, t: enc.feed_forward(ctx, w, "ff.", t))
    assert_close_to_float64(out, ref)


@pytest.mark.parametrize("n_frames", [1, 23])
def test_rel_pos_attention_matches_nemo(nemo, layer, n_frames):
    x, pos_emb = layer_inputs(nemo, n_frames)
    with torch.no_grad():
        t = torch.from_numpy(x)[None]
        ref = layer.self_attn(t, t, t, None, torch.from_numpy(pos_emb)[None])[0].numpy()
    out = run_block(graph_arrays(layer.self_attn, "att."), {"x": x, "pos": pos_emb},
                    lambda ctx, w, t, p: enc.rel_pos_attention(ctx, w, "att.", CFG, t,
                                                               enc.AttentionInputs(p)))
    assert_close_to_float64(out, ref)


def test_flash_attention_path_matches_nemo_within_f16_mask_rounding(nemo, layer):
    x, pos_emb = layer_inputs(nemo)
    with torch.no_grad():
        t = torch.from_numpy(x)[None]
        ref = layer.self_attn(t, t, t, None, torch.from_numpy(pos_emb)[None])[0].numpy()
    out = run_block(graph_arrays(layer.self_attn, "att."), {"x": x, "pos": pos_emb},
                    lambda ctx, w, t, p: enc.rel_pos_attention(
                        ctx, w, "att.", CFG, t, enc.AttentionInputs(p, flash_attention=True)))
    assert_close_to_float64(out, ref, limit=1e-5)


@pytest.mark.parametrize("n_frames, context", [(23, 4), (1, 4), (6, 8), (40, 8)])
def test_local_attention_matches_nemo_longformer(nemo, layer, n_frames, context):
    """rel_pos_local_attn: NeMo's RelPositionMultiHeadAttentionLongformer (sliding chunks,
    time padded to a multiple of 2w, LocalAttRelPositionalEncoding's 2w+1 positions) against
    the band-masked full attention, for T beyond the window, inside it, and not a multiple of
    2w; and the band matters: full-context attention differs."""
    mha = nemo[1]
    module = mha.RelPositionMultiHeadAttentionLongformer(
        n_head=HEADS, n_feat=D, dropout_rate=0.0, pos_bias_u=None, pos_bias_v=None,
        att_context_size=[context, context], use_bias=layer.self_attn.linear_q.bias is not None)
    module.load_state_dict(layer.self_attn.state_dict())
    module.double().eval()
    pos_enc = mha.LocalAttRelPositionalEncoding(att_context_size=[context, context],
                                                d_model=D, dropout_rate=0.0)
    pos_enc.extend_pe(n_frames, "cpu", torch.float32)
    x = np.random.default_rng(4).standard_normal((n_frames, D))
    _, pos_emb = pos_enc(torch.zeros(1, n_frames, D))
    local = positions.local_rel_pos_encoding(context, D)
    assert np.abs(local - pos_emb[0].numpy()).max() <= 2 * context * 2.0**-23 + 2.0**-23
    with torch.no_grad():
        t = torch.from_numpy(x)[None]
        pad_mask = torch.zeros(1, n_frames, dtype=torch.bool)
        ref = module(t, t, t, pad_mask, pos_emb.double())[0].numpy()
    cfg = EncoderConfig(feat_in=MELS, n_layers=1, d_model=D, n_heads=HEADS,
                        self_attention_model="rel_pos_local_attn",
                        att_context_size=(context, context))
    grid = positions.local_positions_on_full_grid(pos_emb[0].numpy().astype(np.float64), n_frames)
    mask = positions.band_mask(n_frames, context)
    out = run_block(graph_arrays(layer.self_attn, "att."),
                    {"x": x, "pos": grid, "mask": mask},
                    lambda ctx, w, t, p, m: enc.rel_pos_attention(ctx, w, "att.", cfg, t,
                                                                  enc.AttentionInputs(p, m)))
    assert_close_to_float64(out, ref)
    if n_frames > context + 1:
        with torch.no_grad():
            full = layer.self_attn(t, t, t, None, torch.from_numpy(
                nemo_pos_emb(nemo, n_frames).astype(np.float64))[None])[0].numpy()
        assert nmse(full, ref) > 1e-3


def test_rel_shift_view_equals_nemo_rel_shift(nemo):
    n_frames = 6
    bd = np.random.default_rng(5).standard_normal((HEADS, n_frames, 2 * n_frames - 1))
    ref = nemo[1].RelPositionMultiHeadAttention.rel_shift(None, torch.from_numpy(bd)[None])[0]
    with Runtime("cpu") as rt, rt.graph() as g:
        shifted = enc.rel_shift(g.ctx, g.input("bd", bd.astype(np.float32)), n_frames)
        g.output("y", shifted, ndim=3)
        out = g.compute()["y"]
    np.testing.assert_array_equal(out, ref[..., :n_frames].numpy().astype(np.float32))


@pytest.mark.parametrize("n_frames", [1, 23])
def test_conv_module_matches_nemo(nemo, layer, n_frames):
    x, _ = layer_inputs(nemo, n_frames)
    with torch.no_grad():
        ref = layer.conv(torch.from_numpy(x)[None])[0].numpy()
    out = run_block(graph_arrays(layer.conv, "encoder.layers.0.conv."), {"x": x},
                    lambda ctx, w, t: enc.conv_module(ctx, w, "encoder.layers.0.conv.", CFG, t))
    assert_close_to_float64(out, ref)


def test_conformer_layer_matches_nemo(nemo, layer):
    x, pos_emb = layer_inputs(nemo)
    with torch.no_grad():
        ref = layer(torch.from_numpy(x)[None], pos_emb=torch.from_numpy(pos_emb)[None])
    out = run_block(graph_arrays(layer, "encoder.layers.0."), {"x": x, "pos": pos_emb},
                    lambda ctx, w, t, p: enc.conformer_layer(ctx, w, 0, CFG, t,
                                                             enc.AttentionInputs(p)))
    assert_close_to_float64(out, ref[0].numpy())


def test_encoder_with_xscaling_and_biases_matches_nemo_conformer_encoder():
    """The Encoder object on a NeMo ``ConformerEncoder`` with the switches v3 leaves off
    (xscaling, linear/conv biases): every tap, end to end and layer by layer."""
    from nemo.collections.asr.modules import ConformerEncoder

    encoder_cfg = {"feat_in": MELS, "n_layers": 2, "d_model": D, "subsampling": "dw_striding",
                   "subsampling_factor": 8, "subsampling_conv_channels": CHANNELS,
                   "n_heads": HEADS, "conv_kernel_size": KERNEL, "xscaling": True,
                   "use_bias": True, "att_context_size": [-1, -1], "dropout": 0.0,
                   "dropout_pre_encoder": 0.0, "dropout_emb": 0.0, "dropout_att": 0.0}
    module = randomize(ConformerEncoder(**encoder_cfg), seed=8)
    taps = {}
    module.pre_encode.register_forward_hook(
        lambda mod, args, out: taps.__setitem__("pre_encode", out[0][0].numpy()))
    for i, block in enumerate(module.layers):
        block.register_forward_hook(
            lambda mod, args, out, i=i: taps.__setitem__(f"layer_{i}", out[0].numpy()))
    mel = np.random.default_rng(9).standard_normal((90, MELS))
    with torch.no_grad():
        enc_out, _ = module(audio_signal=torch.from_numpy(mel.T.copy())[None],
                            length=torch.tensor([90]))
    config = from_nemo_config({
        "preprocessor": {}, "encoder": encoder_cfg,
        "decoder": {"vocab_size": 4, "prednet": {"pred_hidden": 8}},
        "joint": {"num_classes": 4, "num_extra_outputs": 0,
                  "jointnet": {"joint_hidden": 8, "encoder_hidden": D, "pred_hidden": 8}},
    })
    arrays = graph_arrays(module, "encoder.")
    with Runtime("cpu", threads=1) as rt:
        weights = rt.upload(arrays, dict.fromkeys(arrays, "f32"))
        encoder = enc.Encoder(weights, config, rt)
        out = encoder.forward(mel.astype(np.float32))
        isolated = list(encoder.layers_isolated([taps["pre_encode"], taps["layer_0"]],
                                                out["pos_emb"]))
    assert_close_to_float64(out["enc_out"], enc_out[0].T.numpy())
    for name in ("pre_encode", "layer_0", "layer_1"):
        assert_close_to_float64(out[name], taps[name])
    for i, layer_out in enumerate(isolated):
        assert_close_to_float64(layer_out, taps[f"layer_{i}"])


def test_fold_batch_norm_equals_conv_then_batch_norm():
    rng = np.random.default_rng(6)
    conv = torch.nn.Conv1d(8, 8, KERNEL, padding=4, groups=8).double()
    norm = torch.nn.BatchNorm1d(8, eps=1e-3).double().eval()
    with torch.no_grad():
        for tensor in (norm.weight, norm.bias, norm.running_mean):
            tensor.copy_(torch.from_numpy(rng.standard_normal(8)))
        norm.running_var.copy_(torch.from_numpy(rng.uniform(0.5, 1.5, 8)))
        x = torch.from_numpy(rng.standard_normal((1, 8, 30)))
        ref = norm(conv(x))[0].numpy()
        weight, bias = fold_batch_norm(conv.weight.numpy(), conv.bias.numpy(),
                                       {k: v.numpy() for k, v in norm.state_dict().items()},
                                       norm.eps)
        folded = torch.nn.functional.conv1d(x, torch.from_numpy(weight).double(),
                                            torch.from_numpy(bias).double(), padding=4, groups=8)
    np.testing.assert_allclose(folded[0].numpy(), ref, rtol=1e-5, atol=1e-6)


def test_config_rejects_architectures_the_port_does_not_implement(parakeet_model):
    import tarfile

    import yaml

    with tarfile.open(parakeet_model) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_config.yaml"))
        cfg = yaml.safe_load(tar.extractfile(member))
    assert from_nemo_config(cfg).encoder.subsampling == "dw_striding"
    cfg["encoder"]["self_attention_model"] = "rel_pos_local_attn"
    with pytest.raises(AudioparityError, match=r"att_context_size: \[-1, -1\] is not supported"):
        from_nemo_config(cfg)
    cfg["encoder"]["att_context_size"] = [8, 4]
    with pytest.raises(AudioparityError, match=r"att_context_size: \[8, 4\] is not supported"):
        from_nemo_config(cfg)
    cfg["encoder"]["att_context_size"] = [[8, 8], [8, 8]]  # multi-lookahead
    with pytest.raises(AudioparityError, match=r"att_context_size: \[\[8, 8\], \[8, 8\]\] is not"):
        from_nemo_config(cfg)
    cfg["encoder"]["att_context_size"] = [8, 8]
    assert from_nemo_config(cfg).encoder.local_context == 8
    cfg["encoder"]["global_tokens"] = 1
    with pytest.raises(AudioparityError, match="encoder.global_tokens: 1 is not"):
        from_nemo_config(cfg)
    cfg["encoder"]["global_tokens"] = 0
    cfg["encoder"]["self_attention_model"] = "abs_pos"
    with pytest.raises(AudioparityError, match="self_attention_model: abs_pos is not"):
        from_nemo_config(cfg)


def to_hf_name(name: str) -> str:
    for pattern, replacement in NEMO_TO_HF.items():
        name = re.sub(pattern, replacement, name)
    return name


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    """A small random transformers ``ParakeetForTDT`` saved in bfloat16 (config.json +
    model.safetensors), and its state dict."""
    transformers = pytest.importorskip("transformers")
    hf_config = transformers.ParakeetTDTConfig(
        vocab_size=33, decoder_hidden_size=24, num_decoder_layers=1, durations=[0, 1, 2],
        encoder_config={
            "hidden_size": D, "num_hidden_layers": 2, "num_attention_heads": HEADS,
            "intermediate_size": 4 * D, "conv_kernel_size": KERNEL, "subsampling_factor": 8,
            "subsampling_conv_channels": CHANNELS, "num_mel_bins": MELS, "scale_input": False,
            "attention_bias": True, "convolution_bias": True,
        },
    )
    torch.manual_seed(7)
    model = transformers.ParakeetForTDT(hf_config).to(torch.bfloat16)
    directory = tmp_path_factory.mktemp("hf_parakeet")
    model.save_pretrained(directory)
    return directory, {k: v.float() for k, v in model.state_dict().items()}


def test_hugging_face_checkpoint_reads_as_nemo(hf_checkpoint):
    directory, hf_state = hf_checkpoint
    config = load_config(directory)
    assert (config.encoder.d_model, config.encoder.n_layers, config.encoder.d_ff) == (D, 2, 4 * D)
    assert (config.decoder.vocab_size, config.joint.joint_hidden, config.durations) == (
        32, 24, (0, 1, 2))
    state, native = read_state(directory)
    expected = expected_shapes(config)
    for name, shape in expected.items():
        hf_name = to_hf_name(name)
        assert state[name].shape == shape, name
        np.testing.assert_array_equal(state[name], hf_state[hf_name].numpy(), err_msg=name)
        assert native[name] == "bf16"
    checkpoint = PARAKEET.weights(directory, config)
    try:
        storage, _ = storage_types(PARAKEET, checkpoint.shapes, checkpoint.native, "native",
                                   {"conv_weight_type": "f32"})
    finally:
        checkpoint.close()
    assert storage["encoder.layers.1.self_attn.linear_pos.weight"] == "bf16"
    assert storage["encoder.layers.1.self_attn.pos_bias_u"] == "f32"
    assert storage["encoder.layers.1.conv.depthwise_conv.weight"] == "f32"


@pytest.mark.parametrize("damage, message", [
    ("drop", r"missing tensor 'encoder.layers.1.self_attn.linear_pos.weight'.*\[48, 48\]"),
    ("reshape", r"'encoder.layers.1.self_attn.linear_pos.weight' has shape \[24, 96\], "
                r"expected \[48, 48\]"),
])
def test_damaged_checkpoint_names_the_tensor_and_shapes(hf_checkpoint, tmp_path, damage,
                                                        message):
    import shutil

    from safetensors.torch import save_file

    directory, hf_state = hf_checkpoint
    shutil.copy(directory / "config.json", tmp_path / "config.json")
    key = to_hf_name("encoder.layers.1.self_attn.linear_pos.weight")
    state = dict(hf_state)
    if damage == "drop":
        del state[key]
    else:
        state[key] = state[key].reshape(24, 96)
    save_file({k: v.contiguous() for k, v in state.items()}, tmp_path / "model.safetensors")
    with pytest.raises(AudioparityError, match=message):
        PARAKEET.weights(tmp_path, load_config(tmp_path))


@pytest.fixture(scope="module")
def reference(parakeet_reference) -> Dump:
    return Dump(parakeet_reference)


@pytest.fixture(scope="module")
def tiny(parakeet_model):
    return parakeet_model, load_config(parakeet_model)


def encoder_taps(tiny, reference, matmul: str, conv: str = "f32", flash: bool = False):
    model, config = tiny
    with Runtime("cpu", threads=1) as rt:
        weights = uploaded(rt, model, matmul, conv)
        encoder = enc.Encoder(weights, config, rt, flash_attention=flash)
        taps = encoder.forward(reference.tensor("mel_features"))
        inputs = [reference.tensor("pre_encode")] + [
            reference.tensor(f"layer_{i}") for i in range(config.encoder.n_layers - 1)]
        for i, out in enumerate(encoder.layers_isolated(inputs, reference.tensor("pos_emb"))):
            taps[f"layer_{i}_isolated"] = out
    return taps


@pytest.mark.slow
def test_f32_encoder_matches_nemo_reference_dump(tiny, reference):
    taps = encoder_taps(tiny, reference, "f32")
    n_layers = tiny[1].encoder.n_layers
    names = ["pre_encode", "pos_emb", "enc_out"] + [f"layer_{i}" for i in range(n_layers)]
    for name in names + [f"layer_{i}_isolated" for i in range(n_layers)]:
        ref = reference.tensor(name.removesuffix("_isolated"))
        assert taps[name].shape == ref.shape, name
        assert cosine(taps[name], ref) >= 0.99999, name
        assert nmse(taps[name], ref) < 1e-9, (name, nmse(taps[name], ref))


@pytest.mark.slow
def test_a_layer_that_takes_the_progress_time_logs_one_line(tiny, reference, monkeypatch,
                                                           caplog):
    """A layer that takes ``PROGRESS_SECONDS`` or more logs a line, end to end and isolated (a
    long clip's encoder runs for an hour); the fixture's layers, under it, log none."""
    model, config = tiny
    mel, n_layers = reference.tensor("mel_features"), config.encoder.n_layers
    inputs = [reference.tensor("pre_encode")] + [
        reference.tensor(f"layer_{i}") for i in range(n_layers - 1)]

    def progress_lines(encoder) -> list[str]:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="audioparity"):
            encoder.forward(mel)
            list(encoder.layers_isolated(inputs, reference.tensor("pos_emb")))
        return [r.getMessage() for r in caplog.records
                if r.getMessage().startswith("parakeet encoder:")]

    with Runtime("cpu", threads=1) as rt:
        encoder = enc.Encoder(uploaded(rt, model), config, rt)
        assert progress_lines(encoder) == []
        monkeypatch.setattr(enc, "PROGRESS_SECONDS", 0.0)
        lines = progress_lines(encoder)
    frames = reference.tensor("enc_out").shape[0]
    expected = [f"parakeet encoder: layer_{i} of {n_layers} layers (T'={frames}) in 0 s"
                for i in range(n_layers)]
    assert lines == 2 * expected


@pytest.mark.slow
@pytest.mark.parametrize("matmul, conv", [("f16", "f32"), ("bf16", "f32"), ("q8_0", "f32"),
                                          ("f32", "f16")])
def test_reduced_precision_encoders_run_and_stay_close(tiny, reference, matmul, conv):
    taps = encoder_taps(tiny, reference, matmul, conv)
    for name in ("enc_out", "layer_0_isolated"):
        assert np.isfinite(taps[name]).all(), name
        assert cosine(taps[name], reference.tensor(name.removesuffix("_isolated"))) > 0.99, name


@pytest.mark.slow
def test_flash_attention_encoder_matches_nemo_reference_dump(tiny, reference):
    taps = encoder_taps(tiny, reference, "f32", flash=True)
    assert cosine(taps["enc_out"], reference.tensor("enc_out")) >= 0.99999


def test_isolated_layers_want_one_input_per_layer_before_any_runs(tiny):
    model, config = tiny
    n_layers = config.encoder.n_layers
    x = np.zeros((12, config.encoder.d_model), np.float32)
    with Runtime("cpu") as rt:
        encoder = enc.Encoder(uploaded(rt, model), config, rt)
        pos_emb = encoder.positions(12 * config.encoder.subsampling_factor)
        with pytest.raises(AudioparityError, match=f"^{n_layers + 1} layer inputs for "
                                                    f"{n_layers} layers$"):
            next(encoder.layers_isolated([x] * (n_layers + 1), pos_emb))


def test_encoder_rejects_mel_of_the_wrong_width(tiny):
    model, config = tiny
    with Runtime("cpu") as rt:
        weights = uploaded(rt, model)
        with pytest.raises(AudioparityError, match=r"expected \[T, 128\]"):
            enc.Encoder(weights, config, rt).forward(np.zeros((50, 80), np.float32))
