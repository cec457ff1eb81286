"""Determinism: at a fixed thread count, two dumps of the same inputs are byte-identical, on both
sides of both families; ``audioparity determinism`` finds and names any difference; every
manifest records the thread count and the library versions."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from audioparity.dumping.artifacts import MANIFEST, Dump, DumpWriter, dump_differences
from tests import REPO

PROMPT = REPO / "resources" / "moss" / "en_instruction.json"
CLI = [sys.executable, "-m", "audioparity.cli"]


def assert_byte_identical(a: Path, b: Path) -> None:
    """Every file but the manifest equal byte for byte (read here, not by the code under test),
    and at least one ``.npy`` among them."""
    names = sorted(p.name for p in a.iterdir() if p.name != MANIFEST)
    assert names == sorted(p.name for p in b.iterdir() if p.name != MANIFEST)
    assert any(name.endswith(".npy") for name in names)
    for name in names:
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def assert_records_threads_and_versions(dump: Dump, threads: int, *libraries: str) -> None:
    assert dump.manifest["threads"] == threads
    versions = dump.manifest["versions"]
    for library in ("python", "numpy", *libraries):
        assert versions.get(library, "absent") != "absent", (library, versions)


def determinism_run(tmp_path: Path, command: list[str]) -> subprocess.CompletedProcess:
    """``audioparity determinism run`` of ``command`` (holding ``{output_dir}``)."""
    return subprocess.run([*CLI, "determinism", "run", "--work-dir", str(tmp_path / "runs"),
                           "--", *command], capture_output=True, text=True, timeout=600)


def test_ggml_parakeet_dump_twice_is_byte_identical(parakeet_model, clip_wav, parakeet_reference,
                                                    tmp_path):
    result = determinism_run(tmp_path, [
        *CLI, "ggml", "parakeet-tdt", "--model", str(parakeet_model), "--audio", str(clip_wav),
        "--reference-dir", str(parakeet_reference), "--output-dir", "{output_dir}",
        "--weight-type", "q8_0", "--threads", "2",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.startswith("identical: ")
    runs = tmp_path / "runs"
    assert_byte_identical(runs / "run_1", runs / "run_2")
    assert_records_threads_and_versions(Dump(runs / "run_1"), 2, "ggml-python")


def test_nemo_reference_dump_twice_is_byte_identical(parakeet_model, clip_wav, parakeet_reference,
                                                     tmp_path):
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family

    dump_reference(family("parakeet_tdt"), parakeet_model, [(clip_wav, tmp_path / "again")],
                   options={}, threads=1)
    assert_byte_identical(parakeet_reference, tmp_path / "again")
    assert dump_differences(parakeet_reference, tmp_path / "again") == []
    assert_records_threads_and_versions(Dump(parakeet_reference), 1, "torch", "nemo_toolkit")


@pytest.mark.parametrize("weight_type", ["f32", "q8_0"])
def test_ggml_moss_dump_twice_is_byte_identical(moss_model, weight_type, tmp_path):
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family

    reference = tmp_path / "reference"  # the path its teacher-forced steps follow
    dump_reference(family("moss_voicegen"), moss_model, [(PROMPT, reference)],
                   options={"generate_rows": 16})
    result = determinism_run(tmp_path, [
        *CLI, "ggml", "moss-voicegen", "--model", str(moss_model), "--prompt", str(PROMPT),
        "--reference-dir", str(reference), "--output-dir", "{output_dir}", "--weight-type",
        weight_type, "--threads", "2",
    ])
    assert result.returncode == 0, result.stderr[-3000:]
    runs = tmp_path / "runs"
    assert_byte_identical(runs / "run_1", runs / "run_2")
    assert_records_threads_and_versions(Dump(runs / "run_1"), 2, "ggml_python", "tokenizers")


def test_torch_moss_reference_dump_twice_is_byte_identical(moss_model, tmp_path):
    from audioparity.dumping.driver import dump_reference
    from audioparity.models.registry import family

    for run in ("run_1", "run_2"):
        dump_reference(family("moss_voicegen"), moss_model, [(PROMPT, tmp_path / run)],
                       options={"generate_rows": 16}, threads=2)
    assert_byte_identical(tmp_path / "run_1", tmp_path / "run_2")
    assert dump_differences(tmp_path / "run_1", tmp_path / "run_2") == []
    assert_records_threads_and_versions(Dump(tmp_path / "run_1"), 2, "torch", "transformers",
                                        "tokenizers")


def write(path: Path, enc_out: np.ndarray, threads: int = 1) -> Path:
    with DumpWriter(path, producer="test", fields={"threads": threads}) as writer:
        writer.add_tensor("enc_out", enc_out, "[T, D]")
        writer.add_tensor("pos_emb", np.zeros((3, 2), np.float32), "[2T-1, D]")
        writer.add_json("decode", {"ids": [1, 2]})
        writer.manifest["seconds"]["encoder"] = threads * 0.5  # volatile: never reported
    return path


def test_determinism_compare_names_each_differing_file_and_manifest_key(tmp_path):
    base = np.arange(12, dtype=np.float32).reshape(4, 3)
    changed = base.copy()
    changed[2, 1] += np.float32(0.25)
    a, b = write(tmp_path / "a", base), write(tmp_path / "b", changed, threads=2)
    (b / "decode.json").write_text('{"ids": [1, 3]}\n')
    result = subprocess.run([*CLI, "determinism", "compare", str(a), str(b)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 1
    assert result.stdout.splitlines() == [
        "decode.json: differs",
        "enc_out.npy: differs (1 of 12 values, max abs diff 0.25)",
        "manifest.json: 'threads' differs: 1 vs 2",
    ]
    assert result.stderr.splitlines()[-1] == (
        f"audioparity: error: {a} and {b} differ: 3 difference(s), listed on stdout")


def test_determinism_compare_of_identical_dumps_exits_0(tmp_path):
    base = np.ones((4, 3), np.float32)
    a, b = write(tmp_path / "a", base), write(tmp_path / "b", base)
    result = subprocess.run([*CLI, "determinism", "compare", str(a), str(b)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("identical: ")


def test_determinism_run_reports_a_failing_command(tmp_path):
    result = determinism_run(tmp_path, [sys.executable, "-c", "import sys; sys.exit(3)",
                                        "{output_dir}"])
    assert result.returncode == 1
    assert result.stderr.splitlines()[-1].endswith("run 1 of " + sys.executable
                                                   + " failed (exit code 3)")
