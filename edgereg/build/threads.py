"""Thread counts by measurement: which counts the benchmark sweeps, and which it recommends.

Phones differ in which thread count is fastest (often 2-4: past the big
cores, more threads wait on little ones). The benchmark times each count from
1 up to the tier's core count, capped by the build host's, and recommends the
smallest count within :data:`WITHIN` of the best: more threads than that cost
the app battery and contention for almost nothing. These are host figures: the
curve on an x86 build machine is a hint, not a phone's curve.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

#: A count is as good as the best when its p50 is within this fraction of it.
WITHIN = 0.05
#: The sweep's upper end for a tier that does not say its core count (the catch-all).
DEFAULT_TIER_CORES = 4


def host_cores() -> int:
    """CPU cores this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def sweep_counts(tier_cores: int | None, host: int | None = None) -> tuple[int, ...]:
    """1 up to the tier's cores (:data:`DEFAULT_TIER_CORES` when unsaid), capped by the host."""
    top = min(tier_cores or DEFAULT_TIER_CORES, host if host is not None else host_cores())
    return tuple(range(1, max(top, 1) + 1))


def recommend(p50_ms: Mapping[int, float], counts: tuple[int, ...]) -> int | None:
    """The smallest of ``counts`` whose p50 is within :data:`WITHIN` of the best of them."""
    measured = {n: p50_ms[n] for n in counts if n in p50_ms}
    if not measured:
        return None
    best = min(measured.values())
    return min(n for n, value in measured.items() if value <= best * (1.0 + WITHIN))
