"""The package's imports flow one way: a module imports only modules of its own layer or lower
(:data:`LAYERS`), and no modules import each other round a circle. Read from the source, every
import counted wherever it is written (a function's too), except those only a type checker
reads (``if TYPE_CHECKING:``). Each rule is shown failing on a planted import."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import REPO

PACKAGE = "audioparity"
#: The layers, lowest first, each a tuple of module prefixes (dotted, below the package): the
#: words; the contract and leaf helpers; storage, dumps and checkpoints; the ggml runtime; the
#: model families; dumping a side; judging; reporting; the workflow and the command line.
LAYERS = (
    ("contract.errors", "contract.vocabulary", "dumping.threads"),
    ("contract", "dumping.provenance", "dumping.audio", "dumping.shared_cache",
     "dumping.environments", "compare.metrics"),
    ("dumping", "checkpoints"),
    ("ggml",),
    ("models",),
    ("dumping.driver", "dumping.export", "candidates"),
    ("compare",),
    ("report",),
    ("workflow", "cli", "__main__"),
)


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _runtime_nodes(tree: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``tree`` but those under ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            yield from (n for child in node.orelse for n in [child, *_runtime_nodes(child)])
            continue
        yield node
        yield from _runtime_nodes(node)


def imports(source: str, modules: set[str]) -> set[str]:
    """The package's modules a module's ``source`` imports at run time: ``from a.b import c``
    is module ``a.b.c`` where that is one, else ``a.b``."""
    found = set()
    for node in _runtime_nodes(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                found.add(sub if sub in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {name for name in found if name in modules}


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules it imports, for every module under ``root`` (the package)."""
    paths = {module_name(path, root.parent): path for path in root.rglob("*.py")}
    return {name: imports(path.read_text(), set(paths)) - {name} for name, path in paths.items()}


def layer(module: str) -> int:
    """The layer of a module (:data:`LAYERS`; the longest prefix that names it)."""
    name = module.removeprefix(f"{PACKAGE}.")
    found = [(len(prefix), index) for index, prefixes in enumerate(LAYERS) for prefix in prefixes
             if name == prefix or name.startswith(prefix + ".")]
    if not found:
        raise LookupError(f"{module}: in no layer of tests/test_imports.py's LAYERS")
    return max(found)[1]


def upward(graph: dict[str, set[str]]) -> list[str]:
    """Each import of a higher layer's module, ``a -> b``."""
    return sorted(f"{a} -> {b}" for a, targets in graph.items() for b in targets
                  if a != PACKAGE and b != PACKAGE and layer(b) > layer(a))


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in sorted(graph.get(node, ())):
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                other = stack.pop()
                group.append(other)
                if other == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(REPO / "src" / PACKAGE)


def test_every_module_is_in_a_layer(graph):
    for module in graph:
        if module != PACKAGE:
            layer(module)


def test_no_module_imports_a_higher_layer(graph):
    assert upward(graph) == []


def test_no_modules_import_each_other_round_a_circle(graph):
    assert circles(graph) == []


def test_each_rule_fails_on_a_planted_import(graph):
    planted = {name: set(targets) for name, targets in graph.items()}
    planted[f"{PACKAGE}.ggml.graphs"].add(f"{PACKAGE}.compare.cell")  # the runtime reaching up
    assert set(upward(planted)) - set(upward(graph)) == {
        f"{PACKAGE}.ggml.graphs -> {PACKAGE}.compare.cell"}
    planted = {name: set(targets) for name, targets in graph.items()}
    errors, vocabulary = f"{PACKAGE}.contract.errors", f"{PACKAGE}.contract.vocabulary"
    planted[errors].add(vocabulary)
    planted[vocabulary].add(errors)
    assert [errors, vocabulary] in circles(planted)
    assert imports(f"if TYPE_CHECKING:\n    import audioparity.cli\nimport {errors}\n",
                   {"audioparity.cli", errors}) == {errors}
