"""Means of values in [0, 1]: is the candidate's mean above the stable's by more than a margin?

What an app metric's guardrail judges: each network's mean statistic (a
success rate, a share of values below an edge, a mean mapped onto [0, 1]),
as a share of "worse". The binomial evidence of :mod:`edgereg.analysis._rates`
stays valid for such values but treats each one as a coin flip of its mean,
whose variance ``p (1 - p)`` is many times the real spread of a device's
success rate over dozens of events (twenty times, for a 92 % rate over
twenty events): a 3-point drop would need twenty times the devices to show.
So the evidence here estimates the spread.

It is a mixture sequential probability ratio test on the difference of the
two arms' means with a normal mixing distribution (Robbins 1970; the mSPRT
of Johari, Pekelis and Walsh, "Always valid inference", Operations Research
2022, which A/B testing platforms run): with ``V`` the variance of the
difference (each arm's sample variance over its count) and ``tau^2`` the
mixture's variance,

    Lambda(theta0) = sqrt(V / (V + tau^2)) * exp(tau^2 (d - theta0)^2 / (2 V (V + tau^2)))

is the evidence against the difference being ``theta0`` at the observed
difference ``d``; ``p = min(1, 1 / Lambda)`` is valid at every look (Ville's
inequality) as the counts grow, and the set of ``theta0`` it does not reject
at ``alpha`` is a confidence sequence. The validity is asymptotic (the
variance is estimated and the means are nearly normal), which is why a
verdict also needs ``min_networks`` beyond the tolerated ones per arm; the
A/A rate is measured in benchmarks/canary.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from edgereg.analysis._rates import RateComparison

__all__ = ["MeanArm", "compare_means", "log_evidence", "mixture_scale", "standard_error"]

#: The smallest variance of a mean in [0, 1] the evidence assumes: a handful of
#: networks that happen to agree must not look like certainty.
_VARIANCE_FLOOR = 1e-4


@dataclass(frozen=True)
class MeanArm:
    """One arm's values in [0, 1]: their sum, the sum of their squares, and how many."""

    total: float
    squares: float
    count: int

    @property
    def mean(self) -> float:
        return self.total / self.count

    @property
    def variance(self) -> float:
        """The sample variance (unbiased), floored."""
        if self.count < 2:
            return 0.25
        spread = (self.squares - self.total * self.total / self.count) / (self.count - 1)
        return min(0.25, max(_VARIANCE_FLOOR, spread))


def mixture_scale(margin: float) -> float:
    """The mixture's standard deviation ``tau``: differences of the size a limit is set at.

    The evidence is strongest for differences near ``tau``; a guardrail's limit
    says what size matters (at least 1 point).
    """
    return max(2 * margin, 0.01)


def _variance(candidate: MeanArm, stable: MeanArm) -> float:
    return candidate.variance / candidate.count + stable.variance / stable.count


def log_evidence(candidate: MeanArm, stable: MeanArm, theta: float, tau: float) -> float:
    """The log of the mixture's evidence against the difference being ``theta``."""
    v = _variance(candidate, stable)
    t2 = tau * tau
    d = candidate.mean - stable.mean
    return 0.5 * math.log(v / (v + t2)) + t2 * (d - theta) ** 2 / (2 * v * (v + t2))


def compare_means(
    candidate: MeanArm,
    stable: MeanArm,
    *,
    margin: float,
    alpha: float,
    interval: bool = True,
) -> RateComparison:
    """The candidate's mean minus the stable's against ``margin``, as a rate comparison reads.

    Raises:
        ValueError: an arm without values.
    """
    if candidate.count < 1 or stable.count < 1:
        raise ValueError("each arm needs at least one value")
    tau = mixture_scale(margin)
    d = candidate.mean - stable.mean
    evidence = max(0.0, log_evidence(candidate, stable, margin, tau))
    p = min(1.0, math.exp(-evidence))
    if interval:
        v = _variance(candidate, stable)
        t2 = tau * tau
        radius = math.sqrt(
            2 * v * (v + t2) / t2 * (math.log(1 / alpha) + 0.5 * math.log((v + t2) / v))
        )
        low, high = d - radius, d + radius
    else:
        low = high = math.nan
    return RateComparison(
        candidate_events=candidate.total,
        candidate_devices=candidate.count,
        stable_events=stable.total,
        stable_devices=stable.count,
        margin=margin,
        difference=d,
        log_evidence=evidence,
        p_worse=p if d > margin else 1.0,
        p_within=p if d < margin else 1.0,
        ci_low=low,
        ci_high=high,
    )


def standard_error(candidate: MeanArm, stable: MeanArm) -> float:
    """The difference's standard error at one look."""
    return math.sqrt(_variance(candidate, stable))
