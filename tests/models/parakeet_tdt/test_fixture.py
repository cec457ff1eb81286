"""The tiny Parakeet-TDT fixture: v3's structure, seeded determinism, atomic save, and a greedy
decode of the project's clip that exercises every TDT rule (counted from NeMo's own decoder)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.audio import load_audio
from audioparity.models.parakeet_tdt.fixture import build_fixture

torch = pytest.importorskip("torch")
nemo_asr = pytest.importorskip("nemo.collections.asr")


def _restore(path: Path):
    return nemo_asr.models.EncDecRNNTBPEModel.restore_from(str(path), map_location="cpu").eval()


@pytest.fixture(scope="module")
def model(parakeet_model: Path):
    return _restore(parakeet_model)


def test_same_seed_gives_identical_state_dict_and_another_seed_does_not(
    model, tmp_path: Path
) -> None:
    build_fixture(tmp_path / "again", seed=0)
    build_fixture(tmp_path / "other", seed=1)
    first = model.state_dict()
    again = _restore(tmp_path / "again" / "model.nemo").state_dict()
    other = _restore(tmp_path / "other" / "model.nemo").state_dict()
    assert list(first) == list(again)
    unequal = [key for key in first if not torch.equal(first[key], again[key])]
    assert unequal == []
    assert not torch.equal(first["joint.joint_net.2.weight"], other["joint.joint_net.2.weight"])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again", "other"]
    assert [p.name for p in (tmp_path / "again").iterdir()] == ["model.nemo"]
    # the folder it was built in (the tokenizer's, in the config and in the SentencePiece
    # proto) is no path a model carries: the committed trained model is built the same way
    assert str(tmp_path).encode() not in (tmp_path / "again" / "model.nemo").read_bytes()


def test_fixture_has_v3_structure(model) -> None:
    cfg = model.cfg
    assert cfg.preprocessor.features == 128
    assert cfg.encoder.subsampling == "dw_striding" and cfg.encoder.subsampling_factor == 8
    assert cfg.encoder.self_attention_model == "rel_pos"
    assert cfg.encoder.xscaling is False and cfg.encoder.use_bias is False
    assert cfg.encoder.conv_kernel_size == 9 and cfg.encoder.conv_norm_type == "batch_norm"
    assert list(cfg.decoding.durations) == [0, 1, 2, 3, 4]
    assert cfg.decoding.greedy.max_symbols == 10
    keys = model.state_dict().keys()
    layer_biases = [k for k in keys if k.startswith("encoder.layers.") and k.endswith(".bias")
                    and "norm" not in k]
    assert layer_biases == []
    assert "decoder.prediction.dec_rnn.lstm.weight_hh_l1" in keys
    # blank_as_pad: the blank row of the prediction-net embedding stays zero (NeMo's SOS input)
    embed = model.decoder.prediction["embed"]
    assert embed.padding_idx == model.decoder.blank_idx == len(model.tokenizer.vocab)
    assert torch.count_nonzero(embed.weight[embed.padding_idx]) == 0


def test_build_refuses_an_unusable_directory_and_leaves_nothing_when_saving_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "a_file").write_text("")
    with pytest.raises(AudioparityError, match="cannot create the directory"):
        build_fixture(tmp_path / "a_file" / "tiny")

    def broken_save(self, path, *args, **kwargs):
        Path(path).write_bytes(b"half an archive")
        raise OSError("disk full")

    monkeypatch.setattr(nemo_asr.models.EncDecRNNTBPEModel, "save_to", broken_save)
    with pytest.raises(OSError, match="disk full"):
        build_fixture(tmp_path / "tiny")
    assert [p.name for p in tmp_path.iterdir()] == ["a_file"]


def nemo_greedy_decode(model, audio: Path):
    """NeMo's own greedy TDT decode (the model's greedy_batch strategy) with every step recorded."""
    from omegaconf import open_dict

    samples = torch.from_numpy(load_audio(audio).samples).unsqueeze(0)
    with torch.inference_mode():
        encoded, length = model.forward(
            input_signal=samples, input_signal_length=torch.tensor([samples.shape[1]])
        )
    config = model.cfg.decoding.copy()
    with open_dict(config):
        config.preserve_alignments = True
        config.tdt_include_token_duration = True
    model.change_decoding_strategy(config, verbose=False)
    (hypothesis,) = model.decoding.rnnt_decoder_predictions_tensor(
        encoder_output=encoded, encoded_lengths=length, return_hypotheses=True
    )
    return hypothesis, encoded[0, :, : int(length[0])].T.numpy()


def test_clip_decode_exercises_blanks_zero_durations_and_the_symbol_limit(
    model, clip_wav: Path
) -> None:
    hypothesis, _ = nemo_greedy_decode(model, clip_wav)
    blank = model.decoding.blank_id
    steps = [int(label) for frame in hypothesis.alignments for _, label in frame]
    frames = [int(t) for t in hypothesis.timestamp]
    durations = [int(d) for d in hypothesis.token_duration]
    ids = [int(i) for i in hypothesis.y_sequence]
    per_frame = Counter(frames)
    # the guard fires where max_symbols tokens were emitted on one frame, the last with duration 0
    guard_hits = [t for t, n in per_frame.items()
                  if n == 10 and durations[len(frames) - 1 - frames[::-1].index(t)] == 0]
    assert steps.count(blank) >= 3
    assert durations.count(0) >= 10
    assert any(d > 0 for d in durations)
    assert len(guard_hits) >= 2
    assert max(per_frame.values()) == 10
    assert len(set(ids)) >= 5


def test_encoder_output_varies_in_time_at_a_safe_scale(model, clip_wav: Path) -> None:
    _, enc_out = nemo_greedy_decode(model, clip_wav)
    temporal = enc_out.std(axis=0).mean() / enc_out.std()
    assert temporal > 0.4
    assert np.abs(enc_out).max() < 100


def test_vocab_size_minimum_is_what_sentencepiece_needs(tmp_path: Path) -> None:
    """The option's declared minimum is the corpus's true one: SentencePiece trains at it and
    fails one below; below it the build is refused in one line, before NeMo runs."""
    import sentencepiece as spm

    from audioparity.models.parakeet_tdt import ParakeetTdt
    from audioparity.models.parakeet_tdt.fixture import CORPUS, min_vocab_size, train_tokenizer

    (option,) = (o for o in ParakeetTdt.spec.options if o.name == "vocab_size")
    assert option.minimum == min_vocab_size() == 45
    train_tokenizer(tmp_path / "least", option.minimum)
    with pytest.raises(RuntimeError, match="Vocabulary size"):
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(CORPUS), model_prefix=str(tmp_path / "raw"),
            vocab_size=option.minimum - 1, model_type="bpe", character_coverage=1.0,
            num_threads=1, bos_id=-1, eos_id=-1, unk_id=0, minloglevel=2)
    with pytest.raises(AudioparityError, match=r"^fixture parakeet-tdt: vocab_size 8 is below "
                       r"45, [^\n]*$"):
        build_fixture(tmp_path / "tiny", vocab_size=8)
    assert not (tmp_path / "tiny").exists()


@pytest.mark.parametrize(("options", "message"), [
    ({"d_model": 30, "n_heads": 4}, "d_model 30 is not a multiple of n_heads 4"),
    ({"conv_kernel_size": 8}, "conv_kernel_size 8 is even"),
    ({"subsampling_conv_channels": 0}, "subsampling_conv_channels 0"),
    ({"n_head": 2}, "unknown option.s. n_head"),
])
def test_shapes_nemo_refuses_are_refused_in_one_line(tmp_path: Path, options, message) -> None:
    with pytest.raises(AudioparityError, match=rf"^fixture parakeet-tdt: {message}[^\n]*$"):
        build_fixture(tmp_path / "tiny", **options)


def test_fixture_takes_the_shapes(tmp_path: Path) -> None:
    """Every shape option reaches NeMo's model: its config and its tensors' shapes."""
    shapes = {"d_model": 40, "n_heads": 5, "n_layers": 1, "conv_kernel_size": 31,
              "subsampling_factor": 4, "subsampling_conv_channels": 12, "sample_rate": 8000,
              "features": 64, "window_size": 0.032, "window_stride": 0.016, "n_fft": 0,
              "preemph": 0.9, "pred_hidden": 20, "pred_rnn_layers": 1}
    build_fixture(tmp_path / "shaped", vocab_size=50, **shapes)
    model = _restore(tmp_path / "shaped" / "model.nemo")
    cfg, weights = model.cfg, model.state_dict()
    assert {k: cfg.encoder[k] for k in ("d_model", "n_heads", "n_layers", "conv_kernel_size",
                                         "subsampling_factor", "subsampling_conv_channels")} == {
        k: shapes[k] for k in ("d_model", "n_heads", "n_layers", "conv_kernel_size",
                               "subsampling_factor", "subsampling_conv_channels")}
    assert cfg.sample_rate == cfg.preprocessor.sample_rate == 8000
    assert cfg.preprocessor.n_fft is None and cfg.preprocessor.preemph == 0.9
    assert weights["preprocessor.featurizer.fb"].shape == (1, 64, 129)  # n_fft 256 (window 256)
    assert weights["encoder.pre_encode.conv.0.weight"].shape == (12, 1, 3, 3)
    assert sum(k.startswith("encoder.pre_encode.conv.") and k.endswith(".weight")
               for k in weights) == 3  # x4: one conv, one depthwise-pointwise pair
    assert weights["encoder.layers.0.conv.depthwise_conv.weight"].shape == (40, 1, 31)
    assert "encoder.layers.1.norm_out.weight" not in weights
    assert weights["encoder.layers.0.self_attn.pos_bias_u"].shape == (5, 8)
    assert weights["decoder.prediction.dec_rnn.lstm.weight_hh_l0"].shape == (80, 20)
    assert "decoder.prediction.dec_rnn.lstm.weight_hh_l1" not in weights
    assert weights["decoder.prediction.embed.weight"].shape == (51, 20)
