"""The test suite, laid out as src/audioparity is: one folder per package, one per model family
under models/. Shared session fixtures live in conftest.py."""

from pathlib import Path

import yaml

#: The checkout, and the small inputs it ships (the speech clip, the MOSS prompts).
REPO = Path(__file__).resolve().parent.parent
RESOURCES = REPO / "resources"
#: The MOSS prompt files the default sweep uses.
MOSS_PROMPTS = sorted((RESOURCES / "moss").glob("*.json"))


def config_gates(family: str, weight_type: str, model: str = "tiny") -> dict:
    """The gates config/config.yaml gives ``model`` of ``family`` on the CPU at ``weight_type``
    (:func:`audioparity.compare.resolve_gates`)."""
    from audioparity.compare.gate_lists import resolve_gates
    from audioparity.compare.plan import CellKey

    config = yaml.safe_load((REPO / "config/config.yaml").read_text())
    return resolve_gates(config[family], CellKey(family, model, "audioparity", "cpu",
                                                 weight_type, ""))


def cell_rows(reference: Path, candidate: Path, output: Path, family: str = "parakeet_tdt",
              weight_type: str = "f32", cost: Path | None = None) -> dict[str, dict]:
    """{stage: row} of ``candidate`` compared with ``reference`` under the gates the default
    config gives ``family`` at ``weight_type`` (``cost``: the float32 reference of a quantized
    cell), the cell written to ``output``."""
    import json

    from audioparity.compare.cell import compare_cell
    from audioparity.compare.plan import CellDumps

    compare_cell(CellDumps(reference, candidate, cost=cost), config_gates(family, weight_type),
                 {"family": family}, output)
    return {row["stage"]: row for row in json.loads(Path(output).read_text())}
