"""The synthetic sweep's report page (tests/report/sweep.py), written once for the tests that
read it."""

from __future__ import annotations

from pathlib import Path

import pytest

from audioparity.report.html import write_html
from tests.report.sweep import write_sweep


@pytest.fixture(scope="session")
def sweep_page(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """index.html written from the synthetic sweep's summary.csv (beside it)."""
    folder = tmp_path_factory.mktemp("sweep_report")
    write_html(write_sweep(folder / "summary.csv"), folder / "index.html")
    return folder / "index.html"
