"""Canary analysis: statistics against scipy and brute force, and rules that always hold."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import scipy.stats
from armkit import arm
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import minimize_scalar
from scipy.special import xlogy

from edgereg.analysis import (
    Analysis,
    GuardrailResult,
    analysis_periods,
    analyze,
    combine,
    compare_latency,
    compare_rates,
    mann_whitney,
)
from edgereg.analysis._rates import restricted_rates
from edgereg.config import (
    AppMetric,
    Guardrails,
    LatencyGuardrail,
    RateGuardrail,
    UnconfirmedGuardrail,
)
from edgereg.reports.summary import (
    ArmSummary,
    Histogram,
    MetricTally,
    Tally,
    bucket_value_ms,
    latency_bucket,
)
from edgereg.wire import HistoryEvent, RolloutSnapshot, RolloutState

SINCE = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
GUARDRAILS = Guardrails()


def expand(histogram: dict[int, int]) -> np.ndarray:
    return np.repeat([bucket_value_ms(index) for index in histogram], list(histogram.values()))


def run(*summaries: ArmSummary, guardrails: Guardrails = GUARDRAILS, **kw: object) -> Analysis:
    return analyze(
        summaries,
        unit="vision",
        candidate="1.1.0",
        stable="1.0.0",
        since=SINCE,
        guardrails=guardrails,
        **kw,  # type: ignore[arg-type]
    )


def verdicts(analysis: Analysis, tier: str = "high") -> dict[str, str]:
    (found,) = (t for t in analysis.tiers if t.tier == tier)
    return {result.name: result.verdict for result in found.guardrails}


# --- the statistics, checked against independent computations ----------------------

histograms = st.dictionaries(
    st.integers(min_value=200, max_value=240), st.integers(min_value=1, max_value=30), min_size=1
)


@settings(max_examples=150, deadline=None)
@given(histograms, histograms)
def test_mann_whitney_from_counts_matches_scipy_on_the_expanded_values(
    candidate: dict[int, int], stable: dict[int, int]
) -> None:
    expected = scipy.stats.mannwhitneyu(
        expand(candidate), expand(stable), alternative="greater", method="asymptotic"
    )
    u, _, p = mann_whitney(candidate, stable)
    assert u == pytest.approx(expected.statistic)
    if not np.isnan(expected.pvalue):
        assert p == pytest.approx(expected.pvalue, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(histograms, histograms)
def test_hodges_lehmann_is_the_median_of_all_pairwise_differences(
    candidate: dict[int, int], stable: dict[int, int]
) -> None:
    result = compare_latency(candidate, stable, alpha=0.05)
    differences = np.subtract.outer(expand(candidate), expand(stable)).ravel()
    assert result.shift_ms == pytest.approx(float(np.median(differences)))
    assert result.stable_median_ms == pytest.approx(float(np.median(expand(stable))))
    assert result.ci_low_ms <= result.shift_ms <= result.ci_high_ms


@settings(max_examples=300, deadline=None)
@given(
    st.integers(1, 400),
    st.integers(1, 400),
    st.floats(0, 1),
    st.floats(0, 1),
    st.floats(-0.95, 0.95),
)
def test_restricted_rates_maximise_the_likelihood(
    n1: int, n0: int, f1: float, f0: float, delta: float
) -> None:
    x1, x0 = round(f1 * n1), round(f0 * n0)

    def minus_log_likelihood(p0: float) -> float:
        p1 = p0 + delta
        return -float(
            xlogy(x1, p1) + xlogy(n1 - x1, 1 - p1) + xlogy(x0, p0) + xlogy(n0 - x0, 1 - p0)
        )

    rate1, rate0 = restricted_rates(x1, n1, x0, n0, delta)
    assert rate1 - rate0 == pytest.approx(delta)
    best = minimize_scalar(
        minus_log_likelihood,
        bounds=(max(0.0, -delta), min(1.0, 1 - delta)),
        method="bounded",
        options={"xatol": 1e-12},
    )
    assert minus_log_likelihood(rate0) <= best.fun + 1e-5


@pytest.mark.parametrize(
    ("counts", "margin", "fails", "passes"),
    [
        pytest.param((0, 50, 0, 50), 0.01, False, False, id="zero-of-50-proves-nothing"),
        pytest.param((0, 300, 0, 300), 0.01, False, False, id="zero-of-300-not-yet"),
        pytest.param((0, 1000, 0, 1000), 0.01, False, True, id="zero-of-1000-is-within-1pt"),
        pytest.param((1, 1, 0, 50), 0.01, False, False, id="one-revert-on-one-device"),
        pytest.param((62, 62, 62, 62), 0.01, False, False, id="alike-is-not-worse"),
        pytest.param((50, 1000, 0, 1000), 0.01, True, False, id="5pt-more-fails"),
        pytest.param((15, 1000, 10, 1000), 0.01, False, False, id="half-point-more-unclear"),
        pytest.param((5, 100, 5, 100), 0.0, False, False, id="no-margin-never-passes"),
    ],
)
def test_rate_comparison_table(
    counts: tuple[int, int, int, int], margin: float, fails: bool, passes: bool
) -> None:
    result = compare_rates(*counts, margin=margin, alpha=0.05)
    assert (result.p_worse < 0.05) is fails
    assert (result.p_within < 0.05) is passes
    # The interval is the inverted test: it lies above the margin exactly when the test fails.
    assert (result.ci_low > margin) is fails
    assert (result.ci_high < margin) is passes


def test_rate_comparison_refuses_impossible_counts() -> None:
    with pytest.raises(ValueError, match="candidate arm: 3 events of 2 devices"):
        compare_rates(3, 2, 0, 10, margin=0.01, alpha=0.05)


# --- rules that hold for every input -------------------------------------------------

arm_counts = st.tuples(
    st.integers(1, 5000), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), histograms, histograms
)


def summary_of(
    name: str, counts: tuple[int, float, float, float, dict[int, int], dict[int, int]]
) -> ArmSummary:
    devices, probe, load, revert, load_ms, inference = counts
    return arm(
        name,
        devices,
        probe_failed=round(probe * devices),
        load_failed=round(load * devices),
        reverted=round(revert * devices),
        # A crash loop stalls before it reverts: as many stalled installs as reverts.
        stalled=round(revert * devices),
        load_ms=load_ms,
        inference_p50_ms=inference,
    )


@settings(max_examples=200, deadline=None)
@given(
    arm_counts,
    st.floats(0.001, 0.5),
    st.floats(0, 0.2),
    st.floats(0, 50),
    st.booleans(),
)
def test_identical_arms_never_fail(
    counts: tuple[int, float, float, float, dict[int, int], dict[int, int]],
    alpha: float,
    max_increase: float,
    max_increase_pct: float,
    critical: bool,
) -> None:
    rate = RateGuardrail(max_increase=max_increase, critical=critical)
    latency = LatencyGuardrail(max_increase_pct=max_increase_pct, critical=critical)
    guardrails = Guardrails(
        alpha=alpha,
        probe_failure=rate,
        load_failure=rate,
        revert=rate,
        unconfirmed=UnconfirmedGuardrail(max_increase=max_increase, critical=critical),
        load_ms=latency,
        inference_ms=latency,
    )
    analysis = run(
        summary_of("candidate", counts), summary_of("stable", counts), guardrails=guardrails
    )
    # Alike is never worse; only an absolute limit can fail both, and then the
    # stable arm raises its own alarm for the same guardrail.
    (tier,) = analysis.tiers
    for result in tier.guardrails:
        if result.verdict == "fail":
            assert "above the absolute limit" in result.reason
            assert any(f"stable arm's {result.name} rate" in alarm for alarm in tier.alarms)


@settings(max_examples=100, deadline=None)
@given(
    st.integers(GUARDRAILS.min_devices, 100_000),
    st.integers(GUARDRAILS.min_devices, 100_000),
    st.floats(0, 0.02),
    st.integers(200, 300),
)
def test_a_huge_regression_with_enough_devices_always_fails(
    candidate_devices: int, stable_devices: int, stable_rate: float, bucket: int
) -> None:
    slower = bucket + 40  # 2.7 times slower
    candidate = arm(
        "candidate",
        candidate_devices,
        probe_failed=candidate_devices // 2,
        load_ms={slower: candidate_devices},
        inference_p50_ms={slower: candidate_devices // 2, slower + 1: candidate_devices // 2},
    )
    stable = arm(
        "stable",
        stable_devices,
        probe_failed=round(stable_rate * stable_devices),
        load_ms={bucket: stable_devices},
        inference_p50_ms={bucket: stable_devices},
    )
    analysis = run(candidate, stable)
    found = verdicts(analysis)
    assert found["probe_failure"] == "fail"
    assert found["load_ms"] == "fail"
    assert found["inference_ms"] == "fail"
    assert analysis.verdict == "fail"


# --- verdicts ----------------------------------------------------------------------


def healthy(name: str, devices: int = 2000, **fields: object) -> ArmSummary:
    latencies = {latency_bucket(40.0) + offset: devices // 5 for offset in range(5)}
    values: dict[str, object] = {"load_ms": latencies, "inference_p50_ms": latencies, **fields}
    return arm(name, devices, **values)


def test_two_healthy_arms_pass_every_guardrail() -> None:
    analysis = run(healthy("candidate"), healthy("stable"), tiers=["high"])
    assert set(verdicts(analysis).values()) == {"pass"}
    assert analysis.verdict == "pass"


def test_below_min_devices_a_guardrail_cannot_pass_but_can_fail() -> None:
    few = GUARDRAILS.min_devices - 1
    analysis = run(healthy("candidate", few), healthy("stable", 100_000))
    assert set(verdicts(analysis).values()) == {"inconclusive"}
    (tier,) = analysis.tiers
    assert (
        f"candidate {few} of {GUARDRAILS.min_devices} needed per arm beyond the "
        f"{GUARDRAILS.tolerated_networks} tolerated"
    ) in tier.guardrails[0].reason
    broken = run(healthy("candidate", 40, probe_failed=40), healthy("stable", 100_000))
    assert verdicts(broken)["probe_failure"] == "fail"


def test_a_tier_without_reports_is_named_and_judged_within_the_pool() -> None:
    analysis = run(healthy("candidate"), healthy("stable"), tiers=["high", "low"])
    assert [tier.tier for tier in analysis.tiers] == ["high", "low"]
    assert set(verdicts(analysis, "low").values()) == {"inconclusive"}
    assert analysis.tiers[1].guardrails[0].reason == "no candidate and stable reports in the period"
    # It cannot hold the rollout forever: its passes are the pool's.
    assert [tier.pooled for tier in analysis.tiers] == [False, True]
    assert analysis.pool is not None
    assert analysis.pool.candidate_devices == 2000
    assert analysis.verdict == "pass"
    # A tier too small to pass alone (fewer than min_devices networks beyond the tolerated
    # ones) is judged within the pool, but its own fail counts once it has the failing
    # networks to fail on (min_failing_devices beyond the tolerated ones): 6 of 6 rejecting
    # the model fail, 5 of 5 do not.
    for devices, verdict in ((6, "fail"), (5, "inconclusive")):
        found = run(
            healthy("candidate"),
            healthy("stable"),
            healthy("candidate", devices, tier="low", probe_failed=devices),
            healthy("stable", 30, tier="low"),
            tiers=["high", "low"],
        )
        assert found.tiers[1].pooled
        probe = found.tiers[1].guardrails[0]
        assert probe.verdict == verdict, probe.reason
        assert (found.verdict == "fail") == (verdict == "fail")


def test_reports_of_other_versions_units_and_arms_are_ignored() -> None:
    analysis = run(
        healthy("candidate"),
        healthy("stable"),
        healthy("candidate", version="1.0.5", probe_failed=2000),
        healthy("stable", version="0.9.0", probe_failed=2000),
        healthy("candidate", unit="sensor", probe_failed=2000),
    )
    assert analysis.verdict == "pass"


def test_summaries_of_one_arm_are_added_up() -> None:
    analysis = run(healthy("candidate", 30), healthy("candidate", 30), healthy("stable"))
    (tier,) = analysis.tiers
    assert tier.candidate_devices == 60


def test_a_latency_regression_names_its_numbers() -> None:
    bucket = latency_bucket(40.0)
    slow = healthy("candidate", load_ms={bucket + 8: 2000})  # about 22% slower
    analysis = run(slow, healthy("stable"))
    (tier,) = analysis.tiers
    (load,) = (result for result in tier.guardrails if result.name == "load_ms")
    assert load.verdict == "fail"
    assert not load.critical
    assert load.numbers["shift_pct"] == pytest.approx(17.5, abs=3)
    assert "limit +10%" in load.reason
    # A non-critical failure holds the rollout but does not halt it.
    assert analysis.verdict == "inconclusive"


@pytest.mark.parametrize(
    ("results", "expected"),
    [
        pytest.param([], "inconclusive", id="nothing-to-judge"),
        pytest.param([("pass", True), ("pass", False)], "pass", id="all-pass"),
        pytest.param([("fail", True), ("pass", False)], "fail", id="critical-fails"),
        pytest.param([("fail", False), ("pass", True)], "inconclusive", id="non-critical-fails"),
        pytest.param([("inconclusive", True), ("pass", True)], "inconclusive", id="one-unclear"),
        pytest.param([("inconclusive", True), ("fail", True)], "fail", id="fail-beats-unclear"),
    ],
)
def test_combine(results: list[tuple[str, bool]], expected: str) -> None:
    rows = [GuardrailResult("x", critical, verdict, "") for verdict, critical in results]  # type: ignore[arg-type]
    assert combine(rows) == expected


def test_evidence_is_compact_json() -> None:
    analysis = run(healthy("candidate"), healthy("stable"))
    evidence = analysis.evidence()
    assert evidence["verdict"] == "pass"
    assert evidence["since"] == "2026-12-01T08:00:00Z"
    guardrail = evidence["tiers"]["high"]["guardrails"]["probe_failure"]  # type: ignore[index]
    assert set(guardrail) <= {
        "verdict",
        "candidate_rate",
        "stable_rate",
        "difference",
        "estimate",
        "ci_low",
        "ci_high",
        "p_worse",
        "p_above_max_rate",
        "limit",
    }
    assert len(str(evidence)) < 2000


# --- the period --------------------------------------------------------------------


def state_with(*moves: tuple[str, float]) -> RolloutState:
    history = []
    snapshot = RolloutSnapshot(stable="1.0.0")
    for sequence, (action, percent) in enumerate(moves, start=2):
        after = RolloutSnapshot(stable="1.0.0", candidate="1.1.0", percent=percent)
        history.append(
            HistoryEvent(
                sequence=sequence,
                at=SINCE + timedelta(hours=sequence),
                actor="test",
                action=action,  # type: ignore[arg-type]
                before=snapshot,
                after=after,
            )
        )
        snapshot = after
    return RolloutState(
        model="vision",
        sequence=len(moves) + 1,
        expires=SINCE + timedelta(days=30),
        stable="1.0.0",
        candidate="1.1.0",
        percent=moves[-1][1],
        salt="0" * 16,
        history=history,
    )


@pytest.mark.parametrize(
    ("moves", "candidate_hours", "stable_hours"),
    [
        pytest.param([("publish", 5)], 2, 2, id="canary"),
        pytest.param([("publish", 5), ("rollout", 25)], 3, 3, id="after-a-step"),
        pytest.param(
            [("publish", 5), ("rollout", 50), ("rollout", 100)], 4, 3, id="at-100-last-step"
        ),
        pytest.param([("publish", 100)], 2, None, id="published-at-100"),
    ],
)
def test_analysis_periods(
    moves: list[tuple[str, float]], candidate_hours: int, stable_hours: int | None
) -> None:
    # The history keeps whole seconds: a period starts at the second after its change.
    second = timedelta(seconds=1)
    candidate, stable = analysis_periods(state_with(*moves))
    assert candidate == SINCE + timedelta(hours=candidate_hours) + second
    assert stable == (
        None if stable_hours is None else SINCE + timedelta(hours=stable_hours) + second
    )


def test_at_100_percent_the_stable_period_is_recorded() -> None:
    later = SINCE + timedelta(hours=5)
    analysis = run(healthy("candidate"), healthy("stable"), stable_since=later)
    assert analysis.stable_since == later
    assert analysis.to_json()["stable_since"] == "2026-12-01T13:00:00Z"
    assert analysis.evidence()["stable_since"] == "2026-12-01T13:00:00Z"
    assert "stable_since" not in run(healthy("candidate"), healthy("stable")).evidence()


@pytest.mark.parametrize(
    ("stable_rate", "increase", "devices"),
    [
        pytest.param(0.02, 0.01, 800, id="at-the-limit"),
        pytest.param(0.005, 0.01, 3000, id="at-the-limit-rare-events"),
        pytest.param(0.02, 0.0, 800, id="no-increase"),
    ],
)
def test_rate_guardrail_fails_good_candidates_at_most_alpha_of_the_time(
    stable_rate: float, increase: float, devices: int
) -> None:
    # Simulated canaries whose true increase is at (or below) the one-point limit:
    # a calibrated one-sided test fails about alpha of them, never much more.
    rng = np.random.default_rng(11)
    trials = 1000
    failed = sum(
        compare_rates(
            int(rng.binomial(devices, stable_rate + increase)),
            devices,
            int(rng.binomial(devices, stable_rate)),
            devices,
            margin=0.01,
            alpha=0.05,
        ).p_worse
        < 0.05
        for _ in range(trials)
    )
    assert failed / trials <= 0.05 + 0.02, failed
    if increase == 0:
        assert failed / trials < 0.01


def test_rate_guardrail_catches_a_two_point_regression_with_enough_devices() -> None:
    rng = np.random.default_rng(12)
    failed = sum(
        compare_rates(
            int(rng.binomial(5000, 0.04)),
            5000,
            int(rng.binomial(5000, 0.01)),
            5000,
            margin=0.01,
            alpha=0.05,
        ).p_worse
        < 0.05
        for _ in range(200)
    )
    assert failed >= 195


# --- small arms, repeated looks and absolute limits ---------------------------------


def test_one_event_on_one_device_is_never_a_verdict() -> None:
    # The normal-approximation score test called this p = 7.7e-13: an instant rollback.
    analysis = run(healthy("candidate", 1, reverted=1), healthy("stable", 50))
    assert verdicts(analysis)["revert"] == "inconclusive"
    result = compare_rates(1, 1, 0, 50, margin=0.01, alpha=0.05)
    assert result.p_worse > 0.1


def test_a_fail_needs_failing_networks_beyond_the_tolerated_ones() -> None:
    # Five of fifteen reverting against 0 of 1000 is strong evidence even with three of
    # them set aside (p about 0.03), but two failing networks remain: min_failing_devices
    # (3) is the floor beyond the tolerated ones.
    assert compare_rates(5 - 3, 15 - 3, 0, 997, margin=0.01, alpha=0.05).p_worse > 0.05
    assert compare_rates(6 - 3, 15 - 3, 0, 997, margin=0.01, alpha=0.05).p_worse < 0.05
    analysis = run(healthy("candidate", 15, reverted=5), healthy("stable", 1000))
    (tier,) = analysis.tiers
    (revert,) = (r for r in tier.guardrails if r.name == "revert")
    assert revert.verdict == "inconclusive"
    worse = run(healthy("candidate", 15, reverted=6), healthy("stable", 1000))
    assert verdicts(worse)["revert"] == "fail"
    low = Guardrails(min_failing_devices=4)
    (revert,) = (
        r
        for r in run(healthy("candidate", 15, reverted=6), healthy("stable", 1000), guardrails=low)
        .tiers[0]
        .guardrails
        if r.name == "revert"
    )
    assert "only 3 failing candidate network(s) beyond the 3 tolerated, 4 needed" in revert.reason
    # A rate's fail needs no min_networks besides: ten of ten failing is one.
    tiny = run(healthy("candidate", 10, reverted=10), healthy("stable", 1000))
    assert verdicts(tiny)["revert"] == "fail"


@dataclass(frozen=True)
class SmallArm:
    """A canary arm smaller than min_networks + tolerated_networks, and what it must get."""

    name: str
    candidate: int  # devices, each its own network
    failing: int  # of them failing their probe
    stable: int
    stable_failing: int
    forged: int  # forged failing candidate networks (one report each) on top
    verdict: str


SMALL_ARMS = [
    # The lead's case: a bad candidate whose arm is smaller than min_networks + tolerated.
    SmallArm("10-of-12-fail", 12, 10, 180, 0, 0, "fail"),
    SmallArm("6-of-6-fail", 6, 6, 180, 0, 0, "fail"),
    SmallArm("4-of-12-fail-beyond-3-and-the-floor", 12, 6, 180, 0, 0, "fail"),
    # Beyond the tolerated ones, fewer than min_failing_devices: no fail, however small.
    SmallArm("5-of-12-is-two-beyond", 12, 5, 180, 0, 0, "inconclusive"),
    # A forger's three networks stop no canary at its start: alone, or with two genuine
    # failures (five failing networks, two beyond the tolerated ones).
    SmallArm("three-forged-on-a-healthy-canary", 10, 0, 180, 0, 3, "inconclusive"),
    SmallArm("three-forged-and-two-genuine", 10, 2, 180, 0, 3, "inconclusive"),
    # A stable arm that fails alike: no comparison fail, but the absolute limit's.
    SmallArm("failing-alike-above-the-absolute-limit", 12, 10, 180, 150, 0, "fail"),
]


@pytest.mark.parametrize("row", SMALL_ARMS, ids=lambda row: row.name)
def test_a_small_arm_fails_on_failing_networks_beyond_the_tolerated_not_on_min_networks(
    row: SmallArm,
) -> None:
    # min_networks guards the observations a step without proof rests on; a rate's fail
    # already needs min_failing_devices failing networks beyond the tolerated ones with
    # them set aside, which no forger of tolerated_networks can supply. Before, the arm
    # also needed min_networks (10) beyond the tolerated: a bad candidate whose canary
    # arm had 12 devices was never rolled back.
    candidate = healthy("candidate", row.candidate, probe_failed=row.failing)
    if row.forged:
        candidate = _forged(candidate, row.forged, row.forged, probe_failed=row.forged)
    found = run(candidate, healthy("stable", row.stable, probe_failed=row.stable_failing))
    (probe,) = (r for r in found.tiers[0].guardrails if r.name == "probe_failure")
    assert probe.verdict == row.verdict, probe.reason


def test_the_single_arm_evidence_is_exact_under_every_look() -> None:
    # Exact: the chance that p_above ever falls below alpha, looking after every one of
    # the first 150 devices, when the true rate is the limit itself (dynamic programming
    # over the event counts not yet stopped).
    from edgereg.analysis._rates import check_rate_limit

    limit, alpha = 0.2, 0.05
    alive = {0: 1.0}
    stopped = 0.0
    for devices in range(1, 151):
        step: dict[int, float] = {}
        for events, chance in alive.items():
            step[events + 1] = step.get(events + 1, 0.0) + chance * limit
            step[events] = step.get(events, 0.0) + chance * (1 - limit)
        alive = {}
        for events, chance in step.items():
            if check_rate_limit(events, devices, limit=limit, alpha=alpha).p_above < alpha:
                stopped += chance
            else:
                alive[events] = chance
    assert 0 < stopped <= alpha


def test_looking_after_every_few_devices_fails_a_good_candidate_at_most_alpha() -> None:
    # A candidate exactly at the limit (+1 point), looked at after every 20 devices per
    # arm up to 600: always-valid evidence keeps the chance of ever failing under alpha.
    # A per-look test (the score test) crosses alpha at some look far more often.
    rng = np.random.default_rng(21)
    trials, looks, every = 200, 30, 20
    ever = 0
    for _ in range(trials):
        candidate = np.cumsum(rng.random(looks * every) < 0.03)
        stable = np.cumsum(rng.random(looks * every) < 0.02)
        for look in range(1, looks + 1):
            n = look * every
            result = compare_rates(
                int(candidate[n - 1]), n, int(stable[n - 1]), n, margin=0.01, alpha=0.05
            )
            if result.p_worse < 0.05:
                ever += 1
                break
    assert ever / trials <= 0.06, ever


def test_an_absolute_limit_fails_a_candidate_that_fails_alike_with_the_stable() -> None:
    # 62 of 62 failing in each arm was "inconclusive": alike is not worse.
    analysis = run(
        healthy("candidate", 62, probe_failed=62), healthy("stable", 62, probe_failed=62)
    )
    found = verdicts(analysis)
    assert found["probe_failure"] == "fail"
    assert analysis.verdict == "fail"
    (tier,) = analysis.tiers
    assert tier.alarms
    assert "stable arm's probe_failure rate is 100.0% (62/62)" in tier.alarms[0]
    assert analysis.to_json()["alarms"] == list(tier.alarms)


def test_a_failing_stable_arm_raises_an_alarm_without_failing_a_good_candidate() -> None:
    analysis = run(healthy("candidate", 2000), healthy("stable", 2000, reverted=1500))
    assert verdicts(analysis)["revert"] != "fail"
    assert any("stable arm's revert rate" in alarm for alarm in analysis.alarms)


def test_a_first_release_is_judged_by_the_absolute_limits() -> None:
    def first(candidate: ArmSummary) -> Analysis:
        return analyze(
            [candidate],
            unit="vision",
            candidate="1.1.0",
            stable=None,
            since=SINCE,
            guardrails=GUARDRAILS,
            tiers=["high"],
        )

    broken = first(healthy("candidate", 62, reverted=62))
    assert verdicts(broken)["revert"] == "fail"
    assert broken.verdict == "fail"
    fine = first(healthy("candidate", 2000))
    found = verdicts(fine)
    assert {found[name] for name in ("probe_failure", "load_failure", "revert")} == {"pass"}
    # Latency has no absolute limit: without a stable arm a person promotes.
    assert found["load_ms"] == "inconclusive"
    assert fine.verdict == "inconclusive"


def test_a_bundle_is_judged_per_member_latency_counted_in_devices() -> None:
    # The bundle's own histograms hold one row per member per install: 3 members would
    # triple the device count and blend a slow member into fast ones. Per member, each
    # install is one value, and a slow recogniser is named.
    fast = {latency_bucket(40.0) + offset: 400 for offset in range(5)}
    slow = {latency_bucket(60.0) + offset: 400 for offset in range(5)}
    members = {
        "det": [healthy("candidate", load_ms=fast), healthy("stable", load_ms=fast)],
        "rec": [healthy("candidate", load_ms=slow), healthy("stable", load_ms=fast)],
    }
    analysis = run(healthy("candidate"), healthy("stable"), members=members)
    found = verdicts(analysis)
    assert "load_ms" not in found
    assert found["load_ms/det"] == "pass"
    assert found["load_ms/rec"] == "fail"
    (tier,) = analysis.tiers
    (rec,) = (r for r in tier.guardrails if r.name == "load_ms/rec")
    assert rec.numbers["candidate_devices"] == 2000
    assert found["revert"] == "pass"  # rates stay per install


def test_the_revert_guardrail_counts_only_installs_old_enough_to_have_reverted() -> None:
    # A crash loop reverts after the app's unconfirmed starts (days for a daily app): a
    # young cohort with no revert yet is no evidence, and must not pass.
    young = run(healthy("candidate", aged_devices=0), healthy("stable", aged_devices=2000))
    (tier,) = young.tiers
    (revert,) = (r for r in tier.guardrails if r.name == "revert")
    assert revert.verdict == "inconclusive"
    assert "no candidate device installed 72 h ago yet" in revert.reason
    # Old enough: the aged installs and their reverts are what is compared.
    aged = run(
        healthy("candidate", aged_devices=1000, aged_reverted=100, reverted=100),
        healthy("stable", aged_devices=2000),
    )
    found = verdicts(aged)
    assert found["revert"] == "fail"
    (tier,) = aged.tiers
    (revert,) = (r for r in tier.guardrails if r.name == "revert")
    assert revert.numbers["candidate_devices"] == 1000


# --- latency evidence under repeated looks --------------------------------------------


def _latency_histogram(values: np.ndarray) -> dict[int, int]:
    buckets, counts = np.unique([latency_bucket(float(v)) for v in values], return_counts=True)
    return {int(b): int(c) for b, c in zip(buckets, counts, strict=True)}


def test_latency_evidence_holds_alpha_over_every_look_at_the_limit() -> None:
    from edgereg.analysis._bands import shift_evidence

    # Exactly +10 % slower with a +10 % limit, looked at 24 times as 2,000 devices per arm
    # arrive: a fixed-sample test at every look fails far more often than alpha.
    rng = np.random.default_rng(3)
    failed = 0
    for _ in range(30):
        candidate = np.exp(rng.normal(np.log(44.0), 0.35, 2000))
        stable = np.exp(rng.normal(np.log(40.0), 0.35, 2000))
        for look in range(1, 25):
            n = 2000 * look // 24
            evidence = shift_evidence(
                _latency_histogram(candidate[:n]),
                _latency_histogram(stable[:n]),
                limit_pct=10,
                alpha=0.05,
            )
            if evidence.slower:
                failed += 1
                break
    assert failed <= 3  # alpha = 5 % of 30, with room for chance


def test_latency_evidence_fails_a_clear_slowdown_and_passes_no_change() -> None:
    from edgereg.analysis._bands import band, shift_evidence

    rng = np.random.default_rng(4)
    stable = _latency_histogram(np.exp(rng.normal(np.log(40.0), 0.35, 5000)))
    slow = _latency_histogram(np.exp(rng.normal(np.log(60.0), 0.35, 5000)))
    same = _latency_histogram(np.exp(rng.normal(np.log(40.0), 0.35, 5000)))
    slower = shift_evidence(slow, stable, limit_pct=10, alpha=0.05)
    assert slower.slower
    assert not slower.within
    assert 10 < slower.ci_low_pct < 50 < slower.ci_high_pct < 70
    alike = shift_evidence(same, stable, limit_pct=10, alpha=0.05)
    assert alike.within
    assert not alike.slower
    assert alike.ci_low_pct < 0 < alike.ci_high_pct < 10
    # The band narrows with the devices and widens with certainty.
    assert band(100, 0.025) > band(1000, 0.025) > band(10_000, 0.025)
    assert band(1000, 0.001) > band(1000, 0.025)
    assert band(0, 0.025) == 1.0


def test_peak_memory_is_a_guardrail_where_devices_report_it() -> None:
    # Report schema 2's memory_peak_mb, judged like a latency: +50 % fails (not critical),
    # and a tier where no device reports memory leaves the guardrail out, not waiting.
    bucket = latency_bucket(120.0)
    lean = {bucket + offset: 400 for offset in range(5)}
    heavy = {latency_bucket(180.0) + offset: 400 for offset in range(5)}
    analysis = run(
        healthy("candidate", memory_peak_mb=heavy), healthy("stable", memory_peak_mb=lean)
    )
    found = verdicts(analysis)
    assert found["memory_peak_mb"] == "fail"
    (memory,) = (r for r in analysis.tiers[0].guardrails if r.name == "memory_peak_mb")
    assert "MB vs" in memory.reason
    assert not memory.critical
    same = run(healthy("candidate", memory_peak_mb=lean), healthy("stable", memory_peak_mb=lean))
    assert verdicts(same)["memory_peak_mb"] == "pass"
    unreported = run(healthy("candidate"), healthy("stable"))
    assert "memory_peak_mb" not in verdicts(unreported)
    assert unreported.verdict == "pass"
    # One arm reporting it and the other not: nothing to compare with yet.
    half = run(healthy("candidate", memory_peak_mb=lean), healthy("stable"))
    assert verdicts(half)["memory_peak_mb"] == "inconclusive"


# --- the unconfirmed guardrail: installs stalled before the app confirms them -----------

KNOWN = {"sources": 2000, "sourced_devices": 2000}


@dataclass(frozen=True)
class Stall:
    candidate: ArmSummary
    stable: ArmSummary
    verdict: str
    reason: str = ""
    revert: str | None = None  # the revert guardrail's verdict, when the row is about it
    guardrails: Guardrails = GUARDRAILS


STALLS = {
    # A crash loop on a daily app: stalled at the second start, days before any revert,
    # in a cohort too young for the revert guardrail to say anything.
    "stalls-fail-before-any-revert": Stall(
        healthy("candidate", aged_devices=0, stalled=200, stalled_sources=200, **KNOWN),
        healthy("stable", aged_devices=2000, stalled=40, stalled_sources=40, **KNOWN),
        "fail",
        "above the limit",
        revert="inconclusive",
    ),
    "young-cohort-cannot-pass": Stall(
        healthy("candidate", aged_devices=0, **KNOWN),
        healthy("stable", aged_devices=2000, **KNOWN),
        "inconclusive",
        "a pass counts only the 0 candidate network(s) installed 72 h ago or more",
    ),
    "aged-cohort-passes-on-its-aged-installs": Stall(
        healthy("candidate", aged_devices=1500, aged_sources=1500, **KNOWN),
        healthy("stable", aged_devices=2000, aged_sources=2000, **KNOWN),
        "pass",
        "a pass counts only the 1500 candidate network(s) installed 72 h ago",
    ),
    "too-few-aged-to-pass": Stall(
        healthy("candidate", aged_devices=30, aged_sources=30, **KNOWN),
        healthy("stable", aged_devices=2000, aged_sources=2000, **KNOWN),
        "inconclusive",
        "too few networks to pass (candidate 30 of 50",
    ),
    # The aged installs' own stalls decide a pass: 15 of 500 aged (3 %) is no pass, though
    # over the whole arm, 19,500 young clean installs would dilute it to 0.08 %.
    "young-installs-cannot-dilute-aged-stalls": Stall(
        healthy(
            "candidate",
            20_000,
            aged_devices=500,
            aged_sources=500,
            stalled=15,
            stalled_sources=15,
            aged_stalled=15,
            aged_stalled_sources=15,
            sources=20_000,
            sourced_devices=20_000,
        ),
        healthy("stable", 20_000, sources=20_000, sourced_devices=20_000),
        "inconclusive",
        "a pass counts only the 500 candidate network(s)",
    ),
    # Forty stalls in one network (a forger's /24, or one carrier NAT): one network,
    # its devices all stalled, among 2,000: its weight is one network's.
    "stalls-from-one-network-weigh-one-network": Stall(
        healthy("candidate", stalled=40, stalled_sources=1, **KNOWN),
        healthy("stable", **KNOWN),
        "pass",
        "1/2000 networks; 40/2000 devices",
    ),
    "stalling-alike-with-the-stable-is-not-worse": Stall(
        healthy("candidate", stalled=40, stalled_sources=40, **KNOWN),
        healthy("stable", stalled=40, stalled_sources=40, **KNOWN),
        "inconclusive",
        "not enough evidence either way",
    ),
    # A revert without a stall count (schema 1) is the revert guardrail's, not this one's.
    "a-revert-is-not-a-stall": Stall(
        healthy("candidate", reverted=100, reverted_sources=100, **KNOWN),
        healthy("stable", **KNOWN),
        "pass",
        revert="fail",
    ),
    "not-critical-when-declared": Stall(
        healthy("candidate", stalled=100, stalled_sources=100, **KNOWN),
        healthy("stable", **KNOWN),
        "fail",
        guardrails=Guardrails(unconfirmed={"critical": False}),  # type: ignore[arg-type]
    ),
    "a-wider-margin-tolerates-more": Stall(
        healthy("candidate", stalled=60, stalled_sources=60, **KNOWN),
        healthy("stable", stalled=40, stalled_sources=40, **KNOWN),
        "pass",
        guardrails=Guardrails(unconfirmed={"max_increase": 0.05}),  # type: ignore[arg-type]
    ),
}


@pytest.mark.parametrize("row", STALLS.values(), ids=STALLS.keys())
def test_unconfirmed_guardrail(row: Stall) -> None:
    analysis = run(row.candidate, row.stable, guardrails=row.guardrails)
    (tier,) = analysis.tiers
    found = {result.name: result for result in tier.guardrails}
    unconfirmed = found["unconfirmed"]
    assert unconfirmed.verdict == row.verdict, unconfirmed.reason
    assert row.reason in unconfirmed.reason
    assert unconfirmed.critical == row.guardrails.unconfirmed.critical
    assert unconfirmed.numbers["stalled_starts"] == row.guardrails.unconfirmed.stalled_starts
    if row.revert is not None:
        assert found["revert"].verdict == row.revert, found["revert"].reason
    # Critical by default: its fail alone fails the analysis.
    if row.verdict == "fail":
        assert (analysis.verdict == "fail") == row.guardrails.unconfirmed.critical


def test_unconfirmed_is_listed_everywhere_the_analysis_goes() -> None:
    stalled = healthy("candidate", stalled=100, stalled_sources=100, **KNOWN)
    analysis = run(stalled, healthy("stable", **KNOWN))
    assert analysis.verdict == "fail"
    tier = analysis.to_json()["tiers"][0]  # type: ignore[index]
    (listed,) = (g for g in tier["guardrails"] if g["name"] == "unconfirmed")
    assert (listed["verdict"], listed["candidate_events"], listed["stalled_starts"]) == (
        "fail",
        100,
        2,
    )
    evidence = analysis.evidence()["tiers"]["high"]["guardrails"]  # type: ignore[index]
    assert evidence["unconfirmed"]["verdict"] == "fail"
    assert evidence["unconfirmed"]["candidate_rate"] == 0.05
    assert evidence["unconfirmed"]["stalled_starts"] == 2


def test_a_first_release_is_judged_on_its_stalls_too() -> None:
    def first(candidate: ArmSummary) -> Analysis:
        return analyze(
            [candidate],
            unit="vision",
            candidate="1.1.0",
            stable=None,
            since=SINCE,
            guardrails=GUARDRAILS,
            tiers=["high"],
        )

    assert verdicts(first(healthy("candidate", 62, stalled=62)))["unconfirmed"] == "fail"
    assert verdicts(first(healthy("candidate", 2000, aged_devices=2000)))["unconfirmed"] == "pass"
    young = first(healthy("candidate", 2000, aged_devices=0))
    assert verdicts(young)["unconfirmed"] == "inconclusive"


def test_a_stalling_stable_arm_raises_an_alarm() -> None:
    analysis = run(healthy("candidate"), healthy("stable", stalled=1500))
    assert any("stable arm's unconfirmed rate is 75.0%" in alarm for alarm in analysis.alarms)


def test_sabotage_an_unconfirmed_guardrail_that_always_passes_is_caught(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The table above must catch a guardrail that never fails: make it always pass and
    # the crash-loop row has to fail.
    from edgereg.analysis import _canary

    judged = _canary._rate_result

    def always_passes(spec: object, rule: RateGuardrail, *args: object, **kw: object) -> object:
        result = judged(spec, rule, *args, **kw)  # type: ignore[arg-type]
        return replace(result, verdict="pass") if result.name == "unconfirmed" else result

    monkeypatch.setattr(_canary, "_rate_result", always_passes)
    with pytest.raises(AssertionError):
        test_unconfirmed_guardrail(STALLS["stalls-fail-before-any-revert"])


# --- a few networks move no verdict (docs/operations/report-threats.md) ----------------------


@dataclass(frozen=True)
class Campaign:
    """A real fleet's arms, and what a forger adds to them from its own networks."""

    candidate: ArmSummary
    stable: ArmSummary
    guardrail: str
    verdict: str
    with_forger: Callable[[], ArmSummary]


def _forged(summary: ArmSummary, networks: int, tokens: int, **events: int) -> ArmSummary:
    """``summary`` plus ``tokens`` forged devices from ``networks`` /24s of the forger's own."""
    extra = Tally(
        tokens,
        networks,
        events,
        # Each forged network is wholly the forger's: its share is 1 where it has the event.
        {name: float(min(count, networks)) for name, count in events.items()},
    )
    aged = None if summary.aged is None else summary.aged + extra
    return replace(summary, all=summary.all + extra, aged=aged)


GOOD_C = healthy("candidate", 1000, reverted=20)
GOOD_S = healthy("stable", 19_000, reverted=380)
BAD_C = healthy("candidate", 5000, reverted=250)  # 5 % against 2 %: three points worse
BAD_S = healthy("stable", 15_000, reverted=300)
SMALL_C = healthy("candidate", 49, probe_failed=1)
SMALL_S = healthy("stable", 900)
SLOW = {latency_bucket(52.0) + o: 400 for o in range(5)}  # about 30 % slower
FAST = {latency_bucket(40.0) + o: 400 for o in range(5)}

CAMPAIGNS = {
    # Forged failures of a good candidate, from three /24s: set aside, they fail nothing.
    "reverts-from-three-networks": Campaign(
        GOOD_C,
        GOOD_S,
        "revert",
        "inconclusive",
        with_forger=lambda: _forged(GOOD_C, 3, 12, reverted=12),
    ),
    # Forged probe failures in a young canary's few dozen networks: they show a harm only
    # while they are counted, so they hold no step without proof (issue 33: three /24s
    # held a good candidate at 5 % for 21 days, at 1,000 devices).
    "probe-failures-in-a-small-canary-from-three-networks": Campaign(
        SMALL_C,
        SMALL_S,
        "probe_failure",
        "inconclusive",
        with_forger=lambda: _forged(SMALL_C, 3, 3, probe_failed=3),
    ),
    # Forged stable failures to mask a bad candidate: the stable arm is counted alike.
    "stable-failures-from-three-networks": Campaign(
        BAD_C,
        BAD_S,
        "revert",
        "fail",
        with_forger=lambda: _forged(BAD_S, 3, 60, reverted=60),
    ),
    # Forged healthy installs to dilute a bad candidate: networks weigh one each.
    "healthy-candidates-from-three-networks": Campaign(
        BAD_C,
        BAD_S,
        "revert",
        "fail",
        with_forger=lambda: _forged(BAD_C, 3, 600),
    ),
}


@pytest.mark.parametrize("row", CAMPAIGNS.values(), ids=CAMPAIGNS.keys())
def test_a_forger_with_tolerated_networks_changes_no_verdict(row: Campaign) -> None:
    """Nor whether a step without proof may go (harmless): forged failures hold nothing."""

    def judged(analysis: Analysis) -> GuardrailResult:
        return next(r for r in analysis.tiers[0].guardrails if r.name == row.guardrail)

    honest = judged(run(row.candidate, row.stable))
    assert honest.verdict == row.verdict
    forged = row.with_forger()
    arms = (forged, row.stable) if forged.arm == "candidate" else (row.candidate, forged)
    with_forger = judged(run(*arms))
    assert with_forger.verdict == row.verdict
    assert with_forger.harmless == honest.harmless, (honest.reason, with_forger.reason)


def test_a_forgers_latency_reports_weigh_one_network_each() -> None:
    """A hundred slow reports from one /24 are one slow value; so are a hundred fast ones."""
    fast_c = healthy("candidate", 2000, load_ms=FAST)
    slow_c = healthy("candidate", 2000, load_ms={b: n for b, n in SLOW.items()})
    stable = healthy("stable", 2000, load_ms=FAST)
    slow_forged = replace(
        fast_c,
        histograms={
            **fast_c.histograms,
            "load_ms": fast_c.histogram("load_ms")
            + Histogram(
                {latency_bucket(400.0): 100}, {latency_bucket(400.0): 1}, {latency_bucket(400.0): 1}
            ),
        },
    )
    assert verdicts(run(fast_c, stable))["load_ms"] == "pass"
    assert verdicts(run(slow_forged, stable))["load_ms"] == "pass"
    fast_forged = replace(
        slow_c,
        histograms={
            **slow_c.histograms,
            "load_ms": slow_c.histogram("load_ms")
            + Histogram(
                {latency_bucket(5.0): 3000}, {latency_bucket(5.0): 3}, {latency_bucket(5.0): 3}
            ),
        },
    )
    assert verdicts(run(slow_c, stable))["load_ms"] == "fail"
    assert verdicts(run(fast_forged, stable))["load_ms"] == "fail"


def test_a_fail_prints_the_interval_of_the_counts_it_rests_on() -> None:
    analysis = run(healthy("candidate", 1000, probe_failed=100), healthy("stable", 19_000))
    (probe,) = (r for r in analysis.tiers[0].guardrails if r.name == "probe_failure")
    assert probe.verdict == "fail"
    # The interval shown is the case with the tolerated networks set aside.
    assert "3 network(s) set aside" in probe.reason
    case = compare_rates(97, 997, 0, 19_000, margin=0.01, alpha=0.05)
    assert probe.numbers["ci_low"] == pytest.approx(case.ci_low)
    assert f"+{100 * case.ci_low:.2f} pt to" in probe.reason


def test_a_crash_at_the_first_launch_fails_first_start() -> None:
    """Every candidate install crashed once at its first launch, then ran: no revert, no stall."""
    crashed_once = healthy(
        "candidate", 1000, first_start=1000, aged_devices=900, aged_first_start=900
    )
    stable = healthy("stable", 19_000, first_start=1900, aged_devices=19_000, aged_first_start=1900)
    found = verdicts(run(crashed_once, stable))
    assert found["first_start"] == "fail"
    assert (found["revert"], found["unconfirmed"]) == ("pass", "pass")
    # Non-users at the first launch, alike in both arms, are not a crash.
    alike = healthy("candidate", 1000, first_start=100, aged_devices=900, aged_first_start=90)
    assert verdicts(run(alike, stable))["first_start"] != "fail"


# --- guardrails on app metrics -----------------------------------------------------

ACCEPTED = AppMetric(kind="rate")
CONFIDENCE = AppMetric(kind="distribution", buckets=[0.5, 0.7, 0.9], unit="score")
DECLARED = {"accepted": ACCEPTED, "confidence": CONFIDENCE}
ON_METRICS = Guardrails.model_validate(
    {
        "accepted": {"metric": "accepted", "max_worse": 0.01},
        "confident": {"metric": "confidence", "max_worse": 0.05},
        "unsure": {
            "metric": "confidence",
            "max_worse": 0.02,
            "stat": "share_below",
            "threshold": 0.5,
            "critical": False,
        },
        "nobody_declares": {"metric": "retries", "max_worse": 0.1},
    }
)


def success_rates(devices: int, rate: float, seed: int, events: int = 20) -> list[float]:
    """Each device's success rate over its own events (some users are worse off than others)."""
    rng = np.random.default_rng(seed)
    own = np.clip(rng.normal(rate, 0.03, devices), 0, 1)
    return list(rng.binomial(events, own) / events)


def with_metrics(
    name: str, devices: int, rate: float, seed: int, **tallies: MetricTally
) -> ArmSummary:
    return healthy(
        name,
        devices,
        metrics={"accepted": MetricTally.of_devices(success_rates(devices, rate, seed)), **tallies},
    )


def metric_run(candidate: ArmSummary, stable: ArmSummary | None, **kw: object) -> Analysis:
    arms = (candidate,) if stable is None else (candidate, stable)
    return run(*arms, guardrails=ON_METRICS, metrics=DECLARED, tiers=["high"], **kw)


def result_of(analysis: Analysis, name: str) -> GuardrailResult:
    (found,) = (r for r in analysis.tiers[0].guardrails if r.name == name)
    return found


def test_a_three_point_drop_in_an_app_metric_fails_in_the_metrics_terms() -> None:
    analysis = metric_run(
        with_metrics("candidate", 3000, 0.89, 1), with_metrics("stable", 3000, 0.92, 2)
    )
    accepted = result_of(analysis, "accepted")
    assert accepted.verdict == "fail"
    assert analysis.verdict == "fail"
    assert accepted.reason.startswith("accepted's rate of success: candidate 8")
    assert "vs stable 9" in accepted.reason
    assert "limit +1.0 pt worse" in accepted.reason
    assert accepted.beyond_limit is not None
    assert accepted.beyond_limit.endswith("pt")
    # A guardrail on a metric the unit does not declare judges nothing.
    assert "nobody_declares" not in verdicts(analysis)


def test_an_unchanged_app_metric_passes_with_enough_devices_and_waits_with_few() -> None:
    same = metric_run(
        with_metrics("candidate", 3000, 0.92, 3), with_metrics("stable", 3000, 0.92, 4)
    )
    assert result_of(same, "accepted").verdict == "pass"
    few = metric_run(with_metrics("candidate", 30, 0.92, 5), with_metrics("stable", 3000, 0.92, 6))
    assert result_of(few, "accepted").verdict == "inconclusive"


def test_app_metric_guardrails_fail_good_candidates_at_most_alpha_over_every_look() -> None:
    """A/A at the limit, looked at every 100 devices: the evidence is valid at every look."""
    margin = ON_METRICS.metric_guardrails()["accepted"].max_worse
    fails = 0
    runs = 120
    for seed in range(runs):
        candidate = np.array(success_rates(2000, 0.92 - margin, 10_000 + seed))
        stable = np.array(success_rates(2000, 0.92, 20_000 + seed))
        for n in range(100, 2001, 100):
            analysis = metric_run(
                healthy(
                    "candidate",
                    n,
                    metrics={"accepted": MetricTally.of_devices(list(candidate[:n]))},
                ),
                healthy(
                    "stable", n, metrics={"accepted": MetricTally.of_devices(list(stable[:n]))}
                ),
                intervals=False,
            )
            if result_of(analysis, "accepted").verdict == "fail":
                fails += 1
                break
    assert fails / runs <= ON_METRICS.alpha


def test_a_distributions_mean_and_share_are_judged_in_their_own_terms() -> None:
    # Buckets (-inf, 0.5], (0.5, 0.7], (0.7, 0.9], (0.9, inf): valued 0.5, 0.6, 0.8, 0.9.
    def confidence(devices: int, low: float, seed: int) -> dict[str, MetricTally]:
        rng = np.random.default_rng(seed)
        counts = rng.multinomial(30, [low, 0.2, 0.4, 0.4 - low], devices)
        values = np.array([0.5, 0.6, 0.8, 0.9])
        return {
            "confident": MetricTally.of_devices(list(counts @ values / 30)),
            "unsure": MetricTally.of_devices(list(counts[:, 0] / 30)),
        }

    worse = metric_run(
        with_metrics("candidate", 3000, 0.92, 7, **confidence(3000, 0.3, 8)),
        with_metrics("stable", 3000, 0.92, 9, **confidence(3000, 0.05, 10)),
    )
    mean = result_of(worse, "confident")
    assert mean.verdict == "fail"
    assert mean.reason.startswith("confidence's mean: candidate 0.")
    assert "score" in mean.reason
    assert mean.beyond_limit is not None
    assert mean.beyond_limit.endswith("worse")
    unsure = result_of(worse, "unsure")
    assert unsure.verdict == "fail"
    assert not unsure.critical
    assert unsure.reason.startswith("confidence's share at or below 0.5: candidate 30.")


def test_an_app_metric_without_counts_or_without_a_stable_release() -> None:
    stable = with_metrics("stable", 3000, 0.92, 11)
    silent = metric_run(healthy("candidate", 3000), stable)
    assert result_of(silent, "accepted").reason == (
        "no candidate device counted accepted in the period"
    )
    unheard = metric_run(with_metrics("candidate", 3000, 0.92, 12), healthy("stable", 3000))
    assert (
        result_of(unheard, "accepted").reason == "no stable device counted accepted in the period"
    )
    first = analyze(
        [with_metrics("candidate", 3000, 0.5, 13)],
        unit="vision",
        candidate="1.1.0",
        stable=None,
        since=SINCE,
        guardrails=ON_METRICS,
        tiers=["high"],
        metrics=DECLARED,
    )
    # Nothing to compare with: an app metric holds no first release back.
    assert result_of(first, "accepted").verdict == "pass"


def _forged_metric(summary: ArmSummary, networks: int, value: float) -> ArmSummary:
    """``summary`` plus a forger's ``networks`` /24s, each of many tokens reporting ``value``."""
    extra = MetricTally(
        networks * 200, networks, networks * 200 * value, networks * value, networks * value**2
    )
    return replace(
        summary, metrics={**summary.metrics, "accepted": summary.metric("accepted") + extra}
    )


@pytest.mark.parametrize(
    ("candidate_rate", "forged_arm", "forged_value", "verdict"),
    [
        # Forged failures of a good candidate: set aside, they fail nothing.
        pytest.param(0.92, "candidate", 0.0, "pass", id="failures-in-the-candidate-arm"),
        # Forged stable failures to mask a worse candidate.
        pytest.param(0.89, "stable", 0.0, "fail", id="failures-in-the-stable-arm"),
        # Forged perfect candidates to dilute a worse one.
        pytest.param(0.89, "candidate", 1.0, "fail", id="successes-in-the-candidate-arm"),
    ],
)
def test_a_forger_from_tolerated_networks_moves_no_app_metric_verdict(
    candidate_rate: float, forged_arm: str, forged_value: float, verdict: str
) -> None:
    candidate = with_metrics("candidate", 3000, candidate_rate, 14)
    stable = with_metrics("stable", 3000, 0.92, 15)
    assert result_of(metric_run(candidate, stable), "accepted").verdict == verdict
    k = ON_METRICS.tolerated_networks
    if forged_arm == "candidate":
        candidate = _forged_metric(candidate, k, forged_value)
    else:
        stable = _forged_metric(stable, k, forged_value)
    assert result_of(metric_run(candidate, stable), "accepted").verdict == verdict


def test_a_rate_guardrail_turned_off_neither_fails_nor_holds() -> None:
    """`enabled = false` (a fleet too small for a rate both arms share): not analysed at all."""
    candidate = healthy("candidate", 20, probe_failed=20)
    stable = healthy("stable", 20)
    assert verdicts(run(candidate, stable))["probe_failure"] == "fail"
    off = Guardrails.model_validate({"probe_failure": {"enabled": False}})
    assert "probe_failure" not in verdicts(run(candidate, stable, guardrails=off))
    assert off.probe_failure.max_increase == Guardrails().probe_failure.max_increase


@dataclass(frozen=True)
class FullExposure:
    """Arms at the step to 100 %, and whether the estimate a promotion reads holds it there."""

    candidate: ArmSummary
    stable: ArmSummary
    held: bool


def _probe(devices: int, failing: int, name: str = "candidate") -> ArmSummary:
    return healthy(name, devices, probe_failed=failing)


FULL_EXPOSURE = {
    # A good candidate, 2 % in both arms of 200 networks: on to 100 %.
    "good": FullExposure(_probe(200, 4), _probe(200, 4, "stable"), False),
    # The same with three forged failing networks (the candidate's estimate +1.5 pt over
    # every network): set aside, they hold nothing. Failed on the rule before
    # (the plain estimate over every network: 7/203 - 4/200, beyond the 1 pt limit).
    "good-and-three-forged-failing-networks": FullExposure(
        _forged(_probe(200, 4), 3, 10, probe_failed=10), _probe(200, 4, "stable"), False
    ),
    # A bad candidate, 5 % against 2 %: held below 100 %, with or without a forger's
    # healthy candidate networks diluting it.
    "bad": FullExposure(_probe(200, 10), _probe(200, 4, "stable"), True),
    "bad-and-three-forged-healthy-networks": FullExposure(
        _forged(_probe(200, 10), 3, 600), _probe(200, 4, "stable"), True
    ),
}


@pytest.mark.parametrize("row", FULL_EXPOSURE.values(), ids=FULL_EXPOSURE.keys())
def test_the_estimate_full_exposure_reads_sets_aside_what_a_forger_could_hold(
    row: FullExposure,
) -> None:
    # Holding a candidate below 100 % on its estimate is a claim of harm: it must survive
    # setting aside the tolerated networks most against the candidate, as a fail must.
    (probe,) = (
        r for r in run(row.candidate, row.stable).tiers[0].guardrails if r.name == "probe_failure"
    )
    assert probe.verdict == "inconclusive", probe.reason
    assert (probe.beyond_limit is not None) == row.held, probe.numbers


@pytest.mark.parametrize(
    ("numbers", "said"),
    [
        ({"ci_high": 0.031}, "+3.1 pt"),
        ({"ci_high": math.nan}, None),
        ({"ci_high_pct": 12.4}, "+12%"),
        ({"ci_high_pct": math.nan}, None),
        ({}, None),
    ],
)
def test_the_harm_left_open_is_said_only_when_there_is_an_interval(
    numbers: dict[str, float], said: str | None
) -> None:
    from edgereg.analysis._canary import GuardrailResult

    result = GuardrailResult("revert", True, "inconclusive", "", numbers=numbers)
    assert result.harm_left_open == said
