"""summary.csv from the cells' results, and the self-contained index.html built from it."""

from audioparity.report.html import write_html
from audioparity.report.summary import write_summary

__all__ = ["write_html", "write_summary"]
