"""Failure rates: is the candidate's rate higher than the stable's by more than a margin?

The evidence is an always-valid likelihood ratio (a mixture sequential
probability ratio test), so its verdicts hold however often they are looked
at and however few devices there are:

- Each arm's devices are Bernoulli draws with the arm's rate. For a pair of
  rates ``(q1, q0)``, the mixture martingale of an arm with ``x`` events in
  ``n`` devices is ``M(q) = mean_b B(a + x, b + n - x) / B(a, b) / (q^x (1 - q)^(n - x))``
  (the prior-weighted likelihood of every rate over the likelihood of ``q``,
  averaged over the priors of :data:`PRIOR_BS`; Robbins 1970). Under the
  true rate it has expectation 1 after any number of devices, and so has the
  product of the two arms' (one factor moves at a time).
- Ville's inequality: a non-negative martingale that starts at 1 ever reaches
  ``1 / alpha`` with probability at most ``alpha``. So "reject the rates
  ``(q1, q0)`` once ``M1(q1) M0(q0) >= 1 / alpha``" errs with probability at
  most ``alpha`` over the whole sequence of looks, not per look, and with no
  normal approximation: it is exact at one device.
- A composite hypothesis (``q1 - q0 <= margin``: the candidate is within the
  limit) is rejected when the smallest product over it reaches ``1 / alpha``.
  That smallest product sits on the boundary ``q1 - q0 = margin``, at the
  maximum-likelihood rates constrained to differ by the margin: Farrington
  and Manning's restricted estimate (1990), a closed-form root of a cubic.

``p_worse = min(1, 1 / inf M)`` over "within the limit" is an always-valid
p-value of a failed guardrail, ``p_within`` the same over "above the limit"
for a passed one, and the interval is the set of margins neither rejects: a
``1 - alpha`` confidence sequence for the difference (Howard, Ramdas,
McAuliffe and Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence
sequences", Ann. Statist. 2021, §3; Waudby-Smith and Ramdas 2024 for the
binary case). The priors are Jeffreys' Beta(1/2, 1/2) and four Beta(1/2, b)
that spend their mass where failure rates live (near 0), averaged.

What it assumes: each device's outcome is a draw of its arm's rate,
independent of the order in which devices report. docs/operations/canary-analysis.md
says what that means in the field.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

#: The priors on each arm's rate: Beta(1/2, b) for each b, averaged. b = 1/2 is
#: Jeffreys' prior; the larger ones put their mass near the small rates failures
#: have (their means: 50 %, 4.8 %, 0.5 %, 0.05 %, 0.005 %), so the evidence does
#: not pay for rates no release has. An average of five costs at most log 5
#: against the best of them.
PRIOR_A = 0.5
PRIOR_BS = (0.5, 10.0, 100.0, 1000.0, 10000.0)


@dataclass(frozen=True)
class RateComparison:
    """Candidate rate minus stable rate, tested against a margin with always-valid evidence.

    Attributes:
        candidate_events: Candidate devices with the event (say, a failed probe).
        candidate_devices: Candidate devices that reported.
        stable_events: Stable devices with the event.
        stable_devices: Stable devices that reported.
        margin: The largest allowed increase (the guardrail's max_increase).
        difference: Candidate rate minus stable rate.
        log_evidence: Natural log of the smallest likelihood ratio against the
            side of the margin the data are not on (0 when they sit on it).
        p_worse: Always-valid p-value of "the increase is at most the margin".
        p_within: Always-valid p-value of "the increase is at least the margin".
        ci_low: Lower end of the ``1 - alpha`` confidence sequence of the difference.
        ci_high: Upper end of it.
    """

    candidate_events: float
    candidate_devices: int
    stable_events: float
    stable_devices: int
    margin: float
    difference: float
    log_evidence: float
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


@dataclass(frozen=True)
class RateLimitCheck:
    """One arm's rate against an absolute limit, with always-valid evidence.

    Attributes:
        events: Devices with the event.
        devices: Devices that reported.
        limit: The highest acceptable rate.
        p_above: Always-valid p-value of "the rate is at most the limit".
        p_below: Always-valid p-value of "the rate is at least the limit".
        ci_low: Lower end of the ``1 - alpha`` confidence sequence of the rate.
        ci_high: Upper end of it.
    """

    events: float
    devices: int
    limit: float
    p_above: float
    p_below: float
    ci_low: float
    ci_high: float

    @property
    def rate(self) -> float:
        """The arm's rate."""
        return self.events / self.devices


def restricted_rates(
    candidate_events: float,
    candidate_devices: int,
    stable_events: float,
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


def _log_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


_LOG_PRIORS = tuple((b, _log_beta(PRIOR_A, b)) for b in PRIOR_BS)
_LOG_COUNT = math.log(len(PRIOR_BS))


@functools.lru_cache(maxsize=1 << 16)
def log_mixture(events: float, devices: int) -> float:
    """Log of the mixture likelihood of ``events`` in ``devices`` (the martingale's numerator).

    The average over the priors Beta(1/2, b), b in :data:`PRIOR_BS`, of each
    prior's Beta-binomial likelihood (the average of martingales is one).
    """
    terms = [
        _log_beta(PRIOR_A + events, b + devices - events) - log_prior
        for b, log_prior in _LOG_PRIORS
    ]
    top = max(terms)
    return top + math.log(sum(math.exp(t - top) for t in terms)) - _LOG_COUNT


def log_likelihood(events: float, devices: int, rate: float) -> float:
    """Log of ``rate^events (1 - rate)^(devices - events)``, with 0 log 0 = 0."""
    total = 0.0
    for count, chance in ((events, rate), (devices - events, 1.0 - rate)):
        if count:
            if chance <= 0:
                return -math.inf
            total += count * math.log(chance)
    return total


def log_ratio(
    candidate_events: float,
    candidate_devices: int,
    stable_events: float,
    stable_devices: int,
    delta: float,
) -> float:
    """Log of the smallest product martingale over the rate pairs that differ by ``delta``."""
    counts = (candidate_events, candidate_devices, stable_events, stable_devices)
    rate1, rate0 = restricted_rates(*counts, delta)
    return (
        log_mixture(candidate_events, candidate_devices)
        + log_mixture(stable_events, stable_devices)
        - log_likelihood(candidate_events, candidate_devices, rate1)
        - log_likelihood(stable_events, stable_devices, rate0)
    )


def _p(log_evidence: float) -> float:
    return 1.0 if log_evidence <= 0 else math.exp(-log_evidence)


def _check_counts(events: float, devices: int, arm: str) -> None:
    if devices < 1 or not 0 <= events <= devices:
        raise ValueError(f"{arm} arm: {events} events of {devices} devices")


def compare_rates(
    candidate_events: float,
    candidate_devices: int,
    stable_events: float,
    stable_devices: int,
    *,
    margin: float,
    alpha: float,
    interval: bool = True,
) -> RateComparison:
    """Test whether the candidate's event rate exceeds the stable's by more than ``margin``.

    Args:
        candidate_events: Candidate devices with the event.
        candidate_devices: Candidate devices that reported (at least 1).
        stable_events: Stable devices with the event.
        stable_devices: Stable devices that reported (at least 1).
        margin: Largest allowed increase of the rate, 0 to 1.
        alpha: The error allowed over every look (the interval is ``1 - alpha``).
        interval: False to skip the confidence sequence (NaN): the p-values cost
            one evaluation each, the interval two bisections.

    Raises:
        ValueError: an arm without devices, or more events than devices.
    """
    _check_counts(candidate_events, candidate_devices, "candidate")
    _check_counts(stable_events, stable_devices, "stable")
    counts = (candidate_events, candidate_devices, stable_events, stable_devices)
    difference = candidate_events / candidate_devices - stable_events / stable_devices
    evidence = log_ratio(*counts, margin)
    target = math.log(1 / alpha)
    return RateComparison(
        *counts,
        margin=margin,
        difference=difference,
        log_evidence=max(0.0, evidence),
        p_worse=_p(evidence) if difference > margin else 1.0,
        p_within=_p(evidence) if difference < margin else 1.0,
        ci_low=_edge(lambda delta: log_ratio(*counts, delta), difference, -1.0, target)
        if interval
        else math.nan,
        ci_high=_edge(lambda delta: log_ratio(*counts, delta), difference, 1.0, target)
        if interval
        else math.nan,
    )


def check_rate_limit(
    events: float, devices: int, *, limit: float, alpha: float, interval: bool = True
) -> RateLimitCheck:
    """Test one arm's rate against an absolute limit (no other arm needed).

    The same martingale with one factor: ``M(limit) >= 1 / alpha`` rejects the limit.
    Without ``interval`` the confidence sequence is not computed (NaN): the
    p-values cost one evaluation, the interval a bisection.

    Raises:
        ValueError: no devices, or more events than devices.
    """
    _check_counts(events, devices, "the")
    rate = events / devices

    def evidence(value: float) -> float:
        return log_mixture(events, devices) - log_likelihood(events, devices, value)

    at_limit = evidence(limit)
    target = math.log(1 / alpha)
    return RateLimitCheck(
        events,
        devices,
        limit,
        p_above=_p(at_limit) if rate > limit else 1.0,
        p_below=_p(at_limit) if rate < limit else 1.0,
        ci_low=_edge(evidence, rate, 0.0, target) if interval else math.nan,
        ci_high=_edge(evidence, rate, 1.0, target) if interval else math.nan,
    )


def _edge(evidence: Callable[[float], float], start: float, end: float, target: float) -> float:
    """Where the evidence reaches ``target`` between the estimate and ``end`` (it rises outward)."""
    if evidence(end) < target:
        return end
    near, far = start, end
    for _ in range(32):
        middle = (near + far) / 2
        if evidence(middle) < target:
            near = middle
        else:
            far = middle
    return (near + far) / 2
