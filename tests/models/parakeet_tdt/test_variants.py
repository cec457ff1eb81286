"""The Parakeet family as NeMo ships it: each architecture switch of config/examples/variants.yaml
built as a tiny fixture by NeMo itself, dumped by NeMo and by the ggml port on the clip, and
compared at f32 with config/config.yaml's gates, which every stage must pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audioparity.artifacts import Dump
from tests import config_gates
from tests.models.parakeet_tdt.test_dump import run_dump

pytest.importorskip("nemo.collections.asr")

#: Fixture options of each variant (config/examples/variants.yaml's, less v3 itself).
VARIANTS = {
    "bias": {"use_bias": True},
    "vocab1024": {"vocab_size": 1024, "blank_bias_nudge": 4.5},
    "local8": {"local_attention": 8},
    "rnnt": {"head": "rnnt"},
}


@pytest.fixture(scope="module")
def variant_dumps(fixture_model, clip_wav, tmp_path_factory):
    """``variant_dumps(name)``: (model, reference dump, ggml f32 dump) of a variant on the
    clip, each built once per module."""
    from audioparity.models.parakeet_tdt.reference import dump_reference

    built: dict[str, tuple[Path, Path, Path]] = {}

    def build(name: str) -> tuple[Path, Path, Path]:
        if name not in built:
            model = fixture_model("parakeet_tdt", **VARIANTS[name])
            work = tmp_path_factory.mktemp(f"variant_{name}")
            dump_reference(model, [(clip_wav, work / "reference")], threads=1)
            result = run_dump(model, clip_wav, work / "reference", work / "ggml",
                              "--weight-type", "f32", "--threads", "1")
            assert result.returncode == 0, result.stderr[-2000:]
            built[name] = (model, work / "reference", work / "ggml")
        return built[name]

    return build


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_passes_every_f32_gate_against_nemo(variant_dumps, name, tmp_path):
    from audioparity.compare import compare_cell

    _, reference, ggml = variant_dumps(name)
    compare_cell(reference, ggml, config_gates("parakeet_tdt", "f32"),
                 {"family": "parakeet_tdt"}, tmp_path / "cell.json")
    rows = {row["stage"]: row for row in json.loads((tmp_path / "cell.json").read_text())}
    failing = {stage: row["reason"] for stage, row in rows.items() if row["status"] != "pass"}
    assert not failing, failing
    assert Dump(ggml).json("decode") == Dump(reference).json("decode")


def test_biased_fixture_carries_every_encoder_bias_but_linear_pos(variant_dumps):
    """NeMo's use_bias puts biases on the feed-forward, linear_q/k/v/out and the three convs
    of the conv module; linear_pos has none (bias=False in RelPositionMultiHeadAttention)."""
    from audioparity.models.parakeet_tdt.checkpoint import read_state
    from audioparity.models.parakeet_tdt.config import load_config

    model, _, _ = variant_dumps("bias")
    assert load_config(model).encoder.use_bias is True
    state, _ = read_state(model)
    biases = {name.removeprefix("encoder.layers.0.") for name in state
              if name.startswith("encoder.layers.0.") and name.endswith(".bias")
              and "norm" not in name}
    assert biases == {f"{module}.bias" for module in (
        "feed_forward1.linear1", "feed_forward1.linear2", "feed_forward2.linear1",
        "feed_forward2.linear2", "self_attn.linear_q", "self_attn.linear_k",
        "self_attn.linear_v", "self_attn.linear_out", "conv.pointwise_conv1",
        "conv.depthwise_conv", "conv.pointwise_conv2")}


def test_1024_piece_vocabulary_decodes_blanks_and_tokens(variant_dumps):
    """The English models' vocabulary size: the tokenizer trains to 1024 pieces, and NeMo's
    greedy decode of the clip still emits blanks, tokens of duration 0 and several ids."""
    from audioparity.models.parakeet_tdt.config import load_config

    model, reference, _ = variant_dumps("vocab1024")
    assert load_config(model).decoder.vocab_size == 1024
    dump = Dump(reference)
    decode = dump.json("decode")
    rows = dump.tensor("joint_logits")
    assert rows.shape[1] == 1024 + 1 + 5
    blanks = int((rows[:, :1025].argmax(axis=1) == 1024).sum())
    assert blanks >= 3 and len(decode["ids"]) >= 10 and len(set(decode["ids"])) >= 5
    assert decode["durations"].count(0) >= 3 and decode["text"].strip()


def test_local_attention_fixture_is_nemo_longformer_with_a_window_the_clip_exceeds(
        variant_dumps):
    """rel_pos_local_attn [8, 8]: NeMo built RelPositionMultiHeadAttentionLongformer, fed the
    layers the 17 positions of LocalAttRelPositionalEncoding, and the clip's encoder frames
    exceed the 17-frame window (so the band changes what attention sees)."""
    from audioparity.models.parakeet_tdt.config import load_config

    model, reference, ggml = variant_dumps("local8")
    assert load_config(model).encoder.local_context == 8
    dump = Dump(reference)
    assert dump.tensor("pos_emb").shape == (17, 64)
    assert dump.tensor("enc_out").shape[0] > 2 * 17
    assert Dump(ggml).tensor("pos_emb").shape == (17, 64)


def test_rnnt_decode_is_nemo_rnnt_greedy_without_durations(variant_dumps, clip_wav):
    """parakeet-rnnt: NeMo's label-looping (greedy_batch) and frame-looping (greedy) RNNT
    decoders agree with each other and with the dumps (tokens stay on their frame, a blank
    advances one, max_symbols forces the step on), and like NeMo's RNNT hypotheses the decode
    records no token durations."""
    import torch
    from nemo.collections.asr.models import EncDecRNNTBPEModel
    from omegaconf import open_dict

    from audioparity.models.parakeet_tdt.config import load_config

    model_path, reference, ggml = variant_dumps("rnnt")
    config = load_config(model_path)
    assert config.durations == () and config.n_joint_outputs == config.blank_id + 1
    decode = Dump(reference).json("decode")
    assert decode["durations"] == [] and Dump(ggml).json("decode") == decode
    frames = decode["frames"]
    assert max(frames.count(t) for t in set(frames)) == config.max_symbols
    assert len(Dump(reference).tensor("joint_logits")) > len(decode["ids"])  # blanks too
    model = EncDecRNNTBPEModel.restore_from(str(model_path), map_location="cpu").eval()
    enc_out = torch.from_numpy(Dump(reference).tensor("enc_out").T.copy())[None]
    length = torch.tensor([enc_out.shape[2]])
    for strategy in ("greedy_batch", "greedy"):
        cfg = model.cfg.decoding.copy()
        with open_dict(cfg):
            cfg.strategy = strategy
        model.change_decoding_strategy(cfg, verbose=False)
        with torch.inference_mode():
            (hypothesis,) = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=enc_out, encoded_lengths=length, return_hypotheses=True)
        assert [int(i) for i in hypothesis.y_sequence] == decode["ids"], strategy
        assert [int(t) for t in hypothesis.timestamp] == frames, strategy
