"""What the canary analysis reads from the report store: per-arm counts and latency histograms.

The store aggregates in the database (one row per device, the latest report
per token) and hands the analysis :class:`ArmSummary` values, never raw rows,
so analysing a million reports costs a GROUP BY, not a million objects.
Latencies are binned on :data:`LATENCY_EDGES_MS` (log-spaced, 2.5% apart), fine
enough that a rank test on the bins matches one on the raw values to the
resolution the guardrails are set at.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["LATENCY_EDGES_MS", "ArmSummary", "bucket_value_ms", "latency_bucket"]

_STEP = 1.025
LATENCY_EDGES_MS: tuple[float, ...] = tuple(
    0.05 * _STEP**i for i in range(int(math.log(600_000 / 0.05, _STEP)) + 1)
)
"""Upper edges of the latency buckets, 0.05 ms to 10 minutes: bucket i is (edge[i-1], edge[i]]."""


def latency_bucket(ms: float) -> int:
    """The bucket index of a latency (values beyond the last edge go to the last bucket)."""
    return min(bisect.bisect_left(LATENCY_EDGES_MS, ms), len(LATENCY_EDGES_MS) - 1)


def bucket_value_ms(index: int) -> float:
    """A bucket's representative latency: the geometric middle of its edges."""
    upper = LATENCY_EDGES_MS[index]
    return upper / math.sqrt(_STEP) if index else upper / 2


@dataclass(frozen=True)
class ArmSummary:
    """One arm (candidate or stable) of one tier, over the devices that reported.

    Attributes:
        unit: The model or bundle.
        tier: The device tier.
        arm: ``candidate`` or ``stable``.
        version: The unit version the arm ran.
        devices: Distinct report tokens (one per install).
        probe_failed: Devices whose self-test failed on every backend (model rejected).
        load_failed: Devices where loading the model failed.
        reverted: Devices that reverted the model (unconfirmed after the app's declared
            starts, or reverted by the app): the revert guardrail's failing devices.
        confirmed: Devices that confirmed the model after a real inference.
        sources: Distinct source networks of the devices (0: unknown, as for
            reports through an untrusted proxy or from before schema 2).
        sourced_devices: Devices whose source network is known.
        probe_failed_sources: Distinct source networks of the probe failures.
        load_failed_sources: Distinct source networks of the load failures.
        reverted_sources: Distinct source networks of the reverts.
        stalled: Devices not confirmed after the unconfirmed guardrail's
            ``stalled_starts`` app starts (report schema 2's ``unconfirmed_starts``),
            reverted since or not: its failing devices.
        stalled_sources: Distinct source networks of the stalled devices.
        aged_devices: Devices that first reported long enough ago to have
            crash-looped (the revert guardrail's denominator), or None when not
            counted (then every device is).
        aged_reverted: Those of them that reverted.
        aged_reverted_sources: Distinct source networks of those reverts.
        aged_sources: Distinct source networks of the aged devices.
        aged_stalled: The aged devices that stalled.
        aged_stalled_sources: Distinct source networks of those.
        load_ms: Bucket index -> devices, of each device's load time.
        inference_p50_ms: Bucket index -> devices, of each device's median inference time.
        memory_peak_mb: Bucket index -> devices, of each device's peak memory in MB (the
            latency buckets, read as MB; report schema 2's ``memory_peak_mb``).
    """

    unit: str
    tier: str
    arm: Literal["candidate", "stable"]
    version: str
    devices: int
    probe_failed: int = 0
    load_failed: int = 0
    reverted: int = 0
    confirmed: int = 0
    sources: int = 0
    sourced_devices: int = 0
    probe_failed_sources: int = 0
    load_failed_sources: int = 0
    reverted_sources: int = 0
    aged_devices: int | None = None
    aged_reverted: int = 0
    aged_reverted_sources: int = 0
    aged_sources: int = 0
    stalled: int = 0
    stalled_sources: int = 0
    aged_stalled: int = 0
    aged_stalled_sources: int = 0
    load_ms: dict[int, int] = field(default_factory=dict)
    inference_p50_ms: dict[int, int] = field(default_factory=dict)
    memory_peak_mb: dict[int, int] = field(default_factory=dict)
