"""MOSS generation judged at every step: the ggml port teacher-forced along the reference's rows
(``generation_text_logits``, ``generation_audio_logits``), the reference's own path checked
before it is followed, the third-party candidates' reasons for not exposing it, and a planted
codebook-embedding fault that the free-running generation lets through at a near tie while the
teacher-forced steps that read it fail."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from audioparity.candidates import load_adapter
from audioparity.candidates.reading import not_exposed
from audioparity.compare.metrics import nmse
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Phase
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.driver import dump_reference
from audioparity.dumping.emulation import emulated_dir
from audioparity.models.moss_voicegen.config import load_config
from audioparity.models.moss_voicegen.port import reference_path
from audioparity.models.moss_voicegen.stages import Forward, teacher_forced_outputs
from tests import config_gates
from tests.models.moss_voicegen import FAMILY, PROMPT, options
from tests.planted import planted_dump, planted_rows

#: The teacher-forced stages.
PATH_STAGES = ("generation_text_logits", "generation_audio_logits")

#: The faulty codebook and how its embedding rows are scaled: every code but the pad (whose row
#: is zero, so the prompt's rows, all pad codes, are untouched) reads a row 20% too large.
CODEBOOK, SCALE = 1, 1.2
#: The planted fault, in backbone.py's ``compute_input_embeddings``.
SCALED_CODEBOOK = [(
    "backbone.py",
    '        x = ggml.ggml_add(ctx, x, ggml.ggml_get_rows(ctx, w[f"emb_ext.{k}.weight"], '
    'ids[k + 1]))\n',
    '        rows = ggml.ggml_get_rows(ctx, w[f"emb_ext.{k}.weight"], ids[k + 1])\n'
    f'        x = ggml.ggml_add(ctx, x, ggml.ggml_scale(ctx, rows, {SCALE}) '
    f'if k == {CODEBOOK} else rows)\n',
)]


def test_teacher_forcing_prefills_the_given_prompt_and_feeds_every_row_but_the_last() -> None:
    """Row 0 is the prefill's heads, row j the heads after the given row j-1, whatever the
    side's own heads would have chosen."""
    prompt = np.arange(12).reshape(4, 3)
    rows = [[7, 1, 2], [8, 3, 4], [9, 5, 6]]
    fed: list = []

    def heads(value: float) -> tuple[np.ndarray, np.ndarray]:
        return np.full(5, value, np.float32), np.full((2, 4), value, np.float32)

    def prefill(given: np.ndarray) -> Forward:
        fed.append(("prefill", given.tolist()))
        text, audio = heads(-1.0)
        return Forward(np.zeros((4, 2)), np.zeros((4, 2)), np.zeros((1, 4, 2)), text, audio)

    def step(row: list[int]) -> tuple[np.ndarray, np.ndarray]:
        fed.append(("step", row))
        return heads(float(row[0]))

    outputs = list(teacher_forced_outputs(prompt, rows, prefill, step))
    assert outputs[0] == Phase("generation_text_logits")
    assert fed == [("prefill", prompt.tolist()), ("step", rows[0]), ("step", rows[1])]
    dumped = dict(outputs[1:])
    assert sorted(dumped) == sorted(PATH_STAGES)
    assert dumped["generation_text_logits"][:, 0].tolist() == [-1.0, 7.0, 8.0]
    assert dumped["generation_audio_logits"].shape == (3, 2, 4)
    assert dumped["generation_audio_logits"][:, 1, 3].tolist() == [-1.0, 7.0, 8.0]


def test_the_references_path_stages_give_its_generation(moss_model: Path,
                                                        moss_references: dict[str, Dump]
                                                        ) -> None:
    """Each reference dump's path stages hold one row per generated row, row 0 the prefill's
    heads, and decide its rows under the delay pattern's rules."""
    config = load_config(moss_model)
    for ref in moss_references.values():
        generated = ref.json("generation")["rows"]
        prompt, rows = reference_path(ref, config)
        assert prompt.tolist() == ref.json("prompt")["rows"] and rows == generated
        text, audio = (ref.tensor(stage) for stage in PATH_STAGES)
        assert text.shape == (len(generated), *ref.tensor("text_logits").shape)
        assert audio.shape == (len(generated), *ref.tensor("audio_logits").shape)
        np.testing.assert_array_equal(text[0], ref.tensor("text_logits"))
        np.testing.assert_array_equal(audio[0], ref.tensor("audio_logits"))


def test_a_reference_whose_path_stages_are_not_its_generation_is_refused(
        moss_model: Path, moss_references: dict[str, Dump], tmp_path: Path) -> None:
    source = moss_references[PROMPT.stem]
    copy = tmp_path / "reference"
    shutil.copytree(source.path, copy)
    document = source.json("generation")
    row = document["rows"][5]
    code = next(k for k in range(1, len(row)) if row[k] != document["audio_pad_code"])
    row[code] = (row[code] + 1) % document["audio_pad_code"]
    (copy / source.manifest["documents"]["generation"]).write_text(json.dumps(document))
    with pytest.raises(AudioparityError, match="generation_\\*_logits do not give its "
                                               "generation rows"):
        reference_path(Dump(copy), load_config(moss_model))


@pytest.mark.parametrize("adapter", ["llama_cpp", "openmoss"])
def test_third_party_candidates_name_why_they_have_no_teacher_forced_steps(tmp_path: Path,
                                                                           adapter: str) -> None:
    loaded = load_adapter(adapter)
    with DumpWriter(tmp_path / "dump", producer=adapter,
                    fields={"family": "moss_voicegen"}) as writer:
        writer.add_tensor("last_hidden", np.zeros(4, np.float32), "[H]")
        not_exposed(writer, loaded, FAMILY.spec)
    reasons = writer.manifest["not_exposed"]
    for stage in PATH_STAGES:
        assert reasons[stage].startswith(f"{loaded.title} does not expose it: ")
        assert "generated rows" in reasons[stage] or "codebook embeddings" in reasons[stage]


@pytest.fixture(scope="module")
def q8_0_reference(moss_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The float32 reference dump of :data:`PROMPT`, its q8_0 quantization-aware twin beside
    it."""
    output = tmp_path_factory.mktemp("moss_q8_0") / PROMPT.stem
    dump_reference(FAMILY, moss_model, [(PROMPT, output)], options=options("reference"),
                   emulate=["q8_0"])
    return output


def test_a_scaled_codebook_embedding_passes_free_generation_at_a_near_tie_and_fails_its_steps(
        tmp_path: Path, moss_model: Path, q8_0_reference: Path) -> None:
    """Issue 27's fault: codebook 1's embedding rows 20% too large, at q8_0 against the
    quantization-aware reference. The prompt holds pad codes only, so the prefill stages pass;
    the free-running generation parts at a near tie within its allowance and passes; the
    teacher-forced steps fail, and exactly at the steps that read a codebook-1 code: before the
    first of them the planted port computes what the clean port does, bit for bit."""
    planted = planted_rows(tmp_path / "planted", "moss_voicegen", SCALED_CODEBOOK, moss_model,
                           PROMPT, q8_0_reference, weight_type="q8_0")
    allowance = next(gate["logit_gap_max"] for gate in config_gates("moss_voicegen", "q8_0")
                     ["gates"] if gate["stage"] == "generation")
    assert {stage: planted[stage]["status"] for stage in
            ("prompt", "input_embeddings", "last_hidden", "text_logits", "audio_logits")} == \
        dict.fromkeys(("prompt", "input_embeddings", "last_hidden", "text_logits",
                       "audio_logits"), "pass")
    generation = planted["generation"]
    assert generation["status"] == "pass" and generation["token_match"] < 1
    assert 0 < generation["logit_gap"] <= allowance
    for stage in PATH_STAGES:
        assert planted[stage]["status"] == "fail", (stage, planted[stage])
        assert "nmse" in planted[stage]["reason"]

    reference = Dump(emulated_dir(q8_0_reference, "q8_0"))
    rows = reference.json("generation")["rows"]
    pad = reference.json("generation")["audio_pad_code"]
    reads = [j for j in range(1, len(rows)) if rows[j - 1][1 + CODEBOOK] != pad]
    assert reads, "the reference's generation never emits a code of the faulty codebook"
    bound = next(gate["nmse_max"] for gate in config_gates("moss_voicegen", "q8_0")["gates"]
                 if gate["stage"] == "generation_*_logits")
    planted_dump_ = Dump(tmp_path / "planted" / "dump")
    clean = planted_dump(tmp_path / "clean", "moss_voicegen", [], moss_model, PROMPT,
                         emulated_dir(q8_0_reference, "q8_0"), "q8_0")
    for stage in PATH_STAGES:
        ours, theirs = planted_dump_.tensor(stage), reference.tensor(stage)
        np.testing.assert_array_equal(ours[:reads[0]], clean.tensor(stage)[:reads[0]])
        step_nmse = [nmse(ours[j], theirs[j]) for j in range(len(rows))]
        assert min(step_nmse[j] for j in reads) > bound, (stage, step_nmse)
