"""Report-store benchmark: ingestion through `edgereg serve`, and summaries over a million reports.

In one run, for SQLite and for PostgreSQL (a real server from Debian's
package, tests/pgkit.py, fsync on):

1. one `edgereg serve` (``--workers N``: N worker processes) on loopback,
   every report check on (the admission against the signed state and
   manifests, the source caps, size and schema; the per-address rate limit
   lifted, the load being one address): manifest requests per second and p99,
   then ``POST /v1/reports`` (a new token per request, so every one is an
   insert; a report the registry served, so every one is admitted and
   stored) per second and p99 against the same server, with the same load
   generator (wrk with a Lua script when installed, else a threaded Python
   client) and connections, alternating round by round; the ratio of the
   medians, reports/s over manifests/s, is printed (target >= 0.5, issue 32)
   with the load average before and after. With ``--baseline REV`` the same
   rounds run against `edgereg serve` as of git revision REV, alternating
   with the current code, for its ratio beside;
2. ``summaries()`` over 1,000,000 stored reports (bulk-inserted through
   ``ingest_many``, not HTTP; 3 tiers, a 10% candidate arm): seconds
   (target < 5 s) and the peak memory it adds to this process.

Usage: .venv/bin/python benchmarks/reports.py [--seconds 5] [--rounds 3] [--connections 50]
       [--workers N] [--baseline REV] [--rows 1000000] [--only sqlite|postgresql]
       [--skip-summaries] [--json]
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
from serve import extract_revision, free_port, wait_for  # noqa: E402  (benchmarks/serve.py)
from servekit import SERVE_CMD, make_registry  # noqa: E402

from edgereg.protocol.reports import LatencySummary, Report  # noqa: E402
from edgereg.registry import Registry  # noqa: E402
from edgereg.reports import open_store  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

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
    "sequence": 0,  # the registry's (served_report)
    "tier": "high",
    "token": "TOKEN",
    "unit": "digits",
    "unit_version": "",
    "variant": "",
    "version": "",
    "mnn_runtime": "3.6.1",
    "os": "android",
    "os_version": "14",
    "device_class": "ram8-8c",
}


def served_report(registry: Path, unit: str = "digits", tier: str = "high") -> str:
    """The template as JSON, naming what the registry serves: the admission check admits it.

    The candidate arm at the state's sequence, its version and the tier's variant (a report
    of something never served is refused 422, and would measure the refusal).
    """
    reader = Registry(open_storage(str(registry)))
    state, _ = reader.read_state(unit)
    assert state is not None
    assert state.candidate is not None
    release = reader.read_release(unit, state.candidate)
    variant = release.tiers[tier]  # type: ignore[union-attr]
    report = dict(REPORT_TEMPLATE)
    report.update(
        sequence=state.sequence,
        unit=unit,
        model=unit,
        tier=tier,
        unit_version=state.candidate,
        version=state.candidate,
        variant=variant,
    )
    return json.dumps(report, separators=(",", ":"))


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
def edgereg_server(
    registry: Path,
    store_url: str,
    workdir: Path,
    *,
    workers: int = 1,
    source: Path | None = None,
) -> Iterator[str]:
    """Run `edgereg serve` with a report store; ``source``: another checkout's code instead."""
    port = free_port()
    log = (workdir / f"serve-{port}.log").open("wb")
    env = dict(os.environ)
    if source is not None:
        env["PYTHONPATH"] = str(source)  # ahead of the editable install
    proc = subprocess.Popen(
        [
            *SERVE_CMD,
            "--registry",
            str(registry),
            "--port",
            str(port),
            "--reports",
            store_url,
            # The benchmark is one client address: lift the per-address limit
            # (the per-worker share is this divided by the workers: still lifted).
            "--reports-rate",
            "1e9",
            "--reports-burst",
            "1000000000",
            *(("--workers", str(workers)) if workers > 1 else ()),
        ],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env=env,
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


def run_python(
    url: str, seconds: float, connections: int, template: str | None
) -> dict[str, float]:
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
                if template is not None:
                    body = template.replace("TOKEN", f"{index:016x}{n:016x}").encode()
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
    registry: Path,
    store_urls: dict[str, str],
    workdir: Path,
    *,
    seconds: float,
    connections: int,
    rounds: int,
    workers: int,
    sources: dict[str, Path | None],
) -> dict[str, Any]:
    """Manifests then reports against each server, alternating round by round.

    ``store_urls`` and ``sources``: per server name (``edgereg``, ``baseline``), its
    store and the code it runs (None: this checkout).
    """
    wrk = shutil.which("wrk")
    template = served_report(registry)
    script = workdir / "report.lua"
    script.write_text(WRK_SCRIPT % template)
    manifest_path = "/manifests/digits/high.json"

    def load(url: str, post: bool) -> dict[str, float]:
        if wrk:
            if post:
                return run_wrk(wrk, f"{url}/v1/reports", seconds, connections, script)
            return run_wrk(wrk, url + manifest_path, seconds, connections, None)
        if post:
            return run_python(f"{url}/v1/reports", seconds, connections, template)
        return run_python(url + manifest_path, seconds, connections, None)

    runs: dict[str, dict[str, list[dict[str, float]]]] = {
        name: {"manifest": [], "reports": []} for name in store_urls
    }
    with contextlib.ExitStack() as stack:
        urls = {
            name: stack.enter_context(
                edgereg_server(
                    registry, store_url, workdir, workers=workers, source=sources.get(name)
                )
            )
            for name, store_url in store_urls.items()
        }
        # Warm up both paths (imports, the store's schema, pooled connections, the
        # served index), in every worker (the kernel spreads connections).
        for url in urls.values():
            for _ in range(20 * workers):
                conn = http.client.HTTPConnection(url.removeprefix("http://"), timeout=10)
                conn.request("GET", manifest_path)
                conn.getresponse().read()
                conn.request(
                    "POST",
                    "/v1/reports",
                    body=template.replace("TOKEN", os.urandom(16).hex()).encode(),
                    headers={"Content-Type": "application/json"},
                )
                answer = conn.getresponse()
                answer.read()
                conn.close()
                if answer.status != 202:
                    raise RuntimeError(f"a warm-up report was answered {answer.status}")
        load_before = os.getloadavg()
        for _ in range(rounds):
            for name, url in urls.items():
                runs[name]["manifest"].append(load(url, post=False))
                runs[name]["reports"].append(load(url, post=True))
        load_after = os.getloadavg()
    results: dict[str, Any] = {
        "load_generator": "wrk" if wrk else "python",
        "load_average_before": load_before,
        "load_average_after": load_after,
    }
    for name, store_url in store_urls.items():
        with open_store(store_url) as store:
            stored = store.count()
        manifest = median_run(runs[name]["manifest"])
        reports = median_run(runs[name]["reports"])
        results[name] = {
            "manifest": manifest,
            "reports": reports,
            "rounds": runs[name],
            "stored": stored,
            "posted": sum(int(run["requests"]) for run in runs[name]["reports"]) + 20 * workers,
            "ratio": reports["requests_per_s"] / manifest["requests_per_s"],
            "round_ratios": [
                r["requests_per_s"] / m["requests_per_s"]
                for m, r in zip(runs[name]["manifest"], runs[name]["reports"], strict=True)
            ],
        }
    return results


def median_run(runs: list[dict[str, float]]) -> dict[str, float]:
    """The run with the median requests/s (errors summed over every run)."""
    ordered = sorted(runs, key=lambda run: run["requests_per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["errors"] = sum(run["errors"] for run in runs)
    return chosen


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
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per server")
    parser.add_argument("--connections", type=int, default=50)
    parser.add_argument("--workers", type=int, default=1, help="edgereg serve --workers N")
    parser.add_argument(
        "--baseline", metavar="REV", help="also measure `edgereg serve` as of this git revision"
    )
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--skip-summaries", action="store_true", help="measure ingestion only")
    parser.add_argument("--only", choices=("sqlite", "postgresql"))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-reports-") as tmp:
        work = Path(tmp)
        registry = make_registry(work / "registry", models=("digits",)).root
        assert registry is not None
        sources: dict[str, Path | None] = {"edgereg": None}
        if args.baseline:
            sources["baseline"] = extract_revision(args.baseline, work)
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
                        registry,
                        {name: url(f"http-{name}") for name in sources},
                        work,
                        seconds=args.seconds,
                        connections=args.connections,
                        rounds=args.rounds,
                        workers=args.workers,
                        sources=sources,
                    )
                }
                if not args.skip_summaries:
                    results[backend]["summaries"] = summaries(url("bulk"), args.rows)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    workers = f"{args.workers} `edgereg serve` workers" if args.workers > 1 else "one worker"
    print(
        f"report store benchmark on {os.cpu_count()} CPUs ({workers}, {args.connections} "
        f"connections, median of {args.rounds} alternating rounds of {args.seconds:g}s)"
    )
    for backend, result in results.items():
        ing = result["ingestion"]
        before = ", ".join(f"{x:.1f}" for x in ing["load_average_before"])
        after = ", ".join(f"{x:.1f}" for x in ing["load_average_after"])
        print(
            f"\n[{backend}] load generator: {ing['load_generator']}; load average {before} "
            f"before, {after} after (above the CPU count, other work skews the ratios)"
        )
        for name in ("edgereg", "baseline"):
            if name not in ing:
                continue
            one = ing[name]
            m, r = one["manifest"], one["reports"]
            label = "this tree" if name == "edgereg" else f"at {args.baseline}"
            verdict = "PASS" if one["ratio"] >= RATIO_TARGET else "FAIL"
            print(f"  {label}:")
            print(
                f"    manifests    {m['requests_per_s']:9.0f} req/s  p99 {m['p99_ms']:7.2f} ms  "
                f"errors {m['errors']}"
            )
            print(
                f"    reports      {r['requests_per_s']:9.0f} req/s  p99 {r['p99_ms']:7.2f} ms  "
                f"errors {r['errors']}  stored {one['stored']:,} of {one['posted']:,} posted"
            )
            rounds = ", ".join(f"{x:.2f}" for x in one["round_ratios"])
            print(
                f"    ratio reports/manifests {one['ratio']:.2f}x (rounds {rounds}; "
                f"target >= {RATIO_TARGET}x) {verdict}"
            )
        if "baseline" in ing:
            now, then = ing["edgereg"], ing["baseline"]
            print(
                f"  now / {args.baseline}: reports/s "
                f"{now['reports']['requests_per_s'] / then['reports']['requests_per_s']:.2f}x, "
                f"manifests/s "
                f"{now['manifest']['requests_per_s'] / then['manifest']['requests_per_s']:.2f}x"
            )
        summ = result.get("summaries")
        if summ is None:
            continue
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
