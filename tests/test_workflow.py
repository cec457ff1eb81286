"""The whole workflow on a temporary directory: a sweep, a no-op rerun, and content-aware reruns.

Runs Snakemake in a subprocess (`python -m snakemake --directory <tmp>`) on a copy of the
workflow, so editing a source file in the copy never touches this checkout.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml
from workflow_copy import REPO, make_workdir, parakeet_config, snakemake

pytestmark = pytest.mark.slow


def planned_rules(workdir: Path) -> list[str]:
    """Names of the jobs a dry run would run (Snakemake's job-stats table)."""
    out = snakemake(workdir, "-n", "--quiet", "rules").stdout
    return sorted(set(re.findall(r"^(\w+)\s+\d+\s*$", out, flags=re.M)) - {"total", "all"})


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep: the tiny Parakeet on the shipped clip (f32 and q8_0, cpu and vulkan) and
    the tiny MOSS on one prompt (f32)."""
    config = parakeet_config(backends=["cpu", "vulkan"], weight_types=["f32", "q8_0"])
    config["families"].append("moss_voicegen")
    config["moss_voicegen"] = {
        "models": [{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
        "cases": [{"name": "en", "path": str(REPO / "resources/moss/en_instruction.json")}],
        "weight_types": ["f32"],
    }
    workdir = make_workdir(tmp_path_factory.mktemp("workflow") / "run", config)
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


def test_moss_cell_passes_at_f32(sweep):
    summary = pd.read_csv(sweep / "results/report/summary.csv")
    moss = summary[summary.family == "moss_voicegen"]
    assert {"prompt", "last_hidden", "step_last_hidden", "generation"} <= set(moss.stage)
    assert (moss.status == "pass").all(), moss[moss.status != "pass"].to_string()


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


def test_lint_is_clean(sweep):
    result = snakemake(sweep, "--lint")
    assert "Congratulations" in result.stdout + result.stderr
    assert "Lints for" not in result.stdout + result.stderr


def test_snakemake_report_bundles_the_summary_and_the_html(sweep):
    snakemake(sweep, "--report", "report.zip")
    with zipfile.ZipFile(sweep / "report.zip") as bundle:
        names = bundle.namelist()
    assert any(name.endswith("summary.csv") for name in names)
    assert any(name.endswith("index.html") for name in names)


@pytest.mark.parametrize(
    ("cases", "message"),
    [
        ([{"name": "a", "path": "resources/speech/clip.wav"}] * 2, "the name 'a' is used twice"),
        ([{"name": "a", "path": "no/such.wav"}], "'a': no/such.wav does not exist"),
    ],
)
def test_config_naming_a_case_twice_or_a_missing_file_is_refused(tmp_path, cases, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"families": ["parakeet_tdt"],
                                      "parakeet_tdt": {"cases": cases}}))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr
