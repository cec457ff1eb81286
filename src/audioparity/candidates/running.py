"""Running a candidate for one cell (``audioparity candidate run``): the family's own port
through the dump driver, in this process; a third-party port's commands, whose files are read
into a dump of the contract (:mod:`.reading`); and a candidate's model conversion
(``audioparity candidate convert``)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from audioparity.candidates.adapter import Adapter, Command, ToolCall
from audioparity.candidates.model_file import model_storage, write_storage
from audioparity.candidates.reading import RUN_WALL, read_tool_output
from audioparity.candidates.registry import load_adapter
from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.contract.vocabulary import RECIPE_SEPARATOR
from audioparity.dumping.artifacts import MANIFEST, DumpWriter, built_directory
from audioparity.dumping.guard import describe_exit
from audioparity.dumping.weight_files import Recipe, type_name

if TYPE_CHECKING:
    from audioparity.dumping.driver import RunSettings

log = logging.getLogger("audioparity")

#: Lines of a tool's stderr kept in the message when it fails.
STDERR_TAIL = 3


class ToolFailed(AudioparityError):
    """A tool that started and exited non-zero or was killed (not one that could not start)."""


def run_tool(argv: Sequence[str], env: Mapping[str, str], what: str,
             cwd: Path | None = None, echo: bool = True) -> tuple[str, str]:
    """Run ``argv`` with the environment variables ``env`` on top of ours; its stdout and
    stderr. With ``echo``, its stderr also goes through to ours (a job's log); a build's
    thousands of compiler lines do not.

    Raises:
        AudioparityError: it cannot start; :class:`ToolFailed`: it exits non-zero (naming the
            exit and the last lines of its stderr).
    """
    log.info("%s: %s", what, " ".join(map(str, argv)))
    try:
        result = subprocess.run([str(a) for a in argv], env={**os.environ, **env}, cwd=cwd,
                                capture_output=True, text=True, errors="replace")
    except OSError as err:
        raise AudioparityError(f"{what}: cannot run {argv[0]} ({err.strerror or err})") from None
    if echo:
        sys.stderr.write(result.stderr)
    if result.returncode != 0:
        tail = " | ".join(line.strip() for line in result.stderr.splitlines()[-STDERR_TAIL:])
        raise ToolFailed(f"{what}: {Path(str(argv[0])).name} failed "
                         f"({describe_exit(result.returncode)}): {tail or 'no stderr'}")
    return result.stdout, result.stderr


def port_cell(adapter: Adapter, options: dict[str, Any], weight_type: str | Recipe
              ) -> tuple[str, dict[str, Any], str | None]:
    """The weight type and options a third-party port converts and runs a cell of
    ``weight_type`` with: a recipe's base type and the options under which its quantizer
    writes the recipe (:meth:`Adapter.recipe_options`); and why it cannot, or None.

    Raises:
        AudioparityError: options the recipe makes that the adapter refuses.
    """
    if not isinstance(weight_type, Recipe):
        return weight_type, options, None
    found = adapter.recipe_options(weight_type, options)
    if found is None:
        return weight_type.base, options, (
            f"{adapter.title}'s quantizer takes no type per tensor: it cannot write the recipe "
            f"{weight_type.weight_type}")
    return weight_type.base, adapter.check_options(
        found, f"adapter {adapter.name!r} options for {weight_type.weight_type}"), None


def convert(adapter_name: str, model: Path, weight_type: str | Recipe, output_dir: Path,
            options: dict[str, Any]) -> None:
    """The candidate's own model files for ``model`` at ``weight_type`` (a recipe: in its
    quantizer's syntax, :func:`port_cell`), written by its adapter's :meth:`~Adapter.convert`
    commands into ``output_dir`` (atomically: the commands write into a new empty folder
    beside it, renamed when they all succeed), and beside them the model files its run reads
    as the checkpoint's weights (:func:`~audioparity.candidates.model_file.write_storage`),
    which its quantized cells' reference computes with.

    Raises:
        AudioparityError: an unknown adapter, one that converts nothing, a recipe its quantizer
            cannot write, or a command that fails.
    """
    adapter = load_adapter(adapter_name)
    if not adapter.converts:
        raise AudioparityError(f"adapter {adapter.name!r} converts no model")
    options = adapter.check_options(options, f"adapter {adapter.name!r} options")
    kind, options, why = port_cell(adapter, options, weight_type)
    if why:
        raise AudioparityError(why)
    with built_directory(output_dir) as work:
        for argv in adapter.convert(Path(model), kind, work, options=options):
            run_tool(argv, {}, f"convert {model} for {adapter.name} ({type_name(weight_type)})")
        write_storage(adapter, work, options, kind)


@dataclass(frozen=True)
class CandidateRun:
    """One cell of a candidate, as ``candidate run`` was given it (options checked): its
    adapter, its family, and the :class:`ToolCall` of the cell, whose ``output`` is the dump
    directory and ``reference`` the case's reference dump."""

    adapter: Adapter
    family: Family
    call: ToolCall
    #: The recipe the cell runs (its weight type the recipe's base), None for a plain type.
    recipe: Recipe | None = None

    def commands(self, output: Path, reference: Path | None) -> list[Command]:
        """The adapter's commands for this cell, writing into ``output``, reading what
        :meth:`Adapter.prepare` gave (``reference``)."""
        return self.adapter.run(replace(self.call, output=output, reference=reference))


@dataclass(frozen=True)
class CandidateEntry:
    """A candidate as ``candidate run`` names it: its adapter (a shipped adapter's name, a
    ``.py`` file defining one, or an entry point), its family, and the family's options of the
    config section (the family's own port's options under its entry's)."""

    adapter: str
    family: str
    family_options: Mapping[str, Any] = field(default_factory=dict)


def run_candidate(port: CandidateEntry, model: Path, case: Path, output_dir: Path,
                  settings: RunSettings, reference_dir: Path | None = None) -> None:
    """One cell of a candidate into a dump of the contract at ``output_dir``; ``settings`` its
    weight type, backend, threads, its entry's options and the weights file to map.

    The family's own port (:attr:`Adapter.family_port`) is dumped by
    :func:`audioparity.dumping.driver.dump_ggml` in this process, its options the family's
    (``port.family_options``) with the entry's overriding them, and its weights mapped from
    ``settings.weights_file`` when given. A tool that writes the contract
    itself (output ``dump``) runs its commands with ``output_dir`` as their output. Any other
    runs its commands into ``<dump>/raw/``, whose files are read into the dump
    (:func:`~audioparity.candidates.reading.read_tool_output`); one that dies gives a
    ``crashed`` dump holding what it wrote before. A weight type or backend the adapter does
    not run gives an ``unavailable`` dump saying so (:meth:`Adapter.cannot_run`).

    Raises:
        AudioparityError: an unknown adapter or family, an adapter that does not implement the
            family, bad options, a tool that cannot start or writes what the adapter cannot
            read; for a tool of output ``dump``, one that fails or writes no dump.
    """
    from audioparity.models.registry import family

    adapter_name, family_name, options = port.adapter, port.family, settings.options
    weight_type, backend, threads = settings.weight_type, settings.backend, settings.threads
    adapter, spec = load_adapter(adapter_name), family(family_name).spec
    if spec.name not in adapter.families:
        raise AudioparityError(f"adapter {adapter.name!r} implements "
                               f"{', '.join(adapter.families)}, not {spec.name}")
    section = spec.check_options(port.family_options, f"family {spec.name} options")
    if adapter.family_port:
        merged = spec.check_options({**section, **options}, f"adapter {adapter.name!r} options")
        why = adapter.cannot_run(merged, type_name(weight_type).partition(RECIPE_SEPARATOR)[0],
                                 backend)
        if why:  # a weight type it makes none of (a tool's mix)
            _unavailable(CandidateRun(adapter, family(family_name), ToolCall(
                Path(model), Path(case), Path(output_dir), spec, section, merged,
                type_name(weight_type), backend, threads, reference_dir)), why)
            return
        _run_family_port(family(family_name), merged, Path(model),
                         [(Path(case), Path(output_dir), reference_dir)], settings)
        return
    if adapter.reads_reference and reference_dir is None:
        raise AudioparityError(f"{adapter.title} reads the reference dump of the case: give "
                               "--reference-dir")
    options = adapter.check_options(options, f"adapter {adapter.name!r} options")
    # a tool runs a recipe only through its own quantizer's syntax, at the recipe's base type
    kind, options, why = port_cell(adapter, options, weight_type)
    cell = CandidateRun(adapter, family(family_name), ToolCall(
        Path(model), Path(case), Path(output_dir), spec, section, options, kind, backend, threads,
        None if reference_dir is None else Path(reference_dir)),
        weight_type if isinstance(weight_type, Recipe) else None)
    if why:
        _unavailable(cell, why)
    elif adapter.output == "dump":
        _run_dump_tool(cell)
    else:
        _run_tool_cell(cell)


def run_candidate_cases(port: CandidateEntry, model: Path,
                        runs: Sequence[tuple[Path, Path, Path | None]],
                        settings: RunSettings) -> None:
    """Several cases of a candidate in one process, each ``(case file, dump directory,
    reference dump or None)`` of ``runs`` in order, for an adapter that runs several
    (:attr:`Adapter.several_cases`: the family's own port, through
    :func:`audioparity.dumping.driver.dump_ggml_cases`); otherwise as :func:`run_candidate`.

    Raises:
        AudioparityError: an adapter that runs one case per process, and as
            :func:`run_candidate`.
    """
    from audioparity.models.registry import family

    adapter, spec = load_adapter(port.adapter), family(port.family).spec
    if not adapter.several_cases:
        raise AudioparityError(f"adapter {adapter.name!r} runs one case per process; give one "
                               "--audio|--prompt")
    section = spec.check_options(port.family_options, f"family {spec.name} options")
    merged = spec.check_options({**section, **settings.options},
                                f"adapter {adapter.name!r} options")
    _run_family_port(family(port.family), merged, Path(model),
                     [(Path(case), Path(output), None if reference is None else Path(reference))
                      for case, output, reference in runs], settings)


def _run_family_port(family: Family, options: dict[str, Any], model: Path,
                     runs: Sequence[tuple[Path, Path, Path | None]], settings: RunSettings
                     ) -> None:
    """The family's ggml dump of each ``(case, dump directory, reference dump)`` in one
    process, as ``audioparity ggml <family>`` makes it (its ggml options)."""
    from audioparity.dumping.driver import dump_ggml_cases

    spec = family.spec
    if spec.ggml_reads_reference and any(reference is None for _, _, reference in runs):
        raise AudioparityError(f"the ggml port of {spec.name} reads the reference dump of the "
                               "case: give --reference-dir")
    dump_ggml_cases(family, model, [(case, output, reference if spec.ggml_reads_reference
                                     else None) for case, output, reference in runs],
                    replace(settings, options={option.name: options[option.name]
                                               for option in spec.options_for("ggml")}))


def _unavailable(cell: CandidateRun, why: str) -> None:
    """An ``unavailable`` dump of the cell, saying why."""
    with DumpWriter(cell.call.output, producer=cell.adapter.name, model=cell.call.model,
                    inputs={"case": cell.call.case}, fields=_fields(cell)) as writer:
        writer.set_status("unavailable", why)


def _fields(cell: CandidateRun) -> dict[str, Any]:
    recipe = ({"weight_type": cell.recipe.weight_type, "recipe": dict(cell.recipe.overrides)}
              if cell.recipe else {})
    call = cell.call
    return {"family": cell.family.spec.name, "candidate_adapter": cell.adapter.name,
            "backend": call.backend, "weight_type": call.weight_type, "threads": call.threads,
            "candidate_options": call.options, **recipe}


def _run_dump_tool(cell: CandidateRun) -> None:
    """A tool that writes the dump contract itself: its commands, the dump directory their output
    (its parent created, itself not).

    Raises:
        AudioparityError: a command fails (the workflow's guard records the cell ``crashed``),
            or they all succeed without writing the dump.
    """
    why = cell.adapter.cannot_run(cell.call.options, cell.call.weight_type, cell.call.backend)
    if why:
        _unavailable(cell, why)
        return
    commands = cell.commands(cell.call.output, cell.call.reference)
    cell.call.output.parent.mkdir(parents=True, exist_ok=True)
    for argv, env in commands:
        run_tool(argv, env, f"{cell.adapter.name} on {cell.call.case.name}")
    if not (cell.call.output / MANIFEST).is_file():
        raise AudioparityError(f"{cell.adapter.title}: its commands exited 0 but wrote no "
                               f"{cell.call.output / MANIFEST}; expected a dump of the contract")


def _run_tool_cell(cell: CandidateRun) -> None:
    """A tool that writes its own files: its commands run into ``<dump>/raw/`` (timed as a
    whole: :data:`~audioparity.candidates.reading.RUN_WALL`), stopping at the first that dies,
    and what they wrote and printed read into the dump, with the storage of the model file
    they read (:func:`~audioparity.candidates.model_file.model_storage`)."""
    adapter = cell.adapter
    why = adapter.cannot_run(cell.call.options, cell.call.weight_type, cell.call.backend)
    if why:
        _unavailable(cell, why)
        return
    with DumpWriter(cell.call.output, producer=adapter.name, model=cell.call.model,
                    inputs={"case": cell.call.case}, fields=_fields(cell)) as writer:
        for note in adapter.notes:
            writer.note(note)
        storage = model_storage(adapter, cell.call.model, cell.call.options, cell.call.weight_type)
        if storage is not None:
            record, hashes, lines = storage
            writer.add_storage(record, hashes)
            for line in lines:
                writer.note(f"storage: {line}")
        raw = writer.partial / "raw"
        raw.mkdir()
        reference = adapter.prepare(cell.call.reference, raw / "inputs", options=cell.call.options)
        commands = cell.commands(raw, reference)
        outputs, crash = [], None
        with writer.timed(RUN_WALL):
            for argv, env in commands:
                try:
                    outputs.append(run_tool(argv, env, f"{adapter.name} on {cell.call.case.name}"))
                except ToolFailed as err:  # it died: keep what it wrote before
                    crash = str(err)
                    break
        stdout, stderr = ("".join(part) for part in zip(*outputs, strict=True)) if outputs \
            else ("", "")
        (raw / "stdout.txt").write_text(stdout)
        (raw / "stderr.txt").write_text(stderr + (f"{crash}\n" if crash else ""))
        read_tool_output(writer, adapter, cell.call, raw, crash=crash, commands=len(commands))
