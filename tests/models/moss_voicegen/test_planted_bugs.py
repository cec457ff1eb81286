"""Bugs planted in a copy of the MOSS ggml backbone, each caught at the stage that should see it
(the f32 dump of one prompt against the torch reference)."""

from __future__ import annotations

from pathlib import Path

import pytest

from audioparity.artifacts import Dump
from audioparity.compare.metrics import first_divergence, max_rel
from tests.models.moss_voicegen import F32_GATE, HIDDEN_STAGES, PROMPT
from tests.planted import Patch, planted_dump

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
    cand = planted_dump(tmp_path, "moss_voicegen", BUGS[bug], moss_model, PROMPT)
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
