"""``audioparity export``: a dump of ours in transcribe.cpp's ``.f32`` + ``.json`` format (read
back, and by transcribe.cpp's own ``scripts/compare_tensors.py`` when the port is built), and
the refusals every format shares."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from audioparity.candidates import f32json
from audioparity.cli import main
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, DumpWriter
from audioparity.dumping.export import FORMATS, export_dump
from tests import REPO

COMPARE_TENSORS = REPO / ".ports" / "transcribe_cpp" / "scripts" / "compare_tensors.py"


def planted_dump(path, *, status="ok", family="parakeet_tdt", scale=1.0, ints=True):
    """A small dump: two float tensors, an int tensor (with ``ints``) and a document."""
    rng = np.random.default_rng(0)
    with DumpWriter(path, producer="torch", fields={"family": family}) as writer:
        writer.add_tensor("enc_out", rng.standard_normal((5, 4)).astype(np.float32) * scale,
                          "[T, D]")
        writer.add_tensor("joint_logits", rng.standard_normal((3, 7)).astype(np.float32),
                          "[steps, V+1+n_durations]")
        if ints:
            writer.add_tensor("ids", np.arange(3, dtype=np.int64), "[N]")
        writer.add_json("decode", {"ids": [1, 2], "frames": [0, 1], "durations": [1, 1],
                                   "text": "hi"})
        if status != "ok":
            writer.set_status(status, "no such backend")
    return path


def test_f32json_export_round_trips_the_float_tensors(tmp_path):
    dump = Dump(planted_dump(tmp_path / "dump"))
    written = export_dump(dump.path, "f32json", tmp_path / "out")
    assert sorted(written) == ["enc_out.f32", "enc_out.json", "joint_logits.f32",
                               "joint_logits.json"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(written)
    tensors = f32json.read_folder(tmp_path / "out")
    assert set(tensors) == {"enc_out", "joint_logits"}
    for name, array in tensors.items():
        np.testing.assert_array_equal(array, dump.tensor(name))


def test_cli_export_prints_the_files_and_refuses_in_one_line(tmp_path, capsys):
    dump = planted_dump(tmp_path / "dump")
    assert main(["export", str(dump), "--format", "f32json", "--output-dir",
                 str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.split() == [str(tmp_path / "out" / name) for name in (
        "enc_out.f32", "enc_out.json", "joint_logits.f32", "joint_logits.json")]
    assert main(["export", str(dump), "--format", "f32json", "--output-dir",
                 str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0
    assert err.endswith("out: exists and is not an empty folder; expected a new folder to "
                        "export into")


def test_cli_formats_are_the_modules(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["export", "x", "--format", "npz", "--output-dir", "y"])
    assert exit_.value.code == 2
    assert f"valid: {', '.join(FORMATS)}" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["status", "floats", "format", "family", "seedless"])
def test_refusals_name_the_dump_and_leave_nothing(tmp_path, kind):
    dump = {"status": lambda: planted_dump(tmp_path / "dump", status="unavailable"),
            "family": lambda: planted_dump(tmp_path / "dump", family="no_such_family"),
            "seedless": lambda: planted_dump(tmp_path / "dump", family="whisper")}.get(
        kind, lambda: planted_dump(tmp_path / "dump"))()
    if kind == "floats":
        with DumpWriter(dump, producer="torch") as writer:
            writer.add_tensor("ids", np.arange(3), "[N]")
    fmt = {"format": "npz", "family": "seed", "seedless": "seed"}.get(kind, "f32json")
    expected = {
        "status": "status 'unavailable'; only a dump of status 'ok' can be exported",
        "floats": "no float tensor to export as f32json",
        "format": "unknown export format 'npz'; valid: f32json, seed",
        "family": "unknown family 'no_such_family'",
        "seedless": "family 'whisper' has no seed format",
    }[kind]
    with pytest.raises(AudioparityError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        export_dump(dump, fmt, tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dump"]


def test_seed_export_checks_the_dumps_family_when_asked(tmp_path):
    dump = planted_dump(tmp_path / "dump", family="moss_voicegen")
    with pytest.raises(AudioparityError, match="a dump of family 'moss_voicegen'; expected "
                                               "'parakeet_tdt'"):
        export_dump(dump, "seed", tmp_path / "out", family="parakeet_tdt")


@pytest.mark.skipif(not COMPARE_TENSORS.is_file(),
                    reason=f"transcribe.cpp's port is not built ({COMPARE_TENSORS} absent; "
                           "make ports)")
def test_transcribe_cpp_compare_tensors_reads_exported_dumps(tmp_path):
    """Its script takes two exports as its own dumps: equal ones pass, and a tensor scaled by 2
    fails with the difference our files hold."""
    base = export_dump(planted_dump(tmp_path / "a"), "f32json", tmp_path / "fa")
    export_dump(planted_dump(tmp_path / "b"), "f32json", tmp_path / "fb")
    export_dump(planted_dump(tmp_path / "c", scale=2.0), "f32json", tmp_path / "fc")

    def compare(left, right):
        return subprocess.run([sys.executable, str(COMPARE_TENSORS), str(left), str(right)],
                              capture_output=True, text=True, timeout=60)

    same = compare(tmp_path / "fa", tmp_path / "fb")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "2/2 tensors within tolerance" in same.stdout
    assert len(base) == 4
    differ = compare(tmp_path / "fa", tmp_path / "fc")
    assert differ.returncode == 1, differ.stdout + differ.stderr
    rows = {line.split()[0]: line.split() for line in differ.stdout.splitlines()
            if line.split() and line.split()[0] in ("enc_out", "joint_logits")}
    assert rows["joint_logits"][1] == "ok"
    assert rows["enc_out"][1] == "FAIL" and rows["enc_out"][2] == "[5,4]"
    expected = np.abs(Dump(tmp_path / "a").tensor("enc_out")).max()
    assert float(rows["enc_out"][3]) == pytest.approx(expected, rel=1e-3)
