"""The ``transformers`` reference of MOSS (transformers' ``Qwen3Model``, embeddings and heads as
torch ops on the checkpoint's tensors) against the ``remote_code`` one, stage by stage, on the
tiny fixtures: within bounds a float32-correct path meets, and a planted fault outside them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from audioparity.cli import main
from audioparity.compare import metrics as m
from audioparity.compare.documents import document_metrics
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import ReplaySettings, dump_reference, dump_replay
from audioparity.models.moss_voicegen.references import transformers as tr
from tests import MOSS_PROMPTS
from tests.models.moss_voicegen import F32_GATE, FAMILY, PROMPT, options

TRANSFORMERS = tr.Transformers.name

#: Bounds of a float32-correct reference against another: the family's f32 gate (max_rel), an
#: NMSE as the config's float32 layers, the same argmax of every logits row, and the same
#: documents (prompt rows, generated rows).
NMSE_MAX = 1e-10
#: The tiny fixtures: name -> fixture options.
FIXTURES = {"tiny": {}, "tiny-massive": {"massive_activation": True},
            "tiny-remote-code": {"remote_code": True}}


def disagreements(cand: Dump, ref: Dump) -> dict[str, str]:
    """Each stage of ``ref`` (tensors, ``generation_margins`` among them, and documents) that
    ``cand`` lacks or holds outside the bounds (module notes), with its figures."""
    found = {}
    for name in ref.tensor_names:
        if not cand.has(name):
            found[name] = "missing"
            continue
        a, b = cand.tensor(name), ref.tensor(name)
        figures = {"nmse": m.nmse(a, b), "max_rel": m.max_rel(a, b)}
        if name.endswith("_logits"):
            figures["top1"] = m.top1(np.atleast_2d(a), np.atleast_2d(b))
        if a.shape != b.shape or not (figures["nmse"] <= NMSE_MAX
                                      and figures["max_rel"] <= F32_GATE
                                      and figures.get("top1", 1.0) == 1.0):
            found[name] = f"{list(a.shape)} {figures}"
    for name in ref.manifest.get("documents", {}):
        result = document_metrics(cand.json(name), ref.json(name))
        if not result["exact"]:
            found[name] = f"token_match {result['token_match']}, differing {result['differing']}"
    return found


@pytest.fixture(scope="module")
def pairs(fixture_model, moss_references: dict[str, Dump], tmp_path_factory
          ) -> dict[str, dict[str, tuple[Dump, Dump]]]:
    """Fixture name -> prompt stem -> ``(transformers dump, remote_code dump)``, every shipped
    prompt, one model load per fixture and implementation."""
    root = tmp_path_factory.mktemp("moss_transformers")
    found = {}
    for fixture, fixture_options in FIXTURES.items():
        model = fixture_model("moss_voicegen", **fixture_options)
        implementations = (TRANSFORMERS,) if fixture == "tiny" else (TRANSFORMERS, "remote_code")
        for implementation in implementations:
            dump_reference(FAMILY, model,
                           [(p, root / fixture / implementation / p.stem) for p in MOSS_PROMPTS],
                           options=options("reference", implementation=implementation))
        found[fixture] = {
            p.stem: (Dump(root / fixture / TRANSFORMERS / p.stem),
                     moss_references[p.stem] if fixture == "tiny"
                     else Dump(root / fixture / "remote_code" / p.stem))
            for p in MOSS_PROMPTS}
    return found


@pytest.mark.parametrize("fixture", FIXTURES)
def test_transformers_reference_agrees_stage_by_stage(pairs, fixture: str) -> None:
    for stem, (cand, ref) in pairs[fixture].items():
        assert cand.manifest["producer"] == TRANSFORMERS
        assert ref.manifest["producer"] == "remote_code"
        assert sorted(cand.tensor_names) == sorted(ref.tensor_names), stem
        assert disagreements(cand, ref) == {}, f"{fixture} {stem}"


@pytest.mark.parametrize("fixture", FIXTURES)
def test_transformers_reference_is_bitwise_the_remote_code_one(pairs, fixture: str) -> None:
    """What was measured: both run transformers' ``Qwen3Model`` (the checkpoint's code wraps
    the same class) on the same float32 weights, add the codebook embeddings in the same order
    and multiply the heads over every row as upstream, so every value is the same float; the
    remote-code fixture runs a copy of the built-in code, loaded by trust_remote_code."""
    for stem, (cand, ref) in pairs[fixture].items():
        for name in ref.tensor_names:
            np.testing.assert_array_equal(cand.tensor(name), ref.tensor(name),
                                          err_msg=f"{fixture} {stem} {name}")


def _swapped_codebooks(model, rows):
    """Planted fault: codebook ``k`` looked up in codebook ``k+1``'s table (cyclically)."""
    import torch.nn.functional as F

    tables = model.codebook_embeddings
    embeddings = model.backbone.embed_tokens(rows[..., 0])
    for k in range(len(tables)):
        embeddings = embeddings + F.embedding(rows[..., k + 1], tables[(k + 1) % len(tables)])
    return embeddings


def _without_final_norm(load_model):
    """Planted fault: the backbone's final RMSNorm left out."""
    import torch

    def load(model_dir, config):
        loaded = load_model(model_dir, config)
        loaded.backbone.norm = torch.nn.Identity()
        return loaded
    return load


@pytest.mark.parametrize(("fault", "first"), [
    # the prompt's codebook columns hold only the pad code, whose rows are zero in every
    # table: the prefill cannot see the swap, the steps fed the generated rows (real codes) do
    ("swapped_codebooks", "generation_text_logits"),
    ("no_final_norm", "last_hidden"),
])
def test_a_planted_fault_fails_the_bounds(moss_model: Path, moss_references: dict[str, Dump],
                                          tmp_path: Path, monkeypatch, fault: str,
                                          first: str) -> None:
    if fault == "swapped_codebooks":
        monkeypatch.setattr(tr, "input_embeddings", _swapped_codebooks)
    else:
        monkeypatch.setattr(tr, "load_model", _without_final_norm(tr.load_model))
    dump_reference(FAMILY, moss_model, [(PROMPT, tmp_path / "planted")],
                   options=options("reference", implementation=TRANSFORMERS))
    found = disagreements(Dump(tmp_path / "planted"), moss_references[PROMPT.stem])
    assert found and min(found, key=FAMILY.spec.stage_key) == first, found
    if fault == "swapped_codebooks":
        assert not {"input_embeddings", "last_hidden", "text_logits"} & set(found), found


def test_the_command_dumps_the_transformers_reference(moss_model: Path, tmp_path: Path,
                                                      moss_references: dict[str, Dump]) -> None:
    assert main(["reference", "moss-voicegen", "--model", str(moss_model), "--prompt",
                 str(PROMPT), "--output-dir", str(tmp_path / "ref"), "--implementation",
                 TRANSFORMERS]) == 0
    dump = Dump(tmp_path / "ref")
    assert dump.manifest["producer"] == TRANSFORMERS
    assert dump.manifest["modeling"] == "transformers Qwen3Model"
    assert disagreements(dump, moss_references[PROMPT.stem]) == {}


def test_no_quantization_aware_or_replayed_transformers_reference(
        moss_model: Path, moss_references: dict[str, Dump], tmp_path: Path) -> None:
    """Its embeddings and heads are no modules to round, and replay is remote_code's: each
    refused in one line."""
    given = options("reference", implementation=TRANSFORMERS)
    with pytest.raises(AudioparityError, match="no quantization-aware form"):
        dump_reference(FAMILY, moss_model, [(PROMPT, tmp_path / "q8")], options=given,
                       emulate=["q8_0"])
    assert not (tmp_path / "q8").exists()
    with pytest.raises(AudioparityError, match="the transformers reference has no replay; "
                       "replay with --implementation remote_code"):
        dump_replay(FAMILY, moss_model, PROMPT, moss_references[PROMPT.stem].path,
                    tmp_path / "replay", ReplaySettings(given))
