"""The harness catches real Whisper port bugs at the right stage, with the default config's f32
gates.

Each test plants one bug, of a kind port authors make, in a copy of the package (copied to a
temporary directory, one source line replaced), runs the ggml dump from that copy against the
reference dump of the shipped clip, compares, and checks which stages fail: the planted stage
and those downstream of it, never those upstream, and the isolated layers only where the bug
sits inside a layer. The clean copy passes everything, so a failure is the bug's doing.
"""

from __future__ import annotations

import pytest

from tests.planted import Patch, failing, planted_crash, planted_statuses

pytestmark = pytest.mark.slow

BUGS: dict[str, list[Patch]] = {
    "clean": [],
    # ggml_gelu is the tanh approximation (gelu_new), not nn.functional.gelu.
    "tanh_gelu": [(
        "encoder.py", "    return ggml.ggml_gelu_erf(ctx, x)", "    return ggml.ggml_gelu(ctx, x)",
    )],
    # ggml_conv_1d, as whisper.cpp runs the convs: its im2col is F16 (the kernel must be too),
    # an f16 rounding of the activations and kernels inside the f32 path.
    "f16_im2col": [(
        "encoder.py",
        '    kernel = w[name + ".weight"]\n',
        '    kernel = w[name + ".weight"]\n'
        "    f16 = ggml.ggml_cast(ctx, kernel, ggml.GGML_TYPE_F16)\n"
        "    out = ggml.ggml_conv_1d(ctx, f16, x, stride, padding, 1)  # ne [T', out]\n"
        "    out = ggml.ggml_cont(ctx, ggml.ggml_transpose(ctx, out))\n"
        '    return ggml.ggml_add(ctx, out, w[name + ".bias"])\n',
    )],
    # The query is not scaled by head_dim ** -0.5.
    "no_query_scaling": [("encoder.py", "cfg.head_dim**-0.5)", "1.0)")],
    # The position table is not added before layer 0.
    "no_positions": [("encoder.py", "    return ggml.ggml_add(ctx, x, rows)", "    return x")],
    # A symmetric Hann window (torch.hann_window(n, periodic=False)) in the frontend.
    "symmetric_hann": [(
        "frontend.py", "np.float32(2.0 * np.pi / n_fft)", "np.float32(2.0 * np.pi / (n_fft - 1))",
    )],
    # One f16 rounding in the decoder: the cross-attention's query of every layer.
    "f16_cross_query": [(
        "decoder.py",
        "    frames = config.n_frames\n",
        "    frames = config.n_frames\n"
        "    q = ggml.ggml_cast(ctx, ggml.ggml_cast(ctx, q, ggml.GGML_TYPE_F16), F32)\n",
    )],
    # The decoder self-attention's out_proj without its bias.
    "no_self_attention_out_bias": [(
        "decoder.py",
        '                    caches.read(ctx, f"self.v.{layer}", start + n), mask)\n'
        '    return linear(ctx, w, prefix + "out_proj", out)',
        '                    caches.read(ctx, f"self.v.{layer}", start + n), mask)\n'
        '    return ggml.ggml_mul_mat(ctx, w[prefix + "out_proj.weight"], out)',
    )],
    # A cached step reads the position table one row early (the prefill is right).
    "step_position_off_by_one": [(
        "decoder.py", "start * table.contents.nb[1])", "max(start - 1, 0) * table.contents.nb[1])",
    )],
    # A bias on the keys (the queries' bias reused): no bug in effect, see its test.
    "key_bias": [(
        "encoder.py",
        '    k = linear(ctx, w, prefix + "k_proj", x)',
        '    k = ggml.ggml_add(ctx, linear(ctx, w, prefix + "k_proj", x),'
        ' w[prefix + "q_proj.bias"])',
    )],
}


@pytest.fixture(scope="module")
def statuses(whisper_model, clip_wav, whisper_reference, tmp_path_factory):
    """Run every planted copy once; {bug: {stage: status}} under the config's f32 gates."""
    return {bug: planted_statuses(tmp_path_factory.mktemp(bug), "whisper", patches,
                                  whisper_model, clip_wav, whisper_reference)
            for bug, patches in BUGS.items()}


ENCODER = {"mel_features", "conv_out", "layer_0", "layer_0_isolated", "layer_1",
           "layer_1_isolated", "enc_out"}
#: The decoder's stages fed our enc_out: downstream of every encoder stage.
DECODER_END_TO_END = {"decoder_layer_0", "decoder_layer_1", "decoder_logits"}
DECODER = DECODER_END_TO_END | {"decoder_layer_0_isolated", "decoder_layer_1_isolated"}
#: The fixture's greedy decodes repeat one token with margins of 0.3 and more: no bug here
#: moves them, so they pass throughout (the tensors carry the faults).
DECODES = {"decode", "decoder_replay"}
ALL_STAGES = ENCODER | DECODER | DECODES


def test_clean_copy_passes_every_stage(statuses):
    assert set(statuses["clean"]) == ALL_STAGES
    assert failing(statuses["clean"]) == set()


def test_tanh_gelu_fails_at_conv_out_and_in_every_layer(statuses):
    assert failing(statuses["tanh_gelu"]) == ENCODER - {"mel_features"} | DECODER


def test_f16_rounding_in_the_convs_fails_at_conv_out_not_in_the_layers(statuses):
    assert failing(statuses["f16_im2col"]) == {"conv_out", "layer_0", "layer_1",
                                               "enc_out"} | DECODER_END_TO_END


def test_unscaled_queries_fail_every_layer_but_nothing_before(statuses):
    assert failing(statuses["no_query_scaling"]) == (ENCODER - {"mel_features", "conv_out"}
                                                     | DECODER_END_TO_END)


def test_missing_positions_fail_at_layer_0_not_at_conv_out(statuses):
    got = statuses["no_positions"]
    assert failing(got) == {"layer_0", "layer_0_isolated", "layer_1",
                            "enc_out"} | DECODER_END_TO_END
    assert got["layer_1_isolated"] == "pass"  # fed the reference's layer_0


def test_symmetric_window_fails_at_mel_features_and_downstream_only(statuses):
    assert failing(statuses["symmetric_hann"]) == {"mel_features", "conv_out", "layer_0",
                                                   "layer_1", "enc_out"} | DECODER_END_TO_END


def test_one_f16_rounding_in_the_decoder_fails_its_layer_and_no_encoder_stage(statuses):
    """The cross-attention's query rounded to f16 in every layer: each layer fails alone on the
    reference's input, layer 1 too, though its cross-attention is nearly uniform over the 1500
    frames on this fixture, so the rounded scores barely move its output (NMSE 6.9e-11, under
    the end-to-end bound of 1e-10 its isolated form once took; its own is 2e-12)."""
    got = statuses["f16_cross_query"]
    assert failing(got) == {"decoder_layer_0", "decoder_layer_0_isolated", "decoder_layer_1",
                            "decoder_layer_1_isolated"}


def test_a_dropped_bias_fails_every_decoder_layer_alone(statuses):
    assert failing(statuses["no_self_attention_out_bias"]) == DECODER


def test_a_wrong_position_in_the_cached_steps_fails_the_teacher_forced_stages_only(statuses):
    """The teacher-forced stages run through the KV-cached steps; the isolated layers run
    the sequence in one graph from position 0, which the bug leaves right."""
    assert failing(statuses["step_position_off_by_one"]) == DECODER_END_TO_END


def test_a_key_bias_is_invisible_to_softmax(statuses):
    """A bias on the keys adds ``q . b`` to every score of a query, the same for all its keys:
    softmax cancels it (that is why ``WhisperAttention`` has none). The harness cannot see it,
    and need not: the outputs are the same to float32 rounding."""
    assert failing(statuses["key_bias"]) == set()


#: An exception in the teacher-forced phase: the decoder raises once it has run the prompt.
TEACHER_FORCED_CRASH: list[Patch] = [(
    "decoder.py", "        steps = [self.forward(list(tokens[:prefill]), 0)]\n",
    "        steps = [self.forward(list(tokens[:prefill]), 0)]\n"
    "        raise RuntimeError('boom')  # planted\n",
)]


def test_a_crash_in_the_teacher_forced_decoder_keeps_the_encoder_and_names_its_stage(
        whisper_model, clip_wav, whisper_reference, tmp_path):
    """The port raises in the teacher-forced decoder (the phase of decoder_layer_0, which
    computes every decoder layer and the logits): the guard keeps every encoder stage, each
    compared and passing; decoder_layer_0 is crashed with the exception's last line, and the
    decoder stages the dump never reached are missing."""
    dump, rows = planted_crash(tmp_path, "whisper", TEACHER_FORCED_CRASH, whisper_model,
                               clip_wav, whisper_reference)
    assert dump.status == "crashed" and dump.manifest["crashed_in"] == "decoder_layer_0"
    assert set(dump.tensor_names) == ENCODER
    status = {stage: row["status"] for stage, row in rows.items()}
    assert {stage for stage, got in status.items() if got == "pass"} == ENCODER
    assert status.pop("decoder_layer_0") == "crashed"
    assert rows["decoder_layer_0"]["reason"] == "exit code 1: RuntimeError: boom"
    assert {stage: status[stage] for stage in ALL_STAGES - ENCODER - {"decoder_layer_0"}} == (
        dict.fromkeys(ALL_STAGES - ENCODER - {"decoder_layer_0"}, "missing"))
    assert "the dump crashed in decoder_layer_0 (exit code 1: RuntimeError: boom)" in (
        rows["decode"]["reason"])
