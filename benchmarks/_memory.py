"""Memory measurements the benchmark scripts share (Linux /proc; ru_maxrss elsewhere)."""

from __future__ import annotations

import gc
import os
import resource
import sys
import threading
from collections.abc import Callable


def current_rss() -> int:
    """Resident set size of this process now, in bytes (elsewhere than Linux: the peak)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def peak_growth(work: Callable[[], object]) -> int:
    """Bytes the resident set grows by, at its peak, while ``work`` runs.

    Sampled every millisecond against the size just before, so memory held by
    imports made earlier (which ru_maxrss would include) does not count.
    """
    gc.collect()
    baseline = peak = current_rss()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.001):
            peak = max(peak, current_rss())

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return max(peak, current_rss()) - baseline
