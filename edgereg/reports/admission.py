"""Which reports a receiver admits: only what the signed rollout state and manifests served.

A report is anonymous and unsigned, so anyone can post one (the threat model:
docs/operations/report-threats.md). What a receiver *can* check is that the
report describes something the registry actually served: its unit has a
rollout state, its tier a manifest, its sequence was issued, and at that
sequence the state's candidate (for the candidate arm) or stable (for the
stable arm) was the unit version it names. A report that breaks one of those
is refused with a reason code and counted, never stored.

Pure: :class:`ServedUnit` is built from a verified :class:`RolloutState` and
the tiers with a manifest; :func:`admit` decides. The server's shell
(edgereg/serve/_admission.py) reads and caches them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from edgereg.protocol.reports import DistributionCounts, Report
from edgereg.protocol.wire import AnyRelease, BundleRecord, DistributionMetric, RolloutState

__all__ = ["REFUSALS", "ReleaseFacts", "ServedUnit", "admit"]

#: Every reason a report is refused, with what it means (metrics label -> text).
REFUSALS: dict[str, str] = {
    "unknown-unit": "no rollout state for this unit in the registry",
    "unknown-tier": "the unit has no manifest for this tier",
    "future-sequence": "the registry never issued this sequence for the unit",
    "not-served": "at this sequence the arm did not serve this unit version",
    "version-mismatch": "a model's version differs from its unit's (not a bundle), or a "
    "bundle member's from the member version the bundle release names",
    "unknown-model": "the unit's release has no such model (a bundle member it does not hold)",
    "unknown-variant": "the release of the model has no such variant",
    "undeclared-metric": "the report carries an app metric the unit's release does not declare",
    "metric-mismatch": "an app metric sent as another kind than declared, or with another "
    "number of buckets",
}


@dataclass(frozen=True)
class ReleaseFacts:
    """What one released unit version holds: per model, its version and variants.

    A model's release holds itself; a bundle's, each member. ``metrics``: the app
    metrics the release declares, name -> buckets (0 for a rate).
    """

    models: dict[str, tuple[str, frozenset[str]]]
    metrics: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, record: AnyRelease) -> ReleaseFacts:
        """The facts of a verified release record."""
        metrics = {
            name: len(declared.buckets) + 1 if isinstance(declared, DistributionMetric) else 0
            for name, declared in (record.metrics or {}).items()
        }
        if isinstance(record, BundleRecord):
            return cls(
                {
                    name: (member.version, frozenset(member.variants))
                    for name, member in record.members.items()
                },
                metrics,
            )
        return cls({record.model: (record.version, frozenset(record.variants))}, metrics)


@dataclass(frozen=True)
class ServedUnit:
    """What the registry served of one unit: per issued sequence, the arm's versions.

    Attributes:
        unit: The model or bundle.
        sequence: The current state's sequence (the newest a device can hold).
        tiers: Tiers with a manifest.
        served: Sequence -> (stable version, candidate version) after that event.
        oldest: The oldest sequence the state's history still holds; before it
            (the history keeps the last 200 events) a version is only checked
            against ``versions``.
        versions: Every version that was ever a stable or a candidate in the history.
        releases: Unit version -> what its release holds (models, their versions and
            variants), for the versions the index could read; a version without
            one is checked as before (its arm's version only).
    """

    unit: str
    sequence: int
    tiers: frozenset[str]
    served: dict[int, tuple[str | None, str | None]]
    oldest: int
    versions: frozenset[str]
    releases: Mapping[str, ReleaseFacts] = field(default_factory=dict)

    @classmethod
    def from_state(
        cls,
        state: RolloutState,
        tiers: Iterable[str],
        releases: Mapping[str, ReleaseFacts] | None = None,
    ) -> ServedUnit:
        """Index a verified state, the tiers that have a manifest and what each release holds."""
        served: dict[int, tuple[str | None, str | None]] = {}
        versions: set[str] = set()
        for event in state.history:
            snapshot = event.after
            served[event.sequence] = (snapshot.stable, snapshot.candidate)
            versions.update(v for v in (snapshot.stable, snapshot.candidate) if v)
        # The state itself is what the newest manifests carry.
        served[state.sequence] = (state.stable, state.candidate)
        versions.update(v for v in (state.stable, state.candidate) if v)
        return cls(
            unit=state.model,
            sequence=state.sequence,
            tiers=frozenset(tiers),
            served=served,
            oldest=min(served),
            versions=frozenset(versions),
            releases=dict(releases or {}),
        )


def admit(report: Report, served: ServedUnit | None) -> str | None:
    """Whether a report describes what was served: None to admit, else a key of :data:`REFUSALS`.

    Args:
        report: The parsed report.
        served: What the registry served of the report's unit (None: no state).
    """
    if served is None or served.unit != report.unit:
        return "unknown-unit"
    if report.unit == report.model and report.version != report.unit_version:
        return "version-mismatch"
    if report.tier not in served.tiers:
        return "unknown-tier"
    if report.sequence > served.sequence:
        return "future-sequence"
    at = served.served.get(report.sequence)
    if at is None:
        if report.sequence < served.oldest and report.unit_version in served.versions:
            return _in_release(report, served.releases.get(report.unit_version))
        # Inside the history every issued sequence has its event: a gap was never served.
        return "not-served"
    stable, candidate = at
    wanted = candidate if report.arm == "candidate" else stable
    if wanted != report.unit_version:
        return "not-served"
    return _in_release(report, served.releases.get(report.unit_version))


def _in_release(report: Report, release: ReleaseFacts | None) -> str | None:
    """Whether the report's model, its version and its variant are in the unit version's release."""
    if release is None:
        return None
    found = release.models.get(report.model)
    if found is None:
        return "unknown-model"
    version, variants = found
    if report.version != version:
        return "version-mismatch"
    if report.variant not in variants:
        return "unknown-variant"
    for name, counts in (report.metrics or {}).items():
        buckets = release.metrics.get(name)
        if buckets is None:
            return "undeclared-metric"
        sent = len(counts.counts) if isinstance(counts, DistributionCounts) else 0
        if sent != buckets:
            return "metric-mismatch"
    return None
