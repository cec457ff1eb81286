"""The whole workflow on a temporary directory: a sweep, a no-op rerun, and content-aware reruns.

Runs Snakemake in a subprocess (`python -m snakemake --directory <tmp>`) on a copy of the
workflow, so editing a source file in the copy never touches this checkout.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run the copied workflow in `workdir`; fail the test with Snakemake's output on error."""
    bin_dir = str(Path(sys.executable).parent)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "GGML_NO_BACKTRACE": "1", "HOME": str(workdir)}
    result = subprocess.run(
        [sys.executable, "-m", "snakemake", "--directory", str(workdir),
         "--snakefile", str(workdir / "Snakefile"), "--configfile", str(workdir / "sweep.yaml"),
         *args],
        capture_output=True, text=True, env=env, cwd=workdir,
    )
    if result.returncode != 0:
        output = f"{result.stdout[-4000:]}\n{result.stderr[-4000:]}"
        pytest.fail(f"snakemake {' '.join(args)} failed:\n{output}")
    return result


def planned_rules(workdir: Path) -> list[str]:
    """Names of the jobs a dry run would run (Snakemake's job-stats table)."""
    out = snakemake(workdir, "-n", "--quiet", "rules").stdout
    return sorted(set(re.findall(r"^(\w+)\s+\d+\s*$", out, flags=re.M)) - {"total", "all"})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep of the tiny fixture on the shipped clip: f32 and q8_0, cpu and vulkan."""
    workdir = tmp_path_factory.mktemp("workflow")
    for item in ("Snakefile", "rules", "config", "src", "docs"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, workdir / item)
    config = {
        "parakeet_tdt": {
            "models": [{"name": "tiny", "path": "results/fixtures/parakeet_tdt/tiny.nemo"}],
            "cases": [{"name": "clip", "path": str(REPO / "resources/speech/clip.wav")}],
            "backends": ["cpu", "vulkan"],
            "weight_types": ["f32", "q8_0"],
        }
    }
    (workdir / "sweep.yaml").write_text(yaml.safe_dump(config))
    snakemake(workdir, "--cores", "2")
    return workdir


def test_sweep_writes_summary_and_self_contained_report(sweep):
    summary = pd.read_csv(sweep / "results/report/summary.csv")
    assert set(summary["weight_type"]) == {"f32", "q8_0"}
    cpu_f32 = summary[(summary.backend == "cpu") & (summary.weight_type == "f32")]
    assert {"mel_features", "enc_out", "decoder_replay", "decode", "layer_0_isolated"} <= set(
        cpu_f32.stage
    )
    assert (cpu_f32.status == "pass").all(), cpu_f32[cpu_f32.status != "pass"].to_string()
    html = (sweep / "results/report/index.html").read_text()
    assert "data:image/png;base64," in html
    assert not re.search(r"""(src|href)=["']https?://""", html)


def test_backend_not_built_in_is_unavailable_not_an_error(sweep):
    import ggml

    if ggml.GGML_USE_VULKAN:
        pytest.skip("this ggml has Vulkan built in")
    summary = pd.read_csv(sweep / "results/report/summary.csv")
    assert (summary[summary.backend == "vulkan"].status == "unavailable").all()


def test_finished_sweep_has_nothing_to_do(sweep):
    assert planned_rules(sweep) == []


def test_touching_a_source_file_reruns_nothing(sweep):
    (sweep / "src/audioparity/models/parakeet_tdt/encoder.py").touch()
    assert planned_rules(sweep) == []


def test_editing_the_encoder_reruns_only_ggml_compare_and_report(sweep):
    encoder = sweep / "src/audioparity/models/parakeet_tdt/encoder.py"
    original = encoder.read_text()
    encoder.write_text(original + "\n# an edit\n")
    try:
        assert planned_rules(sweep) == [
            "compare_cell", "parakeet_ggml_dump", "report_html", "report_summary"
        ]
    finally:
        encoder.write_text(original)


def test_editing_the_report_code_reruns_only_the_html(sweep):
    html = sweep / "src/audioparity/report/html.py"
    original = html.read_text()
    html.write_text(original + "\n# an edit\n")
    try:
        assert planned_rules(sweep) == ["report_html"]
    finally:
        html.write_text(original)
