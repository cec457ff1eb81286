"""The MOSS reference dumps of the four shipped prompts, shared by this folder's tests."""

from __future__ import annotations

import pytest

from audioparity.dumping.artifacts import Dump
from audioparity.dumping.driver import dump_reference
from tests import MOSS_PROMPTS
from tests.models.moss_voicegen import FAMILY, options


@pytest.fixture(scope="session")
def moss_references(moss_model, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Dump]:
    """The torch reference dump of each shipped prompt through the tiny checkpoint, by stem."""
    root = tmp_path_factory.mktemp("moss_reference")
    dump_reference(FAMILY, moss_model, [(prompt, root / prompt.stem) for prompt in MOSS_PROMPTS],
                   options=options("reference"))
    return {prompt.stem: Dump(root / prompt.stem) for prompt in MOSS_PROMPTS}
