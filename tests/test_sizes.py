"""The package's sizes: modules of at most :data:`MODULE_LINES` lines, functions of at most
:data:`FUNCTION_LINES` lines of code (the docstring aside), public functions of at most
:data:`PARAMETERS` parameters (``self`` and ``cls`` aside). What is over a limit today is named
in :data:`OVER`, and that list only shrinks: an item over a limit that it does not name fails,
and so does one it names that is now within its limit (take it off). Each rule is shown failing
on a planted source."""

from __future__ import annotations

import ast
from pathlib import Path

from tests import REPO

PACKAGE = REPO / "src" / "audioparity"
MODULE_LINES, FUNCTION_LINES, PARAMETERS = 600, 60, 6
#: The items over a limit today, by rule: modules by dotted name, functions as
#: ``module:qualified name``.
OVER: dict[str, set[str]] = {
    "module_lines": set(),
    "function_lines": set(),
    "parameters": set(),
}
#: Public functions whose parameters are a third party's, kept as that party wrote them (a
#: caller passes them as it would to the original), with why. Each must still be over the limit.
MIRRORED: dict[str, str] = {
    "audioparity.models.moss_voicegen.remote_code.processing_moss_tts:"
    "MossTTSDelayProcessor.build_user_message":
        "the fixture's remote code: OpenMOSS's processor API, whose user message has eight "
        "fields, each a keyword the reference passes by name",
}


def module_name(path: Path) -> str:
    """``audioparity.compare.cell`` of ``src/audioparity/compare/cell.py``."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """The lines of a function, its docstring aside."""
    lines = node.end_lineno - node.lineno + 1
    if ast.get_docstring(node, clean=False) is not None:
        lines -= node.body[0].end_lineno - node.body[0].lineno + 1
    return lines


def parameters(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """A function's parameters, ``self`` and ``cls`` aside (``*args`` and ``**kwargs`` not
    counted: they name no parameter)."""
    args = node.args
    return sum(a.arg not in ("self", "cls") for a in (*args.posonlyargs, *args.args,
                                                       *args.kwonlyargs))


def _functions(tree: ast.AST, prefix: str = ""):
    """``(qualified name, node, public)`` of every function and method, nested ones too; a
    function is public when neither it nor a class or function around it is private."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{prefix}{node.name}"
            if not isinstance(node, ast.ClassDef):
                yield name, node, not any(p.startswith("_") for p in name.split("."))
            yield from _functions(node, f"{name}.")


def over(source: str, module: str) -> dict[str, set[str]]:
    """What of one module's ``source`` is over a limit, by rule (:data:`OVER`'s keys)."""
    tree = ast.parse(source)
    found: dict[str, set[str]] = {rule: set() for rule in OVER}
    if len(source.splitlines()) > MODULE_LINES:
        found["module_lines"].add(module)
    for name, node, public in _functions(tree):
        if code_lines(node) > FUNCTION_LINES:
            found["function_lines"].add(f"{module}:{name}")
        if public and parameters(node) > PARAMETERS:
            found["parameters"].add(f"{module}:{name}")
    return found


def package_over() -> dict[str, set[str]]:
    """:func:`over` of every module of the package."""
    found: dict[str, set[str]] = {rule: set() for rule in OVER}
    for path in sorted(PACKAGE.rglob("*.py")):
        for rule, items in over(path.read_text(), module_name(path)).items():
            found[rule] |= items
    return found


def test_the_package_keeps_its_sizes():
    found = package_over()
    assert sorted(set(MIRRORED) - found["parameters"]) == [], "mirrored, within the limit"
    found["parameters"] -= set(MIRRORED)
    for rule, listed in OVER.items():
        assert sorted(found[rule] - listed) == [], f"{rule}: over the limit and not in OVER"
        assert sorted(listed - found[rule]) == [], f"{rule}: within the limit now: off OVER"


def test_each_limit_fails_on_a_planted_source():
    body = "".join(f"    x = {i}\n" for i in range(FUNCTION_LINES - 1))  # and the def line
    long_function = f'def f():\n    """A docstring\n\n    of lines."""\n{body}'
    assert over(long_function, "m")["function_lines"] == set()  # the docstring aside: 60 lines
    assert over(long_function + "    return x\n", "m")["function_lines"] == {"m:f"}
    names = ", ".join(f"a{i}" for i in range(PARAMETERS))
    assert over(f"def f(self, {names}, *rest, **more): pass\n", "m")["parameters"] == set()
    assert over(f"def f({names}, *, b): pass\n", "m")["parameters"] == {"m:f"}
    assert over(f"def _f({names}, b): pass\n", "m")["parameters"] == set()  # private
    assert over(f"class _C:\n    def f(self, {names}, b): pass\n", "m")["parameters"] == set()
    assert over(f"class C:\n    def f(self, {names}, b): pass\n", "m")["parameters"] == {"m:C.f"}
    assert over("x = 1\n" * MODULE_LINES, "m")["module_lines"] == set()
    assert over("x = 1\n" * (MODULE_LINES + 1), "m")["module_lines"] == {"m"}
