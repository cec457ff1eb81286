"""Every relative position the encoder's attention reads is compared with NeMo.

The shipped clip gives the tiny fixture 38 encoder frames, so its attention reads relative
positions up to 37 only: a fault in the port's position table past that passes every other test.
Here the clip is tiled to 96.5 s, 1207 encoder frames (subsampling x8, 100 mel frames a second),
so the table holds positions up to 1206 either way; the port's dump of it (through the command
line, as the planted-bug tests run it) passes every stage the positions feed, and the same port
with its table wrong only past :data:`FAR` fails at ``pos_emb``.
"""

from __future__ import annotations

import numpy as np
import pytest
import soundfile

from audioparity.dumping.artifacts import Dump
from tests.planted import Patch, clean_and_planted, failing

pytestmark = pytest.mark.slow

#: Positions past this distance are the ones no shorter case reaches.
FAR = 600
#: The clip tiled to this length gives 1207 encoder frames: distances up to twice FAR.
SECONDS = 96.5

#: The table's rows past distance FAR rounded to f16, as a port storing the far part of its
#: table in f16 would hold them; the near rows are exact.
FAR_ROWS_F16: list[Patch] = [(
    "positions.py",
    "    return sinusoids(np.arange(n_frames - 1, -n_frames, -1, dtype=np.float32), d_model)",
    "    pe = sinusoids(np.arange(n_frames - 1, -n_frames, -1, dtype=np.float32), d_model)\n"
    f"    far = np.abs(np.arange(n_frames - 1, -n_frames, -1)) > {FAR}\n"
    "    pe[far] = pe[far].astype(np.float16)\n"
    "    return pe",
)]

#: The stages the position table feeds, and those before it. The decodes are left out: over
#: 1600 tokens the random fixture's greedy path has near-ties (smallest margin 0.0017) that
#: another machine's rounding may flip; the shipped clip's tests hold the decoder.
ENCODER_PREFIXES = ("mel_features", "pre_encode", "pos_emb", "layer_", "enc_out")


@pytest.fixture(scope="module")
def long_case(parakeet_model, clip_wav, tmp_path_factory):
    """The tiled clip and its NeMo reference dump (1 thread)."""
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family

    root = tmp_path_factory.mktemp("parakeet_positions")
    clip, rate = soundfile.read(clip_wav, dtype="float32")
    n = int(SECONDS * rate)
    audio = root / "long.wav"
    soundfile.write(audio, np.resize(clip, n), rate)
    reference = root / "reference"
    dump_reference(family("parakeet_tdt"), parakeet_model, [(audio, reference)], options={},
                   threads=1)
    return audio, reference


@pytest.fixture(scope="module")
def statuses(parakeet_model, long_case, tmp_path_factory):
    """{run: {stage: status}} of the clean port and the planted one, under the f32 gates."""
    audio, reference = long_case
    return clean_and_planted(tmp_path_factory, "parakeet_tdt", "far_rows_f16", FAR_ROWS_F16,
                             parakeet_model, audio, reference)


def encoder(statuses: dict[str, str]) -> dict[str, str]:
    return {stage: s for stage, s in statuses.items() if stage.startswith(ENCODER_PREFIXES)}


def test_the_case_reaches_twice_the_far_distance(long_case):
    manifest = Dump(long_case[1]).manifest["tensors"]
    frames = manifest["enc_out"]["shape"][0]
    assert frames >= 2 * FAR
    assert manifest["pos_emb"]["shape"][0] == 2 * frames - 1  # positions frames-1 ... -(frames-1)


def test_the_port_passes_at_every_position(statuses):
    got = encoder(statuses["clean"])
    assert {"pos_emb", "layer_0", "layer_0_isolated", "enc_out"} <= set(got)
    assert failing(got) == set()


def test_a_table_wrong_only_past_600_fails_at_pos_emb(statuses):
    got = statuses["far_rows_f16"]
    assert got["pos_emb"] == "fail"
    assert got["mel_features"] == got["pre_encode"] == "pass"
    # the isolated layers read the reference's table
    assert all(got[s] == "pass" for s in got if s.endswith("_isolated"))
