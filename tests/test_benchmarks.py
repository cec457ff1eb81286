"""The benchmark harnesses run against the current code (issue 23: benchmarks are code too).

Each script under benchmarks/ runs as ``make bench`` runs it (the venv's interpreter, from the
checkout, as a subprocess) on its tiny setting: the tiny random-weight checkpoints of
benchmarks/checkpoints.py, built once for the module, one or two weight types, short inputs,
one thread. Each test then reads what the script wrote with the fields its tables read, not
just its exit code. Every output goes under pytest's temporary folders; a guard checks that
benchmarks/results is left as it was.
"""

from __future__ import annotations

import csv
import importlib
import json
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from audioparity.models.registry import family as family_of
from tests import REPO

BENCHMARKS = REPO / "benchmarks"
# benchmarks/ holds scripts that import each other by name (tables imports checkpoints)
sys.path.insert(0, str(BENCHMARKS))
tables = importlib.import_module("tables")
#: The cached checkpoints' names, as ``run.ensure_checkpoint`` looks them up (seed 0).
PARAKEET_TINY, MOSS_TINY = "parakeet-tiny-s0.nemo", "moss-tiny-s0"
#: The columns of bench.csv (and builds.csv) that the tables of run.py and BENCHMARKS.md read.
RECORD_FIELDS = ("model", "impl", "build", "weight_type", "threads", "part", "n", "median_ms",
                 "min_ms", "max_ms", "peak_rss_mib", "others_cores")
PARTS = {"parakeet": {"encoder", "decoder"}, "moss": {"prefill", "step"}}
#: Short measurements: one thread, one repetition, short inputs, no waiting for quiet.
SHORT = ("--threads", "1", "--reps", "1", "--steps", "2", "--seconds", "2", "--wait-quiet", "0")


def bench(script: str, *args: str | Path, timeout: float = 600) -> str:
    """Run ``benchmarks/<script>`` with ``args`` from the checkout; its stdout. Fails with the
    end of its stderr unless it exits 0."""
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *map(str, args)],
                          cwd=REPO, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, (f"{script} exited {done.returncode}:\n"
                                  f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}")
    return done.stdout


def snapshot(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in folder.rglob("*")
            if p.is_file()}


@pytest.fixture(autouse=True)
def results_untouched():
    """No test run writes into benchmarks/results."""
    before = snapshot(BENCHMARKS / "results")
    yield
    assert snapshot(BENCHMARKS / "results") == before, "a benchmark test wrote into results/"


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The benchmark cache with both tiny checkpoints, built by checkpoints.py as the runner
    builds them."""
    folder = tmp_path_factory.mktemp("bench_cache")
    bench("checkpoints.py", "parakeet", "--shape", "tiny", "--output", folder / PARAKEET_TINY)
    bench("checkpoints.py", "moss", "--shape", "tiny", "--output", folder / MOSS_TINY)
    return folder


def records(path: Path) -> list[dict]:
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def markdown_rows(lines: list[str], header_start: str) -> list[dict]:
    """The rows of the Markdown table whose header starts with ``header_start``, as dicts."""
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    header = [cell.strip() for cell in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(header, (c.strip() for c in line.strip("|").split("|")),
                             strict=True)))
    return rows


def test_checkpoints(cache: Path) -> None:
    """The tiny checkpoints have the sizes checkpoints.py gives them."""
    assert (cache / PARAKEET_TINY).is_file()
    config = json.loads((cache / MOSS_TINY / "config.json").read_text())
    assert config["n_vq"] == 4 and config["language_config"]["hidden_size"] == 128
    assert (cache / MOSS_TINY / "model.safetensors").stat().st_size > 0


def check_run_results(out: Path, weight_types: tuple[str, ...]) -> None:
    """bench.json: every child measured both families' parts, the ggml side with its parity
    figures against the reference of the same run and its buffers' bytes; the memory dumps
    exited 0. bench.csv: the records the tables read."""
    bench_json = json.loads((out / "bench.json").read_text())
    results = bench_json["results"]
    assert not [r for r in results if "error" in r]
    kinds = sorted((r["spec"]["kind"], r["spec"].get("weight_type", "")) for r in results)
    assert kinds == sorted([("parakeet_torch", ""), ("moss_torch", ""),
                            *[(f"{m}_ggml", t) for m in PARTS for t in weight_types]])
    for r in results:
        model = r["spec"]["kind"].split("_")[0]
        assert PARTS[model] <= set(r["parts"]) and all(r["parts"][p] for p in PARTS[model])
        assert r["peak_rss_mib"] > 0 and "load" in r["seconds"]
        if r["spec"]["kind"].endswith("_ggml"):
            assert r["bytes"]["weights"] > 0 and r["bytes"]["compute"] > 0
            parity = r["parity"]
            cosine = parity["enc_out_cosine" if model == "parakeet" else "last_hidden_cosine"]
            assert cosine > (0.9999 if r["spec"]["weight_type"] == "f32" else 0.99)
            if model == "parakeet" and r["spec"]["weight_type"] == "f32":
                assert parity["decode_equal"] is True
    memory = bench_json["memory"]
    assert len(memory) == 6 and all(row["rc"] == 0 for row in memory), memory  # 2 references
    assert all(row["peak_rss_mib"] > 0 for row in memory)
    assert all(row["ratio"] > 0 for row in memory if row["process"] == "ggml dump")
    rows = records(out / "bench.csv")
    assert set(RECORD_FIELDS) <= set(rows[0])
    measured = {(r["model"], r["impl"], r["weight_type"], r["part"]) for r in rows}
    for model, parts in PARTS.items():
        for part in parts:
            assert (model, "torch", "f32", part) in measured
            assert {(model, "ggml", t, part) for t in weight_types} <= measured


@pytest.mark.slow
def test_run_tiny(cache: Path, tmp_path: Path) -> None:
    """``run.py --size tiny``: both families' reference and ggml parts and the memory check;
    the ratio table printed at the end holds a ggml / torch ratio for every part and weight
    type, measured against the reference in the same run."""
    types = ("f32", "q8_0")
    out = tmp_path / "out"
    stdout = bench("run.py", "--size", "tiny", *SHORT, "--types", ",".join(types), "--rows",
                   "16", "--cache", cache, "--out", out)
    check_run_results(out, types)
    printed = stdout.splitlines()
    table = markdown_rows(printed, "| model | part | threads | torch ms")
    assert {(row["model"], row["part"]) for row in table} == {
        (model, part) for model, parts in PARTS.items() for part in parts}
    for row in table:
        for weight_type in types:
            assert float(row[f"{weight_type} ratio"]) > 0, row
    assert len([line for line in printed if line.startswith("- ")]) == 4  # acceptance lines
    text = (out / "bench.md").read_text()
    for section in ("## Times and ratios", "## Kernels", "## Acceptance", "## Processes",
                    "## Memory"):
        assert section in text
    kernels = markdown_rows(text.splitlines(), "| model | part | f32")
    assert {(row["model"], row["part"]) for row in kernels} == {
        (model, part) for model, parts in PARTS.items() for part in parts}


@pytest.mark.parametrize("part, weight_type, features, expected", [
    # ggml 0.15.3: llamafile's sgemm takes 2+ rows (sgemm.cpp: "if (n < 2) return false")
    ("prefill", "f32", {"avx512", "llamafile"}, "tinyBLAS f32, AVX-512 FMA"),
    ("encoder", "f32", {"avx2", "llamafile"}, "tinyBLAS f32, AVX2 FMA"),
    ("step", "f32", {"avx512", "llamafile"}, "vec_dot_f32, AVX-512"),
    ("prefill", "f32", {"avx512"}, "vec_dot_f32, AVX-512"),  # built without llamafile
    # tinyBLAS<32, __m512, __m512bh> only with __AVX512BF16__
    ("prefill", "bf16", {"avx512", "avx512_bf16", "llamafile"},
     "tinyBLAS bf16, AVX512-BF16 vdpbf16ps"),
    ("prefill", "bf16", {"avx2", "llamafile"}, "tinyBLAS bf16, AVX2 (widened to f32)"),
    # tinyBLAS_Q0_AVX: _mm256_dpbusd_epi32 with AVX512-VNNI or AVX-VNNI, else maddubs
    ("encoder", "q8_0", {"avx512", "avx512_vnni", "llamafile"},
     "tinyBLAS_Q0_AVX q8_0 x q8_0, 256-bit VNNI dpbusd, f32 scale per block"),
    ("decoder", "q8_0", {"avx2"}, "vec_dot_q8_0_q8_0, 256-bit maddubs"),
    # setup/patches/ggml-python-cpu-gemm.patch: tinyBLAS_Q8_0_R8 from 8 rows on; one row stays
    # vec_dot (sgemm is not called)
    ("prefill", "q8_0", {"avx2", "llamafile", "q8_0_r8"},
     "tinyBLAS_Q8_0_R8 q8_0 x q8_0 (patched), 8 rows packed, 256-bit maddubs, "
     "f32 scale per block of 8 rows"),
    ("step", "q8_0", {"avx2", "llamafile", "q8_0_r8"}, "vec_dot_q8_0_q8_0, 256-bit maddubs"),
    # and tinyBLAS_F32_R16 for f32 where it compiles (AVX2 and FMA, no AVX-512)
    ("encoder", "f32", {"avx2", "fma", "llamafile", "f32_r16"},
     "tinyBLAS_F32_R16 f32 (patched), 16 rows packed, 6x16 AVX2 FMA tile"),
    ("step", "f32", {"avx2", "fma", "llamafile", "f32_r16"}, "vec_dot_f32, AVX2"),
])
def test_kernel_follows_ggmls_dispatch(part, weight_type, features, expected) -> None:
    assert tables.kernel(part, weight_type, features) == expected


def test_builds_tiny(cache: Path, tmp_path: Path) -> None:
    """``builds.py`` on the venv's own build, one weight type, MOSS (its measurements are
    run.py's, tested above with both families): the comparison and parity tables of
    builds.md."""
    out = tmp_path / "out"
    bench("builds.py", "--variants", "venv", "--size", "tiny", "--types", "f32", "--models",
          "moss", *SHORT, "--cache", cache, "--out", out)
    results = json.loads((out / "builds.json").read_text())["results"]
    assert sorted(r["spec"]["kind"] for r in results) == ["moss_ggml", "moss_torch"]
    assert not [r for r in results if "error" in r]
    rows = records(out / "builds.csv")
    assert set(RECORD_FIELDS) <= set(rows[0])
    assert {r["build"] for r in rows if r["impl"] == "ggml"} == {"venv"}
    lines = (out / "builds.md").read_text().splitlines()
    times = markdown_rows(lines, "| model | part | weights | torch ms")
    assert len(times) == 2 and all(re.fullmatch(r"[\d.]+ \([\d.]+x\)", row["venv"])
                                   for row in times), times
    parity = markdown_rows(lines, "| variant | flags found")
    assert [row["weights"] for row in parity] == ["moss_ggml f32"]


@pytest.mark.parametrize(("family", "impl", "args", "op"), [
    ("parakeet", "ggml", ("--weight-type", "f32"), "MUL_MAT f32"),
    ("parakeet", "torch", (), "aten::"),
    ("moss", "ggml", ("--weight-type", "q8_0", "--part", "step"), "MUL_MAT q8_0"),
    ("moss", "torch", ("--part", "prefill"), "aten::"),
])
def test_profile_ops_tiny(cache: Path, tmp_path: Path, family: str, impl: str,
                          args: tuple[str, ...], op: str) -> None:
    """``profile_ops.py`` on each family and side: the summary line, and the per-op JSON whose
    shares add up to one (a ggml matmul keyed by its weight's storage type); for ggml the host
    split, over as many graphs as the call computes."""
    model = cache / (PARAKEET_TINY if family == "parakeet" else MOSS_TINY)
    stdout = bench("profile_ops.py", family, impl, "--model", model, *args, "--threads", "1",
                   "--seconds", "2", "--rows", "16", "--json", tmp_path / "ops.json")
    summary = rf"^{family} {impl} .*, 1 threads: [\d.]+ ms unprofiled, [\d.]+ ms in ops"
    assert re.search(summary, stdout, re.M), stdout[-2000:]
    profile = json.loads((tmp_path / "ops.json").read_text())
    assert profile["plain_ms"] > 0 and profile["ops"]
    assert math.isclose(sum(row["share"] for row in profile["ops"]), 1.0, rel_tol=1e-6)
    assert any(row["op"].startswith(op) for row in profile["ops"]), profile["ops"][:5]
    split = profile["split"]
    if impl == "torch":
        assert split is None
        return
    # the graphs the call computes, counted apart: the encoder's subsampling and each layer's,
    # or the one cached step's
    graphs = (family_of("parakeet_tdt").config(model).encoder.n_layers + 1
              if family == "parakeet" else 1)
    assert re.search(rf"^host split of [\d.]+ ms, {graphs} graphs: alloc ", stdout, re.M)
    assert split["graphs"] == graphs and split["compute"] > 0 and split["host"] > 0
    assert min(split[part] for part in ("alloc", "upload", "download")) >= 0


def test_pre_encode_memory_tiny(tmp_path: Path) -> None:
    """``pre_encode_memory.py --tiny``: its figures, and the output it saves, of the length the
    subsampling gives (``calc_length``: 1200 mel frames -> 150)."""
    line = bench("pre_encode_memory.py", "--tiny", "--minutes", "0.2", "--threads", "1",
                 "--save", tmp_path / "out.npy").strip().splitlines()[-1]
    figures = json.loads(line)
    assert (figures["mel_frames"], figures["frames"]) == (1200, 150)
    assert figures["seconds"] > 0 and figures["peak_rss_mb"] >= figures["rss_before_mb"] > 0
    assert np.load(tmp_path / "out.npy").shape == (150, 32)


def test_long_audio_tiny(cache: Path, tmp_path: Path) -> None:
    """``long_audio.py --tiny``: the reference and ggml dumps of a short clip, timed, and every
    stage judged under the default f32 gates (the last layer's isolated form included), the
    decodes equal; the port with layer 1 rounded to f16 fails there, and layer 0 passes. Run
    again with ``--reuse-reference``, the reference dump and its figures are kept, the port's
    redone."""
    out = tmp_path / "out"
    bench("long_audio.py", "--tiny", "--minutes", "0.05", "--threads", "1", "--cache", cache,
          "--out", out, "--plant-f16", "1")
    entry = json.loads((out / "long_audio.json").read_text())["0.05min"]
    for side in ("reference", "ggml", "planted"):
        assert entry[side]["exit"] == 0 and entry[side]["message"] == ""
        assert entry[side]["wall_s"] > 0 and entry[side]["peak_rss_mb"] > 0
    stages = entry["stages"]
    assert {"mel_features", "pos_emb", "layer_0", "layer_1_isolated", "enc_out"} <= set(stages)
    assert stages["layer_1_isolated"]["nmse"] < 1e-9
    assert stages["failing"] == {} and stages["decode_equal"] is True
    assert entry["frames"] == stages["enc_out"]["shape"][0] > 0
    planted = entry["planted_stages"]["failing"]
    assert "layer_1_isolated" in planted and "layer_0_isolated" not in planted
    assert entry["planted_stages"]["layer_0_isolated"]["status"] == "pass"

    manifest = cache / "long_audio_tiny" / "0.05min-reference" / "manifest.json"
    written = manifest.stat().st_mtime_ns
    bench("long_audio.py", "--tiny", "--minutes", "0.05", "--threads", "1", "--cache", cache,
          "--out", out, "--reuse-reference")
    again = json.loads((out / "long_audio.json").read_text())["0.05min"]
    assert manifest.stat().st_mtime_ns == written
    assert again["reference"] == entry["reference"]
    assert again["ggml"]["exit"] == 0 and again["stages"]["failing"] == {}
    assert "planted" not in again


def test_length_noise_tiny(tmp_path: Path) -> None:
    """``length_noise.py --tiny``: the mel features and the position table at two lengths, the
    port against NeMo and each against float64 (whose position error grows with the length:
    every row's angle rounds in float32)."""
    out = tmp_path / "out"
    stdout = bench("length_noise.py", "--tiny", "--seconds", "1,4", "--out", out)
    rows = json.loads((out / "length_noise.json").read_text())["lengths"]
    assert [(r["seconds"], r["frames"]) for r in rows] == [(1.0, 100), (4.0, 400)]
    for row in rows:
        for stage in ("mel_features", "pos_emb"):
            assert 0 < row[stage]["port_vs_nemo"]["nmse"] < 1e-9, (stage, row)
    short, longer = (r["pos_emb"]["nemo_vs_f64"]["nmse"] for r in rows)
    assert longer > 4 * short
    assert "growth exponent" in stdout


def test_precision_tiny(cache: Path, tmp_path: Path) -> None:
    """``precision.py --tiny``: a recipe search on the tiny Parakeet timed against one float32
    reference pass, its trials, its bits per weight (the recipe between uniform and all-wide)
    and the port's verdict."""
    out = tmp_path / "out"
    stdout = bench("precision.py", "--tiny", "--types", "q4_0", "--threads", "1", "--targets",
                   '[{"stage": "enc_out", "nmse_max": 0.05}]', "--cache", cache, "--out", out)
    assert re.search(r"^q4_0: [\d.]+ s \([\d.]+x one float32 reference pass", stdout, re.M)
    result = json.loads((out / "precision.json").read_text())
    entry = result["types"]["q4_0"]
    assert result["reference_seconds"] > 0 and entry["seconds"] > 0 and entry["trials"] >= 1
    bits = entry["bits_per_weight"]
    assert bits["uniform"] <= bits["recipe"] <= bits["wide"]
    assert entry["verified"] is True


@pytest.mark.slow
def test_sweep_tiny(cache: Path, tmp_path: Path) -> None:
    """``sweep.py --tiny``: the workflow on one clip and one prompt, then grown by one clip: the
    wall, compute and memory figures of sweep.json, and what the grown run re-ran."""
    out = tmp_path / "out"
    stdout = bench("sweep.py", "--tiny", "--cores", "2", "--cache", cache, "--work",
                   tmp_path / "work", "--out", out)
    runs = json.loads((out / "sweep.json").read_text())["runs"]
    assert [(r["family"], r["cases"]) for r in runs] == [("parakeet_tdt", 1),
                                                          ("moss_voicegen", 1)]
    for run in runs:
        assert run["wall_s"] > 0 and run["compute_total_s"] > 0 and run["peak_job_rss_mb"] > 0
        assert {f"{run['family']}/reference", f"{run['family']}/ggml"} <= set(run["compute_s"])
        verdict = run["verdict"][run["family"]]
        assert verdict["cells"] >= 1 and 0 < verdict["floor_s"] < verdict["cost_s"]
    assert runs[0]["wall_per_case_vs_first"] == 1.0
    added = runs[0]["add_a_case"]
    assert {"reference_dump", "ggml_dump"} <= set(added["jobs"]), added
    assert added["reference"] == ["1 of 2 case(s) restored"], added
    assert "| parakeet_tdt | 1 | 1 |" in stdout and "one case added" in stdout


def test_report_scale_tiny(tmp_path: Path) -> None:
    """``report_scale.py --tiny``: the summary and the page of 100 synthetic cells, each
    command's wall time, peak memory and output size, and the table BENCHMARKS.md shows."""
    from tests.report.sweep import scaled_cells

    out = tmp_path / "out"
    stdout = bench("report_scale.py", "--tiny", "--work", tmp_path / "work", "--out", out)
    (sweep,) = json.loads((out / "report_scale.json").read_text())["sweeps"]
    assert (sweep["cells"], sweep["cases"]) == (100, 2)
    assert sweep["rows"] == sum(map(len, scaled_cells(100)))
    for step in ("summary", "html"):
        assert sweep[step]["seconds"] > 0 and sweep[step]["peak_rss_mib"] > 0, sweep
        assert sweep[step]["mib"] > 0, sweep
    assert "All rows (" in (tmp_path / "work" / "100" / "index.html").read_text()
    assert f"| 100 | 2 | {sweep['rows']:,} | " in stdout


@pytest.mark.slow
def test_ports_storage_tiny(tmp_path: Path) -> None:
    """``ports_storage.py --tiny``: llama.cpp's q8_0 cell of the MOSS fixture judged before
    (against our storage policy's reference) and after (its storage-matched reference), with its
    storage and quantizer rows."""
    if not (REPO / ".ports/llama_cpp").is_dir():
        if os.environ.get("AUDIOPARITY_REQUIRE_PORTS"):
            pytest.fail("no built llama.cpp: make ports")
        pytest.skip("no built llama.cpp: make ports")
    out = tmp_path / "out"
    stdout = bench("ports_storage.py", "--tiny", "--work", tmp_path / "work", "--out", out,
                   timeout=1200)
    ((cell, entry),) = json.loads((out / "ports_storage.json").read_text()).items()
    assert cell == "moss_voicegen/tiny/llama.cpp/cpu/q8_0/en-instruction"
    assert entry["before"] == [] and entry["after"] == []
    assert entry["storage"].startswith("pass: asked q8_0: 16 of 24 matmul weights as asked")
    assert entry["stored_weights"].startswith("pass: ")
    assert float(entry["bits_per_weight"]) > 8.5
    assert f"{cell}: before 0 failing (-); after 0 (-)" in stdout


def test_gpu_script_calls() -> None:
    """benchmarks/gpu/run.sh (it needs an NVIDIA GPU) parses, and what it calls exists: its
    make targets, its config, ``audioparity doctor --backend``, and run.py's flags, which
    run.py's own parser accepts with the script's values."""
    script = BENCHMARKS / "gpu" / "run.sh"
    subprocess.run(["bash", "-n", str(script)], check=True)
    text = script.read_text().replace("\\\n", " ")
    makefile = (REPO / "Makefile").read_text()
    for target in re.findall(r"^make ([\w-]+)", text, re.M):
        assert re.search(rf"^{target}:", makefile, re.M), target
    for config in re.findall(r"--configfile (\S+?)\"", text):
        assert (REPO / config).is_file(), config
    doctor = subprocess.run([str(Path(sys.executable).with_name("audioparity")), "doctor",
                             "--help"], capture_output=True, text=True, check=True).stdout
    assert "--backend" in doctor
    calls = [line.split("benchmarks/run.py", 1)[1] for line in text.splitlines()
             if "benchmarks/run.py" in line]
    assert calls
    values = {"$backend": "cuda", "$cores": "16", "$out": "/nonexistent"}
    for call in calls:
        argv = [re.sub(r"\$\w+", lambda m: values[m[0]], word) for word in shlex.split(call)]
        check = ("import sys; sys.path.insert(0, 'benchmarks'); import run; "
                 "args = run.parse_args(sys.argv[1:]); run.make_plan(args)")
        subprocess.run([sys.executable, "-c", check, *argv], cwd=REPO, check=True)


def test_verdict_floor_on_a_planted_run(tmp_path: Path) -> None:
    """``verdict_floor.py`` on the records of a run planted with known seconds: a cell's cost
    is its share of the reference job, its dump job and its compare job; its floor is its
    graphs' compute; the isolated form counts to the isolated pass, load to neither."""
    results = tmp_path / "work" / "results"
    cell = "parakeet_tdt/m/audioparity/cpu/f32/clip"

    def dump(folder: Path, manifest: dict) -> None:
        folder.mkdir(parents=True)
        (folder / "manifest.json").write_text(json.dumps(manifest))

    def job(rule: str, name: str, seconds: float) -> None:
        tsv = results / "benchmarks" / rule / f"{name}.tsv"
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:0{int(seconds)}\t100\n")

    dump(results / "ggml" / cell, {
        "seconds": {"load": 1.0, "pre_encode": 0.5, "layer_0": 0.25, "layer_0_isolated": 0.125},
        "graph_seconds": {"pre_encode": 0.4, "layer_0": 0.2, "layer_0_isolated": 0.1},
        "inputs": {"reference": {"path": "results/reference/parakeet_tdt/m/clip"}}})
    dump(results / "reference/parakeet_tdt/m/clip", {"seconds": {"load": 5.0, "pre_encode": 0.3}})
    dump(results / "reference/parakeet_tdt/m/clip@q8_0", {"seconds": {"pre_encode": 0.3}})
    job("ggml_dump", cell, 3.0)
    job("compare_cell", cell, 1.0)
    job("reference_dump", "parakeet_tdt/m", 8.0)
    out = tmp_path / "out"
    stdout = bench("verdict_floor.py", "--results", results, "--label", "planted", "--out", out)
    run = json.loads((out / "verdict_floor.json").read_text())["planted"]
    (row,) = run["cells"]
    assert (row["reference_s"], row["candidate_job_s"], row["compare_s"]) == (4.0, 3.0, 1.0)
    assert (row["candidate_pass_s"], row["isolated_pass_s"]) == (0.75, 0.125)
    assert row["reference_forward_s"] == 0.3 and row["cost_s"] == 8.0
    assert row["floor_s"] == 0.7 and row["cost_over_floor"] == 11.4
    assert "| planted | parakeet_tdt | 1 | 8.0 |" in stdout
