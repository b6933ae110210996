"""Serving benchmark: `edgereg serve` against nginx on the same registry files, on loopback.

In one run:

1. manifest requests per second and p99 latency, for `edgereg serve` and for
   nginx serving the registry directory as static files (Debian's nginx,
   started as a user process with a temporary config), as ratios; the same
   load generator drives both (wrk when installed, else a threaded Python
   client); then the same with ``If-None-Match`` (the ETag each server gave),
   every answer a 304: what polling devices cost. Targets (issue 32, a quiet
   machine): manifest requests/s and 304 requests/s each >= 0.5x nginx's.
   The load average before and after the rounds is printed beside them;
2. the same for a blob (throughput in MB/s);
3. the bytes a client spends on a check when nothing changed: a conditional
   GET answered 304, request plus response as they go on the wire (HTTP
   bytes; TCP/IP framing not counted). Target: under 400 bytes;
4. with ``--baseline REV``: the same manifest load against `edgereg serve`
   as of git revision REV (e.g. the commit before a change), alternating
   with the current code round by round, as a ratio: a change must not
   lower it;
   With ``--workers N``, `edgereg serve --workers N` is measured (nginx runs
   its usual worker processes, one per core);
5. with ``--soak SECONDS``: 200 keep-alive clients (wrk) on manifests for
   that long while 100 idle sockets are held open (half of them with half a
   request head sent, reopened whenever the server closes them); reports
   errors (target 0), the clients' p99 and the server's peak RSS;
6. with ``--idle-flood 2000,10000``: one host (127.0.0.2) opens that many
   idle sockets and keeps reopening those the server closes, while normal
   clients (127.0.0.1) fetch manifests; reports their success rate (target
   100%) and p99 against the same clients without the flood. Socket counts
   stay within ``ulimit -n`` (the soft limit is raised to the hard one).

nginx and wrk come from Debian: `apt-get install -y nginx-light wrk`. Without
nginx the comparison prints SKIP; without wrk the Python client is used.

Usage: .venv/bin/python benchmarks/serve.py [--registry DIR] [--seconds 5]
       [--rounds 3] [--connections 64] [--baseline REV] [--soak 30]
       [--idle-flood 2000,10000] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from servekit import make_registry  # noqa: E402

NOT_MODIFIED_TARGET = 400  # bytes on the wire for an unchanged check
SERVE_CMD = [sys.executable, "-c", "from edgereg.cli.serve import serve_command; serve_command()"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(url: str, timeout: float = 30) -> None:
    host, port = url.removeprefix("http://").split(":")
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing answers on {url}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def edgereg_server(
    registry: Path,
    workdir: Path,
    *,
    source: Path | None = None,
    pids: list[int] | None = None,
    extra: tuple[str, ...] = (),
) -> Iterator[str]:
    """Run `edgereg serve`; ``source`` is another checkout's top directory to run instead."""
    port = free_port()
    log = (workdir / f"edgereg-serve-{port}.log").open("wb")
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)  # ahead of the editable install
    proc = subprocess.Popen(
        [*SERVE_CMD, "--registry", str(registry), "--port", str(port), *extra],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=workdir,
    )
    if pids is not None:
        pids.append(proc.pid)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# The minimal Python alternative the issue compares against: uvicorn + Starlette
# reading the manifest per request (as edgereg serve does), same headers.
STARLETTE_APP = """
import hashlib, sys
import uvicorn
from starlette.applications import Starlette
from starlette.responses import Response
from starlette.routing import Route

root, port = sys.argv[1], int(sys.argv[2])

async def manifest(request):
    p = request.path_params
    with open(f"{root}/manifests/{p['model']}/{p['tier']}.json", "rb") as f:
        data = f.read()
    etag = '"' + hashlib.sha256(data).hexdigest() + '"'
    headers = {"ETag": etag, "Cache-Control": "public, max-age=60"}
    return Response(data, media_type="application/json", headers=headers)

app = Starlette(routes=[Route("/manifests/{model}/{tier}.json", manifest)])
uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning", access_log=False)
"""


@contextlib.contextmanager
def starlette_server(registry: Path, workdir: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", STARLETTE_APP, str(registry.resolve()), str(port)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=workdir,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def have_starlette() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(name) for name in ("uvicorn", "starlette"))


NGINX_CONF = """
{user}worker_processes 2;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    types {{ application/json json; application/x-pem-file pem; }}
    default_type application/octet-stream;
    server {{
        listen 127.0.0.1:{port};
        root {root};
        location ~ /\\. {{ deny all; }}
        location /manifests/ {{ add_header Cache-Control "public, max-age=60"; }}
        location /blobs/ {{ add_header Cache-Control "public, max-age=31536000, immutable"; }}
    }}
}}
"""


@contextlib.contextmanager
def nginx_server(nginx: str, registry: Path, workdir: Path) -> Iterator[str]:
    port = free_port()
    tmp = workdir / "nginx"
    tmp.mkdir()
    # As root, nginx would drop its workers to "nobody", who may not read a
    # private temp directory; a user process keeps its own user anyway.
    user = "user root;\n" if os.geteuid() == 0 else ""
    conf = tmp / "nginx.conf"
    conf.write_text(NGINX_CONF.format(user=user, tmp=tmp, port=port, root=registry.resolve()))
    proc = subprocess.Popen(
        [nginx, "-c", str(conf), "-p", str(tmp), "-e", str(tmp / "error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(url)
        yield url
    finally:
        proc.send_signal(signal.SIGQUIT)  # nginx's graceful stop
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# -- load generators -------------------------------------------------------------------

_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _seconds(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"cannot read the duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)]


def run_wrk(
    wrk: str, url: str, seconds: float, connections: int, headers: dict[str, str] | None = None
) -> dict[str, float]:
    extra = [arg for name, value in (headers or {}).items() for arg in ("-H", f"{name}: {value}")]
    result = subprocess.run(
        [
            wrk,
            "-t2",
            f"-c{connections}",
            f"-d{seconds:g}s",
            "--latency",
            "--timeout",
            "10s",
            *extra,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    out = result.stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    non_2xx = socket_errors = 0
    found = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if found:
        non_2xx = int(found.group(1))
    found = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if found:
        socket_errors = sum(int(g) for g in found.groups())
    errors = non_2xx + socket_errors
    transfer = re.search(r"Transfer/sec:\s+([0-9.]+)(B|KB|MB|GB)", out)
    mbps = 0.0
    if transfer:
        scale = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[transfer.group(2)]
        mbps = float(transfer.group(1)) * scale / 1e6
    return {
        "requests_per_s": rps,
        "p50_ms": _seconds(p50.group(1)) * 1000 if p50 else float("nan"),
        "p99_ms": _seconds(p99.group(1)) * 1000 if p99 else float("nan"),
        "requests": total,  # answered, whatever the status
        "errors": errors,
        "non_2xx": non_2xx,
        "socket_errors": socket_errors,
        "mb_per_s": mbps,
    }


def run_python_client(
    url: str, seconds: float, connections: int, headers: dict[str, str] | None = None
) -> dict[str, float]:
    """Fallback load generator: one keep-alive connection per thread."""
    host, port_path = url.removeprefix("http://").split(":", 1)
    port, _, path = port_path.partition("/")
    latencies: list[list[float]] = [[] for _ in range(connections)]
    errors = [0] * connections
    non_2xx = [0] * connections
    received = [0] * connections
    deadline = time.monotonic() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                conn.request("GET", "/" + path, headers=headers or {})
                response = conn.getresponse()
                body = response.read()
                if response.status not in (200, 304):
                    errors[index] += 1
                    non_2xx[index] += 1
                received[index] += len(body)
            except (OSError, http.client.HTTPException):
                errors[index] += 1
                conn.close()
                conn = http.client.HTTPConnection(host, int(port), timeout=10)
                continue
            latencies[index].append(time.perf_counter() - started)
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(connections)]
    begun = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - begun
    everything = sorted(x for per in latencies for x in per)
    quantiles = statistics.quantiles(everything, n=100) if len(everything) > 1 else [0.0] * 99
    return {
        "requests_per_s": len(everything) / elapsed,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
        "requests": len(everything),  # answered, whatever the status
        "errors": sum(errors),
        "non_2xx": sum(non_2xx),
        "socket_errors": sum(errors) - sum(non_2xx),
        "mb_per_s": sum(received) / elapsed / 1e6,
    }


# -- a baseline revision and the soak --------------------------------------------------


def extract_revision(revision: str, workdir: Path) -> Path:
    """The ``edgereg`` package as of a git revision, in a directory to put on PYTHONPATH."""
    target = workdir / "baseline"
    target.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", revision, "edgereg"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
    return target


def rss(pid: int, field: str = "VmRSS") -> int:
    """A memory figure of a process from /proc (VmRSS now, VmHWM the peak), in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


class IdleSockets:
    """Hold ``count`` connections open doing nothing (half with half a request head).

    A connection the server closes (idle or head timeout) is reopened at once,
    so the server always has ``count`` idle sockets on its hands.
    """

    def __init__(self, url: str, count: int) -> None:
        self._address = url.removeprefix("http://").split(":")
        self._count = count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.reopened = 0
        self.refused = 0

    def _open(self, index: int) -> socket.socket | None:
        try:
            sock = socket.create_connection((self._address[0], int(self._address[1])), timeout=5)
            if index % 2:
                sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
            return sock
        except OSError:
            self.refused += 1
            return None

    def _run(self) -> None:
        import select

        sockets = [self._open(i) for i in range(self._count)]
        while not self._stop.wait(0.2):
            live = [s for s in sockets if s is not None]
            readable = set(select.select(live, [], [], 0)[0]) if live else set()
            for index, sock in enumerate(sockets):
                if sock is None or sock in readable:  # closed or answered by the server
                    if sock is not None:
                        sock.close()
                        self.reopened += 1
                    sockets[index] = self._open(index)
        for sock in sockets:
            if sock is not None:
                sock.close()

    def __enter__(self) -> IdleSockets:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def soak(
    load: Any, url: str, path: str, seconds: float, pid: int, clients: int = 200, idle: int = 100
) -> dict[str, float]:
    """``clients`` busy clients for ``seconds`` while ``idle`` sockets are held open."""
    before = rss(pid)
    peak = [before]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.05):
            peak[0] = max(peak[0], rss(pid))

    # The control: the same clients without idle sockets, so "unaffected" is a ratio.
    control = load(url, path, clients, min(seconds, 10.0))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    with IdleSockets(url, idle) as holder:
        time.sleep(1.0)  # every idle socket is open before the load starts
        result = load(url, path, clients, seconds)
    done.set()
    sampler.join()
    result.update(
        {
            "rss_before_mb": before / 1e6,
            "rss_peak_mb": max(peak[0], rss(pid, "VmHWM")) / 1e6,
            "idle_sockets": idle,
            "control_requests_per_s": control["requests_per_s"],
            "control_p99_ms": control["p99_ms"],
            "control_errors": control["errors"],
            "idle_reopened": holder.reopened,
            "idle_refused": holder.refused,
            "clients": clients,
            "seconds": seconds,
        }
    )
    return result


class IdleFlood:
    """One host holding ``count`` idle sockets: what filled the connection cap in issue #22.

    Opened from 127.0.0.2, so the server sees another host than the normal
    clients; a socket the server closes is reopened (at most ``reopen_per_s``
    a second: an attacker's churn, not a CPU flood of connects).
    """

    def __init__(self, url: str, count: int, source: str = "127.0.0.2") -> None:
        host, port = url.removeprefix("http://").split(":")
        self._address = (host, int(port))
        self._source = source
        self._count = count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self.opened = 0
        self.refused = 0
        self.closed_by_server = 0
        self.held_at_end = 0

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(
                self._address, timeout=5, source_address=(self._source, 0)
            )
        except OSError:
            self.refused += 1
            return None
        self.opened += 1
        return sock

    def _run(self, reopen_per_s: int = 500) -> None:
        import selectors

        sockets: list[socket.socket | None] = []
        for _ in range(self._count):
            if self._stop.is_set():
                break
            sockets.append(self._open())
        selector = selectors.DefaultSelector()
        for index, sock in enumerate(sockets):
            if sock is not None:
                selector.register(sock, selectors.EVENT_READ, index)
        while not self._stop.wait(0.2):
            for key, _ in selector.select(timeout=0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                selector.unregister(sock)
                sock.close()
                sockets[key.data] = None
                self.closed_by_server += 1
            budget = reopen_per_s // 5
            for index, sock in enumerate(sockets):
                if budget <= 0:
                    break
                if sock is None:
                    budget -= 1
                    sockets[index] = self._open()
                    if sockets[index] is not None:
                        selector.register(sockets[index], selectors.EVENT_READ, index)
        self.held_at_end = sum(sock is not None for sock in sockets)
        selector.close()
        for sock in sockets:
            if sock is not None:
                sock.close()

    def __enter__(self) -> IdleFlood:
        self._thread.start()
        return self

    def wait_until_open(self, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while self.opened + self.refused < self._count and time.monotonic() < deadline:
            time.sleep(0.1)

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def idle_flood(load: Any, url: str, path: str, counts: list[int], seconds: float) -> dict[str, Any]:
    """Normal clients' success rate and p99 while one host holds ``counts`` idle sockets."""
    clients = 20
    control = load(url, path, clients, seconds)
    out: dict[str, Any] = {"clients": clients, "seconds": seconds, "control": control, "runs": []}
    for count in counts:
        with IdleFlood(url, count) as flood:
            flood.wait_until_open()
            time.sleep(1.0)
            result = load(url, path, clients, seconds)
        # Answered 2xx out of every attempt (an answer or a socket error).
        attempts = result["requests"] + result["socket_errors"]
        succeeded = result["requests"] - result["non_2xx"]
        out["runs"].append(
            {
                "idle_sockets": count,
                "opened": flood.opened,
                "refused": flood.refused,
                "closed_by_server": flood.closed_by_server,
                "held_at_end": flood.held_at_end,
                "success_rate": succeeded / attempts if attempts else 0.0,
                **result,
            }
        )
    return out


def raise_open_files_limit() -> int:
    """Raise the soft limit of open files to the hard one; returns the soft limit now."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


# -- the 304 check ---------------------------------------------------------------------


def not_modified_bytes(url: str, path: str) -> tuple[int, int, int]:
    """(request bytes, response bytes, status) of a conditional GET with the current ETag."""
    host = url.removeprefix("http://")
    conn = http.client.HTTPConnection(*host.split(":"), timeout=10)
    conn.request("GET", path)
    response = conn.getresponse()
    response.read()
    etag = response.getheader("ETag")
    conn.close()
    request = f"GET {path} HTTP/1.1\r\nHost: {host}\r\nIf-None-Match: {etag}\r\n\r\n".encode()
    hostname, port = host.split(":")
    with socket.create_connection((hostname, int(port)), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(4096)
            if not chunk:
                break
            answer += chunk
    status = int(answer.split(b" ", 2)[1])
    return len(request), len(answer), status


def etag_of(url: str, path: str) -> str:
    """The ETag a server gives ``path`` now (what a device holds and sends back)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        etag = response.getheader("ETag")
    finally:
        conn.close()
    if etag is None:
        raise RuntimeError(f"{url}{path} has no ETag")
    return etag


def _loads(values: Any) -> str:
    return "?" if values is None else "/".join(f"{v:.1f}" for v in values)


# -- main ------------------------------------------------------------------------------


def median_run(runs: list[dict[str, float]], key: str) -> dict[str, float]:
    """The run with the median ``key`` (errors summed over every run)."""
    ordered = sorted(runs, key=lambda run: run[key])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["errors"] = sum(run["errors"] for run in runs)
    return chosen


def pick_paths(registry: Path) -> tuple[str, str]:
    def visible(paths: Iterator[Path]) -> list[Path]:
        # Skip the local backend's own .lock-* and .tmp-* files.
        return [p for p in paths if not p.name.startswith(".")]

    manifests = sorted(visible((registry / "manifests").glob("*/*.json")))
    blobs = sorted(
        visible((registry / "blobs" / "sha256").iterdir()), key=lambda p: -p.stat().st_size
    )
    if not manifests or not blobs:
        raise SystemExit(f"{registry} holds no manifest or blob")
    manifest = "/" + manifests[0].relative_to(registry).as_posix()
    blob = "/" + blobs[0].relative_to(registry).as_posix()
    return manifest, blob


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--registry",
        type=Path,
        help="serve this registry directory (default: a fresh one made with tests/servekit.py)",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server")
    parser.add_argument("--connections", type=int, default=64)
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also measure manifests against `edgereg serve` as of this git revision",
    )
    parser.add_argument(
        "--soak",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="then run 200 clients for this long with 100 idle sockets held open",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        help="run `edgereg serve --workers N` (ratios and p99 against nginx with N workers)",
    )
    parser.add_argument(
        "--idle-flood",
        default="",
        metavar="N,N",
        help="then measure normal clients while one host holds N idle sockets (e.g. 2000,10000)",
    )
    parser.add_argument(
        "--only-flood",
        action="store_true",
        help="measure the idle flood only (no nginx comparison rounds)",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()
    flood_counts = [int(n) for n in args.idle_flood.split(",") if n.strip()]
    open_files = raise_open_files_limit()
    too_many = [n for n in flood_counts if n + 2048 > open_files]
    if too_many:
        parser.error(
            f"--idle-flood {too_many[0]} needs about {too_many[0] + 2048} open files; "
            f"ulimit -n allows {open_files}"
        )

    workdir = Path(tempfile.mkdtemp(prefix="edgereg-bench-serve-"))
    try:
        registry = args.registry
        if registry is None:
            registry = workdir / "registry"
            make_registry(
                registry,
                models=("digits",),
                sizes={"high": 2_000_000, "mid": 500_000, "low": 100_000},
            )
        manifest, blob = pick_paths(registry)
        wrk = shutil.which("wrk")
        nginx = shutil.which("nginx") or (
            "/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None
        )
        generator = "wrk" if wrk else "python threads"

        def load(
            url: str,
            path: str,
            connections: int,
            seconds: float | None = None,
            headers: dict[str, str] | None = None,
        ) -> dict[str, float]:
            duration = args.seconds if seconds is None else seconds
            if wrk:
                return run_wrk(wrk, url + path, duration, connections, headers)
            return run_python_client(url + path, duration, connections, headers)

        results: dict[str, Any] = {
            "registry": str(registry),
            "manifest": manifest,
            "blob": blob,
            "generator": generator,
            "connections": args.connections,
            "seconds": args.seconds,
            "rounds": args.rounds,
            "workers": args.workers,
        }
        with contextlib.ExitStack() as stack:
            pids: list[int] = []
            extra = ("--workers", str(args.workers)) if args.workers > 1 else ()
            urls = {
                "edgereg": stack.enter_context(
                    edgereg_server(registry, workdir, pids=pids, extra=extra)
                )
            }
            if args.baseline:
                source = extract_revision(args.baseline, workdir)
                urls["baseline"] = stack.enter_context(
                    edgereg_server(registry, workdir, source=source)
                )
                results["baseline_revision"] = args.baseline
            if have_starlette() and not args.only_flood:
                urls["starlette"] = stack.enter_context(starlette_server(registry, workdir))
            if nginx and not args.only_flood:
                urls["nginx"] = stack.enter_context(nginx_server(nginx, registry, workdir))
            runs: dict[str, dict[str, list[dict[str, float]]]] = {
                name: {"manifest": [], "blob": [], "conditional": []} for name in urls
            }
            # Devices poll with the ETag they hold: the 304 is the hot path.
            # (The Starlette app answers no conditional request.)
            validators = {
                name: {"If-None-Match": etag_of(url, manifest)}
                for name, url in urls.items()
                if name != "starlette"
            }
            results["load_average_before"] = os.getloadavg()
            # Alternate the servers round by round, so a noisy neighbour on the
            # machine hurts all alike; report the median round.
            for _ in range(1 if args.only_flood else args.rounds):
                for name, url in urls.items():
                    runs[name]["manifest"].append(load(url, manifest, args.connections))
                    if name in validators and not args.only_flood:
                        runs[name]["conditional"].append(
                            load(url, manifest, args.connections, headers=validators[name])
                        )
                    if name not in ("baseline", "starlette"):
                        runs[name]["blob"].append(load(url, blob, min(args.connections, 10)))
            results["load_average_after"] = os.getloadavg()
            for name, url in urls.items():
                results[name] = {
                    "manifest": median_run(runs[name]["manifest"], "requests_per_s"),
                    "not_modified": not_modified_bytes(url, manifest),
                }
                if runs[name]["blob"]:
                    results[name]["blob"] = median_run(runs[name]["blob"], "mb_per_s")
                if runs[name]["conditional"]:
                    results[name]["conditional"] = median_run(
                        runs[name]["conditional"], "requests_per_s"
                    )
            if args.soak > 0:
                results["soak"] = soak(load, urls["edgereg"], manifest, args.soak, pids[0])
            if flood_counts:
                results["idle_flood"] = idle_flood(
                    load, urls["edgereg"], manifest, flood_counts, args.seconds
                )
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    ours = results["edgereg"]
    request_bytes, response_bytes, status = ours["not_modified"]
    wire = request_bytes + response_bytes
    passed = status == 304 and wire < NOT_MODIFIED_TARGET
    results["not_modified_pass"] = passed
    if "nginx" in results:
        theirs = results["nginx"]
        results["ratios"] = {
            "manifest_rps": ours["manifest"]["requests_per_s"]
            / theirs["manifest"]["requests_per_s"],
            "manifest_p99": ours["manifest"]["p99_ms"] / theirs["manifest"]["p99_ms"],
            "blob_mbps": ours["blob"]["mb_per_s"] / max(theirs["blob"]["mb_per_s"], 1e-9),
        }
        if "conditional" in ours and "conditional" in theirs:
            results["ratios"]["not_modified_rps"] = (
                ours["conditional"]["requests_per_s"] / theirs["conditional"]["requests_per_s"]
            )
            results["ratios"]["not_modified_p99"] = (
                ours["conditional"]["p99_ms"] / theirs["conditional"]["p99_ms"]
            )
    if "baseline" in results:
        results.setdefault("ratios", {})["manifest_rps_vs_baseline"] = (
            ours["manifest"]["requests_per_s"] / results["baseline"]["manifest"]["requests_per_s"]
        )
        if "conditional" in ours and "conditional" in results["baseline"]:
            results["ratios"]["not_modified_rps_vs_baseline"] = (
                ours["conditional"]["requests_per_s"]
                / results["baseline"]["conditional"]["requests_per_s"]
            )
    targets = {"manifest_rps": 0.5, "not_modified_rps": 0.5}
    results["targets"] = {
        name: {"target": f">= {floor}", "pass": results["ratios"][name] >= floor}
        for name, floor in targets.items()
        if name in results.get("ratios", {})
    }
    if "starlette" in results and "nginx" in results:
        results["ratios"]["starlette_manifest_rps"] = (
            results["starlette"]["manifest"]["requests_per_s"]
            / results["nginx"]["manifest"]["requests_per_s"]
        )
    soaked = results.get("soak")
    if soaked is not None:
        passed = passed and soaked["errors"] == 0 and soaked["control_errors"] == 0
    flooded = results.get("idle_flood")
    if flooded is not None:
        passed = passed and all(run["success_rate"] == 1.0 for run in flooded["runs"])
    passed = passed and all(verdict["pass"] for verdict in results["targets"].values())
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if passed else 1

    print(
        f"registry {registry}; load: {generator}, {args.connections} connections, "
        f"median of {args.rounds} rounds of {args.seconds:g}s; server and load generator "
        f"share {os.cpu_count()} cores; load average (1, 5, 15 min) "
        f"{_loads(results.get('load_average_before'))} before, "
        f"{_loads(results.get('load_average_after'))} after"
    )
    label = "edgereg serve" + (f" x{args.workers}" if args.workers > 1 else "")
    print(f"{'':24}{label:>16}{'nginx':>16}{'ratio':>10}")

    def row(label: str, key: str, what: str, fmt: str, ratio: str | None) -> None:
        mine = format(ours[what][key], fmt)
        other = format(results["nginx"][what][key], fmt) if "nginx" in results else "SKIP"
        value = format(results["ratios"][ratio], ".2f") if ratio and "ratios" in results else ""
        print(f"{label:24}{mine:>16}{other:>16}{value:>10}")

    row("manifest requests/s", "requests_per_s", "manifest", ",.0f", "manifest_rps")
    row("manifest p50 ms", "p50_ms", "manifest", ".2f", None)
    row("manifest p99 ms", "p99_ms", "manifest", ".2f", "manifest_p99")
    row("manifest errors", "errors", "manifest", ".0f", None)
    if "conditional" in ours:
        row("304 requests/s", "requests_per_s", "conditional", ",.0f", "not_modified_rps")
        row("304 p99 ms", "p99_ms", "conditional", ".2f", "not_modified_p99")
    row("blob MB/s", "mb_per_s", "blob", ",.0f", "blob_mbps")
    if "nginx" not in results:
        print("SKIP nginx comparison: nginx is not installed (apt-get install -y nginx-light)")
    if "starlette" in results:
        other = results["starlette"]["manifest"]
        vs_nginx = results.get("ratios", {}).get("starlette_manifest_rps")
        print(
            f"manifest requests/s, minimal uvicorn + Starlette app: {other['requests_per_s']:,.0f}"
            + (f" ({vs_nginx:.2f} of nginx)" if vs_nginx else "")
            + f"; edgereg serve / it = "
            f"{ours['manifest']['requests_per_s'] / other['requests_per_s']:.2f}"
        )
    else:
        print("SKIP uvicorn + Starlette comparison: pip install uvicorn starlette")
    if "baseline" in results:
        before = results["baseline"]["manifest"]
        print(
            f"manifest requests/s at {results['baseline_revision']}: "
            f"{before['requests_per_s']:,.0f} (p99 {before['p99_ms']:.2f} ms); now / then = "
            f"{results['ratios']['manifest_rps_vs_baseline']:.2f}"
        )
        if "not_modified_rps_vs_baseline" in results["ratios"]:
            then = results["baseline"]["conditional"]
            print(
                f"304 requests/s at {results['baseline_revision']}: "
                f"{then['requests_per_s']:,.0f} (p99 {then['p99_ms']:.2f} ms); now / then = "
                f"{results['ratios']['not_modified_rps_vs_baseline']:.2f}"
            )
    for name, verdict in results["targets"].items():
        print(
            f"target {name} {verdict['target']} (of nginx): "
            f"{results['ratios'][name]:.2f} {'PASS' if verdict['pass'] else 'FAIL'}"
        )
    if soaked is not None:
        print(
            f"soak: {soaked['clients']:.0f} clients for {soaked['seconds']:g}s with "
            f"{soaked['idle_sockets']:.0f} idle sockets held open "
            f"(reopened {soaked['idle_reopened']:.0f} times after the server cut them off): "
            f"{soaked['requests']:,.0f} requests, {soaked['requests_per_s']:,.0f}/s, "
            f"p99 {soaked['p99_ms']:.1f} ms, errors {soaked['errors']:.0f} (target 0: "
            f"{'PASS' if soaked['errors'] == 0 else 'FAIL'}); server RSS "
            f"{soaked['rss_before_mb']:.0f} MB before, peak {soaked['rss_peak_mb']:.0f} MB"
        )
        print(
            f"soak control, the same clients without idle sockets: "
            f"{soaked['control_requests_per_s']:,.0f}/s, p99 {soaked['control_p99_ms']:.1f} ms; "
            f"with / without = "
            f"{soaked['requests_per_s'] / soaked['control_requests_per_s']:.2f}"
        )
    if flooded is not None:
        control = flooded["control"]
        print(
            f"idle flood: {flooded['clients']} normal clients (127.0.0.1) on manifests for "
            f"{flooded['seconds']:g}s; without a flood {control['requests_per_s']:,.0f}/s, "
            f"p99 {control['p99_ms']:.1f} ms, errors {control['errors']:.0f}"
        )
        for run in flooded["runs"]:
            print(
                f"  one host (127.0.0.2) holding {run['idle_sockets']:,} idle sockets "
                f"(opened {run['opened']:,}, closed by the server {run['closed_by_server']:,}, "
                f"held at the end {run['held_at_end']:,}): success "
                f"{100 * run['success_rate']:.2f}% "
                f"({'PASS' if run['success_rate'] == 1.0 else 'FAIL'}), "
                f"{run['requests_per_s']:,.0f}/s, p99 {run['p99_ms']:.1f} ms, "
                f"errors {run['errors']:.0f}"
            )
    theirs_wire = ""
    if "nginx" in results:
        n_req, n_resp, _ = results["nginx"]["not_modified"]
        theirs_wire = f" (nginx: {n_req} + {n_resp} = {n_req + n_resp})"
    print(
        f"unchanged check (304): {request_bytes} request + {response_bytes} response = "
        f"{wire} bytes on the wire{theirs_wire}; target < {NOT_MODIFIED_TARGET}: "
        f"{'PASS' if results['not_modified_pass'] else 'FAIL'}"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
