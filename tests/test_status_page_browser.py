"""The status page of `edgereg serve`, rendered by a real headless chromium."""

from __future__ import annotations

import re
from pathlib import Path

import browser
from servekit import make_registry, serve


def test_status_page_renders_in_a_real_browser(tmp_path: Path) -> None:
    fake = make_registry(tmp_path / "registry")
    with serve(fake.storage) as url:
        dom = browser.dump_dom(url + "/")
        png = browser.screenshot(url + "/", browser.artifact_path("status-page.png"))
    # The browser ran the page: the DOM it serialises is the rendered document.
    assert "<title>" in dom
    for model in ("digits", "sensor"):
        assert model in dom
    for text in ("1.0.0", "1.1.0", "5%", "high", "mid", "low", "published --full"):
        assert text in dom, text
    assert "release-bot@ci" not in dom  # who acted stays in the signed history
    # One row per tier and model in the tier tables.
    assert len(re.findall(r"<tr", dom)) >= 6
    assert browser.is_png(png)
    assert png.stat().st_size > 15_000  # a blank page is a few KB
