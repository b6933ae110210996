"""`edgereg serve`: real HTTP on loopback over a registry made through the library."""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from html import escape
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import servekit
from click.testing import CliRunner
from servekit import FakeRegistry, make_registry, serve, serve_registry  # noqa: F401

from edgereg.cli import main
from edgereg.config import RolloutPolicy
from edgereg.errors import StorageError
from edgereg.registry import PreparedRelease, Registry, model_status
from edgereg.registry import _transitions as transitions
from edgereg.registry._registry import export_public_key
from edgereg.serve import App, Request, openapi_document, start_in_thread
from edgereg.serve._http import BadTarget, Unsatisfiable, none_match, parse_range, request_path
from edgereg.serve._status_page import render_status_page
from edgereg.signing import Signer, generate_key, read_trusted_keys
from edgereg.storage import open_storage
from edgereg.storage._local import LocalStorage

SECRET = b"TOPSECRET-must-never-be-served"
# The serve command alone, without the group: the same code `edgereg serve` runs.
SERVE_CMD = [sys.executable, "-c", "from edgereg.cli.serve import serve_command; serve_command()"]


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- fixtures ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def reg(tmp_path_factory: pytest.TempPathFactory) -> FakeRegistry:
    base = tmp_path_factory.mktemp("serve")
    # A secret next to the registry: no URL may reach it.
    (base / "secret.txt").write_bytes(SECRET)
    (base / "registry-secret.json").write_bytes(SECRET)
    return make_registry(base / "registry")


@pytest.fixture(scope="module")
def base_url(reg: FakeRegistry) -> Iterator[str]:
    with serve(reg.root) as url:  # type: ignore[arg-type]
        yield url


def connect(url: str, timeout: float = 10) -> http.client.HTTPConnection:
    parts = urlsplit(url)
    return http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)


def get(
    url: str, path: str, method: str = "GET", headers: dict[str, str] | None = None
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = connect(url)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response, response.read()
    finally:
        conn.close()


def raw(url: str, request: bytes, *, until_eof: bool = True) -> bytes:
    """Send bytes as they are; return everything the server sends back."""
    parts = urlsplit(url)
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            if not until_eof and b"\r\n\r\n" in data:
                return data


def raw_get(url: str, target: str) -> tuple[int, bytes]:
    answer = raw(url, f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
    status_line = answer.split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), answer


@contextlib.contextmanager
def cli_server(log: Path, *args: str, cwd: Path | None = None) -> Iterator[tuple[Any, str]]:
    """Run the serve command in a child process on a free port; yield (process, base URL)."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*SERVE_CMD, "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            found = re.search(r" on (http://[0-9.:]+) ", log.read_text(errors="replace"))
            if found:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"edgereg serve did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield proc, found.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- pure rules ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        pytest.param(None, 100, None, id="no-range"),
        pytest.param("bytes=0-9", 100, (0, 10), id="first-bytes"),
        pytest.param("bytes=10-19", 100, (10, 10), id="middle"),
        pytest.param("bytes=-10", 100, (90, 10), id="suffix"),
        pytest.param("bytes=-1000", 100, (0, 100), id="suffix-longer-than-body"),
        pytest.param("bytes=90-", 100, (90, 10), id="open-ended"),
        pytest.param("bytes=90-1000", 100, (90, 10), id="end-past-size-is-cut"),
        pytest.param("bytes=99-99", 100, (99, 1), id="last-byte"),
        pytest.param(" BYTES = 5 - 6 ", 100, (5, 2), id="spaces-and-case"),
        pytest.param("bytes=0-1,5-6", 100, None, id="several-ranges-whole-body"),
        pytest.param("items=0-1", 100, None, id="other-unit-ignored"),
        pytest.param("garbage", 100, None, id="no-unit-ignored"),
    ],
)
def test_range_parsing(header: str | None, size: int, expected: tuple[int, int] | None) -> None:
    result = parse_range(header, size)
    assert (None if result is None else (result.start, result.length)) == expected


@pytest.mark.parametrize(
    "header",
    ["bytes=100-", "bytes=100-200", "bytes=5-3", "bytes=-0", "bytes=-", "bytes=x-y", "bytes=1-2-3"],
)
def test_unsatisfiable_ranges(header: str) -> None:
    with pytest.raises(Unsatisfiable):
        parse_range(header, 100)


@pytest.mark.parametrize(
    ("header", "matches"),
    [
        ('"abc"', True),
        ('W/"abc"', True),
        ('"x", "abc"', True),
        ("*", True),
        ('"abcd"', False),
        ("abc", False),  # unquoted: malformed, ignored
        ("", False),
    ],
)
def test_if_none_match(header: str, matches: bool) -> None:
    assert none_match(header, '"abc"') is matches


@pytest.mark.parametrize(
    "target",
    [
        "/../x",
        "/a/./b",
        "/%2e%2e/x",
        "/%2E%2e/x",
        "/a%2fb",
        "/a%5Cb",
        "/a%00",
        "/a\\b",
        "/a%zz",
        "/%c0%ae%c0%ae/x",
        "http://host/x",
        "*",
        "/a\x01",
    ],
)
def test_bad_targets_are_refused(target: str) -> None:
    with pytest.raises(BadTarget):
        request_path(target)


def test_targets_are_decoded_and_queries_dropped() -> None:
    assert request_path("/manifests/digits/high.json?x=1") == "/manifests/digits/high.json"
    assert request_path("/manifests/digit%73/high.json") == "/manifests/digits/high.json"


class BrokenStorage(LocalStorage):
    def _list(self, prefix: str) -> list[str]:
        raise StorageError("down", url=self.url)

    def _get_stamped(self, key: str) -> tuple[bytes, str | None]:
        raise OSError("disk on fire")  # what serving reads documents through


def test_storage_failures_answer_503_not_500(tmp_path: Path) -> None:
    app = App(BrokenStorage(tmp_path))
    health = app.handle(Request("GET", "/healthz"))
    assert health.status == 503
    assert json.loads(bytes(health.body))["status"] == "unavailable"
    manifest = app.handle(Request("GET", "/manifests/digits/high.json"))
    assert manifest.status == 503
    assert manifest.header("Retry-After") == "5"


# -- manifests and other signed documents ----------------------------------------------


def test_manifest_has_strong_etag_and_short_cache(base_url: str, reg: FakeRegistry) -> None:
    response, body = get(base_url, "/manifests/digits/high.json")
    assert response.status == 200
    assert body == reg.storage.get("manifests/digits/high.json")
    assert response.getheader("ETag") == f'"{sha(body)}"'
    assert response.getheader("Cache-Control") == "public, max-age=60"
    assert response.getheader("Content-Type") == "application/json"
    assert response.getheader("Content-Length") == str(len(body))
    # It is the signed manifest, verifiable with the registry's keys.
    manifest = reg.registry.read_manifest("digits", "high")
    assert manifest.candidate is not None
    assert manifest.candidate.sha256 == reg.blob("digits", "1.1.0", "high").digest


def test_if_none_match_answers_304_without_body(base_url: str) -> None:
    response, body = get(base_url, "/manifests/digits/mid.json")
    etag = response.getheader("ETag")
    assert etag is not None
    for header in (etag, f"W/{etag}", f'"nope", {etag}', "*"):
        again, again_body = get(
            base_url, "/manifests/digits/mid.json", headers={"If-None-Match": header}
        )
        assert again.status == 304, header
        assert again_body == b""
        assert again.getheader("ETag") == etag
        assert again.getheader("Cache-Control") == "public, max-age=60"
        assert again.getheader("Content-Length") is None
    changed, changed_body = get(
        base_url, "/manifests/digits/mid.json", headers={"If-None-Match": '"stale"'}
    )
    assert changed.status == 200
    assert changed_body == body


def test_unchanged_check_costs_under_400_bytes_on_the_wire(base_url: str) -> None:
    etag = get(base_url, "/manifests/digits/high.json")[0].getheader("ETag")
    host = urlsplit(base_url).netloc
    request = (
        f"GET /manifests/digits/high.json HTTP/1.1\r\nHost: {host}\r\nIf-None-Match: {etag}\r\n\r\n"
    ).encode()
    answer = raw(base_url, request, until_eof=False)
    assert answer.startswith(b"HTTP/1.1 304 ")
    assert answer.endswith(b"\r\n\r\n")  # headers only, nothing after
    assert len(request) + len(answer) < 400, (len(request), len(answer))


@pytest.mark.parametrize(
    ("path", "key", "content_type"),
    [
        ("/models/digits/state.json", "models/digits/state.json", "application/json"),
        (
            "/models/digits/releases/1.1.0.json",
            "models/digits/releases/1.1.0.json",
            "application/json",
        ),
        ("/manifests/sensor/low.json", "manifests/sensor/low.json", "application/json"),
    ],
)
def test_signed_documents(
    base_url: str, reg: FakeRegistry, path: str, key: str, content_type: str
) -> None:
    response, body = get(base_url, path)
    assert response.status == 200
    assert body == reg.storage.get(key)
    assert response.getheader("Content-Type") == content_type
    assert response.getheader("ETag") == f'"{sha(body)}"'


def test_public_keys(base_url: str, reg: FakeRegistry) -> None:
    response, body = get(base_url, f"/keys/{reg.signer.key_id}.pem")
    assert response.status == 200
    assert body == reg.signer.public_pem()


def test_manifest_max_age_is_configurable(reg: FakeRegistry) -> None:
    assert reg.root is not None
    with serve(reg.root, manifest_max_age=5) as url:
        response, _ = get(url, "/manifests/digits/high.json")
    assert response.getheader("Cache-Control") == "public, max-age=5"


# -- blobs -----------------------------------------------------------------------------


def test_blob_is_immutable_and_whole(base_url: str, reg: FakeRegistry) -> None:
    blob = reg.blob("digits", "1.0.0", "mid")
    response, body = get(base_url, f"/blobs/sha256/{blob.digest}")
    assert response.status == 200
    assert body == blob.data
    assert response.getheader("ETag") == f'"{blob.digest}"'
    assert response.getheader("Cache-Control") == "public, max-age=31536000, immutable"
    assert response.getheader("Accept-Ranges") == "bytes"
    assert response.getheader("Content-Type") == "application/octet-stream"
    assert response.getheader("Content-Length") == str(len(blob.data))
    again, again_body = get(
        base_url, f"/blobs/sha256/{blob.digest}", headers={"If-None-Match": f'"{blob.digest}"'}
    )
    assert (again.status, again_body) == (304, b"")
    assert again.getheader("Cache-Control") == "public, max-age=31536000, immutable"


@pytest.mark.parametrize(
    ("header", "start", "stop"),
    [
        ("bytes=0-99", 0, 100),
        ("bytes=1000-1999", 1000, 2000),
        ("bytes=-10", -10, None),
        ("bytes=299990-", 299990, None),
        ("bytes=299000-999999", 299000, None),
    ],
)
def test_range_requests_answer_206(
    base_url: str, reg: FakeRegistry, header: str, start: int, stop: int | None
) -> None:
    blob = reg.blob("digits", "1.1.0", "high")  # 300,000 bytes
    response, body = get(base_url, f"/blobs/sha256/{blob.digest}", headers={"Range": header})
    expected = blob.data[start:stop]
    assert response.status == 206
    assert body == expected
    first = start % len(blob.data)
    assert response.getheader("Content-Range") == (
        f"bytes {first}-{first + len(expected) - 1}/{len(blob.data)}"
    )
    assert response.getheader("Content-Length") == str(len(expected))
    assert response.getheader("ETag") == f'"{blob.digest}"'


def test_resume_spanning_several_storage_reads(base_url: str, reg: FakeRegistry) -> None:
    blob = reg.blob("digits", "1.1.0", "high")
    # The server reads ranges from storage in 1 MiB pieces; a tiny blob still
    # exercises the offset arithmetic through the app's RangeBody directly.
    from edgereg.serve._app import RangeBody

    body = RangeBody(reg.storage, f"blobs/sha256/{blob.digest}", 12_345, 200_000, chunk_size=7_777)
    assert b"".join(body.chunks()) == blob.data[12_345:212_345]


@pytest.mark.parametrize("header", ["bytes=300000-", "bytes=5-3", "bytes=-0", "bytes=abc"])
def test_unsatisfiable_range_answers_416(base_url: str, reg: FakeRegistry, header: str) -> None:
    blob = reg.blob("digits", "1.1.0", "high")
    response, body = get(base_url, f"/blobs/sha256/{blob.digest}", headers={"Range": header})
    assert response.status == 416
    assert response.getheader("Content-Range") == f"bytes */{len(blob.data)}"
    assert json.loads(body)["error"] == "range not satisfiable"


def test_if_range_gates_the_range(base_url: str, reg: FakeRegistry) -> None:
    blob = reg.blob("digits", "1.1.0", "low")
    path = f"/blobs/sha256/{blob.digest}"
    ok, body = get(base_url, path, headers={"Range": "bytes=10-19", "If-Range": f'"{blob.digest}"'})
    assert (ok.status, body) == (206, blob.data[10:20])
    stale, body = get(base_url, path, headers={"Range": "bytes=10-19", "If-Range": '"other"'})
    assert (stale.status, body) == (200, blob.data)
    several, body = get(base_url, path, headers={"Range": "bytes=0-1,5-6"})
    assert (several.status, body) == (200, blob.data)


def test_head_sends_headers_only_and_keeps_the_connection_usable(
    base_url: str, reg: FakeRegistry
) -> None:
    blob = reg.blob("sensor", "1.0.0", "high")
    conn = connect(base_url)
    try:
        for path, length in (
            (f"/blobs/sha256/{blob.digest}", len(blob.data)),
            ("/manifests/sensor/high.json", len(reg.storage.get("manifests/sensor/high.json"))),
        ):
            conn.request("HEAD", path)
            response = conn.getresponse()
            assert response.status == 200
            assert response.read() == b""
            assert response.getheader("Content-Length") == str(length)
            assert response.getheader("ETag") is not None
        # The same connection still frames the next answer right.
        conn.request("GET", "/manifests/sensor/high.json")
        response = conn.getresponse()
        assert response.status == 200
        assert json.loads(response.read())["payloadType"].startswith("application/vnd.edgereg")
    finally:
        conn.close()


def test_keep_alive_serves_many_requests_on_one_connection(base_url: str) -> None:
    conn = connect(base_url)
    try:
        for _ in range(20):
            conn.request("GET", "/manifests/digits/low.json")
            response = conn.getresponse()
            response.read()
            assert response.status == 200
            assert response.getheader("Connection") is None  # persistent
    finally:
        conn.close()


# -- what is refused -------------------------------------------------------------------


@pytest.mark.parametrize("method", ["POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "BREW"])
def test_other_methods_answer_405_with_allow(base_url: str, method: str) -> None:
    for path in ("/manifests/digits/high.json", "/nowhere"):
        response, body = get(base_url, path, method=method)
        assert response.status == 405
        assert response.getheader("Allow") == "GET, HEAD"
        assert json.loads(body)["error"] == "method not allowed"


def test_a_request_body_is_not_taken_for_the_next_request(base_url: str) -> None:
    answer = raw(
        base_url,
        b"POST /manifests/digits/high.json HTTP/1.1\r\nHost: x\r\nContent-Length: 38\r\n\r\n"
        b"GET /secret.txt HTTP/1.1\r\nHost: x\r\n\r\n",
    )
    assert answer.startswith(b"HTTP/1.1 405 ")
    assert answer.count(b"HTTP/1.1 ") == 1  # answered once, then closed


TRAVERSALS = [
    "/../secret.txt",
    "/../../../../etc/passwd",
    "/manifests/../../secret.txt",
    "/manifests/digits/../../../secret.txt",
    "/%2e%2e/secret.txt",
    "/%2E%2E/%2E%2E/secret.txt",
    "/manifests/%2e%2e/%2e%2e/secret.txt",
    "/manifests/digits/..%2f..%2f..%2fsecret.txt",
    "/manifests%2f..%2f..%2fsecret.txt",
    "/blobs/sha256/..%5c..%5c..%5csecret.txt",
    "/blobs\\..\\..\\secret.txt",
    "/%252e%252e/secret.txt",
    "/%c0%ae%c0%ae/secret.txt",
    "//etc/passwd",
    "/etc/passwd",
    "///secret.txt",
    "/manifests/digits/high.json%00",
    "/manifests/digits/high.json%00.pem",
    "/keys/../../secret.txt",
    "/keys/%2e%2e%2fsecret.pem",
    "/models/digits/releases/..%2f..%2f..%2f..%2fregistry-secret.json",
    "/models/../../registry-secret.json",
    "/blobs/sha256/%2e%2e%2f%2e%2e%2f%2e%2e%2fsecret.txt",
    "/manifests/digits/.lock-high.json",
    "/models/digits/.lock-state.json",
    "/manifests/digits/high.json/..",
    "/manifests/./digits/high.json",
    "http://localhost/../secret.txt",
    "/secret.txt",
    "/registry-secret.json",
]


@pytest.mark.parametrize("target", TRAVERSALS)
def test_traversal_never_leaves_the_registry(base_url: str, target: str) -> None:
    status, answer = raw_get(base_url, target)
    assert status in (400, 404), answer[:300]
    assert SECRET not in answer
    assert b"root:" not in answer


@pytest.mark.parametrize(
    "path",
    [
        "/manifests/nosuch/high.json",
        "/manifests/digits/ultra.json",
        "/models/nosuch/state.json",
        "/models/digits/releases/9.9.9.json",
        "/blobs/sha256/" + "0" * 64,
        "/keys/" + "0" * 64 + ".pem",
        "/manifests/digits",
        "/manifests/",
        "/blobs/sha256",
        "/favicon.ico",
    ],
)
def test_unknown_things_answer_404(base_url: str, path: str) -> None:
    for method in ("GET", "HEAD"):
        response, body = get(base_url, path, method=method)
        assert response.status == 404, (method, path)
        assert response.getheader("Cache-Control") == "no-store"
        if method == "GET":
            assert json.loads(body)["error"] == "not found"


@pytest.mark.parametrize(
    "path",
    [
        "/blobs/sha256/xyz",
        "/blobs/sha256/" + "A" * 64,
        "/blobs/sha256/" + "0" * 63,
        "/blobs/sha256/" + "0" * 65,
        "/blobs/sha256/" + "g" * 64,
        "/manifests/Digits/high.json",
        "/manifests/digits/hi.gh.json",
        "/manifests/-x/high.json",
        "/models/digits/releases/1.0.json",
        "/models/digits/releases/01.0.0.json",
        "/keys/abc.pem",
        "/models/digits/releases/1.0.0-" + "a" * 250 + ".json",
    ],
)
def test_malformed_parameters_answer_400(base_url: str, path: str) -> None:
    response, body = get(base_url, path)
    assert response.status == 400, path
    assert "detail" in json.loads(body)


def test_malformed_requests_get_an_answer_not_a_crash(base_url: str) -> None:
    for request in (
        b"NONSENSE\r\n\r\n",
        b"GET /healthz HTTP/9.9\r\n\r\n",
        b"GET /healthz\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\n" + b"X-Long: " + b"a" * 70000 + b"\r\n\r\n",
        b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",
    ):
        answer = raw(base_url, request)
        assert re.match(rb"HTTP/1\.[01] (400|414|431|505) ", answer), answer[:100]
    assert get(base_url, "/healthz")[0].status == 200


# -- operations ------------------------------------------------------------------------


def test_healthz(base_url: str) -> None:
    response, body = get(base_url, "/healthz")
    assert response.status == 200
    assert json.loads(body) == {"status": "ok"}
    assert response.getheader("Cache-Control") == "no-store"


def _metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    pattern = "^" + re.escape(f"{name}{{{wanted}}}" if labels else name) + r" (\S+)$"
    found = re.search(pattern, text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_metrics_count_requests_bytes_and_latency(reg: FakeRegistry) -> None:
    assert reg.root is not None
    with serve(reg.root) as url:
        etag = None
        for _ in range(5):
            response, _ = get(url, "/manifests/digits/high.json")
            etag = response.getheader("ETag")
        for _ in range(3):
            get(url, "/manifests/digits/high.json", headers={"If-None-Match": str(etag)})
        get(url, "/manifests/nosuch/high.json")
        get(url, "/nowhere", method="DELETE")
        response, body = get(url, "/metrics")
    text = body.decode()
    assert response.getheader("Content-Type").startswith("text/plain; version=0.0.4")
    requests = "edgereg_http_requests_total"
    assert _metric(text, requests, route="manifest", method="GET", code="200") == 5
    assert _metric(text, requests, route="manifest", method="GET", code="304") == 3
    assert _metric(text, requests, route="manifest", method="GET", code="404") == 1
    assert _metric(text, requests, route="other", method="other", code="405") == 1
    assert _metric(text, "edgereg_http_sent_bytes_total", route="manifest") > 5 * 1000
    histogram = "edgereg_http_request_duration_seconds"
    assert _metric(text, f"{histogram}_count", route="manifest") == 9
    assert _metric(text, f"{histogram}_bucket", route="manifest", le="+Inf") == 9
    assert _metric(text, f"{histogram}_sum", route="manifest") > 0
    assert "# TYPE edgereg_http_request_duration_seconds histogram" in text
    assert _metric(text, "edgereg_http_requests_in_flight") == 1  # this very request


def test_openapi_document_is_valid_and_complete(base_url: str) -> None:
    from openapi_spec_validator import validate

    response, body = get(base_url, "/openapi.json")
    assert response.status == 200
    document = json.loads(body)
    assert document == openapi_document()
    validate(document)
    assert document["openapi"].startswith("3.1")
    assert set(document["paths"]) == {
        "/",
        "/healthz",
        "/metrics",
        "/openapi.json",
        "/manifests/{model}/{tier}.json",
        "/blobs/sha256/{digest}",
        "/models/{model}/releases/{version}.json",
        "/models/{model}/state.json",
        "/keys/{keyid}.pem",
        "/v1/reports",
    }
    blob = document["paths"]["/blobs/sha256/{digest}"]["get"]
    assert {"200", "206", "304", "400", "404", "416"} <= set(blob["responses"])
    digest = next(p for p in blob["parameters"] if p["name"] == "digest")
    assert digest["schema"]["pattern"] == "^[0-9a-f]{64}$"


def test_schemathesis_finds_no_server_error(reg: FakeRegistry, tmp_path: Path) -> None:
    """Fuzz every operation of the served OpenAPI document against the running server."""
    assert reg.root is not None
    digests = sorted({b.digest for blobs in reg.blobs.values() for b in blobs.values()})
    config = f"""
[dictionaries.models]
values = ["digits", "sensor"]
[dictionaries.tiers]
values = ["high", "mid", "low"]
[dictionaries.versions]
values = ["1.0.0", "1.1.0"]
[dictionaries.digests]
values = {json.dumps(digests)}
[dictionaries.keyids]
values = ["{reg.signer.key_id}"]
[dictionaries.ranges]
values = ["bytes=0-99", "bytes=-10", "bytes=100-", "bytes=5-3", "bytes=999999999-"]

[parameters]
"path.model" = {{ dictionary = "models", probability = 0.7 }}
"path.tier" = {{ dictionary = "tiers", probability = 0.7 }}
"path.version" = {{ dictionary = "versions", probability = 0.7 }}
"path.digest" = {{ dictionary = "digests", probability = 0.7 }}
"path.keyid" = {{ dictionary = "keyids", probability = 0.7 }}
"header.Range" = {{ dictionary = "ranges", probability = 0.5 }}

[checks.positive_data_acceptance]
# A valid Range header for a range the blob does not have is answered 416.
expected-statuses = ["2xx", "3xx", "404", "416"]
"""
    (tmp_path / "schemathesis.toml").write_text(config)
    with serve(reg.root) as url:
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "schemathesis.cli",
                "--config-file",
                str(tmp_path / "schemathesis.toml"),
                "run",
                f"{url}/openapi.json",
                "--checks",
                "all",
                # Bounded by examples (--max-time would keep fuzzing until it ends).
                "--max-examples",
                "40",
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
    assert re.search(r"\d+ generated, \d+ passed", result.stdout), result.stdout[-3000:]


def test_status_page_shows_rollouts_but_not_who_acted(tmp_path: Path) -> None:
    actor = "<script>alert('x')</script> & \"co\""
    fake = make_registry(tmp_path / "registry", actor=actor)
    registry = Registry(fake.storage)
    registry.change(
        "sensor",
        lambda state, now, expires: transitions.pause(
            state, "sensor", now=now, expires=expires, actor="ops <b>bold</b>"
        ),
        signer=fake.signer,
        expires_days=30,
    )
    with serve(fake.storage) as url:
        response, body = get(url, "/")
    page = body.decode()
    assert response.status == 200
    assert response.getheader("Content-Type") == "text/html; charset=utf-8"
    assert "script-src" not in response.getheader("Content-Security-Policy", "")
    assert "default-src 'none'" in response.getheader("Content-Security-Policy", "")
    for text in ("digits", "sensor", "1.0.0", "1.1.0", "5%", "paused", "high-int8", "300.0 KB"):
        assert text in page, text
    assert "<script" not in page
    # Who acted stays in the signed history: the page never shows it, escaped or not.
    assert "alert" not in page
    assert "bold" not in page
    assert "who" not in page
    assert "&quot;co&quot;" not in page
    assert actor in Registry(fake.storage).read_state("digits")[0].history[0].actor
    # Offline: nothing is loaded from anywhere.
    assert not re.search(r"(src|href)=", page)


def _dangling_key(root: Path) -> None:
    (root / "keys" / ("f" * 64 + ".pem")).symlink_to(root / "nowhere" / "gone.pem")


def _looping_key(root: Path) -> None:
    (root / "keys" / ("e" * 64 + ".pem")).symlink_to(root / "keys" / ("e" * 64 + ".pem"))


def _dangling_state(root: Path) -> None:
    state = root / "models" / "digits" / "state.json"
    state.unlink()
    state.symlink_to(root / "nowhere" / "state.json")


def _dangling_release(root: Path) -> None:
    record = next((root / "models" / "digits" / "releases").glob("*.json"))
    record.unlink()
    record.symlink_to(root / "nowhere" / "record.json")


def _unreadable_models(root: Path) -> None:
    (root / "models" / "zzz").symlink_to(root / "models" / "zzz")  # a symlink loop


# Issue #22: errors on public pages name nothing of the server's disk.
@pytest.mark.parametrize(
    "damage",
    [_dangling_key, _looping_key, _dangling_state, _dangling_release, _unreadable_models],
    ids=lambda f: f.__name__.strip("_"),
)
@pytest.mark.parametrize("pinned", [True, False], ids=["pinned", "unpinned"])
def test_status_page_errors_name_nothing_of_the_servers_disk(
    tmp_path: Path, damage: Any, pinned: bool
) -> None:
    root = tmp_path / "secret-place" / "registry"
    fake = make_registry(root)
    trusted = read_trusted_keys([root / "keys"]) if pinned else None
    damage(root)
    with serve(fake.storage, trusted=trusted) as url:
        response, body = get(url, "/")
        healthz, _ = get(url, "/healthz")
        manifest, manifest_body = get(url, "/manifests/digits/mid.json")
    page = body.decode()
    assert response.status == 200
    assert "secret-place" not in page, page
    assert "file://" not in page, page
    assert str(tmp_path) not in page
    assert b"secret-place" not in manifest_body
    assert healthz.status in (200, 503)
    del manifest


def test_status_page_of_an_empty_registry(tmp_path: Path) -> None:
    with serve(tmp_path / "empty") as url:
        response, body = get(url, "/")
    assert response.status == 200
    assert b"No model is published yet" in body


# -- S3 ---------------------------------------------------------------------------------


def test_serves_an_s3_registry(s3_bucket: str, moto_endpoint: str, tmp_path: Path) -> None:
    storage = open_storage(f"s3://{s3_bucket}/team/registry", endpoint_url=moto_endpoint)
    fake = make_registry(storage, models=("digits",), workdir=tmp_path / "staging")
    blob = fake.blob("digits", "1.1.0", "mid")
    with serve(storage) as url:
        response, body = get(url, "/manifests/digits/mid.json")
        assert response.status == 200
        assert body == storage.get("manifests/digits/mid.json")
        etag = response.getheader("ETag")
        assert etag == f'"{sha(body)}"'
        again, _ = get(url, "/manifests/digits/mid.json", headers={"If-None-Match": str(etag)})
        assert again.status == 304
        response, body = get(url, f"/blobs/sha256/{blob.digest}")
        assert (response.status, body) == (200, blob.data)
        response, body = get(url, f"/blobs/sha256/{blob.digest}", headers={"Range": "bytes=100-"})
        assert (response.status, body) == (206, blob.data[100:])
        response, body = get(url, f"/blobs/sha256/{blob.digest}", headers={"Range": "bytes=-7"})
        assert (response.status, body) == (206, blob.data[-7:])
        response, _ = get(url, f"/blobs/sha256/{blob.digest}", headers={"Range": "bytes=999999-"})
        assert response.status == 416
        assert get(url, "/manifests/digits/ultra.json")[0].status == 404
        assert get(url, "/healthz")[0].status == 200
        assert b"digits" in get(url, "/")[1]


def test_listens_on_ipv6_loopback(reg: FakeRegistry) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        server, url = start_in_thread(reg.storage, host="::1")
    except OSError as exc:
        pytest.skip(f"IPv6 loopback unavailable: {exc}")
    try:
        assert url.startswith("http://[::1]:")
        conn = http.client.HTTPConnection("::1", server.port, timeout=10)
        conn.request("GET", "/healthz")
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        server.close()


def test_fixture_for_other_tests(serve_registry: Any, reg: FakeRegistry) -> None:  # noqa: F811
    url = serve_registry(reg.root)
    assert get(url, "/healthz")[0].status == 200


# -- the command: load and graceful shutdown -------------------------------------------


def test_command_serves_the_registry_of_models_toml(tmp_path: Path, small_toml: str) -> None:
    (tmp_path / "models.toml").write_text(small_toml)  # [registry] defaults to file://registry
    make_registry(tmp_path / "registry", models=("digits",))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with cli_server(
        tmp_path / "serve.log", "--config", str(tmp_path / "models.toml"), cwd=elsewhere
    ) as (proc, url):
        assert get(url, "/manifests/digits/high.json")[0].status == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0


def test_command_without_a_registry_says_what_to_do(tmp_path: Path) -> None:
    result = subprocess.run(
        [*SERVE_CMD, "--port", "0"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 2
    assert "--registry" in result.stderr


def test_command_on_a_busy_port_says_so(reg: FakeRegistry) -> None:
    server, _ = start_in_thread(reg.storage)
    try:
        result = subprocess.run(
            [*SERVE_CMD, "--registry", str(reg.root), "--port", str(server.port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.close()
    assert result.returncode == 1
    assert f"cannot listen on 127.0.0.1:{server.port}" in result.stderr
    assert "--port" in result.stderr


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_graceful_shutdown_finishes_a_slow_download(tmp_path: Path, signum: int) -> None:
    size = 24 * 1024 * 1024
    fake = make_registry(
        tmp_path / "registry", models=("digits",), sizes={"high": size, "low": 1000}
    )
    blob = fake.blob("digits", "1.1.0", "high")
    with cli_server(tmp_path / "serve.log", "--registry", str(tmp_path / "registry")) as (
        proc,
        url,
    ):
        parts = urlsplit(url)
        assert parts.hostname is not None
        assert parts.port is not None
        # An idle keep-alive connection must not hold the shutdown up.
        idle = connect(url)
        idle.request("GET", "/healthz")
        idle.getresponse().read()
        slow = socket.socket()
        slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        slow.settimeout(30)
        slow.connect((parts.hostname, parts.port))
        slow.sendall(f"GET /blobs/sha256/{blob.digest} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        received = b""
        signalled_at = None
        while True:
            chunk = slow.recv(256 * 1024)
            if not chunk:
                break
            received += chunk
            if signalled_at is None and len(received) > 2 * 1024 * 1024:
                proc.send_signal(signum)
                signalled_at = time.monotonic()
                time.sleep(0.3)
                # No new connections once stopping.
                with pytest.raises(ConnectionRefusedError):
                    socket.create_connection((parts.hostname, parts.port), timeout=2).close()
            time.sleep(0.005)
        # The answer was whole, then the stopping server closed the connection.
        slow.close()
        assert signalled_at is not None
        head, _, data = received.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert len(data) == size
        assert sha(data) == blob.digest
        assert proc.wait(timeout=15) == 0
        assert time.monotonic() - signalled_at < 15
        idle.close()
    log = (tmp_path / "serve.log").read_text()
    assert "finishing answers in flight" in log


def test_200_concurrent_clients_for_30_seconds(tmp_path: Path) -> None:
    """200 clients hammer manifests (200 and 304) and blobs; not one error."""
    seconds = float(__import__("os").environ.get("EDGEREG_SERVE_SOAK_SECONDS", "30"))
    clients = 200
    fake = make_registry(
        tmp_path / "registry",
        models=("digits",),
        sizes={"high": 20_000, "mid": 10_000, "low": 5_000},
    )
    manifests = {
        tier: fake.storage.get(f"manifests/digits/{tier}.json") for tier in ("high", "mid", "low")
    }
    blobs = {tier: fake.blob("digits", "1.1.0", tier) for tier in manifests}
    errors: list[str] = []
    counts = [0] * clients
    # A generous idle timeout: on a loaded machine a client thread may wait
    # long for the CPU, and http.client does not retry a closed keep-alive.
    with cli_server(
        tmp_path / "serve.log", "--registry", str(tmp_path / "registry"), "--timeout", "120"
    ) as (proc, url):
        start = threading.Barrier(clients + 1)
        deadline = 0.0

        def client(index: int) -> None:
            tier = ("high", "mid", "low")[index % 3]
            expected = manifests[tier]
            etag = f'"{sha(expected)}"'
            blob = blobs[tier]
            conn = connect(url, timeout=60)
            start.wait()
            while time.monotonic() < deadline:
                try:
                    conn.request("GET", f"/manifests/digits/{tier}.json")
                    response = conn.getresponse()
                    body = response.read()
                    if response.status != 200 or body != expected:
                        errors.append(f"manifest: {response.status}")
                    conn.request(
                        "GET", f"/manifests/digits/{tier}.json", headers={"If-None-Match": etag}
                    )
                    response = conn.getresponse()
                    if response.status != 304 or response.read() != b"":
                        errors.append(f"304: {response.status}")
                    conn.request("GET", f"/blobs/sha256/{blob.digest}")
                    response = conn.getresponse()
                    body = response.read()
                    if response.status != 200 or len(body) != len(blob.data):
                        errors.append(f"blob: {response.status} {len(body)}")
                    counts[index] += 3
                except Exception as exc:  # every failure counts, whatever it is
                    errors.append(f"{type(exc).__name__}: {exc}")
                    conn.close()
                    conn = connect(url, timeout=60)
            conn.close()

        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + seconds
        start.wait()
        for thread in threads:
            thread.join(timeout=seconds + 120)
        assert proc.poll() is None, "the server died"
        _, metrics = get(url, "/metrics")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    total = sum(counts)
    print(f"{total} requests by {clients} clients in {seconds:g}s")
    assert not errors, f"{len(errors)} errors in {total} requests, e.g. {errors[:5]}"
    assert all(counts), "some clients never completed a round"
    assert total >= clients * 3
    served = _metric(
        metrics.decode(), "edgereg_http_requests_total", route="manifest", method="GET", code="304"
    )
    assert served >= total / 3


# -- the operator page: gates, next step, warnings -----------------------------------------


def _metrics_json(accuracy: float, *, failed: tuple[str, ...] = ()) -> dict[str, Any]:
    """A variant's metrics.json as the build writes it (the parts the page reads)."""
    return {
        "task": "classification",
        "status": "failed" if failed else "passed",
        "metrics": {"accuracy": accuracy, "top1_agreement": 0.99},
        "baseline": {"accuracy": 0.98},
        "gates": {"accuracy.max_drop": not failed, "max_size_mb": True, "min_cosine[y]": True},
        "failed": list(failed),
    }


def _operator_registry(
    root: Path, *, expires_days: int = 3650, candidate_failed: bool = False
) -> tuple[Registry, Signer]:
    """digits: 1.0.0 stable (accuracy 0.95), 1.1.0 a 5% canary (0.97); fresh: only a canary."""
    staging = root.parent / "staging"
    staging.mkdir(parents=True, exist_ok=True)
    signer = Signer.from_pem(generate_key()[0])
    clock = iter(OPS_T0 + timedelta(hours=hour) for hour in range(100))
    registry = Registry(open_storage(str(root)), clock=lambda: next(clock))
    releases = [
        ("digits", "1.0.0", 0.95, None),
        ("digits", "1.1.0", 0.97, 5.0),
        ("fresh", "0.1.0", 0.90, 10.0),
    ]
    for model, version, accuracy, percent in releases:
        prepared, _ = servekit._release(
            model, version, {"high": 3000, "low": 1000}, staging, seed=version
        )
        failed = ("accuracy drop 0.03 > 0.02",) if candidate_failed and version == "1.1.0" else ()
        variants = {
            name: variant.model_copy(update={"metrics": _metrics_json(accuracy, failed=failed)})
            for name, variant in prepared.record.variants.items()
        }
        record = prepared.record.model_copy(update={"variants": variants})
        registry.publish(
            PreparedRelease(record=record, blobs=prepared.blobs),
            signer=signer,
            percent=percent,
            full=percent is None,
            actor="ops@laptop",
            expires_days=expires_days,
        )
    return registry, signer


OPS_T0 = datetime(2025, 3, 1, 8, 0, tzinfo=timezone.utc)


def _section(page: str, model: str) -> str:
    found = re.search(rf'<section id="model-{model}">.*?</section>', page, re.S)
    assert found, page
    return found.group(0)


def _rows(section: str) -> list[list[str]]:
    """The tier table's body rows as lists of cell texts (tags stripped)."""
    body = section.split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return [
        [re.sub(r"<[^>]+>", "", cell) for cell in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        for row in re.findall(r"<tr>(.*?)</tr>", body)
    ]


def test_operator_page_shows_candidate_gates_next_to_stables(tmp_path: Path) -> None:
    registry, _ = _operator_registry(tmp_path / "registry")
    now = OPS_T0 + timedelta(hours=3)  # the canary went out at T0 + 1 h
    page = render_status_page(
        registry.storage, policy=lambda _model: RolloutPolicy(min_soak_hours=24), now=now
    )
    digits = _section(page, "digits")
    high = _rows(digits)[0]
    assert high[:2] == ["high", "5%: candidate high-int8; 95%: stable high-int8"]
    # Stable: variant, size, headline, gates; then the candidate's, in the same row.
    assert high[2:6] == ["high-int8", "3.0 KB", "accuracy 0.95 (fp32 0.98)", "3/3 passed"]
    assert high[6:10] == [
        "high-int8",
        "3.0 KB",
        "accuracy 0.97 (fp32 0.98) +0.02 vs stable",
        "3/3 passed",
    ]
    # Rollout step and when the next one is allowed: 24 h after the canary went out.
    assert "At 5% (steps <b>5%</b> → 25% → 50% → 100%)" in digits
    assert "Next step 25%: allowed from 2025-03-02T09:00:00Z" in digits
    assert "22.0 h left" in digits
    assert "Wait for the soak time, then: <code>edgereg rollout digits --next</code>" in digits
    assert "<code>edgereg rollback digits</code>" in digits
    # Devices with no model: the warning `edgereg status` prints, word for word.
    fresh = _section(page, "fresh")
    warning = escape(model_status(registry, "fresh").warnings[0])
    assert "90% of devices" in warning
    assert f"<li>{warning}</li>" in fresh
    assert "warnings" not in digits
    assert "ops@laptop" not in page


def test_operator_page_after_the_soak_and_without_a_policy(tmp_path: Path) -> None:
    registry, _ = _operator_registry(tmp_path / "registry")
    later = OPS_T0 + timedelta(days=3)
    soaked = _section(
        render_status_page(registry.storage, policy=lambda _m: RolloutPolicy(), now=later),
        "digits",
    )
    assert "Next step 25%: allowed now." in soaked
    assert "Next step: <code>edgereg rollout digits --next</code>" in soaked
    unknown = _section(render_status_page(registry.storage, now=later), "digits")
    assert "The next step and its soak time are unknown here" in unknown
    assert "the last change was at 2025-03-01T09:00:00Z" in unknown
    assert "<code>edgereg rollout digits --next</code>" in unknown


def test_operator_page_next_command_follows_the_state(tmp_path: Path) -> None:
    registry, signer = _operator_registry(tmp_path / "registry")
    later = OPS_T0 + timedelta(days=30)
    policy = RolloutPolicy(steps=[5, 100], min_soak_hours=1)

    def page() -> str:
        return _section(
            render_status_page(registry.storage, policy=lambda _m: policy, now=later), "digits"
        )

    def change(transition: Any, **extra: Any) -> None:
        registry.change(
            "digits",
            lambda state, now, expires: transition(
                state, "digits", now=now, expires=expires, actor="ops", **extra
            ),
            signer=signer,
            expires_days=3650,
        )

    change(transitions.pause)
    assert "Resume the rollout: <code>edgereg resume digits</code>" in page()
    assert "rollout paused" in page()
    change(transitions.resume)
    change(transitions.set_percent, percent=None, policy=policy, force=True)
    assert "Make it stable for every device: <code>edgereg promote digits</code>" in page()
    assert "100%: candidate high-int8" not in page()  # percent 100 says so in full
    assert "candidate high-int8 (100%)" in page()
    change(transitions.promote)
    assert "Nothing to do" in page()
    assert "<code>edgereg publish digits --canary 5%</code>" in page()


def test_operator_page_warns_of_expiring_signatures_and_failed_gates(tmp_path: Path) -> None:
    registry, _ = _operator_registry(tmp_path / "registry", expires_days=5, candidate_failed=True)
    page = render_status_page(registry.storage, now=OPS_T0 + timedelta(hours=3))
    digits = _section(page, "digits")
    assert "digits: the signatures of its state and manifests expire at" in digits
    assert "edgereg resign digits" in digits
    assert "2/3 passed; failed: accuracy drop 0.03 &gt; 0.02" in digits
    assert "The candidate failed gates: <code>edgereg rollback digits</code>" in digits
    expired = render_status_page(registry.storage, now=OPS_T0 + timedelta(days=30))
    assert "expired at" in _section(expired, "digits")


def test_static_status_page_is_the_served_page(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # no models.toml: neither side knows a rollout policy
    fake = make_registry(tmp_path / "registry")
    pinned = tmp_path / "publisher.pem"
    pinned.write_bytes(export_public_key(fake.signer))
    out = tmp_path / "status.html"
    command = ["status", "--registry", str(fake.root), "--trusted-key", str(pinned)]
    result = CliRunner().invoke(main, [*command, "--html", str(out)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    keys = read_trusted_keys([pinned])
    with serve(fake.storage, trusted=lambda: keys) as url:
        _, served = get(url, "/")
    assert out.read_bytes() == served
    page = out.read_text()
    assert "Unverified" not in page
    assert "<code>edgereg rollout digits --next</code>" in page
    assert "release-bot@ci" not in page
    assert not re.search(r"<script|(src|href)=", page)  # self-contained: nothing to load


def test_static_status_page_into_a_missing_directory_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    fake = make_registry(tmp_path / "registry")
    target = tmp_path / "nowhere" / "status.html"
    result = CliRunner().invoke(
        main, ["status", "--registry", str(fake.root), "--html", str(target)]
    )
    assert result.exit_code == 2, result.output
    assert "does not exist" in result.output
    assert not target.parent.exists()
