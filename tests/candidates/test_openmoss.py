"""The openmoss MOSS candidate's pieces that run without openmoss: its prompt rows as the
driver prints them, read into the `prompt` document, and the refusal of a line it cannot read."""

from __future__ import annotations

import pytest

from audioparity.candidates import openmoss
from audioparity.errors import AudioparityError


def test_the_prompt_line_is_the_prompt_document():
    stdout = 'prompt: {"rows": [[481, 96], [483, 96]]}\nsettings: {"flash_attn": true}\n'
    assert openmoss.parse(stdout, "", None, options={}) == (
        "prompt", {"rows": [[481, 96], [483, 96]]})


@pytest.mark.parametrize("stdout", ["settings: {}\n", "prompt: [1, 2]\n", "prompt: {rows\n"])
def test_a_missing_or_unreadable_prompt_line_is_one_error(stdout):
    with pytest.raises(AudioparityError, match="openmoss-moss-dump"):
        openmoss.parse(stdout, "", None, options={})
