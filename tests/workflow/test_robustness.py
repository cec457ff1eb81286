"""A crashing dump never takes the sweep down; a run killed mid-dump resumes to the same bytes.

Both run the real workflow (`python -m snakemake`) on a copy in a temporary directory, on the
tiny Parakeet fixture and the shipped clip, as `make run` would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from audioparity.dumping.artifacts import Dump
from tests.workflow.workdir import (
    environment,
    make_workdir,
    parakeet_config,
    run_to_completion,
    snakemake_command,
)

pytestmark = pytest.mark.slow

#: An "external dump tool" (a candidate with a command of its own): aborts like a failed
#: GGML_ASSERT at f16, writes half a dump and exits 1 at bf16, and otherwise runs the built-in
#: dump with the same command line.
EXTERNAL_TOOL = """\
import os, pathlib, sys
args = sys.argv[1:]
weight_type = args[args.index("--weight-type") + 1]
if weight_type == "f16":
    print("ggml.c:1234: GGML_ASSERT(ggml_nelements(a) == ne0) failed", file=sys.stderr, flush=True)
    os.abort()
if weight_type == "bf16":
    out = pathlib.Path(args[args.index("--output-dir") + 1])
    out.mkdir(parents=True)
    (out / "mel_features.npy").write_bytes(b"half")
    print("out of memory while writing enc_out", file=sys.stderr, flush=True)
    sys.exit(1)
os.execvp(sys.executable, [sys.executable, "-m", "audioparity.cli", "ggml", "parakeet-tdt", *args])
"""


def npy_bytes(workdir: Path) -> dict[str, bytes | list[bytes]]:
    """Every ``.npy`` under results/ by path, but the reference's dump cache's by content
    alone: its entries are named by a key that hashes the model's modification time, which
    differs between two workdirs' fixtures."""
    cache = workdir / "results" / "cache"
    files = sorted((workdir / "results").rglob("*.npy"))
    return {**{str(p.relative_to(workdir)): p.read_bytes() for p in files
               if not p.is_relative_to(cache)},
            "cache": sorted(p.read_bytes() for p in files if p.is_relative_to(cache))}


def test_crashing_cells_are_reported_and_the_sweep_finishes(tmp_path):
    (tmp_path / "tool.py").write_text(EXTERNAL_TOOL)
    command = (f"python {tmp_path / 'tool.py'} --model {{model}} --audio {{case}} "
               "--reference-dir {reference} --output-dir {output} --weight-type {weight_type} "
               "--backend {backend} --threads {threads} {options}")
    workdir = make_workdir(tmp_path / "run", parakeet_config(
        weight_types=["f32", "f16", "bf16"], candidates=[
            {"name": "tool", "adapter": "command", "options": {"command": command},
             "replay": False}]))
    run_to_completion(workdir)

    summary = pd.read_csv(workdir / "results/report/summary.csv")
    by_type = summary.groupby("weight_type").status.agg(set)
    assert by_type["f32"] == {"pass"}
    # a cell that died before it finished a stage: its first stage crashed, the rest missing
    assert by_type["f16"] == {"crashed", "missing"} and by_type["bf16"] == {"crashed", "missing"}
    for weight_type in ("f16", "bf16"):
        cell = summary[summary.weight_type == weight_type]
        assert list(cell[cell.status == "crashed"].stage) == ["mel_features"]
    f16 = summary[summary.weight_type == "f16"].iloc[0]
    assert "SIGABRT" in f16.reason and "GGML_ASSERT" in f16.reason
    bf16 = Dump(workdir / "results/ggml/parakeet_tdt/tiny/tool/cpu/bf16/clip")
    assert bf16.manifest["message"].startswith("exit code 1")
    assert not (bf16.path / "mel_features.npy").exists()  # the half-written file is gone
    html = (workdir / "results/report/index.html").read_text()
    assert "crashed" in html


def test_run_killed_during_a_dump_resumes_to_identical_artifacts(tmp_path):
    config = parakeet_config(weight_types=["f32"])
    reference = make_workdir(tmp_path / "uninterrupted", config)
    run_to_completion(reference)

    workdir = make_workdir(tmp_path / "interrupted", config)
    run = subprocess.Popen(snakemake_command(workdir, "--cores", "1"), env=environment(workdir),
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    deadline = time.monotonic() + 300
    while not list((workdir / "results").glob("ggml/**/*.partial")):
        assert run.poll() is None, "the run finished before a dump could be interrupted"
        assert time.monotonic() < deadline, "no ggml dump started within 300 s"
        time.sleep(0.005)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait()
    partial = list((workdir / "results").glob("ggml/**/*.partial"))
    assert partial and not any(Path(str(p).removesuffix(".partial")).exists() for p in partial)

    # the summary a killed run left behind is refused, in one line
    code, line = check(workdir)
    assert code == 2 and line.startswith("audioparity: error: the last run did not finish: "
                                         "started "), line

    run_to_completion(workdir)
    assert not list((workdir / "results").rglob("*.partial"))
    assert npy_bytes(workdir) == npy_bytes(reference)
    assert pd.read_csv(workdir / "results/report/summary.csv").drop(columns="seconds").equals(
        pd.read_csv(reference / "results/report/summary.csv").drop(columns="seconds"))
    assert check(workdir)[0] == 0


def check(workdir: Path) -> tuple[int, str]:
    """`audioparity report check` of the workdir's summary: its exit code and last line."""
    done = subprocess.run([sys.executable, "-m", "audioparity.cli", "report", "check",
                           "results/report/summary.csv"], cwd=workdir, capture_output=True,
                          text=True, env=environment(workdir))
    return done.returncode, (done.stdout + done.stderr).strip().splitlines()[-1]


def test_a_run_that_stops_on_an_error_leaves_no_summary_that_reads_as_current(tmp_path):
    """A reference that raises (an error of the workflow, not a port's fault) stops the run:
    the summary and report of the run before are set aside as stale-*, and the check exits 2
    in one line."""
    workdir = make_workdir(tmp_path / "run", parakeet_config(weight_types=["f32"]))
    run_to_completion(workdir)
    assert check(workdir)[0] == 0
    reference = workdir / "src/audioparity/models/parakeet_tdt/references/nemo.py"
    reference.write_text(reference.read_text() + "\nraise RuntimeError('planted')\n")
    failed = subprocess.run(snakemake_command(workdir, "--cores", "2"),
                            env=environment(workdir), capture_output=True, text=True)
    assert failed.returncode != 0
    report = workdir / "results/report"
    assert not (report / "summary.csv").exists() and not (report / "index.html").exists()
    assert (report / "stale-summary.csv").exists() and (report / "stale-index.html").exists()
    code, line = check(workdir)
    assert code == 2 and line.startswith(
        "audioparity: error: the last run did not finish: it stopped on an error at "), line
    assert line.endswith("results/report/summary.csv is set aside as stale-summary.csv"), line
