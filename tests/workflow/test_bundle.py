"""A bundle packed here, run in a fresh folder without the network or a package index, and
merged back gives the summary the direct run gives (docs/bundles.md).

The sweep is the tiny Parakeet fixture on the clip at f32 and q8_0 on cpu and vulkan
(lavapipe), and the bundle takes both backends' cells, so the host computes the CPU dumps, the
Vulkan dumps, their comparison and the drill-down. The host's ggml-python is this machine's
cached build (the wheel cache, as a second setup takes it): building it offline from the
bundled source package is setup/ggml-python.sh's, tested in tests/setup/.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pandas as pd
import pytest

import tests.workflow.workdir as wd
from audioparity.contract.errors import AudioparityError
from audioparity.workflow.bundle import MANIFEST, RETURNED, merge
from tests import REPO
from tests.conftest import vulkan_or_skip

pytestmark = pytest.mark.slow

CONFIG = wd.parakeet_config(weight_types=["f32", "q8_0"], backends=["cpu", "vulkan"])
#: What building the project's wheel needs beside the workflow's folders (make_workdir's).
BUILD_ITEMS = ("setup", "Makefile", "pyproject.toml", "README.md")


def workflow_folder(root: Path) -> Path:
    workdir = wd.make_workdir(root, CONFIG)
    for item in BUILD_ITEMS:
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, workdir / item)
    return workdir


def audioparity(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    command = [str(Path(sys.executable).parent / "audioparity"), *args]
    return subprocess.run(command, cwd=workdir, env=wd.environment(workdir), capture_output=True,
                          text=True)


def offline(command: list[str]) -> list[str]:
    """``command`` without the network where this machine can take it away (unshare)."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"]).returncode == 0:
        return ["unshare", "-n", *command]
    return command


def summary(workdir: Path) -> pd.DataFrame:
    """The summary, but its timings (``seconds``: a dump's wall time per stage)."""
    frame = pd.read_csv(workdir / "results" / "report" / "summary.csv", dtype=str,
                        keep_default_na=False).drop(columns="seconds")
    return frame.sort_values(list(frame.columns)).reset_index(drop=True)


#: The jobs' Vulkan device, and Mesa's shader cache (compiling lavapipe's pipelines is most of
#: a cold Vulkan run), as tests/workflow/test_backends.py passes them.
VULKAN = {"GGML_VK_VISIBLE_DEVICES": os.environ.get("GGML_VK_VISIBLE_DEVICES", "0"),
          "MESA_SHADER_CACHE_DIR": str(Path.home() / ".cache" / "mesa_shader_cache")}


def test_a_bundle_run_offline_and_merged_gives_the_direct_runs_summary(tmp_path, monkeypatch):
    vulkan_or_skip()
    plain = wd.environment
    monkeypatch.setattr(wd, "environment", lambda workdir: {**plain(workdir), **VULKAN})
    direct = workflow_folder(tmp_path / "direct")
    wd.run_to_completion(direct)

    first = workflow_folder(tmp_path / "first")
    packed = audioparity(first, "bundle", "pack", "--configfile", "sweep.yaml", "--backend",
                         "cpu", "--backend", "vulkan", "--cores", "2", "--output",
                         str(tmp_path / "cells.tar"))
    assert packed.returncode == 0, packed.stderr[-3000:]
    assert not list((first / "results" / "ggml").glob("*/*/*/vulkan")), "the host's cells ran here"

    host = tmp_path / "host"  # a fresh folder: only the bundle, no checkout, no venv
    host.mkdir()
    with tarfile.open(tmp_path / "cells.tar") as archive:
        archive.extractall(host, filter="tar")
    bundle = host / "cells"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(host), "PIP_CONFIG_FILE": os.devnull, **VULKAN,
           "AUDIOPARITY_WHEELS": os.environ.get("AUDIOPARITY_WHEELS", str(
               Path.home() / ".cache" / "audioparity" / "wheels"))}
    ran = subprocess.run(offline([str(bundle / "run"), "2"]), cwd=host, env=env,
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    assert set(wd.ran_rules(ran)) == {"ggml_dump", "compare_backend", "drilldown"}

    returned = bundle / RETURNED
    edited = first / "src" / "audioparity" / "compare" / "metrics.py"
    original = edited.read_text()
    edited.write_text(original + "\n# an edit after packing\n")
    with pytest.raises(AudioparityError, match="metrics.py changed here since the bundle"):
        merge(first, returned)
    edited.write_text(original)
    # how ggml is built is the port's code too: the host's cells were computed with the old
    patch = first / "setup" / "patches" / "ggml-python-cpu-gemm.patch"
    patch.write_text(patch.read_text() + "\n")
    with pytest.raises(AudioparityError, match="cpu-gemm.patch changed here since the bundle"):
        merge(first, returned)
    patch.write_text(patch.read_text()[:-1])
    targets = len(json.loads((returned / MANIFEST).read_text())["targets"])
    assert merge(first, returned)[0].startswith(f"bundle merge: {targets} of {targets} results")

    after = wd.run_to_completion(first)
    assert not {"ggml_dump", "compare_backend", "drilldown"} & set(wd.ran_rules(after))
    pd.testing.assert_frame_equal(summary(first), summary(direct))


def test_merge_refuses_a_folder_that_is_no_bundles(tmp_path):
    (tmp_path / MANIFEST).write_text("{}")
    with pytest.raises(AudioparityError, match="is no bundle's returned folder"):
        merge(tmp_path, tmp_path)
