"""What a finished run prints: the stages per status, where the report is, and the culprit of
the first failing cells."""

from __future__ import annotations

import os
from pathlib import Path

#: Statuses of a stage compared with the reference that need attention.
FAILING = ("fail", "crashed", "missing")
CELL = ("family", "model", "case", "candidate", "backend", "weight_type")


def outcome(summary: str | Path, report: str | Path, culprits: int = 5) -> list[str]:
    """The lines a successful run ends with: the stages per status (against the reference,
    then per baseline), the report's path, and the culprit of the first ``culprits`` failing
    cells; none without a summary."""
    if not os.path.exists(summary):
        return []
    import pandas as pd

    rows = pd.read_csv(summary)
    parts = []
    for against, group in rows.groupby("against", sort=False):
        counts = ", ".join(f"{count} {status}"
                           for status, count in group["status"].value_counts().items())
        parts.append(counts if against == "reference" else f"against {against}: {counts}")
    lines = [f"audioparity: {'; '.join(parts)}; report: {os.path.abspath(report)}"]
    failing = rows[(rows["against"] == "reference") & rows["status"].isin(FAILING)]
    for _, cell in failing.drop_duplicates(list(CELL)).head(culprits).iterrows():
        lines.append(f"audioparity: culprit of {'/'.join(str(cell[key]) for key in CELL)}: "
                     f"{cell['culprit']}")
    return lines
