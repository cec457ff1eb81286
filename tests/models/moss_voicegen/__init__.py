"""Tests of the MOSS-VoiceGenerator family; what its test files share."""

from audioparity.models.moss_voicegen import MossVoicegen
from tests import MOSS_PROMPTS

#: The family under test.
FAMILY = MossVoicegen()
#: The prompt a single-prompt test uses.
PROMPT = MOSS_PROMPTS[0]
#: Acceptance gate of issue 3 for float32 weights (max_rel).
F32_GATE = 1e-5
#: The hidden-state stages of a MOSS dump.
HIDDEN_STAGES = ("last_hidden", "step_last_hidden", "probe_hidden", "layer_0", "layer_1")


def options(side: str, **given) -> dict:
    """The family's options of ``side`` (``reference``, ``ggml``) at their defaults, with
    ``given`` instead."""
    return {**{o.name: o.default for o in FAMILY.spec.options_for(side)}, **given}
