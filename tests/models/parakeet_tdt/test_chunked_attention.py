"""Attention in chunks of query rows, on both sides: NeMo's ``RelPositionMultiHeadAttention``
as the reference runs it (:func:`~audioparity.models.parakeet_tdt.chunked_attention.
ChunkedRelPosAttention`) and the port's ``rel_pos_attention``, each against itself in one
chunk. Several chunks must give every row as one chunk does, within float32 summation noise; a
chunk that reads its positional rows one column off fails these bounds by orders of
magnitude."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audioparity.dumping.artifacts import Dump
from audioparity.ggml import Runtime
from audioparity.models.parakeet_tdt import encoder as enc
from audioparity.models.parakeet_tdt import positions
from audioparity.models.parakeet_tdt.config import load_config
from tests.models.parakeet_tdt import assert_rows_equal_within_noise, reference_dump, uploaded

torch = pytest.importorskip("torch")
pytest.importorskip("nemo.collections.asr")

D, HEADS, FRAMES = 48, 4, 23
# --- NeMo's attention, as the reference runs it ------------------------------------------------

@pytest.fixture(scope="module", params=[False, True], ids=["matmul", "sdpa"])
def nemo_attention(request):
    """A float32 NeMo RelPositionMultiHeadAttention with random weights, with and without
    ``use_pytorch_sdpa``, and its inputs: T frames of which the last is padding (masked, as
    NeMo masks the padded frame that survives subsampling), pos_emb ``[1, 2T-1, D]``."""
    from nemo.collections.asr.parts.submodules.multi_head_attention import (
        RelPositionalEncoding,
        RelPositionMultiHeadAttention,
    )

    gen = torch.Generator().manual_seed(5)
    module = RelPositionMultiHeadAttention(HEADS, D, 0.0, None, None,
                                           use_pytorch_sdpa=request.param).eval()
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(0.3 * torch.randn(param.shape, generator=gen))
    x = torch.randn(1, FRAMES, D, generator=gen)
    encoding = RelPositionalEncoding(D, 0.0, max_len=100)
    encoding.extend_pe(FRAMES, "cpu", torch.float32)
    _, pos_emb = encoding(torch.zeros(1, FRAMES, D))
    padded = torch.arange(FRAMES) >= FRAMES - 1
    mask = (padded[None, :] | padded[:, None])[None]
    return module, x, mask, pos_emb


@pytest.mark.parametrize("rows", [1, 3, 7, FRAMES - 1])
def test_nemo_attention_in_chunks_equals_nemo_forward(nemo_attention, rows):
    from audioparity.models.parakeet_tdt.chunked_attention import ChunkedRelPosAttention

    module, x, mask, pos_emb = nemo_attention
    calls: list[tuple[int, int]] = []
    with torch.inference_mode():
        whole = module(x, x, x, mask, pos_emb).numpy()
        chunked = ChunkedRelPosAttention(module, rows, calls)(x, x, x, mask, pos_emb).numpy()
    assert calls == [(FRAMES, rows)]
    assert_rows_equal_within_noise(chunked, whole)


def test_nemo_attention_in_one_chunk_is_nemo_forward_bit_for_bit(nemo_attention):
    """A clip within the budget (the default rows: all of them here) runs NeMo's own calls."""
    from audioparity.models.parakeet_tdt.chunked_attention import ChunkedRelPosAttention

    module, x, mask, pos_emb = nemo_attention
    with torch.inference_mode():
        whole = module(x, x, x, mask, pos_emb)
        for rows in (None, FRAMES, 10 * FRAMES):
            torch.testing.assert_close(
                ChunkedRelPosAttention(module, rows)(x, x, x, mask, pos_emb),
                whole, rtol=0, atol=0)


def test_reference_dump_in_chunks_equals_the_dump_in_one(parakeet_model: Path, clip_wav: Path,
                                                          tmp_path: Path, monkeypatch) -> None:
    """The NeMo reference end to end (the tiny fixture, in process) with its attention forced
    into chunks of 3 query rows: every encoder stage as in one chunk, within float32 noise,
    the same decode, and the manifest says how it was computed."""
    from audioparity.models.parakeet_tdt import chunked_attention

    whole, chunked = tmp_path / "whole", tmp_path / "chunked"
    reference_dump(parakeet_model, [(clip_wav, whole)], threads=1)
    monkeypatch.setattr(chunked_attention, "attention_chunk_rows", lambda n_heads, n_frames: 3)
    reference_dump(parakeet_model, [(clip_wav, chunked)], threads=1)
    ours, truth = Dump(chunked), Dump(whole)
    n_layers = int(truth.manifest["n_layers"])
    for name in ("pre_encode", "pos_emb", *(f"layer_{i}" for i in range(n_layers)), "enc_out"):
        assert_rows_equal_within_noise(ours.tensor(name), truth.tensor(name))
    assert ours.json("decode")["ids"] == truth.json("decode")["ids"]
    notes = " ".join(ours.manifest.get("notes", []))
    assert "chunks of 3 query rows" in notes
    assert "chunks of" not in " ".join(truth.manifest.get("notes", []))


# --- the ggml port ---------------------------------------------------------------------------

def port_attention(arrays, x, pos_emb, rows, flash: bool, context: int | None):
    """The port's ``rel_pos_attention`` in one f32 graph, in chunks of ``rows``."""
    cfg = enc.EncoderConfig(feat_in=40, n_layers=1, d_model=D, subsampling="dw_striding",
                            subsampling_factor=8, subsampling_conv_channels=12, n_heads=HEADS,
                            conv_kernel_size=9, xscaling=False)
    with Runtime("cpu", threads=1) as rt:
        weights = rt.upload(arrays, dict.fromkeys(arrays, "f32"))
        with rt.graph() as g:
            mask = (None if context is None
                    else g.input("mask", positions.band_mask(x.shape[0], context)))
            t = g.input("x", x)
            inputs = enc.AttentionInputs(g.input("pos", pos_emb), mask, flash, chunk_rows=rows)
            out = enc.rel_pos_attention(g.ctx, weights, "att.", cfg, t, inputs)
            g.output("y", out, ndim=2)
            return g.compute()["y"]


@pytest.fixture(scope="module")
def port_weights():
    """Random float32 attention weights in the graph layout, and an input of FRAMES frames."""
    rng = np.random.default_rng(6)
    arrays = {f"att.linear_{n}.weight": (rng.standard_normal((D, D)) / np.sqrt(D))
              for n in ("q", "k", "v", "out", "pos")}
    arrays |= {f"att.linear_{n}.bias": 0.2 * rng.standard_normal(D) for n in "qkv"}
    arrays["att.linear_out.bias"] = 0.2 * rng.standard_normal(D)
    arrays |= {f"att.pos_bias_{n}": 0.2 * rng.standard_normal((HEADS, D // HEADS)) for n in "uv"}
    arrays = {name: value.astype(np.float32) for name, value in arrays.items()}
    x = rng.standard_normal((FRAMES, D)).astype(np.float32)
    return arrays, x, positions.rel_pos_encoding(FRAMES, D)


@pytest.mark.parametrize("flash", [False, True], ids=["softmax", "flash"])
@pytest.mark.parametrize("context", [None, 4], ids=["full", "local"])
@pytest.mark.parametrize("rows", [1, 5, 7, FRAMES - 1])
def test_port_attention_in_chunks_equals_one_chunk(port_weights, rows, flash, context):
    arrays, x, pos_emb = port_weights
    whole = port_attention(arrays, x, pos_emb, FRAMES, flash, context)
    chunked = port_attention(arrays, x, pos_emb, rows, flash, context)
    assert_rows_equal_within_noise(chunked, whole)


def test_port_attention_in_the_most_chunks_fits_one_graph(port_weights):
    """MAX_ATTENTION_CHUNKS single-row chunks build in one graph (its node budget) and equal
    one chunk."""
    arrays, _, _ = port_weights
    n_frames = enc.MAX_ATTENTION_CHUNKS
    x = np.random.default_rng(7).standard_normal((n_frames, D)).astype(np.float32)
    pos_emb = positions.rel_pos_encoding(n_frames, D)
    assert_rows_equal_within_noise(port_attention(arrays, x, pos_emb, 1, False, None),
                                   port_attention(arrays, x, pos_emb, n_frames, False, None))


def test_port_default_chunks_are_one_for_a_short_clip_and_bounded_for_a_long_one():
    cfg = enc.EncoderConfig(feat_in=128, n_layers=24, d_model=1024, subsampling="dw_striding",
                            subsampling_factor=8, subsampling_conv_channels=256, n_heads=8,
                            conv_kernel_size=9)
    assert enc.attention_chunk_rows(cfg, 750) == 750  # one minute: one chunk
    for n_frames in (7500, 22500):  # 10 and 30 minutes
        rows = enc.attention_chunk_rows(cfg, n_frames)
        assert -(-n_frames // rows) <= enc.MAX_ATTENTION_CHUNKS
        assert rows < n_frames


@pytest.mark.slow
def test_port_encoder_in_chunks_equals_one_chunk_on_the_fixture(parakeet_model: Path,
                                                                 clip_wav: Path) -> None:
    """The tiny fixture's whole encoder, attention in chunks of 3 rows against one chunk."""
    from audioparity.dumping.audio import load_audio
    from audioparity.models.parakeet_tdt.frontend import mel_features

    config = load_config(parakeet_model)
    mel = mel_features(load_audio(clip_wav).samples, config.preprocessor)
    with Runtime("cpu", threads=1) as rt:
        weights = uploaded(rt, parakeet_model)
        whole = enc.Encoder(weights, config, rt).forward(mel)
        chunked = enc.Encoder(weights, config, rt, chunk_rows=3).forward(mel)
    for name in ("pre_encode", "enc_out", *(f"layer_{i}"
                                           for i in range(config.encoder.n_layers))):
        assert_rows_equal_within_noise(chunked[name], whole[name])
