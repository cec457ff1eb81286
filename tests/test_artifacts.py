"""Dump directories: atomic commit, manifest contents, and clear errors on bad dumps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audioparity.artifacts import Dump, DumpWriter, sha256_of
from audioparity.errors import AudioparityError


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "model.bin"
    path.write_bytes(b"weights")
    return path


def test_committed_dump_round_trips_tensors_documents_and_manifest(tmp_path, model_file):
    out = tmp_path / "dump"
    array = np.arange(6, dtype=np.float32).reshape(3, 2)
    with DumpWriter(out, producer="ggml", model=model_file, inputs={"audio": model_file},
                    fields={"backend": "cpu"}) as writer:
        writer.add_tensor("enc_out", array, "[T, D]")
        writer.add_json("decode", {"ids": [1, 2]})
    dump = Dump(out)
    np.testing.assert_array_equal(dump.tensor("enc_out"), array)
    assert dump.json("decode") == {"ids": [1, 2]}
    assert dump.layout("enc_out") == "[T, D]"
    assert dump.manifest["backend"] == "cpu"
    assert dump.manifest["model"]["sha256"] == sha256_of(model_file)
    assert dump.manifest["tensors"]["enc_out"] == {
        "file": "enc_out.npy", "shape": [3, 2], "dtype": "float32", "layout": "[T, D]"
    }
    assert not (tmp_path / "dump.partial").exists()


def test_failed_dump_leaves_nothing_that_looks_complete(tmp_path, model_file):
    out = tmp_path / "dump"
    with pytest.raises(RuntimeError), DumpWriter(out, producer="ggml", model=model_file) as writer:
        writer.add_tensor("enc_out", np.zeros((2, 2), np.float32), "[T, D]")
        raise RuntimeError("killed halfway")
    assert not out.exists()
    assert not (tmp_path / "dump.partial").exists()


def test_stale_partial_directory_from_a_killed_run_is_replaced(tmp_path, model_file):
    stale = tmp_path / "dump.partial"
    stale.mkdir()
    (stale / "enc_out.npy").write_bytes(b"half")
    with DumpWriter(tmp_path / "dump", producer="ggml", model=model_file) as writer:
        writer.add_tensor("x", np.ones(2, np.float32), "[D]")
    assert Dump(tmp_path / "dump").tensor_names == ["x"]


def test_reader_names_the_directory_when_manifest_is_missing(tmp_path):
    with pytest.raises(AudioparityError, match="not a dump directory"):
        Dump(tmp_path)


def test_reader_rejects_a_tensor_whose_shape_disagrees_with_the_manifest(tmp_path, model_file):
    out = tmp_path / "dump"
    with DumpWriter(out, producer="ggml", model=model_file) as writer:
        writer.add_tensor("x", np.ones((2, 3), np.float32), "[T, D]")
    np.save(out / "x.npy", np.ones((3, 2), np.float32))
    expected = r"shape \[3, 2\] differs from the manifest's \[2, 3\]"
    with pytest.raises(AudioparityError, match=expected):
        Dump(out).tensor("x")


def test_reader_rejects_a_manifest_that_is_not_json(tmp_path):
    (tmp_path / "manifest.json").write_text("{half")
    with pytest.raises(AudioparityError, match="unreadable manifest"):
        Dump(tmp_path)


def test_sha256_of_a_directory_depends_on_names_and_contents(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x").write_text("1")
    first = sha256_of(tmp_path / "a")
    (tmp_path / "a" / "x").write_text("2")
    assert sha256_of(tmp_path / "a") != first
    assert json.dumps(first)  # a plain hex string
