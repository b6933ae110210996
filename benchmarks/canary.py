"""Canary judge benchmark: whole automatic rollouts in the world shipped clients make.

Monte Carlo over the pure code `edgereg rollout --auto` runs, in the world of
tests/worldsim.py: three tiers (one of them 3 % of the fleet), CPU classes,
home networks and carrier NATs, apps started once a day on a diurnal cycle
(most days), offline spells, new users, devices that report as the reference
client does (docs/protocol.md §11: in every rollout period, for the release
the manifest gives them, refused or not), the report store's merge and
summaries mirrored in numpy, the real transitions, analysis (default
guardrails and policy: steps 5 → 25 → 50 → 100 %, 24 h minimum soak, 72 h
maximum) and ``decide``, every 30 simulated minutes, 21 days at most. A
forger posts valid-looking reports from networks of its own.

Prints, per world and fleet size, how the rollouts ended: promoted, left at
100 % (a promotion in all but name), rolled back, or waiting below 100 %,
and the median day the candidate reached 100 %. Targets (issue 33):

- a good candidate reaches 100 % within 21 days in >= 95 % of rollouts at
  2,000 and 20,000 devices, and is rolled back in <= 5 %;
- a bad one (+3 points of crashes, +30 % latency, crashes on one CPU class
  or one tier, a crash at the first launch) is promoted or left at 100 % in
  <= 1 %, with and without a forger posting passes, and with the report
  server's clock 12 h behind;
- a forger with up to 10 reports from up to 3 networks changes no outcome;
- app metrics (issue 26): a candidate operationally perfect but whose
  ``accepted`` rate is 3 points lower (92 % -> 89 %) is rolled back at 20,000
  devices and never promoted at 1,000; with it unchanged (A/A) it is rolled
  back in at most alpha (5 %); a forger's metric reports from 3 networks, in
  either arm, decide nothing.

Also: the table of what one step concludes (docs/operations/canary-analysis.md),
the latency bands' calibration (``--latency``), `edgereg analyze` timing
(``--analyze N``) and the end-to-end fleet through `edgereg serve`
(``--fleet 1000``, tests/fleetsim.py).

Usage: .venv/bin/python benchmarks/canary.py [--rollouts 20] [--sizes 2000,20000]
       [--worlds good,crash3,...] [--workers 2] [--each]
       .venv/bin/python benchmarks/canary.py --only-table
       .venv/bin/python benchmarks/canary.py --fleet 1000 [--http-devices 50]
       .venv/bin/python benchmarks/canary.py --latency --rollouts 100
       .venv/bin/python benchmarks/canary.py --analyze 20000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from datetime import datetime, timedelta, timezone

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path.insert(0, TESTS)

from worldsim import GOOD, Forger, Outcome, Release, World, rollout  # noqa: E402

from edgereg.analysis import analyze  # noqa: E402
from edgereg.config import Guardrails  # noqa: E402
from edgereg.protocol.wire import RolloutState  # noqa: E402
from edgereg.reports.summary import LATENCY_EDGES_MS, ArmSummary  # noqa: E402

UNIT = "vision"
TIER = "high"
START = datetime(2026, 12, 1, tzinfo=timezone.utc)
LATENCY_EDGES = np.array(LATENCY_EDGES_MS)

CRASH3 = Release(crash_loop=0.05)
ACCEPTED3 = Release(accepted=0.89)
#: name -> (description, good?, the world at a fleet size)
WORLDS: dict[str, tuple[str, bool, Callable[[int], World]]] = {
    "good": (
        "good: 0.5 % probe, 0.5 % load, 2 % crash loops in both arms",
        True,
        lambda n: World(GOOD, n),
    ),
    "good-forger": (
        "good + a forger's failures (10 reports, 3 /24s, each period)",
        True,
        lambda n: World(GOOD, n, forger=Forger("fail")),
    ),
    "good-slow-forger": (
        "good + a forger's slow latencies (10 reports, 3 /24s)",
        True,
        lambda n: World(GOOD, n, forger=Forger("slow")),
    ),
    "good-legacy": (
        "good, clients before period reports (install, starts, confirm, revert)",
        True,
        lambda n: World(GOOD, n, regime="legacy"),
    ),
    "crash3": ("crash loops +3 pt (5 % vs 2 %)", False, lambda n: World(CRASH3, n)),
    "crash3-forger": (
        "crash loops +3 pt + a forger's passes (10 reports, 3 /24s)",
        False,
        lambda n: World(CRASH3, n, forger=Forger("pass")),
    ),
    "crash3-stable-forger": (
        "crash loops +3 pt + forged stable failures (10, 3 /24s)",
        False,
        lambda n: World(CRASH3, n, forger=Forger("stable-fail")),
    ),
    "crash3-skew": (
        "crash loops +3 pt, the report server's clock 12 h behind",
        False,
        lambda n: World(CRASH3, n, serve_skew_hours=12),
    ),
    "slow30": (
        "load and inference time +30 %",
        False,
        lambda n: World(Release(load_ms=52.0, inference_ms=15.6), n),
    ),
    "armv9": (
        "crash loops on armv9 only (+12 pt there, +3 pt overall)",
        False,
        lambda n: World(Release(crash_loop_by={"armv9": 0.12}), n),
    ),
    "mid-tier": (
        "crash loops on the mid tier only (+5 pt there)",
        False,
        lambda n: World(Release(crash_loop_by={"mid": 0.05}), n),
    ),
    "first-launch": (
        "a crash at every install's first launch, then fine",
        False,
        lambda n: World(Release(first_crash=1.0), n),
    ),
    # App metrics (issue 26): the app records whether its user kept each recognised text,
    # a guardrail allows one point fewer than the stable.
    "accepted-aa": (
        "good, and the app metric accepted unchanged (92 % kept), guarded at -1 pt",
        True,
        lambda n: World(GOOD, n, metrics=True),
    ),
    "accepted-aa-forger": (
        "accepted unchanged + a forger's candidate reports keeping nothing (3 /24s)",
        True,
        lambda n: World(GOOD, n, metrics=True, forger=Forger("fail")),
    ),
    "accepted-3pt": (
        "operationally perfect, accepted 3 pt lower (92 % -> 89 %)",
        False,
        lambda n: World(ACCEPTED3, n, metrics=True),
    ),
    "accepted-3pt-forger": (
        "accepted 3 pt lower + a forger's candidate reports keeping all (3 /24s)",
        False,
        lambda n: World(ACCEPTED3, n, metrics=True, forger=Forger("pass")),
    ),
    "accepted-3pt-stable-forger": (
        "accepted 3 pt lower + a forger's stable reports keeping nothing (3 /24s)",
        False,
        lambda n: World(ACCEPTED3, n, metrics=True, forger=Forger("stable-fail")),
    ),
}
#: Worlds that must be rolled back (not merely held) from this fleet size on.
ROLLED_BACK_FROM = {"accepted-3pt": 20_000, "accepted-3pt-forger": 20_000}


def _job(args: tuple[str, int, int]) -> tuple[str, int, Outcome, float]:
    name, size, seed = args
    started = time.process_time()
    outcome = rollout(WORLDS[name][2](size), seed)
    return name, size, outcome, time.process_time() - started


def run_worlds(
    names: list[str], sizes: list[int], rollouts: int, workers: int, *, each: bool = False
) -> bool:
    """Every world at every size, ``rollouts`` times; prints the table, returns the targets met.

    ``each``: also print every rollout as it ends (its seed, outcome and last move), so a
    run cut short still says what it found.
    """
    jobs = [(name, size, seed) for size in sizes for name in names for seed in range(rollouts)]
    found: dict[tuple[str, int], list[Outcome]] = {}
    cpu = 0.0
    with ProcessPoolExecutor(workers) as pool:
        for (_, _, seed), (name, size, outcome, seconds) in zip(
            jobs, pool.map(_job, jobs), strict=True
        ):
            found.setdefault((name, size), []).append(outcome)
            cpu += seconds
            if each:
                reached = (
                    ""
                    if outcome.reached_full is None
                    else f", 100 % on day {outcome.reached_full:.1f}"
                )
                last = outcome.moves[-1][2][:200] if outcome.moves else "no move"
                print(
                    f"{name} {size:,} seed {seed}: {outcome.result}, day {outcome.days:.1f}"
                    f"{reached} (last move: {last})",
                    flush=True,
                )
    print(
        f"\n{rollouts} rollouts per cell, default policy, --auto every 30 min, 21 days at most "
        f"({cpu / 60:.0f} CPU minutes, load average {os.getloadavg()[0]:.1f}):\n"
    )
    print(
        "| world | devices | promoted | left at 100 % | rolled back | waiting < 100 % | "
        "reached 100 % (median day) |"
    )
    print("|---|---|---|---|---|---|---|")
    met = True
    for (name, size), outcomes in found.items():
        description, good, _ = WORLDS[name]
        n = len(outcomes)
        promoted = sum(o.result == "promoted" for o in outcomes)
        full = sum(o.result == "stuck at 100%" for o in outcomes)
        back = sum(o.result in ("rolled back", "paused") for o in outcomes)
        waiting = n - promoted - full - back
        days = [o.reached_full for o in outcomes if o.reached_full is not None]
        median = f"{statistics.median(days):.1f}" if days else ""
        print(
            f"| {description} | {size:,} | {promoted}/{n} | {full}/{n} | {back}/{n} | "
            f"{waiting}/{n} | {median} |",
            flush=True,
        )
        if good and name != "good-legacy":
            reached = sum(o.reached_full is not None for o in outcomes)
            met &= reached >= 0.95 * n and back <= 0.05 * n
        elif not good:
            met &= promoted + full <= 0.01 * n
        if size >= ROLLED_BACK_FROM.get(name, math.inf):
            met &= back >= 0.95 * n
    return met


CASES = (
    ("0 % in both", 0.0, 0.0, "pass"),
    ("2 % in both", 0.02, 0.02, "pass"),
    ("2 → 7 %", 0.07, 0.02, "fail"),
    ("2 → 22 %", 0.22, 0.02, "fail"),
    ("all fail", 1.0, 0.02, "fail"),
)


def conclusions(devices: int, percent: float) -> str:
    """One table row: what one step concludes about reverts once every device reported."""
    guardrails = Guardrails()
    candidate_n = max(1, round(devices * percent / 100))
    # At 100 % the stable arm is the last step's (50 %): analysis_periods.
    stable_n = max(1, devices - candidate_n if percent < 100 else devices // 2)
    cells = []
    for _, c_rate, s_rate, right in CASES:
        cand = ArmSummary.of_devices(
            UNIT, TIER, "candidate", "1.1.0", candidate_n, reverted=round(c_rate * candidate_n)
        )
        stab = ArmSummary.of_devices(
            UNIT, TIER, "stable", "1.0.0", stable_n, reverted=round(s_rate * stable_n)
        )
        analysis = analyze(
            [cand, stab],
            unit=UNIT,
            candidate="1.1.0",
            stable="1.0.0",
            since=START,
            guardrails=guardrails,
            tiers=[TIER],
        )
        (revert,) = (r for r in analysis.tiers[0].guardrails if r.name == "revert")
        cells.append(revert.verdict if revert.verdict == right else f"*{revert.verdict}*")
    return (
        f"| {devices:,} | {percent:g} % | {candidate_n:,} vs {stable_n:,} | "
        + " | ".join(cells)
        + " |"
    )


def fleet_scenarios() -> list[tuple[str, object, object]]:
    """(name, candidate behaviour, forger factory) of each end-to-end fleet run."""
    sys.path.insert(0, TESTS)
    from fleetsim import GOOD, Behaviour, Forger

    crash = Behaviour(crash_loop=0.8)
    return [
        ("good", GOOD, None),
        ("good + 12 forged reverts, 1 /24", GOOD, lambda: Forger(1, "reverted", 12)),
        ("good + 12 forged reverts, 3 /24s", GOOD, lambda: Forger(3, "reverted", 12)),
        ("crash loop 80 %", crash, None),
        ("crash loop 80 % + 2,000 forged passes, 1 /24", crash, lambda: Forger(1, "passes", 2000)),
        ("crash loop 80 % + 5,000 forged passes, 5 /24s", crash, lambda: Forger(5, "passes", 5000)),
        ("crash loop +3 pt (5 % vs 2 %)", Behaviour(crash_loop=0.05), None),
        ("probe failures +2 pt", Behaviour(probe_failure=0.025), None),
    ]


def run_fleet(sizes: list[int], http_devices: int, days: float) -> None:
    import tempfile
    import time
    from pathlib import Path

    sys.path.insert(0, TESTS)
    from fleetsim import FleetWorld

    for size in sizes:
        print(
            f"\n{size:,} devices in one tier, default policy, --auto every 30 min, {days:g} days:"
        )
        for name, behaviour, forger_of in fleet_scenarios():
            forger = forger_of() if callable(forger_of) else None
            started = time.perf_counter()
            with tempfile.TemporaryDirectory() as work:
                world = FleetWorld(Path(work), size, behaviour, http_devices=http_devices)  # type: ignore[arg-type]
                with world.running():
                    outcome = world.rollout(days, forger)
            moves = ", ".join(f"{action} day {day - 1:.1f}" for day, action, _ in outcome.actions)
            forged = f"; forged {forger.sent}" if forger is not None else ""
            print(
                f"  {name:<48} {outcome.result:<12} [{moves or 'no move'}] device HTTP "
                f"{outcome.reports}{forged}  ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )


def latency_calibration(steps: int) -> None:
    """How the latency bands err and pass over 48 looks per step (canary-analysis.md)."""
    from edgereg.analysis._bands import shift_evidence

    rng = np.random.default_rng(1)

    def histogram(values: np.ndarray) -> dict[int, int]:
        buckets, counts = np.unique(np.searchsorted(LATENCY_EDGES, values), return_counts=True)
        return {int(b): int(c) for b, c in zip(buckets, counts, strict=True)}

    print(
        "| true shift | candidate vs stable devices | failed | passed | devices at the first pass |"
    )
    print("|---|---|---|---|---|")
    rows = [(0.10, 1000, 19000), (0.10, 5000, 15000), (0.0, 300, 5700), (0.0, 1000, 19000)]
    rows += [(0.0, 5000, 15000), (0.2, 300, 5700), (0.2, 1000, 19000), (0.3, 50, 950)]
    for shift, n1, n0 in rows:
        failed = passed = 0
        first: list[int] = []
        for _ in range(steps):
            candidate = np.exp(rng.normal(math.log(40 * (1 + shift)), 0.35, n1))
            stable = np.exp(rng.normal(math.log(40), 0.35, n0))
            shown = False
            for look in range(1, 49):
                m1, m0 = max(1, n1 * look // 48), max(1, n0 * look // 48)
                evidence = shift_evidence(
                    histogram(candidate[:m1]), histogram(stable[:m0]), limit_pct=10, alpha=0.05
                )
                if evidence.slower:
                    failed += 1
                    break
                if evidence.within and not shown:
                    shown = True
                    first.append(m1)
            passed += shown
        at = f"{statistics.median(first):,.0f}" if first else ""
        print(
            f"| {100 * shift:+.0f} % | {n1:,} vs {n0:,} | {100 * failed / steps:.0f} % | "
            f"{100 * passed / steps:.0f} % | {at} |",
            flush=True,
        )


def analyze_timing(devices: int, runs: int) -> None:
    """`edgereg analyze` end to end on a store of ``devices`` reports, SQLite and PostgreSQL.

    The store, registry and command line of benchmarks/analyze.py; beside it,
    what a fresh interpreter costs before any work (``edgereg --version``) and
    the same command on an empty store (start-up, imports, the verified
    registry read), so the part that grows with the reports shows apart.
    """
    import subprocess
    import tempfile
    import time
    from pathlib import Path

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    sys.path.insert(0, TESTS)
    import analyze as bench  # benchmarks/analyze.py

    from edgereg.protocol.envelope import generate_key

    def timed(command: list[str], cwd: Path) -> float:
        seconds = []
        for _ in range(runs):
            started = time.perf_counter()
            done = subprocess.run(command, cwd=cwd, capture_output=True, text=True)
            seconds.append(time.perf_counter() - started)
            if done.returncode not in (0, 12, 13):
                sys.exit(f"{command[2:4]} failed ({done.returncode}):\n{done.stderr}")
        return statistics.median(seconds)

    with tempfile.TemporaryDirectory(prefix="edgereg-bench-canary-") as name:
        tmp = Path(name)
        private_pem, public_pem = generate_key()
        (tmp / "publisher.pem").write_bytes(public_pem)
        registry = bench.publish_rollout(tmp / "project", tmp / "registry", private_pem)
        state, _ = registry.read_state(bench.MODEL)
        assert state is not None
        since, _ = analysis_periods_of(state)
        stores = {"SQLite": f"sqlite:///{tmp / 'reports.sqlite'}"}
        empty = f"sqlite:///{tmp / 'empty.sqlite'}"
        import pgkit

        server = None
        if pgkit.postgres_bin() is not None:
            server = pgkit.PostgresServer()
            server.__enter__()
            stores["PostgreSQL"] = server.create_database()
        try:
            for url in stores.values():
                fill_store(bench, url, devices, since)
            base = [sys.executable, "-m", "edgereg.cli"]
            startup = timed([*base, "--version"], tmp)
            command = [
                *base,
                "analyze",
                bench.MODEL,
                "--json",
                "--registry",
                f"file://{tmp / 'registry'}",
                "--trusted-key",
                str(tmp / "publisher.pem"),
                "--reports",
            ]
            nothing = timed([*command, empty], tmp)
            print(
                f"`edgereg --version` {startup:.2f} s; `edgereg analyze` on an empty store "
                f"{nothing:.2f} s (median of {runs})"
            )
            for label, url in stores.items():
                took = timed([*command, url], tmp)
                print(
                    f"`edgereg analyze --json` on {devices:,} reports, {label}: {took:.2f} s "
                    f"(median of {runs}; {took - nothing:+.2f} s over the empty store); "
                    f"target < 1 s: {'PASS' if took < 1 else 'FAIL'}",
                    flush=True,
                )
        finally:
            if server is not None:
                server.__exit__(None, None, None)


def analysis_periods_of(state: RolloutState) -> tuple[datetime, datetime | None]:
    from edgereg.analysis import analysis_periods

    since, stable = analysis_periods(state)
    assert since is not None
    return since, stable


def fill_store(bench: object, url: str, count: int, since: datetime) -> None:
    import random

    from edgereg.reports import open_store

    rng = random.Random(7)
    with open_store(url) as store:
        batch = []
        for pair in bench.reports(count, since + timedelta(seconds=1), rng):  # type: ignore[attr-defined]
            batch.append(pair)
            if len(batch) == 10_000:
                store.ingest_many(batch)
                batch = []
        if batch:
            store.ingest_many(batch)
        assert store.count() == count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=20)
    parser.add_argument("--sizes", default="2000,20000", help="fleet sizes")
    parser.add_argument("--worlds", default=",".join(WORLDS), help="which worlds, by name")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-days", type=float, default=21.0)
    parser.add_argument("--only-table", action="store_true")
    parser.add_argument("--fleet", default=None, help="end-to-end fleet sizes, e.g. 1000")
    parser.add_argument("--http-devices", type=int, default=50)
    parser.add_argument("--latency", action="store_true", help="the latency bands' calibration")
    parser.add_argument("--analyze", type=int, default=0, help="time analyze on N reports")
    parser.add_argument("--each", action="store_true", help="print every rollout as it ends")
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f}")
    if args.analyze:
        analyze_timing(args.analyze, 3)
        return
    if args.latency:
        latency_calibration(args.rollouts)
        return
    if args.fleet:
        run_fleet([int(n) for n in args.fleet.split(",")], args.http_devices, args.max_days)
        return
    print("What one step concludes about reverts once every device reported (default guardrails):")
    print(
        "| devices in the tier | step | candidate vs stable | "
        + " | ".join(c[0] for c in CASES)
        + " |"
    )
    print("|---" * (3 + len(CASES)) + "|")
    for devices in (60, 600, 60_000):
        for percent in (5, 50, 100):
            print(conclusions(devices, percent))
    if args.only_table:
        return
    unknown = set(args.worlds.split(",")) - set(WORLDS)
    if unknown:
        sys.exit(f"unknown worlds {sorted(unknown)}; known: {', '.join(WORLDS)}")
    met = run_worlds(
        args.worlds.split(","),
        [int(n) for n in args.sizes.split(",")],
        args.rollouts,
        args.workers,
        each=args.each,
    )
    print(f"\ntargets: {'PASS' if met else 'FAIL'}")


if __name__ == "__main__":
    main()
