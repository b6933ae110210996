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

Then the forged campaigns: how many forged networks (valid-looking reports
of the served unit, tier, sequence and version, everything a manifest
reveals, from /24s of the forger's own) get the forger the verdict it wants,
through either arm, in each direction.

Usage: .venv/bin/python benchmarks/report_checks.py [--reports 3000] [--rounds 5]
       (--rounds 0: the forged campaigns only)
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
from edgereg.reports.summary import ArmSummary, Tally
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
        "variant": f"{('high', 'mid', 'low')[n % 3]}-int8",
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


#: The campaigns: (name, the world's candidate rate, the verdict or move the forger wants,
#: the arm it posts to, whether its forged networks have the event).
CAMPAIGNS = (
    ("fail a good candidate: forged candidate failures", 0.02, "fail", "candidate", True),
    ("fail a good candidate: forged healthy stable installs", 0.02, "fail", "stable", False),
    ("hold a good candidate: forged candidate failures", 0.02, "held", "candidate", True),
    ("pass a bad one (5 % vs 2 %): forged healthy candidates", 0.05, "pass", "candidate", False),
    ("pass a bad one: forged stable failures", 0.05, "pass", "stable", True),
    # issue 30 item 1: a fail turned into anything else (no rollback) through either arm.
    (
        "stop a bad one's fail (5 % vs 2 %): forged healthy candidates",
        0.05,
        "no-fail",
        "candidate",
        False,
    ),
    ("stop a bad one's fail: forged stable failures", 0.05, "no-fail", "stable", True),
    ("promote a bad one unproven: forged stable failures", 0.05, "within", "stable", True),
)


def smallest_flip(
    devices: int, percent: float, campaign: tuple[object, ...], *, networks: int | None = None
) -> int | None:
    """Forged networks (each wholly the forger's) that get the forger what it wants.

    With ``networks``, forged *devices* from that many networks instead (how many
    the forger's few networks need: None when no number does).

    One tier of ``devices`` devices at a step of ``percent``, every device in a
    network of its own and reported (the world of benchmarks/canary.py once the
    period has heard from all), 2 % reverts in the stable arm. ``held`` is a
    harm shown (a step without proof waits); ``within`` an estimate within the
    limit (what a promotion without proof reads).
    """
    _, rate, wanted, arm, failing = campaign
    guardrails = Guardrails()
    candidate_n = round(devices * percent / 100)
    stable_n = devices - candidate_n
    assert isinstance(rate, float)

    def outcome(forged: int) -> str:
        nets = forged if networks is None else min(forged, networks)
        extra = Tally(
            forged,
            nets,
            {"reverted": forged if failing else 0},
            {"reverted": float(nets) if failing else 0.0},
        )
        cand = Tally.of_devices(candidate_n, reverted=round(rate * candidate_n))
        stab = Tally.of_devices(stable_n, reverted=round(0.02 * stable_n))
        if arm == "candidate":
            cand = cand + extra
        else:
            stab = stab + extra
        arms = [
            ArmSummary("u", "t", "candidate", "2", cand, cand),
            ArmSummary("u", "t", "stable", "1", stab, stab),
        ]
        analysis = analyze(
            arms,
            unit="u",
            candidate="2",
            stable="1",
            since=START,
            guardrails=guardrails,
            intervals=False,
        )
        (revert,) = (r for r in analysis.tiers[0].guardrails if r.name == "revert")
        if wanted == "held":
            return "held" if not revert.harmless and revert.verdict != "fail" else revert.verdict
        if wanted == "within":
            return "within" if revert.beyond_limit is None else "beyond"
        if wanted == "no-fail":
            return "no-fail" if revert.verdict != "fail" else "fail"
        return revert.verdict

    if outcome(0) == wanted:
        return 0
    low, high = 0, 1
    while outcome(high) != wanted:
        high *= 2
        if high > 100 * devices:
            return None
    while high - low > 1:
        middle = (low + high) // 2
        if outcome(middle) == wanted:
            high = middle
        else:
            low = middle
    return high


def cell(found: int | None, campaign: tuple[object, ...]) -> str:
    """A table cell: the fewest forged networks or devices, "never", or what holds without."""
    if found is None:
        return "never"
    if found == 0:
        return "(no fail)" if campaign[2] == "no-fail" else "(without a forger)"
    return f"{found:,}"


def issue_30_fleet() -> None:
    """Issue 30's case: a candidate failing its probe on 10 of 60 devices, forged stable failures.

    The stable arm: 1,140 devices (the rest of 1,200 at a 5 % step) at 0.5 %.
    Before both arms counted networks, 12 forged stable-arm probe failures from
    one /24 stopped its fail and 150 passed it.
    """
    guardrails = Guardrails()

    def verdict(forged: int, networks: int) -> str:
        cand = Tally.of_devices(60, probe_failed=10)
        stab = Tally.of_devices(1140, probe_failed=6)
        if forged:
            stab = stab + Tally(
                forged, networks, {"probe_failed": forged}, {"probe_failed": float(networks)}
            )
        analysis = analyze(
            [
                ArmSummary("u", "t", "candidate", "2", cand, cand),
                ArmSummary("u", "t", "stable", "1", stab, stab),
            ],
            unit="u",
            candidate="2",
            stable="1",
            since=START,
            guardrails=guardrails,
            intervals=False,
        )
        (probe,) = (r for r in analysis.tiers[0].guardrails if r.name == "probe_failure")
        return probe.verdict

    print("\nissue 30's fleet: 10 of 60 candidates fail their probe, 6 of 1,140 stable")
    print(f"  no forger: {verdict(0, 0)}")
    for forged, networks in ((12, 1), (150, 1), (10_000, 1), (10_000, 3), (1, 1)):
        said = verdict(forged, networks)
        print(f"  {forged:,} forged stable failures from {networks} /24: {said}")
    passing = next((k for k in range(1, 5000) if verdict(k, k) == "pass"), None)
    print(f"  /24s (one forged failure each) to pass it: {passing}")


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
    # --rounds 0: the campaigns only.
    ratio = statistics.median(rates[True]) / statistics.median(rates[False]) if args.rounds else 0
    print(
        "\nforged campaigns against the revert guardrail (default guardrails, one tier, "
        "every device in a network of its own): the fewest forged networks that succeed"
    )
    sizes = [(600, 5), (600, 50), (60_000, 5), (60_000, 50), (600_000, 50)]
    print("| campaign | " + " | ".join(f"{d:,} at {p} %" for d, p in sizes) + " |")
    print("|---" * (len(sizes) + 1) + "|")
    for campaign in CAMPAIGNS:
        cells = []
        for devices, percent in sizes:
            found = smallest_flip(devices, percent, campaign)
            cells.append(cell(found, campaign))
        print(f"| {campaign[0]} | " + " | ".join(cells) + " |", flush=True)
    print(
        f"(a network's cap is {DEFAULT_TOKENS_PER_SOURCE} new tokens an hour; one forged "
        "network needs one token)"
    )
    issue_30_fleet()
    print("\nthe same campaigns from one /24 and from three: the fewest forged devices")
    print("| campaign | networks | " + " | ".join(f"{d:,} at {p} %" for d, p in sizes) + " |")
    print("|---" * (len(sizes) + 2) + "|")
    for campaign in CAMPAIGNS:
        for networks in (1, 3):
            cells = []
            for devices, percent in sizes:
                found = smallest_flip(devices, percent, campaign, networks=networks)
                cells.append(cell(found, campaign))
            print(f"| {campaign[0]} | {networks} | " + " | ".join(cells) + " |", flush=True)
    if not args.rounds:
        return
    print(
        f"\nsummary\n  reports/s with the checks / without: {ratio:.2f} "
        f"(target >= 0.9)  {'PASS' if ratio >= 0.9 else 'FAIL'}"
    )


if __name__ == "__main__":
    main()
