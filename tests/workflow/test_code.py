"""Which source files each job runs (audioparity.workflow.imports, .code): the import walker on
a small package of its own, then on the real families, whose reference side must not run ggml."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from audioparity.candidates import load_adapter
from audioparity.contract.family import SIDE_METHODS
from audioparity.models.registry import registered
from audioparity.workflow import imports
from audioparity.workflow.code import CLI, Code
from audioparity.workflow.imports import Entry, Sources, entry_imports, parse
from tests import REPO

PACKAGE = {
    "__init__.py": "",
    "a.py": "import os\nfrom audioparity import b\n\n\ndef f():\n"
            "    from audioparity.c import x\n",
    "b.py": "",
    "c/__init__.py": "",
    "c/x.py": "from . import y\n",
    "c/y.py": "",
    "heavy.py": "", "light.py": "", "fromn.py": "", "typing_only.py": "",
    "shallow.py": (
        "from typing import TYPE_CHECKING\n\nfrom audioparity import b\n\n"
        "if TYPE_CHECKING:\n    from audioparity import typing_only\n\n\n"
        "def run():\n    from audioparity import heavy\n\n\n"
        "def side():\n    helper()\n\n\n"
        "def helper():\n    from audioparity import light\n\n\n"
        "class K:\n    def m(self):\n        return self.n()\n\n"
        "    def n(self):\n        from audioparity import fromn\n"),
}


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package `audioparity` of PACKAGE's files under tmp_path/src."""
    for name, text in PACKAGE.items():
        path = tmp_path / "src" / "audioparity" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "src"


def names(files: set[Path], root: Path) -> set[str]:
    return {str(path.relative_to(root / "audioparity")) for path in files}


def test_parse_tells_module_level_imports_from_lazy_ones_and_resolves_relative_ones():
    parsed = parse(PACKAGE["a.py"], "a.py", "audioparity")
    assert parsed.module_level == ["os", "audioparity", "audioparity.b"]
    assert {"audioparity.c", "audioparity.c.x"} <= set(parsed.anywhere)
    assert parse(PACKAGE["c/x.py"], "x.py", "audioparity.c").anywhere == [
        "audioparity.c", "audioparity.c.y"]
    shallow = parse(PACKAGE["shallow.py"], "shallow.py", "audioparity")
    assert "audioparity.typing_only" in shallow.module_level  # a guarded import counts
    assert shallow.functions["side"].calls == {"helper"}
    assert shallow.classes["K"]["m"].methods == {"n"}


def test_a_module_brings_its_imports_at_any_depth_and_each_package_init(package):
    found = names(Sources(package).files(["audioparity.a"]), package)
    assert found == {"__init__.py", "a.py", "b.py", "c/__init__.py", "c/x.py", "c/y.py"}


def test_a_shallow_module_brings_only_its_module_level_imports_and_the_functions_named(
        package):
    sources = Sources(package, shallow=lambda name: name == "audioparity.shallow")
    base = {"__init__.py", "shallow.py", "b.py", "typing_only.py"}
    assert names(sources.files(["audioparity.shallow"]), package) == base
    side = Entry("audioparity.shallow", ("side",))
    assert names(sources.files(entries=[side]), package) == base | {"light.py"}
    method = Entry("audioparity.shallow", ("m", "inherited"), owner="K")
    assert names(sources.files(entries=[method]), package) == base | {"fromn.py"}
    with pytest.raises(KeyError, match="no function nowhere"):
        entry_imports(sources.module("audioparity.shallow"),
                      Entry("audioparity.shallow", ("nowhere",)))


def test_the_parses_are_kept_by_content_and_only_a_changed_file_is_parsed_again(
        package, monkeypatch):
    cache = package.parent / "imports.json"
    first = Sources(package, cache=cache)
    expected = first.files(["audioparity.a"])
    first.save()
    parsed = []
    monkeypatch.setattr(imports, "parse", lambda *args: parsed.append(args[1]) or parse(*args))
    assert Sources(package, cache=cache).files(["audioparity.a"]) == expected
    assert parsed == []
    (package / "audioparity" / "b.py").write_text("from audioparity import heavy\n")
    assert "heavy.py" in names(Sources(package, cache=cache).files(["audioparity.a"]), package)
    assert sorted(parsed) == [str((package / "audioparity" / name).resolve())
                              for name in ("b.py", "heavy.py")]  # heavy.py: newly reached


# -- the real package ----------------------------------------------------------------------------

@pytest.fixture
def code(monkeypatch) -> Code:
    monkeypatch.chdir(REPO)
    return Code(REPO / "src")


@pytest.mark.parametrize("name", sorted(registered()))
def test_a_familys_reference_side_runs_no_ggml_and_its_ggml_side_does(code, name):
    family = registered()[name]
    package = f"src/audioparity/models/{name}/"
    sides = {side: code.side(family, side) for side in SIDE_METHODS}
    cli = {os.path.relpath(code.sources.module_file(module)) for module in CLI}
    for side, files in sides.items():
        assert cli <= set(files), side
        assert f"{package}__init__.py" in files, side
        assert ("src/audioparity/dumping/driver.py" in files) == (side != "fixture"), side
    assert not [f for f in sides["reference"] if f.startswith("src/audioparity/ggml/")]
    assert [f for f in sides["ggml"] if f.startswith("src/audioparity/ggml/")]
    assert [f for f in sides["weights"] if f.startswith("src/audioparity/ggml/")]
    # the port's sides run the ggml that make setup builds; the others never (a patch added to
    # it reruns no reference)
    built = {side for side, files in sides.items() if "setup/ggml-python.sh" in files}
    assert built == {"ggml", "weights"}
    assert all("setup/patches/ggml-python-cpu-gemm.patch" in sides[side] for side in built)
    own = {side: {f for f in files if f.startswith(package)} for side, files in sides.items()}
    assert own["ggml"] - own["reference"], "the port's modules"
    assert own["reference"] - own["ggml"], "the reference's modules"
    assert f"{package}fixture.py" in own["fixture"]
    assert f"{package}fixture.py" not in own["reference"] | own["ggml"]


@pytest.mark.parametrize("name", sorted(registered()))
def test_a_precision_search_runs_the_reference_side_and_no_port(code, name):
    """A port edit never reruns a recipe search, nor so the reference dumps that read it: the
    search's files are its own and the reference side's, none of the family's port."""
    family = registered()[name]
    search = set(code.precision(family))
    assert set(code.side(family, "reference")) <= search
    assert "src/audioparity/compare/precision.py" in search
    port = set(code.side(family, "ggml")) - set(code.side(family, "reference"))
    assert port and not port & search, sorted(port & search)


def test_our_ports_dump_runs_its_ggml_side_and_a_third_party_ports_does_not(code):
    family = registered()["parakeet_tdt"]
    ours = code.candidate_run(family, load_adapter("audioparity"), "audioparity")
    assert {"src/audioparity/dumping/guard.py", "src/audioparity/candidates/running.py",
            "src/audioparity/candidates/audioparity.py"} <= set(ours)
    assert set(code.side(family, "ggml")) <= set(ours)
    ours_again = code.reuse(family, load_adapter("audioparity"), "audioparity")
    build = {"setup/ggml-python.sh", "setup/patches/ggml-python-cpu-gemm.patch"}
    assert build <= set(ours) & set(ours_again) & set(code.drilldown(family))
    theirs = code.candidate_run(family, load_adapter("transcribe_cpp"), "transcribe_cpp")
    assert "src/audioparity/candidates/transcribe_cpp.py" in theirs
    assert "src/audioparity/candidates/audioparity.py" not in theirs
    assert not build & set(theirs)  # its own build is its port files' (rule input `port`)
    assert not build & set(code.reuse(family, load_adapter("transcribe_cpp"), "transcribe_cpp"))
    assert not [f for f in theirs if f.startswith(("src/audioparity/ggml/",
                                                   "src/audioparity/models/parakeet_tdt/"))
                and not f.endswith("__init__.py")]


def test_a_users_adapter_named_by_path_is_its_own_code_input(tmp_path, monkeypatch):
    code = Code(REPO / "src")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ports").mkdir()
    (tmp_path / "ports" / "my_port.py").write_text(
        "from audioparity.candidates.adapter import Adapter\n")
    files = code.candidate_convert(None, "ports/my_port.py")
    assert "ports/my_port.py" in files
    assert os.path.relpath(REPO / "src/audioparity/candidates/adapter.py") in files


def test_a_users_adapter_brings_the_helpers_of_its_own_folder_it_imports(tmp_path,
                                                                        monkeypatch):
    """An adapter importing a module beside it (its folder is on the path when it loads)
    depends on that module too, transitively; a module it does not import is no input."""
    code = Code(REPO / "src")
    monkeypatch.chdir(tmp_path)
    ports = tmp_path / "ports"
    (ports / "shared").mkdir(parents=True)
    (ports / "lite.py").write_text("import my_port\nfrom shared import tools\n")
    (ports / "my_port.py").write_text("def f():\n    import helper\n")
    (ports / "helper.py").write_text("import os\n")
    (ports / "shared" / "__init__.py").write_text("")
    (ports / "unused.py").write_text("")
    files = code.candidate_convert(None, "ports/lite.py")
    assert {"ports/lite.py", "ports/my_port.py", "ports/helper.py",
            "ports/shared/__init__.py"} <= set(files)
    assert "ports/unused.py" not in files


def test_a_code_input_holds_the_digest_of_its_files_and_changes_only_with_them(
        tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("a.py").write_text("a = 1\n")
    Path("b.py").write_text("b = 2\n")
    stamp = Code(tmp_path).stamp("fam/side", lambda: ["b.py", "a.py"])
    assert stamp == "results/code/fam/side.sha256"
    expected = hashlib.sha256(b"a.py\0a = 1\nb.py\0b = 2\n").hexdigest()
    lines = Path(stamp).read_text().splitlines()
    assert lines[0] == expected
    assert lines[1] == f"{hashlib.sha256(b'a = 1' + bytes([10])).hexdigest()}  a.py"
    os.utime(stamp, (1, 1))
    Path("a.py").touch()
    assert Code(tmp_path).stamp("fam/side", lambda: ["a.py", "b.py"]) == stamp
    assert os.stat(stamp).st_mtime == 1  # touched, not changed: not rewritten
    Path("a.py").write_text("a = 3\n")
    code = Code(tmp_path)
    code.stamp("fam/side", lambda: ["a.py", "b.py"])
    assert os.stat(stamp).st_mtime > 1
    assert code.digest_of(stamp) == Path(stamp).read_text().splitlines()[0] != expected


def test_a_build_the_project_changes_reruns_the_jobs_that_run_it(tmp_path, monkeypatch):
    """The port's jobs key on how ``make setup`` builds ggml (its script, which names the
    version, and its patches), never on the library's bytes: a patch added (a kernel) or
    edited, or the script edited, changes their digest; a file of setup/ that is no patch (a
    patch's leftover, another script) does not."""
    (tmp_path / "src").mkdir()
    patches = tmp_path / "setup" / "patches"
    patches.mkdir(parents=True)
    (tmp_path / "setup" / "ggml-python.sh").write_text("cmake\n")
    (patches / "ggml-python-cuda.patch").write_text("tf32\n")
    monkeypatch.chdir(tmp_path)

    def digest() -> str:
        code = Code(tmp_path / "src")
        return code.digest_of(code.stamp("fam/ggml", lambda: code.files(build=True)))

    first = digest()
    names = [line.split("  ")[1]
             for line in Path("results/code/fam/ggml.sha256").read_text().splitlines()[1:]]
    assert names == ["setup/ggml-python.sh", "setup/patches/ggml-python-cuda.patch"]
    (tmp_path / "setup" / "apt.sh").write_text("apt-get\n")
    (patches / "ggml-python-cuda.patch.orig").write_text("tf32 before\n")
    assert digest() == first
    digests = {first}
    for change in (lambda: (patches / "ggml-python-cpu-gemm.patch").write_text("R8\n"),
                   lambda: (patches / "ggml-python-cpu-gemm.patch").write_text("R8 VNNI\n"),
                   lambda: (tmp_path / "setup" / "ggml-python.sh").write_text("version=0.0.46\n")):
        change()
        digests.add(digest())
    assert len(digests) == 4
