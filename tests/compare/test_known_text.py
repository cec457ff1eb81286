"""WER against the known text of a case (what was said): ``wer_known`` for the candidate and
``ref_wer_known`` for the reference, case and punctuation aside, gated by ``wer_known_max``; a
case without a known text is not held to that gate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from audioparity.compare.cell import compare_cell
from audioparity.compare.plan import CellDumps
from audioparity.compare.sequences import wer_known
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import DumpWriter

#: What JFK said (the inaugural address, 1961), as a transcript writes it.
JFK = "And so, my fellow Americans: ask not what your country can do for you, ask what you " \
      "can do for your country."
LABELS = {"family": "parakeet_tdt", "model": "m", "case": "jfk", "candidate": "c",
          "backend": "cpu", "weight_type": "f32"}


def decode(text: str) -> dict:
    words = text.split()
    return {"ids": list(range(len(words))), "frames": list(range(len(words))),
            "durations": [1] * len(words), "text": text}


def write_dump(path: Path, text: str) -> Path:
    source = path.parent / "clip.wav"
    source.write_bytes(b"")
    with DumpWriter(path, producer="test", model=source, inputs={"audio": source},
                    fields={"family": "parakeet_tdt"}) as writer:
        writer.add_json("decode", decode(text))
    return path


def compare(tmp_path: Path, cand: str, ref: str, known: str | None, gate: dict) -> dict:
    output = tmp_path / "cell.json"
    compare_cell(CellDumps(write_dump(tmp_path / "ref", ref), write_dump(tmp_path / "cand", cand)),
                 {"gates": [{"stage": "decode", **gate}], "expected_failures": []}, LABELS, output,
                 known_text=known)
    (row,) = json.loads(output.read_text())
    return row


def test_case_and_punctuation_are_set_aside_words_are_not():
    assert wer_known("and so my fellow americans ask not what your country can do for you "
                     "ask what you can do for your country", JFK) == 0.0
    # one word of the known text's 22 substituted, one deleted
    assert wer_known("And so my fellow Americans ask not what your country can do for you, "
                     "ask what you can do for our", JFK) == pytest.approx(2 / 22)


def test_a_known_text_without_words_is_refused():
    with pytest.raises(AudioparityError, match=r"known text '!\?'"):
        wer_known("anything", "!?")


def test_both_sides_are_measured_against_the_known_text_and_the_gate_reads_the_candidates(
        tmp_path: Path):
    reference = "And so my fellow Americans ask not what your country can do for you, ask " \
                "what you can do for your country."
    candidate = reference.replace("fellow", "follow")
    row = compare(tmp_path, candidate, reference, JFK, {"wer_known_max": 0.0})
    assert row["ref_wer_known"] == 0.0
    assert row["wer_known"] == pytest.approx(1 / 22)
    assert row["wer"] == pytest.approx(1 / 22)  # exact text against the reference's
    assert row["status"] == "fail" and "wer_known" in row["reason"]


def test_a_reference_that_misheard_too_shows_beside_the_candidate(tmp_path: Path):
    misheard = "And so my follow Americans ask not what your country can do for you, ask " \
               "what you can do for your country."
    row = compare(tmp_path, misheard, misheard, JFK, {"exact": True})
    assert row["status"] == "pass" and row["wer"] == 0.0
    assert row["wer_known"] == row["ref_wer_known"] == pytest.approx(1 / 22)


def test_a_case_without_a_known_text_is_not_held_to_the_gate(tmp_path: Path):
    row = compare(tmp_path, "so my fellow", "so my fellow", None,
                  {"exact": True, "wer_known_max": 0.0})
    assert row["status"] == "pass"
    assert row["wer_known"] is None and row["ref_wer_known"] is None
