"""Reference dumps kept by what made them, so that a reference job run again for a new case
restores the dumps it made before instead of computing them again (docs/design.md, "Reruns")."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import MANIFEST, built_directory
from audioparity.dumping.emulation import emulated_dir
from audioparity.dumping.provenance import sha256_of, stat_key

log = logging.getLogger("audioparity.dumping.dump_cache")


class DumpCache:
    """A folder of dumps, one per (case input, weight type), each under a key that hashes
    everything the dump depends on: the job's ``identity`` (family, the digest of the code that
    computes it, the model's size and time, threads, options) and the case's input file's bytes.

    Snakemake removes a job's outputs before it runs the job, so the cache lives beside them
    (``results/cache/reference/<family>/<model>``); a dump is stored and restored as hard links
    (a copy where the file system has none), so it costs no space while its output is there.
    """

    def __init__(self, directory: str | os.PathLike, model: Path, identity: dict[str, Any]):
        """``directory``: the cache folder (created); ``model``: the checkpoint (its size and
        time join ``identity``, a JSON-able mapping).

        Raises:
            AudioparityError: the folder cannot be created, or the model does not exist.
        """
        self.directory = Path(directory)
        if not Path(model).exists():
            raise AudioparityError(f"{model}: no such file or directory")
        self._identity = {**identity, "model": stat_key(Path(model))}
        self._used: set[str] = set()
        self._inputs: dict[Path, str] = {}
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise AudioparityError(f"{self.directory}: cannot create the cache ({err})") from err

    def key(self, case_input: Path, weight_type: str | None) -> str:
        """The entry name of ``case_input``'s dump at ``weight_type`` (None: float32)."""
        if case_input not in self._inputs:
            self._inputs[case_input] = sha256_of(case_input)
        text = json.dumps({**self._identity, "input": self._inputs[case_input],
                           "weight_type": weight_type}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def restore(self, cases: Sequence[tuple[Path, Path]], emulate: Sequence[str]
                ) -> tuple[list[tuple[Path, Path]], list[str]]:
        """Restore every dump of ``cases`` (``(input, output_dir)`` pairs) at float32 and at
        each ``emulate`` type that the cache holds; return the cases left to compute and the
        emulated types they need. A case to compute is computed at float32 as well (a reference
        job always dumps it), so its float32 dump is not restored.
        """
        todo, types = [], set()
        for case_input, output_dir in cases:
            missing = [t for t in (None, *emulate) if not self._entry(case_input, t).is_dir()]
            for weight_type in (None, *emulate):
                if weight_type not in missing and (missing == [] or weight_type is not None):
                    _link_tree(self._entry(case_input, weight_type),
                               emulated_dir(output_dir, weight_type))
            if missing:
                todo.append((case_input, output_dir))
                types.update(t for t in missing if t is not None)
        log.info("reference: %d of %d case(s) restored from %s, %d to compute",
                 len(cases) - len(todo), len(cases), self.directory, len(todo))
        return todo, [t for t in emulate if t in types]

    def store(self, cases: Sequence[tuple[Path, Path]], emulate: Sequence[str]) -> None:
        """Store each written dump of ``cases`` at float32 and each ``emulate`` type that the
        cache lacks (a dump is there once its directory is: they are written atomically)."""
        for case_input, output_dir in cases:
            for weight_type in (None, *emulate):
                dump = emulated_dir(output_dir, weight_type)
                entry = self._entry(case_input, weight_type)
                if not entry.is_dir() and (dump / MANIFEST).is_file():
                    _link_tree(dump, entry)

    def prune(self) -> None:
        """Remove every entry this job did not name: the cache holds the dumps of the job's
        current cases only (removing a case and adding it back computes it again)."""
        for entry in self.directory.iterdir():
            if entry.name not in self._used:
                shutil.rmtree(entry) if entry.is_dir() else entry.unlink()

    def _entry(self, case_input: Path, weight_type: str | None) -> Path:
        name = self.key(case_input, weight_type)
        self._used.add(name)
        return self.directory / name


def _link_tree(source: Path, target: Path) -> None:
    """Make ``target`` a copy of the flat folder ``source`` by hard links (copies where links
    fail), built beside it and renamed into place (:func:`~audioparity.dumping.artifacts.
    built_directory`), so a reader never sees half of it."""
    with built_directory(target) as work:
        for file in source.iterdir():
            try:
                os.link(file, work / file.name)
            except OSError:
                shutil.copy2(file, work / file.name)
