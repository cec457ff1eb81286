"""The package's modules and what each imports, read from their source (``ast``), never
imported: which source files a job runs (:mod:`audioparity.workflow.code`).

A module's imports are those at any depth of its code (lazy ones inside functions too),
followed transitively, each package's ``__init__`` on the way; a *shallow* module (a family
package, the driver, a registry whose functions import every entry) contributes only its
module-level imports, and the functions of it that a job runs are named apart
(:class:`Entry`): their imports, and those of the functions and methods of the same module
they call, by name or through ``self``.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Entry:
    """Functions of a shallow module that a job runs: ``names`` of ``module``'s class
    ``owner`` (its methods), or of the module itself when ``owner`` is ``""``."""

    module: str
    names: tuple[str, ...]
    owner: str = ""


@dataclass
class _Body:
    """What one function or method body imports and calls."""

    imports: list[str] = field(default_factory=list)
    calls: set[str] = field(default_factory=set)
    methods: set[str] = field(default_factory=set)


@dataclass
class Parsed:
    """One module's imports: at module level, anywhere, and per function and method."""

    module_level: list[str]
    anywhere: list[str]
    functions: dict[str, _Body]
    classes: dict[str, dict[str, _Body]]

    def to_json(self) -> dict:
        def body(b: _Body) -> list:
            return [b.imports, sorted(b.calls), sorted(b.methods)]

        return {"module_level": self.module_level, "anywhere": self.anywhere,
                "functions": {name: body(b) for name, b in self.functions.items()},
                "classes": {name: {m: body(b) for m, b in methods.items()}
                            for name, methods in self.classes.items()}}

    @classmethod
    def from_json(cls, data: dict) -> Parsed:
        def body(b: list) -> _Body:
            return _Body(b[0], set(b[1]), set(b[2]))

        return cls(data["module_level"], data["anywhere"],
                   {name: body(b) for name, b in data["functions"].items()},
                   {name: {m: body(b) for m, b in methods.items()}
                    for name, methods in data["classes"].items()})


def _imported(node: ast.AST, package: str) -> list[str]:
    """The module names an import statement names (``from a import b`` names ``a`` and
    ``a.b``, which may be a module), relative ones resolved against ``package``."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    base = node.module or ""
    if node.level:
        anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
        base = f"{anchor}.{base}" if base else anchor
    return [base, *(f"{base}.{alias.name}" for alias in node.names)]


def _body(function: ast.AST, package: str) -> _Body:
    body = _Body()
    for node in ast.walk(function):
        body.imports.extend(_imported(node, package))
        if isinstance(node, ast.Call):
            target = node.func
            if isinstance(target, ast.Name):
                body.calls.add(target.id)
            elif (isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name)
                  and target.value.id in ("self", "cls")):
                body.methods.add(target.attr)
    return body


_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef)


def parse(source: str, filename: str, package: str) -> Parsed:
    """The imports of a module's ``source``; ``package``: the package relative imports are
    resolved against (the module's own name for a package's ``__init__``)."""
    tree = ast.parse(source, filename)
    parsed = Parsed([], [], {}, {})
    stack = list(reversed(tree.body))
    while stack:  # module level, in order: every statement but functions' and classes' bodies
        node = stack.pop()
        if isinstance(node, _FUNCTIONS):
            parsed.functions[node.name] = _body(node, package)
        elif isinstance(node, ast.ClassDef):
            parsed.classes[node.name] = {item.name: _body(item, package)
                                         for item in node.body if isinstance(item, _FUNCTIONS)}
        else:
            parsed.module_level.extend(_imported(node, package))
            stack.extend(reversed([child for child in ast.iter_child_nodes(node)
                                   if isinstance(child, ast.stmt)]))
    parsed.anywhere = [*parsed.module_level,
                       *(n for body in parsed.functions.values() for n in body.imports),
                       *(n for methods in parsed.classes.values() for body in methods.values()
                         for n in body.imports)]
    return parsed


def entry_imports(parsed: Parsed, entry: Entry) -> list[str]:
    """What the functions of ``entry`` import, with the functions and methods of the same
    module they call (transitively). A method the class does not define is inherited: its
    base class's module is followed as any other.

    Raises:
        KeyError: ``entry`` names a class, or a module-level function, the module lacks.
    """
    methods = parsed.classes[entry.owner] if entry.owner else {}
    missing = [] if entry.owner else sorted(set(entry.names) - set(parsed.functions))
    if missing:
        raise KeyError(f"{entry.module}: no function {', '.join(missing)}")
    todo = [(bool(entry.owner), name) for name in entry.names]
    seen, names = set(), []
    while todo:
        key = todo.pop()
        body = (methods if key[0] else parsed.functions).get(key[1])
        if key in seen or body is None:
            continue
        seen.add(key)
        names.extend(body.imports)
        todo.extend((False, call) for call in body.calls if call in parsed.functions)
        todo.extend((True, method) for method in body.methods if method in methods)
    return names


class Sources:
    """The modules of the package under ``root`` (the folder holding ``audioparity/``), each
    file read and parsed once, and its parse kept in ``cache`` (a JSON file) by the digest of
    its content, so a run parses only the files that changed since the last.

    Args:
        root: the source folder (``src``).
        shallow: whether a module (``audioparity.dumping.driver``) is shallow (module docstring).
        cache: the JSON file of parses; None: none kept.
        package: the top-level package whose modules are followed.
    """

    def __init__(self, root: Path, shallow: Callable[[str], bool] = lambda name: False,
                 cache: Path | None = None, package: str = "audioparity") -> None:
        self.root = Path(root).resolve()
        self.shallow = shallow
        self.package = package
        self.cache = cache
        self._parsed: dict[Path, Parsed] = {}
        self._files: dict[str, Path | None] = {}
        self._bytes: dict[Path, tuple[bytes, str]] = {}
        self._stored: dict[str, list] = {}
        self._dirty = False
        if cache is not None and cache.is_file():
            try:
                self._stored = json.loads(cache.read_text())
            except ValueError:
                self._stored = {}

    def read(self, path: Path) -> tuple[bytes, str]:
        """``(content, its sha256)`` of a file, read once."""
        if path not in self._bytes:
            data = Path(path).read_bytes()
            self._bytes[path] = data, hashlib.sha256(data).hexdigest()
        return self._bytes[path]

    def module_file(self, name: str) -> Path | None:
        """The file of module ``name`` (``audioparity.x.y``), or None when it is none of the
        package's."""
        if name not in self._files:
            found = None
            if name == self.package or name.startswith(f"{self.package}."):
                base = self.root.joinpath(*name.split("."))
                found = next((candidate for candidate in (base / "__init__.py",
                                                          base.with_suffix(".py"))
                              if candidate.is_file()), None)
            self._files[name] = found
        return self._files[name]

    def parsed(self, path: Path, package: str) -> Parsed:
        """The imports of the file ``path`` (:func:`parse`), parsed once, or taken from the
        cache where its content and ``package`` are those parsed then."""
        if path not in self._parsed:
            data, digest = self.read(path)
            stored = self._stored.get(str(path))
            if stored and stored[:2] == [digest, package]:
                self._parsed[path] = Parsed.from_json(stored[2])
            else:
                self._parsed[path] = parse(data.decode(), str(path), package)
                self._stored[str(path)] = [digest, package, self._parsed[path].to_json()]
                self._dirty = True
        return self._parsed[path]

    def save(self) -> None:
        """Write the cache where a file was parsed since it was read."""
        if self.cache is not None and self._dirty:
            self.cache.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.cache.with_name(f".{self.cache.name}.{os.getpid()}")
            temporary.write_text(json.dumps(self._stored, sort_keys=True))
            os.replace(temporary, self.cache)
            self._dirty = False

    def module(self, name: str) -> Parsed:
        """The imports of module ``name``.

        Raises:
            KeyError: no such module of the package.
        """
        path = self.module_file(name)
        if path is None:
            raise KeyError(f"no module {name} under {self.root}")
        return self.parsed(path, name if path.name == "__init__.py" else name.rpartition(".")[0])

    def files(self, modules: Iterable[str] = (), entries: Iterable[Entry] = (),
              paths: Iterable[Path] = ()) -> set[Path]:
        """The files of ``modules`` and of every module of the package they import,
        transitively, with each package's ``__init__`` on the way; ``entries``: functions of
        shallow modules a job runs (their modules and imports included); ``paths``: files
        outside the package (a user's adapter) whose imports of the package are followed, and
        the modules beside them they import (:meth:`beside`, listed; ``paths`` themselves are
        not).
        """
        todo = list(modules)
        for entry in entries:
            todo += [entry.module, *entry_imports(self.module(entry.module), entry)]
        given, files = {Path(path) for path in paths}, set()
        for path in self.beside(given):
            files |= {path} - given
            todo += self.parsed(path, "").anywhere
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            parts = name.split(".")
            for depth in range(1, len(parts) + 1):
                prefix = ".".join(parts[:depth])
                path = self.module_file(prefix)
                if path is None or path in files:
                    continue
                files.add(path)
                parsed = self.module(prefix)
                todo += parsed.module_level if self.shallow(prefix) else parsed.anywhere
        return files


    def beside(self, paths: Iterable[Path]) -> set[Path]:
        """``paths`` (files outside the package) and the modules beside them that they import,
        transitively: a user's adapter importing a helper of its own folder (its folder is on
        the path when it is loaded)."""
        found: set[Path] = set()
        todo = [Path(path) for path in paths]
        while todo:
            path = todo.pop()
            if path in found:
                continue
            found.add(path)
            for name in self.parsed(path, "").anywhere:
                top = path.parent / name.split(".")[0]
                todo += [c for c in (top.with_suffix(".py"), top / "__init__.py") if c.is_file()]
        return found


def relative(paths: Iterable[Path], start: str | os.PathLike = os.curdir) -> list[str]:
    """``paths`` relative to ``start`` (the working directory), sorted."""
    return sorted(os.path.relpath(path, start) for path in paths)
