"""The reference job's dump cache: what it restores, what it leaves to compute, what changes a
key, and that it holds the current cases only."""

import os
from pathlib import Path

import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.dump_cache import DumpCache


def write_dump(directory: Path, text: str) -> None:
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_text(f'{{"note": "{text}"}}')
    (directory / "enc_out.npy").write_bytes(text.encode())


@pytest.fixture
def job(tmp_path):
    """A model, two case inputs and their output folders."""
    model = tmp_path / "model.nemo"
    model.write_bytes(b"weights")
    inputs = []
    for name in ("a", "b"):
        (tmp_path / f"{name}.wav").write_bytes(name.encode())
        inputs.append((tmp_path / f"{name}.wav", tmp_path / "out" / name))
    return model, inputs


def cache_of(tmp_path, model, code="c0"):
    return DumpCache(tmp_path / "cache", model, {"family": "f", "code": code, "threads": 1})


def test_stored_dumps_are_restored_and_only_the_new_case_is_left_to_compute(tmp_path, job):
    model, (a, b) = job
    cache = cache_of(tmp_path, model)
    assert cache.restore([a], ["q8_0"]) == ([a], ["q8_0"])
    write_dump(a[1], "a f32")
    write_dump(a[1].with_name("a@q8_0"), "a q8_0")
    cache.store([a], ["q8_0"])
    for dump in (a[1], a[1].with_name("a@q8_0")):
        for file in dump.iterdir():
            os.unlink(file)
        dump.rmdir()

    todo, emulate = cache_of(tmp_path, model).restore([a, b], ["q8_0"])
    assert (todo, emulate) == ([b], ["q8_0"])
    assert (a[1] / "enc_out.npy").read_bytes() == b"a f32"
    assert (a[1].with_name("a@q8_0") / "manifest.json").read_text() == '{"note": "a q8_0"}'
    assert not b[1].exists()


def test_a_case_missing_one_weight_type_computes_float32_and_that_type(tmp_path, job):
    model, (a, _) = job
    cache = cache_of(tmp_path, model)
    cache.restore([a], [])
    write_dump(a[1], "a f32")
    cache.store([a], [])
    (a[1] / "enc_out.npy").unlink()
    (a[1] / "manifest.json").unlink()
    a[1].rmdir()
    assert cache_of(tmp_path, model).restore([a], ["f16"]) == ([a], ["f16"])
    assert not a[1].exists()  # computed again, with f16, so not restored


@pytest.mark.parametrize("change", ["input", "code", "model"])
def test_a_key_changes_with_the_input_bytes_the_code_and_the_model(tmp_path, job, change):
    model, (a, _) = job
    before = cache_of(tmp_path, model).key(a[0], None)
    code = "c0"
    if change == "input":
        a[0].write_bytes(b"other audio")
    elif change == "code":
        code = "c1"
    else:
        model.write_bytes(b"other weights")
    assert cache_of(tmp_path, model, code).key(a[0], None) != before
    assert cache_of(tmp_path, model, code).key(a[0], "q8_0") != cache_of(
        tmp_path, model, code).key(a[0], None)


def test_prune_keeps_only_the_entries_of_the_current_cases(tmp_path, job):
    model, (a, b) = job
    cache = cache_of(tmp_path, model)
    cache.restore([a, b], [])
    write_dump(a[1], "a")
    write_dump(b[1], "b")
    cache.store([a, b], [])
    assert len(list(cache.directory.iterdir())) == 2
    again = cache_of(tmp_path, model)
    again.restore([a], [])
    again.prune()
    assert [p.name for p in again.directory.iterdir()] == [again.key(a[0], None)]


def test_a_missing_model_or_input_is_one_error_line(tmp_path, job):
    model, (a, _) = job
    with pytest.raises(AudioparityError, match="nowhere.nemo: no such file"):
        DumpCache(tmp_path / "cache", tmp_path / "nowhere.nemo", {})
    a[0].unlink()
    with pytest.raises(AudioparityError, match="a.wav: no such file"):
        cache_of(tmp_path, model).restore([a], [])
