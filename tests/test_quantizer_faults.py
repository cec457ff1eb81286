"""A planted quantizer bug: our port stores one weight with one q4_K sub-block scale one step
off (as a converter with an off-by-one in its scale packing would write it). On the trained
Parakeet the cell fails against its quantization-aware reference, the failing stages name the
weight and its block, and the same cell without the bug passes every gate."""

from __future__ import annotations

import ctypes

import pytest

from audioparity.dumping import driver
from audioparity.dumping.driver import RunSettings, dump_ggml, dump_reference
from audioparity.dumping.emulation import emulated_dir
from audioparity.models.registry import family
from tests import RESOURCES, cell_rows

pytestmark = pytest.mark.slow

MODEL = RESOURCES / "models" / "parakeet-tdt-espeak" / "model.nemo"
CASE = RESOURCES / "speech" / "clip.wav"
#: A weight of rows of 256 values: one q4_K block (144 bytes) per row.
WEIGHT = "encoder.layers.1.feed_forward1.linear1.weight"
BLOCK = 3
#: A q4_K block: f16 d, f16 dmin, then 12 bytes of 6-bit sub-block scales and mins; the low 6
#: bits of byte 4 are sub-block 0's scale (ggml-common.h block_q4_K, get_scale_min_k4).
Q4_K_BYTES, SCALE_0 = 144, 4


def _plant(upload):
    """``upload_weights`` whose weight :data:`WEIGHT` then has block :data:`BLOCK`'s first
    sub-block scale one step off in the backend."""
    from audioparity.ggml.bindings import ggml, tensor_bytes

    def planted(*args, **kwargs):
        weights, record = upload(*args, **kwargs)
        tensor = weights[WEIGHT]
        assert weights.storage(WEIGHT) == "q4_K"
        raw = tensor_bytes(tensor)
        offset = BLOCK * Q4_K_BYTES + SCALE_0
        scale = raw[offset] & 63
        raw[offset] = (raw[offset] & 0xC0) | (scale + 1 if scale < 63 else scale - 1)
        ggml.ggml_backend_tensor_set(tensor, raw.ctypes.data_as(ctypes.c_void_p), 0, raw.nbytes)
        return weights, record

    return planted


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> tuple:
    folder = tmp_path_factory.mktemp("reference") / "clip"
    dump_reference(family("parakeet_tdt"), MODEL, [(CASE, folder)], options={},
                   emulate=["q4_K"])
    return folder, emulated_dir(folder, "q4_K")


@pytest.mark.parametrize("planted", [False, True], ids=["clean", "planted"])
def test_a_scale_one_step_off_fails_the_cell_and_names_the_block(planted, reference, tmp_path,
                                                                 monkeypatch):
    f32, emulated = reference
    if planted:
        monkeypatch.setattr(driver, "upload_weights", _plant(driver.upload_weights))
    dump_ggml(family("parakeet_tdt"), MODEL, CASE, tmp_path / "ggml",
              RunSettings("q4_K", "cpu", {}), emulated)
    rows = cell_rows(emulated, tmp_path / "ggml", tmp_path / "cell.json",
                     weight_type="q4_K", cost=f32)
    failing = {stage: row["reason"] for stage, row in rows.items() if row["status"] == "fail"}
    if not planted:
        assert failing == {}
        assert rows["stored_weights"]["status"] == "pass"
        return
    # one sub-block of 32 of 262144 values moves layer 1 too little for its gates; the bytes
    # tell, and name the weight and the block
    assert failing == {"stored_weights": f"stored weight {WEIGHT}: block {BLOCK} of 1024 (q4_K, "
                       "256 values each) differs from ggml's quantization of the checkpoint"}
    clean_upstream = rows["layer_0_isolated"]["nmse"]
    assert rows["layer_1_isolated"]["nmse"] > 10 * clean_upstream
