"""Every third-party module src/ imports comes from a distribution pyproject.toml declares, in
``dependencies`` or one of its extras: an import found only because another package brought its
distribution in (Snakemake brings jsonschema) breaks when that package drops it."""

from __future__ import annotations

import ast
import importlib.metadata
import sys
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests import REPO

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

#: Modules src/ imports that no distribution provides: llama.cpp's converter and its package,
#: imported from the llama.cpp checkout put on sys.path (candidates/llama_cpp_convert.py).
NOT_DISTRIBUTIONS = {"convert_hf_to_gguf", "conversion"}


def imported_modules(root: Path) -> dict[str, str]:
    """{top-level module: the first file:line importing it} of every ``import x`` and absolute
    ``from x import y`` in the Python files under ``root``, inside functions and try blocks too."""
    found: dict[str, str] = {}
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            where = f"{path.relative_to(root.parent)}:{node.lineno}"
            for name in names:
                found.setdefault(name.split(".")[0], where)
    return found


def declared_distributions(pyproject: Path) -> set[str]:
    """The PEP 503 names of the distributions ``dependencies`` and every extra of
    ``optional-dependencies`` require."""
    project = tomllib.loads(pyproject.read_text())["project"]
    requirements = [*project["dependencies"],
                    *(r for extra in project.get("optional-dependencies", {}).values()
                      for r in extra)]
    return {canonicalize_name(Requirement(r).name) for r in requirements}


def undeclared(modules: dict[str, str], declared: set[str]) -> list[str]:
    """A line per third-party module of ``modules`` (not the standard library's, not
    audioparity's) whose distributions (``importlib.metadata.packages_distributions``) are none
    of ``declared``, or which no installed distribution provides."""
    distributions = importlib.metadata.packages_distributions()
    problems = []
    for module, where in sorted(modules.items()):
        if module in sys.stdlib_module_names or module in NOT_DISTRIBUTIONS \
                or module == "audioparity":
            continue
        names = {canonicalize_name(d) for d in distributions.get(module, [])}
        if not names:
            problems.append(f"{where}: {module} is provided by no installed distribution")
        elif not names & declared:
            problems.append(f"{where}: {module} comes from {', '.join(sorted(names))}, which "
                            "pyproject.toml does not declare")
    return problems


def test_every_imported_distribution_is_declared() -> None:
    problems = undeclared(imported_modules(REPO / "src"), declared_distributions(
        REPO / "pyproject.toml"))
    assert not problems, "\n".join(problems)


def test_an_undeclared_import_is_found(tmp_path: Path) -> None:
    """One imported in a function, under a try/except ImportError, counts as well."""
    (tmp_path / "late.py").write_text("import numpy as np\n\n\ndef f():\n    try:\n"
                                      "        import yaml.constructor\n"
                                      "    except ImportError:\n        pass\n")
    assert undeclared(imported_modules(tmp_path), {"numpy"}) == [
        f"{tmp_path.name}/late.py:6: yaml comes from pyyaml, which pyproject.toml does not "
        "declare"]
