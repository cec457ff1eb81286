"""Comparison of a candidate dump with its reference: metrics, gates, and one cell's rows."""

from audioparity.compare.cell import COLUMNS, compare_cell
from audioparity.compare.gates import resolve_gates, status

__all__ = ["COLUMNS", "compare_cell", "resolve_gates", "status"]
