"""Fresh against reused: a candidate that runs several cases in one process
(:attr:`~audioparity.candidates.Adapter.several_cases`) runs a model's cases again in one
process, each after another case or a second time, and every stage of each must be what the
candidate's fresh run of the case (its own process: the cell's dump) gave
(:mod:`audioparity.compare.fresh`). A KV cache, an LSTM state or a graph or compute buffer
kept from one case to the next fails it at the first stage that reads it.

The order (:func:`reuse_order`): the cases in reverse, then the first of those again, so that
with cases ``[A, B]`` the process runs B, A, B: A runs after another case and B a second time,
and each case is compared once (``[A]``: A, A). The process that runs them is a child of this
one, so one that dies (an abort, a segfault) is recorded in the rows (``crashed``), and the
sweep goes on.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from audioparity.compare.fresh import fresh_rows
from audioparity.contract.errors import AudioparityError
from audioparity.dumping.artifacts import Dump, write_text_atomic
from audioparity.dumping.guard import describe_exit, run_child
from audioparity.models.registry import family

log = logging.getLogger("audioparity")

#: The folder under the output that holds the runs (a run that passes is removed).
RUNS = "runs"


def reuse_order(cases: Sequence[str]) -> list[str]:
    """The order one process runs ``cases`` in: reversed, then the first of those again
    (``[A, B, C]`` -> ``[C, B, A, C]``; ``[A]`` -> ``[A, A]``). Each case but the first run
    comes after another case or after itself; each case is compared once.

    Raises:
        AudioparityError: no cases.
    """
    if not cases:
        raise AudioparityError("reuse: no case to run")
    order = list(reversed(cases))
    return [*order, order[0]]


def check_reuse(command: Sequence[str], fresh: Mapping[str, str | os.PathLike],
                output_dir: str | os.PathLike, labels: Mapping[str, str],
                bounds: Sequence[Mapping[str, Any]] = ()) -> None:
    """Run the cases of ``fresh`` again in one process, in :func:`reuse_order`, and write for
    each case ``<output_dir>/<case>.json``: its rows against its fresh dump
    (:func:`~audioparity.compare.fresh.fresh_rows`).

    Args:
        command: ``audioparity candidate run ...`` for the cell, without a case: each run's
            ``--audio|--prompt FILE [--reference-dir DIR] --output-dir DIR`` is appended, read
            from the fresh dump's manifest (``inputs``).
        fresh: case name -> the cell's fresh dump, in the config's order. A dump that is not
            ``ok`` (unavailable, crashed) has nothing to compare with: its case is left out.
        output_dir: a new folder; ``runs/<i>-<case>`` holds each run that differs.
        labels: the cell's labels but ``case`` (family, model, candidate, backend,
            weight_type).
        bounds: the config's ``reuse_bounds`` that match the cell (:func:`~audioparity.compare.
            fresh.bound_for`).

    Raises:
        AudioparityError: an unreadable fresh dump, one without its input's path, or an
            unknown family.
    """
    spec = family(labels["family"]).spec
    output = Path(output_dir)
    dumps = {name: Dump(path) for name, path in fresh.items()}
    ready = [name for name, dump in dumps.items() if dump.status == "ok"]
    output.mkdir(parents=True, exist_ok=True)
    if not ready:
        log.info("reuse: no fresh dump is ok; nothing to run again")
        return
    order = reuse_order(ready)
    runs = [output / RUNS / f"{index}-{name}" for index, name in enumerate(order)]
    argv = list(command)
    for name, run in zip(order, runs, strict=True):
        inputs = dumps[name].manifest.get("inputs", {})
        if spec.input not in inputs:
            raise AudioparityError(f"{dumps[name].path}: its manifest names no {spec.input} "
                                   "input to run again")
        argv += [spec.input_flag, inputs[spec.input]["path"],
                 *(["--reference-dir", inputs["reference"]["path"]]
                   if "reference" in inputs else []), "--output-dir", str(run)]
    log.info("reuse: running %s in one process", " ".join(order))
    returncode, tail = run_child(argv)
    died = (f"{describe_exit(returncode)}: {tail[-1] if tail else 'no stderr'}"
            if returncode else None)
    shutil.rmtree(runs[0], ignore_errors=True)  # the first run is a fresh one
    for name, run in zip(order[1:], runs[1:], strict=True):
        rows = fresh_rows(dumps[name].path, run, {**labels, "case": name}, bounds, died)
        write_text_atomic(output / f"{name}.json",
                          json.dumps(rows, indent=1, allow_nan=False) + "\n")
        failing = [row["stage"] for row in rows if row["status"] != "pass"]
        if failing:
            log.warning("reuse: %s run again differs from its fresh run at %s", name,
                        ", ".join(failing))
        else:
            shutil.rmtree(run, ignore_errors=True)
