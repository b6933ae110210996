"""POST /v1/reports on a real `edgereg serve` over HTTP, into a real SQLite or PostgreSQL store."""

from __future__ import annotations

import hashlib
import http.client
import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pgkit import PostgresServer, postgres_server, postgres_url  # noqa: F401 (fixtures)
from servekit import FakeRegistry, make_registry, serve, serve_process

from edgereg.protocol.reports import MAX_REPORT_BYTES
from edgereg.reports import ReportStore, open_store
from edgereg.serve._ratelimit import RateLimiter, client_key

GENEROUS = RateLimiter(10_000, 10_000)


def report_body(n: int, **fields: Any) -> bytes:
    data: dict[str, Any] = {
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": "1.1.0",
        "unit_version": "1.1.0",
        "variant": "high-int8",
        "tier": "high",
        "arm": "candidate",
        "sequence": 2,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": 12.5,
        "inference": {"count": 20, "p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 4.0},
    }
    data.update(fields)
    return json.dumps(data, separators=(",", ":"), sort_keys=True).encode()


def post(
    base_url: str,
    body: bytes,
    *,
    content_type: str = "application/json",
    conn: http.client.HTTPConnection | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    own = conn is None
    if conn is None:
        conn = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=10)
    try:
        conn.request("POST", "/v1/reports", body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        return response, response.read()
    finally:
        if own:
            conn.close()


def get(base_url: str, path: str) -> tuple[http.client.HTTPResponse, bytes]:
    conn = http.client.HTTPConnection(base_url.removeprefix("http://"), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def raw(base_url: str, data: bytes, *, read_timeout: float = 5.0) -> bytes:
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=read_timeout) as sock:
        sock.sendall(data)
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
    return answer


def tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def reg(tmp_path: Path) -> FakeRegistry:
    return make_registry(tmp_path / "registry", models=("digits",))


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReportStore]:
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path}/reports.sqlite"
    else:
        url = str(request.getfixturevalue("postgres_url"))
    with open_store(url) as opened:
        yield opened


def test_a_report_is_stored_and_answered_202(reg: FakeRegistry, store: ReportStore) -> None:
    with serve(reg.storage, reports=store, report_limiter=GENEROUS) as url:
        response, body = post(url, report_body(1))
        assert response.status == 202, body
        assert json.loads(body) == {"status": "accepted"}
        assert response.getheader("Cache-Control") == "no-store"
        # Keep-alive: the body was read exactly, so the next request on the
        # connection parses (a second report, then a manifest).
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        assert post(url, report_body(2), conn=conn)[0].status == 202
        assert post(url, report_body(2, confirmed=True), conn=conn)[0].status == 202
        conn.request("GET", "/manifests/digits/high.json")
        assert conn.getresponse().status == 200
        conn.close()
    (summary,) = store.summaries("digits")
    assert (summary.devices, summary.all.count("confirmed")) == (2, 1)


@pytest.mark.parametrize(
    ("body", "content_type", "status", "detail"),
    [
        (b"{not json", "application/json", 400, "report is not JSON"),
        (report_body(1, arm="canary"), "application/json", 400, "arm"),
        (report_body(1, extra_field=1), "application/json", 400, "extra_field"),
        (report_body(1, token="DEVICE-ID"), "application/json", 400, "token"),
        (report_body(1), "text/plain", 415, "application/json"),
        (report_body(1), "application/json; charset=utf-8", 202, ""),
    ],
)
def test_bad_reports_are_refused_with_the_reason(
    reg: FakeRegistry, tmp_path: Path, body: bytes, content_type: str, status: int, detail: str
) -> None:
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        response, answer = post(url, body, content_type=content_type)
        assert response.status == status, answer
        if status != 202:
            assert detail in json.loads(answer)["detail"]
            assert store.count() == 0


def test_an_oversized_report_is_refused_from_its_header(reg: FakeRegistry, tmp_path: Path) -> None:
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        # Only the head is sent: the answer comes without waiting for the 10 MB.
        answer = raw(
            url,
            b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 10000000\r\n\r\n",
        )
        assert answer.startswith(b"HTTP/1.1 413 ")
        assert b"Connection: close" in answer
        assert str(MAX_REPORT_BYTES).encode() in answer
        chunked = raw(
            url,
            b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        )
        assert chunked.startswith(b"HTTP/1.1 411 ")
        response, _ = post(url, b" " * (MAX_REPORT_BYTES + 1))
        assert response.status == 413
        assert store.count() == 0


def test_only_post_and_only_with_a_store(reg: FakeRegistry, tmp_path: Path) -> None:
    with serve(reg.storage) as url:
        response, body = post(url, report_body(1))
        assert response.status == 404
        assert "--reports" in json.loads(body)["detail"]
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store) as url,
    ):
        response, _ = get(url, "/v1/reports")
        assert response.status == 405
        assert response.getheader("Allow") == "POST"
        # Every other path stays GET/HEAD only.
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        conn.request("POST", "/manifests/digits/high.json", body=report_body(1))
        assert conn.getresponse().status == 405
        conn.close()


def test_a_flooding_address_is_limited_with_retry_after(reg: FakeRegistry, tmp_path: Path) -> None:
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=RateLimiter(0.5, 3)) as url,
    ):
        statuses = []
        for n in range(6):
            response, _ = post(url, report_body(n))
            statuses.append(response.status)
            if response.status == 429:
                assert int(response.getheader("Retry-After", "0")) >= 1
        assert statuses == [202, 202, 202, 429, 429, 429]
        # The manifests are not rate-limited.
        assert get(url, "/manifests/digits/high.json")[0].status == 200
        assert store.count() == 3


def test_rate_limit_buckets() -> None:
    limiter = RateLimiter(rate=2, burst=2, max_clients=2)
    assert [limiter.take("10.0.0.1", 0.0) for _ in range(3)] == [0.0, 0.0, 0.5]
    assert limiter.take("10.0.0.1", 1.0) == 0.0  # refilled two in a second, one spent
    assert limiter.take("10.0.0.2", 1.0) == 0.0  # another address, its own bucket
    # One IPv6 host holds a /64: the whole prefix shares one bucket.
    assert client_key("2001:db8::1") == client_key("2001:db8::ffff:1") == "2001:db8::/64"
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1"


def test_a_flood_of_reports_never_touches_the_registry(
    reg: FakeRegistry, store: ReportStore
) -> None:
    assert reg.root is not None
    before = tree_digest(reg.root)
    with serve(reg.storage, reports=store, report_limiter=RateLimiter(1000, 150)) as url:
        manifest_before = get(url, "/manifests/digits/high.json")[1]
        conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
        statuses: dict[int, int] = {}
        bodies = [
            report_body(1),  # replayed below
            b"[]",
            b"\xff\xfe",
            b"{" * 3000,
            report_body(2, unit="../../manifests/digits", model="digits"),
            report_body(3, version="9.9.9", tier="high", arm="stable"),
        ]
        for i in range(200):
            body = bodies[i % len(bodies)]
            try:
                status = post(url, body, conn=conn)[0].status
            except (http.client.HTTPException, OSError):
                conn.close()
                conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
                continue
            statuses[status] = statuses.get(status, 0) + 1
        conn.close()
        assert raw(url, b"POST /v1/reports HTTP/1.1\r\nContent-Length: 99999\r\n\r\n")[:12] == (
            b"HTTP/1.1 413"
        )
        response, manifest_after = get(url, "/manifests/digits/high.json")
        assert response.status == 200
        assert manifest_after == manifest_before
        blob = reg.blob("digits", "1.1.0", "high")
        response, data = get(url, f"/blobs/sha256/{blob.digest}")
        assert (response.status, data) == (200, blob.data)
    assert tree_digest(reg.root) == before
    assert set(statuses) <= {202, 400, 422, 429}
    assert statuses[202] >= 2
    assert statuses[400] >= 2
    # 9.9.9 was never published: refused, not stored.
    assert statuses[422] >= 2
    assert store.count() == 1  # the replays of token 1 are one row; token 3 was refused


def test_a_store_outage_refuses_reports_but_keeps_delivering(reg: FakeRegistry) -> None:
    blob = reg.blob("digits", "1.1.0", "high")
    with PostgresServer() as database:
        store = open_store(database.create_database())
        with serve(reg.storage, reports=store, report_limiter=GENEROUS) as url:
            assert post(url, report_body(1))[0].status == 202
            database.stop()
            response, body = post(url, report_body(2))
            assert response.status == 503
            assert response.getheader("Retry-After") == "30"
            assert "report store" in json.loads(body)["detail"]
            for path in ("/manifests/digits/high.json", f"/blobs/sha256/{blob.digest}"):
                assert get(url, path)[0].status == 200
            assert get(url, "/healthz")[0].status == 200
            database.start()
            assert post(url, report_body(3))[0].status == 202
        assert store.count() == 2
        store.close()


# -- the command ---------------------------------------------------------------------


def test_serve_command_takes_reports_into_the_given_store(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    assert reg.root is not None
    path = tmp_path / "reports.sqlite"
    log = tmp_path / "serve.log"
    with serve_process(
        log, "--registry", str(reg.root), "--reports", f"sqlite:///{path}", cwd=tmp_path
    ) as (_, url):
        assert post(url, report_body(1))[0].status == 202
    with open_store(f"sqlite:///{path}") as store:
        assert store.count() == 1


def test_serve_command_believes_x_forwarded_for_only_from_a_trusted_proxy(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    # The real command: a proxy on 127.0.0.1 is trusted, another loopback host is not.
    path = tmp_path / "reports.sqlite"
    log = tmp_path / "serve.log"
    with serve_process(
        log,
        "--registry",
        str(reg.root),
        "--reports",
        f"sqlite:///{path}",
        "--trusted-proxy",
        "127.0.0.1/32",
        "--trusted-proxy",
        "10.0.0.0/8",
        cwd=tmp_path,
    ) as (_, url):

        def send(n: int, source: str, forwarded: str) -> int:
            host, port = url.removeprefix("http://").split(":")
            conn = http.client.HTTPConnection(
                host, int(port), timeout=10, source_address=(source, 0)
            )
            headers = {"Content-Type": "application/json", "X-Forwarded-For": forwarded}
            conn.request("POST", "/v1/reports", body=report_body(n), headers=headers)
            status = conn.getresponse().status
            conn.close()
            return status

        # Through the trusted proxy: the device's own network, past a trusted inner hop.
        assert send(1, "127.0.0.1", "198.51.100.7") == 202
        assert send(2, "127.0.0.1", "203.0.113.9, 10.1.2.3") == 202
        # From a peer that is not a proxy: the header is the peer's own claim, ignored.
        assert send(3, "127.0.9.2", "192.0.2.1") == 202
    with open_store(f"sqlite:///{path}") as store:
        (summary,) = store.summaries("digits")
    assert (summary.devices, summary.networks) == (3, 3)
    import sqlite3

    with sqlite3.connect(path) as conn:
        sources = {row[0] for row in conn.execute("SELECT source FROM reports")}
    assert sources == {"198.51.100.0/24", "203.0.113.0/24", "127.0.9.0/24"}


def test_serve_command_refuses_a_proxy_that_is_not_a_network(tmp_path: Path) -> None:
    import subprocess

    from servekit import SERVE_CMD

    result = subprocess.run(
        [*SERVE_CMD, "--registry", str(tmp_path), "--trusted-proxy", "10.0.0.0/33"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "'10.0.0.0/33' is not a network" in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_command_refuses_a_bad_store_url(reg: FakeRegistry, tmp_path: Path) -> None:
    import subprocess

    from servekit import SERVE_CMD

    assert reg.root is not None
    result = subprocess.run(
        [*SERVE_CMD, "--registry", str(reg.root), "--port", "0", "--reports", "mysql://x:pw@db/r"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 2
    assert "--reports: unsupported report store scheme 'mysql'" in result.stderr
    assert "pw" not in result.stderr
    assert "Traceback" not in result.stderr


def test_serve_in_a_project_uses_its_reports_store(tmp_path: Path, small_toml: str) -> None:
    # [registry] defaults to file://registry; [reports] store is set relative to models.toml.
    (tmp_path / "models.toml").write_text(
        small_toml + '\n[reports]\nstore = "sqlite:///data/reports.sqlite"\nretention_days = 30\n'
    )
    (tmp_path / "data").mkdir()
    make_registry(tmp_path / "registry", models=("digits",))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    log = tmp_path / "serve.log"
    with serve_process(log, "--config", str(tmp_path / "models.toml"), cwd=elsewhere) as (_, url):
        assert post(url, report_body(1))[0].status == 202
    assert "reports: POST" in log.read_text()
    with open_store(f"sqlite:///{tmp_path}/data/reports.sqlite") as store:
        assert store.count() == 1


def test_schemathesis_finds_no_disagreement_on_reports(reg: FakeRegistry, tmp_path: Path) -> None:
    """Fuzz POST /v1/reports from its OpenAPI schema against a server with a store.

    Invalid reports must be refused with a 4xx and nothing may answer 5xx.
    Schema-valid data is not required to be accepted: JSON Schema's "integer"
    admits 1773.0, which the strict parser refuses (integers are written without
    a fraction, as in manifests); the document says so in words.
    """
    import subprocess
    import sys

    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "run",
                f"{url}/openapi.json",
                "--include-path",
                "/v1/reports",
                "--checks",
                "all",
                "--exclude-checks",
                "positive_data_acceptance",
                "--max-examples",
                "60",
                "--seed",
                "1",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]


def test_a_default_store_that_cannot_open_does_not_stop_delivery(
    tmp_path: Path, small_toml: str
) -> None:
    import subprocess

    from servekit import SERVE_CMD

    (tmp_path / "models.toml").write_text(small_toml)  # [reports] store left at its default
    (tmp_path / "reports.sqlite").mkdir()  # the default path cannot be a database
    make_registry(tmp_path / "registry", models=("digits",))
    log = tmp_path / "serve.log"
    with serve_process(log, "--config", str(tmp_path / "models.toml"), cwd=tmp_path) as (_, url):
        assert get(url, "/manifests/digits/high.json")[0].status == 200
        assert post(url, report_body(1))[0].status == 404
    assert "this server keeps no reports" in log.read_text()
    # Chosen explicitly, the same store stops the start with the reason.
    result = subprocess.run(
        [
            *SERVE_CMD,
            "--config",
            str(tmp_path / "models.toml"),
            "--port",
            "0",
            "--reports",
            "sqlite:///reports.sqlite",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 6
    assert "cannot open" in result.stderr
    assert "Traceback" not in result.stderr


def test_expect_100_continue_gets_the_interim_answer(reg: FakeRegistry, tmp_path: Path) -> None:
    body = report_body(1, device_class="x" * 32)
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=5) as sock:
            sock.sendall(
                b"POST /v1/reports HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                b"Expect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body)
            )
            assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
            sock.sendall(body)
            assert sock.recv(100).startswith(b"HTTP/1.1 202 ")
        assert store.count() == 1


# --- forged reports: only what the registry served is admitted ----------------------


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"unit": "nosuch", "model": "nosuch"}, "unknown-unit", id="unknown-unit"),
        pytest.param({"tier": "ultra"}, "unknown-tier", id="undeclared-tier"),
        pytest.param({"sequence": 3}, "future-sequence", id="never-issued-sequence"),
        pytest.param({"sequence": 1}, "not-served", id="no-candidate-at-sequence-1"),
        pytest.param(
            {"version": "1.2.0", "unit_version": "1.2.0"}, "not-served", id="unpublished-version"
        ),
        pytest.param({"arm": "stable"}, "not-served", id="candidate-version-as-stable"),
        pytest.param({"unit_version": "1.0.0"}, "version-mismatch", id="model-unit-mismatch"),
        # What the release holds: a model that is not the unit's, a variant it never built.
        pytest.param({"model": "zzzfake"}, "unknown-model", id="made-up-model"),
        pytest.param({"variant": "ultra-int8"}, "unknown-variant", id="made-up-variant"),
    ],
)
def test_a_report_of_what_was_never_served_is_refused_and_counted(
    reg: FakeRegistry, tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        response, answer = post(url, report_body(1, **fields))
        assert response.status == 422, answer
        assert json.loads(answer)["detail"].startswith(reason)
        _, metrics = get(url, "/metrics")
        assert f'edgereg_reports_refused_total{{reason="{reason}"}} 1' in metrics.decode()
        # What was served is admitted: the stable arm at either sequence, the candidate at 2.
        for n, good in enumerate(
            (
                {},
                {"arm": "stable", "version": "1.0.0", "unit_version": "1.0.0"},
                {"arm": "stable", "version": "1.0.0", "unit_version": "1.0.0", "sequence": 1},
            ),
            start=2,
        ):
            assert post(url, report_body(n, **good))[0].status == 202
    assert store.count() == 3


def test_a_new_sequence_is_admitted_as_soon_as_it_is_published(tmp_path: Path) -> None:
    # The server caches what was served; a report naming a newer sequence refreshes it.
    from edgereg.serve._app import App, Request

    reg = make_registry(tmp_path / "registry", models=("digits",))
    clock = [0.0]
    with open_store(f"sqlite:///{tmp_path}/r.sqlite") as store:
        app = App(reg.storage, reports=store, report_limiter=GENEROUS, monotonic=lambda: clock[0])

        def send(n: int, **fields: Any) -> int:
            body = report_body(n, **fields)
            headers = {"content-type": "application/json", "content-length": str(len(body))}
            return app.handle(Request("POST", "/v1/reports", headers, body, "10.0.0.1")).status

        assert send(1) == 202
        assert send(2, sequence=3) == 422
        from edgereg.config import RolloutPolicy
        from edgereg.registry._transitions import set_percent

        reg.registry.change(
            "digits",
            lambda state, now, expires: set_percent(
                state,
                "digits",
                25.0,
                policy=RolloutPolicy(min_soak_hours=0),
                now=now,
                expires=expires,
                actor="test",
            ),
            signer=reg.signer,
            expires_days=30,
        )
        clock[0] += 2  # past the early-refresh interval, well inside the cache's lifetime
        assert send(3, sequence=3) == 202


def test_new_tokens_per_source_network_are_capped(reg: FakeRegistry, tmp_path: Path) -> None:
    import ipaddress

    from edgereg.serve._ratelimit import SourceCaps

    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(
            reg.storage,
            reports=store,
            report_limiter=GENEROUS,
            source_caps=SourceCaps(tokens=5),
            trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),),
        ) as url,
    ):

        def send(n: int, address: str, **fields: Any) -> int:
            conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
            headers = {"Content-Type": "application/json", "X-Forwarded-For": address}
            conn.request("POST", "/v1/reports", body=report_body(n, **fields), headers=headers)
            status = conn.getresponse().status
            conn.close()
            return status

        statuses = [send(n, f"198.51.100.{n}") for n in range(8)]
        assert statuses == [202] * 5 + [429] * 3
        # A device already counted keeps reporting (confirm, revert): same token, admitted.
        assert send(0, "198.51.100.77", confirmed=True) == 202
        # Another network has its own cap.
        assert send(9, "192.0.2.1") == 202
        _, metrics = get(url, "/metrics")
        assert 'edgereg_reports_refused_total{reason="source-cap"} 3' in metrics.decode()
        # The store keeps each report's network: the evidence counts two.
        (summary,) = store.summaries("digits")
        assert (summary.devices, summary.networks) == (6, 2)
    assert store.count() == 6


def test_source_caps_count_networks_not_addresses() -> None:
    from edgereg.serve._ratelimit import SourceCaps, source_key

    assert source_key("203.0.113.7") == "203.0.113.0/24"
    assert source_key("2001:db8:1:2:3::9") == "2001:db8:1::/48"
    assert source_key("::ffff:203.0.113.7") == "203.0.113.0/24"
    caps = SourceCaps(tokens=2, period=3600)
    assert caps.take("203.0.113.1", "a" * 32, 0.0) == 0
    assert caps.take("203.0.113.200", "b" * 32, 1.0) == 0
    # A third address of the same /24 is the same source; another /24 is not.
    assert caps.take("203.0.113.9", "c" * 32, 2.0) == pytest.approx(3598.0)
    assert caps.take("203.0.114.9", "c" * 32, 2.0) == 0
    # The window ends: the source may bring new tokens again.
    assert caps.take("203.0.113.9", "c" * 32, 3600.0) == 0
    # The local peer is a proxy on the host: never capped.
    assert all(caps.take("127.0.0.1", f"{n:032x}", 5.0) == 0 for n in range(10))
    assert all(caps.take("::1", f"{n:032x}", 5.0) == 0 for n in range(10))
    assert caps.source("::ffff:127.0.0.1") is None
    # Any other loopback address is a host of its own (a simulated device), capped by its /24.
    assert caps.source("127.0.3.9") == "127.0.3.0/24"
    assert caps.take("127.0.3.9", "a" * 32, 5.0) == 0
    assert caps.take("127.0.3.10", "b" * 32, 5.0) == 0
    assert caps.take("127.0.3.11", "c" * 32, 5.0) > 0


@pytest.mark.parametrize(
    ("peer", "header", "client"),
    [
        pytest.param("10.0.0.5", "198.51.100.7", "198.51.100.7", id="trusted-proxy"),
        pytest.param("10.0.0.5", "198.51.100.7, 10.0.0.9", "198.51.100.7", id="two-proxies"),
        pytest.param("10.0.0.5", "1.2.3.4, 198.51.100.7", "198.51.100.7", id="forged-left-part"),
        pytest.param("192.0.2.1", "198.51.100.7", "192.0.2.1", id="untrusted-peer"),
        pytest.param("10.0.0.5", "not-an-ip", "10.0.0.5", id="malformed"),
        pytest.param("10.0.0.5", None, "10.0.0.5", id="no-header"),
    ],
)
def test_x_forwarded_for_is_believed_only_from_a_configured_proxy(
    peer: str, header: str | None, client: str
) -> None:
    import ipaddress

    from edgereg.serve._ratelimit import forwarded_client

    trusted = (ipaddress.ip_network("10.0.0.0/8"),)
    assert forwarded_client(peer, header, trusted) == client
    assert forwarded_client(peer, header, ()) == peer


def test_an_authenticator_refuses_reports_it_cannot_verify(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    from edgereg.serve import HmacAuthenticator
    from edgereg.serve._authenticate import AUTH_HEADER

    auth = HmacAuthenticator(b"k" * 32)
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(
            reg.storage, reports=store, report_limiter=GENEROUS, report_authenticator=auth
        ) as url,
    ):

        def send(body: bytes, signature: str | None) -> int:
            conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
            headers = {"Content-Type": "application/json"}
            if signature is not None:
                headers[AUTH_HEADER] = signature
            conn.request("POST", "/v1/reports", body=body, headers=headers)
            status = conn.getresponse().status
            conn.close()
            return status

        good = report_body(1)
        assert send(good, None) == 401
        assert send(good, auth.sign(report_body(2))) == 401  # signed another body
        assert send(good, HmacAuthenticator(b"x" * 32).sign(good)) == 401  # another key
        assert send(good, auth.sign(good)) == 202
        _, metrics = get(url, "/metrics")
        text = metrics.decode()
        assert 'edgereg_reports_refused_total{reason="unauthenticated"} 1' in text
        assert 'edgereg_reports_refused_total{reason="bad-authenticator"} 2' in text
    assert store.count() == 1


def test_refused_authentication_uses_up_nothing_of_the_networks_cap(
    reg: FakeRegistry, tmp_path: Path
) -> None:
    """Issue #30: 200 reports the authenticator refused locked a genuine device of the /24 out."""
    import ipaddress

    from edgereg.serve import HmacAuthenticator
    from edgereg.serve._authenticate import AUTH_HEADER
    from edgereg.serve._ratelimit import SourceCaps

    auth = HmacAuthenticator(b"k" * 32)
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(
            reg.storage,
            reports=store,
            report_limiter=GENEROUS,
            report_authenticator=auth,
            source_caps=SourceCaps(tokens=5),
            trusted_proxies=(ipaddress.ip_network("127.0.0.0/8"),),
        ) as url,
    ):

        def send(n: int, signature: str | None) -> int:
            body = report_body(n)
            conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
            headers = {"Content-Type": "application/json", "X-Forwarded-For": f"198.51.100.{n}"}
            if signature is not None:
                headers[AUTH_HEADER] = signature
            conn.request("POST", "/v1/reports", body=body, headers=headers)
            status = conn.getresponse().status
            conn.close()
            return status

        # Unsigned and wrongly signed reports, each with a new token, from one /24.
        assert [send(n, None if n % 2 else "00" * 32) for n in range(20)] == [401] * 20
        # The network's five new tokens are all still there for genuine devices.
        assert [send(100 + n, auth.sign(report_body(100 + n))) for n in range(5)] == [202] * 5
        assert send(110, auth.sign(report_body(110))) == 429
    assert store.count() == 5


def test_reports_naming_future_sequences_cost_no_state_read_each(tmp_path: Path) -> None:
    """Issue #30: each such report cost a state read, a listing and a second of a thread."""
    import time
    from concurrent.futures import ThreadPoolExecutor

    from edgereg.serve._admission import NEAR_FUTURE
    from edgereg.storage._local import LocalStorage

    reg = make_registry(tmp_path / "registry", models=("digits",))

    class Counting(LocalStorage):
        state_reads = 0

        def get_versioned(self, key: str) -> tuple[bytes, str]:
            if key.endswith("/state.json"):
                Counting.state_reads += 1
            return super().get_versioned(key)

    clock = [0.0]
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(
            Counting(tmp_path / "registry"),
            reports=store,
            report_limiter=GENEROUS,
            monotonic=lambda: clock[0],
        ) as url,
    ):
        assert post(url, report_body(0))[0].status == 202  # the first read (sequence 2)
        # Made-up sequences far above a state read less than a second ago: refused from
        # the cache, no read, no wait.
        started = time.monotonic()
        far = [post(url, report_body(n, sequence=3 + NEAR_FUTURE + n))[0].status for n in range(30)]
        elapsed = time.monotonic() - started
        assert far == [422] * 30
        assert Counting.state_reads == 1, "a far-future sequence re-read the state"
        assert elapsed < 10, f"{elapsed:.1f} s for 30 refusals: a thread waited for each"
        # The next sequence, just above it, could be a manifest written since: the
        # reports wait for one shared read at the end of the second, not one each.
        with ThreadPoolExecutor(10) as pool:
            near = list(
                pool.map(lambda n: post(url, report_body(40 + n, sequence=3))[0].status, range(10))
            )
        assert near == [422] * 10
        assert Counting.state_reads == 2, "each near-future report read the state"
        # Published since: seen at the next refresh, and admitted.
        reg.registry.change(
            "digits",
            lambda state, now, expires: state.model_copy(
                update={"sequence": state.sequence + 1, "expires": expires}
            ),
            signer=reg.signer,
            expires_days=30,
        )
        clock[0] += 1.5
        assert post(url, report_body(60, sequence=3))[0].status == 202
        assert Counting.state_reads == 3
    assert store.count() == 2


def test_a_bundle_report_names_a_member_and_version_its_release_holds() -> None:
    """A made-up member (``zzzfake``) or another member version is refused, never stored."""
    from edgereg.protocol.reports import parse_report
    from edgereg.reports.admission import ReleaseFacts, ServedUnit, admit

    served = ServedUnit(
        unit="ocr",
        sequence=2,
        tiers=frozenset({"high"}),
        served={1: ("1.0.0", None), 2: ("1.0.0", "1.1.0")},
        oldest=1,
        versions=frozenset({"1.0.0", "1.1.0"}),
        releases={
            "1.1.0": ReleaseFacts(
                {
                    "det": ("2.0.0", frozenset({"high-int8"})),
                    "rec": ("3.1.0", frozenset({"high-int8", "high-w8"})),
                }
            )
        },
    )

    def reason(**fields: Any) -> str | None:
        data = {"unit": "ocr", "model": "rec", "version": "3.1.0", "unit_version": "1.1.0"}
        return admit(parse_report(report_body(1, **{**data, **fields})), served)

    assert reason() is None
    assert reason(variant="high-w8") is None
    assert reason(model="zzzfake") == "unknown-model"
    assert reason(version="3.0.0") == "version-mismatch"
    assert reason(variant="low-int8") == "unknown-variant"
    # A version whose release the index could not read is checked by its arm's version only.
    assert reason(arm="stable", unit_version="1.0.0", model="zzzfake") is None


def _bundle_registry(root: Path) -> FakeRegistry:
    """ocr 1.0.0 (det 2.0.0 + rec 3.0.0, stable) and 1.1.0 (det 2.0.0 + rec 3.1.0, a canary).

    Tiers high and low: det's variants are high-fp16 and low-fp16, rec's high-int8 and low-int8.
    """
    from datetime import timedelta

    from servekit import NOW, _release

    from edgereg.protocol.wire import BundleMember, BundleRecord
    from edgereg.registry import PreparedBundle, Registry
    from edgereg.signing import Signer, generate_key
    from edgereg.storage import open_storage

    staging = root.parent / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    storage = open_storage(str(root))
    signer = Signer.from_pem(generate_key()[0])
    clock = iter(NOW + timedelta(hours=hour) for hour in range(100))
    registry = Registry(storage, clock=lambda: next(clock))
    for version, rec in (("1.0.0", "3.0.0"), ("1.1.0", "3.1.0")):
        members, blobs = {}, {}
        for name, member_version, kind in (("det", "2.0.0", "fp16"), ("rec", rec, "int8")):
            tiers = {"high": 2000, "low": 1000}
            prepared, _ = _release(name, member_version, tiers, staging, seed=version)
            members[name] = BundleMember(
                version=member_version,
                variants={f"{t}-{kind}": prepared.record.variants[f"{t}-int8"] for t in tiers},
                tiers={t: f"{t}-{kind}" for t in tiers},
            )
            blobs.update(prepared.blobs)
        record = BundleRecord(
            bundle="ocr", version=version, created=NOW, members=members, tier_order=list(tiers)
        )
        registry.publish(
            PreparedBundle(record=record, blobs=blobs),
            signer=signer,
            percent=None if version == "1.0.0" else 5.0,
            full=version == "1.0.0",
            actor="release-bot@ci",
            expires_days=3650,
        )
    return FakeRegistry(root, storage, signer)


#: A bundle member report's fields (ocr 1.1.0's rec, a candidate at sequence 2).
REC = {"unit": "ocr", "model": "rec", "version": "3.1.0", "unit_version": "1.1.0"}


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        pytest.param({"model": "zzzfake"}, "unknown-model", id="made-up-member"),
        pytest.param({"model": "ocr", "version": "1.1.0"}, "unknown-model", id="bundle-as-member"),
        pytest.param({"version": "3.0.0"}, "version-mismatch", id="the-stables-member-version"),
        pytest.param({"version": "9.9.9"}, "version-mismatch", id="made-up-member-version"),
        pytest.param({"variant": "mid-int8"}, "unknown-variant", id="variant-never-built"),
        pytest.param(
            {"model": "det", "version": "2.0.0"}, "unknown-variant", id="another-members-variant"
        ),
        pytest.param(
            {"arm": "stable", "unit_version": "1.0.0", "version": "3.1.0"},
            "version-mismatch",
            id="stable-arm-candidates-member-version",
        ),
        pytest.param(
            {"arm": "stable", "unit_version": "1.0.0", "model": "zzzfake"},
            "unknown-model",
            id="stable-arm-made-up-member",
        ),
    ],
)
def test_a_bundle_member_report_of_what_the_release_does_not_hold_is_refused(
    tmp_path: Path, fields: dict[str, Any], reason: str
) -> None:
    """issue 30 item 3: a made-up member, member version or variant: 422, counted, not stored."""
    reg = _bundle_registry(tmp_path / "registry")
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        response, answer = post(url, report_body(1, **{**REC, **fields}))
        assert response.status == 422, answer
        assert json.loads(answer)["detail"].startswith(reason)
        _, metrics = get(url, "/metrics")
        assert f'edgereg_reports_refused_total{{reason="{reason}"}} 1' in metrics.decode()
        assert store.count() == 0
        # What the releases hold is admitted: each member of either arm, every variant.
        for n, good in enumerate(
            (
                {},
                {"variant": "low-int8", "tier": "low"},
                {"model": "det", "version": "2.0.0", "variant": "high-fp16"},
                {"arm": "stable", "unit_version": "1.0.0", "version": "3.0.0"},
                {
                    "arm": "stable",
                    "unit_version": "1.0.0",
                    "model": "det",
                    "version": "2.0.0",
                    "variant": "low-fp16",
                    "tier": "low",
                },
            ),
            start=2,
        ):
            assert post(url, report_body(n, **{**REC, **good}))[0].status == 202, good
        assert store.count() == 5


# --- app metrics: only what the release declares ------------------------------------


def test_app_metrics_are_admitted_only_as_the_release_declares_them(tmp_path: Path) -> None:
    """An undeclared name, a rate sent as buckets, buckets of another count: 422, counted."""
    from edgereg.protocol.wire import DistributionMetric, RateMetric

    reg = make_registry(
        tmp_path / "registry",
        models=("digits",),
        metrics={
            "accepted": RateMetric(kind="rate"),
            "confidence": DistributionMetric(kind="distribution", buckets=[0.5, 0.9]),
        },
    )
    good = {
        "schema_version": 3,
        "metrics": {
            "accepted": {"events": 10, "successes": 9},
            "confidence": {"counts": [1, 2, 7]},
        },
    }
    refused = [
        (
            {"accepted": {"events": 1, "successes": 1}, "typo": {"events": 1, "successes": 0}},
            "undeclared-metric",
        ),
        ({"accepted": {"counts": [1, 2]}}, "metric-mismatch"),
        ({"confidence": {"events": 3, "successes": 1}}, "metric-mismatch"),
        ({"confidence": {"counts": [1, 2]}}, "metric-mismatch"),
        ({"confidence": {"counts": [1, 2, 3, 4]}}, "metric-mismatch"),
    ]
    with (
        open_store(f"sqlite:///{tmp_path}/r.sqlite") as store,
        serve(reg.storage, reports=store, report_limiter=GENEROUS) as url,
    ):
        assert post(url, report_body(1, **good))[0].status == 202
        for n, (metrics, reason) in enumerate(refused, start=2):
            response, answer = post(url, report_body(n, schema_version=3, metrics=metrics))
            assert response.status == 422, answer
            assert json.loads(answer)["detail"].startswith(reason), answer
        # Not a count: refused by the parser (400), whatever the release declares.
        for n, counts in enumerate(
            (
                {"events": -1, "successes": 0},
                {"events": 2, "successes": 1.5},
                {"events": 1, "successes": 2},
            ),
            start=20,
        ):
            body = report_body(n, schema_version=3, metrics={"accepted": counts})
            assert post(url, body)[0].status == 400
        _, scraped = get(url, "/metrics")
        text = scraped.decode()
        assert 'edgereg_reports_refused_total{reason="undeclared-metric"} 1' in text
        assert 'edgereg_reports_refused_total{reason="metric-mismatch"} 4' in text
    assert store.count() == 1
