"""The NeMo reference dump: every tensor checked against NeMo's own modules run here, or against
float64 numpy formulas; the greedy-path walker against hand-made joint rows; atomic failure."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.audio import load_audio
from audioparity.models.parakeet_tdt.greedy import replay_path
from tests import config_gates
from tests.models.parakeet_tdt import ggml_dump, reference_dump

DURATIONS = [0, 1, 2, 3, 4]


def _row(token: int, duration_index: int, vocab: int = 3) -> np.ndarray:
    """One joint row with the given argmaxes: V tokens + blank (index ``vocab``) + 5 durations."""
    row = np.zeros(vocab + 1 + len(DURATIONS), np.float32)
    row[token] = 1.0
    row[vocab + 1 + duration_index] = 1.0
    return row


# --- the greedy TDT walk, on rows whose argmaxes are known -------------------------------------

def test_walk_blank_of_duration_zero_advances_one_frame_without_emitting() -> None:
    rows = np.stack([_row(3, 0), _row(1, 2)])  # blank d=0 at t=0, token 1 d=2 at t=1
    path = replay_path(rows, n_frames=3, durations=DURATIONS, max_symbols=10)
    assert (path.ids, path.frames, path.durations) == ([1], [1], [2])
    assert (path.row_frames, path.row_history) == ([0, 1], [0, 0])


def test_walk_forces_the_next_frame_after_max_symbols_zero_duration_tokens() -> None:
    rows = np.stack([_row(2, 0)] * 3 + [_row(0, 1)])
    path = replay_path(rows, n_frames=2, durations=DURATIONS, max_symbols=3)
    assert path.frames == [0, 0, 0, 1]
    assert path.row_history == [0, 1, 2, 3]


def test_walk_does_not_force_when_the_last_symbol_moved_on() -> None:
    rows = np.stack([_row(2, 0), _row(2, 0), _row(1, 1), _row(0, 1)])
    path = replay_path(rows, n_frames=2, durations=DURATIONS, max_symbols=3)
    assert path.frames == [0, 0, 0, 1]


def test_walk_refuses_rows_that_do_not_match_the_path() -> None:
    rows = np.stack([_row(3, 1), _row(3, 1)])
    with pytest.raises(AudioparityError, match="used 1 of 2 joint rows"):
        replay_path(rows, n_frames=1, durations=DURATIONS, max_symbols=10)
    with pytest.raises(AudioparityError, match="needs more than 2 joint rows"):
        replay_path(rows, n_frames=3, durations=DURATIONS, max_symbols=10)


# --- the dump against NeMo -------------------------------------------------------------------

torch = pytest.importorskip("torch")
nemo_asr = pytest.importorskip("nemo.collections.asr")


@pytest.fixture(scope="module")
def model(parakeet_model: Path):
    return nemo_asr.models.EncDecRNNTBPEModel.restore_from(
        str(parakeet_model), map_location="cpu"
    ).eval()


@pytest.fixture(scope="module")
def nemo_run(model, clip_wav: Path) -> dict:
    """NeMo run here, without hooks: preprocessor, then encoder, then the model's own decoding;
    one thread, like the dump, so the float32 results are bit-identical."""
    samples = torch.from_numpy(load_audio(clip_wav).samples).unsqueeze(0)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            mel, mel_len = model.preprocessor(
                input_signal=samples, length=torch.tensor([samples.shape[1]])
            )
            pre, pre_len = model.encoder.pre_encode(x=mel.transpose(1, 2), lengths=mel_len)
            enc, enc_len = model.encoder(audio_signal=mel, length=mel_len)
            (hypothesis,) = model.decoding.rnnt_decoder_predictions_tensor(
                encoder_output=enc, encoded_lengths=enc_len, return_hypotheses=True
            )
    finally:
        torch.set_num_threads(threads)
    return {
        "mel": mel[0, :, : int(mel_len[0])].T.numpy(),
        "n_samples": samples.shape[1],
        "pre_encode": pre[0, : int(pre_len[0])].numpy(),
        "enc_out": enc[0, :, : int(enc_len[0])].T.numpy(),
        "ids": [int(i) for i in hypothesis.y_sequence],
        "frames": [int(t) for t in hypothesis.timestamp],
        "text": hypothesis.text,
    }


def test_manifest_names_family_threads_layers_decoding_and_versions(
    parakeet_reference: Path,
) -> None:
    manifest = Dump(parakeet_reference).manifest
    assert manifest["producer"] == "nemo" and manifest["status"] == "ok"
    assert manifest["family"] == "parakeet_tdt"
    assert manifest["threads"] == 1 and manifest["n_layers"] == 3
    assert manifest["decoding"] == {
        "strategy": "greedy_batch", "durations": DURATIONS, "max_symbols": 10
    }
    assert {"torch", "nemo_toolkit"} <= set(manifest["versions"])
    expected = {"mel_features", "pre_encode", "pos_emb", "layer_0", "layer_1", "layer_2",
                "enc_out", "joint_logits", "lstm_state_0", "decode_margins", "decode_logits"}
    assert set(manifest["tensors"]) == expected
    assert manifest["documents"] == {"decode": "decode.json"}
    # on its own enc_out, its decode teacher-forced along its own path is its joint rows; each
    # row chooses a token (V+1 classes) and a duration apart
    dump = Dump(parakeet_reference)
    np.testing.assert_array_equal(dump.tensor("decode_logits"), dump.tensor("joint_logits"))
    width = dump.tensor("joint_logits").shape[1]
    assert manifest["decisions"] == dict.fromkeys(
        ("joint_logits", "decode_logits"), [width - len(DURATIONS), len(DURATIONS)])


def test_mel_is_nemo_preprocessor_output_on_valid_frames(parakeet_reference: Path,
                                                          nemo_run) -> None:
    mel = Dump(parakeet_reference).tensor("mel_features")
    assert mel.shape == (nemo_run["n_samples"] // 160, 128)
    np.testing.assert_array_equal(mel, nemo_run["mel"])


def test_pre_encode_and_enc_out_are_nemo_encoder_outputs(parakeet_reference: Path,
                                                          nemo_run) -> None:
    dump = Dump(parakeet_reference)
    np.testing.assert_array_equal(dump.tensor("pre_encode"), nemo_run["pre_encode"])
    np.testing.assert_array_equal(dump.tensor("enc_out"), nemo_run["enc_out"])
    # no output projection (feat_out -1): the last layer's output is the encoder output
    np.testing.assert_array_equal(dump.tensor("layer_2"), dump.tensor("enc_out"))
    assert not np.allclose(dump.tensor("layer_1"), dump.tensor("layer_2"), atol=1e-2)


def test_pos_emb_is_the_sinusoid_over_positions_t_minus_1_down_to_1_minus_t(
    parakeet_reference: Path,
) -> None:
    dump = Dump(parakeet_reference)
    n_frames, d_model = dump.tensor("enc_out").shape
    positions = np.arange(n_frames - 1, -n_frames, -1, dtype=np.float64)[:, None]
    inv_freq = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * -(np.log(10000.0) / d_model))
    expected = np.zeros((2 * n_frames - 1, d_model))
    expected[:, 0::2] = np.sin(positions * inv_freq)
    expected[:, 1::2] = np.cos(positions * inv_freq)
    np.testing.assert_allclose(dump.tensor("pos_emb"), expected, atol=1e-5)


def test_decode_is_nemo_hypothesis_and_joint_rows_replay_it(
    parakeet_reference: Path, nemo_run, model
) -> None:
    dump = Dump(parakeet_reference)
    decode = dump.json("decode")
    assert decode["ids"] == nemo_run["ids"] and decode["frames"] == nemo_run["frames"]
    assert decode["text"] == nemo_run["text"]
    rows = dump.tensor("joint_logits")
    vocab = len(model.tokenizer.vocab)
    assert rows.shape[1] == vocab + 1 + len(DURATIONS)
    tokens = rows[:, : vocab + 1].argmax(axis=1)
    assert [int(t) for t in tokens if t != vocab] == decode["ids"]
    emitted = rows[tokens != vocab, vocab + 1 :].argmax(axis=1)
    assert [DURATIONS[i] for i in emitted] == decode["durations"]
    # the rows are raw joint outputs: not log-probabilities
    assert np.all(np.abs(np.log(np.exp(rows.astype(np.float64)).sum(axis=1))) > 1e-3)


def test_joint_rows_equal_nemo_joint_along_the_path(parakeet_reference: Path, model) -> None:
    dump = Dump(parakeet_reference)
    rows, enc_out = dump.tensor("joint_logits"), dump.tensor("enc_out")
    decode = dump.json("decode")
    path = replay_path(rows, enc_out.shape[0], DURATIONS, max_symbols=10)
    history = [model.decoder.blank_idx, *decode["ids"]]
    with torch.inference_mode():
        # prediction net over the whole token history, SOS (blank) first: g[u] after u tokens
        g, _ = model.decoder.predict(torch.tensor([history]), None, add_sos=False, batch_size=1)
        f = torch.from_numpy(enc_out[path.row_frames]).unsqueeze(0)
        pred = g[:, path.row_history]
        expected = model.joint.joint_net(
            model.joint.project_encoder(f) + model.joint.project_prednet(pred)
        )[0]
    np.testing.assert_allclose(rows, expected.numpy(), atol=1e-5)


def test_lstm_state_0_is_the_float64_lstm_step_from_zero_input_and_state(
    parakeet_reference: Path, model
) -> None:
    state = Dump(parakeet_reference).tensor("lstm_state_0")
    lstm = model.decoder.prediction["dec_rnn"].lstm
    n_layers, hidden = lstm.num_layers, lstm.hidden_size
    assert state.shape == (n_layers, 2, hidden)
    def weight(name: str, layer: int) -> np.ndarray:
        return getattr(lstm, f"{name}_l{layer}").detach().double().numpy()

    def sigmoid(v: np.ndarray) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-v))

    x = np.zeros(lstm.input_size)  # the blank/SOS embedding row is zero
    for layer in range(n_layers):
        # h0 = 0, so W_hh drops out; c0 = 0, so the forget gate drops out
        gates = weight("weight_ih", layer) @ x + weight("bias_ih", layer) + weight("bias_hh", layer)
        i, _, g, o = np.split(gates, 4)  # PyTorch gate order i, f, g, o
        c = sigmoid(i) * np.tanh(g)
        h = sigmoid(o) * np.tanh(c)
        np.testing.assert_allclose(state[layer, 0], h, atol=1e-6)
        np.testing.assert_allclose(state[layer, 1], c, atol=1e-6)
        x = h


def test_failed_dump_leaves_no_directory(parakeet_model: Path, tmp_path: Path) -> None:
    output = tmp_path / "dump"
    with pytest.raises(AudioparityError, match="no such file"):
        reference_dump(parakeet_model, [(tmp_path / "missing.wav", output)])
    not_audio = tmp_path / "not_audio.wav"
    not_audio.write_bytes(b"RIFF0000WAVEjunk")
    with pytest.raises(AudioparityError, match="cannot read audio"):
        reference_dump(parakeet_model, [(not_audio, output)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["not_audio.wav"]


def test_audio_whose_padded_frame_survives_subsampling_matches_the_ggml_port(
    parakeet_model: Path, clip_wav: Path, tmp_path: Path
) -> None:
    """2.0 s: 200 valid mel frames (a multiple of 8), so NeMo's padded frame survives the x8
    subsampling (T' 25, padded 26) and its pos_emb has 51 rows for 49 valid positions."""
    from audioparity.compare.cell import compare_cell
    from audioparity.compare.plan import CellDumps
    from audioparity.models.parakeet_tdt.positions import rel_pos_encoding

    samples, rate = sf.read(clip_wav, dtype="int16")
    audio = tmp_path / "two_seconds.wav"
    sf.write(audio, samples[: 2 * rate], rate, subtype="PCM_16")
    reference = tmp_path / "reference"
    reference_dump(parakeet_model, [(audio, reference)], threads=1)
    pos_emb = Dump(reference).tensor("pos_emb")
    assert pos_emb.shape[0] == 2 * 25 - 1
    np.testing.assert_allclose(pos_emb, rel_pos_encoding(25, pos_emb.shape[1]), atol=1e-5)

    candidate = tmp_path / "ggml"
    ggml_dump(parakeet_model, audio, candidate, reference_dir=reference)
    gates = config_gates("parakeet_tdt", "f32")
    cell = tmp_path / "cell.json"
    compare_cell(CellDumps(reference, candidate), gates,
                 {"family": "parakeet_tdt", "case": "two_seconds"}, cell)
    failing = {row["stage"]: row["reason"] for row in json.loads(cell.read_text())
               if row["status"] != "pass"}
    assert failing == {}


def test_one_model_load_dumps_every_case_as_separate_jobs_would(
    parakeet_model: Path, clip_wav: Path, parakeet_reference: Path, tmp_path: Path
) -> None:
    """Several cases share one NeMo import and restore (the workflow's one job per model): the
    clip's tensors after another case are byte-identical to its own job's (parakeet_reference)."""
    samples, rate = sf.read(clip_wav, dtype="int16")
    short = tmp_path / "short.wav"
    sf.write(short, samples[: rate], rate, subtype="PCM_16")
    reference_dump(parakeet_model, [(short, tmp_path / "short"), (clip_wav, tmp_path / "clip")])

    alone, shared = Dump(parakeet_reference), Dump(tmp_path / "clip")
    assert shared.manifest["cases_per_load"] == 2
    assert alone.manifest["cases_per_load"] == 1
    assert sorted(shared.manifest["tensors"]) == sorted(alone.manifest["tensors"])
    for name in alone.manifest["tensors"]:
        assert shared.tensor(name).tobytes() == alone.tensor(name).tobytes(), name
    assert shared.json("decode") == alone.json("decode")
    assert Dump(tmp_path / "short").tensor("enc_out").shape[0] < shared.tensor("enc_out").shape[0]
