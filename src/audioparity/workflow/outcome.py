"""What a finished run prints: the stages per status, where the report is, and every cause
that needs attention, with how many cells it covers, across every comparison (with the
reference, another backend, a fresh run, another reference)."""

from __future__ import annotations

import os
from pathlib import Path


def outcome(summary: str | Path, report: str | Path) -> list[str]:
    """The lines a successful run ends with: the stages per status (against the reference,
    then per other ``against``), the report's path, and each cause of the rows that need
    attention (:func:`audioparity.report.attention.causes`: each cell's culprits one by one,
    their measured values left out) with the cells it covers, per ``against``, the cause of
    most cells first; none without a summary."""
    if not os.path.exists(summary):
        return []
    import pandas as pd

    from audioparity.report.attention import causes

    rows = pd.read_csv(summary, dtype=str, keep_default_na=False)
    parts = []
    for against, group in rows.groupby("against", sort=False):
        counts = ", ".join(f"{count} {status}"
                           for status, count in group["status"].value_counts().items())
        parts.append(counts if against == "reference" else f"against {against}: {counts}")
    lines = [f"audioparity: {'; '.join(parts)}; report: {os.path.abspath(report)}"]
    for against, group in rows.groupby("against", sort=False):
        found = causes(group.to_dict("records"))
        if not found:
            continue
        cells = {(c.labels.get("family"), c.labels.get("model"), case, c.labels.get("candidate"),
                  c.labels.get("backend"), c.labels.get("weight_type"))
                 for cause in found for c in cause.covered for case in c.cases}
        lines.append(f"audioparity: against {against}: {len(found)} cause(s) in "
                     f"{len(cells)} cell(s)")
        for cause in sorted(found, key=lambda c: -sum(len(line.cases) for line in c.covered)):
            covered = ["/".join(c.labels[key] for key in ("model", "candidate", "backend",
                                                          "weight_type"))
                       + f" ({', '.join(c.cases)})" for c in cause.covered]
            count = sum(len(c.cases) for c in cause.covered)
            lines.append(f"audioparity:   {count} cell(s): {cause.text} [{'; '.join(covered)}]")
    return lines
