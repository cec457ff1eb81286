"""Every example config is code: each one planned by Snakemake (`snakemake -n`) on top of the
default config, as `make run SNAKEMAKE_ARGS="--configfile config/examples/X.yaml"` would, from
a copy of the workflow that sees the shared data and the built ports where this checkout does.
An example that names a real checkpoint the user downloads must be refused for that path alone,
in one line."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

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


def test_cuda_strict_takes_the_gates_of_cuda_the_cpus_at_float32(monkeypatch):
    """config/examples/cuda.yaml over the default config, as --configfile lays it: cuda-strict
    (a setting of cuda) takes cuda's gates at every weight type: at f32 and native the CPU's,
    not loosened; at a type with a <type>@cuda list that list first, each of its entries marked
    unmeasured (copies of the Vulkan lists), where the CPU's cells carry no mark."""
    from snakemake.utils import update_config, validate

    from audioparity.candidates import load_adapter
    from audioparity.models.registry import registered
    from audioparity.workflow.code import Code
    from audioparity.workflow.commands import Commands
    from audioparity.workflow.jobs import Jobs
    from audioparity.workflow.plan import Sweep

    monkeypatch.chdir(REPO)
    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    update_config(config, yaml.safe_load((REPO / "config/examples/cuda.yaml").read_text()))
    validate(config, str(REPO / "config/schema.yaml"))
    commands = Commands(Jobs(Sweep(config, registered(), load_adapter), Code(REPO / "src")))
    for family, plan in commands.jobs.sweep.families.items():
        assert plan.backends["cuda-strict"].backend == "cuda"
        lists = {}
        for weight_type in plan.section["weight_types"]:
            w = SimpleNamespace(family=family, model=next(iter(plan.models)),
                                candidate="audioparity", weight_type=weight_type,
                                case=next(iter(plan.cases)))
            gates = {backend: json.loads(commands.gates(SimpleNamespace(**vars(w),
                                                                        backend=backend)))
                     for backend in ("cpu", "cuda", "cuda-strict")}
            assert gates["cuda-strict"] == gates["cuda"], (family, weight_type)
            assert not any("unmeasured" in entry for entry in gates["cpu"]["gates"])
            own = [entry for entry in gates["cuda"]["gates"]
                   if entry["from"] == f"{weight_type}@cuda"]
            lists[weight_type] = bool(own)
            if own:
                assert all(entry["unmeasured"].startswith("unmeasured on cuda: copied from the "
                                                          "Vulkan lists") for entry in own)
            else:
                assert gates["cuda"]["gates"] == gates["cpu"]["gates"], (family, weight_type)
        assert lists["f32"] is False and lists["q8_0"] is True, (family, lists)
