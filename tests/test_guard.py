"""A dump process that dies becomes a `crashed` dump with its signal and stderr tail."""

from __future__ import annotations

import subprocess
import sys

from audioparity.dumping.artifacts import Dump


def guard(tmp_path, script: str) -> subprocess.CompletedProcess:
    out = tmp_path / "dump"
    return subprocess.run(
        [sys.executable, "-m", "audioparity.cli", "guard", "--output-dir", str(out),
         "--field", "backend=cpu", "--", sys.executable, "-c", script],
        capture_output=True, text=True,
    )


def test_abort_is_recorded_as_crashed_with_the_signal_and_stderr_tail(tmp_path):
    script = (
        "import os, sys; print('GGML_ASSERT(ne0 % 32 == 0) failed', file=sys.stderr, flush=True);"
        " os.abort()"
    )
    result = guard(tmp_path, script)
    assert result.returncode == 0
    dump = Dump(tmp_path / "dump")
    assert dump.status == "crashed"
    assert "SIGABRT" in dump.manifest["message"]
    assert "GGML_ASSERT(ne0 % 32 == 0) failed" in dump.manifest["stderr_tail"]
    assert dump.manifest["backend"] == "cpu"
    assert "GGML_ASSERT" in result.stderr  # passed through to the job's log


def test_exit_after_writing_half_the_files_leaves_only_the_crashed_record(tmp_path):
    out = tmp_path / "dump"
    script = (
        f"import pathlib, sys; d = pathlib.Path({str(out)!r}); d.mkdir();"
        " (d / 'enc_out.npy').write_bytes(b'half'); sys.exit(1)"
    )
    assert guard(tmp_path, script).returncode == 0
    dump = Dump(out)
    assert dump.status == "crashed"
    assert dump.manifest["message"].startswith("exit code 1")
    assert sorted(p.name for p in out.iterdir()) == ["manifest.json"]


def test_success_without_a_dump_is_not_hidden(tmp_path):
    assert guard(tmp_path, "pass").returncode == 1
    assert not (tmp_path / "dump").exists()


def test_a_dump_that_aborts_keeps_the_stages_it_finished(tmp_path):
    """A DumpWriter records each stage as it lands: the guard keeps those, and names the stage
    the process died in (the decoder's, say), so the cell's encoder stages are still compared."""
    out = tmp_path / "dump"
    script = (
        "import os, numpy as np; from audioparity.dumping.artifacts import DumpWriter\n"
        f"w = DumpWriter({str(out)!r}, producer='ggml').__enter__()\n"
        "with w.timed('encoder'): w.add_tensor('enc_out', np.ones((3, 2), np.float32), '[T, D]')\n"
        "with w.timed('decode'): os.abort()\n"
    )
    result = guard(tmp_path, script)
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(out)
    assert dump.status == "crashed" and "SIGABRT" in dump.manifest["message"]
    assert dump.tensor_names == ["enc_out"] and dump.tensor("enc_out").sum() == 6
    assert dump.manifest["crashed_in"] == "decode" and dump.manifest["backend"] == "cpu"
    assert not (tmp_path / "dump.partial").exists()


def test_a_dump_refused_halfway_keeps_the_stages_before_and_names_the_stage(tmp_path):
    """A refusal (AudioparityError) met in the decoder after the encoder's stages: the guard
    keeps those stages, names the stage it was raised in, and keeps the refusal's line."""
    out = tmp_path / "dump"
    script = (
        "import numpy as np; from audioparity.dumping.artifacts import DumpWriter\n"
        "from audioparity.contract.errors import AudioparityError\n"
        f"with DumpWriter({str(out)!r}, producer='ggml') as w:\n"
        "    with w.timed('encoder'):\n"
        "        w.add_tensor('enc_out', np.ones((3, 2), np.float32), '[T, D]')\n"
        "    with w.timed('decode'):\n"
        "        raise AudioparityError('decoding.greedy.max_symbols: 0 is refused')\n"
    )
    result = guard(tmp_path, script)
    assert result.returncode == 0, result.stderr[-2000:]
    dump = Dump(out)
    assert dump.status == "crashed" and dump.tensor_names == ["enc_out"]
    assert dump.manifest["crashed_in"] == "decode"
    assert dump.manifest["refused"] == "decoding.greedy.max_symbols: 0 is refused"
    assert not (tmp_path / "dump.partial").exists()
