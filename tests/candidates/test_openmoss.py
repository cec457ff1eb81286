"""The openmoss MOSS candidate's pieces that run without openmoss: its prompt rows as the
driver prints them, read into the `prompt` document, and the refusal of a line it cannot read."""

from __future__ import annotations

import pytest

from audioparity.candidates import load_adapter
from audioparity.contract.errors import AudioparityError

OPENMOSS = load_adapter("openmoss")


def test_the_prompt_line_is_the_prompt_document():
    stdout = 'prompt: {"rows": [[481, 96], [483, 96]]}\nsettings: {"flash_attn": true}\n'
    assert OPENMOSS.parse(stdout, "", None, options={}) == {"rows": [[481, 96], [483, 96]]}
    assert OPENMOSS.printed.stage == "prompt"


@pytest.mark.parametrize("stdout", ["settings: {}\n", "prompt: [1, 2]\n", "prompt: {rows\n"])
def test_a_missing_or_unreadable_prompt_line_is_one_error(stdout):
    with pytest.raises(AudioparityError, match="openmoss-moss-dump"):
        OPENMOSS.parse(stdout, "", None, options={})


def test_check_dump_reads_the_prompt_stage_from_the_tools_stdout(tmp_path):
    from audioparity.candidates.check_raw import _parsed_problems

    assert _parsed_problems(tmp_path, OPENMOSS) == [
        f"{tmp_path}: missing stdout.txt (stage prompt); expected the tool's output, from "
        "which adapter 'openmoss' reads it"]
    (tmp_path / "stdout.txt").write_text("settings: {}\n")
    assert _parsed_problems(tmp_path, OPENMOSS) == [
        f"{tmp_path / 'stdout.txt'}: openmoss-moss-dump printed no 'prompt: {{\"rows\": ...}}' "
        "line"]
    (tmp_path / "stdout.txt").write_text('prompt: {"rows": [[1, 2]]}\n')
    assert _parsed_problems(tmp_path, OPENMOSS) == []
