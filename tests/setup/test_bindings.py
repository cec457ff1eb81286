"""setup/bindings.py: ggml-python 0.0.45's CUDA binding that no source defines is found in its
source package, setup/patches/ggml-python-cuda.patch leaves none (the other patches applied
with it), the installed ggml exports every binding it enables, and a planted binding is
reported, by the command line too."""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO

SETUP = REPO / "setup"
spec = importlib.util.spec_from_file_location("bindings", SETUP / "bindings.py")
bindings = importlib.util.module_from_spec(spec)
sys.modules["bindings"] = bindings  # dataclasses look their module up
spec.loader.exec_module(bindings)

ALLREDUCE = "ggml_backend_cuda_allreduce_tensor"
PLANTED = '''

@ggml_function("ggml_planted_missing", [], None, enabled=GGML_USE_VULKAN)
def ggml_planted_missing() -> None:
    ...
'''


def ggml_python_version() -> str:
    """The version of ggml-python pyproject.toml pins (the one setup/ggml-python.sh builds)."""
    return re.search(r'"ggml-python==([^"]+)"', (REPO / "pyproject.toml").read_text())[1]


@pytest.fixture(scope="module")
def unpatched(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """ggml/ggml.py and vendor/ggml/{src,include} of ggml-python's source package, extracted:
    the package kept in the wheel cache (`make setup-vulkan` keeps it), fetched there the way
    setup/ggml-python.sh does when it is missing."""
    version = ggml_python_version()
    package = subprocess.run([str(SETUP / "ggml-python-source.sh"), sys.executable, version],
                             capture_output=True, text=True, check=True).stdout.strip()
    folder = tmp_path_factory.mktemp("source")
    top = f"ggml_python-{version}"
    subprocess.run(["tar", "xzf", package, "-C", str(folder), f"{top}/ggml/ggml.py",
                    f"{top}/vendor/ggml/src", f"{top}/vendor/ggml/include"], check=True)
    return folder / top


@pytest.fixture(scope="module")
def patched(unpatched: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same, with every patch of setup/patches/ applied: each build applies the CPU
    backend's (ggml-python-cpu-gemm.patch) and its backend's (`make setup-cuda`: the CUDA
    one), so they must apply together."""
    folder = tmp_path_factory.mktemp("patched") / unpatched.name
    shutil.copytree(unpatched, folder)
    for path in sorted((SETUP / "patches").glob("*.patch")):
        with open(path) as patch:
            subprocess.run(["patch", "--quiet", "-p1", "-d", str(folder)], stdin=patch,
                           check=True)
    return folder


def test_unpatched_source_lacks_the_cuda_allreduce(unpatched: Path) -> None:
    lines = bindings.check_source(unpatched, ["cpu", "cuda"])
    assert len(lines) == 1 and lines[0].startswith(f"{ALLREDUCE} (enabled=GGML_USE_CUDA)")
    assert bindings.check_source(unpatched, ["cpu", "vulkan"]) == []


@pytest.mark.parametrize("backend", ["cpu", "cuda", "vulkan"])
def test_patched_source_defines_every_binding(patched: Path, backend: str) -> None:
    assert bindings.check_source(patched, sorted({"cpu", backend})) == []


def test_installed_ggml_exports_every_binding() -> None:
    assert bindings.check_built(bindings.installed_package()) == []


def test_a_planted_binding_is_reported_by_the_installed_libraries(tmp_path: Path) -> None:
    installed = bindings.installed_package()
    package = tmp_path / "ggml"
    package.mkdir()
    (package / "lib").symlink_to(installed / "lib")
    (package / "ggml.py").write_text((installed / "ggml.py").read_text() + PLANTED)
    has_vulkan = any((installed / "lib").glob("libggml-vulkan.so*"))
    planted = ["ggml_planted_missing (enabled=GGML_USE_VULKAN)"] if has_vulkan else []
    assert [line.split(" is ")[0] for line in bindings.check_built(package)] == planted


def test_a_planted_binding_is_reported_for_its_backend_only(patched: Path,
                                                            tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "ggml").mkdir(parents=True)
    (source / "vendor").symlink_to(patched / "vendor")
    (source / "ggml" / "ggml.py").write_text((patched / "ggml" / "ggml.py").read_text() + PLANTED)
    assert bindings.check_source(source, ["cpu", "cuda"]) == []
    [line] = bindings.check_source(source, ["cpu", "vulkan"])
    assert line.startswith("ggml_planted_missing (enabled=GGML_USE_VULKAN) is bound")


def test_an_unknown_enabled_is_an_error(tmp_path: Path) -> None:
    ggml_py = tmp_path / "ggml.py"
    ggml_py.write_text('@ggml_function("f", [], None, enabled=os.environ)\ndef f(): ...\n')
    with pytest.raises(ValueError, match=r"ggml.py:1: f: enabled=os.environ is not"):
        bindings.parse_bindings(ggml_py)


def test_static_and_declared_functions_are_not_definitions(tmp_path: Path) -> None:
    source = tmp_path / "a.cpp"
    source.write_text("bool declared(int a);\nstatic bool hidden(void) { return 1; }\n"
                      "static bool\nhidden_too(int (*f)(int)) {}\n// bool commented(void) {}\n"
                      "GGML_API void\nexported(int * a, size_t n) try {\n}\n"
                      "#define MACRO(x) bool made(x) {}\n")
    assert bindings.defined_functions([source]) == {"exported"}


def test_the_backends_of_cmake_arguments(patched: Path) -> None:
    src = patched / "vendor" / "ggml" / "src"
    assert bindings.backends_from_cmake_args("", src) == ["cpu"]
    assert bindings.backends_from_cmake_args(
        "-DGGML_LLAMAFILE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90", src) == ["cpu", "cuda"]
    assert bindings.backends_from_cmake_args("-DGGML_VULKAN:BOOL=1 -DGGML_CPU=OFF", src) == [
        "vulkan"]


def run_check(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SETUP / "bindings.py"), *args],
                          capture_output=True, text=True)


def test_command_line(unpatched: Path, patched: Path) -> None:
    cmake_args = "-DGGML_LLAMAFILE=ON -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=native"
    failed = run_check("source", str(unpatched), "--cmake-args", cmake_args)
    assert failed.returncode == 1
    assert failed.stderr.startswith(f"bindings.py: {ALLREDUCE} ")
    assert len(failed.stderr.splitlines()) == 1
    passed = run_check("source", str(patched), "--cmake-args", cmake_args)
    assert (passed.returncode, passed.stderr) == (0, "")
    # one argument alone starts with '-': setup/ggml-python.sh passes it as --cmake-args=...
    alone = run_check("source", str(unpatched), "--cmake-args=-DGGML_CUDA=ON")
    assert alone.returncode == 1 and ALLREDUCE in alone.stderr
    assert run_check("built").returncode == 0
    bad = run_check("source", str(patched), "--backend", "nosuch")
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "no backend 'nosuch'" in bad.stderr


def source_script(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    """setup/ggml-python-source.sh run with the wheel cache in ``tmp_path`` and ``env``."""
    environment = {name: value for name, value in os.environ.items()
                   if name not in ("AUDIOPARITY_GGML_SOURCE", "PIP_NO_INDEX")}
    environment.update(AUDIOPARITY_WHEELS=str(tmp_path / "wheels"), **env)
    return subprocess.run([str(SETUP / "ggml-python-source.sh"), sys.executable, "0.0.45"],
                          capture_output=True, text=True, env=environment)


def test_source_package_offline(tmp_path: Path) -> None:
    """Offline (PIP_NO_INDEX), no package kept nor given is one line, never a download; a kept
    or given one is used as it is, and a given one that is not there is one line."""
    offline = source_script(tmp_path, PIP_NO_INDEX="1")
    assert offline.returncode == 1 and len(offline.stderr.splitlines()) == 1
    assert "AUDIOPARITY_GGML_SOURCE" in offline.stderr
    given = tmp_path / "ggml_python-0.0.45.tar.gz"
    given.touch()
    used = source_script(tmp_path, PIP_NO_INDEX="1", AUDIOPARITY_GGML_SOURCE=str(given))
    assert (used.returncode, used.stdout) == (0, f"{given}\n")
    kept = tmp_path / "wheels" / "sources" / "ggml_python-0.0.45.tar.gz"
    kept.parent.mkdir(parents=True)
    kept.touch()
    reused = source_script(tmp_path, PIP_NO_INDEX="1")
    assert (reused.returncode, reused.stdout) == (0, f"{kept}\n")
    absent = source_script(tmp_path, AUDIOPARITY_GGML_SOURCE=str(tmp_path / "none.tar.gz"))
    assert absent.returncode == 1 and len(absent.stderr.splitlines()) == 1
