"""Report ingestion with five app metrics (schema 3) against without (schema 2), in one run.

The same `edgereg serve` request logic (``App.handle``: parse, rate limit,
per-source cap, the check against what the signed state and manifests
served, the metrics against what the release declares, the store) takes two
streams of valid reports into real SQLite stores, alternating per round:

- schema 2: every key of schema 2 set (unconfirmed starts, CPU class, peak
  and steady memory, first inference), the way a current client reports;
- schema 3: the same reports plus ``metrics``, three rates and two
  distributions of 8 buckets (issue 26), all five declared by the release,
  counts of a few days' to weeks' use.

In-process, without the HTTP server around it, so what differs (parsing the
metrics, checking them against the declaration, writing their column) is the
largest share it can be: through a socket the ratio is closer to 1. Each
report comes from its own address of a few hundred /24 networks, the way a
fleet's do. Rounds alternate the order; the ratio is of the medians.

Two modes: one request after another (a commit per report: the most the
store's write adds), and ``--callers`` threads at once through
``GroupCommit``, as `edgereg serve` stores reports (concurrent reports share
one transaction).

Target: reports/s with 5 metrics >= 0.9 x without (issue 26), in each mode.
Also printed: the median body sizes and the store's bytes per report.

Usage: .venv/bin/python benchmarks/ingest.py [--reports 3000] [--rounds 5] [--callers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from servekit import make_registry  # noqa: E402

from edgereg.protocol.wire import DistributionMetric, RateMetric  # noqa: E402
from edgereg.reports import open_store  # noqa: E402
from edgereg.reports.batch import GroupCommit  # noqa: E402
from edgereg.serve._app import App, Request  # noqa: E402
from edgereg.serve._ratelimit import RateLimiter, SourceCaps  # noqa: E402

TARGET = 0.9
TIERS = ("high", "mid", "low")
RATES = {"accepted": 0.92, "cloud_fallback": 0.07, "retried": 0.03}
DISTRIBUTIONS = {
    "confidence": (0.3, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95),
    "edit_distance": (0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 13.0),
}
DECLARED: dict[str, Any] = {
    **{name: RateMetric(kind="rate") for name in RATES},
    **{
        name: DistributionMetric(kind="distribution", buckets=list(edges))
        for name, edges in DISTRIBUTIONS.items()
    },
}


def app_metrics(rng: random.Random) -> dict[str, Any]:
    """One install's totals so far: counts only, as a client sends them."""
    events = 5 + int(rng.expovariate(1 / 30))
    metrics: dict[str, Any] = {}
    for name, rate in RATES.items():
        successes = sum(rng.random() < rate for _ in range(events))
        metrics[name] = {"events": events, "successes": successes}
    for name, edges in DISTRIBUTIONS.items():
        counts = [0] * (len(edges) + 1)
        for _ in range(events):
            value = rng.betavariate(8, 2) if name == "confidence" else rng.expovariate(0.8)
            counts[next((i for i, e in enumerate(edges) if value <= e), len(edges))] += 1
        metrics[name] = {"counts": counts}
    return metrics


def body(n: int, rng: random.Random, with_metrics: bool) -> bytes:
    arm = "candidate" if n % 20 == 0 else "stable"
    version = "1.1.0" if arm == "candidate" else "1.0.0"
    tier = TIERS[n % 3]
    p50 = rng.lognormvariate(1.6, 0.3)
    peak = rng.lognormvariate(3.0, 0.3)
    data: dict[str, Any] = {
        "schema_version": 3 if with_metrics else 2,
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": version,
        "unit_version": version,
        "variant": f"{tier}-int8",
        "tier": tier,
        "arm": arm,
        "sequence": 2,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": round(rng.lognormvariate(3.4, 0.35), 3),
        "inference": {
            "count": 20,
            "p50_ms": round(p50, 3),
            "p90_ms": round(p50 * 1.6, 3),
            "p99_ms": round(p50 * 2.5, 3),
        },
        "confirmed": True,
        "mnn_runtime": "3.6.1",
        "os": "android",
        "os_version": "14",
        "device_class": "ram4-8c",
        "unconfirmed_starts": 0,
        "cpu_class": "armv8.2",
        "memory_peak_mb": round(peak, 1),
        "memory_steady_mb": round(peak * 0.8, 1),
        "first_inference_ms": round(p50 * 3, 3),
    }
    if with_metrics:
        data["metrics"] = app_metrics(rng)
    return json.dumps(data, separators=(",", ":")).encode()


def requests(count: int, offset: int, with_metrics: bool) -> list[Request]:
    rng = random.Random(offset)
    made = []
    for i in range(count):
        n = offset + i
        payload = body(n, rng, with_metrics)
        headers = {"content-type": "application/json", "content-length": str(len(payload))}
        address = f"10.{n % 251}.{(n // 251) % 256}.{n % 200 + 1}"
        made.append(Request("POST", "/v1/reports", headers, payload, address))
    return made


def run(storage: object, where: Path, batch: list[Request], callers: int) -> float:
    """Reports/s of ``batch`` through ``App.handle`` into a new SQLite store.

    ``callers`` 1: one request after another, a commit each. More: that many
    threads at once into the store through ``GroupCommit``, as `edgereg serve`
    stores them (concurrent reports share a transaction).
    """
    with open_store(f"sqlite:///{where}") as store:
        store.check()
        sink = GroupCommit(store) if callers > 1 else store
        app = App(
            storage,  # type: ignore[arg-type]
            reports=sink,
            report_limiter=RateLimiter(1e9, 10**9),
            source_caps=SourceCaps(),
        )

        def handle(request: Request) -> None:
            answer = app.handle(request)
            if answer.status != 202:
                raise SystemExit(f"report answered {answer.status}: {answer.body!r}")

        started = time.perf_counter()
        if callers == 1:
            for request in batch:
                handle(request)
        else:
            with ThreadPoolExecutor(callers) as pool:
                list(pool.map(handle, batch))
        seconds = time.perf_counter() - started
        assert store.count() == len(batch)
        if isinstance(sink, GroupCommit):
            sink.close()  # its writer thread (and the store, closed again below: a no-op)
    return len(batch) / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--callers", type=int, default=16, help="threads of the GroupCommit runs")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", flush=True)
    modes = {"one at a time": 1, f"{args.callers} at once, GroupCommit": args.callers}
    ratios: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="edgereg-bench-ingest-") as tmp_name:
        tmp = Path(tmp_name)
        registry = make_registry(tmp / "registry", models=("digits",), metrics=DECLARED)
        sizes: dict[bool, list[int]] = {True: [], False: []}
        stored: dict[bool, list[float]] = {True: [], False: []}
        for mode, callers in modes.items():
            print(f"{mode}:", flush=True)
            rates: dict[bool, list[float]] = {True: [], False: []}
            for round_ in range(args.rounds):
                order = (True, False) if round_ % 2 == 0 else (False, True)
                for with_metrics in order:
                    where = tmp / f"r{round_}-{with_metrics}.sqlite"
                    offset = (round_ * 2 + int(with_metrics)) * args.reports
                    batch = requests(args.reports, offset, with_metrics)
                    sizes[with_metrics] += [len(r.body) for r in batch]
                    rates[with_metrics].append(run(registry.storage, where, batch, callers))
                    stored[with_metrics].append(where.stat().st_size / args.reports)
                    where.unlink()
                print(
                    f"  round {round_ + 1}: schema 3 with 5 metrics {rates[True][-1]:,.0f}/s, "
                    f"schema 2 {rates[False][-1]:,.0f}/s",
                    flush=True,
                )
            with_m, without = statistics.median(rates[True]), statistics.median(rates[False])
            ratios[mode] = with_m / without
            print(
                f"  median {with_m:,.0f} reports/s with 5 metrics, {without:,.0f} without: "
                f"{ratios[mode]:.2f}x (load average {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    print(
        f"{args.reports:,} reports per store, {args.rounds} rounds per mode; body median "
        f"{statistics.median(sizes[True]):,.0f} bytes with 5 metrics, "
        f"{statistics.median(sizes[False]):,.0f} without; store (SQLite file) "
        f"{statistics.median(stored[True]):,.0f} bytes per report with, "
        f"{statistics.median(stored[False]):,.0f} without"
    )
    print("\nsummary")
    for mode, ratio in ratios.items():
        print(
            f"  {'PASS' if ratio >= TARGET else 'FAIL'}  reports/s with 5 app metrics / "
            f"schema 2 >= {TARGET}, {mode}: {ratio:.2f}"
        )
    sys.exit(0 if all(ratio >= TARGET for ratio in ratios.values()) else 1)


if __name__ == "__main__":
    main()
