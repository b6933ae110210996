"""Serving benchmark: `edgereg serve` against nginx on the same registry files, on loopback.

In one run:

1. manifest requests per second and p99 latency, for `edgereg serve` and for
   nginx serving the registry directory as static files (Debian's nginx,
   started as a user process with a temporary config), as ratios; the same
   load generator drives both (wrk when installed, else a threaded Python
   client);
2. the same for a blob (throughput in MB/s);
3. the bytes a client spends on a check when nothing changed: a conditional
   GET answered 304, request plus response as they go on the wire (HTTP
   bytes; TCP/IP framing not counted). Target: under 400 bytes;
4. with ``--baseline REV``: the same manifest load against `edgereg serve`
   as of git revision REV (e.g. the commit before a change), alternating
   with the current code round by round, as a ratio: a change must not
   lower it;
5. with ``--soak SECONDS``: 200 keep-alive clients (wrk) on manifests for
   that long while 100 idle sockets are held open (half of them with half a
   request head sent, reopened whenever the server closes them); reports
   errors (target 0), the clients' p99 and the server's peak RSS.

nginx and wrk come from Debian: `apt-get install -y nginx-light wrk`. Without
nginx the comparison prints SKIP; without wrk the Python client is used.

Usage: .venv/bin/python benchmarks/serve.py [--registry DIR] [--seconds 5]
       [--rounds 3] [--connections 50] [--baseline REV] [--soak 30] [--json]
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
    registry: Path, workdir: Path, *, source: Path | None = None, pids: list[int] | None = None
) -> Iterator[str]:
    """Run `edgereg serve`; ``source`` is another checkout's top directory to run instead."""
    port = free_port()
    log = (workdir / f"edgereg-serve-{port}.log").open("wb")
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)  # ahead of the editable install
    proc = subprocess.Popen(
        [*SERVE_CMD, "--registry", str(registry), "--port", str(port)],
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


def run_wrk(wrk: str, url: str, seconds: float, connections: int) -> dict[str, float]:
    result = subprocess.run(
        [wrk, "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "10s", url],
        capture_output=True,
        text=True,
        check=True,
    )
    out = result.stdout
    rps = float(re.search(r"Requests/sec:\s+([0-9.]+)", out).group(1))  # type: ignore[union-attr]
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE)
    total = int(re.search(r"(\d+) requests in", out).group(1))  # type: ignore[union-attr]
    errors = 0
    for pattern in (
        r"Non-2xx or 3xx responses: (\d+)",
        r"Socket errors: connect (\d+), "
        r"read (\d+), write (\d+), timeout (\d+)",
    ):
        found = re.search(pattern, out)
        if found:
            errors += sum(int(g) for g in found.groups())
    transfer = re.search(r"Transfer/sec:\s+([0-9.]+)(B|KB|MB|GB)", out)
    mbps = 0.0
    if transfer:
        scale = {"B": 1, "KB": 1024, "MB": 1024**2, "GB": 1024**3}[transfer.group(2)]
        mbps = float(transfer.group(1)) * scale / 1e6
    return {
        "requests_per_s": rps,
        "p50_ms": _seconds(p50.group(1)) * 1000 if p50 else float("nan"),
        "p99_ms": _seconds(p99.group(1)) * 1000 if p99 else float("nan"),
        "requests": total,
        "errors": errors,
        "mb_per_s": mbps,
    }


def run_python_client(url: str, seconds: float, connections: int) -> dict[str, float]:
    """Fallback load generator: one keep-alive connection per thread."""
    host, port_path = url.removeprefix("http://").split(":", 1)
    port, _, path = port_path.partition("/")
    latencies: list[list[float]] = [[] for _ in range(connections)]
    errors = [0] * connections
    received = [0] * connections
    deadline = time.monotonic() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        while time.monotonic() < deadline:
            started = time.perf_counter()
            try:
                conn.request("GET", "/" + path)
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    errors[index] += 1
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
        "requests": len(everything),
        "errors": sum(errors),
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
    parser.add_argument("--connections", type=int, default=50)
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
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args()

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
            url: str, path: str, connections: int, seconds: float | None = None
        ) -> dict[str, float]:
            duration = args.seconds if seconds is None else seconds
            if wrk:
                return run_wrk(wrk, url + path, duration, connections)
            return run_python_client(url + path, duration, connections)

        results: dict[str, Any] = {
            "registry": str(registry),
            "manifest": manifest,
            "blob": blob,
            "generator": generator,
            "connections": args.connections,
            "seconds": args.seconds,
            "rounds": args.rounds,
        }
        with contextlib.ExitStack() as stack:
            pids: list[int] = []
            urls = {"edgereg": stack.enter_context(edgereg_server(registry, workdir, pids=pids))}
            if args.baseline:
                source = extract_revision(args.baseline, workdir)
                urls["baseline"] = stack.enter_context(
                    edgereg_server(registry, workdir, source=source)
                )
                results["baseline_revision"] = args.baseline
            if have_starlette():
                urls["starlette"] = stack.enter_context(starlette_server(registry, workdir))
            if nginx:
                urls["nginx"] = stack.enter_context(nginx_server(nginx, registry, workdir))
            runs: dict[str, dict[str, list[dict[str, float]]]] = {
                name: {"manifest": [], "blob": []} for name in urls
            }
            # Alternate the servers round by round, so a noisy neighbour on the
            # machine hurts all alike; report the median round.
            for _ in range(args.rounds):
                for name, url in urls.items():
                    runs[name]["manifest"].append(load(url, manifest, args.connections))
                    if name not in ("baseline", "starlette"):
                        runs[name]["blob"].append(load(url, blob, min(args.connections, 10)))
            for name, url in urls.items():
                results[name] = {
                    "manifest": median_run(runs[name]["manifest"], "requests_per_s"),
                    "not_modified": not_modified_bytes(url, manifest),
                }
                if runs[name]["blob"]:
                    results[name]["blob"] = median_run(runs[name]["blob"], "mb_per_s")
            if args.soak > 0:
                results["soak"] = soak(load, urls["edgereg"], manifest, args.soak, pids[0])
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
    if "baseline" in results:
        results.setdefault("ratios", {})["manifest_rps_vs_baseline"] = (
            ours["manifest"]["requests_per_s"] / results["baseline"]["manifest"]["requests_per_s"]
        )
    if "starlette" in results and "nginx" in results:
        results["ratios"]["starlette_manifest_rps"] = (
            results["starlette"]["manifest"]["requests_per_s"]
            / results["nginx"]["manifest"]["requests_per_s"]
        )
    soaked = results.get("soak")
    if soaked is not None:
        passed = passed and soaked["errors"] == 0 and soaked["control_errors"] == 0
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if passed else 1

    print(
        f"registry {registry}; load: {generator}, {args.connections} connections, "
        f"median of {args.rounds} rounds of {args.seconds:g}s; server and load generator "
        f"share {os.cpu_count()} cores"
    )
    print(f"{'':24}{'edgereg serve':>16}{'nginx':>16}{'ratio':>10}")

    def row(label: str, key: str, what: str, fmt: str, ratio: str | None) -> None:
        mine = format(ours[what][key], fmt)
        other = format(results["nginx"][what][key], fmt) if "nginx" in results else "SKIP"
        value = format(results["ratios"][ratio], ".2f") if ratio and "ratios" in results else ""
        print(f"{label:24}{mine:>16}{other:>16}{value:>10}")

    row("manifest requests/s", "requests_per_s", "manifest", ",.0f", "manifest_rps")
    row("manifest p50 ms", "p50_ms", "manifest", ".2f", None)
    row("manifest p99 ms", "p99_ms", "manifest", ".2f", "manifest_p99")
    row("manifest errors", "errors", "manifest", ".0f", None)
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
    theirs_wire = ""
    if "nginx" in results:
        n_req, n_resp, _ = results["nginx"]["not_modified"]
        theirs_wire = f" (nginx: {n_req} + {n_resp} = {n_req + n_resp})"
    print(
        f"unchanged check (304): {request_bytes} request + {response_bytes} response = "
        f"{wire} bytes on the wire{theirs_wire}; target < {NOT_MODIFIED_TARGET}: "
        f"{'PASS' if passed else 'FAIL'}"
    )
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
