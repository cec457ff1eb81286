"""The workflow through ``--profile profiles/slurm`` on a real one-node SLURM cluster started on
this machine (setup/slurm.sh): the same summary as a local run, every job visible to squeue, the
jobs of a GPU backend's cell in the profile's GPU partition with a GPU and every other job in the
default partition, and nothing submitted a second time.

Needs root or sudo (the daemons and /etc/slurm/slurm.conf); skipped without, unless
AUDIOPARITY_REQUIRE_SLURM is set (CI), which makes it fail instead.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pandas as pd
import pytest

from tests import REPO
from tests.workflow.workdir import make_workdir, parakeet_config, snakemake

pytestmark = pytest.mark.slow

SCRIPT = REPO / "setup" / "slurm.sh"
#: A named setting of the CUDA backend: its cells' jobs are GPU jobs (its dumps are
#: `unavailable` in seconds on a ggml without CUDA, and the summary says so on both runs).
CUDA_STRICT = {"name": "cuda-strict", "backend": "cuda", "env": {"GGML_CUDA_DISABLE_TF32": "1"}}
#: The rules whose jobs run a cell's ggml backend (gpu_resources in rules/common.smk); their
#: SLURM comment is ``rule_<rule>_wildcards_<the wildcards' values joined by _>``.
GPU_JOB = re.compile(r"rule_(ggml_dump|compare_fresh|drilldown)_wildcards_\S*_"
                     rf"{CUDA_STRICT['name']}_")
METRICS = ["cosine", "std_ratio", "nmse", "max_abs", "mean_abs", "max_rel", "kl", "wer",
           "cost_nmse", "cost_cosine"]


def _cluster(action: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), action], capture_output=True, text=True)


@pytest.fixture(scope="module")
def cluster():
    """The cluster, started for this module and stopped after it (left running if it was)."""
    allowed = os.geteuid() == 0 or shutil.which("sudo")
    if not allowed and not os.environ.get("AUDIOPARITY_REQUIRE_SLURM"):
        pytest.skip("no root and no sudo: setup/slurm.sh cannot start the daemons")
    was_running = _cluster("status").returncode == 0
    started = _cluster("start")
    assert started.returncode == 0, started.stdout + started.stderr
    again = _cluster("start")  # idempotent: a running cluster is left as it is
    assert again.returncode == 0 and "running already" in again.stdout, again.stdout
    yield
    if not was_running:
        stopped = _cluster("stop")
        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert _cluster("status").returncode != 0


def _sweep(tmp_path_factory, name: str):
    # the profile, not the weight types, is tested; a backend cell for the GPU partition
    config = parakeet_config(weight_types=["f32"], backends=["cpu", CUDA_STRICT])
    workdir = make_workdir(tmp_path_factory.mktemp(name) / "run", config)
    shutil.copytree(REPO / "profiles", workdir / "profiles")
    return workdir


def _slurm(workdir) -> subprocess.CompletedProcess:
    # one thread per job: the node has the machine's cores, and the local run's jobs use one;
    # a group of compares asks for a core per compare it runs at once, at most --cores: the
    # local run's 2 (3 compares asked for 3 cores of a 2-core node and pended for ever);
    # the first status check after 5 s, not the plugin's 40 (it also waits that long to exit)
    return snakemake(workdir, "--profile", "profiles/slurm", "--jobs", "4", "--cores", "2",
                     "--set-threads", "reference_dump=1", "ggml_dump=1", "drilldown=1",
                     "--slurm-init-seconds-before-status-checks", "5")


def test_a_sweep_through_the_slurm_profile_equals_the_local_run(cluster, tmp_path_factory):
    local, cluster_run = _sweep(tmp_path_factory, "local"), _sweep(tmp_path_factory, "slurm")
    snakemake(local, "--cores", "2")
    result = _slurm(cluster_run)
    log = result.stdout + result.stderr
    run_id = re.search(r"SLURM run ID: (\S+)", log)[1]
    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    rules = set(re.findall(r"slurm_logs/(?:rule|group)_(\w+?)/", log))
    assert {"fixture_build", "reference_dump", "ggml_weights", "ggml_dump", "drilldown",
            "compare_compare_backend_compare_cell"} <= rules, rules
    assert not re.search(r"slurm_logs/rule_report_", log)  # the report runs locally

    queue = subprocess.run(["squeue", "--states=all", "--noheader", "--format=%i|%T|%P|%b|%k",
                            "--name", run_id], capture_output=True, text=True, check=True)
    jobs = {job: rest for job, *rest in (line.split("|") for line in queue.stdout.split())}
    assert sorted(jobs) == sorted(submitted)
    assert {state for state, *_ in jobs.values()} == {"COMPLETED"}
    # where each job ran: the profile's GPU resources (cluster.gpu_resources) for the CUDA
    # cell's dump and drill-down, the default partition without a GPU for every other job
    gpu = {job: GPU_JOB.match(comment) for job, (*_, comment) in jobs.items()}
    gpu = {job: match[1] for job, match in gpu.items() if match}
    assert sorted(gpu.values()) == ["drilldown", "ggml_dump"], jobs
    assert {job: (partition, gres) for job, (_, partition, gres, _) in jobs.items()} == {
        job: ("gpu", "gres:gpu:1") if job in gpu else ("local", "N/A") for job in jobs}, jobs

    ours = pd.read_csv(local / "results/report/summary.csv")
    theirs = pd.read_csv(cluster_run / "results/report/summary.csv")
    keys = ["family", "model", "case", "candidate", "backend", "weight_type", "against", "stage"]
    ours, theirs = (frame.sort_values(keys).reset_index(drop=True) for frame in (ours, theirs))
    assert len(ours) > 10  # every stage of the f32 cell
    pd.testing.assert_frame_equal(ours[[*keys, "status", "gate", "reason"]],
                                  theirs[[*keys, "status", "gate", "reason"]])
    np.testing.assert_allclose(theirs[METRICS].to_numpy(float), ours[METRICS].to_numpy(float),
                               rtol=1e-6, atol=1e-12, equal_nan=True)

    again = _slurm(cluster_run)
    assert "has been submitted" not in again.stdout + again.stderr
    assert "Nothing to be done" in again.stdout + again.stderr
