"""The MOSS seed tool's ``--prompt`` and ``--hidden`` files (``audioparity export --format
seed``): the request the reference dump records (or its prompt file), the prompt's row count and
``last_hidden``; one-line refusals of what the seed cannot take."""

from __future__ import annotations

import json

import numpy as np
import pytest

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.export import export_dump
from tests import MOSS_PROMPTS

REQUEST = {"text": "Hello there.", "instruction": "A calm voice.", "language": "English"}


def planted(path, *, request=REQUEST, prompt_file=None, hidden_shape=(8,)):
    fields = {"family": "moss_voicegen", **({"request": request} if request else {})}
    inputs = {"prompt": prompt_file} if prompt_file else None
    with DumpWriter(path, producer="torch", inputs=inputs, fields=fields) as writer:
        writer.add_json("prompt", {"text": "<rendered>", "rows": [[1, 9], [2, 9], [3, 9]]})
        writer.add_tensor("last_hidden", np.linspace(-1, 1, int(np.prod(hidden_shape)),
                                                     dtype=np.float32).reshape(hidden_shape),
                          "[H]")
    return path


def exported(tmp_path, dump):
    export_dump(dump, "seed", tmp_path / "seed")
    return {name: json.loads((tmp_path / "seed" / f"{name}.json").read_text(encoding="utf-8"))
            for name in ("prompt", "hidden")}


def test_the_request_and_last_hidden_as_the_seed_reads_them(tmp_path):
    dump = planted(tmp_path / "ref")
    files = exported(tmp_path, dump)
    assert files["prompt"] == REQUEST
    assert files["hidden"]["rows"] == 3
    assert np.array_equal(np.asarray(files["hidden"]["last_hidden"], dtype=np.float32),
                          Dump(dump).tensor("last_hidden"))


def test_a_dump_without_request_reads_its_unchanged_prompt_file(tmp_path):
    prompt = tmp_path / "prompt.json"
    prompt.write_text(json.dumps(REQUEST))
    dump = planted(tmp_path / "ref", request=None, prompt_file=prompt)
    assert exported(tmp_path, dump)["prompt"] == REQUEST
    prompt.write_text(json.dumps({**REQUEST, "text": "changed"}))
    with pytest.raises(AudioparityError, match="the manifest has no 'request' and its prompt file "
                                               ".* is not there as dumped"):
        export_dump(dump, "seed", tmp_path / "again")


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"request": {**REQUEST, "instruction": None}},
     "the prompt has no instruction; the MOSS seed's --prompt needs text, instruction and "
     "language as strings"),
    ({"request": {"text": "x"}}, "the prompt has no instruction or language"),
    ({"hidden_shape": (2, 4)}, r"last_hidden is \[2, 4\]; expected \[H\]"),
])
def test_what_the_seed_cannot_take_is_refused(tmp_path, kwargs, message):
    dump = planted(tmp_path / "ref", **kwargs)
    with pytest.raises(AudioparityError, match=message):
        export_dump(dump, "seed", tmp_path / "seed")
    assert not (tmp_path / "seed").exists()


@pytest.mark.slow
def test_the_torch_reference_dump_exports(moss_references, tmp_path):
    """Every shipped prompt that names instruction and language exports as its file says; the
    others are refused naming what is missing."""
    for prompt in MOSS_PROMPTS:
        dump = moss_references[prompt.stem]
        request = json.loads(prompt.read_text(encoding="utf-8"))
        if set(request) != {"text", "instruction", "language"}:
            with pytest.raises(AudioparityError, match="the prompt has no "):
                export_dump(dump.path, "seed", tmp_path / prompt.stem)
            continue
        files = exported(tmp_path / prompt.stem, dump.path)
        assert files["prompt"] == request
        assert files["hidden"]["rows"] == len(dump.json("prompt")["rows"])
        assert files["hidden"]["last_hidden"] == dump.tensor("last_hidden").tolist()
