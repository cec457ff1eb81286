"""Faults planted in a copy of our own ports, run through the workflow as a user's sweep: one
sweep, each fault switched on by its own backend setting (``AUDIOPARITY_PLANTED`` in the
setting's ``env``), every cell judged against the same reference dumps. Each fault is named
where it is, and nowhere else: the culprits follow the data flow (docs/design.md,
"Culprits")."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from audioparity.report.culprit import SEPARATOR, check
from tests import MOSS_PROMPTS, REPO
from tests.workflow import workdir as wd

pytestmark = pytest.mark.slow

#: The planted fault's switch, read by the patched code.
SWITCH = "__import__('os').environ.get('AUDIOPARITY_PLANTED')"

#: (file under src/audioparity/models/, its exact original text, the replacement): each fault
#: acts only where its setting switches it on.
PATCHES = [
    # lstm: the prediction network's LSTM gates taken as f, i instead of torch's i, f.
    ("parakeet_tdt/decoder.py", "i = ggml.ggml_sigmoid(ctx, gate(0))",
     f"i = ggml.ggml_sigmoid(ctx, gate(1 if {SWITCH} == 'lstm' else 0))"),
    # mask: the end-to-end encoder masks out (zeroes) the last frame of layer 0's input, as a
    # padding mask one frame short would; the isolated layers, fed the reference's taps, are
    # right.
    ("parakeet_tdt/encoder.py",
     '        x = self._scaled(pre_encode)\n',
     '        x = self._scaled(pre_encode)\n'
     f"        if {SWITCH} == 'mask':\n"
     "            x = x.copy()\n"
     "            x[-1] = 0\n"),
    # two: the first subsampling conv's output rounded to f16, and layer 2's conv-module
    # LayerNorm without its bias.
    ("parakeet_tdt/subsampling.py",
     '    x = ggml.ggml_relu(ctx, add_channel_bias(ctx, x, w[p + "conv.0.bias"]))\n',
     '    x = ggml.ggml_relu(ctx, add_channel_bias(ctx, x, w[p + "conv.0.bias"]))\n'
     f"    if {SWITCH} == 'two':\n"
     "        x = ggml.ggml_cast(ctx, ggml.ggml_cast(ctx, x, ggml.GGML_TYPE_F16),"
     " ggml.GGML_TYPE_F32)\n"),
    ("parakeet_tdt/encoder.py",
     '        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], eps)',
     f'        if {SWITCH} == "two" and index == 2 and name == "norm_conv":\n'
     '            scale = w[f"{p}{name}.weight"]\n'
     '            return ggml.ggml_mul(ctx, ggml.ggml_norm(ctx, t, eps), scale)\n'
     '        return layer_norm(ctx, t, w[f"{p}{name}.weight"], w[f"{p}{name}.bias"], eps)'),
    # crash: the process dies building the positional table.
    ("parakeet_tdt/encoder.py",
     "        cfg = self.cfg\n        n_out = cfg.subsampled_length(n_mel_frames)\n",
     f"        if {SWITCH} == 'crash':\n"
     "            __import__('os').abort()\n"
     "        cfg = self.cfg\n        n_out = cfg.subsampled_length(n_mel_frames)\n"),
    # leak: the prediction network's state not reset between cases: each TdtDecoder after the
    # process's first starts from the state the last step left, not from zeros. A case run
    # fresh (its own process) is right; run again in one process, it is not.
    ("parakeet_tdt/decoder.py",
     "        self._graphs = GraphCache(runtime)\n",
     "        self._graphs = GraphCache(runtime)\n"
     f"        if {SWITCH} == 'leak':\n"
     "            TdtDecoder.made = getattr(TdtDecoder, 'made', 0) + 1\n"),
    ("parakeet_tdt/decoder.py",
     "        shape = (self.config.decoder.pred_rnn_layers, self.config.decoder.pred_hidden)\n",
     "        shape = (self.config.decoder.pred_rnn_layers, self.config.decoder.pred_hidden)\n"
     f"        if {SWITCH} == 'leak' and TdtDecoder.made > 1:\n"
     "            return TdtDecoder.last\n"),
    ("parakeet_tdt/decoder.py", '        return out["g"], out["g_proj"], new_state\n',
     '        TdtDecoder.last = new_state\n        return out["g"], out["g_proj"], new_state\n'),
    # dense: Whisper's encoder layer 1 scaled by 1 + 1e-4 at its output (NMSE 1e-8 on every
    # row), which q8_0's NMSE bound, sized for flipped roundings, lets through.
    ("whisper/encoder.py", '    return ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))\n',
     '    out = ggml.ggml_add(ctx, x, linear(ctx, w, p + "fc2", h))\n'
     f"    if {SWITCH} == 'dense' and index == 1:\n"
     "        out = ggml.ggml_scale(ctx, out, 1 + 1e-4)\n"
     "    return out\n"),
    # norm: MOSS's final RMSNorm with Llama's epsilon (1e-5) for Qwen3's (1e-6): dense, and far
    # under the max_rel bound.
    ("moss_voicegen/backbone.py",
     'hidden = rms_norm(ctx, x, self.weights["language_model.norm.weight"],\n'
     "                              lang.rms_norm_eps)",
     'hidden = rms_norm(ctx, x, self.weights["language_model.norm.weight"],\n'
     f"                              1e-5 if {SWITCH} == 'norm' else lang.rms_norm_eps)"),
    # embed: MOSS's codebook 1 embedding rows scaled by 1.2; the prompt's rows pad codebook 1
    # (a zero row), so only the generated rows read it.
    ("moss_voicegen/backbone.py",
     '        x = ggml.ggml_add(ctx, x, ggml.ggml_get_rows(ctx, w[f"emb_ext.{k}.weight"], '
     "ids[k + 1]))\n",
     '        rows = ggml.ggml_get_rows(ctx, w[f"emb_ext.{k}.weight"], ids[k + 1])\n'
     f"        if {SWITCH} == 'embed' and k == 1:\n"
     "            rows = ggml.ggml_scale(ctx, rows, 1.2)\n"
     "        x = ggml.ggml_add(ctx, x, rows)\n"),
]

#: Each family's faults, each a CPU backend setting of its own.
FAULTS = {"parakeet_tdt": ("lstm", "mask", "two", "crash", "leak"),
          "moss_voicegen": ("norm", "embed"),
          "whisper": ("dense",)}


#: Parakeet's recipe: q8_0 with what the prediction network's state needs kept f16 (on the
#: tiny fixture, nothing: uniform q8_0 moves it by NMSE 7e-9): every cell of q8_0+recipe
#: verifies it on its own dump.
RECIPES = {"recipe": {"wide": "f16", "targets": [{"stage": "lstm_state_0", "nmse_max": 1e-6}]}}


def setting(fault: str) -> dict:
    return {"name": f"cpu-{fault}", "backend": "cpu", "env": {"AUDIOPARITY_PLANTED": fault}}


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> pd.DataFrame:
    """The sweep, clean (``cpu``) and with each fault: the tiny Parakeet fixture on the clip at
    f32 and at a precision recipe's q8_0+recipe, the tiny MOSS fixture on one prompt at f32 and
    q8_0, the tiny Whisper fixture on the clip at q8_0; the summary's rows
    (``attrs["workdir"]``: its folder)."""
    config = wd.parakeet_config(weight_types=["f32", "q8_0+recipe"], recipes=RECIPES,
                                backends=["cpu", *map(setting, FAULTS["parakeet_tdt"])])
    config["families"] = list(FAULTS)
    config["moss_voicegen"] = {
        "models": [{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
        "cases": [{"name": "en-instruction", "path": str(MOSS_PROMPTS[0])}],
        "weight_types": ["f32", "q8_0"],
        "backends": ["cpu", *map(setting, FAULTS["moss_voicegen"])],
        "references": [{"name": "remote_code", "implementation": "remote_code"}],
        "reuse": False}  # fresh against reused: Parakeet's cells carry it (and its leak)
    config["whisper"] = {"weight_types": ["q8_0"], "reuse": False,
                         "backends": ["cpu", *map(setting, FAULTS["whisper"])],
                         "cases": [{"name": "clip",
                                    "path": str(REPO / "resources/speech/clip.wav")}]}
    workdir = wd.make_workdir(tmp_path_factory.mktemp("planted") / "run", config,
                              fresh_check=True)
    for file, old, new in PATCHES:
        path = workdir / "src/audioparity/models" / file
        text = path.read_text()
        assert text.count(old) == 1, (file, old)
        path.write_text(text.replace(old, new))
    wd.run_to_completion(workdir)
    rows = pd.read_csv(workdir / "results/report/summary.csv", dtype=str, keep_default_na=False)
    rows.attrs["workdir"] = workdir
    return rows


def our_cell(rows: pd.DataFrame, backend: str, weight_type: str = "f32",
             family: str = "parakeet_tdt", against: str = "reference") -> pd.DataFrame:
    """Our port's cell on ``backend`` against the reference (or ``against``)."""
    return rows[(rows.family == family) & (rows.backend == backend)
                & (rows.weight_type == weight_type) & (rows.candidate == "audioparity")
                & (rows.against == against)]


def culprits(rows: pd.DataFrame, backend: str, weight_type: str = "f32",
             family: str = "parakeet_tdt", against: str = "reference") -> list[str]:
    """The culprits of our port's cell on ``backend``, each as its stage and why."""
    cell = our_cell(rows, backend, weight_type, family, against)
    assert len(cell), (backend, weight_type)
    text = cell.culprit.iloc[0]
    return [one.split(":")[0] for one in text.split(SEPARATOR)] if text else []


def test_the_clean_port_passes(planted):
    for family, weight_types in (("parakeet_tdt", ["f32"]), ("moss_voicegen", ["f32", "q8_0"]),
                                 ("whisper", ["q8_0"])):
        for weight_type in weight_types:
            assert culprits(planted, "cpu", weight_type, family) == [], (family, weight_type)


def test_a_prediction_network_fault_is_named_at_lstm_state_0(planted):
    assert culprits(planted, "cpu-lstm") == ["lstm_state_0 (fail)"]


def test_a_port_fault_never_stops_the_recipe_and_its_cells_say_it_is_not_verified(planted):
    """The recipe's search runs no port: the faulty port's cells of q8_0+recipe are judged
    like any other, name the fault, and their row `recipe` says the port misses the recipe's
    target; the clean port verifies it; a crashed cell has no such row."""
    assert culprits(planted, "cpu-lstm", "q8_0+recipe") == ["lstm_state_0 (fail)"]
    assert culprits(planted, "cpu", "q8_0+recipe") == []
    recipe = {backend: our_cell(planted, backend, "q8_0+recipe").set_index("stage")
              for backend in ("cpu", "cpu-lstm", "cpu-crash")}
    assert recipe["cpu"].loc["recipe"].status == "pass"
    faulty = recipe["cpu-lstm"].loc["recipe"]
    assert faulty.status == "fail" and faulty.reason.startswith(
        "not verified: lstm_state_0 of clip: nmse "), faulty.reason
    assert "recipe" not in recipe["cpu-crash"].index
    document = json.loads((planted.attrs["workdir"] / "results/precision/parakeet_tdt/tiny/"
                           "q8_0+recipe.json").read_text())
    assert document["search"]["met"]


def test_a_mask_only_the_end_to_end_path_has_is_named_as_such(planted):
    assert culprits(planted, "cpu-mask") == [
        "layer_0 (fail, end to end only"]


def test_two_faults_in_one_cell_are_both_named(planted):
    assert culprits(planted, "cpu-two") == [
        "pre_encode (fail, its inputs pass; no isolated form to tell its own error)",
        "layer_2_isolated (fail, its own error)"]


def test_a_crash_is_named_at_the_stage_it_died_in(planted):
    assert culprits(planted, "cpu-crash") == ["pos_emb (crashed)"]


def test_a_setting_on_the_cpu_is_compared_with_the_cpu_but_not_drilled_into(planted):
    """A fault switched on by a setting's environment runs on both sides of a drill-down in
    one process: the comparison with the CPU names the stage, the drill-down says why it
    did not run."""
    against_cpu = planted[(planted.backend == "cpu-lstm") & (planted.against == "cpu")]
    assert "fail" in set(against_cpu[against_cpu.stage == "lstm_state_0"].status)
    folder = (planted.attrs["workdir"]
              / "results/drilldown/parakeet_tdt/tiny/audioparity/cpu-lstm/f32/clip")
    drilled = json.loads((folder / "drilldown.json").read_text())
    assert drilled["status"] == "not drilled" and "environment" in drilled["reason"]


def test_a_dense_fault_under_the_q8_0_nmse_bound_fails_its_isolated_layer_only(planted):
    """NMSE 1e-8 on every row of Whisper's layer 1, 100 times under the q8_0 isolated bound
    (2e-4, sized for flipped roundings): the median row NMSE, which a few flipped rows do not
    move, fails it."""
    rows = our_cell(planted, "cpu-dense", "q8_0", "whisper").set_index("stage")
    assert culprits(planted, "cpu-dense", "q8_0", "whisper") == [
        "layer_1_isolated (fail, its own error)"]
    isolated = rows.loc["layer_1_isolated"]
    assert float(isolated.nmse) < 2e-4 and "median_row_nmse" in isolated.reason


def test_a_norm_fault_under_the_max_rel_bound_fails_at_f32_on_nmse(planted):
    rows = our_cell(planted, "cpu-norm", "f32", "moss_voicegen").set_index("stage")
    assert rows.loc["last_hidden"].status == "fail" and "nmse" in rows.loc["last_hidden"].reason
    assert "max_rel" not in rows.loc["last_hidden"].reason
    assert culprits(planted, "cpu-norm", "f32", "moss_voicegen")[0] == (
        "last_hidden (fail, its inputs pass; no isolated form to tell its own error)")


def test_an_embedding_fault_free_generation_passes_at_a_near_tie_fails_the_teacher_forced_steps(
        planted):
    """The generated rows read codebook 1; the free-running generation parts at a near tie
    (and passes under its allowance); the steps fed the generated rows fail."""
    rows = our_cell(planted, "cpu-embed", "q8_0", "moss_voicegen").set_index("stage")
    assert rows.loc["generation"].status == "pass"
    assert float(rows.loc["generation"].token_match) < 1.0
    for stage in ("generation_text_logits", "generation_audio_logits"):
        assert rows.loc[stage].status == "fail", stage
    prefill = ["input_embeddings", "layer_0", "last_hidden", "text_logits", "audio_logits"]
    assert set(rows.loc[prefill].status) == {"pass"}


def test_a_state_kept_between_cases_passes_fresh_and_fails_run_again(planted):
    """The leak leaves the fresh cell right; the clip run twice in one process parts from its
    fresh run at the prediction network's first state, and the check fails naming it. Every
    other setting's run again equals its fresh run (a fault that is the same every run, the
    crash, whose fresh dump has nothing to run again, excepted)."""
    assert culprits(planted, "cpu-leak") == []
    assert culprits(planted, "cpu-leak", against="fresh") == ["lstm_state_0 (fail)"]
    leaked = our_cell(planted, "cpu-leak", against="fresh").set_index("stage")
    assert float(leaked.loc["lstm_state_0"].max_abs) > 0
    assert set(leaked.loc[["mel_features", "enc_out"]].status) == {"pass"}
    for backend in ("cpu", "cpu-lstm", "cpu-mask", "cpu-two"):
        fresh = our_cell(planted, backend, against="fresh")
        assert len(fresh) and set(fresh.status) == {"pass"}, backend
        assert set(fresh.gate) == {"identical"}
    assert our_cell(planted, "cpu-crash", against="fresh").empty
    code, lines = check(planted.to_dict("records"))
    assert code == 1 and any(line.startswith("parakeet_tdt/tiny/clip/audioparity/cpu-leak/f32 "
                                             "against fresh: lstm_state_0") for line in lines)
