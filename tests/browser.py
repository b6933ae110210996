"""A real headless browser for tests: Debian's chromium, driven through its own CLI.

``screenshot(url, png)`` saves what the page looks like; ``dump_dom(url)``
returns the DOM after the page has loaded (scripts run, SVG parsed), to check
what rendered. When chromium is missing, both FAIL the test with the command
that installs it: a browser test that silently skips tests nothing.

Screenshots go under ``test-artifacts/`` at the top of the checkout
(gitignored); :func:`artifact_path` creates it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = REPO_ROOT / "test-artifacts"
#: Where Debian's package puts it; PATH is searched as a fallback.
CHROMIUM = Path("/usr/bin/chromium")
INSTALL_HINT = (
    "chromium is not installed; the browser tests need it. Install Debian's package: "
    "sudo apt-get update && sudo apt-get install -y chromium"
)
#: No network, no first-run chatter, no background services: the page alone.
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--hide-scrollbars",
)
TIMEOUT = 60.0


def chromium() -> str:
    """The chromium executable; fails the test (with how to install it) when absent."""
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return str(CHROMIUM)
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(INSTALL_HINT, pytrace=False)


def artifact_path(name: str) -> Path:
    """A path under test-artifacts/ (created) for a screenshot or page."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name


def _run(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    with tempfile.TemporaryDirectory(prefix="chromium-profile-") as profile:
        args = [chromium(), *FLAGS, f"--user-data-dir={profile}", *extra, url]
        try:
            done = subprocess.run(
                args,
                capture_output=True,
                text=True,
                timeout=TIMEOUT,
                check=False,
                # chromium's crash reporter and dbus lookups read these.
                env={**os.environ, "HOME": profile},
            )
        except subprocess.TimeoutExpired:
            pytest.fail(f"chromium did not finish {url} within {TIMEOUT:g}s", pytrace=False)
    if done.returncode != 0:
        pytest.fail(
            f"chromium exited {done.returncode} on {url}:\n{done.stderr[-3000:]}", pytrace=False
        )
    return done


def screenshot(url: str, png: Path | str, *, width: int = 1280, height: int = 2000) -> Path:
    """Render ``url`` headless and save a ``width``×``height`` PNG screenshot to ``png``."""
    target = Path(png).resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    _run(url, f"--screenshot={target}", f"--window-size={width},{height}")
    if not target.is_file() or target.stat().st_size == 0:
        pytest.fail(f"chromium wrote no screenshot of {url} to {target}", pytrace=False)
    return target


def dump_dom(url: str) -> str:
    """The serialised DOM of ``url`` after it loaded, as chromium's --dump-dom prints it."""
    dom = _run(url, "--dump-dom").stdout
    if "<html" not in dom.lower():
        pytest.fail(f"chromium printed no DOM for {url}", pytrace=False)
    return dom


def is_png(path: Path) -> bool:
    """Whether ``path`` starts with the PNG signature."""
    with path.open("rb") as handle:
        return handle.read(8) == b"\x89PNG\r\n\x1a\n"
