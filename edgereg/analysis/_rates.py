"""Failure rates: is the candidate's rate higher than the stable's by more than a margin?

The test is Farrington and Manning's score test for a difference of two
proportions against a margin ``delta`` (the non-inferiority test of clinical
trials). Fisher's exact test and Boschloo's test answer "are the rates
equal?", not "is the increase above one point?", so they cannot carry the
margin a guardrail declares. The score test can, and because its variance is
taken under the hypothesis (the rates constrained to differ by exactly
``delta``) it stays sensible at zero counts, where a Wald test would claim
certainty from 0 failures out of 50.

One statistic gives both one-sided p-values: ``p_worse`` for "the increase is
above the margin" (a failed guardrail) and ``p_within`` for "it is below"
(a passed one). The confidence interval is the set of margins the test does
not reject, found by bisection (the statistic falls as the margin rises).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

_NORMAL = NormalDist()


@dataclass(frozen=True)
class RateComparison:
    """Candidate rate minus stable rate, tested against a margin.

    Attributes:
        candidate_events: Candidate devices with the event (say, a failed probe).
        candidate_devices: Candidate devices that reported.
        stable_events: Stable devices with the event.
        stable_devices: Stable devices that reported.
        margin: The largest allowed increase (the guardrail's max_increase).
        difference: Candidate rate minus stable rate.
        z: The score statistic at the margin.
        p_worse: One-sided p-value of "the increase is at most the margin".
        p_within: One-sided p-value of "the increase is at least the margin".
        ci_low: Lower end of the two-sided ``1 - 2 alpha`` interval of the difference.
        ci_high: Upper end of that interval.
    """

    candidate_events: int
    candidate_devices: int
    stable_events: int
    stable_devices: int
    margin: float
    difference: float
    z: float
    p_worse: float
    p_within: float
    ci_low: float
    ci_high: float

    @property
    def candidate_rate(self) -> float:
        """The candidate arm's rate."""
        return self.candidate_events / self.candidate_devices

    @property
    def stable_rate(self) -> float:
        """The stable arm's rate."""
        return self.stable_events / self.stable_devices


def restricted_rates(
    candidate_events: int,
    candidate_devices: int,
    stable_events: int,
    stable_devices: int,
    delta: float,
) -> tuple[float, float]:
    """The maximum-likelihood rates under "candidate rate = stable rate + delta".

    The closed form of Farrington and Manning (1990): the root of a cubic in
    the candidate rate, taken in its trigonometric form.
    """
    p1 = candidate_events / candidate_devices
    p0 = stable_events / stable_devices
    if delta == 0:
        pooled = (candidate_events + stable_events) / (candidate_devices + stable_devices)
        return pooled, pooled
    theta = stable_devices / candidate_devices
    a = 1 + theta
    b = -(1 + theta + p1 + theta * p0 + delta * (theta + 2))
    c = delta * delta + delta * (2 * p1 + theta + 1) + p1 + theta * p0
    d = -p1 * delta * (1 + delta)
    v = b**3 / (27 * a**3) - b * c / (6 * a * a) + d / (2 * a)
    u_squared = max(b * b / (9 * a * a) - c / (3 * a), 0.0)
    u = math.copysign(math.sqrt(u_squared), v)
    if u == 0:
        rate1 = -b / (3 * a)
    else:
        w = (math.pi + math.acos(max(-1.0, min(1.0, v / u**3)))) / 3
        rate1 = 2 * u * math.cos(w) - b / (3 * a)
    # Rounding can leave the root a hair outside where both rates are probabilities.
    rate1 = max(max(0.0, delta), min(min(1.0, 1 + delta), rate1))
    return rate1, rate1 - delta


def score_z(
    candidate_events: int,
    candidate_devices: int,
    stable_events: int,
    stable_devices: int,
    delta: float,
) -> float:
    """Farrington-Manning's statistic: (difference - delta) / its standard error under delta."""
    difference = candidate_events / candidate_devices - stable_events / stable_devices
    rate1, rate0 = restricted_rates(
        candidate_events, candidate_devices, stable_events, stable_devices, delta
    )
    variance = rate1 * (1 - rate1) / candidate_devices + rate0 * (1 - rate0) / stable_devices
    excess = difference - delta
    if variance <= 0:
        # Only when both constrained rates are 0 or 1: the data sit exactly on delta or not.
        return 0.0 if math.isclose(excess, 0.0, abs_tol=1e-12) else math.copysign(math.inf, excess)
    return excess / math.sqrt(variance)


def compare_rates(
    candidate_events: int,
    candidate_devices: int,
    stable_events: int,
    stable_devices: int,
    *,
    margin: float,
    alpha: float,
) -> RateComparison:
    """Test whether the candidate's event rate exceeds the stable's by more than ``margin``.

    Args:
        candidate_events: Candidate devices with the event.
        candidate_devices: Candidate devices that reported (at least 1).
        stable_events: Stable devices with the event.
        stable_devices: Stable devices that reported (at least 1).
        margin: Largest allowed increase of the rate, 0 to 1.
        alpha: Significance level of each one-sided test.

    Raises:
        ValueError: an arm without devices, or more events than devices.
    """
    for events, devices, arm in (
        (candidate_events, candidate_devices, "candidate"),
        (stable_events, stable_devices, "stable"),
    ):
        if devices < 1 or not 0 <= events <= devices:
            raise ValueError(f"{arm} arm: {events} events of {devices} devices")
    counts = (candidate_events, candidate_devices, stable_events, stable_devices)
    z = score_z(*counts, margin)
    critical = _NORMAL.inv_cdf(1 - alpha)
    return RateComparison(
        *counts,
        margin=margin,
        difference=candidate_events / candidate_devices - stable_events / stable_devices,
        z=z,
        p_worse=_upper_tail(z),
        p_within=_upper_tail(-z),
        ci_low=_invert(counts, critical),
        ci_high=_invert(counts, -critical),
    )


def _upper_tail(z: float) -> float:
    return 0.5 * math.erfc(z / math.sqrt(2))


def _invert(counts: tuple[int, int, int, int], target: float) -> float:
    """The margin where the statistic equals ``target`` (it falls as the margin rises)."""
    low, high = -1.0, 1.0
    # The score is unbounded at the ends: clamp there so the bracket always holds.
    if score_z(*counts, low + 1e-12) <= target:
        return low
    if score_z(*counts, high - 1e-12) >= target:
        return high
    for _ in range(60):
        middle = (low + high) / 2
        if score_z(*counts, middle) > target:
            low = middle
        else:
            high = middle
    return (low + high) / 2
