"""The Parakeet family as NeMo ships it: each architecture switch of config/examples/variants.yaml
built as a tiny fixture by NeMo itself, dumped by NeMo and by the ggml port on the clip, and
compared at f32 with config/config.yaml's gates, which every stage must pass."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audioparity.dumping.artifacts import Dump
from tests import cell_rows
from tests.models.parakeet_tdt.test_dump import run_dump

pytest.importorskip("nemo.collections.asr")

#: Fixture options of each variant (config/examples/variants.yaml's, less v3 itself).
VARIANTS = {
    "bias": {"use_bias": True},
    "vocab1024": {"vocab_size": 1024, "blank_bias_nudge": 4.5},
    "local8": {"local_attention": 8},
    "rnnt": {"head": "rnnt"},
    "ctc": {"head": "ctc"},
    "tdt_ctc": {"head": "tdt_ctc"},
}


@pytest.fixture(scope="module")
def variant_dumps(fixture_model, clip_wav, tmp_path_factory):
    """``variant_dumps(name)``: (model, reference dump, ggml f32 dump) of a variant on the
    clip, each built once per module."""
    from tests.models.parakeet_tdt import reference_dump

    built: dict[str, tuple[Path, Path, Path]] = {}

    def build(name: str) -> tuple[Path, Path, Path]:
        if name not in built:
            model = fixture_model("parakeet_tdt", **VARIANTS[name])
            work = tmp_path_factory.mktemp(f"variant_{name}")
            reference_dump(model, [(clip_wav, work / "reference")], threads=1)
            result = run_dump(model, clip_wav, work / "reference", work / "ggml",
                              "--weight-type", "f32", "--threads", "1")
            assert result.returncode == 0, result.stderr[-2000:]
            built[name] = (model, work / "reference", work / "ggml")
        return built[name]

    return build


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_passes_every_f32_gate_against_nemo(variant_dumps, name, tmp_path):
    _, reference, ggml = variant_dumps(name)
    rows = cell_rows(reference, ggml, tmp_path / "cell.json")
    failing = {stage: row["reason"] for stage, row in rows.items() if row["status"] != "pass"}
    assert not failing, failing
    documents = Dump(reference).manifest["documents"]
    assert documents and all(Dump(ggml).json(name) == Dump(reference).json(name)
                             for name in documents)


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


@pytest.mark.parametrize("name", ["ctc", "tdt_ctc"])
def test_ctc_decode_is_nemos_own_transcription(variant_dumps, clip_wav, name):
    """parakeet-ctc and parakeet-tdt_ctc: the port's greedy CTC text is NeMo's own (the
    model's ``transcribe`` for a CTC model, the hybrid's CTC decoding for the hybrid), the
    decode exercises blanks and repeats, and the dumps hold exactly their heads' stages (the
    hybrid both), which check-dump accepts."""
    import torch
    from nemo.collections.asr.models import ASRModel

    from audioparity.candidates.check import check_dump
    from audioparity.dumping.audio import load_audio

    model_path, reference, ggml = variant_dumps(name)
    model = ASRModel.restore_from(str(model_path), map_location="cpu").eval()
    model.preprocessor.featurizer.dither = 0.0
    samples = torch.from_numpy(load_audio(clip_wav).samples)[None]
    length = torch.tensor([samples.shape[1]])
    with torch.inference_mode():
        if name == "ctc":  # EncDecCTCModel.forward: log-probs, lengths, greedy predictions
            log_probs, length, _ = model.forward(input_signal=samples,
                                                 input_signal_length=length)
            decoding = model.decoding
        else:
            encoded, length = model.forward(input_signal=samples, input_signal_length=length)
            log_probs, decoding = model.ctc_decoder(encoder_output=encoded), model.ctc_decoding
        (hypothesis,) = decoding.ctc_decoder_predictions_tensor(log_probs,
                                                                decoder_lengths=length)
    text = getattr(hypothesis, "text", hypothesis)
    ours = Dump(ggml).json("ctc_decode")
    assert ours["text"] == text and text.strip()
    log_probs = Dump(reference).tensor("ctc_logits")
    labels = log_probs.argmax(axis=1)
    blank = log_probs.shape[1] - 1
    assert (labels == blank).sum() >= 5 and len(ours["ids"]) >= 3
    transducer = {"joint_logits", "lstm_state_0", "decode", "decode_logits"}
    assert transducer.isdisjoint(Dump(ggml).tensor_names + list(Dump(ggml).manifest[
        "documents"])) == (name == "ctc")
    assert check_dump(ggml, "parakeet_tdt") == []
    assert check_dump(reference, "parakeet_tdt") == []


def test_ctc_kernel_rounded_to_f16_fails_the_f32_gate(variant_dumps, clip_wav, tmp_path):
    """The f32 gate of ctc_logits_isolated is one a sloppy port fails: the CTC decoder (and
    every matmul) in f16 puts it at NMSE ~8e-9 against a gate of 2e-13."""
    model, reference, _ = variant_dumps("ctc")
    result = run_dump(model, clip_wav, reference, tmp_path / "f16", "--weight-type", "f16",
                      "--threads", "1")
    assert result.returncode == 0, result.stderr[-2000:]
    rows = cell_rows(reference, tmp_path / "f16", tmp_path / "cell.json")
    assert rows["ctc_logits_isolated"]["status"] == "fail"
    assert 1e-10 < rows["ctc_logits_isolated"]["nmse"] < 1e-6


def test_check_dump_requires_every_stage_of_a_head_the_dump_has(variant_dumps, tmp_path):
    """A CTC dump without its ctc_decode, or a hybrid one without the transducer's decode, is
    missing a stage; a CTC dump need not hold the transducer's stages."""
    import shutil

    from audioparity.candidates.check import check_dump

    for name, dropped in (("ctc", "ctc_decode"), ("tdt_ctc", "decode")):
        dump = tmp_path / name
        shutil.copytree(variant_dumps(name)[2], dump)
        manifest = json.loads((dump / "manifest.json").read_text())
        (dump / manifest["documents"].pop(dropped)).unlink()
        (dump / "manifest.json").write_text(json.dumps(manifest))
        assert [p for p in check_dump(dump, "parakeet_tdt") if "missing stage" in p] == [
            f"{dump}: missing stage {dropped!r} (document "
            f"{'{ids, frames, text}' if name == 'ctc' else '{ids, frames, durations, text}'}); "
            "expected every stage of parakeet_tdt but isolated and replayed forms"]
