"""The caches every checkout of a machine shares (audioparity.dumping.shared_cache): two runs
building one entry at once, as two processes (a ``make ports`` in one clone while another clone's
``make test`` builds the same port), build it once, the second saying what it waits for, and both
end with a good entry; a build killed midway leaves nothing that looks built. For a port (a stand-in
whose build waits for the test's word) and for the ggml-python wheel (setup/ggml-python.sh, its pip
a stand-in)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from audioparity.candidates import ports
from audioparity.dumping.shared_cache import cached_tree, fixture_entry, lock_path
from tests import REPO
from tests.candidates.test_adapters import TOY, snapshot

#: The stand-in port's build: it counts itself, says it started, then waits for ``../go``
#: (the cache folder is the tree's parent) before leaving its product.
SLOW_BUILD = """echo built >> ../builds
touch ../started
i=0
while [ ! -e ../go ]; do sleep 0.05; i=$((i + 1)); [ $i -lt 1200 ] || exit 9; done
mkdir -p bin
touch bin/toy
"""

#: One run of ``build_ports`` on the stand-in port: ``python -c RUN_TOY <source> <cache>``.
RUN_TOY = """import logging, sys
from pathlib import Path
from audioparity.candidates import ports
from tests.candidates.test_adapters import TOY
logging.basicConfig(level=logging.INFO, format="%(message)s")
ports.build_ports(Path(sys.argv[1]), Path(sys.argv[2]), adapters=[TOY])
"""

#: A stand-in interpreter for setup/ggml-python.sh: ``-m pip download`` leaves an empty source
#: package, ``-m pip wheel`` counts itself, says it started and waits for ``$STANDIN/go`` before
#: leaving a wheel, ``-m pip install`` writes down the wheel it is given; any other command
#: (the binding checks) does nothing.
STANDIN_PYTHON = """#!/usr/bin/env bash
set -eu
[ "${1:-}" = -m ] || exit 0  # setup/bindings.py's checks: a stand-in package binds nothing
shift 2
case $1 in
download)
    package=${@: -3:1}; package=${package#ggml-python==}; dest=${@: -1}
    mkdir -p "$dest/ggml_python-$package"
    tar czf "$dest/ggml_python-$package.tar.gz" -C "$dest" "ggml_python-$package" ;;
wheel)
    echo built >> "$STANDIN/builds"
    touch "$STANDIN/started"
    i=0
    while [ ! -e "$STANDIN/go" ]; do sleep 0.05; i=$((i + 1)); [ $i -lt 1200 ] || exit 9; done
    mkdir -p "${@: -2:1}"
    echo wheel > "${@: -2:1}/ggml_python-0-py3-none-any.whl" ;;
install)
    echo "${@: -1}" >> "$STANDIN/installs" ;;
esac
"""


def start(argv: list[str], stderr: Path, **env: str) -> subprocess.Popen:
    """``argv`` run from the checkout in a session of its own, its stderr into ``stderr``."""
    with open(stderr, "w") as handle:
        return subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=handle,
                                start_new_session=True,
                                env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'src'}", **env})


def wait_for(condition: Callable[[], bool], what: str, *running: subprocess.Popen) -> None:
    """Poll ``condition`` for up to 60 s; fail saying ``what`` when it does not come, or when
    one of ``running`` ends first."""
    deadline = time.monotonic() + 60
    while not condition():
        ended = [p.args for p in running if p.poll() is not None]
        if ended or time.monotonic() > deadline:
            pytest.fail(f"no {what}" + (f": {ended[0]} ended first" if ended else " in 60 s"))
        time.sleep(0.05)


def two_runs_at_once(argv: list[str], tmp_path: Path, started: Path, go: Path,
                     **env: str) -> tuple[str, str]:
    """Run ``argv`` twice: the second once the first's build has ``started``, then ``go`` once
    the second says it waits. Both must exit 0; returns their stderr."""
    first = start(argv, tmp_path / "first.err", **env)
    wait_for(started.exists, "start of the first build", first)
    second = start(argv, tmp_path / "second.err", **env)
    wait_for(lambda: "waiting for another build" in (tmp_path / "second.err").read_text(),
             "word from the second run that it waits", first, second)
    go.touch()
    codes = first.wait(60), second.wait(60)
    errors = (tmp_path / "first.err").read_text(), (tmp_path / "second.err").read_text()
    assert codes == (0, 0), errors
    return errors


def kill_once_started(argv: list[str], tmp_path: Path, started: Path, **env: str) -> None:
    """Run ``argv`` and kill it, with what it started, once its build has ``started``."""
    run = start(argv, tmp_path / "killed.err", **env)
    wait_for(started.exists, "start of the build", run)
    os.killpg(run.pid, signal.SIGKILL)
    run.wait(60)


@pytest.fixture
def toy_source(tmp_path: Path) -> Path:
    """The stand-in port's snapshot folder (its build: :data:`SLOW_BUILD`)."""
    (tmp_path / "src").mkdir()
    snapshot(tmp_path / "src", SLOW_BUILD)
    return tmp_path / "src"


def test_two_runs_building_one_port_at_once_build_it_once_and_both_end_with_it(
        tmp_path, toy_source):
    cache = tmp_path / "cache"
    first, second = two_runs_at_once([sys.executable, "-c", RUN_TOY, str(toy_source),
                                      str(cache)], tmp_path, cache / "started", cache / "go")
    tree = (cache / "toy").resolve()
    assert tree.parent == cache and (tree / "bin/toy").is_file() and (tree / ".built").is_file()
    assert (cache / "builds").read_text() == "built\n"
    waiting = f"waiting for another build of {tree.name} (lock {lock_path(tree)})"
    assert (second.count(waiting), first.count("waiting")) == (1, 0), second
    assert f"ports: toy ready in {tree}" in second


def test_a_port_build_killed_midway_leaves_no_tree_that_looks_built(tmp_path, toy_source):
    cache = tmp_path / "cache"
    kill_once_started([sys.executable, "-c", RUN_TOY, str(toy_source), str(cache)], tmp_path,
                      cache / "started")
    (tree,) = cache.glob("toy-1.0-*")
    assert not (tree / ".built").exists() and not os.path.lexists(cache / "toy")
    (cache / "go").touch()
    built = ports.build_ports(toy_source, cache, adapters=[TOY])  # the lock died with it
    assert (built["toy"] / "bin/toy").is_file() and built["toy"].resolve() == tree
    assert (cache / "builds").read_text() == "built\nbuilt\n"


@pytest.fixture
def wheel_setup(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """setup/ggml-python.sh's command line with :data:`STANDIN_PYTHON`, and its environment:
    ``AUDIOPARITY_WHEELS`` a new folder, ``STANDIN`` the stand-in's folder."""
    standin = tmp_path / "standin"
    standin.mkdir()
    (standin / "python").write_text(STANDIN_PYTHON)
    (standin / "python").chmod(0o755)
    env = {"AUDIOPARITY_WHEELS": str(tmp_path / "wheels"), "STANDIN": str(standin)}
    return ["bash", "setup/ggml-python.sh", str(standin / "python"), "-DGGML_TEST=ON"], env


def test_two_setups_building_one_wheel_at_once_build_it_once_and_both_install_it(
        tmp_path, wheel_setup):
    argv, env = wheel_setup
    standin = Path(env["STANDIN"])
    first, second = two_runs_at_once(argv, tmp_path, standin / "started", standin / "go", **env)
    (wheel,) = (tmp_path / "wheels").glob("ggml-python-*/*.whl")
    assert (standin / "builds").read_text() == "built\n"
    assert (standin / "installs").read_text() == f"{wheel}\n" * 2
    entry = wheel.parent.name
    waiting = f"waiting for another build of {entry} (lock {tmp_path}/wheels/.{entry}.lock)"
    assert (second.count(waiting), first.count("waiting")) == (1, 0), second
    # the wheel, its lock, and the source package kept for the next build (offline too)
    assert {p.name for p in (tmp_path / "wheels").iterdir()} == {entry, f".{entry}.lock",
                                                                  "sources"}
    assert [p.name for p in (tmp_path / "wheels" / "sources").iterdir()] == [
        "ggml_python-0.0.45.tar.gz"]


def test_a_wheel_build_killed_midway_leaves_no_wheel(tmp_path, wheel_setup):
    argv, env = wheel_setup
    standin = Path(env["STANDIN"])
    kill_once_started(argv, tmp_path, standin / "started", **env)
    assert not list((tmp_path / "wheels").glob("ggml-python-*"))
    (standin / "go").touch()
    done = subprocess.run(argv, cwd=REPO, env={**os.environ, **env}, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr
    assert (standin / "builds").read_text() == "built\nbuilt\n"
    assert len(list((tmp_path / "wheels").glob("ggml-python-*/*.whl"))) == 1


def test_a_fixture_is_built_once_stored_and_then_copied(tmp_path):
    built = []

    def build(output: Path) -> None:
        built.append(output)
        output.mkdir()
        (output / "model.nemo").write_bytes(b"weights")

    entry = tmp_path / "cache" / "parakeet_tdt-0123"
    assert cached_tree(entry, tmp_path / "a", build) is False
    assert cached_tree(entry, tmp_path / "b", build) is True
    assert built == [tmp_path / "a"]
    assert (tmp_path / "b" / "model.nemo").read_bytes() == b"weights"
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["model.nemo"]  # no marker


def test_a_fixture_build_that_fails_stores_nothing(tmp_path):
    def build(output: Path) -> None:
        output.mkdir()
        (output / "half").write_bytes(b"")
        raise RuntimeError("killed")

    entry = tmp_path / "cache" / "parakeet_tdt-0123"
    with pytest.raises(RuntimeError):
        cached_tree(entry, tmp_path / "a", build)
    assert not entry.exists()


def test_a_fixture_entry_changes_with_its_code_seed_and_options(tmp_path, monkeypatch):
    monkeypatch.setenv("AUDIOPARITY_FIXTURES", str(tmp_path / "cache"))
    code = tmp_path / "fixture.sha256"
    code.write_text("aaaa\n1111  src/audioparity/models/parakeet_tdt/fixture.py\n")
    entry = fixture_entry("parakeet_tdt", 0, {"vocab_size": 64}, code)
    assert entry.parent == tmp_path / "cache" and entry.name.startswith("parakeet_tdt-")
    assert fixture_entry("parakeet_tdt", 0, {"vocab_size": 64}, code) == entry
    assert fixture_entry("parakeet_tdt", 1, {"vocab_size": 64}, code) != entry
    assert fixture_entry("parakeet_tdt", 0, {"vocab_size": 128}, code) != entry
    code.write_text("bbbb\n")
    assert fixture_entry("parakeet_tdt", 0, {"vocab_size": 64}, code) != entry
