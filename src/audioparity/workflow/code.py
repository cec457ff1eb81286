"""The source files each kind of job runs, and their digest: a job's code input.

A job depends on one file, ``results/code/<name>.sha256`` (:data:`~.paths.CODE`): the digest
of the files it runs, then one ``<sha256>  <file>`` line per file. It is written when the
workflow asks for it and rewritten only when a file's content changes, so an edit reruns
exactly the jobs that run the edited file, and a touched file reruns nothing (docs/design.md,
"Reruns"). Which files a kind of job runs (:class:`Code`):

- a family's side (fixture, reference, ggml, weights, replay): the module-level imports of the
  family's package, the imports inside the methods of its
  :class:`~audioparity.contract.family.Family` class that the side runs
  (:data:`~audioparity.contract.family.SIDE_METHODS`), for the reference and replay sides every
  module of its reference implementations (``references/``), the dump driver's function of the side
  (:data:`DRIVER_ENTRIES`), each followed transitively (:mod:`.imports`), and the command line's
  files (:data:`CLI`, not followed: it dispatches);
- a candidate's dump (``audioparity guard ... candidate run``): the guard, the code that runs a
  candidate, its adapter (a module of ours and what it imports, or the user's file), and for
  our own port the family's ggml side;
- a compare, a drill-down, a report step: their modules and the families' tables.

The jobs that run our port (its ggml side, the weights it converts, its dumps, its cases run
again, a drill-down) compute with the ggml library ``make setup`` builds, so how it is built is
part of their code too (:data:`BUILD`): a patch the project adds to it, or another version
(the script names it), reruns them, and no dump of the old build reads as current.
"""

from __future__ import annotations

import hashlib
import inspect
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from audioparity.contract.family import REFERENCES, SIDE_METHODS, Family
from audioparity.contract.spec import REPLAY, WEIGHTS
from audioparity.contract.vocabulary import Side
from audioparity.workflow import paths
from audioparity.workflow.imports import Entry, Sources

#: The command line's modules: part of every job that runs ``audioparity``, not followed.
CLI = ("audioparity.cli", "audioparity.cli.arguments", "audioparity.cli.commands")
DRIVER = "audioparity.dumping.driver"
#: The driver's functions each dump side runs.
DRIVER_ENTRIES = {"reference": ("dump_reference",), "ggml": ("dump_ggml", "dump_ggml_cases"),
                  WEIGHTS: ("save_weights",), REPLAY: ("dump_replay",)}
#: Modules whose functions import what only some jobs run: the driver (each side its
#: function), the registries of families and adapters (each job its own).
SHALLOW = frozenset({DRIVER, "audioparity.models.registry", "audioparity.candidates.registry"})
#: The modules that run a candidate, and the crash guard around a dump.
RUNNER, GUARD = "audioparity.candidates.running", "audioparity.dumping.guard"
#: The check of a case run again against its fresh run (rule compare_fresh).
REUSE = "audioparity.compare.reuse"
#: The precision search (rule precision).
PRECISION = "audioparity.compare.precision"
#: How the project builds the ggml library our port computes with (``make setup``): the script and
#: the patches it applies (``*.patch``), relative to the checkout (the folder holding ``src``); the
#: script names the ggml-python version. They are part of the code of every job that runs our port;
#: ``make run`` first brings the installed builds to them. The library's bytes are not: they differ
#: between machines (the wheel is built for the CPU's flags) and on a bundle's host (built for its
#: accelerator), where the dumps the bundle brought must still hold. The reference's emulation runs
#: ggml's conversions too, yet the build never reruns a reference: one that quantizes otherwise is
#: caught by the compare, which checks the hashes of the weights both dumps stored.
BUILD = ("setup/ggml-python.sh", "setup/patches")


def shallow(name: str) -> bool:
    """Whether module ``name`` is followed by its module-level imports only: a family's package
    (``audioparity.models.<family>``, whose methods import each side's code) or one of
    :data:`SHALLOW`."""
    parts = name.split(".")
    return name in SHALLOW or (len(parts) == 3 and parts[:2] == ["audioparity", "models"])


def family_module(family: Family) -> str:
    """The package that defines ``family``'s class (``audioparity.models.parakeet_tdt``)."""
    return type(family).__module__


class Code:
    """The source files of each kind of job, found in the checkout's source folder ``root``
    (``src``), as paths relative to the working directory, and the digests of them.

    Args:
        root: the folder holding ``audioparity/``.
        cache: where the parses of its modules are kept between runs (:class:`Sources`).
    """

    def __init__(self, root: Path, cache: Path | None = None) -> None:
        self.sources = Sources(root, shallow, cache)
        self._written: dict[str, str] = {}

    def files(self, modules: Iterable[str] = (), entries: Iterable[Entry] = (),
              outside: Sequence[str] = (), build: bool = False) -> list[str]:
        """The files of ``modules`` and ``entries`` followed (:meth:`Sources.files`), the
        command line's (:data:`CLI`), and ``outside`` (files not of the package, followed for
        their imports of it), relative to the working directory, sorted; with ``build``,
        then those of :data:`BUILD` (:meth:`build_files`)."""
        found = self.sources.files(modules, entries, [Path(p) for p in outside])
        found |= {p for p in map(self.sources.module_file, CLI) if p is not None}
        files = sorted({*(os.path.relpath(p) for p in found), *map(os.path.normpath, outside)})
        return [*files, *self.build_files()] if build else files

    def build_files(self) -> list[str]:
        """The files of :data:`BUILD` in the checkout, relative to the working directory,
        sorted; none where the package is installed without its checkout."""
        checkout = self.sources.root.parent
        found = [path for name in BUILD for path in (
            (checkout / name).rglob("*.patch") if (checkout / name).is_dir()
            else [checkout / name])]
        return sorted(os.path.relpath(path) for path in found if path.is_file())

    def side_entries(self, family: Family, side: str) -> list[Entry]:
        """What of ``family``'s package and of the driver a job of ``side`` runs."""
        entries = [Entry(family_module(family), SIDE_METHODS[side], type(family).__name__)]
        if side in DRIVER_ENTRIES:
            entries.append(Entry(DRIVER, DRIVER_ENTRIES[side]))
        return entries

    @staticmethod
    def side_modules(family: Family, side: str) -> list[str]:
        """The modules a job of ``side`` loads by name: the reference and replay sides' the
        family's reference implementations (:meth:`Family.library`), the others' none."""
        if side not in (Side.REFERENCE, REPLAY):
            return []
        return [f"{family_module(family)}.{REFERENCES}.{name}" for name in family.spec.references]

    def side(self, family: Family, side: str) -> list[str]:
        """The files a job of ``family``'s ``side`` runs (``fixture``, ``reference``, ``ggml``,
        ``weights``, ``replay``); the port's sides (``ggml``, ``weights``), its build's too."""
        return self.files(self.side_modules(family, side), self.side_entries(family, side),
                          build=side in (Side.GGML, WEIGHTS))

    def adapter_source(self, adapter: Any, given: str) -> tuple[list[str], list[str]]:
        """``(modules, outside files)`` of an adapter: the module of ours that defines its
        class, or the file a user named (``given``, a path) or that an entry point loaded."""
        if given.endswith(".py") or "/" in given:
            return [], [given]
        file = Path(inspect.getfile(type(adapter))).resolve()
        try:
            relative = file.relative_to(self.sources.root.resolve()).with_suffix("")
        except ValueError:
            return [], [str(file)]
        parts = relative.parts[:-1] if relative.name == "__init__" else relative.parts
        return [".".join(parts)], []

    def candidate_run(self, family: Family, adapter: Any, given: str) -> list[str]:
        """The files of a candidate's dump (rule ggml_dump: ``audioparity guard ... --
        audioparity candidate run``); for the family's own port, its ggml side too."""
        modules, outside = self.adapter_source(adapter, given)
        entries = self.side_entries(family, Side.GGML) if adapter.family_port else []
        return self.files([GUARD, RUNNER, *modules], entries, outside, adapter.family_port)

    def reuse(self, family: Family, adapter: Any, given: str) -> list[str]:
        """The files of a candidate's cases run again in one process and compared with their
        fresh runs (rule compare_fresh): its dump's (:meth:`candidate_run`) and the check's."""
        modules, outside = self.adapter_source(adapter, given)
        entries = self.side_entries(family, Side.GGML) if adapter.family_port else []
        return self.files([REUSE, GUARD, RUNNER, *modules], entries, outside, adapter.family_port)

    def candidate_convert(self, adapter: Any, given: str) -> list[str]:
        """The files of a candidate's conversion (rule candidate_model)."""
        modules, outside = self.adapter_source(adapter, given)
        return self.files([RUNNER, *modules], (), outside)

    def compare(self, family: Family) -> list[str]:
        """The compare's files and the family's table (its stages)."""
        return self.files(["audioparity.compare", family_module(family)])

    def drilldown(self, family: Family) -> list[str]:
        """A drill-down's files: its own, the graphs it saves, the family's ggml side."""
        return self.files(["audioparity.compare.drilldown", "audioparity.ggml.graphs"],
                          self.side_entries(family, Side.GGML), build=True)

    def precision(self, family: Family) -> list[str]:
        """A precision search's files (rule precision): the search, which runs the family's
        reference side for its trials and never a port's (a sweep verifies the recipe in its
        cells: :meth:`compare`)."""
        return self.files([PRECISION, *self.side_modules(family, Side.REFERENCE)],
                          self.side_entries(family, Side.REFERENCE))

    def report(self, module: str, families: Iterable[Family]) -> list[str]:
        """A report step's files (``audioparity.report.summary``) and every swept family's
        table (its stage order)."""
        return self.files([module, *map(family_module, families)])

    def digest(self, files: Iterable[str]) -> tuple[str, list[str]]:
        """The digest of ``files`` (each name and content, in sorted order; the reference's
        dump cache keys on it), and one ``<sha256>  <file>`` line per file."""
        total, lines = hashlib.sha256(), []
        for file in sorted(files):
            data, digest = self.sources.read(Path(file).resolve())
            total.update(f"{file}\0".encode())
            total.update(data)
            lines.append(f"{digest}  {file}")
        return total.hexdigest(), lines

    def stamp(self, name: str, files: Callable[[], Iterable[str]]) -> str:
        """The code input ``results/code/<name>.sha256`` of the jobs that run ``files()``
        (asked once per run), written where it is missing or differs; its path."""
        path = paths.CODE.format(name=name)
        if path not in self._written:
            digest, lines = self.digest(files())
            write_if_changed(Path(path), "\n".join([digest, *lines]) + "\n")
            self.sources.save()
            self._written[path] = digest
        return path

    def digest_of(self, stamp: str) -> str:
        """The digest a stamp holds (its first line)."""
        if stamp not in self._written:
            self._written[stamp] = Path(stamp).read_text().partition("\n")[0]
        return self._written[stamp]


def write_if_changed(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` unless it already holds it (its time stamp then stays), through
    a temporary file renamed over it; whether it wrote."""
    try:
        if path.read_text() == text:
            return False
    except (FileNotFoundError, UnicodeDecodeError):
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    temporary.write_text(text)
    os.replace(temporary, path)
    return True
