"""Tests of the MOSS-VoiceGenerator family; what its test files share."""

from tests import MOSS_PROMPTS

#: The prompt a single-prompt test uses.
PROMPT = MOSS_PROMPTS[0]
#: Acceptance gate of issue 3 for float32 weights (max_rel).
F32_GATE = 1e-5
#: The hidden-state stages of a MOSS dump.
HIDDEN_STAGES = ("last_hidden", "step_last_hidden", "probe_hidden", "layer_0", "layer_1")
