"""The world shipped clients make, fast: a fleet of thousands, whole rollouts, many times over.

What users live in, per device: a tier (three, one of them tiny), a CPU class, a
network (its own home /24, or a carrier NAT shared with many), an hour of the
day its app starts (evenings and mornings), days it does not open the app,
starts without a network (offline spells), and new users joining through the
rollout. Each start does what the reference client does (docs/protocol.md §11):
``app_started`` (a crash loop counts its unconfirmed starts, then reverts),
the update check when online (install the release the manifest gives it, or
refuse it: probe or load failure), the app's first real inference (confirm,
unless the release crashes: every start, or only the first launch), and the
reports of each, kept while offline and delivered at the next start online.
In the ``period`` regime (what shipped clients do now) a device reports again
the release the manifest gives it, refused or not, at each new manifest
sequence; in ``legacy`` (clients before it) only at install, starts,
confirmation and revert.

What the report store keeps is mirrored in numpy (one row per install, merged
as the store merges, docs/protocol.md §12) and summarised per tier and arm
exactly as ``ReportStore.summaries`` does (per device and per source network;
tests/test_worldsim.py checks the two agree on the same reports); the rollout
runs the real pure code of ``edgereg rollout --auto``: the transitions, the
analysis (with the default guardrails) and :func:`~edgereg.registry._auto.decide`,
every 30 simulated minutes. A forger posts valid-looking reports of what the
manifests serve from networks of its own.

benchmarks/canary.py runs it over many rollouts; tests/test_worldsim.py runs a
few small ones in the suite.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Literal

import numpy as np

from edgereg.analysis import Analysis, analysis_sequences, analyze
from edgereg.config import AppMetric, RolloutPolicy
from edgereg.protocol.wire import RolloutState
from edgereg.registry._auto import apply, decide
from edgereg.registry._transitions import publish
from edgereg.reports.summary import LATENCY_EDGES_MS, ArmSummary, Histogram, MetricTally, Tally

UNIT = "vision"
STABLE, CANDIDATE = "1.0.0", "1.1.0"
START = datetime(2026, 12, 1, tzinfo=timezone.utc)
EXPIRES = START + timedelta(days=365)
LOOK = timedelta(minutes=30)
TIERS: tuple[tuple[str, float], ...] = (("high", 0.40), ("mid", 0.57), ("low", 0.03))
CPU_CLASSES: tuple[tuple[str, float], ...] = (("armv8", 0.15), ("armv8.2", 0.60), ("armv9", 0.25))
#: The client's default: app starts an install gets to be confirmed before it reverts.
MAX_UNCONFIRMED_STARTS = 3
_EDGES = np.array(LATENCY_EDGES_MS)


def _bucket(values: np.ndarray) -> np.ndarray:
    return np.minimum(np.searchsorted(_EDGES, values, side="left"), len(_EDGES) - 1)


@dataclass(frozen=True)
class Release:
    """How one release behaves on the fleet: shares of devices, latencies in ms.

    ``crash_loop_by`` adds crash loops on one CPU class or tier (``{"armv9": 0.15}``).
    ``first_crash``: the share of installs whose app crashes at the first launch
    after the install, and runs from the second on.
    """

    probe_failure: float = 0.005
    load_failure: float = 0.005
    crash_loop: float = 0.02
    first_crash: float = 0.0
    load_ms: float = 40.0
    inference_ms: float = 12.0
    spread: float = 0.35
    crash_loop_by: Mapping[str, float] = field(default_factory=dict)
    #: The app metric ``accepted``: the share of a device's events (say, recognised
    #: texts) its user kept, on average over devices (each user has a bias of its own).
    accepted: float = 0.92


GOOD = Release()

#: The app metric the worlds with ``metrics`` declare, and the guardrail on it.
ACCEPTED = AppMetric(kind="rate", description="the user kept the recognised text")
METRIC_GUARDRAILS = {"accepted": {"metric": "accepted", "max_worse": 0.01}}
#: Events a device counts per app start that uses the model, on average.
EVENTS_PER_START = 3.0


@dataclass(frozen=True)
class Forger:
    """Reports from ``networks`` /24s of its own, ``reports`` per rollout period in all.

    ``kind``: ``fail`` (candidate-arm failures: reverts and probe failures, to
    roll back a good candidate), ``stable-fail`` (stable-arm failures, to mask a
    bad one), ``pass`` (healthy candidate installs, to dilute a bad one) or
    ``slow`` (slow candidate latencies, to hold a good one).
    """

    kind: Literal["fail", "stable-fail", "pass", "slow"]
    networks: int = 3
    reports: int = 10


@dataclass(frozen=True)
class World:
    """One rollout's world."""

    candidate: Release = GOOD
    devices: int = 2000
    regime: Literal["period", "legacy"] = "period"
    forger: Forger | None = None
    #: Hours the report server's clock is behind (or, negative, ahead of) the --auto host's.
    serve_skew_hours: float = 0.0
    #: Share of devices behind a carrier NAT (each NAT a /24 of many devices).
    nat_share: float = 0.15
    #: Share of a day's starts that find no network.
    offline: float = 0.08
    #: Chance a device opens its app on a given day.
    daily_use: float = 0.9
    #: New users per day, as a share of the fleet.
    new_users: float = 0.003
    policy: RolloutPolicy = field(default_factory=RolloutPolicy)
    max_days: float = 21.0
    #: The app records ``accepted`` and the policy has a guardrail on it (max_worse 1 pt).
    metrics: bool = False

    @property
    def judged_by(self) -> RolloutPolicy:
        """The policy the rollout runs under: ``policy``, with the metric's guardrail."""
        if not self.metrics:
            return self.policy
        data = self.policy.model_dump()
        data["guardrails"] = {**data["guardrails"], **METRIC_GUARDRAILS}
        return RolloutPolicy.model_validate(data)

    @property
    def declared(self) -> dict[str, AppMetric]:
        """The app metrics the unit declares."""
        return {"accepted": ACCEPTED} if self.metrics else {}


@dataclass
class Outcome:
    """How a simulated rollout ended."""

    result: str  # promoted, rolled back, paused, or "stuck at P%"
    days: float
    reached_full: float | None  # the day the candidate reached 100 %, if it did
    moves: list[tuple[float, str, str]]  # (day, action, reason) of every move

    @property
    def exposed(self) -> bool:
        """Promoted, or left at 100 % (a promotion in all but name)."""
        return self.result == "promoted" or self.result == "stuck at 100%"


class _Arm:
    """One release's per-device state: what the device holds, made, and the store keeps."""

    def __init__(self, n: int) -> None:
        # On the device: 0 nothing, 1 installed, 2 refused by its self-test, 3 reverted.
        self.inst = np.zeros(n, np.int8)
        self.confirmed = np.zeros(n, bool)
        self.unconf = np.zeros(n, np.int16)
        self.first_launch = np.zeros(n, bool)  # installed at this start: its first launch
        # The install's latest report as made on the device (kept until delivered).
        self.reported = np.zeros(n, bool)
        self.m_seq = np.zeros(n, np.int64)
        self.m_conf = np.zeros(n, bool)
        self.m_rev = np.zeros(n, bool)
        self.m_unconf = np.full(n, -1, np.int16)  # -1: not said (report schema 1)
        self.m_pf = np.zeros(n, bool)
        self.m_lf = np.zeros(n, bool)
        self.m_load = np.full(n, -1, np.int32)
        self.m_inf = np.full(n, -1, np.int32)
        self.undelivered = np.zeros(n, bool)
        # The store's row of the install (merged as docs/protocol.md §12 says).
        self.row = np.zeros(n, bool)
        self.s_seq = np.zeros(n, np.int64)
        self.s_conf = np.zeros(n, bool)
        self.s_rev = np.zeros(n, bool)
        self.s_unconf = np.full(n, -1, np.int16)
        self.s_pf = np.zeros(n, bool)
        self.s_lf = np.zeros(n, bool)
        self.s_load = np.full(n, -1, np.int32)
        self.s_inf = np.full(n, -1, np.int32)
        self.s_first = np.zeros(n, np.float64)  # hours since START, the server's clock
        self.s_recv = np.zeros(n, np.float64)
        # The app metric ``accepted``: the install's totals on the device and in the store
        # (a report carries the totals when made; the store keeps each count's highest).
        self.events = np.zeros(n, np.int64)
        self.kept = np.zeros(n, np.int64)
        self.m_events = np.zeros(n, np.int64)
        self.m_kept = np.zeros(n, np.int64)
        self.s_events = np.zeros(n, np.int64)
        self.s_kept = np.zeros(n, np.int64)
        self.m_at = np.full(n, -1e9)  # when the install's latest report was made

    def deliver(self, who: np.ndarray, at: float) -> None:
        """The reports of ``who`` reach the store: merged into their rows."""
        who = who[self.undelivered[who]]
        if not len(who):
            return
        new = ~self.row[who]
        self.s_first[who] = np.where(new, at, np.minimum(self.s_first[who], at))
        self.row[who] = True
        newer = self.m_seq[who] >= self.s_seq[who]
        self.s_seq[who] = np.maximum(self.s_seq[who], self.m_seq[who])
        self.s_conf[who] |= self.m_conf[who]
        self.s_rev[who] |= self.m_rev[who]
        self.s_lf[who] |= self.m_lf[who]
        self.s_pf[who] = np.where(newer, self.m_pf[who], self.s_pf[who])
        self.s_unconf[who] = np.maximum(self.s_unconf[who], self.m_unconf[who])
        self.s_load[who] = np.where(
            newer & (self.m_load[who] >= 0), self.m_load[who], self.s_load[who]
        )
        take = (newer & (self.m_inf[who] >= 0)) | (self.s_inf[who] < 0)
        self.s_inf[who] = np.where(take, self.m_inf[who], self.s_inf[who])
        self.s_recv[who] = np.maximum(self.s_recv[who], at)
        self.s_events[who] = np.maximum(self.s_events[who], self.m_events[who])
        self.s_kept[who] = np.maximum(self.s_kept[who], self.m_kept[who])
        self.undelivered[who] = False

    def made(self, who: np.ndarray, at: float) -> None:
        """``who`` make a report of the install now: it carries their totals so far."""
        self.undelivered[who] = True
        self.m_events[who] = self.events[who]
        self.m_kept[who] = self.kept[who]
        self.m_at[who] = at


class Fleet:
    """The devices, their two releases (stable, candidate), and the rollout state."""

    def __init__(self, world: World, seed: int) -> None:
        self.world = world
        rng = self.rng = np.random.default_rng(seed)
        joined = int(world.devices * (1 + world.new_users * world.max_days))
        n = self.n = joined
        self.tier = rng.choice(len(TIERS), n, p=[share for _, share in TIERS])
        self.cpu = rng.choice(len(CPU_CLASSES), n, p=[share for _, share in CPU_CLASSES])
        # Networks: a /24 of its own, or one of a few carrier NATs per thousand devices.
        nats = max(2, world.devices // 250)
        behind = rng.random(n) < world.nat_share
        self.net = np.where(behind, rng.integers(0, nats, n), nats + np.arange(n))
        # Evenings and mornings; a device starts its app at about the same hour each day.
        evening = rng.random(n) < 0.7
        self.hour = np.where(evening, rng.normal(19.5, 2.5, n), rng.normal(8.0, 1.5, n)) % 24
        self.joined_day = np.where(
            np.arange(n) < world.devices,
            -30.0,
            rng.uniform(0, world.max_days, n),
        )
        self.offline_until = np.full(n, -1.0)
        self.cohort = rng.random(n)
        # Each user's own bias in keeping results, whatever the release (its own
        # generator: a world without metrics draws what it drew before).
        self.bias = np.random.default_rng(seed + 7).normal(0.0, 0.03, n)
        self.arms = (_Arm(n), _Arm(n))
        self.running = np.full(n, -1, np.int8)
        self.releases = (GOOD, world.candidate)
        self.draws = tuple(self._draw(release) for release in self.releases)
        self.skew = world.serve_skew_hours
        self._settle_stable()

    def _draw(self, release: Release) -> dict[str, np.ndarray]:
        rng, n = self.rng, self.n
        crash = np.full(n, release.crash_loop)
        for name, extra in release.crash_loop_by.items():
            classes = [c for c, _ in CPU_CLASSES]
            tiers = [t for t, _ in TIERS]
            if name in classes:
                crash = crash + extra * (self.cpu == classes.index(name))
            else:
                crash = crash + extra * (self.tier == tiers.index(name))
        return {
            "probe": rng.random(n) < release.probe_failure,
            "load": rng.random(n) < release.load_failure,
            "crash": rng.random(n) < crash,
            "first": rng.random(n) < release.first_crash,
            "load_b": _bucket(np.exp(rng.normal(math.log(release.load_ms), release.spread, n))),
            "inf_b": _bucket(np.exp(rng.normal(math.log(release.inference_ms), release.spread, n))),
            "accept": np.clip(release.accepted + self.bias, 0.0, 1.0),
        }

    def _settle_stable(self) -> None:
        """Every device of the first fleet installed the stable weeks ago and reported it."""
        first = np.flatnonzero(self.joined_day < 0)
        arm, draw = self.arms[0], self.draws[0]
        refused = draw["probe"][first] | draw["load"][first]
        crashed = ~refused & draw["crash"][first]
        fine = ~refused & ~crashed
        arm.inst[first] = np.where(refused, 2, np.where(crashed, 3, 1))
        arm.confirmed[first] = fine
        arm.reported[first] = True
        arm.m_seq[first] = 1
        arm.m_pf[first] = refused
        arm.m_lf[first] = draw["load"][first] & ~draw["probe"][first]
        arm.m_rev[first] = crashed
        arm.m_conf[first] = fine
        arm.m_unconf[first] = np.where(
            crashed, MAX_UNCONFIRMED_STARTS, np.where(draw["first"][first], 1, 0)
        )
        arm.m_load[first] = np.where(refused, -1, draw["load_b"][first])
        arm.m_inf[first] = np.where(fine, draw["inf_b"][first], -1)
        if self.world.metrics:
            # Weeks of use of the stable install: its totals since the install.
            days = np.random.default_rng(len(first)).uniform(5, 29, len(first))
            metric_rng = np.random.default_rng(int(self.bias.size))
            used = np.where(fine, metric_rng.poisson(EVENTS_PER_START * 0.9 * days), 0)
            arm.events[first] = used
            arm.kept[first] = metric_rng.binomial(used, draw["accept"][first])
        arm.made(first, -24 * 30.0)
        arm.deliver(first, -24 * 30.0 + self.rng.uniform(0, 24 * 29, len(first)))
        self.running[first[fine]] = 0

    # -- one app start, vectorised over the devices starting in a half hour --------------

    def starts(self, who: np.ndarray, at: float, state: RolloutState) -> None:
        """``who`` start their app at ``at`` (hours since START) under ``state``."""
        if not len(who):
            return
        offline = (self.rng.random(len(who)) < self.world.offline) | (self.offline_until[who] > at)
        # An offline spell: a few days without a network now and then.
        spell = self.rng.random(len(who)) < 0.01
        self.offline_until[who[spell]] = at + self.rng.uniform(24, 96, int(spell.sum()))
        self._app_started(who, at)
        online = who[~offline]
        self._update_check(online, state, at)
        self._run(who, at)
        if self.world.metrics:
            self._use(who, online, at)
        stamp = at - self.skew
        for arm in self.arms:
            arm.deliver(online, stamp)

    def _app_started(self, who: np.ndarray, at: float) -> None:
        for v, arm in enumerate(self.arms):
            mine = who[(self.running[who] == v) & (arm.inst[who] == 1) & ~arm.confirmed[who]]
            if not len(mine):
                continue
            # The start before this one ran it and was not confirmed: it counts one, and
            # the start that brings the count to MAX_UNCONFIRMED_STARTS does not load it
            # but reverts (docs/protocol.md §11, edgereg.client._health.on_start): a crash
            # loop installed during a start runs 3 times and reverts at the third start after.
            arm.unconf[mine] += 1
            due = arm.unconf[mine] >= MAX_UNCONFIRMED_STARTS
            revert = mine[due]
            arm.inst[revert] = 3
            arm.m_unconf[revert] = arm.unconf[revert]
            arm.m_rev[revert] = True
            arm.m_inf[revert] = -1
            arm.made(revert, at)
            back = (v == 1) & (self.arms[0].inst[revert] == 1)
            self.running[revert] = np.where(back, 0, -1)
            count = mine[~due]
            arm.m_unconf[count] = arm.unconf[count]
            arm.made(count, at)
            arm.first_launch[mine] = False

    def _update_check(self, who: np.ndarray, state: RolloutState, at: float) -> None:
        if not len(who):
            return
        sequence = state.sequence
        live = state.candidate is not None and not state.paused and state.percent is not None
        assigned = (
            (self.cohort[who] * 100 < state.percent).astype(np.int8)
            if live and state.percent is not None
            else np.zeros(len(who), np.int8)
        )
        for v, arm in enumerate(self.arms):
            mine = who[assigned == v]
            if not len(mine):
                continue
            refused = mine[arm.inst[mine] >= 2]
            if v == 1 and len(refused):
                # Refused here: the stable runs; a new user installs it first.
                self._install(refused[self.arms[0].inst[refused] == 0], 0, sequence, at)
                self.running[refused[self.arms[0].inst[refused] == 1]] = 0
            fresh = mine[arm.inst[mine] == 0]
            self._install(fresh, v, sequence, at)
            held = mine[(arm.inst[mine] == 1) & (self.running[mine] != v)]
            self.running[held] = v
            if self.world.regime == "period":
                again = mine[arm.reported[mine] & (arm.m_seq[mine] < sequence)]
                arm.m_seq[again] = sequence
                running = arm.inst[again] == 1
                # The latency of the release that ran; a refused one's reports carry none.
                arm.m_inf[again] = np.where(
                    running & arm.confirmed[again], self.draws[v]["inf_b"][again], -1
                )
                arm.made(again, at)

    def _install(self, who: np.ndarray, v: int, sequence: int, at: float) -> None:
        if not len(who):
            return
        arm, draw = self.arms[v], self.draws[v]
        refused = draw["probe"][who] | draw["load"][who]
        arm.inst[who] = np.where(refused, 2, 1)
        arm.confirmed[who] = False
        arm.unconf[who] = 0
        arm.first_launch[who] = ~refused
        arm.reported[who] = True
        arm.m_seq[who] = sequence
        arm.m_pf[who] = refused
        arm.m_lf[who] = draw["load"][who] & ~draw["probe"][who]
        arm.m_conf[who] = False
        arm.m_rev[who] = False
        arm.m_unconf[who] = np.where(refused, -1, 0)
        arm.m_load[who] = np.where(refused, -1, draw["load_b"][who])
        arm.m_inf[who] = -1
        arm.events[who] = 0
        arm.kept[who] = 0
        arm.made(who, at)
        ok = who[~refused]
        self.running[ok] = v

    def _run(self, who: np.ndarray, at: float) -> None:
        for v, arm in enumerate(self.arms):
            mine = who[(self.running[who] == v) & (arm.inst[who] == 1) & ~arm.confirmed[who]]
            if not len(mine):
                continue
            draw = self.draws[v]
            crash = draw["crash"][mine] | (draw["first"][mine] & arm.first_launch[mine])
            fine = mine[~crash]
            arm.confirmed[fine] = True
            arm.m_conf[fine] = True
            arm.m_inf[fine] = draw["inf_b"][fine]
            arm.made(fine, at)
            arm.first_launch[mine] = False

    def _use(self, who: np.ndarray, online: np.ndarray, at: float) -> None:
        """The app uses the model it runs: ``accepted`` counts its events (record(name, ok)).

        Counts go with the install that ran them; when they changed and the install's
        last report is 12 hours old, the report is made again (docs/protocol.md §11).
        """
        for v, arm in enumerate(self.arms):
            mine = who[(self.running[who] == v) & (arm.inst[who] == 1) & arm.confirmed[who]]
            if len(mine):
                used = self.rng.poisson(EVENTS_PER_START, len(mine))
                arm.events[mine] += used
                arm.kept[mine] += self.rng.binomial(used, self.draws[v]["accept"][mine])
            here = online[arm.reported[online] & ~arm.undelivered[online]]
            due = here[(arm.events[here] != arm.m_events[here]) & (arm.m_at[here] <= at - 12)]
            arm.made(due, at)

    # -- what the store's summaries say -----------------------------------------------

    def summaries(
        self,
        since: tuple[int, int],
        *,
        aged_hours: float,
        forged: Sequence[ArmSummary] = (),
        pooled: bool = False,
        server_now: float | None = None,
    ) -> list[ArmSummary]:
        """Per tier and arm, as ``ReportStore.summaries(since_sequence=...)`` would say.

        ``pooled``: every tier together (tier ``*``), each network once. ``server_now``:
        the hour the report server last marked the store's clock; the clock is that or
        the newest report, whichever is later.
        """
        rows = [arm.row for arm in self.arms]
        newest = max(
            float(arm.s_recv[r].max()) if r.any() else -1e9
            for arm, r in zip(self.arms, rows, strict=True)
        )
        clock = newest if server_now is None else max(newest, server_now)
        cut = clock - aged_hours
        out = []
        for v, (name, version) in enumerate((("stable", STABLE), ("candidate", CANDIDATE))):
            arm = self.arms[v]
            period = since[0] if v == 1 else since[1]
            chosen = arm.row & (arm.s_seq >= period)
            groups = (
                [("*", chosen)]
                if pooled
                else [(tier, chosen & (self.tier == t)) for t, (tier, _) in enumerate(TIERS)]
            )
            for tier, mask in groups:
                if not mask.any():
                    continue
                out.append(
                    _summary(
                        arm,
                        np.flatnonzero(mask),
                        self.net,
                        cut,
                        tier,
                        name,
                        version,
                        metrics=self.world.metrics,
                    )
                )
        if pooled:
            forged = [
                ArmSummary(UNIT, "*", f.arm, f.version, f.all, f.aged, f.histograms, f.metrics)
                for f in forged
            ]
        return _with_forged(out, forged)


_EVENTS = ("probe_failed", "load_failed", "reverted", "stalled", "first_start", "confirmed")


def _events(arm: _Arm, idx: np.ndarray) -> dict[str, np.ndarray]:
    unconf = arm.s_unconf[idx]
    return {
        "probe_failed": arm.s_pf[idx] & ~arm.s_lf[idx],
        "load_failed": arm.s_lf[idx],
        "reverted": arm.s_rev[idx],
        "stalled": ~arm.s_conf[idx] & (unconf >= 2),
        "first_start": unconf >= 1,
        "confirmed": arm.s_conf[idx],
        # These devices report no backend, so none fell back (backend_fallback: 0 of all).
        "fell_back": np.zeros(len(idx), bool),
    }


def _tally(events: dict[str, np.ndarray], nets: np.ndarray) -> Tally:
    if not len(nets):
        return Tally()
    _, inverse = np.unique(nets, return_inverse=True)
    per_net = np.bincount(inverse)
    return Tally(
        len(nets),
        len(per_net),
        {k: int(v.sum()) for k, v in events.items()},
        {
            k: float((np.bincount(inverse, weights=v.astype(float)) / per_net).sum())
            for k, v in events.items()
        },
    )


def _histogram(buckets: np.ndarray, nets: np.ndarray) -> Histogram:
    keep = buckets >= 0
    buckets, nets = buckets[keep], nets[keep]
    if not len(buckets):
        return Histogram()
    uniq, inverse = np.unique(nets, return_inverse=True)
    low = np.full(len(uniq), np.iinfo(np.int32).max)
    high = np.full(len(uniq), -1)
    np.minimum.at(low, inverse, buckets)
    np.maximum.at(high, inverse, buckets)

    def counted(values: np.ndarray) -> dict[int, int]:
        b, c = np.unique(values, return_counts=True)
        return {int(x): int(y) for x, y in zip(b, c, strict=True)}

    return Histogram(counted(buckets), counted(low), counted(high))


def _metric_tally(arm: _Arm, idx: np.ndarray, nets: np.ndarray) -> MetricTally:
    """The ``accepted`` statistic (each device's share of kept events) as the store tallies it."""
    counted = arm.s_events[idx] > 0
    if not counted.any():
        return MetricTally()
    values = arm.s_kept[idx][counted] / arm.s_events[idx][counted]
    _, inverse = np.unique(nets[counted], return_inverse=True)
    means = np.bincount(inverse, weights=values) / np.bincount(inverse)
    return MetricTally(
        int(counted.sum()),
        len(means),
        float(values.sum()),
        float(means.sum()),
        float((means * means).sum()),
    )


def _summary(
    arm: _Arm,
    idx: np.ndarray,
    net: np.ndarray,
    cut: float,
    tier: str,
    name: str,
    version: str,
    *,
    metrics: bool = False,
) -> ArmSummary:
    events = _events(arm, idx)
    nets = net[idx]
    aged = arm.s_first[idx] <= cut
    return ArmSummary(
        UNIT,
        tier,
        name,  # type: ignore[arg-type]
        version,
        _tally(events, nets),
        _tally({k: v[aged] for k, v in events.items()}, nets[aged]),
        {
            "load_ms": _histogram(arm.s_load[idx], nets),
            "inference_ms": _histogram(arm.s_inf[idx], nets),
        },
        {"accepted": _metric_tally(arm, idx, nets)} if metrics else {},
    )


def _with_forged(real: list[ArmSummary], forged: Sequence[ArmSummary]) -> list[ArmSummary]:
    out = list(real)
    for fake in forged:
        for i, summary in enumerate(out):
            if (summary.tier, summary.arm) == (fake.tier, fake.arm):
                aged = (
                    None if summary.aged is None or fake.aged is None else summary.aged + fake.aged
                )
                kinds = set(summary.histograms) | set(fake.histograms)
                names = set(summary.metrics) | set(fake.metrics)
                out[i] = ArmSummary(
                    UNIT,
                    summary.tier,
                    summary.arm,
                    summary.version,
                    summary.all + fake.all,
                    aged,
                    {k: summary.histogram(k) + fake.histogram(k) for k in kinds},
                    {k: summary.metric(k) + fake.metric(k) for k in names},
                )
                break
        else:
            out.append(fake)
    return out


def forged_summaries(
    forger: Forger, state: RolloutState, *, metrics: bool = False
) -> list[ArmSummary]:
    """What the forger's reports of this period add: its networks, each wholly its own.

    It spends its reports on the tier where they weigh most (the tiny one) and on the
    arm its kind aims at, one network each where it has as many networks as reports.
    With ``metrics`` its reports say ``accepted`` too: none kept where it fails an
    arm, every one where it passes one.
    """
    tier = TIERS[-1][0]
    k, reports = forger.networks, forger.reports
    arm_name = "stable" if forger.kind == "stable-fail" else "candidate"
    version = STABLE if arm_name == "stable" else (state.candidate or CANDIDATE)
    failing = forger.kind in ("fail", "stable-fail")
    events = (
        {"reverted": reports, "probe_failed": reports, "stalled": reports, "first_start": reports}
        if failing
        else {"confirmed": reports}
    )
    shares = {name: float(k) for name in events}
    tally = Tally(reports, k, events, shares)
    slow = _bucket(np.array([400.0 if forger.kind == "slow" else 10.0]))[0]
    histograms = (
        {}
        if failing
        else {
            kind: Histogram({int(slow): reports}, {int(slow): k}, {int(slow): k})
            for kind in ("load_ms", "inference_ms")
        }
    )
    value = 0.0 if failing else 1.0
    said = (
        {"accepted": MetricTally(reports, k, reports * value, k * value, k * value * value)}
        if metrics
        else {}
    )
    return [ArmSummary(UNIT, tier, arm_name, version, tally, tally, histograms, said)]  # type: ignore[arg-type]


def rollout(world: World, seed: int) -> Outcome:
    """One whole rollout: the stable everywhere, the candidate at the first step, --auto
    every 30 minutes until it promotes, halts, or ``world.max_days`` pass."""
    fleet = Fleet(world, seed)
    policy = world.judged_by
    salt = "0123456789abcdef"
    state = publish(
        None,
        UNIT,
        STABLE,
        percent=None,
        full=True,
        salt=salt,
        now=START - timedelta(days=30),
        expires=EXPIRES,
        actor="t",
    )
    state = publish(
        state,
        UNIT,
        CANDIDATE,
        percent=policy.steps[0],
        full=False,
        salt=salt,
        now=START,
        expires=EXPIRES,
        actor="t",
    )
    rng = np.random.default_rng(seed + 1)
    moves: list[tuple[float, str, str]] = []
    reached: float | None = None
    forged_period: int | None = None
    forged: list[ArmSummary] = []
    looks = int(world.max_days * 24 / 0.5)
    day_starts: dict[int, np.ndarray] = {}
    for look in range(1, looks + 1):
        low, high = (look - 1) * 0.5, look * 0.5
        day = int(low // 24)
        if day not in day_starts:
            uses = rng.random(fleet.n) < world.daily_use
            joined = fleet.joined_day <= day
            times = day * 24 + (fleet.hour + rng.normal(0, 0.5, fleet.n)) % 24
            times = np.where(uses & joined, times, np.inf)
            day_starts = {day: times}
        times = day_starts[day]
        who = np.flatnonzero((times > low) & (times <= high))
        fleet.starts(who, high, state)
        now = START + timedelta(hours=high)
        since = analysis_sequences(state)
        if world.forger is not None and since[0] != forged_period:
            forged_period = since[0]
            forged = forged_summaries(world.forger, state, metrics=world.metrics)
        candidate_seq, stable_seq = since
        assert candidate_seq is not None
        periods = (candidate_seq, stable_seq if stable_seq is not None else candidate_seq)
        aged = policy.guardrails.revert_window_hours
        served = high - fleet.skew  # the report server's clock, marked every minute
        analysis: Analysis = analyze(
            fleet.summaries(periods, aged_hours=aged, forged=forged, server_now=served),
            unit=UNIT,
            candidate=state.candidate or CANDIDATE,
            stable=state.stable,
            since=now,
            guardrails=policy.guardrails,
            tiers=[t for t, _ in TIERS],
            intervals=False,
            pool=fleet.summaries(
                periods, aged_hours=aged, forged=forged, pooled=True, server_now=served
            ),
            metrics=world.declared,
        )
        decision = decide(state, UNIT, analysis, policy=policy, now=now)
        if decision.changes_state:
            state = apply(
                decision,
                state,
                UNIT,
                analysis=analysis,
                policy=policy,
                now=now,
                expires=EXPIRES,
                actor="cron",
                expected_sequence=state.sequence,
            )
            moves.append((high / 24, decision.action, decision.reason))
            if decision.action == "step" and decision.percent == 100:
                reached = high / 24
            if decision.action != "step":
                result = {"promote": "promoted", "rollback": "rolled back", "pause": "paused"}[
                    decision.action
                ]
                return Outcome(result, high / 24, reached, moves)
    return Outcome(f"stuck at {state.percent:g}%", world.max_days, reached, moves)
