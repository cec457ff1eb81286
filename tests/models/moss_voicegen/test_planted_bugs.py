"""Bugs planted in a copy of the MOSS ggml backbone, each caught at the stage that should see it
(the f32 dump of one prompt against the torch reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audioparity.compare.metrics import max_rel
from audioparity.compare.sequences import first_divergence
from audioparity.dumping.artifacts import Dump
from tests.models.moss_voicegen import F32_GATE, HIDDEN_STAGES, PROMPT
from tests.planted import Patch, failing, planted_crash, planted_dump, planted_rows

#: Planted bugs, all in backbone.py.
BUGS: dict[str, list[Patch]] = {bug: [("backbone.py", old, new)] for bug, (old, new) in {
    "rope_offset_in_step": ("positions=np.array([self.n_past])",
                            "positions=np.array([self.n_past + 3])"),
    "no_causal_mask": ("positions=np.arange(len(rows)), causal=True)",
                       "positions=np.arange(len(rows)), causal=False)"),
    "skipped_codebook": ("for k in range(config.n_vq):", "for k in range(config.n_vq - 1):"),
    # the KV-cache copy built but never added to the graph: attention reads unwritten rows
    "kv_write_not_in_graph": ("        g.expand(ggml.ggml_cpy(", "        (ggml.ggml_cpy("),
    "no_qk_norm": ('    q = rms_norm(ctx, q, w[p + "q_norm.weight"], lang.rms_norm_eps)\n'
                   '    k = rms_norm(ctx, k, w[p + "k_norm.weight"], lang.rms_norm_eps)\n', ""),
}.items()}


@pytest.mark.parametrize("bug", BUGS)
def test_planted_bug_is_caught_at_its_stage(tmp_path: Path, moss_model: Path,
                                            moss_references: dict[str, Dump], bug: str) -> None:
    ref = moss_references[PROMPT.stem]
    cand = planted_dump(tmp_path, "moss_voicegen", BUGS[bug], moss_model, PROMPT, ref.path)
    err = {stage: max_rel(cand.tensor(stage), ref.tensor(stage)) for stage in HIDDEN_STAGES}
    diverged = first_divergence(cand.json("generation")["rows"], ref.json("generation")["rows"])
    if bug == "rope_offset_in_step":  # RoPE is relative: only the cached step sees the offset
        assert err["step_last_hidden"] > 1e-2
        assert max(err["last_hidden"], err["probe_hidden"]) <= F32_GATE
    elif bug == "no_causal_mask":  # the last row attends to everything anyway: every other
        # row of the first layer is off, its last row is not
        assert err["probe_hidden"] > 0.1 and err["layer_0"] > 0.1
        assert max_rel(cand.tensor("layer_0")[-1], ref.tensor("layer_0")[-1]) <= F32_GATE
        assert err["probe_hidden"] > 5 * err["last_hidden"]
    elif bug == "skipped_codebook":  # prompt codes are all pad (zero rows): only generation
        assert max(err.values()) <= F32_GATE
        assert diverged is not None
    else:
        assert err["layer_0"] > 1e-2 and err["last_hidden"] > 1e-2


#: The final norm with Llama's RMSNorm epsilon (1e-5) for Qwen3's (the config's rms_norm_eps,
#: 1e-6): each row scaled by ~2e-6 off, a dense error that max_rel bounds to the peak's
#: scale only.
WRONG_NORM_EPS: list[Patch] = [(
    "backbone.py",
    'hidden = rms_norm(ctx, x, self.weights["language_model.norm.weight"],\n'
    "                              lang.rms_norm_eps)",
    'hidden = rms_norm(ctx, x, self.weights["language_model.norm.weight"],\n'
    "                              1e-5)",
)]


def test_a_wrong_norm_epsilon_fails_the_final_hidden_states_on_nmse(
        tmp_path: Path, moss_model: Path, moss_references: dict[str, Dump]) -> None:
    """The f32 gates bound NMSE as well as max_rel: a wrong epsilon in the final RMSNorm stays
    well under the max_rel bound, yet fails last_hidden on NMSE, and nothing upstream of the
    norm; the clean copy passes every stage."""
    reference = moss_references[PROMPT.stem].path
    clean, bug = (planted_rows(tmp_path / name, "moss_voicegen", patches, moss_model, PROMPT,
                               reference)
                  for name, patches in (("clean", []), ("bug", WRONG_NORM_EPS)))
    assert failing({stage: row["status"] for stage, row in clean.items()}) == set()
    got = {stage: row["status"] for stage, row in bug.items()}
    assert got["last_hidden"] == "fail" and "nmse" in bug["last_hidden"]["reason"]
    assert {got[stage] for stage in ("input_embeddings", "layer_0", "layer_1")} == {"pass"}
    assert bug["last_hidden"]["max_rel"] < F32_GATE / 2
    assert bug["last_hidden"]["nmse"] > 10 * clean["last_hidden"]["nmse"]


#: An exception in the teacher-forced phase: the port raises once it has prefilled the
#: reference's prompt rows, before the first step along its path.
TEACHER_FORCED_CRASH: list[Patch] = [(
    "stages.py", "    full = prefill(prompt_rows)\n",
    "    full = prefill(prompt_rows)\n    raise RuntimeError('boom')  # planted\n",
)]


def test_a_crash_in_the_teacher_forced_steps_keeps_what_was_computed_and_names_its_stage(
        tmp_path: Path, moss_model: Path, moss_references: dict[str, Dump]) -> None:
    """The port raises along the reference's path (the phase of generation_text_logits), after
    the prompt, the prefill and its own generation: the guard keeps those, each compared and
    passing; generation_text_logits is crashed with the exception's last line, and
    generation_audio_logits and step_last_hidden, never computed, are missing (not charged to
    the first stage the dump lacks in pipeline order, step_last_hidden)."""
    reference = moss_references[PROMPT.stem].path
    dump, rows = planted_crash(tmp_path, "moss_voicegen", TEACHER_FORCED_CRASH, moss_model,
                               PROMPT, reference)
    assert dump.status == "crashed" and dump.manifest["crashed_in"] == "generation_text_logits"
    kept = {"prompt", "input_embeddings", "layer_0", "layer_1", "last_hidden", "probe_hidden",
            "text_logits", "audio_logits", "generation"}
    assert {*dump.tensor_names, *dump.manifest["documents"]} == kept | {"generation_margins"}
    status = {stage: row["status"] for stage, row in rows.items()}
    assert {stage for stage, got in status.items() if got == "pass"} == kept
    assert status["generation_text_logits"] == "crashed"
    assert rows["generation_text_logits"]["reason"] == "exit code 1: RuntimeError: boom"
    assert status["generation_audio_logits"] == status["step_last_hidden"] == "missing"
    assert rows["step_last_hidden"]["reason"] == ("not computed: the dump crashed in "
                                                  "generation_text_logits (exit code 1: "
                                                  "RuntimeError: boom)")
