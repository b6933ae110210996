"""Latency shifts with evidence valid at any look: time-uniform confidence bands of each arm's CDF.

A latency guardrail asks whether the candidate is slower than the stable by
more than a limit ``L`` (in percent of the stable). Read as a scale shift,
"at most ``L`` slower" means that for every latency ``u``

    P(candidate > u) <= P(stable > u / (1 + L))

and "more than ``L`` slower" the reverse inequality everywhere. One latency
``u`` where the data show the reverse, with certainty ``1 - alpha`` that
holds whatever ``u`` was chosen and however often the data were looked at,
is then a fail; one where they show the inequality is a pass.

That certainty comes from a confidence band around each arm's empirical CDF
that holds at every sample size at once: with probability at least
``1 - a``, for every ``t >= 1`` and every ``x``,

    |F_t(x) - F(x)| <= 0.85 sqrt((log log(e t) + 0.8 log(1612 / a)) / t)

(Howard and Ramdas, "Sequential estimation of quantiles with applications to
A/B-testing and best-arm identification", Bernoulli 28(3), 2022, Theorem 2:
a time-uniform Dvoretzky-Kiefer-Wolfowitz inequality). It holds for any
distribution, ties and binned values included, and because it is uniform in
``x`` the latency ``u`` may be picked from the data. Each arm gets
``a = alpha / 2``, so both bands hold together with probability ``1 - alpha``
over every look: running ``--auto`` every 30 minutes does not raise the error.

The store hands over histograms on fixed bucket edges (:mod:`edgereg.reports.summary`);
the CDF is exact at the edges, and a point between two edges is bounded by
them (the CDF is monotone), which only makes either verdict harder. The
interval of the shift is the set of shifts neither test rejects.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from edgereg.analysis._ranks import Histogram
from edgereg.reports.summary import LATENCY_EDGES_MS

_EDGES = np.array(LATENCY_EDGES_MS, dtype=np.float64)
_LOG_EDGES = np.log(_EDGES)


def band(devices: int, alpha: float) -> float:
    """Half-width of an arm's time-uniform ``1 - alpha`` CDF band after ``devices`` values."""
    if devices < 1:
        return 1.0
    return min(
        1.0,
        0.85
        * math.sqrt(
            (math.log(math.log(math.e * devices)) + 0.8 * math.log(1612 / alpha)) / devices
        ),
    )


@dataclass(frozen=True)
class ShiftEvidence:
    """What the bands say about the candidate's slowdown, valid at any look.

    Attributes:
        candidate_devices: Candidate devices with a value.
        stable_devices: Stable devices with a value.
        slower: The bands show the candidate slower than the limit (a fail).
        within: The bands show it at most the limit slower (a pass).
        ci_low_pct: The largest slowdown shown (percent; -100 when none; NaN
            when not asked for).
        ci_high_pct: The smallest slowdown shown not reached (percent; inf when
            none; NaN when not asked for).
        slower_at_all: The bands show the candidate slower than the stable at all
            (the interval's lower end above 0: a harm shown).
    """

    candidate_devices: int
    stable_devices: int
    slower: bool
    within: bool
    ci_low_pct: float
    ci_high_pct: float
    slower_at_all: bool = False


def counts_of(histogram: Histogram) -> np.ndarray:
    """A histogram as counts per edge index (the layout the bands read)."""
    if not histogram:
        return np.zeros(len(_EDGES))
    index = np.clip(np.fromiter(histogram.keys(), dtype=np.int64), 0, len(_EDGES) - 1)
    weight = np.maximum(np.fromiter(histogram.values(), dtype=np.float64), 0.0)
    return np.bincount(index, weights=weight, minlength=len(_EDGES))


def without_highest(counts: np.ndarray, number: int) -> np.ndarray:
    """``counts`` without its ``number`` highest values."""
    if number <= 0:
        return counts
    above = np.cumsum(counts[::-1])[::-1]  # values in this bucket or higher
    taken = np.clip(number - (above - counts), 0, counts)
    return np.asarray(counts - taken)


def without_lowest(counts: np.ndarray, number: int) -> np.ndarray:
    """``counts`` without its ``number`` lowest values."""
    if number <= 0:
        return counts
    below = np.cumsum(counts)  # values in this bucket or lower
    taken = np.clip(number - (below - counts), 0, counts)
    return np.asarray(counts - taken)


def _survival(counts: np.ndarray) -> tuple[np.ndarray, int]:
    """P(value > edge[i]) for every edge index, and the devices."""
    total = round(float(counts.sum()))
    if total == 0:
        return np.ones(len(_EDGES)), 0
    return 1.0 - np.cumsum(counts) / counts.sum(), total


class _Bands:
    def __init__(self, candidate: np.ndarray, stable: np.ndarray, alpha: float) -> None:
        self.c, self.n1 = _survival(candidate)
        self.s, self.n0 = _survival(stable)
        self.e1 = band(self.n1, alpha / 2)
        self.e0 = band(self.n0, alpha / 2)

    def shown_slower(self, shift: float) -> bool:
        """Some u with P(C > u) surely above P(S > u / (1 + shift)): slower than ``shift``."""
        # P(S > x) <= P(S > the edge at or below x): the stable's side taken at its largest.
        below, valid = _below(shift)
        stable = np.where(valid, self.s[below], 1.0)
        return bool(np.any(self.c - self.e1 > stable + self.e0))

    def shown_within(self, shift: float) -> bool:
        """Some u with P(C > u) surely below P(S > u / (1 + shift)): at most ``shift`` slower."""
        # P(S > x) >= P(S > the edge at or above x): the stable's side taken at its smallest.
        above, valid = _above(shift)
        stable = np.where(valid, self.s[above], 0.0)
        return bool(np.any(self.c + self.e1 < stable - self.e0))


@functools.lru_cache(maxsize=256)
def _below(shift: float) -> tuple[np.ndarray, np.ndarray]:
    """For each edge x, the index of the edge at or below x / (1 + shift), and whether any is."""
    below = np.searchsorted(_LOG_EDGES, _LOG_EDGES - math.log1p(shift), side="right") - 1
    return np.clip(below, 0, None), below >= 0


@functools.lru_cache(maxsize=256)
def _above(shift: float) -> tuple[np.ndarray, np.ndarray]:
    """For each edge x, the index of the edge at or above x / (1 + shift), and whether any is."""
    above = np.searchsorted(_LOG_EDGES, _LOG_EDGES - math.log1p(shift), side="left")
    return np.clip(above, None, len(_EDGES) - 1), above < len(_EDGES)


def shift_evidence(
    candidate: Histogram | np.ndarray,
    stable: Histogram | np.ndarray,
    *,
    limit_pct: float,
    alpha: float,
    interval: bool = True,
) -> ShiftEvidence:
    """Test "the candidate is at most ``limit_pct`` percent slower" with always-valid bands.

    Each arm is a histogram, or its counts per edge index (:func:`counts_of`).
    Without ``interval`` the confidence sequence of the shift is not searched
    for (NaN): the verdicts cost a few comparisons, the interval two bisections.

    Raises:
        ValueError: an arm without values.
    """
    bands = _Bands(
        candidate if isinstance(candidate, np.ndarray) else counts_of(candidate),
        stable if isinstance(stable, np.ndarray) else counts_of(stable),
        alpha,
    )
    if not bands.n1 or not bands.n0:
        raise ValueError("both arms need at least one latency value")
    limit = limit_pct / 100
    return ShiftEvidence(
        candidate_devices=bands.n1,
        stable_devices=bands.n0,
        slower=bands.shown_slower(limit),
        within=bands.shown_within(limit),
        ci_low_pct=100 * _edge(bands.shown_slower, low=True) if interval else math.nan,
        ci_high_pct=100 * _edge(bands.shown_within, low=False) if interval else math.nan,
        slower_at_all=bands.shown_slower(0.0),
    )


#: The shifts the interval is searched over: -99 % to +1,000 %.
_LOWEST, _HIGHEST = -0.99, 10.0


def _edge(test: Callable[[float], bool], *, low: bool) -> float:
    """The boundary of the shifts ``test`` holds for (monotone in the shift), by bisection."""
    if low:
        # shown_slower holds for small shifts and stops holding past the evidence.
        if not test(_LOWEST):
            return -1.0
        if test(_HIGHEST):
            return _HIGHEST
        inside, outside = _LOWEST, _HIGHEST
    else:
        # shown_within holds for large shifts and stops holding below the evidence.
        if not test(_HIGHEST):
            return math.inf
        if test(_LOWEST):
            return _LOWEST
        inside, outside = _HIGHEST, _LOWEST
    for _ in range(40):
        middle = (inside + outside) / 2
        if test(middle):
            inside = middle
        else:
            outside = middle
    return inside
