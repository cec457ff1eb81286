"""Dump directories: atomic commit, manifest contents, and clear errors on bad dumps."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import REFUSED, Dump, DumpWriter, sha256_of


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


def test_an_input_refused_before_any_stage_leaves_nothing(tmp_path, model_file):
    out = tmp_path / "dump"
    with pytest.raises(AudioparityError), DumpWriter(out, producer="ggml", model=model_file):
        raise AudioparityError("encoder.reduction: pooling is not supported by the ggml port")
    assert not out.exists()
    assert not (tmp_path / "dump.partial").exists()


def test_a_refusal_after_some_stages_keeps_them_and_names_the_stage(tmp_path, model_file):
    """Refused halfway (a setting met only by the decoder, say): the encoder's stages stay for
    the guard to compare, the stage the refusal came from is the one running, and the refusal
    is recorded; nothing looks complete."""
    out = tmp_path / "dump"
    with pytest.raises(AudioparityError), DumpWriter(out, producer="ggml",
                                                     model=model_file) as writer:
        with writer.timed("encoder"):
            writer.add_tensor("enc_out", np.zeros((2, 2), np.float32), "[T, D]")
        with writer.timed("decode"):
            raise AudioparityError("a bad input,\nfound halfway")
    assert not out.exists()
    manifest = json.loads((tmp_path / "dump.partial" / "manifest.json").read_text())
    assert list(manifest["tensors"]) == ["enc_out"] and manifest["running"] == "decode"
    assert manifest[REFUSED] == "a bad input, found halfway"


def test_a_fault_leaves_a_partial_dump_saying_what_finished_and_what_ran(tmp_path, model_file):
    out = tmp_path / "dump"
    with pytest.raises(RuntimeError), DumpWriter(out, producer="ggml", model=model_file) as writer:
        with writer.timed("encoder"):
            writer.add_tensor("enc_out", np.zeros((2, 2), np.float32), "[T, D]")
        with writer.timed("decode"):
            raise RuntimeError("a fault halfway")
    assert not out.exists()  # nothing that looks complete
    manifest = json.loads((tmp_path / "dump.partial" / "manifest.json").read_text())
    assert list(manifest["tensors"]) == ["enc_out"] and manifest["running"] == "decode"


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


def write_small_dump(path, model_file, layout="[T, D]", scale=1.0, seconds=0.5, note="run 1"):
    with DumpWriter(path, producer="test", model=model_file, fields={"threads": 1}) as writer:
        writer.add_tensor("enc_out", np.arange(6, dtype=np.float32).reshape(2, 3) * scale, layout)
        writer.add_json("decode", {"ids": [1, 2]})
        writer.manifest["seconds"]["encoder"] = seconds
        writer.note(note)


def test_digest_covers_what_later_stages_read_and_ignores_how_the_run_went(tmp_path,
                                                                         model_file):
    """Run times and notes change nothing downstream; a value, a layout or a document does."""
    from audioparity.dumping.artifacts import content_digest, write_digest

    write_small_dump(tmp_path / "a", model_file)
    write_small_dump(tmp_path / "b", model_file, seconds=9.0, note="run 2")
    assert content_digest(tmp_path / "a") == content_digest(tmp_path / "b")
    digest = write_digest(tmp_path / "a")
    assert digest == tmp_path / "a.sha256"
    assert digest.read_text() == content_digest(tmp_path / "a")
    lines = digest.read_text().splitlines()
    assert [line.split("  ")[1] for line in lines] == [
        "decode.json", "enc_out.npy", "manifest.json:status,message,tensors,documents"]
    for changed in ({"scale": 2.0}, {"layout": "[T,D]"}):
        write_small_dump(tmp_path / "c", model_file, **changed)
        assert content_digest(tmp_path / "c") != content_digest(tmp_path / "a"), changed


def test_a_model_digest_is_remembered_only_while_its_file_stays_the_same(tmp_path):
    """The reference job hashes its model once for all its dumps; a model rewritten since (its
    size or time changed) is hashed again, never given the old digest."""
    import hashlib
    import os

    from audioparity.dumping.provenance import model_digest

    model = tmp_path / "model.nemo"
    model.write_bytes(b"first")
    assert model_digest(model) == hashlib.sha256(b"first").hexdigest()
    model.write_bytes(b"second model")
    os.utime(model, ns=(1, 1))
    assert model_digest(model) == hashlib.sha256(b"second model").hexdigest()
