"""Adapters of the third-party ports: their commands and how their output is read, without the
ports (their end-to-end run is tests/workflow/test_candidates.py)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from audioparity.candidates import Adapter, Port, f32json, load_adapter, ports, reading, running
from audioparity.compare.stage import apply_view
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.driver import RunSettings
from audioparity.models.registry import family

TRANSCRIBE = {"root": "/ports/t", "profile": "parakeet-tdt-0.6b-v2"}


def test_transcribe_converts_with_its_converter_then_its_quantizer(tmp_path):
    commands = load_adapter("transcribe_cpp").convert(
        tmp_path / "model.nemo", "q8_0", tmp_path / "out", options=TRANSCRIBE)
    f32 = str(tmp_path / "out/models/parakeet-tdt-0.6b-v2/model-f32.gguf")
    assert commands[0][1:] == ["/ports/t/scripts/convert-parakeet.py",
                               str(tmp_path / "model.nemo"), f32]
    assert commands[1] == ["/ports/t/build/bin/transcribe-quantize", f32,
                           str(tmp_path / "out/models/parakeet-tdt-0.6b-v2/model-q8_0.gguf"),
                           "--quant", "Q8_0"]


def test_whisper_f16_is_its_converters_own_f16_and_q8_0_its_quantizer(tmp_path):
    adapter = load_adapter("whisper_cpp")
    (f16,) = adapter.convert(tmp_path / "m.nemo", "f16", tmp_path / "w", options={"root": "/w"})
    assert "--use-f32" not in f16 and f16[-1] == "ggml-model-f16.bin"
    f32, quantize = adapter.convert(tmp_path / "m.nemo", "q8_0", tmp_path / "w",
                                   options={"root": "/w"})
    assert "--use-f32" in f32 and quantize[0] == "/w/build/bin/parakeet-quantize"
    assert quantize[-1] == "q8_0"


#: parakeet-cli -ps token rows (stderr) and its text (stdout), as it prints them.
WHISPER_STDERR = """\
parakeet_full: tokens
  [ 0] id=  830 frame=  2 dur_idx= 1 dur_val= 1 p=0.41
  [ 1] id=  874 frame=  3 dur_idx= 0 dur_val= 0 p=0.37
  [ 2] id=   12 frame=  3 dur_idx= 4 dur_val= 4 p=0.52
"""


def test_whisper_token_rows_become_the_decode_document():
    decode = load_adapter("whisper_cpp").parse(" ab cd\n", WHISPER_STDERR, None, options={})
    assert decode == {"ids": [830, 874, 12], "frames": [2, 3, 3], "durations": [1, 0, 4],
                      "text": "ab cd"}


def test_whisper_text_without_token_rows_is_an_error():
    with pytest.raises(AudioparityError, match="no -ps token rows"):
        load_adapter("whisper_cpp").parse("some text\n", "no rows here\n", None, options={})


def write_pair(folder, name, array, **meta):
    array.astype("<f4").tofile(folder / f"{name}.f32")
    (folder / f"{name}.json").write_text(json.dumps(
        {"name": name, "shape": list(array.shape), "dtype": "f32", "layout": "row-major",
         **meta}))


def test_f32json_reads_back_what_it_wrote(tmp_path):
    array = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_pair(tmp_path, "enc.final", array)
    assert np.array_equal(f32json.read_folder(tmp_path)["enc.final"], array)


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "x.f32").write_bytes(b"\0" * 8), "8 bytes, expected 48"),
    (lambda d: (d / "x.json").write_text("{"), "unreadable tensor sidecar"),
    (lambda d: (d / "x.json").unlink(), "no .json sidecar"),
    (lambda d: (d / "x.f32").unlink(), "missing; its sidecar"),
    (lambda d: write_pair(d, "x", np.zeros((3, 4)), dtype="f16"), "expected f32"),
])
def test_f32json_names_each_malformed_pair(tmp_path, damage, message):
    write_pair(tmp_path, "x", np.zeros((3, 4)))
    damage(tmp_path)
    with pytest.raises(AudioparityError, match=message):
        f32json.read_folder(tmp_path)


def test_a_view_makes_the_reference_what_the_candidate_holds():
    rows = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    first = apply_view(rows, [["row", 0], ["log_softmax"]])
    expected = np.log(np.exp([1.0, 2.0, 3.0]) / np.exp([1.0, 2.0, 3.0]).sum())
    np.testing.assert_allclose(first, expected, rtol=1e-12)
    with pytest.raises(AudioparityError, match="view"):
        apply_view(rows, [["row", 2]])
    with pytest.raises(AudioparityError, match="expected one of"):
        apply_view(rows, [["mean"]])


def test_a_cell_the_port_does_not_run_is_unavailable_and_says_why(tmp_path, clip_wav):
    (tmp_path / "m").write_bytes(b"")
    running.run_candidate(running.CandidateEntry("transcribe_cpp", "parakeet_tdt"),
                          tmp_path / "m", clip_wav, tmp_path / "dump",
                          RunSettings("bf16", "cpu", TRANSCRIBE))
    manifest = json.loads((tmp_path / "dump/manifest.json").read_text())
    assert manifest["status"] == "unavailable"
    assert "no weight type bf16" in manifest["message"]


def test_a_failing_port_fails_in_one_line_and_leaves_no_dump(tmp_path, clip_wav):
    options = {**TRANSCRIBE, "root": str(tmp_path / "nowhere")}
    (tmp_path / "m").write_bytes(b"")
    with pytest.raises(AudioparityError, match="cannot run"):
        running.run_candidate(running.CandidateEntry("transcribe_cpp", "parakeet_tdt"),
                              tmp_path / "m", clip_wav, tmp_path / "dump",
                              RunSettings("f32", "cpu", options))
    assert not (tmp_path / "dump").exists()


def test_a_port_killed_by_a_signal_is_named_with_its_signal_and_stderr():
    with pytest.raises(AudioparityError, match=r"sh failed \(signal SIGSEGV \(11\)\): oops"):
        running.run_tool(["sh", "-c", "echo oops >&2; kill -SEGV $$"], {}, "a port")


def test_an_unreadable_file_leaves_its_stage_out_with_why_and_the_rest_is_compared(tmp_path):
    from audioparity.dumping.artifacts import DumpWriter

    raw = tmp_path / "raw"
    raw.mkdir()
    write_pair(raw, "enc.final", np.ones((3, 4)))
    write_pair(raw, "enc.block.1.out", np.ones((3, 4)))
    (raw / "enc.block.1.out.f32").write_bytes(b"\0" * 8)
    files, unreadable = f32json.read_readable(raw)
    (tmp_path / "m").write_bytes(b"")
    with DumpWriter(tmp_path / "dump", producer="t", model=tmp_path / "m") as writer:
        reading.import_files(writer, load_adapter("transcribe_cpp"), family("parakeet_tdt").spec,
                             files, unreadable)
    manifest = json.loads((tmp_path / "dump/manifest.json").read_text())
    assert list(manifest["tensors"]) == ["enc_out"]
    assert manifest["unreadable"] == {"layer_1": unreadable["enc.block.1.out"]}
    assert "8 bytes, expected 48" in manifest["unreadable"]["layer_1"]


def test_the_compare_names_an_unreadable_file_and_a_stage_not_exposed(tmp_path):
    from audioparity.compare.cell import compare_cell
    from audioparity.compare.plan import CellDumps
    from audioparity.dumping.artifacts import DumpWriter

    (tmp_path / "m").write_bytes(b"")
    ones = np.ones((3, 4), dtype=np.float32)
    with DumpWriter(tmp_path / "ref", producer="nemo", model=tmp_path / "m") as writer:
        for stage in ("pre_encode", "layer_1", "enc_out"):
            writer.add_tensor(stage, ones, "[T, D]")
    with DumpWriter(tmp_path / "cand", producer="t", model=tmp_path / "m") as writer:
        writer.add_tensor("enc_out", ones, "[T, D]")
        writer.manifest["unreadable"] = {"layer_1": "raw/x.f32: 8 bytes, expected 48"}
        writer.manifest["not_exposed"] = {"pre_encode": "my.cpp does not expose it"}
    gates = {"gates": [{"stage": "*", "cosine_min": 0.99, "from": "default"}],
             "expected_failures": []}
    compare_cell(CellDumps(tmp_path / "ref", tmp_path / "cand"), gates, {"family": "parakeet_tdt"},
                 tmp_path / "cell.json")
    rows = {r["stage"]: r for r in json.loads((tmp_path / "cell.json").read_text())}
    assert (rows["enc_out"]["status"], rows["pre_encode"]["status"]) == ("pass", "unavailable")
    assert rows["pre_encode"]["reason"] == "my.cpp does not expose it"
    assert rows["layer_1"]["status"] == "missing"
    assert "unreadable: raw/x.f32: 8 bytes, expected 48" in rows["layer_1"]["reason"]


def snapshot(folder, script: str, name: str = "toy-1.0", file: str = "build.sh"):
    """A port's source snapshot: a tar.gz of one top folder ``name`` holding ``file``."""
    import io
    import tarfile

    data = script.encode()
    with tarfile.open(folder / f"{name}.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo(f"{name}/{file}")
        info.size, info.mode = len(data), 0o755
        tar.addfile(info, io.BytesIO(data))


class Toy(Adapter):
    name, title, families, output = "toy", "toy", ("parakeet_tdt",), "tokens"
    weight_types = ("f32",)
    port = Port(archive="toy-*.tar.gz", commands=(("sh", "build.sh", "{jobs}"),),
                products=("bin/toy",))


TOY = Toy()


def test_ports_are_built_once_and_reused(tmp_path):
    (tmp_path / "src").mkdir()
    snapshot(tmp_path / "src", "mkdir -p bin; echo built $1 >> ../builds; touch bin/toy\n")
    for _ in range(2):
        built = ports.build_ports(tmp_path / "src", tmp_path / "cache", jobs=3, adapters=[TOY])
    assert (built["toy"] / "bin/toy").is_file()
    assert (tmp_path / "cache/builds").read_text() == "built 3\n"


def test_a_port_builds_with_another_ports_folder_vendored_into_it(tmp_path):
    """Port.vendors: the folder of the other port's archive lands where the snapshot leaves a
    submodule empty, before the commands run; that archive is part of the tree's key."""
    (tmp_path / "src").mkdir()
    snapshot(tmp_path / "src", "vendored source\n", name="lib-2.0", file="vendor/lib/lib.h")
    snapshot(tmp_path / "src", "cat third/lib/lib.h > found; mkdir -p bin; touch bin/toy\n")
    library = Toy(name="lib", title="lib", port=Port(archive="lib-*.tar.gz", commands=(),
                                                     products=()))
    toy = Toy(port=replace(TOY.port, vendors=(("lib", "vendor/lib", "third/lib"),)))
    built = ports.build_ports(tmp_path / "src", tmp_path / "cache", adapters=[library, toy])
    assert (built["toy"] / "found").read_text() == "vendored source\n"
    (tmp_path / "src/lib-2.0.tar.gz").unlink()
    with pytest.raises(AudioparityError, match=r"expected one lib-\*\.tar\.gz, found 0"):
        ports.build_ports(tmp_path / "src", tmp_path / "cache", adapters=[toy, library])


def test_a_downloaded_source_package_with_another_digest_is_removed_and_refused(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "cache/downloads").mkdir(parents=True)
    snapshot(tmp_path / "cache/downloads", "touch bin/toy\n")
    toy = Toy(port=replace(TOY.port, download="toy==1.0", download_sha256="0" * 64))
    with pytest.raises(AudioparityError, match=r"toy-1.0.tar.gz: sha256 differs from 0{64} "
                                               r"\(toy==1.0\); removed, run again"):
        ports.build_ports(tmp_path / "src", tmp_path / "cache", adapters=[toy])
    assert not (tmp_path / "cache/downloads/toy-1.0.tar.gz").exists()


def test_a_downloads_archive_is_named_as_the_package_index_names_its_source_file():
    assert Port(commands=(), products=(), download="Llama.CPP-python==0.3.36").archive == \
        "llama_cpp_python-0.3.36.tar.gz"
    with pytest.raises(ValueError, match="an archive pattern, or a download"):
        Port(commands=(), products=())


def test_a_failing_port_build_says_which_step_and_its_last_lines(tmp_path):
    (tmp_path / "src").mkdir()
    snapshot(tmp_path / "src", "echo 'error: no compiler' >&2; exit 2\n")
    with pytest.raises(AudioparityError, match=r"build toy: sh failed \(exit code 2\): "
                                               "error: no compiler"):
        ports.build_ports(tmp_path / "src", tmp_path / "cache", adapters=[TOY])
    with pytest.raises(AudioparityError, match="no such folder"):
        ports.build_ports(tmp_path / "nowhere", tmp_path / "cache", adapters=[TOY])


def test_a_port_that_dies_after_writing_some_tensors_keeps_them_in_a_crashed_dump(tmp_path,
                                                                                 clip_wav):
    """A stand-in transcribe-cli that dumps the mel and pre_encode, then dies: those stages
    are kept (and compared), the dump is crashed with the tool's exit, and the stages it never
    writes are recorded as such, not those it died before writing."""
    root = tmp_path / "port"
    (root / "build/bin").mkdir(parents=True)
    cli = root / "build/bin/transcribe-cli"
    cli.write_text(
        "#!/usr/bin/env python3\n"
        "import json, os, sys\nimport numpy as np\n"
        "out = os.environ['TRANSCRIBE_DUMP_DIR']\n"
        "for name, shape in (('enc.mel.in', (4, 6)), ('enc.pre_encode.out', (2, 8))):\n"
        "    np.ones(shape, '<f4').tofile(os.path.join(out, name + '.f32'))\n"
        "    json.dump({'name': name, 'shape': list(shape), 'dtype': 'f32',\n"
        "               'layout': 'row-major'}, open(os.path.join(out, name + '.json'), 'w'))\n"
        "print('GGML_ASSERT in the encoder', file=sys.stderr); sys.exit(3)\n")
    cli.chmod(0o755)
    model = tmp_path / "converted"
    (model / "models/parakeet-tdt-0.6b-v2").mkdir(parents=True)
    running.run_candidate(running.CandidateEntry("transcribe_cpp", "parakeet_tdt"), model, clip_wav,
                          tmp_path / "dump",
                          RunSettings("f32", "cpu", {**TRANSCRIBE, "root": str(root)}))
    manifest = json.loads((tmp_path / "dump/manifest.json").read_text())
    assert manifest["status"] == "crashed"
    assert "exit code 3" in manifest["message"] and "GGML_ASSERT" in manifest["message"]
    assert sorted(manifest["tensors"]) == ["mel_features", "pre_encode"]
    # what it died before writing is not taken as unexposed: the crash is pos_emb's
    assert "pos_emb" not in manifest["not_exposed"] and "decode" not in manifest["not_exposed"]
    assert "decode_logits" in manifest["not_exposed"]  # it maps no file onto it


#: transcribe-cli's stdout with ``--timestamps token``, as it prints it.
TRANSCRIBE_STDOUT = """\
text: ab cd
tokens:
  [ 0.16 ->  0.24] p=0.529  ab
  [ 0.24 ->  0.24] p=0.311  cd
"""


def test_transcribe_token_times_become_frames_and_without_a_model_no_ids():
    """check-dump has no converted model: the printed lines are read, the ids left None."""
    decode = load_adapter("transcribe_cpp").parse(TRANSCRIBE_STDOUT, "", None, options={})
    assert decode == {"ids": [None, None], "frames": [2, 3], "durations": [1, 0],
                      "text": "ab cd"}
    with pytest.raises(AudioparityError, match="printed no 'tokens:' list"):
        load_adapter("transcribe_cpp").parse("text: ab\n", "", None, options={})
