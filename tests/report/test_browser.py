"""The report page in a headless browser: its filters, set from the URL fragment, hide exactly
the columns and rows of the candidates and weight types left out, its script raises no error,
and it loads nothing from elsewhere.

Needs chromium (Debian: ``apt-get install chromium``); skipped without it unless
``AUDIOPARITY_REQUIRE_CHROMIUM=1``, which makes its absence a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from tests.report.sweep import CANDIDATES, STAGES, WEIGHT_TYPES, sweep_rows

#: The attributes the page's filters read, as the fragment names them.
FILTERED = {"data-candidate": "candidate", "data-backend": "backend",
            "data-weight-type": "weight_type"}


def chromium() -> str:
    """The chromium executable; skips the test without one (fails it where
    AUDIOPARITY_REQUIRE_CHROMIUM=1)."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        message = ("chromium is not installed (Debian: apt-get install chromium), so the page's "
                   "filters cannot be checked in a browser")
        if os.environ.get("AUDIOPARITY_REQUIRE_CHROMIUM") == "1":
            pytest.fail(message + "; AUDIOPARITY_REQUIRE_CHROMIUM=1 requires it")
        pytest.skip(message)
    return found


class Elements(HTMLParser):
    """Every start tag of a page: (tag, attributes), in document order, with its ancestors'
    ``hidden`` folded in (``shown`` False when it or an ancestor is hidden)."""

    VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta",
            "source", "track", "wbr"}

    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, dict[str, str | None], bool]] = []
        self.stack: list[tuple[str, bool]] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        attributes = dict(attrs)
        shown = "hidden" not in attributes and all(s for _, s in self.stack)
        self.found.append((tag, attributes, shown))
        if tag not in self.VOID:
            self.stack.append((tag, "hidden" not in attributes))

    def handle_endtag(self, tag: str) -> None:
        while self.stack:
            if self.stack.pop()[0] == tag:
                break


def dump_dom(page: Path, fragment: str) -> str:
    """The page's DOM after its scripts ran, as chromium serialises it."""
    result = subprocess.run(
        [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-extensions",
         "--dump-dom", f"{page.resolve().as_uri()}#{fragment}"],
        capture_output=True, text=True, timeout=180, check=False)
    assert result.returncode == 0 and "</html>" in result.stdout, result.stderr[-2000:]
    return result.stdout


@pytest.fixture
def page(request: pytest.FixtureRequest) -> Path:
    """The synthetic sweep's page (tests/report/conftest.py), written only where chromium is
    there to read it."""
    chromium()
    return request.getfixturevalue("sweep_page")


def parse(dom: str) -> Elements:
    elements = Elements()
    elements.feed(dom)
    return elements


def test_the_fragment_filters_hide_exactly_the_other_candidates_and_weight_types(page: Path):
    wanted = {"candidate": {"transcribe_cpp"}, "weight_type": {"q4_K", "q8_0"}}
    dom = dump_dom(page, "candidate=transcribe_cpp&weight_type=q4_K,q8_0")
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-filters="ready"' in body and "data-js-error" not in body, body
    elements = parse(dom).found

    filtered = [(tag, attrs, shown) for tag, attrs, shown in elements
                if any(a in attrs for a in FILTERED)]
    assert filtered
    for tag, attrs, _ in filtered:
        keep = all(attrs[a] in wanted[d] for a, d in FILTERED.items()
                   if a in attrs and d in wanted)
        assert ("hidden" not in attrs) == keep, (tag, attrs)

    # the status matrix: the columns of transcribe_cpp at q4_K and q8_0 only, its spanning
    # headers narrowed to them
    leaves = [(a["data-candidate"], a["data-backend"], a["data-weight-type"])
              for tag, a, shown in elements if tag == "th" and "leaf" in a.get("class", "")
              and shown]
    assert leaves == [("transcribe_cpp", "cpu", "q8_0"), ("transcribe_cpp", "cpu", "q4_K")]
    spans = [(a["colspan"], shown) for tag, a, shown in elements
             if tag == "th" and "span" in (a.get("class") or "").split()]
    assert [colspan for colspan, shown in spans if shown] == ["2", "2"]  # candidate, backend
    # the full table: the rows of those two cells, every stage of both cases
    rows = [a for tag, a, shown in elements if tag == "tr" and shown and "data-candidate" in a]
    full = {(a["data-candidate"], a["data-weight-type"]) for a in rows}
    assert full == {("transcribe_cpp", "q4_K"), ("transcribe_cpp", "q8_0")}
    all_rows = dom[dom.index('id="all-rows'):]
    shown_rows = parse(all_rows).found
    assert sum(1 for tag, a, shown in shown_rows if tag == "tr" and shown
               and "data-candidate" in a) == 2 * 2 * len(STAGES)
    # the causes: transcribe_cpp's at q3_K and port_b's crash are both filtered out
    assert not [a for tag, a, shown in elements if tag == "div" and a.get("class") == "cause"
                and shown]
    # the checkboxes say what the fragment chose (the script writes them on <body>)
    assert 'data-selection="candidate=transcribe_cpp&amp;weight_type=q8_0,q4_K"' in body


def test_without_a_filter_in_the_fragment_nothing_is_hidden(page: Path):
    dom = dump_dom(page, "weight-types")  # a section's anchor, not a filter
    assert 'data-filters="ready"' in re.search(r"<body[^>]*>", dom).group(0)
    body = re.search(r"<body[^>]*>", dom).group(0)
    assert 'data-hidden="0"' in body and 'data-selection=""' in body
    elements = parse(dom).found
    leaves = [a for tag, a, shown in elements if tag == "th" and "leaf" in a.get("class", "")
              and shown]
    # and Vulkan's f32 and q8_0, against the reference and against the CPU
    assert len(leaves) == len(CANDIDATES) * len(WEIGHT_TYPES) + 2 + 2
    causes = [a for tag, a, shown in elements if tag == "div" and a.get("class") == "cause"
              and shown]
    assert len(causes) == 2


def test_the_page_references_nothing_outside_itself(page: Path):
    dom = dump_dom(page, "candidate=port_b")
    for tag, attrs, _ in parse(dom).found:
        for name in ("src", "href", "action", "data", "poster", "srcset"):
            value = (attrs.get(name) or "").strip()
            assert not value or value.startswith(("data:", "#")), (tag, name, value[:80])
        assert tag not in ("link", "iframe", "object", "embed"), (tag, attrs)
        assert not (tag == "script" and "src" in attrs), attrs
    assert not re.search(r"url\(|@import|@font-face", dom, re.IGNORECASE)
    assert len(sweep_rows()) > 1000  # the page holds the full sweep, filtered or not
