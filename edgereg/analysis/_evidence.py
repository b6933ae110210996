"""Evidence that a few networks cannot move: every verdict holds with any ``k`` of them set aside.

A report is anonymous, so a forger mints devices at will; what it cannot mint
quickly is source networks (docs/operations/report-threats.md). The store
therefore counts each network as one observation, in both arms
(:mod:`edgereg.reports.summary`), and every verdict here must hold whichever
``k`` networks (the guardrails' ``tolerated_networks``) are removed from the
two arms: the networks a forger may hold, in the arm and the direction that
would help it most.

For rates, removing a network takes away at most one event (a network's
share of an event is at most 1) and exactly one network, so the worst case of
each split of ``k`` between the arms is a closed form:

- a **fail** (the candidate worse than the limit) must survive losing ``j``
  failing candidate networks and ``k - j`` healthy stable ones, for every
  ``j`` (forged candidate failures and forged healthy stable installs are
  what would fake one);
- a **pass** (within the limit) and a **harm not shown** (the step without
  proof) must survive losing ``j`` healthy candidate networks and ``k - j``
  failing stable ones (forged healthy candidates and forged stable failures
  fake those).

The **estimate** a promotion without proof reads (and the step to 100 %) holds
a rollout when it is beyond the limit: that is a claim of harm, like a fail
and a harm shown, so it is read in the fail-side cases, the ``k`` networks
most against the candidate set aside (its failing ones, the stable's healthy
ones), and the smallest difference of them is the estimate. A forger's
failing candidate networks then hold nothing (they are the ones set aside);
its healthy candidate networks dilute the candidate's rate by ``k / n`` of
itself (a few hundredths of a point for the rates failures have), and its
failing stable networks lower the estimate by at most ``k / m`` as they did
the plain one. The price: a candidate's estimate reads ``k / n`` better than
its plain difference, which the fleets benchmarks/canary.py runs measure
(docs/operations/canary-analysis.md).

Latency histograms hold each network at its fastest device (``low``) and its
slowest (``high``): a fail reads the candidate's fastest against the stable's
slowest, a pass the reverse, and each sets aside the ``k`` values that would
help it most. Each case is judged with the same always-valid evidence as one
(a mixture likelihood ratio for rates, time-uniform bands for latencies), so
the error over every look stays below ``alpha`` in each; the verdict is the
worst case's.

A share of an event is not a 0/1 outcome, but the likelihood ratio of a
Bernoulli rate stays a supermartingale for outcomes in [0, 1] (it is convex in
the outcome, so below its chord, whose mean is 1), so the evidence stays valid.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from edgereg.analysis._bands import (
    ShiftEvidence,
    counts_of,
    shift_evidence,
    without_highest,
    without_lowest,
)
from edgereg.analysis._means import (
    MeanArm,
    compare_means,
    log_evidence,
    mixture_scale,
    standard_error,
)
from edgereg.analysis._ranks import ShiftComparison, compare_latency, total
from edgereg.analysis._rates import (
    RateComparison,
    RateLimitCheck,
    check_rate_limit,
    compare_rates,
    log_ratio,
)

__all__ = [
    "RateArm",
    "RateEvidence",
    "ShiftEvidenceRobust",
    "rate_evidence",
    "rate_limit_evidence",
    "shift_evidence_robust",
    "trim_high",
    "trim_low",
]


@dataclass(frozen=True)
class RateArm:
    """One arm of a rate guardrail, as a verdict counts it.

    Attributes:
        events: Networks with the event, each by the share of its devices that had it.
        networks: Source networks (a device without a known one is its own).
        device_events: Devices with the event (for people; an app metric's sum of
            each device's share, a fraction).
        devices: Devices (for people).
        squares: For an app metric, each network's value squared, summed: the
            evidence then estimates their spread (:mod:`edgereg.analysis._means`);
            None for an event, a 0/1 outcome per device.
    """

    events: float
    networks: int
    device_events: float = 0
    devices: int = 0
    squares: float | None = None


@dataclass(frozen=True)
class RateEvidence:
    """A candidate arm against a stable arm, in every case of ``k`` networks set aside.

    Attributes:
        plain: The comparison with no network set aside (the numbers people read).
        fail_case: The fail-side case that is hardest to fail (its interval is
            the one a fail message shows), or None when no case has devices.
        pass_case: The pass-side case that is hardest to pass, likewise.
        p_worse: The largest ``p_worse`` over the fail-side cases (1: some case
            has no devices).
        p_within: The largest ``p_within`` over the pass-side cases.
        harm_shown: Every pass-side case shows the candidate worse than the
            stable at all (its interval above 0): the harm no forger's networks
            can be hiding.
        harmless: Some fail-side case shows no harm: with the ``k`` networks most
            against the candidate set aside (its failing ones, the stable's
            healthy ones) the harm is gone, so it may be a forger's alone (what a
            step without proof needs; a harm shown whichever networks go holds it).
        estimate: The smallest difference over the fail-side cases (the ``k``
            networks most against the candidate set aside): what a promotion
            without proof reads, so that forged failures hold nothing.
        estimate_low: Its lower end at one look (the estimate minus 1.96 standard
            errors of that case, a fixed-sample bound): what "clearly beyond the
            limit" reads.
        ci_high: The largest upper end of the interval over the pass-side cases.
    """

    plain: RateComparison
    fail_case: RateComparison | None
    pass_case: RateComparison | None
    p_worse: float
    p_within: float
    harm_shown: bool
    harmless: bool
    estimate: float
    ci_high: float
    estimate_low: float = -1.0


def _case(
    c_events: float, c_networks: int, s_events: float, s_networks: int
) -> tuple[float, int, float, int] | None:
    if c_networks < 1 or s_networks < 1:
        return None
    return (
        min(max(c_events, 0.0), c_networks),
        c_networks,
        min(max(s_events, 0.0), s_networks),
        s_networks,
    )


def rate_evidence(
    candidate: RateArm,
    stable: RateArm,
    *,
    margin: float,
    alpha: float,
    k: int,
    intervals: bool = True,
) -> RateEvidence:
    """The candidate's rate minus the stable's against ``margin``, robust to ``k`` networks.

    ``intervals``: False leaves the confidence sequences out (NaN), for a caller
    that reads only the verdicts (a simulation looking thousands of times).

    Raises:
        ValueError: an arm without networks.
    """
    if candidate.squares is not None and stable.squares is not None:
        return _mean_evidence(
            candidate, stable, margin=margin, alpha=alpha, k=k, intervals=intervals
        )
    plain = compare_rates(
        candidate.events,
        candidate.networks,
        stable.events,
        stable.networks,
        margin=margin,
        alpha=alpha,
        interval=intervals,
    )
    fail_cases = [
        _case(
            candidate.events - j, candidate.networks - j, stable.events, stable.networks - (k - j)
        )
        for j in range(k + 1)
    ]
    pass_cases = [
        _case(
            candidate.events,
            candidate.networks - j,
            stable.events - (k - j),
            stable.networks - (k - j),
        )
        for j in range(k + 1)
    ]
    target = math.log(1 / alpha)

    def p_worse(counts: tuple[float, int, float, int]) -> float:
        if _difference(counts) <= margin:
            return 1.0
        return min(1.0, math.exp(-max(0.0, log_ratio(*counts, margin))))

    def p_within(counts: tuple[float, int, float, int]) -> float:
        if _difference(counts) >= margin:
            return 1.0
        return min(1.0, math.exp(-max(0.0, log_ratio(*counts, margin))))

    def shows_harm(counts: tuple[float, int, float, int]) -> bool:
        return _difference(counts) > 0 and log_ratio(*counts, 0.0) >= target

    fail_known = [c for c in fail_cases if c is not None]
    pass_known = [c for c in pass_cases if c is not None]
    # The estimate a promotion reads: the fail-side case that makes the candidate look best.
    plain_counts = (candidate.events, candidate.networks, stable.events, stable.networks)
    best = min(fail_known or [plain_counts], key=_difference)
    worst_fail = max(fail_known, key=p_worse) if len(fail_known) == len(fail_cases) else None
    worst_pass = max(pass_known, key=p_within) if len(pass_known) == len(pass_cases) else None
    complete = worst_pass is not None
    harms = [shows_harm(c) for c in pass_known]
    robust_harm = len(fail_known) == len(fail_cases) and all(shows_harm(c) for c in fail_known)
    pass_case = (
        compare_rates(*worst_pass, margin=margin, alpha=alpha, interval=intervals)
        if worst_pass is not None
        else None
    )
    return RateEvidence(
        plain=plain,
        fail_case=(
            compare_rates(*worst_fail, margin=margin, alpha=alpha, interval=intervals)
            if worst_fail is not None
            else None
        ),
        pass_case=pass_case,
        p_worse=p_worse(worst_fail) if worst_fail is not None else 1.0,
        p_within=p_within(worst_pass) if worst_pass is not None else 1.0,
        harm_shown=complete and all(harms),
        harmless=complete and not robust_harm,
        estimate=_difference(best),
        estimate_low=_difference(best) - 1.96 * _standard_error(*best),
        # The interval of the case hardest to pass: the harm the evidence leaves open.
        ci_high=pass_case.ci_high if pass_case is not None else plain.ci_high,
    )


def _mean_arm(total: float, squares: float, count: int) -> MeanArm | None:
    if count < 1:
        return None
    total = min(max(total, 0.0), float(count))
    # Values in [0, 1]: their squares sum to at most their total, at least its square / count.
    return MeanArm(total, min(max(squares, total * total / count), total), count)


def _mean_evidence(
    candidate: RateArm, stable: RateArm, *, margin: float, alpha: float, k: int, intervals: bool
) -> RateEvidence:
    """:func:`rate_evidence` for values in [0, 1] whose spread is known (an app metric).

    The cases are the same: a network set aside takes away at most one of the
    sum, and as much of the sum of squares, and exactly one network.
    """
    assert candidate.squares is not None
    assert stable.squares is not None
    c_sq, s_sq = candidate.squares, stable.squares
    c = _mean_arm(candidate.events, c_sq, candidate.networks)
    s = _mean_arm(stable.events, s_sq, stable.networks)
    if c is None or s is None:
        raise ValueError("each arm needs at least one network")
    plain = compare_means(c, s, margin=margin, alpha=alpha, interval=intervals)
    fail_cases = [
        (
            _mean_arm(c.total - j, c_sq - j, c.count - j),
            _mean_arm(s.total, s_sq, s.count - (k - j)),
        )
        for j in range(k + 1)
    ]
    pass_cases = [
        (
            _mean_arm(c.total, c_sq, c.count - j),
            _mean_arm(s.total - (k - j), s_sq - (k - j), s.count - (k - j)),
        )
        for j in range(k + 1)
    ]
    known_fail = [(a, b) for a, b in fail_cases if a is not None and b is not None]
    known_pass = [(a, b) for a, b in pass_cases if a is not None and b is not None]
    target = math.log(1 / alpha)

    def compared(pair: tuple[MeanArm, MeanArm], interval: bool = False) -> RateComparison:
        return compare_means(*pair, margin=margin, alpha=alpha, interval=interval)

    def shows_harm(pair: tuple[MeanArm, MeanArm]) -> bool:
        a, b = pair
        return a.mean > b.mean and log_evidence(a, b, 0.0, mixture_scale(margin)) >= target

    worst_fail = (
        max(known_fail, key=lambda pair: compared(pair).p_worse)
        if len(known_fail) == len(fail_cases)
        else None
    )
    worst_pass = (
        max(known_pass, key=lambda pair: compared(pair).p_within)
        if len(known_pass) == len(pass_cases)
        else None
    )
    # The estimate a promotion reads: the fail-side case that makes the candidate look best.
    best = min(known_fail or [(c, s)], key=lambda pair: pair[0].mean - pair[1].mean)
    fail_case = compared(worst_fail, intervals) if worst_fail is not None else None
    pass_case = compared(worst_pass, intervals) if worst_pass is not None else None
    harms = [shows_harm(pair) for pair in known_pass]
    complete = worst_pass is not None
    robust_harm = len(known_fail) == len(fail_cases) and all(
        shows_harm(pair) for pair in known_fail
    )
    return RateEvidence(
        plain=plain,
        fail_case=fail_case,
        pass_case=pass_case,
        p_worse=fail_case.p_worse if fail_case is not None else 1.0,
        p_within=pass_case.p_within if pass_case is not None else 1.0,
        harm_shown=complete and all(harms),
        harmless=complete and not robust_harm,
        estimate=best[0].mean - best[1].mean,
        estimate_low=best[0].mean - best[1].mean - 1.96 * standard_error(*best),
        ci_high=pass_case.ci_high if pass_case is not None else plain.ci_high,
    )


def _difference(counts: tuple[float, int, float, int]) -> float:
    """The candidate's rate minus the stable's, of (events, networks) per arm."""
    return counts[0] / counts[1] - counts[2] / counts[3]


def _standard_error(c_events: float, c_networks: int, s_events: float, s_networks: int) -> float:
    """The difference's standard error at one look (Wald, over networks)."""
    p1, p0 = c_events / c_networks, s_events / s_networks
    return math.sqrt(p1 * (1 - p1) / c_networks + p0 * (1 - p0) / s_networks)


def rate_limit_evidence(
    arm: RateArm, *, limit: float, alpha: float, k: int, intervals: bool = True
) -> tuple[RateLimitCheck, RateLimitCheck | None, RateLimitCheck | None]:
    """One arm's rate against an absolute limit: plain, and with ``k`` networks set aside.

    Returns:
        The plain check (with its interval), the case hardest to show the rate
        above the limit (``k`` failing networks gone) and the case hardest to
        show it below (``k`` healthy networks gone); None when ``k`` networks
        are all the arm has.
    """
    plain = check_rate_limit(arm.events, arm.networks, limit=limit, alpha=alpha, interval=intervals)
    left = arm.networks - k
    if left < 1:
        return plain, None, None
    above = check_rate_limit(
        min(max(arm.events - k, 0.0), left), left, limit=limit, alpha=alpha, interval=False
    )
    below = check_rate_limit(min(arm.events, left), left, limit=limit, alpha=alpha, interval=False)
    return plain, above, below


def _as_histogram(counts: np.ndarray) -> dict[int, int]:
    return {int(i): round(float(counts[i])) for i in np.flatnonzero(counts > 0)}


def trim_high(histogram: Mapping[int, int], count: int) -> dict[int, int]:
    """``histogram`` without its ``count`` highest values."""
    out = dict(histogram)
    for bucket in sorted(out, reverse=True):
        if count <= 0:
            break
        taken = min(out[bucket], count)
        out[bucket] -= taken
        count -= taken
    return {b: n for b, n in out.items() if n > 0}


def trim_low(histogram: Mapping[int, int], count: int) -> dict[int, int]:
    """``histogram`` without its ``count`` lowest values."""
    out = dict(histogram)
    for bucket in sorted(out):
        if count <= 0:
            break
        taken = min(out[bucket], count)
        out[bucket] -= taken
        count -= taken
    return {b: n for b, n in out.items() if n > 0}


@dataclass(frozen=True)
class ShiftEvidenceRobust:
    """A latency shift judged in every case of ``k`` networks set aside.

    Attributes:
        plain: The devices' own comparison (medians, Hodges-Lehmann shift: for people).
        slower: Every fail-side case shows the candidate slower than the limit.
        within: Every pass-side case shows it within the limit.
        harm_shown: Every pass-side case shows it slower at all.
        harmless: Some fail-side case shows it no slower: the slowdown seen may
            be the ``k`` networks' alone (a forger's slow reports).
        estimate_pct: The Hodges-Lehmann shift of the candidate's networks at
            their slowest against the stable's at their fastest (percent of the
            stable median; the devices' own where each network holds one), with
            the ``k`` values set aside that make the candidate look best.
        estimate_low_pct: The lower end of its one-look 95 % interval (Lehmann's,
            two-sided): what "clearly beyond the limit" reads.
        ci_low_pct: The smallest lower end of the shift's interval over the
            fail-side cases (the slowdown shown whichever networks go).
        ci_high_pct: The largest upper end over the pass-side cases (inf: none shown).
        candidate_networks: The candidate's networks with a value.
        stable_networks: The stable's.
    """

    plain: ShiftComparison
    slower: bool
    within: bool
    harm_shown: bool
    harmless: bool
    estimate_pct: float
    estimate_low_pct: float
    ci_low_pct: float
    ci_high_pct: float
    candidate_networks: int
    stable_networks: int


def shift_evidence_robust(
    candidate: tuple[Mapping[int, int], Mapping[int, int], Mapping[int, int]],
    stable: tuple[Mapping[int, int], Mapping[int, int], Mapping[int, int]],
    *,
    limit_pct: float,
    alpha: float,
    k: int,
    intervals: bool = True,
) -> ShiftEvidenceRobust:
    """Is the candidate at most ``limit_pct`` percent slower, whichever ``k`` networks go?

    The interval shown is the fail side's with the ``k`` networks set aside from
    the candidate (its lower end) and the pass side's likewise (its upper end).

    Args:
        candidate: The candidate's (devices, low, high) histograms.
        stable: The stable's.
        intervals: False leaves the intervals out (NaN).

    Raises:
        ValueError: an arm without values.
    """
    c_devices, c_low, c_high = candidate
    s_devices, s_low, s_high = stable
    plain = compare_latency(dict(c_devices), dict(s_devices), alpha=alpha)
    counts = {
        name: counts_of(h)
        for name, h in (("c_low", c_low), ("c_high", c_high), ("s_low", s_low), ("s_high", s_high))
    }
    slower: list[ShiftEvidence] = []
    within: list[ShiftEvidence] = []
    # The estimate a promotion reads: the candidate's networks at their slowest against the
    # stable's at their fastest, minus the j slowest candidate values and the k - j fastest
    # stable ones that make it look best (a hold on it is a claim of harm, as a fail is).
    views = [
        compare_latency(_as_histogram(view_c), _as_histogram(view_s), alpha=0.025)
        for j in range(k + 1)
        for view_c, view_s in [
            (without_highest(counts["c_high"], j), without_lowest(counts["s_low"], k - j))
        ]
        if view_c.sum() >= 0.5 and view_s.sum() >= 0.5
    ]
    if not views and counts["c_high"].sum() >= 0.5 and counts["s_low"].sum() >= 0.5:
        views = [compare_latency(dict(c_high), dict(s_low), alpha=0.025)]
    if not views:
        views = [compare_latency(dict(c_devices), dict(s_devices), alpha=0.025)]
    network_view = min(views, key=lambda view: view.percent(view.shift_ms))
    estimate = network_view.percent(network_view.shift_ms)
    estimate_low = network_view.percent(network_view.ci_low_ms)
    for j in range(k + 1):
        # A fail: the candidate at its fastest, minus its j slowest networks; the
        # stable at its slowest, minus its k - j fastest.
        fail_c = without_highest(counts["c_low"], j)
        fail_s = without_lowest(counts["s_high"], k - j)
        # A pass: the candidate at its slowest minus its j fastest; the stable at its
        # fastest minus its k - j slowest.
        pass_c = without_lowest(counts["c_high"], j)
        pass_s = without_highest(counts["s_low"], k - j)
        shown = intervals and j == k
        for pair, into in (((fail_c, fail_s), slower), ((pass_c, pass_s), within)):
            if pair[0].sum() >= 0.5 and pair[1].sum() >= 0.5:
                into.append(
                    shift_evidence(
                        pair[0], pair[1], limit_pct=limit_pct, alpha=alpha, interval=shown
                    )
                )
    complete_fail = len(slower) == k + 1
    complete_pass = len(within) == k + 1
    return ShiftEvidenceRobust(
        plain=plain,
        slower=complete_fail and all(e.slower for e in slower),
        within=complete_pass and all(e.within for e in within),
        harm_shown=complete_pass and all(e.slower_at_all for e in within),
        harmless=complete_pass and not (complete_fail and all(e.slower_at_all for e in slower)),
        estimate_pct=estimate,
        estimate_low_pct=estimate_low,
        ci_low_pct=slower[-1].ci_low_pct if complete_fail else -100.0,
        ci_high_pct=within[-1].ci_high_pct if complete_pass else math.inf,
        candidate_networks=total(c_low),
        stable_networks=total(s_low),
    )
