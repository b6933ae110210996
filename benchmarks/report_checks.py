"""Report ingestion with the forged-report checks against without them, in one run.

The same `edgereg serve` request logic (``App.handle``: parse, rate limit,
per-source cap, the check against what the signed state and manifests
served, the store) takes the same stream of valid reports into a real SQLite
store twice per round, once with the checks (the defaults) and once without
(``check_reports=False`` and a cap no stream reaches: the ingestion as it was
before them). Rounds alternate the order, and the ratio is of the medians.
Each report comes from its own address of a few hundred /24 networks, the
way a fleet's do, so the per-source cap does its bookkeeping for real.

Target: reports/s with the checks >= 0.9 x without.

Then the forged campaigns: how many forged devices (valid-looking reports
of the served unit, tier, sequence and version: everything a manifest
reveals) flip the default guardrails' verdict, and what that costs a forger
at the default cap of 200 new tokens per /24 per hour.

Usage: .venv/bin/python benchmarks/report_checks.py [--reports 3000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))

from servekit import make_registry

from edgereg.analysis import analyze
from edgereg.config import Guardrails
from edgereg.reports import open_store
from edgereg.reports.summary import ArmSummary
from edgereg.serve._app import App, Request
from edgereg.serve._ratelimit import DEFAULT_TOKENS_PER_SOURCE, RateLimiter, SourceCaps

START = datetime(2026, 12, 1, tzinfo=timezone.utc)


def body(n: int, arm: str) -> bytes:
    version = "1.1.0" if arm == "candidate" else "1.0.0"
    data = {
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": version,
        "unit_version": version,
        "variant": "int8",
        "tier": ("high", "mid", "low")[n % 3],
        "arm": arm,
        "sequence": 2,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": 10.0 + n % 17,
        "inference": {"count": 20, "p50_ms": 2.0, "p90_ms": 3.0, "p99_ms": 4.0},
    }
    return json.dumps(data, separators=(",", ":")).encode()


def run(storage: object, where: Path, reports: int, checks: bool, offset: int) -> float:
    with open_store(f"sqlite:///{where}") as store:
        store.check()
        app = App(
            storage,  # type: ignore[arg-type]
            reports=store,
            report_limiter=RateLimiter(1e9, 10**9),
            check_reports=checks,
            source_caps=SourceCaps() if checks else SourceCaps(tokens=10**9),
        )
        requests = []
        for i in range(reports):
            n = offset + i
            payload = body(n, "candidate" if n % 20 == 0 else "stable")
            headers = {"content-type": "application/json", "content-length": str(len(payload))}
            address = f"10.{n % 251}.{(n // 251) % 256}.{n % 200 + 1}"
            requests.append(Request("POST", "/v1/reports", headers, payload, address))
        started = time.perf_counter()
        for request in requests:
            status = app.handle(request).status
            if status != 202:
                raise SystemExit(f"report answered {status}")
        return reports / (time.perf_counter() - started)


def smallest_flip(devices: int, percent: float, attack: str) -> int | None:
    """Forged candidate devices that flip a good (or bad) candidate's revert verdict."""
    guardrails = Guardrails()
    candidate_n = round(devices * percent / 100)
    stable_n = devices - candidate_n
    rate = 0.02 if attack == "fail" else 0.05  # good: 2 % vs 2 %; bad: 5 % vs 2 %
    wanted = "fail" if attack == "fail" else "pass"

    def verdict(forged: int) -> str:
        events = round(rate * candidate_n) + (forged if attack == "fail" else 0)
        arms = [
            ArmSummary("u", "t", "candidate", "2", candidate_n + forged, reverted=events),
            ArmSummary("u", "t", "stable", "1", stable_n, reverted=round(0.02 * stable_n)),
        ]
        analysis = analyze(
            arms, unit="u", candidate="2", stable="1", since=START, guardrails=guardrails
        )
        (revert,) = (r for r in analysis.tiers[0].guardrails if r.name == "revert")
        return revert.verdict

    if verdict(0) == wanted:
        return 0
    low, high = 0, 1
    while verdict(high) != wanted:
        high *= 2
        if high > 100 * devices:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        if verdict(middle) == wanted:
            high = middle
        else:
            low = middle
    return high


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reports", type=int, default=3000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    with tempfile.TemporaryDirectory() as tmp:
        registry = make_registry(Path(tmp) / "registry", models=("digits",))
        rates: dict[bool, list[float]] = {True: [], False: []}
        for round_ in range(args.rounds):
            order = (True, False) if round_ % 2 == 0 else (False, True)
            for checks in order:
                where = Path(tmp) / f"r{round_}-{checks}.sqlite"
                offset = (round_ * 2 + int(checks)) * args.reports
                rates[checks].append(run(registry.storage, where, args.reports, checks, offset))
            print(
                f"  round {round_ + 1}: with checks {rates[True][-1]:,.0f}/s, without "
                f"{rates[False][-1]:,.0f}/s",
                flush=True,
            )
    ratio = statistics.median(rates[True]) / statistics.median(rates[False])
    print("\nforged campaigns against the revert guardrail (default guardrails, one tier):")
    print(
        "| devices in the tier | step | forged devices to fail a good candidate | "
        "forged devices to pass a bad one (5 % vs 2 %) | /24-hours at the default cap |"
    )
    print("|---|---|---|---|---|")
    for devices in (600, 60_000, 600_000):
        for percent in (5, 50):
            fail = smallest_flip(devices, percent, "fail")
            promote = smallest_flip(devices, percent, "pass")
            cheapest = min(x for x in (fail, promote) if x is not None)
            print(
                f"| {devices:,} | {percent:g} % | {fail} | {promote} | "
                f"{cheapest / DEFAULT_TOKENS_PER_SOURCE:.1f} |"
            )
    print(
        f"\nsummary\n  reports/s with the checks / without: {ratio:.2f} "
        f"(target >= 0.9)  {'PASS' if ratio >= 0.9 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
