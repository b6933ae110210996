"""Latencies: Mann-Whitney U and the Hodges-Lehmann shift, straight from binned histograms.

The guardrail's verdict and interval come from :mod:`edgereg.analysis._bands`
(valid at any look); these fixed-sample statistics are the estimate and the
numbers shown beside it.

The store hands over histograms (bucket index -> devices), not values. Both
statistics are computed from the counts directly, never by expanding them
into one value per device: a million devices then cost a pass over at most
a few hundred buckets (U) and a sort of the bucket pairs (the shift), instead
of a million-element array and its sort. The results are exactly those of
``scipy.stats.mannwhitneyu(..., method="asymptotic")`` and of the median of
all pairwise differences on the expanded values (tests/test_analysis.py
checks both): every value of a bucket is its representative, so ties are
whole buckets.

U uses the normal approximation with the tie correction and a continuity
correction; at the sample sizes a guardrail can pass with (``min_devices``,
50 by default, per arm) it is accurate to well below the significance levels
in use. The confidence interval of the shift is Lehmann's: the order
statistics of the pairwise differences at the ranks where U would be
significant, so "the interval lies above the margin" is the rank test of
"the candidate is slower by more than the margin".
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from edgereg.reports.summary import bucket_value_ms

_NORMAL = NormalDist()

Histogram = Mapping[int, int]
"""Bucket index (:func:`edgereg.reports.summary.latency_bucket`) -> devices."""


@dataclass(frozen=True)
class ShiftComparison:
    """How much slower the candidate arm is than the stable arm.

    Attributes:
        candidate_devices: Candidate devices with a value.
        stable_devices: Stable devices with a value.
        candidate_median_ms: The candidate arm's median.
        stable_median_ms: The stable arm's median.
        u: Mann-Whitney U of the candidate (pairs where it is slower, ties count half).
        p_slower: One-sided p-value of "the candidate is not slower".
        shift_ms: Hodges-Lehmann estimate: median of candidate minus stable over all pairs.
        ci_low_ms: Lower end of the two-sided ``1 - 2 alpha`` interval of the shift.
        ci_high_ms: Upper end of that interval.
    """

    candidate_devices: int
    stable_devices: int
    candidate_median_ms: float
    stable_median_ms: float
    u: float
    p_slower: float
    shift_ms: float
    ci_low_ms: float
    ci_high_ms: float

    def percent(self, ms: float) -> float:
        """A shift in percent of the stable median."""
        return 100 * ms / self.stable_median_ms


def _arrays(histogram: Histogram) -> tuple[np.ndarray, np.ndarray]:
    buckets = sorted(index for index, count in histogram.items() if count > 0)
    values = np.array([bucket_value_ms(index) for index in buckets], dtype=np.float64)
    counts = np.array([histogram[index] for index in buckets], dtype=np.float64)
    return values, counts


def total(histogram: Histogram) -> int:
    """The devices in a histogram."""
    return sum(count for count in histogram.values() if count > 0)


def median_ms(histogram: Histogram) -> float:
    """The median of the values a histogram holds (the mean of the middle two when even)."""
    values, counts = _arrays(histogram)
    return _median(values, counts)


def _order_statistic(values: np.ndarray, cumulative: np.ndarray, rank: float) -> float:
    """The value of 1-based ``rank`` among weighted sorted values."""
    index = int(np.searchsorted(cumulative, rank, side="left"))
    return float(values[min(index, len(values) - 1)])


def _median(values: np.ndarray, counts: np.ndarray) -> float:
    cumulative = np.cumsum(counts)
    n = cumulative[-1]
    return (
        _order_statistic(values, cumulative, math.floor((n + 1) / 2))
        + _order_statistic(values, cumulative, math.ceil((n + 1) / 2))
    ) / 2


def mann_whitney(candidate: Histogram, stable: Histogram) -> tuple[float, float, float]:
    """U of the candidate, its tie-corrected standard deviation, and the one-sided p-value.

    The alternative is "candidate values tend to be larger" (slower).
    """
    buckets = sorted({*candidate, *stable})
    c = np.array([max(candidate.get(index, 0), 0) for index in buckets], dtype=np.float64)
    s = np.array([max(stable.get(index, 0), 0) for index in buckets], dtype=np.float64)
    n1, n0 = c.sum(), s.sum()
    below = np.cumsum(s) - s  # stable devices in lower buckets
    u = float(np.sum(c * (below + s / 2)))
    n = n1 + n0
    ties = c + s
    correction = float(np.sum(ties**3 - ties)) / (n * (n - 1)) if n > 1 else 0.0
    sd = math.sqrt(max(n1 * n0 / 12 * ((n + 1) - correction), 0.0))
    excess = u - n1 * n0 / 2 - 0.5  # the continuity correction, as scipy's default
    if sd == 0:
        return u, sd, 1.0 if excess < 0 else 0.5
    return u, sd, 0.5 * math.erfc(excess / sd / math.sqrt(2))


def compare_latency(candidate: Histogram, stable: Histogram, *, alpha: float) -> ShiftComparison:
    """The Mann-Whitney test and Hodges-Lehmann shift of two latency histograms.

    Raises:
        ValueError: an arm without values.
    """
    c_values, c_counts = _arrays(candidate)
    s_values, s_counts = _arrays(stable)
    if not len(c_values) or not len(s_values):
        raise ValueError("both arms need at least one latency value")
    u, sd, p_slower = mann_whitney(candidate, stable)
    # Every pair of buckets is one difference, weighted by how many device pairs it stands for.
    differences = np.subtract.outer(c_values, s_values).ravel()
    weights = np.multiply.outer(c_counts, s_counts).ravel()
    order = np.argsort(differences, kind="stable")
    differences, cumulative = differences[order], np.cumsum(weights[order])
    pairs = float(cumulative[-1])
    shift = (
        _order_statistic(differences, cumulative, math.floor((pairs + 1) / 2))
        + _order_statistic(differences, cumulative, math.ceil((pairs + 1) / 2))
    ) / 2
    # Lehmann's interval: ranks k and pairs + 1 - k, k from U's null distribution.
    k = max(1.0, math.floor(pairs / 2 - _NORMAL.inv_cdf(1 - alpha) * sd))
    return ShiftComparison(
        candidate_devices=int(c_counts.sum()),
        stable_devices=int(s_counts.sum()),
        candidate_median_ms=_median(c_values, c_counts),
        stable_median_ms=_median(s_values, s_counts),
        u=u,
        p_slower=p_slower,
        shift_ms=shift,
        ci_low_ms=_order_statistic(differences, cumulative, k),
        ci_high_ms=_order_statistic(differences, cumulative, pairs + 1 - k),
    )
