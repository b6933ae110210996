"""The status page of `edgereg serve`, rendered by a real headless chromium.

Desktop (1280 px) and phone (390 px) screenshots go to test-artifacts/. The
phone check measures the layout: the page is loaded into a 390 px wide
``srcdoc`` frame of a probe page whose script writes the frame document's
``scrollWidth`` into the DOM chromium dumps (the page itself runs no script;
its CSP forbids them). Headless chromium will not make its window narrower
than 500 px, so the frame is what makes the width exact.
"""

from __future__ import annotations

import re
from html import escape
from http.client import HTTPConnection
from pathlib import Path
from urllib.parse import urlsplit

import browser
from servekit import make_registry, serve
from test_serve import _operator_registry

from edgereg.config import RolloutPolicy

PHONE = 390
DESKTOP = 1280


def _get_page(url: str) -> str:
    parts = urlsplit(url)
    conn = HTTPConnection(parts.hostname, parts.port, timeout=10)
    try:
        conn.request("GET", "/")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def _layout_width(page: str, width: int, where: Path) -> tuple[int, int]:
    """(scrollWidth, clientWidth) of ``page`` laid out ``width`` px wide, in chromium."""
    probe = (
        "<!doctype html><html><body>"
        f'<iframe id="page" style="width:{width}px;height:2000px;border:0" '
        f'srcdoc="{escape(page, quote=True)}"></iframe>'
        "<script>window.addEventListener('load', function () {"
        "var d = document.getElementById('page').contentDocument.documentElement;"
        "document.body.setAttribute('data-layout', d.scrollWidth + 'x' + d.clientWidth);"
        "});</script></body></html>"
    )
    where.write_text(probe)
    found = re.search(r'data-layout="(\d+)x(\d+)"', browser.dump_dom(where.as_uri()))
    assert found, "the probe page did not measure the layout"
    return int(found.group(1)), int(found.group(2))


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


def test_operator_page_fits_desktop_and_phone(tmp_path: Path) -> None:
    registry, _ = _operator_registry(tmp_path / "registry", expires_days=3650)
    with serve(registry.storage, policy=lambda _m: RolloutPolicy()) as url:
        page = _get_page(url)
        dom = browser.dump_dom(url + "/")
        desktop = browser.screenshot(
            url + "/", browser.artifact_path("operator-page.png"), width=DESKTOP, height=1400
        )
        phone = browser.screenshot(
            url + "/", browser.artifact_path("operator-page-phone.png"), width=PHONE, height=2400
        )
    for text in ("3/3 passed", "accuracy 0.97", "+0.02 vs stable", "edgereg rollout digits"):
        assert text in dom, text
    assert "get no model" in dom  # the canary-only model's warning
    assert browser.is_png(desktop)
    assert browser.is_png(phone)
    assert desktop.stat().st_size > 15_000
    assert phone.stat().st_size > 15_000
    # Every table scrolls inside its own box, so nothing widens the page.
    assert page.count("<table") == page.count('<div class="scroll"><table')
    for width in (PHONE, DESKTOP):
        scroll, client = _layout_width(page, width, tmp_path / f"probe-{width}.html")
        assert client == width
        assert scroll <= client, f"the page is {scroll} px wide in a {width} px viewport"
    # The probe measures what it claims: without the scroll boxes the phone page overflows.
    unboxed = page.replace('<div class="scroll">', "<div>")
    scroll, client = _layout_width(unboxed, PHONE, tmp_path / "probe-unboxed.html")
    assert scroll > client
