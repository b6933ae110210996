"""The status page shows a rollout's canary health from device reports (real HTTP, real SQLite)."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path
from typing import Any

import pytest
from servekit import FakeRegistry, make_registry, serve

from edgereg.reports import open_store
from edgereg.serve._ratelimit import RateLimiter

GENEROUS = RateLimiter(10_000, 10_000)


@pytest.fixture
def reg(tmp_path: Path) -> FakeRegistry:
    # digits: stable 1.0.0 everywhere, candidate 1.1.0 a 5% canary.
    return make_registry(tmp_path / "registry", models=("digits",))


def _report(n: int, arm: str, **fields: Any) -> bytes:
    version = "1.1.0" if arm == "candidate" else "1.0.0"
    data: dict[str, Any] = {
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": version,
        "unit_version": version,
        "variant": "high-int8",
        "tier": "high",
        "arm": arm,
        "sequence": 2,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": 12.0,
        "inference": {"count": 20, "p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 4.0},
        "confirmed": True,
    }
    data.update(fields)
    return json.dumps(data).encode()


def _request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, str]:
    conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
    try:
        headers = {"Content-Type": "application/json"} if body is not None else {}
        conn.request(method, path, body=body, headers=headers)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def _health_rows(page: str, tier: str = "high") -> dict[str, list[str]]:
    """guardrail -> its cells (candidate, stable, result) for ``tier`` in the health table."""
    section = page.split("<h3>Canary health</h3>", 1)[1].split("</table>", 1)[0]
    rows: dict[str, list[str]] = {}
    current = ""
    for row in re.findall(r"<tr>(.*?)</tr>", section, flags=re.S)[1:]:
        cells = [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        current = cells[0].removesuffix(" (judged within the pool)") or current
        if current == tier:
            rows[cells[4].removesuffix(" (critical)")] = cells[5:]
    return rows


def test_each_arm_and_guardrail_of_a_tier_with_its_verdict(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    store_url = f"sqlite:///{tmp_path}/reports.sqlite"
    with (
        open_store(store_url) as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        # 1000 stable devices with no probe failure; 1000 candidates, 300 of them failed it
        # (a pass needs about 500 devices per arm; 1000 show a load-failure rate within
        # one point).
        for n in range(1000):
            assert _request(url, "POST", "/v1/reports", _report(n, "stable"))[0] == 202
        # 100 more started twice without a confirmation (report schema 2): stalled.
        for n in range(1000, 2000):
            failed = n < 1300
            stalled = {"schema_version": 2, "unconfirmed_starts": 2} if 1300 <= n < 1400 else {}
            body = _report(
                n,
                "candidate",
                probe="failed" if failed else "passed",
                backend=None if failed else "cpu",
                confirmed=not failed and not stalled,
                **stalled,
            )
            assert _request(url, "POST", "/v1/reports", body)[0] == 202
        status, page = _request(url, "GET", "/")
    assert status == 200
    assert "candidate 1.1.0 vs stable 1.0.0" in page
    rows = _health_rows(page)
    assert rows["probe_failure"] == ["30.0% of 1000 networks", "0.0% of 1000 networks", "fail"]
    assert rows["load_failure"][2] == "pass"
    assert rows["unconfirmed"] == ["10.0% of 1000 networks", "0.0% of 1000 networks", "fail"]
    assert rows["load_ms"][:2] == [rows["load_ms"][1], rows["load_ms"][1]]  # same latencies
    # The same analysis `edgereg analyze` prints: a critical failure fails the rollout.
    assert re.search(r'reports since [0-9TZ:-]+: <span class="fail">fail</span>', page)


def test_without_a_store_or_with_no_reports_the_page_says_so(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    with serve(reg.storage) as url:
        assert "Canary health" not in _request(url, "GET", "/")[1]
    with (
        open_store(f"sqlite:///{tmp_path}/empty.sqlite") as store,
        serve(reg.storage, reports=store) as url,
    ):
        page = _request(url, "GET", "/")[1]
    assert _health_rows(page)["probe_failure"] == ["—", "—", "inconclusive"]


def test_peak_memory_reads_in_mb_on_the_status_page() -> None:
    from edgereg.serve._status_page import _arm_figure

    numbers = {"candidate_median_ms": 182.0, "stable_median_ms": 120.0}
    assert _arm_figure("memory_peak_mb", numbers, "candidate") == "median 182.0 MB"
    assert _arm_figure("memory_peak_mb/det", numbers, "stable") == "median 120.0 MB"
    assert _arm_figure("inference_ms", numbers, "stable") == "median 120.0 ms"
