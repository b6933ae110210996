"""Report-store benchmark: ingestion through `edgereg serve`, and summaries over a million reports.

In one run, for SQLite and for PostgreSQL (a real server from Debian's
package, tests/pgkit.py, fsync on):

1. one `edgereg serve` process (one worker) on loopback: manifest requests
   per second and p99, then ``POST /v1/reports`` (a new token per request,
   so every one is an insert) per second and p99 against the same server,
   with the same load generator (wrk with a Lua script when installed,
   else a threaded Python client) and connections; the ratio reports/s over
   manifests/s is printed (target >= 0.5);
2. ``summaries()`` over 1,000,000 stored reports (bulk-inserted through
   ``ingest_many``, not HTTP; 3 tiers, a 10% candidate arm): seconds
   (target < 5 s) and the peak memory it adds to this process.

Usage: .venv/bin/python benchmarks/reports.py [--seconds 5] [--connections 50]
       [--rows 1000000] [--only sqlite|postgresql] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT))

from _memory import peak_growth  # noqa: E402
from pgkit import PostgresServer  # noqa: E402
from serve import free_port, wait_for  # noqa: E402  (benchmarks/serve.py)
from servekit import SERVE_CMD, make_registry  # noqa: E402

from edgereg.protocol.reports import LatencySummary, Report  # noqa: E402
from edgereg.reports import open_store  # noqa: E402

RATIO_TARGET = 0.5
SUMMARY_TARGET_S = 5.0

REPORT_TEMPLATE = {
    "arm": "candidate",
    "backend": "cpu",
    "confirmed": True,
    "inference": {"count": 120, "p50_ms": 2.4, "p90_ms": 3.1, "p99_ms": 5.0},
    "load_ms": 14.2,
    "model": "digits",
    "probe": "passed",
    "sequence": 3,
    "tier": "high",
    "token": "TOKEN",
    "unit": "digits",
    "unit_version": "1.1.0",
    "variant": "int8",
    "version": "1.1.0",
    "mnn_runtime": "3.6.1",
    "os": "android",
    "os_version": "14",
    "device_class": "ram8-8c",
}
TEMPLATE_JSON = json.dumps(REPORT_TEMPLATE, separators=(",", ":"))

WRK_SCRIPT = """
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local template = [[%s]]
local counter = 0
-- Global, not local: thread:set() gives each thread its own id.
id = 0
local threads = 0
function setup(thread)
  threads = threads + 1
  thread:set("id", threads)
end
function init(args)
  math.randomseed(os.time() + id * 7919)
end
function request()
  counter = counter + 1
  local token = string.format("%%08x%%08x%%08x%%08x", math.random(0, 2147483647),
    math.random(0, 2147483647), id, counter)
  return wrk.format(nil, nil, nil, (template:gsub("TOKEN", token)))
end
"""


@contextlib.contextmanager
def edgereg_server(registry: Path, store_url: str, workdir: Path) -> Iterator[str]:
    port = free_port()
    log = (workdir / f"serve-{port}.log").open("wb")
    proc = subprocess.Popen(
        [
            *SERVE_CMD,
            "--registry",
            str(registry),
            "--port",
            str(port),
            "--reports",
            store_url,
            # The benchmark is one client address: lift the per-address limit.
            "--reports-rate",
            "1e9",
            "--reports-burst",
            "1000000000",
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
    )
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


_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0}


def _ms(text: str) -> float:
    match = re.fullmatch(r"([0-9.]+)(us|ms|s|m)", text)
    if not match:
        raise ValueError(f"cannot read the duration {text!r}")
    return float(match.group(1)) * _UNITS[match.group(2)] * 1000


def run_wrk(
    wrk: str, url: str, seconds: float, connections: int, script: Path | None
) -> dict[str, float]:
    command = [wrk, "-t2", f"-c{connections}", f"-d{seconds:g}s", "--latency", "--timeout", "10s"]
    if script is not None:
        command += ["-s", str(script)]
    out = subprocess.run([*command, url], capture_output=True, text=True, check=True).stdout
    rps = re.search(r"Requests/sec:\s+([0-9.]+)", out)
    p50 = re.search(r"^\s+50%\s+(\S+)", out, re.MULTILINE)
    p99 = re.search(r"^\s+99%\s+(\S+)", out, re.MULTILINE)
    total = re.search(r"(\d+) requests in", out)
    if rps is None or total is None:
        raise RuntimeError(f"cannot read wrk's output:\n{out}")
    errors = 0
    for pattern in (
        r"Non-2xx or 3xx responses: (\d+)",
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)",
    ):
        found = re.search(pattern, out)
        if found:
            errors += sum(int(g) for g in found.groups())
    return {
        "requests_per_s": float(rps.group(1)),
        "p50_ms": _ms(p50.group(1)) if p50 else float("nan"),
        "p99_ms": _ms(p99.group(1)) if p99 else float("nan"),
        "requests": int(total.group(1)),
        "errors": errors,
    }


def run_python(url: str, seconds: float, connections: int, post: bool) -> dict[str, float]:
    host, port_path = url.removeprefix("http://").split(":", 1)
    port, _, path = port_path.partition("/")
    latencies: list[list[float]] = [[] for _ in range(connections)]
    errors = [0] * connections
    deadline = time.monotonic() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection(host, int(port), timeout=10)
        n = 0
        while time.monotonic() < deadline:
            n += 1
            started = time.perf_counter()
            try:
                if post:
                    body = TEMPLATE_JSON.replace("TOKEN", f"{index:016x}{n:016x}").encode()
                    conn.request(
                        "POST", "/" + path, body=body, headers={"Content-Type": "application/json"}
                    )
                else:
                    conn.request("GET", "/" + path)
                response = conn.getresponse()
                response.read()
                if response.status >= 300:
                    errors[index] += 1
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
    }


def ingestion(
    registry: Path, store_url: str, workdir: Path, seconds: float, connections: int
) -> dict[str, Any]:
    wrk = shutil.which("wrk")
    script = workdir / "report.lua"
    script.write_text(WRK_SCRIPT % TEMPLATE_JSON)
    with edgereg_server(registry, store_url, workdir) as url:
        # Warm up both paths (imports, the store's schema, pooled connections).
        for _ in range(20):
            conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
            conn.request("GET", "/manifests/digits/high.json")
            conn.getresponse().read()
            conn.close()
        if wrk:
            manifest = run_wrk(wrk, f"{url}/manifests/digits/high.json", seconds, connections, None)
            reports = run_wrk(wrk, f"{url}/v1/reports", seconds, connections, script)
        else:
            manifest = run_python(f"{url}/manifests/digits/high.json", seconds, connections, False)
            reports = run_python(f"{url}/v1/reports", seconds, connections, True)
    with open_store(store_url) as store:
        stored = store.count()
    return {
        "load_generator": "wrk" if wrk else "python",
        "manifest": manifest,
        "reports": reports,
        "stored": stored,
        "ratio": reports["requests_per_s"] / manifest["requests_per_s"],
    }


def synthetic_reports(rows: int, when: datetime) -> Iterator[tuple[Report, datetime]]:
    """A fleet: 3 tiers, 10% on the candidate; latencies log-normal; 1% probe failures."""
    rng = random.Random(10)
    tiers = ("high", "mid", "low")
    for n in range(rows):
        candidate = n % 10 == 0
        version = "1.1.0" if candidate else "1.0.0"
        inference = LatencySummary.model_construct(
            count=100, p50_ms=rng.lognormvariate(1.0, 0.4), p90_ms=5.0, p99_ms=9.0
        )
        # model_construct: the values are valid by construction; validating a
        # million reports would time pydantic, not the store.
        yield (
            Report.model_construct(
                schema_version=1,
                token=f"{n:032x}",
                unit="digits",
                model="digits",
                version=version,
                unit_version=version,
                variant="int8",
                tier=tiers[n % 3],
                arm="candidate" if candidate else "stable",
                sequence=3,
                probe="failed" if rng.random() < 0.01 else "passed",
                backend="cpu",
                backends_skipped=[],
                load_ms=rng.lognormvariate(3.0, 0.5),
                load_failed=False,
                inference=inference,
                confirmed=rng.random() < 0.97,
                reverted=rng.random() < 0.005,
                mnn_runtime="3.6.1",
                os="android",
                os_version="14",
                device_class="ram8-8c",
            ),
            when + timedelta(milliseconds=n),
        )


def summaries(store_url: str, rows: int) -> dict[str, Any]:
    when = datetime(2026, 1, 1, tzinfo=timezone.utc)
    with open_store(store_url) as store:
        started = time.perf_counter()
        batch: list[tuple[Report, datetime]] = []
        for item in synthetic_reports(rows, when):
            batch.append(item)
            if len(batch) == 20_000:
                store.ingest_many(batch)
                batch.clear()
        if batch:
            store.ingest_many(batch)
        insert_s = time.perf_counter() - started
        result: list[Any] = []
        timings: list[float] = []

        def work() -> None:
            started = time.perf_counter()
            result[:] = store.summaries("digits")
            timings.append(time.perf_counter() - started)

        growth = peak_growth(work)
        since_started = time.perf_counter()
        store.summaries("digits", since=when + timedelta(milliseconds=rows // 2))
        since_s = time.perf_counter() - since_started
    return {
        "rows": rows,
        "insert_s": insert_s,
        "summaries_s": timings[0],
        "summaries_since_s": since_s,
        "peak_memory_mb": growth / 1e6,
        "arms": len(result),
        "devices": sum(s.devices for s in result),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-reports-") as tmp:
        work = Path(tmp)
        registry = make_registry(work / "registry", models=("digits",)).root
        assert registry is not None
        backends = [args.only] if args.only else ["sqlite", "postgresql"]
        for backend in backends:
            if backend == "sqlite":
                stack: contextlib.AbstractContextManager[Any] = contextlib.nullcontext()
            else:
                stack = PostgresServer(fsync=True)
            with stack as database:

                def url(name: str, database: Any = database) -> str:
                    if database is None:
                        return f"sqlite:///{work}/{name}.sqlite"
                    return str(database.create_database())

                results[backend] = {
                    "ingestion": ingestion(
                        registry, url("http"), work, args.seconds, args.connections
                    ),
                    "summaries": summaries(url("bulk"), args.rows),
                }
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(
        f"report store benchmark on {os.cpu_count()} CPUs (one `edgereg serve` worker); "
        f"load average {load} (above the CPU count, other work skews the ratios)"
    )
    for backend, result in results.items():
        ing, summ = result["ingestion"], result["summaries"]
        m, r = ing["manifest"], ing["reports"]
        verdict = "PASS" if ing["ratio"] >= RATIO_TARGET else "FAIL"
        print(f"\n[{backend}] load generator: {ing['load_generator']}")
        print(
            f"  manifests      {m['requests_per_s']:9.0f} req/s  p99 {m['p99_ms']:7.2f} ms  "
            f"errors {m['errors']}"
        )
        print(
            f"  reports        {r['requests_per_s']:9.0f} req/s  p99 {r['p99_ms']:7.2f} ms  "
            f"errors {r['errors']}  stored {ing['stored']}"
        )
        print(
            f"  ratio reports/manifests {ing['ratio']:.2f}x (target >= {RATIO_TARGET}x) {verdict}"
        )
        verdict = "PASS" if summ["summaries_s"] < SUMMARY_TARGET_S else "FAIL"
        print(
            f"  summaries() over {summ['rows']:,} reports: {summ['summaries_s']:.2f} s "
            f"(target < {SUMMARY_TARGET_S:g} s) {verdict}; with since: "
            f"{summ['summaries_since_s']:.2f} s; "
            f"peak memory +{summ['peak_memory_mb'] * 1000:.0f} KB; "
            f"{summ['arms']} arms, {summ['devices']:,} devices "
            f"(bulk insert {summ['insert_s']:.0f} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
