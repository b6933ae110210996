"""Canary judge benchmark: how often whole automatic rollouts end wrong, what fleets conclude.

Monte Carlo over the same pure code `edgereg rollout --auto` runs: the real
rollout transitions (``publish``, then ``decide`` and ``apply`` of
``edgereg.registry._auto``), the real period rules and analysis
(``edgereg.reports.canary.rollout_analysis``) and the default guardrails and
policy (steps 5 → 25 → 50 → 100 %, 24 h soak). Only the report store is
simulated: per period, every device of an arm reports at its app's first
start (apps start once a day, so reports arrive through the day), a
crash-looping device reports its stall ``--stall-days`` later (its second
unconfirmed start: the unconfirmed guardrail) and its revert
``--revert-days`` later (the third), and latencies are log-normal. ``--auto`` looks every 30
simulated minutes; a rollout that neither promotes nor rolls back within
``--max-days`` is "stuck".

Prints, for a good candidate (every rate equal in both arms: 0.5 % probe
failures, 0.5 % load failures, 2 % reverts) and for realistic bad ones (+2
points of reverts, +2 points of probe failures, +30 % load time):
P(rolled back), P(promoted), P(stuck), and the median days to the end. With
``--compare`` the same world is also judged by the earlier per-look score
test (Farrington-Manning, a fail on one device), for the before/after.

Then the table of docs/operations/canary-analysis.md: for fleets of 60, 600
and 60,000 devices in a tier, what one step of 5 % (and 50 %) can conclude
once every device has reported.

Targets: P(good candidate rolled back) <= 5 % over a whole rollout;
P(bad candidate promoted) <= 1 %.

With ``--fleet 1000,20000`` it runs instead the end-to-end fleet of
tests/fleetsim.py for each size: a real registry, ``edgereg serve``'s report
endpoint (default limits and checks on the simulated clock) with the first
``--http-devices`` devices posting over HTTP from their own 127.x.y.2, a
SQLite report store, ``run_auto`` every 30 simulated minutes with the default
policy, and a forger inside the limits; one rollout per scenario.

Usage: .venv/bin/python benchmarks/canary.py [--rollouts 200] [--devices 200000] [--compare]
       .venv/bin/python benchmarks/canary.py --fleet 1000,20000 [--http-devices 50]
       .venv/bin/python benchmarks/canary.py --latency --rollouts 100
       .venv/bin/python benchmarks/canary.py --analyze 20000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from statistics import NormalDist

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edgereg.analysis import _canary, analyze
from edgereg.analysis._rates import RateComparison, restricted_rates
from edgereg.config import Guardrails, RateGuardrail, RolloutPolicy, UnconfirmedGuardrail
from edgereg.protocol.wire import RolloutState
from edgereg.registry._auto import apply, decide
from edgereg.registry._transitions import publish
from edgereg.reports.canary import rollout_analysis
from edgereg.reports.summary import LATENCY_EDGES_MS, ArmSummary

UNIT = "vision"
TIER = "high"
START = datetime(2026, 12, 1, tzinfo=timezone.utc)
DAY = 86_400.0
LOOK = timedelta(minutes=30)
EXPIRES = START + timedelta(days=365)
LATENCY_EDGES = np.array(LATENCY_EDGES_MS)
#: --require-proof: judge with the strict rule (set before the worker processes fork).
REQUIRE_PROOF = False


@dataclass(frozen=True)
class World:
    """One candidate's true rates against the stable's."""

    name: str
    good: bool
    probe: tuple[float, float] = (0.005, 0.005)
    load: tuple[float, float] = (0.005, 0.005)
    revert: tuple[float, float] = (0.02, 0.02)
    slower: float = 1.0
    #: A bundle of MEMBERS whose last member is this much slower in the candidate
    #: (judged per member, one value per device); None: a single model.
    member_slower: float | None = None


WORLDS = (
    World("good (0.5/0.5/2 % in both arms)", good=True),
    World("reverts +2 pt (4 % vs 2 %)", good=False, revert=(0.04, 0.02)),
    World("probe failures +2 pt", good=False, probe=(0.025, 0.005)),
    World("load time +30 %", good=False, slower=1.3),
    World("reverts +3 pt (5 % vs 2 %)", good=False, revert=(0.05, 0.02)),
    World("load time +12 %", good=False, slower=1.12),
    World("crash loop on 80 %", good=False, revert=(0.8, 0.02)),
    World("bundle: one member +40 %", good=False, member_slower=1.4),
)
#: A bundle's members (the last one is the slower in a member_slower world).
MEMBERS = ("det", "cls", "rec")


class Batch:
    """One arm's devices of one period: when each first reports, and what it reports."""

    def __init__(
        self,
        rng: np.random.Generator,
        arm: str,
        version: str,
        devices: int,
        start: float,
        rates: Sequence[float],
        slower: float,
        revert_days: float,
        stall_days: float = math.inf,
        member_slower: float | None = None,
    ) -> None:
        self.arm, self.version = arm, version
        self.revert_delay = revert_days * DAY
        self.stall_delay = stall_days * DAY
        # Sorted by report time: what has arrived by a moment is a prefix, counted by bisection.
        self.times = np.sort(start + rng.random(devices) * DAY)
        self.cumulative = [
            np.concatenate(([0], np.cumsum(rng.random(devices) < rate))) for rate in rates
        ]
        load = np.exp(rng.normal(math.log(40.0 * slower), 0.35, devices))
        self.load = np.searchsorted(LATENCY_EDGES, load)
        # Each member's own load time per device; the last member's is member_slower.
        self.member_load = {
            member: np.searchsorted(
                LATENCY_EDGES,
                np.exp(
                    rng.normal(
                        math.log(40.0 * ((member_slower or 1.0) if member == MEMBERS[-1] else 1.0)),
                        0.35,
                        devices,
                    )
                ),
            )
            for member in (MEMBERS if member_slower is not None else ())
        }

    def summary(
        self, since: float, now: float, aged: float | None, member: str | None = None
    ) -> ArmSummary | None:
        first = int(np.searchsorted(self.times, since, side="left"))
        last = int(np.searchsorted(self.times, now, side="right"))
        devices = last - first
        if devices <= 0:
            return None
        probe, load, _ = (int(c[last] - c[first]) for c in self.cumulative)
        # A crash loop shows as a revert only after the unconfirmed starts it takes.
        shown = int(np.searchsorted(self.times, now - self.revert_delay, side="right"))
        reverted = int(self.cumulative[2][max(first, shown)] - self.cumulative[2][first])
        # The installs old enough to have reverted (revert_window_hours), and their reverts.
        old = last if aged is None else max(first, int(np.searchsorted(self.times, aged, "right")))
        old = min(old, last)
        aged_reverted = int(
            self.cumulative[2][min(old, max(first, shown))] - self.cumulative[2][first]
        )
        # It stalls (its second unconfirmed start) before it reverts, and stays stalled.
        stall = int(np.searchsorted(self.times, now - self.stall_delay, side="right"))
        stalled = int(self.cumulative[2][max(first, stall)] - self.cumulative[2][first])
        aged_stalled = int(
            self.cumulative[2][min(old, max(first, stall))] - self.cumulative[2][first]
        )
        loads = self.load if member is None else self.member_load[member]
        counts = np.bincount(loads[first:last])
        histogram = {int(b): int(c) for b, c in enumerate(counts) if c}
        return ArmSummary(
            unit=UNIT,
            tier=TIER,
            arm=self.arm,  # type: ignore[arg-type]
            version=self.version,
            devices=devices,
            probe_failed=probe,
            load_failed=load,
            reverted=reverted,
            confirmed=devices - max(reverted, stalled),
            aged_devices=None if aged is None else old - first,
            aged_reverted=0 if aged is None else aged_reverted,
            stalled=stalled,
            aged_stalled=0 if aged is None else aged_stalled,
            load_ms=histogram,
            inference_p50_ms=histogram,
        )


class SimulatedStore:
    """The store's ``summaries`` over simulated batches, as of the simulation's clock.

    ``stalled_starts`` is the default guardrail's (2): a batch's stall delay is the
    time its apps take to start twice (``--stall-days``).
    """

    def __init__(self, bundle: bool = False) -> None:
        self.batches: list[Batch] = []
        self.now = 0.0
        self.bundle = bundle

    def members(self, unit: str) -> list[str]:
        """A bundle's members, each judged on its own latencies (rollout_analysis asks)."""
        return list(MEMBERS) if self.bundle else []

    def summaries(
        self,
        unit: str,
        since: datetime | None = None,
        *,
        model: str | None = None,
        aged_before: datetime | None = None,
        stalled_starts: int = 2,
    ) -> list[ArmSummary]:
        cut = (since - START).total_seconds() if since is not None else 0.0
        aged = (aged_before - START).total_seconds() if aged_before is not None else None
        found = [b.summary(cut, self.now, aged, model) for b in self.batches]
        return [s for s in found if s is not None]


def one_rollout(
    world: World,
    seed: int,
    devices: int,
    max_days: float,
    revert_days: float,
    old: bool = False,
    stall_days: float = 1.0,
):
    """Run one rollout to its end; returns (outcome, days).

    The earlier judge (``old``) had no unconfirmed guardrail: its batches never stall.
    """
    stalls = math.inf if old else stall_days
    rng = np.random.default_rng(seed)
    policy = OLD_POLICY if old else RolloutPolicy(require_proof=REQUIRE_PROOF)
    store = SimulatedStore(bundle=world.member_slower is not None)
    state: RolloutState = publish(
        None,
        UNIT,
        "1.0.0",
        percent=None,
        full=True,
        salt="0" * 16,
        now=START,
        expires=EXPIRES,
        actor="bench",
    )
    state = publish(
        state,
        UNIT,
        "1.1.0",
        percent=policy.steps[0],
        full=False,
        salt="1" * 16,
        now=START,
        expires=EXPIRES,
        actor="bench",
    )

    def new_period(percent: float, at: float) -> None:
        candidate = round(devices * percent / 100)
        pairs = [(r[0], r[1]) for r in (world.probe, world.load, world.revert)]
        store.batches.append(
            Batch(
                rng,
                "candidate",
                "1.1.0",
                candidate,
                at,
                [p[0] for p in pairs],
                world.slower,
                revert_days,
                stalls,
                world.member_slower,
            )
        )
        if devices - candidate:
            store.batches.append(
                Batch(
                    rng,
                    "stable",
                    "1.0.0",
                    devices - candidate,
                    at,
                    [p[1] for p in pairs],
                    1.0,
                    revert_days,
                    stalls,
                    None if world.member_slower is None else 1.0,
                )
            )

    # Reports stamped in the second of a change are not counted (the period starts after it).
    new_period(policy.steps[0], 1.0)
    now = START
    while (now - START).total_seconds() < max_days * DAY:
        now += LOOK
        store.now = (now - START).total_seconds()
        analysis = rollout_analysis(
            store, state, guardrails=policy.guardrails, tiers=[TIER], now=now
        )
        decision = decide(state, UNIT, analysis, policy=policy, now=now)
        if not decision.changes_state:
            continue
        state = apply(
            decision,
            state,
            UNIT,
            analysis=analysis,
            policy=policy,
            now=now,
            expires=EXPIRES,
            actor="bench",
            expected_sequence=state.sequence,
        )
        days = store.now / DAY
        if decision.action in ("rollback", "pause"):
            return "rolled back", days
        if decision.action == "promote":
            return "promoted", days
        assert decision.percent is not None
        new_period(decision.percent, store.now + 1.0)
    return f"stuck at {state.percent:g}%", max_days


# --- the earlier judge, for the comparison (the per-look score test of git history) ------

_NORMAL = NormalDist()


def _score_z(x1: int, n1: int, x0: int, n0: int, delta: float) -> float:
    difference = x1 / n1 - x0 / n0
    r1, r0 = restricted_rates(x1, n1, x0, n0, delta)
    variance = r1 * (1 - r1) / n1 + r0 * (1 - r0) / n0
    if variance <= 0:
        return (
            0.0
            if math.isclose(difference, delta, abs_tol=1e-12)
            else math.copysign(math.inf, difference - delta)
        )
    return (difference - delta) / math.sqrt(variance)


def score_test(x1: int, n1: int, x0: int, n0: int, *, margin: float, alpha: float):
    z = _score_z(x1, n1, x0, n0, margin)
    upper = 0.5 * math.erfc(z / math.sqrt(2))
    lower = 0.5 * math.erfc(-z / math.sqrt(2))
    return RateComparison(x1, n1, x0, n0, margin, x1 / n1 - x0 / n0, 0.0, upper, lower, -1.0, 1.0)


# The earlier judge had no failing-device floor and no absolute limit.
_NO_CEILING = RateGuardrail(max_rate=1.0)
OLD_POLICY = RolloutPolicy(
    guardrails=Guardrails(
        min_failing_devices=1,
        min_failing_sources=1,
        probe_failure=_NO_CEILING,
        load_failure=_NO_CEILING,
        revert=_NO_CEILING,
        unconfirmed=UnconfirmedGuardrail(max_rate=1.0),
    )
)


def use_score_test() -> None:
    _canary.compare_rates = score_test  # type: ignore[assignment]


def _job(args: tuple[World, int, int, float, float, bool, float]):
    world, seed, devices, max_days, revert_days, old, stall_days = args
    if old:
        use_score_test()
    return one_rollout(world, seed, devices, max_days, revert_days, old, stall_days)


def run_world(pool, world: World, args: argparse.Namespace, old: bool) -> dict[str, float]:
    jobs = [
        (world, 1000 * i + 7, args.devices, args.max_days, args.revert_days, old, args.stall_days)
        for i in range(args.rollouts)
    ]
    results = list(pool.map(_job, jobs, chunksize=4))
    outcomes = [o for o, _ in results]
    n = len(results)
    rolled = sum(o == "rolled back" for o in outcomes) / n
    promoted = sum(o == "promoted" for o in outcomes) / n
    ended = [d for o, d in results if not o.startswith("stuck")]
    print(
        f"  {'score test' if old else 'always-valid'}  {world.name:<32} rolled back "
        f"{100 * rolled:5.1f}%  promoted {100 * promoted:5.1f}%  stuck "
        f"{100 * (1 - rolled - promoted):5.1f}%  median days to the end "
        f"{statistics.median(ended) if ended else float('nan'):.1f}"
        + "".join(
            f"; {outcomes.count(o)} {o}" for o in sorted(set(outcomes)) if o.startswith("stuck")
        ),
        flush=True,
    )
    return {"rolled back": rolled, "promoted": promoted}


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
        cand = ArmSummary(
            UNIT, TIER, "candidate", "1.1.0", candidate_n, reverted=round(c_rate * candidate_n)
        )
        stab = ArmSummary(
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


TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


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
    parser.add_argument("--rollouts", type=int, default=200)
    parser.add_argument("--devices", type=int, default=200_000, help="devices in the tier")
    parser.add_argument("--max-days", type=float, default=14.0)
    parser.add_argument("--revert-days", type=float, default=2.0)
    parser.add_argument(
        "--stall-days", type=float, default=1.0, help="install to the second unconfirmed start"
    )
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--compare", action="store_true", help="also run the earlier judge")
    parser.add_argument("--only-table", action="store_true")
    parser.add_argument("--only-good", action="store_true", help="only the good candidate")
    parser.add_argument("--worlds", default="0,1,2,3,4,5,6,7", help="which worlds (indexes)")
    parser.add_argument(
        "--require-proof", action="store_true", help="require_proof = true (no soak steps)"
    )
    parser.add_argument("--fleet", default=None, help="end-to-end fleet sizes, e.g. 1000,20000")
    parser.add_argument("--http-devices", type=int, default=50)
    parser.add_argument("--latency", action="store_true", help="the latency bands' calibration")
    parser.add_argument("--analyze", type=int, default=0, help="time analyze on N reports")
    args = parser.parse_args()
    global REQUIRE_PROOF
    REQUIRE_PROOF = args.require_proof
    print(f"load average {os.getloadavg()[0]:.1f}, require_proof = {REQUIRE_PROOF}")
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
    print(
        f"\n{args.rollouts} rollouts per world, {args.devices} devices in one tier, --auto every "
        f"30 min, stalls reported {args.stall_days:g} and reverts {args.revert_days:g} days after "
        "install:"
    )
    summary = []
    with ProcessPoolExecutor(args.workers) as pool:
        chosen = [WORLDS[int(i)] for i in args.worlds.split(",")]
        for world in WORLDS[:1] if args.only_good else chosen:
            summary.append((world, run_world(pool, world, args, False)))
        if args.compare:
            # The earlier judge on the good candidate: the false rollbacks it made.
            run_world(pool, WORLDS[0], args, True)
    print("\nsummary")
    for world, found in summary:
        if world.good:
            ok = found["rolled back"] <= 0.05
            print(
                f"  P(good rolled back) <= 5 %: {100 * found['rolled back']:.1f}%  "
                f"{'PASS' if ok else 'FAIL'}"
            )
        else:
            ok = found["promoted"] <= 0.01
            print(
                f"  P(bad promoted) <= 1 % [{world.name}]: {100 * found['promoted']:.1f}%  "
                f"{'PASS' if ok else 'FAIL'}"
            )


if __name__ == "__main__":
    main()
