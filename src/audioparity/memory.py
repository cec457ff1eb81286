"""The host memory a process may use: what the machine has free, at most what the user (or the
job's scheduler) granted. Read by both sides' checks that refuse an input too large for it."""

from __future__ import annotations

import os
from pathlib import Path

#: Environment variable: the host memory (MB) a process may use for its activations, when less
#: than the machine has free (a job granted less by its scheduler).
MEMORY_LIMIT = "AUDIOPARITY_MEMORY_MB"


def host_free_bytes() -> int | None:
    """The host's ``MemAvailable`` (``/proc/meminfo``), at most :data:`MEMORY_LIMIT` MB; None
    when neither is known."""
    limits = []
    if os.environ.get(MEMORY_LIMIT):
        limits.append(int(os.environ[MEMORY_LIMIT]) * 2**20)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    return min(limits, default=None)
