"""The whole workflow on a temporary directory: a sweep, a no-op rerun, and content-aware reruns.

Runs Snakemake in a subprocess (`python -m snakemake --directory <tmp>`) on a copy of the
workflow, so editing a source file in the copy never touches this checkout.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pandas as pd
import pytest
import yaml

from tests import REPO
from tests.workflow.workdir import (
    edited,
    environment,
    make_workdir,
    parakeet_config,
    planned_rules,
    ran_rules,
    snakemake,
    snakemake_command,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A finished sweep: the tiny Parakeet on the shipped clip (f32 and q8_0, cpu and vulkan)
    and the tiny MOSS on one prompt (f32)."""
    root = tmp_path_factory.mktemp("workflow")
    config = parakeet_config(backends=["cpu", "vulkan"], weight_types=["f32", "q8_0"])
    config["families"].append("moss_voicegen")
    config["moss_voicegen"] = {
        "models": [{"name": "tiny", "path": "results/fixtures/moss_voicegen/tiny"}],
        "cases": [{"name": "en", "path": str(REPO / "resources/moss/en_instruction.json")}],
        "weight_types": ["f32"],
    }
    workdir = make_workdir(root / "run", config, fresh_check=True)
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


def test_results_are_laid_out_by_family_model_and_candidate(sweep):
    assert (sweep / "results/fixtures/parakeet_tdt/tiny/model.nemo").is_file()
    assert (sweep / "results/reference/parakeet_tdt/tiny/clip/manifest.json").is_file()
    assert (sweep / "results/reference/parakeet_tdt/tiny/clip.sha256").is_file()
    assert (sweep / "results/ggml/parakeet_tdt/tiny/audioparity/cpu/q8_0/clip").is_dir()
    assert (sweep / "results/compare/moss_voicegen/tiny/audioparity/cpu/f32/en.json").is_file()


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
    with edited(sweep / "src/audioparity/models/parakeet_tdt/encoder.py"):
        assert planned_rules(sweep) == [
            "compare_backend", "compare_cell", "compare_fresh", "drilldown", "ggml_dump",
            "report_html", "report_summary"
        ]


def test_editing_the_ggml_runtime_reruns_no_reference_job(sweep):
    """The reference side imports nothing of ggml: the slowest jobs stay done. The weights
    are converted again (the runtime writes them)."""
    with edited(sweep / "src/audioparity/ggml/runtime.py"):
        assert planned_rules(sweep) == [
            "compare_backend", "compare_cell", "compare_fresh", "drilldown", "ggml_dump",
            "ggml_weights", "report_html", "report_summary"
        ]


def test_each_model_is_converted_once_per_weight_type_and_every_dump_maps_it(sweep):
    """One GGUF file per (model, weight type), shared by the model's cases and backends; every
    dump of this project's port names the one it mapped."""
    converted = sorted(str(p.relative_to(sweep / "results/weights"))
                       for p in (sweep / "results/weights").rglob("*.gguf"))
    assert converted == ["moss_voicegen/tiny/audioparity/f32.gguf",
                         "parakeet_tdt/tiny/audioparity/f32.gguf",
                         "parakeet_tdt/tiny/audioparity/q8_0.gguf"]
    manifests = list((sweep / "results/ggml").glob("*/*/audioparity/*/*/*/manifest.json"))
    assert len(manifests) == 1 + 2 * 2
    for manifest in manifests:
        family_, model, _, _, weight_type = manifest.parts[-7:-2]
        assert json.loads(manifest.read_text())["weights_file"] == (
            f"results/weights/{family_}/{model}/audioparity/{weight_type}.gguf")


def test_a_config_naming_a_new_model_plans_its_jobs_over_an_old_summary(sweep):
    """The summary's cells are known only after the new model's reference checkpoint: a summary
    left by the config before must not pass for up to date."""
    config = sweep / "sweep.yaml"
    original = config.read_text()
    sweep_config = yaml.safe_load(original)
    sweep_config["fixtures"] = {"parakeet_tdt": {"other": {"seed": 1}}}
    sweep_config["parakeet_tdt"]["models"] = [
        {"name": "other", "path": "results/fixtures/parakeet_tdt/other/model.nemo"}]
    config.write_text(yaml.safe_dump(sweep_config))
    try:
        planned = planned_rules(sweep)
    finally:
        config.write_text(original)
    assert {"fixture_build", "reference_dump", "report_cells", "report_summary"} <= set(planned)


def test_adding_a_case_reruns_only_what_the_new_case_needs(sweep, tmp_path):
    """A new case reruns the model's reference job (one load for all its cases), which restores
    the other cases' dumps from its cache and computes the new one only (their manifests keep
    their run times), and then only the new case's dumps and compares run, and nothing of
    MOSS."""
    import soundfile

    reference = sweep / "results/reference/parakeet_tdt/tiny"
    before = {dump.name: (dump / "manifest.json").read_bytes()
              for dump in reference.iterdir() if dump.is_dir()}
    assert sorted(before) == ["clip", "clip@q8_0"]

    audio, rate = soundfile.read(REPO / "resources/speech/clip.wav", dtype="float32")
    head = tmp_path / "head.wav"
    soundfile.write(head, audio[: 3 * rate], rate)
    config = sweep / "sweep.yaml"
    original = config.read_text()
    sweep_config = yaml.safe_load(original)
    sweep_config["parakeet_tdt"]["cases"].append({"name": "head", "path": str(head)})
    config.write_text(yaml.safe_dump(sweep_config))
    try:
        result = snakemake(sweep, "--cores", "2")
        log = result.stdout + result.stderr
        assert "reference_dump" in ran_rules(result)
        assert "ggml_weights" not in ran_rules(result)  # the model's weights stay converted
        cells = re.findall(r"output: results/(?:ggml|compare|compare_backends|drilldown)/(\S+)",
                           log)
        assert cells and all(re.search(r"/head(\.json)?(,|$)", cell) for cell in cells), cells
        assert "moss_voicegen" not in "".join(cells)
        assert {name: (reference / name / "manifest.json").read_bytes()
                for name in before} == before
        assert sorted(p.name for p in reference.iterdir() if p.is_dir()) == [
            "clip", "clip@q8_0", "head", "head@q8_0"]
        job_log = (sweep / "logs/reference_dump/parakeet_tdt/tiny.log").read_text()
        assert "1 of 2 case(s) restored" in job_log, job_log
        assert len(list((sweep / "results/cache/reference/parakeet_tdt/tiny").iterdir())) == 4
    finally:
        config.write_text(original)
        snakemake(sweep, "--cores", "2")


def test_a_dump_asks_memory_for_its_model_and_weight_type_and_one_that_cannot_fit_is_refused(
        sweep):
    """mem_mb from the model's size and the cell's weight type (f32 above q8_0); a job whose
    estimate exceeds --resources mem_mb is refused in one line, not shrunk to fit."""
    dumps = "results/ggml/parakeet_tdt/tiny/audioparity/cpu"

    def asked(weight_type: str, *args: str) -> subprocess.CompletedProcess:
        argv = snakemake_command(sweep, "-n", "--cores", "2", "-f",
                                 f"{dumps}/{weight_type}/clip", *args)
        return subprocess.run(argv, env=environment(sweep), capture_output=True, text=True)

    memory = {}
    for weight_type in ("f32", "q8_0"):
        log = asked(weight_type).stdout
        memory[weight_type] = int(re.search(r"rule ggml_dump:.*?mem_mb=(\d+)", log, re.S)[1])
    assert memory["f32"] > memory["q8_0"] > 600
    refused = asked("f32", "--resources", f"mem_mb={memory['f32'] - 1}")
    assert refused.returncode != 0
    assert (f"ggml job of parakeet_tdt/tiny/f32 needs about {memory['f32']} MB, more than "
            f"--resources mem_mb={memory['f32'] - 1}") in refused.stdout + refused.stderr


def test_changing_a_familys_option_reruns_its_dumps_and_not_the_other_familys(sweep):
    """A dump's command reads its output and threads, which Snakemake does not record; the
    options it runs with are recorded apart, so a changed option reruns the cells it feeds."""
    config = yaml.safe_load((sweep / "sweep.yaml").read_text())
    config["moss_voicegen"]["options"] = {"kv_cache_type": "f16"}
    changed = sweep / "changed.yaml"
    changed.write_text(yaml.safe_dump(config))
    out = snakemake(sweep, "-n", "--configfile", str(changed)).stdout
    dumps = re.findall(r"^\s+output: (results/ggml/\S+)", out, flags=re.M)
    assert dumps and all(d.startswith("results/ggml/moss_voicegen/") for d in dumps), dumps


def test_editing_the_report_code_reruns_only_the_html(sweep):
    with edited(sweep / "src/audioparity/report/html.py"):
        assert planned_rules(sweep) == ["report_html"]


def test_editing_the_nemo_reference_reruns_it_and_nothing_its_unchanged_dumps_feed(sweep):
    """The reference job runs again; its dumps are byte-identical (digests unchanged), so no
    ggml dump or compare of that model runs again."""
    digest = sweep / "results/reference/parakeet_tdt/tiny/clip.sha256"
    before = digest.read_bytes()
    with edited(sweep / "src/audioparity/models/parakeet_tdt/references/nemo.py"):
        ran = ran_rules(snakemake(sweep, "--cores", "2"))
    assert ran == ["reference_dump"]
    assert digest.read_bytes() == before
    assert ran_rules(snakemake(sweep, "--cores", "2")) == ["reference_dump"]  # the edit undone


def test_a_changed_reference_dump_reruns_what_reads_it(sweep):
    """The control of the test above: an edit of the NeMo reference that changes what its dump
    holds (the decode's margins, which only a near-tie reads) reruns every ggml dump and compare
    of that model, and nothing of MOSS."""
    reference = sweep / "src/audioparity/models/parakeet_tdt/references/nemo.py"
    original = reference.read_text()
    margins = "yield Names.DECODE_MARGINS, margins\n"
    assert original.count(margins) == 1
    reference.write_text(original.replace(margins, "yield Names.DECODE_MARGINS, 2 * margins\n"))
    try:
        result = snakemake(sweep, "--cores", "2")
        assert ran_rules(result) == ["compare_backend", "compare_cell", "compare_fresh",
                                     "drilldown", "ggml_dump", "reference_dump", "report_html",
                                     "report_summary"]
        log = result.stdout + result.stderr
        assert "output: results/ggml/moss_voicegen" not in log
        assert "output: results/compare/moss_voicegen" not in log
        summary = pd.read_csv(sweep / "results/report/summary.csv")
        pos_emb = summary[summary.stage == "pos_emb"]
        assert (pos_emb[pos_emb.backend == "cpu"].status == "pass").all()
    finally:
        reference.write_text(original)
        snakemake(sweep, "--cores", "2")


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
    ("section", "message"),
    [
        ({"parakeet_tdt": {"cases": [{"name": "a", "path": "resources/speech/clip.wav"}] * 2}},
         "the name 'a' is used twice"),
        ({"parakeet_tdt": {"cases": [{"name": "a", "path": "no/such.wav"}]}},
         "'a': no/such.wav does not exist"),
        ({"parakeet_tdt": {"options": {"flash_attention": 2}}},
         "config parakeet_tdt.options['flash_attention']: 2 is not one of [0, 1]"),
        ({"parakeet_tdt": {"options": {"kv_cache_type": "f16"}}},
         "('kv_cache_type' was unexpected)"),
        ({"families": ["parakeet_tdt", "wav2vec"]},
         "config families: unknown family 'wav2vec'; registered: "),
        ({"parakeet_tdd": {"cases": []}},
         "config: 'parakeet_tdd' is neither families nor fixtures nor environments nor cluster "
         "nor a registered family"),
        ({"cluster": {"gpu_partition": "gpu"}}, "('gpu_partition' was unexpected)"),
        ({"parakeet_tdt": {"models": [{"name": "tiny",
                                       "path": "results/fixtures/parakeet_tdt/tiny.nemo"}]}},
         "names no fixture the config declares"),
    ],
)
def test_a_bad_config_is_refused_in_one_line(tmp_path, section, message):
    config = tmp_path / "bad.yaml"
    config.write_text(yaml.safe_dump({"families": ["parakeet_tdt"], **section}))
    result = subprocess.run([sys.executable, "-m", "snakemake", "-n", "--configfile", str(config)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode != 0
    assert message in result.stdout + result.stderr


def test_check_passes_the_sweep_and_names_the_culprit_of_a_planted_bug(sweep):
    """`audioparity report check` (make check): 0 on the sweep, 1 once a bug is planted in
    layer 1, naming layer 1's isolated form as the culprit of each cell."""
    from tests.models.parakeet_tdt.test_planted_bugs import BUGS

    def check() -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "audioparity.cli", "report", "check",
                               str(sweep / "results/report/summary.csv")],
                              capture_output=True, text=True)

    clean = check()
    assert clean.returncode == 0, clean.stdout
    ((file, old, new),) = BUGS["layer_1_norm_bias_dropped"]
    source = sweep / "src/audioparity/models/parakeet_tdt" / file
    original = source.read_text()
    source.write_text(original.replace(old, new))
    try:
        snakemake(sweep, "--cores", "2")
        planted = check()
    finally:
        source.write_text(original)
        snakemake(sweep, "--cores", "2")
    assert planted.returncode == 1
    lines = planted.stdout.splitlines()
    assert lines[-1].startswith("audioparity check: ") and "need attention" in lines[-1]
    assert "parakeet_tdt/tiny/clip/audioparity/cpu/f32: layer_1_isolated (fail, its own " \
           "error)" in planted.stdout
