"""Long positions of MOSS's RoPE are compared with the reference.

A case's rows sit at positions 0 .. S-1 and its generated rows after them; the shipped prompts
render 109 to 152 rows, so with their 16 generated rows every other test stays under position
168. The config allows 40960 (``max_position_embeddings``), out of a test's reach even on the
tiny shape (the attention's scores alone, S^2 floats a head, 27 GB); this prompt, one shipped
text repeated, renders 4111 rows, past :data:`POSITIONS` (the port's default KV cache, the
context it holds unless told otherwise). The port's dump of it (through the command line, as
the planted-bug tests run it) passes every stage, and the same port with its RoPE wrong only past
:data:`FAR` fails in its first layer.
"""

from __future__ import annotations

import json

import pytest

from audioparity.dumping.artifacts import Dump
from tests import RESOURCES
from tests.models.moss_voicegen import FAMILY, options
from tests.planted import Patch, clean_and_planted, failing

pytestmark = pytest.mark.slow

#: The positions the case reaches at least (prompt and generated rows).
POSITIONS = 4096
#: Positions past this one are the far ones.
FAR = POSITIONS // 2
#: Repeats of the shipped text: 23 rows each on the fixture's tokenizer, 4111 rows in all.
REPEATS = 175

#: A cos/sin cache of FAR + 1 positions: the later ones take its last row's angles.
FAR_ROPE_CLAMPED: list[Patch] = [(
    "backbone.py",
    "cos, sin_signed = rope_tables(positions, lang.head_dim, lang.rope_theta)",
    f"cos, sin_signed = rope_tables(np.minimum(positions, {FAR}), lang.head_dim, "
    "lang.rope_theta)",
)]


@pytest.fixture(scope="module")
def long_case(moss_model, tmp_path_factory):
    """The long prompt file and its reference dump."""
    from audioparity.dumping.driver import dump_reference

    root = tmp_path_factory.mktemp("moss_positions")
    text = json.loads((RESOURCES / "moss" / "en_no_instruction.json").read_text())["text"]
    prompt = root / "long.json"
    prompt.write_text(json.dumps({"text": " ".join([text] * REPEATS)}))
    reference = root / "reference"
    dump_reference(FAMILY, moss_model, [(prompt, reference)], options=options("reference"))
    return prompt, reference


@pytest.fixture(scope="module")
def statuses(moss_model, long_case, tmp_path_factory):
    """{run: {stage: status}} of the clean port and the planted one, under the f32 gates."""
    prompt, reference = long_case
    return clean_and_planted(tmp_path_factory, "moss_voicegen", "far_rope_clamped",
                             FAR_ROPE_CLAMPED, moss_model, prompt, reference)


def test_the_case_reaches_the_long_positions(long_case):
    dump = Dump(long_case[1])
    rows = len(dump.json("prompt")["rows"])
    assert rows + len(dump.json("generation")["rows"]) > POSITIONS
    assert rows // 2 > FAR  # probe_hidden's middle row is a far one too


def test_the_port_passes_at_every_position(statuses):
    got = statuses["clean"]
    assert {"layer_0", "last_hidden", "step_last_hidden", "generation"} <= set(got)
    assert failing(got) == set()


def test_rope_wrong_only_past_2048_fails_from_the_first_layer(statuses):
    got = statuses["far_rope_clamped"]
    assert got["prompt"] == got["input_embeddings"] == "pass"
    assert {"layer_0", "last_hidden", "probe_hidden", "step_last_hidden"} <= failing(got)
