"""Canary analysis: statistics against scipy and brute force, and rules that always hold."""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest
import scipy.stats
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
from edgereg.config import Guardrails, LatencyGuardrail, RateGuardrail, UnconfirmedGuardrail
from edgereg.reports.summary import ArmSummary, bucket_value_ms, latency_bucket
from edgereg.wire import HistoryEvent, RolloutSnapshot, RolloutState

SINCE = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
GUARDRAILS = Guardrails()


def expand(histogram: dict[int, int]) -> np.ndarray:
    return np.repeat([bucket_value_ms(index) for index in histogram], list(histogram.values()))


def arm(
    arm_name: str,
    devices: int,
    *,
    tier: str = "high",
    version: str | None = None,
    unit: str = "vision",
    **fields: object,
) -> ArmSummary:
    return ArmSummary(
        unit=unit,
        tier=tier,
        arm=arm_name,  # type: ignore[arg-type]
        version=version or ("1.1.0" if arm_name == "candidate" else "1.0.0"),
        devices=devices,
        **fields,  # type: ignore[arg-type]
    )


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
    assert f"candidate {few} of {GUARDRAILS.min_devices} needed" in tier.guardrails[0].reason
    broken = run(healthy("candidate", 40, probe_failed=40), healthy("stable", 100_000))
    assert verdicts(broken)["probe_failure"] == "fail"


def test_a_tier_without_reports_is_inconclusive_and_named() -> None:
    analysis = run(healthy("candidate"), healthy("stable"), tiers=["high", "low"])
    assert [tier.tier for tier in analysis.tiers] == ["high", "low"]
    assert set(verdicts(analysis, "low").values()) == {"inconclusive"}
    assert analysis.tiers[1].guardrails[0].reason == "no candidate and stable reports in the period"
    assert analysis.verdict == "inconclusive"


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


def test_a_fail_needs_min_failing_devices() -> None:
    # Two of two reverting against 0 of 1000 is strong evidence (p about 0.015) but two
    # devices are not enough to roll back on: min_failing_devices (3) is the floor.
    assert compare_rates(2, 2, 0, 1000, margin=0.01, alpha=0.05).p_worse < 0.05
    analysis = run(healthy("candidate", 2, reverted=2), healthy("stable", 1000))
    (tier,) = analysis.tiers
    (revert,) = (r for r in tier.guardrails if r.name == "revert")
    assert revert.verdict == "inconclusive"
    assert "2 failing candidate device(s), 3 needed to fail" in revert.reason
    worse = run(healthy("candidate", 3, reverted=3), healthy("stable", 1000))
    assert verdicts(worse)["revert"] == "fail"


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


def test_a_fail_needs_failing_devices_from_min_failing_sources_networks() -> None:
    # 40 reverting candidate devices, all from one network: a forger's campaign, not a fail.
    known = {"sources": 300, "sourced_devices": 2000}
    one_network = healthy("candidate", 2000, reverted=40, reverted_sources=1, **known)
    analysis = run(one_network, healthy("stable", 2000, **known))
    (tier,) = analysis.tiers
    (revert,) = (r for r in tier.guardrails if r.name == "revert")
    assert revert.verdict == "inconclusive"
    # Counted one per network, the forty are one failing device.
    assert "(a fail counts 1 of the 40 failing devices: one per network)" in revert.reason
    assert revert.numbers["failing_counted"] == 1
    spread = healthy("candidate", 2000, reverted=40, reverted_sources=40, **known)
    assert verdicts(run(spread, healthy("stable", 2000, **known)))["revert"] == "fail"
    # Forty from three networks count three: too few to show +1 point over 0 %.
    three = healthy("candidate", 2000, reverted=40, reverted_sources=3, **known)
    assert verdicts(run(three, healthy("stable", 2000, **known)))["revert"] == "inconclusive"
    # Devices counted whole (count_networks off): the network floor still holds.
    whole = Guardrails(count_networks=False)
    analysis = run(one_network, healthy("stable", 2000, **known), guardrails=whole)
    (revert,) = (r for r in analysis.tiers[0].guardrails if r.name == "revert")
    assert "come from 1 network(s), 3 needed to fail" in revert.reason
    assert verdicts(run(three, healthy("stable", 2000, **known), guardrails=whole))["revert"] == (
        "fail"
    )
    # Known for a few devices only (a forger's trusted path, the rest behind a proxy
    # not trusted): those few do not decide for the arm.
    few_known = healthy("candidate", 2000, reverted=40, sources=1, sourced_devices=50)
    assert verdicts(run(few_known, healthy("stable", 2000)))["revert"] == "fail"
    # Sources unknown (a proxy not trusted, reports from before schema 2): not applied.
    unknown = healthy("candidate", 2000, reverted=40)
    assert verdicts(run(unknown, healthy("stable", 2000)))["revert"] == "fail"


def test_a_pass_needs_devices_from_min_sources_networks() -> None:
    # Devices counted whole (count_networks off), min_sources is the networks' floor.
    whole = Guardrails(count_networks=False)
    few = run(
        healthy("candidate", sources=2, sourced_devices=2000),
        healthy("stable", sources=300, sourced_devices=2000),
        guardrails=whole,
    )
    assert set(verdicts(few).values()) == {"inconclusive"}
    assert "devices from too few networks to pass (candidate 2 of 5" in (
        few.tiers[0].guardrails[0].reason
    )
    enough = run(
        healthy("candidate", sources=5, sourced_devices=2000),
        healthy("stable", sources=300, sourced_devices=2000),
        guardrails=whole,
    )
    assert enough.verdict == "pass"
    # Counted by network (the default), two networks are two devices of the 50 needed.
    counted = run(
        healthy("candidate", sources=2, sourced_devices=2000),
        healthy("stable", sources=300, sourced_devices=2000),
    )
    assert set(verdicts(counted).values()) == {"inconclusive"}
    assert "candidate 2 of 50 needed" in counted.tiers[0].guardrails[0].reason


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


def test_a_pass_counts_the_candidates_networks_as_its_devices() -> None:
    # 4 genuine candidate devices plus 1,500 forged healthy ones from one network: five
    # networks, so five devices to pass on, far from min_devices.
    forged = healthy("candidate", 1504, sources=5, sourced_devices=1504)
    stable = healthy("stable", 2000, sources=2000, sourced_devices=2000)
    analysis = run(forged, stable)
    found = verdicts(analysis)
    assert set(found.values()) == {"inconclusive"}, found
    (revert,) = (r for r in analysis.tiers[0].guardrails if r.name == "revert")
    assert "(a pass counts the candidate's 5 networks as its devices, not 1504)" in revert.reason
    assert revert.numbers["passing_devices"] == 5
    # Genuine devices on networks of their own pass as before; counted whole, so would these.
    spread = healthy("candidate", 1504, sources=1504, sourced_devices=1504)
    assert run(spread, stable).verdict == "pass"
    assert run(forged, stable, guardrails=Guardrails(count_networks=False)).verdict == "pass"


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
        "a pass counts only the 0 candidate device(s) installed 72 h ago or more",
    ),
    "aged-cohort-passes-on-its-aged-installs": Stall(
        healthy("candidate", aged_devices=1500, aged_sources=1500, **KNOWN),
        healthy("stable", aged_devices=2000, aged_sources=2000, **KNOWN),
        "pass",
        "a pass counts only the 1500 candidate device(s) installed 72 h ago",
    ),
    "too-few-aged-to-pass": Stall(
        healthy("candidate", aged_devices=30, aged_sources=30, **KNOWN),
        healthy("stable", aged_devices=2000, aged_sources=2000, **KNOWN),
        "inconclusive",
        "too few devices to pass",
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
        "a pass counts only the 500 candidate device(s)",
    ),
    "stalls-from-one-network-do-not-fail": Stall(
        healthy("candidate", stalled=40, stalled_sources=1, **KNOWN),
        healthy("stable", **KNOWN),
        "inconclusive",
        "(a fail counts 1 of the 40 failing devices: one per network)",
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

    def always_passes(name: str, rule: RateGuardrail, *args: object, **kw: object) -> object:
        result = judged(name, rule, *args, **kw)  # type: ignore[arg-type]
        return replace(result, verdict="pass") if name == "unconfirmed" else result

    monkeypatch.setattr(_canary, "_rate_result", always_passes)
    with pytest.raises(AssertionError):
        test_unconfirmed_guardrail(STALLS["stalls-fail-before-any-revert"])
