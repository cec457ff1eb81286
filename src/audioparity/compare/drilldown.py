"""The drill-down of a cell one backend computes differently from another: the family's ggml
port run on both with every graph saved, the graphs run node by node on both backends
(:func:`audioparity.ggml.graphs.drill_down`) up to the first with an op that breaks, which is
named.

A drill-down folder holds ``drilldown.json`` (below), ``dumps/<backend>/`` (the two dumps, each
with its ``graphs/``) and ``repro/`` (the graph of the first bad op as both backends built it,
and the one command that reruns it: ``audioparity repro DIR --backend B``).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from pathlib import Path
from typing import TYPE_CHECKING, Any

from audioparity.contract.errors import AudioparityError
from audioparity.contract.family import Family
from audioparity.dumping.artifacts import built_directory, write_text_atomic
from audioparity.dumping.weight_files import type_name

if TYPE_CHECKING:
    from audioparity.dumping.driver import RunSettings

log = logging.getLogger("audioparity")

DRILLDOWN = "drilldown.json"
DUMPS = "dumps"
REPRO = "repro"
#: Row statuses a drill-down looks into: a stage that was compared and disagrees.
DRILLED = ("fail",)
#: How many stages a line of :func:`not_compared_text` names before it counts the rest.
NAMED_STAGES = 3


def failing_stages(cell: Path) -> list[str]:
    """The stages of a cell file (``audioparity compare`` rows) whose status is ``fail``.

    Raises:
        AudioparityError: an unreadable cell file.
    """
    from audioparity.compare.cell import read_cell

    return [row["stage"] for row in read_cell(cell) if row["status"] in DRILLED]


def not_compared(cell: Path, backend: str, against: str) -> list[dict[str, str]]:
    """The rows of a cell file (``backend``'s dump compared with ``against``'s) whose stage was
    not compared (:data:`~audioparity.contract.vocabulary.NOT_COMPARED`: a dump crashed, is
    unavailable, or lacks the stage), each as ``{side, stage, status, reason}``: ``side`` is
    ``against`` where that dump lacked the stage
    (:func:`~audioparity.compare.plan.lacked_by`), else ``backend``.

    Raises:
        AudioparityError: an unreadable cell file.
    """
    from audioparity.compare.cell import read_cell
    from audioparity.compare.plan import lacked_by
    from audioparity.contract.vocabulary import NOT_COMPARED

    return [{"side": against if lacked_by(str(row.get("reason") or ""), against) else backend,
             "stage": row["stage"], "status": row["status"], "reason": row.get("reason") or ""}
            for row in read_cell(cell) if row["status"] in NOT_COMPARED]


def not_compared_text(rows: Sequence[Mapping[str, str]]) -> str:
    """One line of :func:`not_compared`'s rows, those of one side, status and reason together:
    ``vulkan: layer_1 crashed (exit code -6: ...); vulkan: layer_2, layer_3, layer_4 and 5
    more missing (not computed: the dump crashed in layer_1 (...))``."""
    groups: dict[tuple[str, str, str], list[str]] = {}
    for row in rows:
        groups.setdefault((row["side"], row["status"], row["reason"]), []).append(row["stage"])
    parts = []
    for (side, status, reason), stages in groups.items():
        named = ", ".join(stages[:NAMED_STAGES])
        more = f" and {len(stages) - NAMED_STAGES} more" if len(stages) > NAMED_STAGES else ""
        parts.append(f"{side}: {named}{more} {status}" + (f" ({reason})" if reason else ""))
    return "; ".join(parts)


@dataclass(frozen=True)
class Drill:
    """What a drill-down compares and writes.

    Attributes:
        against: the ggml backend the cell is compared with.
        output_dir: the drill-down folder (module docstring), written atomically.
        cell: the cell's comparison with ``against`` (``audioparity compare --label
            against=...``): without a failing stage (and no ``phases``) nothing is run and
            ``drilldown.json`` says why: every stage agrees, or which were not compared.
        cell_output: where to write the cell's rows again, each failing row with its
            ``first_bad_op``.
        phases: only the graphs computed in the phases of these dump stages, shell patterns
            (:class:`~audioparity.contract.family.Phase`: ``pre_encode``, ``layer_*_isolated``,
            ...); default every graph.
    """

    against: str
    output_dir: Path
    cell: Path | None = None
    cell_output: Path | None = None
    phases: Sequence[str] = ()


def drill_cell(family: Family, model: Path, case: Path, settings: RunSettings, drill: Drill,
               reference_dir: Path | None = None) -> dict:
    """Drill into one cell of ``family``'s ggml port on ``settings.backend`` against
    ``drill.against``.

    Args:
        family: the family; its ggml port is run on both backends in this process.
        model, case, settings, reference_dir: the cell's dump, as ``audioparity ggml`` takes
            them (``reference_dir`` for a family whose dump reads it).
        drill: what is compared and written (:class:`Drill`).

    Returns:
        What ``drilldown.json`` holds: ``status`` (``drilled``; ``not needed`` when every stage
        was compared and agrees; ``not drilled`` when ``backend`` is ``against``, or when no
        stage fails but some were not compared, ``reason`` naming them: a cell whose dump
        crashed never agrees), the failing stages, the stages not compared
        (:func:`not_compared`), per graph compared (up to the first with a bad op) its phase,
        outputs, structure and every node's NMSE, and the cell's ``first_bad`` and
        ``first_not_float32`` nodes.

    Raises:
        AudioparityError: an unreadable cell, a dump the port refuses, or graphs that cannot be
            paired (the two dumps computed different numbers of graphs in a phase asked for).
    """
    backend, against, cell, phases = settings.backend, drill.against, drill.cell, drill.phases
    output_dir = drill.output_dir
    failing = failing_stages(cell) if cell is not None else []
    missed = not_compared(cell, backend, against) if cell is not None else []
    result: dict[str, Any] = {"backend": backend, "against": against,
                              "weight_type": type_name(settings.weight_type),
                              "failing_stages": failing, "not_compared": missed}
    with built_directory(output_dir) as out:
        if cell is not None and not failing and missed and not phases:
            result.update(status="not drilled",
                          reason=f"no stage fails, but {len(missed)} were not compared with "
                          f"{against}: {not_compared_text(missed)}")
        elif cell is not None and not failing and not phases:
            result.update(status="not needed",
                          reason=f"every stage agrees with {against} within its gate")
        elif backend == against:
            result.update(status="not drilled",
                          reason=f"the cell runs on {against} too (a backend setting that "
                          "differs by its environment): both sides of a drill-down would run "
                          "the same ops in this one process")
        else:
            result.update(status="drilled", **_drill(family, out, Path(output_dir), model=model,
                                                     case=case, reference_dir=reference_dir,
                                                     settings=settings, drill=drill))
        write_text_atomic(out / DRILLDOWN, json.dumps(result, indent=1, default=str) + "\n")
    if drill.cell_output is not None:
        _rows_with_first_bad_op(cell, drill.cell_output, result)
    log.info("drilldown %s on %s vs %s: %s", output_dir, backend, against,
             first_bad_text(result) or result["status"])
    return result


def _drill(family: Family, out: Path, final: Path, *, model: Path, case: Path,
           reference_dir: Path | None, settings: RunSettings, drill: Drill) -> dict:
    """The drill-down into ``out`` (built in place of ``final``, the folder it becomes)."""
    from audioparity.dumping.driver import dump_ggml
    from audioparity.ggml import capturing_graphs
    from audioparity.ggml.graphs import GRAPHS, GraphCapture

    backend, against, phases = settings.backend, drill.against, drill.phases
    device, threads = settings.device, settings.threads
    dumps = {}
    with capturing_graphs(GraphCapture.of_dump):
        for name in (against, backend):
            dumps[name] = out / DUMPS / name
            dump_ggml(family, model, case, dumps[name], replace(settings, backend=name),
                      reference_dir)
    pairs = _pairs(dumps[against] / GRAPHS, dumps[backend] / GRAPHS, phases)
    graphs = _compare_graphs(pairs, against, backend, device, threads, out)
    first_bad = next(({**(g.get("first_bad") or {"verdict": "aborted", "why": g["aborted"]}),
                       "graph": g["graph"], "phase": g["phase"]}
                      for g in graphs if g.get("first_bad") or g.get("aborted")), None)
    first_f32 = next(({**g["first_not_float32"], "graph": g["graph"], "phase": g["phase"]}
                      for g in graphs if g.get("first_not_float32")), None)
    for node in (first_bad, first_f32):
        if node is not None and "nmse" in node:
            node["cause"] = kernel_cause(dumps[backend], node)
    shown = first_bad or first_f32
    chosen = next((pair for pair in pairs if shown and pair[0].name == str(shown["graph"])),
                  pairs[0] if pairs else None)
    repro = _write_repro(out / REPRO, final / REPRO, chosen, against, backend) if chosen else None
    return {"graphs": graphs, "first_bad": first_bad, "first_not_float32": first_f32,
            "repro": repro}


def kernel_cause(dump: Path, node: Mapping[str, Any]) -> str | None:
    """Why a drill-down's ``node`` (``graph``, ``position``) differs, as the kernel the
    backend of ``dump`` (a drill-down's dump, with its ``graphs/``) computed it with says:
    TF32 on CUDA (:func:`audioparity.ggml.cuda.node_cause`); None where it says nothing."""
    from audioparity.dumping.artifacts import Dump
    from audioparity.ggml.cuda import node_cause
    from audioparity.ggml.graphs import GRAPH, GRAPHS

    description = json.loads((Path(dump) / GRAPHS / str(node["graph"]) / GRAPH).read_text())
    return node_cause(description, int(node["position"]), Dump(dump).manifest)


def _pairs(baseline: Path, target: Path, phases: Sequence[str]) -> list[tuple[Path, Path]]:
    """The saved graphs of both dumps, paired in compute order (only those computed in a
    phase that one of ``phases``, shell patterns, matches, if given)."""
    def listed(folder: Path) -> list[Path]:
        if not folder.is_dir():
            return []
        return sorted((p for p in folder.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))

    base, other = listed(baseline), listed(target)
    if len(base) != len(other):
        raise AudioparityError(f"{target}: {len(other)} graphs; {baseline} has {len(base)}: the "
                               "two backends did not compute the same sequence of graphs")
    pairs = list(zip(base, other, strict=True))
    if phases:
        from audioparity.ggml.graphs import GRAPH

        pairs = [pair for pair in pairs
                 if any(fnmatchcase(json.loads((pair[1] / GRAPH).read_text()).get("phase") or "",
                                    pattern) for pattern in phases)]
        if not pairs:
            raise AudioparityError(f"{target}: no graph computed in {', '.join(phases)}")
    return pairs


def _compare_graphs(pairs: list[tuple[Path, Path]], against: str, backend: str, device: int,
                    threads: int, out: Path) -> list[dict]:
    """The pairs through :func:`audioparity.ggml.graphs.drill_down` in a child process, up to
    the first graph with a bad op (:func:`~audioparity.ggml.graphs.drill_pairs`): an op ggml
    cannot run as given aborts the process (a failed GGML_ASSERT), so a child that dies leaves
    a record of the graph it died in, which ends the drill-down as a bad op does."""
    work = out / "work"
    work.mkdir(exist_ok=True)
    listing, done = work / "pairs.json", work / "done.jsonl"
    listing.write_text(json.dumps([[k, str(a), str(b)] for k, (a, b) in enumerate(pairs)]))
    run = subprocess.run(
        [sys.executable, "-m", "audioparity.ggml.graphs", str(listing), str(done),
         "--baseline", against, "--target", backend, "--device", str(device),
         "--threads", str(threads)],
        capture_output=True, text=True, env={**os.environ, "GGML_NO_BACKTRACE": "1"})
    results = [json.loads(line) for line in done.read_text().splitlines()] if (
        done.exists()) else []
    answered = bool(results) and bool(results[-1].get("first_bad"))
    if run.returncode != 0 and not answered:
        if len(results) == len(pairs):
            raise AudioparityError(f"drill-down of {out}: {_last_line(run.stderr)}")
        k, folder = len(results), pairs[len(results)][1]
        why = _last_line(run.stderr) or f"exit status {run.returncode}"
        results.append({"graph": k, "phase": _phase(folder), "aborted": why})
        log.warning("drilldown: graph %s (%s) stopped: %s", k, folder, why)
    shutil.rmtree(work)
    return results


def _phase(folder: Path) -> str | None:
    from audioparity.ggml.graphs import GRAPH

    try:
        return json.loads((Path(folder) / GRAPH).read_text()).get("phase")
    except (OSError, json.JSONDecodeError):
        return None


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _write_repro(folder: Path, final: Path, pair: tuple[Path, Path], against: str,
                 backend: str) -> dict:
    """The graph of the first bad op as both backends' cells built it, and its command (which
    names ``final``, where ``folder`` ends up)."""
    folder.mkdir()
    for name, source in zip((against, backend), pair, strict=True):
        shutil.copytree(source, folder / name)
    command = f"audioparity repro {final} --backend {backend} --against {against}"
    (folder / "README.txt").write_text(
        f"One ggml graph of a drill-down, as the {against} and the {backend} cells built it\n"
        f"(graph.json, inputs/*.npy, leafs.gguf: its weights and state in their ggml types).\n"
        f"Rerun it node by node on {backend} against {against}:\n\n    {command}\n")
    return {"folder": str(final), "command": command}


def first_bad_text(result: Mapping[str, Any]) -> str:
    """One line naming a drill-down's first bad op (empty when it found none):
    ``MUL_MAT #57 (encoder, feeds layer_0): NMSE 3.1e-03 > 5e-04``, or, when every op is within
    ggml's tolerance, the first that did not compute in float32; with the node's ``cause``
    where the backend's kernel names one (:func:`kernel_cause`): ``MUL_MAT #6 (...): NMSE
    3e-07: TF32 (cuBLAS in TF32 math mode; ...)``."""
    node = result.get("first_bad")
    if node is None and result.get("first_not_float32") is None:
        return ""
    if node is None:
        node = result["first_not_float32"]
        verdict = f"NMSE {_g(node['nmse'])}: " + (node.get("cause") or (
            f"not float32 (ggml's tolerance {_g(node['threshold'])})"))
    elif node["verdict"] == "aborted":
        return f"the drill-down of graph {node['graph']} ({node['phase']}) stopped: {node['why']}"
    elif node["verdict"] == "leaf differs":
        return (f"weight {node['name']} ({node['phase']}) differs between the two graphs"
                + (f": NMSE {_g(node['nmse'])}" if node.get("nmse") is not None else ""))
    elif "nmse" in node:
        verdict = f"NMSE {_g(node['nmse'])} > {_g(node['threshold'])}" + (
            f": {node['cause']}" if node.get("cause") else "")
    else:
        verdict = node["verdict"]
    if node["verdict"] == "not finite in the baseline":
        verdict = f"finite here, not on the baseline backend (NMSE {_g(node['nmse'])})"
    feeds = f"feeds {node['feeds']}" if node["feeds"] else "feeds no output: a state write"
    return f"{node['op']} #{node['position']} ({node['phase']}, {feeds}, {node['type']} " \
           f"{node['shape']}): {verdict}"


def _g(value: float | str) -> str:
    """A metric for a line: 2 significant digits; ``nan`` and ``inf`` as they are."""
    return value if isinstance(value, str) else f"{value:.2g}"


def _rows_with_first_bad_op(cell: Path | None, output: Path, result: Mapping[str, Any]) -> None:
    """The cell's rows again, each failing row with ``first_bad_op``."""
    if cell is None:
        raise AudioparityError("a drill-down writes a cell's rows only when given the cell")
    rows = json.loads(Path(cell).read_text())
    text = first_bad_text(result)
    for row in rows:
        if row["status"] in DRILLED and text:
            row["first_bad_op"] = text
    write_text_atomic(Path(output), json.dumps(rows, indent=1) + "\n")


def rerun_repro(folder: Path, backend: str, against: str = "cpu", device: int = 0,
                threads: int = 1) -> str:
    """Rerun a repro folder's graph node by node on ``backend`` against ``against``: the graph
    each backend's cell built (``folder/<backend>/``, ``folder/<against>/``; one of them, or a
    folder written by :func:`audioparity.ggml.graphs.save_graph` itself, serves both sides).
    Returns the report: the first bad op, the first that did not compute in float32, the
    largest NMSE.

    Raises:
        AudioparityError: the folder holds no saved graph, or one ggml cannot rebuild.
    """
    from audioparity.ggml.graphs import GRAPH, drill_pairs

    folder = Path(folder)
    sides = {name: folder / name for name in (against, backend) if (folder / name / GRAPH).exists()}
    if not sides and not (folder / GRAPH).exists():
        raise AudioparityError(f"{folder}: no saved graph ({GRAPH}, or {against}/ and "
                               f"{backend}/ folders holding one)")
    base = sides.get(against) or sides.get(backend) or folder
    target = sides.get(backend) or base
    done = folder.parent / f".{folder.name}.rerun.jsonl"
    done.unlink(missing_ok=True)
    try:
        drill_pairs([(0, base, target)], done, against, backend, device, threads)
        result = json.loads(done.read_text())
    finally:
        done.unlink(missing_ok=True)
    def located(key: str) -> dict | None:
        return {**result[key], "phase": result["phase"]} if result[key] else None

    first_bad = first_bad_text({"first_bad": located("first_bad"), "first_not_float32": None})
    first_f32 = first_bad_text({"first_bad": None,
                                "first_not_float32": located("first_not_float32")})
    lines = [f"{target}: {len(result['nodes'])} nodes on {backend} against {against} "
             f"({result['structure']})",
             "first bad op: " + (first_bad or "none above ggml's tolerance"),
             f"first op not in float32: {first_f32 or 'none'}"]
    worst = result["worst"]
    if worst:
        lines.append(f"largest NMSE: {worst['op']} #{worst['position']} ({_g(worst['nmse'])})")
    return "\n".join(lines)
