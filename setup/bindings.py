"""ggml-python's ctypes bindings against the functions a ggml build defines.

ggml-python binds each C function with ``@ggml_function("name", argtypes, restype,
enabled=...)`` in ggml/ggml.py, and at import looks every enabled one up in the shared library
(``getattr(lib, name)``): a binding the library lacks fails ``import ggml`` with an
AttributeError. ``enabled`` is absent (always), ``False`` (never), ``hasattr(lib, "symbol")``,
or a flag of ggml.py set the same way (``GGML_USE_CUDA = hasattr(lib, "ggml_backend_cuda_init")``):
a backend's bindings are looked up when the library exports that backend's guard symbol.

Two checks, each a line per binding that would fail the import and exit status 1:

  python setup/bindings.py built [PACKAGE]
      the installed package (default: the ``ggml`` this Python finds, not imported): the
      symbols exported by the libraries in its ggml/lib/ (``nm -D --defined-only``).
  python setup/bindings.py source SOURCE [--backend NAME ...] [--cmake-args ARGS]
      an extracted (and patched) source package, before building it: the functions defined
      (not only declared; not ``static``) in vendor/ggml/src/'s own files and in
      vendor/ggml/src/ggml-NAME/ of each backend: cpu, and those the CMake arguments enable
      (``-DGGML_CUDA=ON``: cuda; ``-DGGML_CPU=OFF`` drops cpu).

Bad input (no such folder, no ggml.py, a form of ``enabled`` this does not know) is one line
and exit status 2.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SOURCE_SUFFIXES = {".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp", ".m", ".mm"}
# A comment, or a string or character literal kept as it is (a "//" inside one is no comment).
_COMMENT = re.compile(r'("(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\')|//[^\n]*|/\*.*?\*/', re.S)
# A function definition: a name, its parameter list (one level of nested parentheses, for
# function-pointer parameters), then its body (or a function-try-block, as ggml-sycl's); a
# declaration ends in ';' instead.
_DEFINITION = re.compile(r"\b([A-Za-z_]\w*)\s*\((?:[^(){};]|\([^(){};]*\))*\)"
                         r"\s*(?:(?:noexcept|try)\b\s*)*\{")
# A preprocessor directive, its continuation lines included (a macro's body is no definition).
_DIRECTIVE = re.compile(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", re.M)
_CMAKE_OPTION = re.compile(r"-DGGML_([A-Z0-9_]+)(?::BOOL)?=(\S*)", re.I)
_ON = {"on", "1", "true", "yes", "y"}


@dataclass(frozen=True)
class Binding:
    """One ``@ggml_function`` of ggml.py: the C function's ``name``; ``guard``, the symbol whose
    presence in the library enables it (None: always enabled); ``enabled``, the source text of
    its ``enabled=`` argument (for the report)."""

    name: str
    guard: str | None
    enabled: str


def parse_bindings(ggml_py: Path) -> list[Binding]:
    """The bindings of ggml-python's ggml/ggml.py, by name, without those that are never
    enabled (``enabled=False``). Mirrors ``ctypes_function_for_shared_library``'s decorator and
    ggml.py's ``GGML_USE_* = hasattr(lib, "...")`` flags. Raises ValueError on an ``enabled``
    that is neither a constant, ``hasattr(lib, "...")``, nor such a flag."""
    tree = ast.parse(ggml_py.read_text(), str(ggml_py))
    flags = {
        target.id: guard
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and (guard := _hasattr_symbol(node.value))
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    bindings = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            if not (isinstance(decorator, ast.Call) and isinstance(decorator.func, ast.Name)
                    and decorator.func.id == "ggml_function"):
                continue
            name = ast.literal_eval(decorator.args[0])
            enabled = next((k.value for k in decorator.keywords if k.arg == "enabled"), None)
            if enabled is None:
                bindings.append(Binding(name, None, "always"))
                continue
            text = ast.unparse(enabled)
            if isinstance(enabled, ast.Constant) and isinstance(enabled.value, bool):
                if enabled.value:
                    bindings.append(Binding(name, None, text))
            elif guard := _hasattr_symbol(enabled):
                bindings.append(Binding(name, guard, text))
            elif isinstance(enabled, ast.Name) and enabled.id in flags:
                bindings.append(Binding(name, flags[enabled.id], text))
            else:
                raise ValueError(f"{ggml_py}:{decorator.lineno}: {name}: enabled={text} is "
                                 "not a constant, hasattr(lib, ...) nor a GGML_USE_* flag")
    return sorted(bindings, key=lambda binding: binding.name)


def _hasattr_symbol(node: ast.expr) -> str | None:
    """"symbol" when ``node`` is ``hasattr(lib, "symbol")``, else None."""
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id == "hasattr" and len(node.args) == 2
            and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)):
        return node.args[1].value
    return None


def missing(bindings: list[Binding], defined: set[str]) -> list[Binding]:
    """The bindings a library defining ``defined`` would fail ``import ggml`` on: enabled (no
    guard, or its guard defined, as ggml.py's ``hasattr(lib, ...)`` decides) and not defined."""
    return [b for b in bindings
            if (b.guard is None or b.guard in defined) and b.name not in defined]


def exported_symbols(lib_dir: Path) -> set[str]:
    """The dynamic symbols defined by the shared libraries (``*.so*``) in ``lib_dir``, without
    their symbol versions, from binutils' ``nm -D --defined-only``. Raises ValueError when the
    folder has no library, OSError when nm cannot be run, CalledProcessError when nm fails."""
    libraries = sorted(path for path in lib_dir.glob("*.so*") if path.is_file())
    if not libraries:
        raise ValueError(f"no shared library (*.so*) in {lib_dir}")
    listing = subprocess.run(["nm", "-D", "--defined-only", "--format=posix", *libraries],
                             check=True, capture_output=True, text=True).stdout
    return {line.split()[0].split("@")[0] for line in listing.splitlines()
            if line and not line.endswith(":")}


def defined_functions(files: list[Path]) -> set[str]:
    """The names of the functions these C, C++, CUDA or Objective-C files define with external
    linkage: a parameter list followed by a body, comments ignored, ``static`` ones left out (a
    library does not export them). A textual reading, not a compiler's: enough for the plain
    definitions ggml's exported API uses (preprocessor directives are left out, and a
    function that a macro defines with it)."""
    names = set()
    for path in files:
        text = _COMMENT.sub(lambda m: m.group(1) or " ", path.read_text(errors="replace"))
        text = _DIRECTIVE.sub("", text)
        for match in _DEFINITION.finditer(text):
            start = match.start(1)
            head = text[max(text.rfind(c, 0, start) for c in ";{}") + 1:start]
            if "static" not in head.split():
                names.add(match.group(1))
    return names


def backends_from_cmake_args(cmake_args: str, src: Path) -> list[str]:
    """The backends a build with ``cmake_args`` compiles, by their folder vendor/ggml/src/ggml-NAME
    in ``src``: cpu unless ``-DGGML_CPU=OFF``, and each ``-DGGML_NAME=ON`` that names such a
    folder (``-DGGML_LLAMAFILE=ON`` is an option of cpu, no backend)."""
    options = {name.lower(): value.lower() in _ON
               for arg in shlex.split(cmake_args)
               for name, value in _CMAKE_OPTION.findall(arg)}
    options.setdefault("cpu", True)
    return sorted(name for name, on in options.items()
                  if on and (src / f"ggml-{name}").is_dir())


def source_files(src: Path, backends: list[str]) -> list[Path]:
    """The sources of a build of vendor/ggml/src (``src``) with these backends: the files of
    ``src`` itself (ggml-base, ggml) and those under each ``src/ggml-NAME/``. Raises ValueError
    on a backend with no such folder."""
    files = [path for path in src.iterdir() if path.suffix in SOURCE_SUFFIXES]
    for backend in backends:
        folder = src / f"ggml-{backend}"
        if not folder.is_dir():
            raise ValueError(f"no backend {backend!r}: {folder} is not a folder")
        files += [path for path in folder.rglob("*") if path.suffix in SOURCE_SUFFIXES]
    return files


def installed_package() -> Path:
    """The folder of the ``ggml`` package this Python would import, found without importing
    it. Raises ValueError when there is none."""
    spec = importlib.util.find_spec("ggml")
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"{sys.executable} has no ggml package installed")
    return Path(spec.submodule_search_locations[0])


def check_built(package: Path) -> list[str]:
    """One line per binding of the installed ggml package (its folder, ``package``) that its
    ggml/lib/ libraries do not export; empty when ``import ggml`` finds them all."""
    lib_dir = package / "lib"
    defined = exported_symbols(lib_dir)
    return [f"{b.name} (enabled={b.enabled}) is bound by {package / 'ggml.py'} and exported "
            f"by no library in {lib_dir}"
            for b in missing(parse_bindings(_ggml_py(package)), defined)]


def check_source(source: Path, backends: list[str]) -> list[str]:
    """One line per binding of an extracted source package (``source``, the folder with
    ggml/ggml.py and vendor/) that a build with these backends would not define."""
    src = source / "vendor" / "ggml" / "src"
    defined = defined_functions(source_files(src, backends))
    where = ", ".join(["vendor/ggml/src", *(f"ggml-{b}/" for b in backends)])
    return [f"{b.name} (enabled={b.enabled}) is bound by ggml/ggml.py and defined nowhere in "
            f"{where} of {source}"
            for b in missing(parse_bindings(_ggml_py(source / "ggml")), defined)]


def _ggml_py(package: Path) -> Path:
    path = package / "ggml.py"
    if not path.is_file():
        raise ValueError(f"no {path}: not ggml-python's ggml package")
    return path


def main(argv: list[str] | None = None) -> int:
    """The command line (the module's docstring): 0 when nothing is missing, 1 when a binding
    is (a line each on stderr), 2 on bad input (one line)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    built = commands.add_parser("built", help="the installed package's libraries")
    built.add_argument("package", nargs="?", type=Path,
                       help="the ggml package folder (default: the one this Python finds)")
    source = commands.add_parser("source", help="an extracted source package, before building")
    source.add_argument("source", type=Path, help="the folder with ggml/ and vendor/")
    source.add_argument("--backend", action="append", default=[],
                        help="a backend built (vendor/ggml/src/ggml-NAME); repeatable")
    source.add_argument("--cmake-args", default="",
                        help="the build's CMake arguments: the backends they enable (cpu, "
                        "unless -DGGML_CPU=OFF, also without them)")
    args = parser.parse_args(argv)
    try:
        if args.command == "built":
            lines = check_built(args.package or installed_package())
        else:
            src = args.source / "vendor" / "ggml" / "src"
            backends = sorted({*args.backend, *backends_from_cmake_args(args.cmake_args, src)})
            lines = check_source(args.source, backends)
    except (ValueError, OSError, SyntaxError, subprocess.CalledProcessError) as error:
        print(f"bindings.py: {error}", file=sys.stderr)
        return 2
    for line in lines:
        print(f"bindings.py: {line}", file=sys.stderr)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
