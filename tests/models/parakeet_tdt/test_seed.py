"""The Parakeet seed tool's ``--nemo-dir`` files (``audioparity export --format seed``): rank-3
``pre_encode``/``pos_emb`` and the rank-2 ``enc_out`` of a reference dump, and one-line refusals
of a dump that lacks or misshapes them."""

from __future__ import annotations

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.export import export_dump
from audioparity.models.parakeet_tdt.seed import FILES


def planted(path, frames=4, width=6, pos_rows=None, enc_frames=None, drop=()):
    rng = np.random.default_rng(1)
    shapes = {"pre_encode": (frames, width),
              "pos_emb": (2 * frames - 1 if pos_rows is None else pos_rows, width),
              "enc_out": (frames if enc_frames is None else enc_frames, width)}
    with DumpWriter(path, producer="nemo", fields={"family": "parakeet_tdt"}) as writer:
        for name, shape in shapes.items():
            if name not in drop:
                writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32), "[T, D]")
    return path


def test_seed_files_carry_the_batch_axis_the_seed_requires(tmp_path):
    dump = Dump(planted(tmp_path / "ref"))
    assert export_dump(dump.path, "seed", tmp_path / "nemo") == list(FILES)
    loaded = {name: np.load(tmp_path / "nemo" / f"{name}.npy") for name in
              ("pre_encode", "pos_emb", "enc_out")}
    assert {name: a.shape for name, a in loaded.items()} == {
        "pre_encode": (1, 4, 6), "pos_emb": (1, 7, 6), "enc_out": (4, 6)}
    for name, array in loaded.items():
        assert array.dtype == np.dtype("<f4")
        np.testing.assert_array_equal(array.reshape(dump.tensor(name).shape), dump.tensor(name))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"drop": ("pos_emb", "enc_out")}, "no pos_emb, enc_out; the Parakeet seed format needs "
                                       "pre_encode, pos_emb and enc_out"),
    ({"pos_rows": 8}, r"pos_emb is \[8, 6\]; expected \[7, 6\] for pre_encode \[4, 6\]"),
    ({"enc_frames": 3}, r"enc_out is \[3, 6\]; expected \[4, 6\] for pre_encode \[4, 6\]"),
])
def test_a_dump_without_the_seeds_tensors_is_refused(tmp_path, kwargs, message):
    dump = planted(tmp_path / "ref", **kwargs)
    with pytest.raises(AudioparityError, match=message):
        export_dump(dump, "seed", tmp_path / "nemo")
    assert not (tmp_path / "nemo").exists()


@pytest.mark.slow
def test_the_nemo_reference_dump_exports(parakeet_reference, tmp_path):
    reference = Dump(parakeet_reference)
    export_dump(parakeet_reference, "seed", tmp_path / "nemo")
    pre_encode = np.load(tmp_path / "nemo" / "pre_encode.npy")
    frames, width = reference.tensor("enc_out").shape
    assert pre_encode.shape == (1, frames, width)
    assert np.load(tmp_path / "nemo" / "pos_emb.npy").shape == (1, 2 * frames - 1, width)
    np.testing.assert_array_equal(pre_encode[0], reference.tensor("pre_encode"))
