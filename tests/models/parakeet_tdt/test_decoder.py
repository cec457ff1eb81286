"""The TDT decoder: the host greedy loop on hand-made joints, the ggml prediction network and
joint against NeMo's own ``RNNTDecoder`` / ``RNNTJoint``, and the tiny fixture's reference
decode replayed exactly."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.models.parakeet_tdt.config import (
    DecoderConfig,
    EncoderConfig,
    JointConfig,
    ParakeetTDTConfig,
    PreprocessorConfig,
)
from audioparity.models.parakeet_tdt.decoder import TdtDecoder, joint
from audioparity.models.parakeet_tdt.greedy import decision_margins, greedy_tdt, replay_path

# A hand-made vocabulary: tokens 0, 1, 2; blank 3; durations (0, 1, 2) at outputs 4, 5, 6.
BLANK = 3
DURATIONS = (0, 1, 2)


def table_joint(table: dict[tuple[int, int], tuple[int, int]], default=(BLANK, 1)):
    """A joint whose argmaxes are looked up by (frame, tokens emitted so far); ``g`` is the
    token history the fake prediction network returns. Values are (label, duration value)."""

    def joint(t: int, history: tuple[int, ...]) -> np.ndarray:
        label, duration = table.get((t, len(history) - 1), default)
        logits = np.full(BLANK + 1 + len(DURATIONS), -5.0, np.float32)
        logits[label] = 3.0
        logits[BLANK + 1 + DURATIONS.index(duration)] = 1.0
        return logits

    return joint


def history_predict(calls: list):
    """A fake prediction network: state and output are the label history (SOS included)."""

    def predict(label: int, state):
        calls.append((label, state))
        history = (state or ()) + (label,)
        return history, history

    return predict


def decode(table, n_frames, max_symbols=10, default=(BLANK, 1)):
    calls: list = []
    path = greedy_tdt(n_frames, table_joint(table, default), history_predict(calls),
                      blank_id=BLANK, durations=DURATIONS, max_symbols=max_symbols)
    return path, calls


def test_greedy_starts_from_blank_sos_and_zero_state():
    path, calls = decode({(0, 0): (2, 1)}, n_frames=2)
    assert calls[0] == (BLANK, None)
    assert calls[1] == (2, (BLANK,))  # the state after the SOS step is carried
    assert (path.ids, path.frames, path.durations) == ([2], [0], [1])


def test_blank_with_duration_zero_advances_one_frame_without_a_prediction_step():
    path, calls = decode({(0, 0): (BLANK, 0), (1, 0): (1, 1), (2, 1): (BLANK, 2)}, n_frames=3)
    assert (path.ids, path.frames, path.durations) == ([1], [1], [1])
    assert path.row_frames == [0, 1, 2]
    assert path.row_history == [0, 0, 1]
    assert [label for label, _ in calls] == [BLANK, 1]  # blanks never step the LSTM


def test_blank_duration_is_skipped():
    path, _ = decode({(0, 0): (BLANK, 2), (2, 0): (0, 1)}, n_frames=3)
    assert path.row_frames == [0, 2]
    assert (path.ids, path.frames) == ([0], [2])


def test_zero_duration_tokens_stay_on_the_frame():
    path, calls = decode({(0, 0): (0, 0), (0, 1): (2, 0), (0, 2): (1, 2)}, n_frames=2)
    assert (path.ids, path.frames, path.durations) == ([0, 2, 1], [0, 0, 0], [0, 0, 2])
    assert path.row_frames == [0, 0, 0]
    assert [label for label, _ in calls] == [BLANK, 0, 2, 1]


def test_ten_zero_duration_tokens_force_the_next_frame():
    table = {(0, k): (k % 3, 0) for k in range(20)}  # frame 0 would emit forever
    path, _ = decode(table, n_frames=2)
    assert path.frames == [0] * 10  # frame 1 is blank (the default)
    assert path.ids == [k % 3 for k in range(10)]
    assert path.row_frames == [0] * 10 + [1]


def rnnt_decode(table, n_frames, max_symbols=3):
    """greedy_tdt without durations (RNNT): the joint gives V+1 outputs, the table labels."""
    def joint(t: int, history: tuple[int, ...]) -> np.ndarray:
        logits = np.full(BLANK + 1, -5.0, np.float32)
        logits[table.get((t, len(history) - 1), BLANK)] = 3.0
        return logits

    calls: list = []
    path = greedy_tdt(n_frames, joint, history_predict(calls), blank_id=BLANK, durations=(),
                      max_symbols=max_symbols)
    return path, calls


def test_rnnt_tokens_stay_blanks_advance_one_frame_and_max_symbols_forces_the_step():
    """NeMo's greedy RNNT (GreedyBatchedRNNTLabelLoopingComputer, GreedyRNNTInfer): a token
    stays on its frame, a blank moves one frame on, max_symbols tokens on a frame move it on;
    no durations are recorded (NeMo's RNNT hypotheses have none)."""
    table = {(0, 0): 1, (0, 1): 2, (2, 2): 0} | {(3, k): 1 for k in range(3, 10)}
    path, calls = rnnt_decode(table, n_frames=5)
    assert (path.ids, path.frames, path.durations) == ([1, 2, 0, 1, 1, 1], [0, 0, 2, 3, 3, 3], [])
    assert path.row_frames == [0, 0, 0, 1, 2, 2, 3, 3, 3, 4]
    assert [label for label, _ in calls] == [BLANK, 1, 2, 0, 1, 1, 1]
    rows = np.eye(BLANK + 1, dtype=np.float32)[
        [1, 2, BLANK, BLANK, 0, BLANK, 1, 1, 1, BLANK]]
    replayed = replay_path(rows, 5, [], 3)
    assert (replayed.ids, replayed.frames, replayed.durations) == (path.ids, path.frames, [])


def test_tenth_token_with_a_duration_is_not_pushed_further():
    table = {(0, k): (1, 0) for k in range(9)} | {(0, 9): (1, 1), (1, 10): (2, 0), (1, 11): (0, 2)}
    path, _ = decode(table, n_frames=3)
    assert path.frames == [0] * 10 + [1, 1]
    assert path.durations == [0] * 9 + [1, 0, 2]


def test_run_count_restarts_on_a_new_frame():
    # 6 zero-duration tokens on frame 0, one token moving to frame 1, 6 more there: no limit hit.
    table = {(0, k): (0, 0) for k in range(6)} | {(0, 6): (1, 1)}
    table |= {(1, k): (2, 0) for k in range(7, 13)} | {(1, 13): (BLANK, 1)}
    path, _ = decode(table, n_frames=2)
    assert path.frames == [0] * 7 + [1] * 6
    assert path.row_frames == [0] * 7 + [1] * 7


def test_decoding_ends_when_a_token_jumps_past_the_last_frame():
    path, _ = decode({(0, 0): (BLANK, 1), (1, 0): (0, 0), (1, 1): (1, 2)}, n_frames=2)
    assert (path.ids, path.frames, path.durations) == ([0, 1], [1, 1], [0, 2])
    assert path.row_frames == [0, 1, 1]
    empty, calls = decode({}, n_frames=0)
    assert (empty.ids, empty.row_frames, len(calls)) == ([], [], 1)


def test_decision_margins_take_the_nearest_tie_since_the_previous_token():
    # rows: blank (token margin 0.5, duration margin 2) at frame 0 -> frame 1; token 0 there
    # (margin 0.25; duration 1 by 3.0); token 2 on frame 2 (margin 4; duration 0 by 0.125), then
    # a blank row after the last token, whose margin belongs to no position.
    rows = np.array([[0.0, 0.0, 0.0, 0.5, 0.0, 2.0, 0.0],
                     [1.25, 0.0, 1.0, 0.0, 0.0, 3.0, 0.0],
                     [0.0, 0.0, 4.0, 0.0, 1.125, 1.0, 0.0],
                     [0.0, 0.0, 0.0, 0.01, 0.0, 9.0, 0.0]], dtype=np.float32)
    path = replay_path(rows, n_frames=3, durations=list(DURATIONS), max_symbols=10)
    assert (path.ids, path.frames) == ([0, 2], [1, 2])
    assert decision_margins(rows, path, len(DURATIONS)).tolist() == [0.25, 0.125]
    # on an encoder output of two frames, the path keeps its rows and tokens on frames 0, 1
    short = path.within(2)
    assert (short.ids, short.frames, short.row_frames, short.row_history) == (
        [0], [1], [0, 1], [0, 0])
    assert path.within(3) == path


def test_joint_of_wrong_width_raises():
    with pytest.raises(AudioparityError, match="expected \\[7\\]"):
        greedy_tdt(1, lambda t, g: np.zeros(6), lambda label, s: (None, None),
                   blank_id=BLANK, durations=DURATIONS, max_symbols=10)


# --------------------------------------------------------------------------------------------
# ggml blocks against NeMo's modules

V, H, J, D, LAYERS = 29, 24, 40, 32, 2


def small_config() -> ParakeetTDTConfig:
    return ParakeetTDTConfig(
        preprocessor=PreprocessorConfig(),
        encoder=EncoderConfig(feat_in=80, n_layers=1, d_model=D),
        decoder=DecoderConfig(vocab_size=V, pred_hidden=H, pred_rnn_layers=LAYERS),
        joint=JointConfig(num_classes=V, joint_hidden=J, encoder_hidden=D, pred_hidden=H,
                          num_extra_outputs=5),
        durations=(0, 1, 2, 3, 4),
    )


@pytest.fixture(scope="module")
def nemo_modules():
    """NeMo's RNNTDecoder and RNNTJoint at small sizes, weights re-drawn (seeded)."""
    torch = pytest.importorskip("torch")
    from nemo.collections.asr.modules import RNNTDecoder, RNNTJoint

    torch.manual_seed(0)
    decoder = RNNTDecoder(prednet={"pred_hidden": H, "pred_rnn_layers": LAYERS},
                          vocab_size=V, blank_as_pad=True).eval()
    joint = RNNTJoint(jointnet={"encoder_hidden": D, "pred_hidden": H, "joint_hidden": J,
                                "activation": "relu", "dropout": 0.0},
                      num_classes=V, num_extra_outputs=5, log_softmax=False).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for module in (decoder, joint):
            for param in module.parameters():
                param.copy_(0.5 * torch.randn(param.shape, generator=generator))
        decoder.prediction["embed"].weight[V].zero_()  # padding_idx row, as NeMo keeps it
    assert isinstance(decoder.prediction["dec_rnn"].lstm, torch.nn.LSTM)
    return decoder, joint


@pytest.fixture()
def ggml_decoder(nemo_modules):
    from audioparity.ggml import Runtime

    decoder, joint = nemo_modules
    arrays = {f"decoder.{k}": v.numpy() for k, v in decoder.state_dict().items()}
    # NeMo's joint_net is [activation, Linear] without dropout; the checkpoint index is 2.
    arrays |= {f"joint.{k}".replace("joint_net.1.", "joint_net.2."): v.numpy()
               for k, v in joint.state_dict().items()}
    with Runtime("cpu", threads=1) as runtime:
        weights = runtime.upload(arrays, dict.fromkeys(arrays, "f32"))
        with TdtDecoder(runtime, weights, small_config()) as tdt:
            yield tdt


def test_prediction_network_matches_nemo_rnnt_decoder(nemo_modules, ggml_decoder):
    import torch

    decoder, _ = nemo_modules
    state = None
    ours_state = None
    for label in (V, 5, 17, 0, V - 1, 5):
        with torch.inference_mode():
            g, state = decoder.predict(torch.tensor([[label]]), state, add_sos=False)
        ours_g, _, ours_state = ggml_decoder.predict(label, ours_state)
        np.testing.assert_allclose(ours_g, g[0, 0].numpy(), rtol=0, atol=2e-6)
        np.testing.assert_allclose(ours_state.h, state[0][:, 0].numpy(), rtol=0, atol=2e-6)
        np.testing.assert_allclose(ours_state.c, state[1][:, 0].numpy(), rtol=0, atol=2e-6)


def test_sos_step_equals_nemo_zero_input_step(nemo_modules, ggml_decoder):
    """The blank/SOS label (zero embedding row) equals NeMo's ``predict(None)`` zero input."""
    import torch

    decoder, _ = nemo_modules
    with torch.inference_mode():
        g, (h, c) = decoder.predict(None, None, add_sos=False, batch_size=1)
    ours_g, _, state = ggml_decoder.predict(V, None)
    np.testing.assert_allclose(ours_g, g[0, 0].numpy(), rtol=0, atol=2e-6)
    np.testing.assert_allclose(state.stacked(), torch.stack([h[:, 0], c[:, 0]], 1).numpy(),
                               rtol=0, atol=2e-6)


def test_joint_matches_nemo_rnnt_joint(nemo_modules, ggml_decoder):
    """``joint`` on aligned rows equals ``RNNTJoint.joint`` on the (t, u) grid's diagonal pairs."""
    import torch

    _, nemo_joint = nemo_modules
    rng = np.random.default_rng(2)
    enc = rng.standard_normal((7, D)).astype(np.float32)
    pred = rng.standard_normal((3, H)).astype(np.float32)
    with torch.inference_mode():
        reference = nemo_joint.joint(torch.from_numpy(enc)[None], torch.from_numpy(pred)[None])[0]
    frames, history = np.repeat(np.arange(7), 3), np.tile(np.arange(3), 7)
    with ggml_decoder.runtime.graph() as graph:
        out = joint(graph.ctx, ggml_decoder.weights, ggml_decoder.config,
                    graph.input("enc", enc[frames]), graph.input("pred", pred[history]))
        graph.output("logits", out, ndim=2)
        ours = graph.compute()["logits"]
    np.testing.assert_allclose(ours, reference[frames, history].numpy(), rtol=0, atol=2e-5)


def test_joint_step_after_projection_matches_nemo(nemo_modules, ggml_decoder):
    import torch

    _, nemo_joint = nemo_modules
    rng = np.random.default_rng(3)
    enc = torch.from_numpy(rng.standard_normal((1, 1, D)).astype(np.float32))
    pred = torch.from_numpy(rng.standard_normal((1, 1, H)).astype(np.float32))
    with torch.inference_mode():
        f, g = nemo_joint.project_encoder(enc), nemo_joint.project_prednet(pred)
        reference = nemo_joint.joint_after_projection(f, g)[0, 0, 0].numpy()
    np.testing.assert_allclose(ggml_decoder.encoder_projection(enc[0].numpy())[0],
                               f[0, 0].numpy(), rtol=0, atol=2e-6)
    ours = ggml_decoder.joint_step(f[0, 0].numpy(), g[0, 0].numpy())
    np.testing.assert_allclose(ours, reference, rtol=0, atol=2e-5)


# --------------------------------------------------------------------------------------------
# The tiny fixture against its NeMo reference dump


def test_fixture_replay_equals_reference_decode(parakeet_model, parakeet_reference):
    from audioparity.dumping.artifacts import Dump
    from audioparity.ggml import Runtime
    from audioparity.models.parakeet_tdt.config import load_config
    from audioparity.models.parakeet_tdt.greedy import replay_path
    from audioparity.models.parakeet_tdt.tokenizer import decode_document, load_tokenizer
    from tests.models.parakeet_tdt import uploaded

    reference = Dump(parakeet_reference)
    expected = reference.json("decode")
    enc_out = reference.tensor("enc_out")
    config = load_config(parakeet_model)
    path = replay_path(reference.tensor("joint_logits"), enc_out.shape[0],
                           list(config.durations), config.max_symbols)
    with Runtime("cpu", threads=1) as runtime:
        weights = uploaded(runtime, parakeet_model)
        with TdtDecoder(runtime, weights, config) as tdt:
            replay = decode_document(tdt.greedy(enc_out), load_tokenizer(parakeet_model))
            joint_logits, lstm_state_0 = tdt.teacher_forced(enc_out, path)
    assert replay == expected
    ref_logits = reference.tensor("joint_logits")
    assert joint_logits.shape == ref_logits.shape
    scale = np.abs(ref_logits).max()
    assert np.abs(joint_logits - ref_logits).max() <= 1e-5 * scale
    np.testing.assert_allclose(lstm_state_0, reference.tensor("lstm_state_0"), rtol=0, atol=1e-6)


def test_tokenizer_strips_one_space_before_vocabulary_punctuation():
    from audioparity.models.parakeet_tdt.tokenizer import Tokenizer

    # "." and "?" are plain pieces (punctuation); "\u2581!" starts with the word marker, so "!"
    # is not collected (NeMo's extract_punctuation_from_vocab), and "<unk>" is special.
    pieces = ["<unk>", "\u2581hi", "\u2581.", ".", "?", "\u2581!", "\u2581there"]
    tokenizer = Tokenizer(pieces, lambda ids: " ".join(pieces[i].strip("\u2581") for i in ids))
    assert tokenizer.ids_to_text([1, 3, 6, 4]) == "hi. there?"
    assert tokenizer.ids_to_text([1, 5]) == "hi !"
    assert tokenizer.ids_to_text([1, len(pieces)]) == "hi"  # the blank id is dropped


def test_log_softmax_stays_finite_far_below_the_best_class():
    """ConvASRDecoder's log_softmax in ggml: torch's float32 values, finite for a class 200
    below the best, where log(softmax) underflows to -inf."""
    import torch

    from audioparity.ggml import Runtime
    from audioparity.models.parakeet_tdt.ctc import log_softmax

    x = np.random.default_rng(0).standard_normal((7, 97)).astype(np.float32) * 3
    x[2, 5] -= 200.0
    with Runtime("cpu") as rt, rt.graph() as g:
        g.output("y", log_softmax(g.ctx, g.input("x", x)), ndim=2)
        out = g.compute()["y"]
    ref = torch.log_softmax(torch.from_numpy(x), dim=-1).numpy()
    assert np.isfinite(out).all()
    np.testing.assert_allclose(out, ref, rtol=1e-6, atol=2e-6)


def test_greedy_ctc_folds_repeats_drops_blanks_and_keeps_each_runs_first_frame():
    """NeMo's decode_hypothesis (fold_consecutive): a repeat after a blank is a new token."""
    from audioparity.models.parakeet_tdt.greedy import collapse_ctc, ctc_margins, greedy_ctc

    labels = [3, 1, 1, 3, 1, 2, 2, 3, 3, 0]
    path = collapse_ctc(labels, blank_id=3)
    assert (path.ids, path.frames) == ([1, 1, 2, 0], [1, 4, 5, 9])
    log_probs = np.log(np.full((10, 4), 0.1, np.float32))
    log_probs[np.arange(10), labels] = np.log(0.7)
    log_probs[6, 0] = np.log(0.65)  # a near tie inside the run of token 2
    assert greedy_ctc(log_probs, 3) == path
    margins = ctc_margins(log_probs, path)
    assert margins.shape == (4,) and margins[3] == pytest.approx(np.log(0.7 / 0.65), rel=1e-5)
