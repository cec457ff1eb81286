"""Every example config is code: each one planned by Snakemake (`snakemake -n`) on top of the
default config, as `make run SNAKEMAKE_ARGS="--configfile config/examples/X.yaml"` would, from
a copy of the workflow that sees the shared data and the built ports where this checkout does.
An example that names a real checkpoint the user downloads must be refused for that path alone,
in one line."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests import REPO
from tests.workflow.workdir import environment, make_workdir, snakemake_command

EXAMPLES = sorted((REPO / "config/examples").glob("*.yaml"))
#: Examples that name files a user brings (a real checkpoint, their own audio): the refusal
#: must name the first of them.
USER_FILES = {"parakeet-tdt-0.6b-v3.yaml": "/path/to/parakeet-tdt-0.6b-v3.nemo",
              "moss-voicegenerator.yaml": "/path/to/MOSS-VoiceGenerator",
              "whisper-tiny-en.yaml": "results/models/whisper-tiny-en",
              "quant.yaml": "results/models/whisper-tiny-en"}


def _workdir(tmp_path: Path) -> Path:
    """A workflow copy whose relative paths resolve as in this checkout: resources/, .ports
    and ../shared beside it."""
    workdir = make_workdir(tmp_path / "work", {})
    (workdir / "resources").symlink_to(REPO / "resources")
    for name, target in ((".ports", REPO / ".ports"), ("../shared", REPO.parent / "shared")):
        if target.exists():
            os.symlink(target.resolve(), workdir / name)
    return workdir


@pytest.mark.parametrize("example", EXAMPLES, ids=[e.name for e in EXAMPLES])
def test_each_example_config_plans(example: Path, tmp_path: Path):
    workdir = _workdir(tmp_path)
    command = [*snakemake_command(workdir, "-n", "--quiet", "rules"), "--configfile",
               str(example)]
    result = subprocess.run(command, env=environment(workdir), capture_output=True, text=True)
    output = result.stdout + result.stderr
    if example.name in USER_FILES:
        assert result.returncode != 0
        assert re.search(rf"{re.escape(USER_FILES[example.name])} does not exist", output), \
            output[-2000:]
        return
    missing = [line for line in output.splitlines() if "does not exist" in line]
    if missing and not (REPO.parent / "shared").exists():
        pytest.skip(f"{example.name} reads the shared data folder, absent here: {missing[0]}")
    assert result.returncode == 0, output[-3000:]
    assert "Job stats" in output or "Nothing to be done" in output, output[-2000:]
