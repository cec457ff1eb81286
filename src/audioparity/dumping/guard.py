"""Crash isolation for dump commands: a dump process that dies becomes a ``crashed`` dump.

A ggml assert calls ``abort()``, a bad kernel segfaults, a big model runs out of memory: the
process is gone, and with it anything it would have reported. The guard runs the dump command
as a child process, passes its stderr through (to the job's log), and when the child exits
non-zero or is killed by a signal it makes a dump directory of what the child left: whose
manifest says ``status: crashed``, the signal or exit code, the last lines of stderr, and, when
the child's :class:`~audioparity.dumping.artifacts.DumpWriter` had got that far, the stages it
finished (kept, and compared) and the one it died in (``crashed_in``). The guard then exits 0, so
the sweep goes on and the report shows what the cell computed and where it crashed.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

from audioparity.dumping.artifacts import (
    CRASHED_IN,
    MANIFEST,
    RUNNING,
    DumpWriter,
    write_text_atomic,
)

log = logging.getLogger("audioparity")

#: Lines of the child's stderr kept in the manifest of a crashed dump.
STDERR_TAIL_LINES = 20


def describe_exit(returncode: int) -> str:
    """``"signal SIGABRT (6)"`` for a negative return code, ``"exit code 1"`` otherwise."""
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        return f"signal {name} ({-returncode})"
    return f"exit code {returncode}"


def run_child(command: list[str]) -> tuple[int, list[str]]:
    """Run ``command``, its stderr passed through to ours: its return code (negative: the
    signal that killed it) and the last :data:`STDERR_TAIL_LINES` lines of its stderr."""
    tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL_LINES)
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True, errors="replace") as child:
        assert child.stderr is not None
        for line in child.stderr:
            sys.stderr.write(line)
            tail.append(line.rstrip("\n"))
    return child.wait(), list(tail)


def run_guarded(command: list[str], output_dir: Path, fields: dict | None = None) -> int:
    """Run ``command``; on failure write a ``crashed`` dump at ``output_dir``.

    Args:
        command: argv of the dump command (it must write ``output_dir`` when it succeeds).
        output_dir: the dump directory the command is expected to produce.
        fields: manifest fields of the crashed dump (e.g. backend, weight_type).

    Returns:
        0 when the command succeeded or its crash was recorded. The child's own return code
        when it succeeded but left no dump (a broken external tool), so that is not hidden.
    """
    returncode, tail = run_child(command)
    if returncode == 0:
        if not (output_dir / "manifest.json").is_file():
            log.error("%s exited 0 but wrote no %s/manifest.json", command[0], output_dir)
            return 1
        return 0
    reason = describe_exit(returncode)
    message = f"{reason}: {tail[-1] if tail else 'no stderr'}"
    log.warning("dump command %s: %s; recording the cell as crashed", reason, command[0])
    shutil.rmtree(output_dir, ignore_errors=True)
    partial = output_dir.with_name(output_dir.name + ".partial")
    if _keep_partial(partial, output_dir, message, command, tail, fields or {}):
        return 0
    with DumpWriter(output_dir, producer="guard", fields=fields) as writer:
        writer.set_status("crashed", message)
        writer.manifest["command"] = command
        writer.manifest["stderr_tail"] = list(tail)
    return 0


def _keep_partial(partial: Path, output_dir: Path, message: str, command: list[str],
                  tail: list[str], fields: dict) -> bool:
    """Make the child's partial dump the crashed dump when its manifest is there: the stages it
    lists are finished (each file written before it was listed), ``crashed_in`` is the stage it
    was timing. False when there is none to keep."""
    try:
        manifest = json.loads((partial / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return False
    if not isinstance(manifest, dict):
        return False
    running = manifest.pop(RUNNING, None)
    manifest.update(fields, status="crashed", message=message, command=command,
                    stderr_tail=tail, **({CRASHED_IN: running} if running else {}))
    write_text_atomic(partial / MANIFEST, json.dumps(manifest, indent=1, default=str) + "\n")
    os.replace(partial, output_dir)
    log.warning("%s: kept %d finished stage(s) of the crashed dump%s", output_dir,
                len(manifest.get("tensors", {})) + len(manifest.get("documents", {})),
                f", crashed in {running}" if running else "")
    return True
