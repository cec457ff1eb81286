"""The precision search (audioparity.compare.precision): the bisection and its pruning on a search
whose answer is known, the sensitivities against float64, recipes read and refused, and the whole
search on the trained Parakeet, whose q4_0 decode changes words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from audioparity.compare.precision import Trial, bisect, sensitivities
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.storage import stored
from audioparity.dumping.weight_files import Recipe, read_recipe
from tests import RESOURCES
from tests.test_storage import _emulated_product


class KnownSearch:
    """A search that passes exactly when every weight of ``needed`` is kept wide."""

    wide = "q8_0"

    def __init__(self, needed: set[str], passes_wide: bool = True) -> None:
        self.needed, self.passes_wide, self.tried = needed, passes_wide, []

    def trial(self, wide):
        self.tried.append(tuple(wide))
        passed = self.needed <= set(wide) and (self.passes_wide or len(wide) < 4)
        return Trial(tuple(wide), passed, [{"stage": "decode", "case": "c", "status":
                                            "pass" if passed else "fail", "reason": "r"}])


RANKED = ["a", "b", "c", "d", "e", "f", "g", "h"]


def test_a_uniform_type_that_passes_needs_no_recipe():
    search = KnownSearch(set())
    assert bisect(search, RANKED)[0] == ()
    assert search.tried == [()]


def test_bisection_then_pruning_keeps_exactly_the_weights_needed():
    """b and e are needed: bisection over the ranking finds the first 5 (a..e), pruning drops
    d, c and a (each still passes without it), and keeps e and b."""
    search = KnownSearch({"b", "e"})
    wide, trials = bisect(search, RANKED)
    assert sorted(wide) == ["b", "e"]
    assert trials["uniform"].passed is False and trials["wide"].passed is True
    assert trials["recipe"].wide == wide and trials["recipe"].passed
    assert search.tried[:2] == [(), tuple(RANKED)]


def test_targets_no_recipe_meets_are_a_result_every_weight_wide_and_failing():
    """No error: the sweep judges every cell of the weight type, and each says the search
    missed its targets (the recipe's `search.met`)."""
    search = KnownSearch({"a"}, passes_wide=False)
    wide, trials = bisect(search, RANKED)
    assert wide == tuple(RANKED) and trials["recipe"] is trials["wide"]
    assert not trials["recipe"].passed
    assert search.tried == [(), tuple(RANKED)]


@pytest.mark.parametrize("storage", ["q4_0", "q4_1"])
def test_sensitivity_is_the_matmuls_nmse_on_the_inputs_it_was_fed(storage: str):
    """A Linear's sensitivity equals float64 NMSE of its product as ggml computes it (q4_1: with
    the min term of its q8_1 input) on the captured input; a weight two modules share is
    measured once, under the first module's name."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.Linear(32, 64, bias=False))
    tied = torch.nn.Linear(32, 64, bias=False)
    tied.weight = net[1].weight
    model = torch.nn.ModuleDict({"net": net, "tied": tied}).requires_grad_(False)
    x = torch.randn(10, 64)
    found = sensitivities(model, lambda: model["tied"](model["net"][0](x)) + net(x), storage)
    assert set(found) == {"net.0.weight", "net.1.weight"}
    w = net[0].weight.numpy()
    exact = x.double().numpy() @ w.astype(np.float64).T
    quantized = _emulated_product(x.numpy(), stored(w, storage), storage)
    expected = float(np.sum((quantized - exact) ** 2) / np.sum(exact ** 2))
    assert found["net.0.weight"] == pytest.approx(expected, rel=1e-9)


def test_a_recipe_is_read_and_checked(tmp_path: Path):
    path = tmp_path / "recipe.json"
    path.write_text(json.dumps({"base": "q4_K", "overrides": {"a.weight": "q8_0"}}))
    recipe = read_recipe(path, "q4_K+mine")
    assert recipe == Recipe("mine", "q4_K", {"a.weight": "q8_0"})
    assert recipe.storage("a.weight") == "q8_0" and recipe.storage("b.weight") == "q4_K"
    with pytest.raises(AudioparityError, match=r"its base is q4_K, so its weight type is "
                       r"q4_K\+<name>, not q4_0\+mine"):
        read_recipe(path, "q4_0+mine")
    path.write_text(json.dumps({"base": "q4_K", "overrides": {"a.weight": "q9"}}))
    with pytest.raises(AudioparityError, match=r"a.weight asks for 'q9'"):
        read_recipe(path, "q4_K+mine")


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "audioparity.cli", *args], capture_output=True,
                          text=True)


MODEL = str(RESOURCES / "models/parakeet-tdt-espeak/model.nemo")
CLIP = str(RESOURCES / "speech/clip.wav")


def test_a_recipe_weight_type_without_its_file_is_refused(tmp_path: Path):
    done = _cli("ggml", "parakeet-tdt", "--model", MODEL, "--audio", CLIP, "--reference-dir",
                str(tmp_path), "--output-dir", str(tmp_path / "out"), "--weight-type",
                "q4_0+recipe")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "audioparity: error: weight type q4_0+recipe: give its recipe as --recipe "
        "q4_0+recipe=<file>")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("--weight-type", "q4_0", "--targets", '[{"stage": "nope", "wer_max": 0}]'),
     "precision: target stage 'nope' matches no stage of parakeet_tdt (mel_features, "
     "pre_encode, pos_emb, layer_{i}, enc_out, joint_logits, lstm_state_0, decode, "
     "decode_logits, ctc_logits, ctc_decode)"),
    (("--weight-type", "q4_0", "--targets", '[{stage: decode}'),
     "--targets '[{stage: decode}': not JSON (Expecting property name enclosed in double "
     "quotes: line 1 column 3 (char 2))"),
    (("--weight-type", "q8_0", "--wide", "q4_0", "--targets", '[{"stage": "decode"}]'),
     "precision: --wide q4_0 (4.5 bits per weight) is no wider than q8_0 (8.5)"),
])
def test_bad_targets_are_refused_before_the_model_loads(args, message, tmp_path: Path):
    done = _cli("precision", "parakeet-tdt", "--model", MODEL, "--audio", CLIP, *args,
                "--output", str(tmp_path / "recipe.json"))
    assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (
        1, f"audioparity: error: {message}")
    assert "NeMo" not in done.stderr and not (tmp_path / "recipe.json").exists()


def test_a_recipe_naming_no_weight_of_the_model_is_refused_by_both_sides(tmp_path: Path):
    """The reference before it dumps anything, the ggml side's storage policy (here converting
    the weights) with the same line."""
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"base": "q4_0", "overrides": {"joint.nope.weight": "q8_0"}}))
    message = ("audioparity: error: recipe q4_0+r: joint.nope.weight is no matmul weight of "
               "this model (1 override(s) name none)")
    reference = _cli("reference", "parakeet-tdt", "--model", MODEL, "--audio", CLIP,
                     "--output-dir", str(tmp_path / "ref"), "--emulate", "q4_0+r",
                     "--recipe", f"q4_0+r={recipe}")
    ggml = _cli("weights", "parakeet-tdt", "--model", MODEL, "--output",
                str(tmp_path / "q4_0+r.gguf"), "--weight-type", "q4_0+r", "--recipe",
                f"q4_0+r={recipe}")
    for done in (reference, ggml):
        assert (done.returncode, done.stderr.strip().splitlines()[-1]) == (1, message)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["recipe.json"]


@pytest.mark.slow
def test_the_search_buys_back_the_trained_parakeet_s_decode_at_q4_0(tmp_path: Path):
    """At q4_0 the trained Parakeet's decode of clip leaves the float32 one; the recipe keeps
    fewer than all weights wide, brings both decodes back on the reference and on our port,
    and costs bits between uniform q4_0 and every matmul weight at q8_0."""
    output = tmp_path / "recipe.json"
    done = subprocess.run([
        sys.executable, "-m", "audioparity.cli", "precision", "parakeet-tdt", "--model",
        str(RESOURCES / "models/parakeet-tdt-espeak/model.nemo"),
        "--audio", str(RESOURCES / "speech/clip.wav"),
        "--audio", str(RESOURCES / "speech/heldout.wav"), "--weight-type", "q4_0",
        "--targets", '[{"stage": "decode", "wer_max": 0.0}]', "--output", str(output)],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    recipe = json.loads(output.read_text())
    trials = recipe["trials"]
    assert not trials["uniform"]["passed"] and trials["recipe"]["passed"]
    assert 0 < len(recipe["overrides"]) < trials["wide"]["wide"]
    assert set(recipe["overrides"].values()) == {"q8_0"}
    assert recipe["search"]["met"] and recipe["search"]["unmet"] is None
    assert recipe["verified"]["passed"]
    assert {row["case"] for row in recipe["verified"]["rows"]} == {"clip", "heldout"}
    bits = recipe["bits_per_weight"]
    assert bits["uniform"] < bits["recipe"] < bits["wide"]
    assert recipe["forms"]["tensor_type"] == [f"{w}=q8_0" for w in recipe["overrides"]]
    assert read_recipe(output, "q4_0+recipe").overrides == recipe["overrides"]
