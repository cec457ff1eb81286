"""A copy of the workflow in a temporary directory, run with `python -m snakemake` as `make run`
would (Snakemake's Python API changes the working directory and ignores profiles).

The copy's src/ is what the rules list as code inputs and what the jobs run (PYTHONPATH), so an
edit there reruns the jobs that run the edited code, and they run it."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from audioparity.dumping.environments import CACHE_VARIABLE
from audioparity.dumping.environments import cache as environments_cache
from audioparity.dumping.shared_cache import FIXTURES, fixtures_cache
from tests import REPO


def make_workdir(root: Path, config: dict, fresh_check: bool = False) -> Path:
    """Copy the Snakefile, rules, config, envs, docs and src into `root`; write sweep.yaml.

    Editing src/ in the copy changes the code inputs of the rules, never this checkout; the jobs
    themselves run the installed package. Without `fresh_check`, each family of the sweep runs
    without the fresh-against-reused check (`reuse: false`, one job per model, candidate,
    backend and weight type): the sweeps that test it ask for it (tests/workflow/
    test_workflow.py, test_planted.py, the Vulkan sweep of test_backends.py).
    """
    if not fresh_check:
        families = config.get("families") or yaml.safe_load(
            (REPO / "config/config.yaml").read_text())["families"]
        config = {**config, **{name: {**config.get(name, {}), "reuse": False}
                               for name in families}}
    root.mkdir()
    for item in ("Snakefile", "rules", "config", "envs", "src", "docs"):
        copy = shutil.copytree if (REPO / item).is_dir() else shutil.copy
        copy(REPO / item, root / item, **({"ignore": shutil.ignore_patterns("__pycache__")}
                                          if (REPO / item).is_dir() else {}))
    (root / "sweep.yaml").write_text(yaml.safe_dump(config))
    return root


#: The tiny random fixture's greedy decode at bf16 and q8_0: float32 noise flips rounding
#: decisions that compound layer after layer, and the decode of random weights re-routes after
#: a near-tie (token_match 0.53 at bf16, 0.22 at q8_0 on the clip; decoder_replay exact), on
#: some CPUs only (q8_0: 1.0 on an AMD EPYC of family 26), so a pass is no stale declaration.
#: Its decode teacher-forced on its own enc_out (decode_logits) flips steps at margins beyond
#: the trained model's near ties (bf16: 2.0e-2 on the clip). The default sweep's model is
#: trained (config/config.yaml); the tests' sweeps of the fixture carry this (q8_0's also for
#: a recipe on q8_0, ``q8_0+<name>``).
TINY_NEAR_TIES = [{"stage": stage, "model": "tiny", "weight_type": weight_type,
                   "candidate": candidate, "strict": False,
                   "reason": "tiny random fixture: end to end, float32 noise flips near ties "
                   "(greedy decoding re-routes after one); decoder_replay is exact"}
                  for weight_type, candidate in (("bf16", "audioparity*"), ("q8_0*", "*"))
                  for stage in ("decode", "decode_logits")]


#: NeMo alone: the default config's other Parakeet references (transformers, NeMo 2.4.1) run in
#: the tests of the references (tests/workflow/test_references.py); transformers' Parakeet
#: cannot load the tiny fixture (its joint is wider than its prediction network).
PRIMARY_ONLY = [{"name": "nemo", "implementation": "nemo"}]


def parakeet_config(**section) -> dict:
    """A Parakeet-only sweep of the tiny fixture on the shipped clip, with its declared near-tie
    decodes (:data:`TINY_NEAR_TIES`), against NeMo alone; `section` overrides keys."""
    return {
        "families": ["parakeet_tdt"],
        "parakeet_tdt": {
            "models": [{"name": "tiny", "path": "results/fixtures/parakeet_tdt/tiny/model.nemo"}],
            "cases": [{"name": "clip", "path": str(REPO / "resources/speech/clip.wav")}],
            "extra_expected_failures": TINY_NEAR_TIES,
            "references": PRIMARY_ONLY,
            **section,
        },
    }


def snakemake_command(workdir: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "snakemake", "--directory", str(workdir), "--snakefile",
            str(workdir / "Snakefile"), "--configfile", str(workdir / "sweep.yaml"), *args]


#: Passed through when set: the code paths MKL, ATen and llvmpipe take, so that an Intel machine
#: with AVX-512 can run the tests with the float32 arithmetic of an AMD CPU without it
#: (``MKL_CBWR=COMPATIBLE``: MKL's generic code, which it runs on AMD CPUs;
#: ``ATEN_CPU_CAPABILITY=avx2``; ``LP_NATIVE_VECTOR_WIDTH=256``: lavapipe's 256-bit vectors).
ARITHMETIC = ("MKL_CBWR", "ATEN_CPU_CAPABILITY", "LP_NATIVE_VECTOR_WIDTH")


def environment(workdir: Path) -> dict[str, str]:
    """Nothing inherited but :data:`ARITHMETIC`, and no venv on PATH: the workflow must find the
    `audioparity` command beside the Python that runs Snakemake, as `.venv/bin/snakemake` run
    without activating the venv does. The copy's src/ comes first on the Python path; the
    reference environments and the built fixtures are this machine's (``make environments``;
    ``~/.cache/audioparity/fixtures``, keyed by the code that builds them, so an edited
    fixture builds anew), whatever HOME is: each sweep of the suite would otherwise build the
    same fixtures again, each Parakeet fixture paying NeMo's import."""
    return {"PATH": "/usr/bin:/bin", "HOME": str(workdir), "GGML_NO_BACKTRACE": "1",
            "PYTHONPATH": str(workdir / "src"), CACHE_VARIABLE: str(environments_cache()),
            FIXTURES: str(fixtures_cache()),
            **{name: os.environ[name] for name in ARITHMETIC if name in os.environ}}


def snakemake(workdir: Path, *args: str) -> subprocess.CompletedProcess:
    """Run Snakemake in `workdir`; raise with its output's tail when it fails."""
    result = subprocess.run(snakemake_command(workdir, *args), env=environment(workdir),
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n"
                             f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return result


def run_to_completion(workdir: Path) -> subprocess.CompletedProcess:
    """What `make run` does: unlock a lock left by a killed run, then finish the sweep."""
    snakemake(workdir, "--unlock")
    return snakemake(workdir, "--cores", "2", "--rerun-incomplete")


def ran_rules(result: subprocess.CompletedProcess) -> list[str]:
    """Names of the rules whose jobs a finished Snakemake run executed (from its log lines
    ``rule X:``, ``checkpoint X:``, ``localrule X:``), less the target rule ``all``."""
    found = re.findall(r"^(?:local)?(?:rule|checkpoint) (\w+):$", result.stdout + result.stderr,
                       flags=re.M)
    return sorted(set(found) - {"all"})


def planned_jobs(workdir: Path) -> dict[str, int]:
    """{rule: jobs} a dry run would run (Snakemake's job-stats table), less ``all``."""
    out = snakemake(workdir, "-n", "--quiet", "rules").stdout
    return {rule: int(count) for rule, count in re.findall(r"^(\w+)\s+(\d+)\s*$", out, flags=re.M)
            if rule not in ("total", "all")}


def planned_rules(workdir: Path) -> list[str]:
    """Names of the rules whose jobs a dry run would run."""
    return sorted(planned_jobs(workdir))


@contextmanager
def edited(path: Path, text: str = "\n# an edit\n") -> Iterator[None]:
    """`path` with `text` appended, restored afterwards."""
    original = path.read_text()
    path.write_text(original + text)
    try:
        yield
    finally:
        path.write_text(original)
