"""The tiny Parakeet-TDT fixture: v3's structure, seeded determinism, atomic save, and a greedy
decode of the project's clip that exercises every TDT rule (counted from NeMo's own decoder)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from audioparity.audio import load_audio
from audioparity.errors import AudioparityError
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
