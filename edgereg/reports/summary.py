"""What the canary analysis reads from the report store: per-arm counts and latency histograms.

The store aggregates in the database (one row per install, merged from its
reports) and hands the analysis :class:`ArmSummary` values, never raw rows,
so analysing a million reports costs a GROUP BY, not a million objects.

Every count comes twice: per device, for people to read, and per **source
network** (an IPv4 /24, an IPv6 /48; a device whose network is unknown is a
network of its own), which is what verdicts rest on. A network counts as one
observation, whatever number of devices (or forged tokens) it holds: its
share of each event is the share of its devices that had it, and each
latency histogram is kept twice, with each network at its fastest device
and at its slowest. Both arms are counted alike, so a forger's thousand
tokens from one /24 weigh what one device does, in either arm
(docs/operations/report-threats.md).

Latencies are binned on :data:`LATENCY_EDGES_MS` (log-spaced, 2.5% apart),
fine enough that a rank test on the bins matches one on the raw values to
the resolution the guardrails are set at.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Literal, Protocol

from edgereg.config import BUILTIN_GUARDRAILS

__all__ = [
    "CONFIRMED",
    "EVENTS",
    "HISTOGRAMS",
    "LATENCY_EDGES_MS",
    "ArmSummary",
    "Histogram",
    "MetricTally",
    "Statistic",
    "SummarySource",
    "Tally",
    "bucket_value_ms",
    "latency_bucket",
]

_STEP = 1.025
LATENCY_EDGES_MS: tuple[float, ...] = tuple(
    0.05 * _STEP**i for i in range(int(math.log(600_000 / 0.05, _STEP)) + 1)
)
"""Upper edges of the latency buckets, 0.05 ms to 10 minutes: bucket i is (edge[i-1], edge[i]]."""

#: The store's count of installs the app confirmed (after a real inference): no
#: guardrail's, counted beside theirs (a bundle's install is confirmed when every member is).
CONFIRMED = "confirmed"

EVENTS: tuple[str, ...] = (
    *(spec.event for spec in BUILTIN_GUARDRAILS if spec.test == "rate"),
    CONFIRMED,
)
"""What the store counts per install: each rate guardrail's event
(:attr:`~edgereg.config.BuiltinGuardrail.event`, counted as its
:attr:`~edgereg.config.BuiltinGuardrail.when` says), and :data:`CONFIRMED`."""

HISTOGRAMS: tuple[str, ...] = tuple(
    spec.histogram for spec in BUILTIN_GUARDRAILS if spec.test == "shift"
)
"""The histograms the store keeps per arm, one per shift guardrail
(:attr:`~edgereg.config.BuiltinGuardrail.histogram`), of each device's value
(:attr:`~edgereg.config.BuiltinGuardrail.column`: its bucket)."""


def latency_bucket(ms: float) -> int:
    """The bucket index of a latency (values beyond the last edge go to the last bucket)."""
    return min(bisect.bisect_left(LATENCY_EDGES_MS, ms), len(LATENCY_EDGES_MS) - 1)


def bucket_value_ms(index: int) -> float:
    """A bucket's representative latency: the geometric middle of its edges."""
    upper = LATENCY_EDGES_MS[index]
    return upper / math.sqrt(_STEP) if index else upper / 2


@dataclass(frozen=True)
class Tally:
    """Devices of one arm and the events among them, per device and per network.

    Attributes:
        devices: Installs (distinct report tokens).
        networks: Distinct source networks of those installs (a device whose
            network is unknown counts as one of its own).
        events: Event name (:data:`EVENTS`) -> devices with it.
        network_events: Event name -> the sum over networks of the share of
            the network's devices with it (a network of one failing device
            adds 1; half of a network's ten devices, 0.5). At most ``networks``.
    """

    devices: int = 0
    networks: int = 0
    events: Mapping[str, int] = field(default_factory=dict)
    network_events: Mapping[str, float] = field(default_factory=dict)

    def count(self, event: str) -> int:
        """Devices with ``event``."""
        return int(self.events.get(event, 0))

    def network_count(self, event: str) -> float:
        """Networks with ``event``, each by the share of its devices that had it."""
        return float(self.network_events.get(event, 0.0))

    @classmethod
    def of_devices(cls, devices: int, **events: int) -> Tally:
        """A tally where each device is a network of its own (sources unknown)."""
        return cls(devices, devices, dict(events), {k: float(v) for k, v in events.items()})

    def __add__(self, other: Tally) -> Tally:
        names = set(self.events) | set(other.events)
        network_names = set(self.network_events) | set(other.network_events)
        return Tally(
            self.devices + other.devices,
            # Parts of one arm (two variants, two tiers pooled) may share networks: the
            # sum is an upper bound, and a verdict that trims networks trims per part.
            self.networks + other.networks,
            {n: self.count(n) + other.count(n) for n in names},
            {n: self.network_count(n) + other.network_count(n) for n in network_names},
        )


@dataclass(frozen=True)
class Histogram:
    """One arm's values of one kind, in buckets of :data:`LATENCY_EDGES_MS`.

    Attributes:
        devices: Bucket -> devices (each device's own value).
        low: Bucket -> networks, each network at its lowest (fastest) device.
        high: Bucket -> networks, each network at its highest (slowest) device.
    """

    devices: Mapping[int, int] = field(default_factory=dict)
    low: Mapping[int, int] = field(default_factory=dict)
    high: Mapping[int, int] = field(default_factory=dict)

    @classmethod
    def of_devices(cls, devices: Mapping[int, int]) -> Histogram:
        """Each device a network of its own: the three histograms are one."""
        return cls(dict(devices), dict(devices), dict(devices))

    def __add__(self, other: Histogram) -> Histogram:
        return Histogram(
            _add(self.devices, other.devices),
            _add(self.low, other.low),
            _add(self.high, other.high),
        )

    def __bool__(self) -> bool:
        return any(self.devices.values())


def _add(a: Mapping[int, int], b: Mapping[int, int]) -> dict[int, int]:
    out = dict(a)
    for bucket, count in b.items():
        out[bucket] = out.get(bucket, 0) + count
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class Statistic:
    """What a guardrail reads of an app metric, per device: a weighted sum of its bucket shares.

    A device's share of its events in each bucket (a rate's two buckets: 0 the
    events that failed, 1 those that succeeded; a distribution's K + 1),
    weighted: its success rate (weights 0, 1), its mean (each bucket's value),
    its share below an edge (1 for the buckets at or below it, else 0).

    Attributes:
        metric: The app metric's name.
        buckets: Its number of buckets (a release that declared it with another
            number counted another metric).
        weights: One per bucket.
    """

    metric: str
    buckets: int
    weights: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.weights) != self.buckets or not 2 <= self.buckets <= 32:
            raise ValueError(
                f"{self.metric}: {len(self.weights)} weights for {self.buckets} buckets (2 to 32)"
            )
        if not all(math.isfinite(w) for w in self.weights):
            raise ValueError(f"{self.metric}: weights must be finite numbers")

    def of(self, counts: Sequence[int]) -> float | None:
        """One device's statistic from its bucket counts (None when it counted nothing)."""
        total = sum(counts)
        if not total:
            return None
        return sum(w * c for w, c in zip(self.weights, counts, strict=True)) / total


@dataclass(frozen=True)
class MetricTally:
    """One arm's statistic of an app metric (:class:`Statistic`), per device and per network.

    Attributes:
        devices: Installs that counted at least one event of the metric.
        networks: Their distinct source networks.
        total: The devices' statistics, summed.
        network_total: Each network's mean statistic (over its devices), summed:
            each network weighs one, whatever its devices.
        network_squares: The squares of those means, summed (their spread).
    """

    devices: int = 0
    networks: int = 0
    total: float = 0.0
    network_total: float = 0.0
    network_squares: float = 0.0

    @classmethod
    def of_devices(cls, values: Sequence[float]) -> MetricTally:
        """A tally of devices each a network of its own, from each device's statistic."""
        return cls(
            len(values),
            len(values),
            float(sum(values)),
            float(sum(values)),
            float(sum(v * v for v in values)),
        )

    def __add__(self, other: MetricTally) -> MetricTally:
        return MetricTally(
            self.devices + other.devices,
            # Parts of one arm may share networks: an upper bound, as for a Tally.
            self.networks + other.networks,
            self.total + other.total,
            self.network_total + other.network_total,
            self.network_squares + other.network_squares,
        )


@dataclass(frozen=True)
class ArmSummary:
    """One arm (candidate or stable) of one tier, over the installs that reported.

    Attributes:
        unit: The model or bundle.
        tier: The device tier.
        arm: ``candidate`` or ``stable``.
        version: The unit version the arm ran.
        all: Every install of the period.
        aged: The installs old enough to have crash-looped (first reported at
            least ``revert_window_hours`` before the store's newest report), or
            None when not asked (then every install counts as aged).
        histograms: Kind (:data:`HISTOGRAMS`) -> values.
        metrics: Statistic name (a guardrail's) -> its tally, for the statistics asked for.
    """

    unit: str
    tier: str
    arm: Literal["candidate", "stable"]
    version: str
    all: Tally = field(default_factory=Tally)
    aged: Tally | None = None
    histograms: Mapping[str, Histogram] = field(default_factory=dict)
    metrics: Mapping[str, MetricTally] = field(default_factory=dict)

    @property
    def devices(self) -> int:
        """Installs that reported in the period."""
        return self.all.devices

    @property
    def networks(self) -> int:
        """Their distinct source networks."""
        return self.all.networks

    @property
    def aged_or_all(self) -> Tally:
        """The aged installs, or every install when age was not counted."""
        return self.all if self.aged is None else self.aged

    def histogram(self, kind: str) -> Histogram:
        """The values of ``kind`` (empty when none reported)."""
        return self.histograms.get(kind, Histogram())

    def metric(self, name: str) -> MetricTally:
        """The statistic ``name`` (empty when no device counted its metric)."""
        return self.metrics.get(name, MetricTally())

    @classmethod
    def of_devices(
        cls,
        unit: str,
        tier: str,
        arm: Literal["candidate", "stable"],
        version: str,
        devices: int,
        *,
        aged: Mapping[str, int] | None = None,
        histograms: Mapping[str, Mapping[int, int]] | None = None,
        metrics: Mapping[str, MetricTally] | None = None,
        **events: int,
    ) -> ArmSummary:
        """An arm whose every device is a network of its own (as with unknown sources).

        Args:
            aged: ``{"devices": n, <event>: k, ...}`` of the aged installs, or None.
            histograms: Kind -> bucket -> devices.
            metrics: Statistic name -> its tally (:meth:`MetricTally.of_devices`).
            events: Event name -> devices with it.
        """
        aged_tally = None
        if aged is not None:
            rest = {k: v for k, v in aged.items() if k != "devices"}
            aged_tally = Tally.of_devices(int(aged["devices"]), **rest)
        return cls(
            unit,
            tier,
            arm,
            version,
            Tally.of_devices(devices, **events),
            aged_tally,
            {k: Histogram.of_devices(v) for k, v in (histograms or {}).items()},
            dict(metrics or {}),
        )


def merge(summaries: Iterable[ArmSummary]) -> ArmSummary | None:
    """One arm's summaries (the store may split an arm, say by variant) added up."""
    merged: ArmSummary | None = None
    for summary in summaries:
        if merged is None:
            merged = summary
            continue
        aged = None if merged.aged is None or summary.aged is None else merged.aged + summary.aged
        kinds = set(merged.histograms) | set(summary.histograms)
        names = set(merged.metrics) | set(summary.metrics)
        merged = replace(
            merged,
            all=merged.all + summary.all,
            aged=aged,
            histograms={k: merged.histogram(k) + summary.histogram(k) for k in kinds},
            metrics={n: merged.metric(n) + summary.metric(n) for n in sorted(names)},
        )
    return merged


class SummarySource(Protocol):
    """What the analysis reads: a :class:`~edgereg.reports.ReportStore` (or a front of one)."""

    def summaries(
        self,
        unit: str,
        since: datetime | None = None,
        *,
        since_sequence: int | None = None,
        model: str | None = None,
        aged_before: datetime | None = None,
        stalled_starts: int = 2,
        pooled: bool = False,
        statistics: Mapping[str, Statistic] | None = None,
        with_pool: bool = False,
    ) -> list[ArmSummary]:
        """Per (tier, arm, version) of ``unit`` since ``since`` (of one member: ``model``).

        ``since_sequence``: only the installs whose latest report carries that
        manifest sequence or a later one (a rollout period).
        ``aged_before``: also count apart the installs that first reported by then.
        ``stalled_starts``: count as stalled the installs not confirmed after that many starts.
        ``pooled``: every tier together (tier ``*``), each network once.
        ``statistics``: what to tally of the app metrics, by a guardrail's name.
        ``with_pool``: the pooled summaries too (tier ``*``), after the ones per tier.
        """
        ...

    def clock(self, unit: str) -> datetime | None:
        """The report servers' clock as the store last heard it (None: never)."""
        ...
