"""The fast world of benchmarks/canary.py says what the real report store would say."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from worldsim import (
    CANDIDATE,
    GOOD,
    STABLE,
    START,
    TIERS,
    UNIT,
    Fleet,
    Release,
    World,
    rollout,
)

from edgereg.config import RolloutPolicy
from edgereg.protocol.reports import LatencySummary, RateCounts, Report
from edgereg.protocol.wire import RolloutState
from edgereg.registry._transitions import publish, set_percent
from edgereg.reports import open_store
from edgereg.reports.summary import ArmSummary, Statistic, bucket_value_ms

EXPIRES = START + timedelta(days=365)


def _state(percent: float) -> RolloutState:
    state = publish(
        None,
        UNIT,
        STABLE,
        percent=None,
        full=True,
        salt="0" * 16,
        now=START - timedelta(days=30),
        expires=EXPIRES,
        actor="t",
    )
    state = publish(
        state,
        UNIT,
        CANDIDATE,
        percent=5,
        full=False,
        salt="0" * 16,
        now=START,
        expires=EXPIRES,
        actor="t",
    )
    if percent != 5:
        state = set_percent(
            state,
            UNIT,
            percent,
            policy=RolloutPolicy(),
            now=START,
            expires=EXPIRES,
            actor="t",
            force=True,
        )
    return state


def _reports(fleet: Fleet) -> list[tuple[Report, object, str]]:
    """The rows the fleet's store mirror holds, as the reports that would have made them."""
    out = []
    for v, (arm_name, version) in enumerate((("stable", STABLE), ("candidate", CANDIDATE))):
        arm = fleet.arms[v]
        for i in np.flatnonzero(arm.row):
            unconf = int(arm.s_unconf[i])
            inference = None
            if arm.s_inf[i] >= 0:
                p50 = bucket_value_ms(int(arm.s_inf[i]))
                inference = LatencySummary(count=5, p50_ms=p50, p90_ms=p50, p99_ms=p50)
            report = Report.versioned(
                token=f"{v:x}{i:031x}",
                unit=UNIT,
                model=UNIT,
                version=version,
                unit_version=version,
                variant="int8",
                tier=TIERS[int(fleet.tier[i])][0],
                arm=arm_name,
                sequence=int(arm.s_seq[i]),
                probe="failed" if arm.s_pf[i] else "passed",
                load_failed=bool(arm.s_lf[i]),
                load_ms=bucket_value_ms(int(arm.s_load[i])) if arm.s_load[i] >= 0 else None,
                inference=inference,
                confirmed=bool(arm.s_conf[i]),
                reverted=bool(arm.s_rev[i]),
                unconfirmed_starts=unconf if unconf >= 0 else None,
                metrics=(
                    {
                        "accepted": RateCounts(
                            events=int(arm.s_events[i]), successes=int(arm.s_kept[i])
                        )
                    }
                    if fleet.world.metrics
                    else None
                ),
            )
            net = int(fleet.net[i])
            source = f"10.{net // 256 % 256}.{net % 256}.0/24"
            for hours in (arm.s_first[i], arm.s_recv[i]):
                out.append((report, START + timedelta(hours=float(hours)), source))
    return out


def _key(summary: ArmSummary) -> tuple[object, ...]:
    def tally(t: object) -> tuple[object, ...]:
        return (
            t.devices,  # type: ignore[attr-defined]
            t.networks,  # type: ignore[attr-defined]
            dict(sorted(t.events.items())),  # type: ignore[attr-defined]
            {k: round(v, 6) for k, v in sorted(t.network_events.items())},  # type: ignore[attr-defined]
        )

    return (
        summary.tier,
        summary.arm,
        {
            name: (
                m.devices,
                m.networks,
                round(m.total, 6),
                round(m.network_total, 6),
                round(m.network_squares, 6),
            )
            for name, m in sorted(summary.metrics.items())
        },
        tally(summary.all),
        tally(summary.aged) if summary.aged is not None else None,
        {
            kind: (dict(h.devices), dict(h.low), dict(h.high))
            for kind, h in sorted(summary.histograms.items())
            if h
        },
    )


@pytest.mark.parametrize("pooled", [False, True], ids=["per-tier", "pooled"])
def test_the_worlds_store_mirror_says_what_the_report_store_says(
    tmp_path: Path, pooled: bool
) -> None:
    world = World(Release(crash_loop=0.1, first_crash=0.2), devices=400, metrics=True)
    fleet = Fleet(world, seed=3)
    state = _state(25)
    rng = np.random.default_rng(0)
    for half_hour in range(1, 4 * 48):
        who = np.flatnonzero(rng.random(fleet.n) < 0.02)
        fleet.starts(who, half_hour * 0.5, state)
        if half_hour == 48:
            state = set_percent(
                state,
                UNIT,
                50,
                policy=RolloutPolicy(),
                now=START,
                expires=EXPIRES,
                actor="t",
                force=True,
            )
    period = state.sequence
    mirrored = fleet.summaries((period, period), aged_hours=48, pooled=pooled)
    with open_store(f"sqlite:///{tmp_path}/reports.sqlite") as store:
        store.ingest_many(_reports(fleet))  # type: ignore[arg-type]
        newest = store.clock(UNIT)
        assert newest is not None
        stored = store.summaries(
            UNIT,
            since_sequence=period,
            aged_before=newest - timedelta(hours=48),
            pooled=pooled,
            statistics={"accepted": Statistic("accepted", 2, (0.0, 1.0))},
        )
    assert any(s.metric("accepted").devices for s in mirrored), "no app metric was counted"
    assert mirrored, "the fleet reported nothing in the period"
    assert sorted(map(_key, mirrored), key=str) == sorted(map(_key, stored), key=str)


def test_a_good_candidate_steps_and_a_gross_crash_loop_is_rolled_back() -> None:
    good = rollout(World(GOOD, devices=1000, max_days=9), seed=1)
    assert good.result != "rolled back", good.moves
    assert [action for _, action, _ in good.moves][:2] == ["step", "step"], good.moves
    crashing = rollout(World(Release(crash_loop=0.6), devices=1000, max_days=4), seed=1)
    assert crashing.result == "rolled back", crashing.moves
    assert crashing.days < 3


def test_a_worse_app_metric_is_rolled_back_and_an_unchanged_one_steps() -> None:
    """Operationally perfect, 3 points fewer texts kept (92 % -> 89 %): never promoted."""
    # Seed 0 (rolled back on day 5.7): seed 2's, since crash loops revert at the start the
    # clients revert at, rolls it back only on day 10.6 (and another max_days, another fleet).
    worse = rollout(World(Release(accepted=0.89), devices=1000, metrics=True, max_days=10), seed=0)
    assert worse.result == "rolled back", worse.moves
    assert "accepted" in worse.moves[-1][2]
    same = rollout(World(GOOD, devices=1000, metrics=True, max_days=8), seed=0)
    assert same.result != "rolled back", same.moves
    assert [action for _, action, _ in same.moves][:2] == ["step", "step"], same.moves
