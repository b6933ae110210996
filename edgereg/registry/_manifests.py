"""Per-tier manifests derived from the rollout state and release records (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from edgereg.protocol.fields import Requirements
from edgereg.protocol.wire import (
    AnyRelease,
    BundleEntry,
    BundleMember,
    BundleRecord,
    Manifest,
    ManifestEntry,
    ReleaseRecord,
    ReleaseVariant,
    RolloutState,
)


def _entry(
    version: str,
    variant_name: str,
    variant: ReleaseVariant,
    requires: Requirements | None,
    variants: Mapping[str, ReleaseVariant] | None = None,
) -> ManifestEntry:
    # The entry describes itself (contract, probe, requires), so an app needs
    # nothing but the manifest to call, check and place the model.
    avoid_cpu, instead = ship_around(variant)
    substitute = None
    if avoid_cpu and instead is not None and variants is not None and instead in variants:
        substitute = _entry(version, instead, variants[instead], requires)
    return ManifestEntry(
        version=version,
        variant=variant_name,
        path=variant.path,
        sha256=variant.sha256,
        size=variant.size,
        min_mnn_runtime=variant.min_mnn_runtime,
        runtime=variant.runtime,
        runtime_trials=variant.runtime_trials,
        contract=variant.contract,
        requires=requires,
        probe=variant.probe,
        probe_data=variant.probe_data,
        avoid_cpu=avoid_cpu or None,
        instead=substitute,
        peak_memory_mb=_peak_memory(variant),
    )


def ship_around(variant: ReleaseVariant) -> tuple[list[str], str | None]:
    """The CPU features a released variant avoids and the variant devices with them get.

    Publish writes them as the variant's own fields, from what the build's ARM
    verification ran (edgereg/build/arm.py). Records published before those
    fields existed carry them only inside the opaque ``metrics["arm"]``; such
    records are signed and immutable, and their manifests are rebuilt on
    every rollout change, so that record is still read when the fields are
    absent (the same manifest bytes as when it was published).
    """
    if variant.avoid_cpu is not None:
        return list(variant.avoid_cpu), variant.instead
    return _legacy_ship_around(variant.metrics.get("arm"))


def _legacy_ship_around(record: object) -> tuple[list[str], str | None]:
    """``avoid_cpu``/``instead`` from ``metrics["arm"]`` of a record without the typed fields."""
    if not isinstance(record, dict):
        return [], None
    avoid = record.get("avoid_cpu")
    instead = record.get("instead")
    features = [str(f) for f in avoid] if isinstance(avoid, list) else []
    return features, str(instead) if isinstance(instead, str) and features else None


#: The largest peak a manifest entry may carry (docs/protocol.md §3: 2^20 MiB).
_MAX_PEAK_MB = 1048576.0


def _peak_memory(variant: ReleaseVariant) -> float | None:
    """The measured peak publish recorded in the variant's metrics (absent in older records)."""
    value = variant.metrics.get("peak_memory_mb")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if 0 < value <= _MAX_PEAK_MB else None


def entry_for(record: ReleaseRecord, tier: str) -> ManifestEntry | None:
    """The entry an app of ``tier`` gets from a release, or None if the tier is unknown."""
    variant_name = record.tiers.get(tier)
    if variant_name is None:
        return None
    entry = _entry(
        record.version,
        variant_name,
        record.variants[variant_name],
        record.requires,
        record.variants,
    )
    # The unit's app metrics travel on its own entry (docs/protocol.md §3).
    return entry if record.metrics is None else entry.model_copy(update={"metrics": record.metrics})


def member_entry_for(member: BundleMember, tier: str) -> ManifestEntry | None:
    """One bundle member's entry for ``tier`` (its own version and requires), or None."""
    variant_name = member.tiers.get(tier)
    if variant_name is None:
        return None
    return _entry(
        member.version,
        variant_name,
        member.variants[variant_name],
        member.requires,
        member.variants,
    )


def bundle_entry_for(record: BundleRecord, tier: str) -> BundleEntry | None:
    """The bundle entry of ``tier``: every member's entry, or None if the tier is unknown.

    Each member falls back to a lower tier's variant on its own (its ``tiers``
    map was resolved per member when the release was prepared).
    """
    members: dict[str, ManifestEntry] = {}
    for name, member in record.members.items():
        entry = member_entry_for(member, tier)
        if entry is None:
            return None  # a bundle is all of its members or nothing
        members[name] = entry
    return BundleEntry(
        version=record.version, members=members, requires=record.requires, metrics=record.metrics
    )


def unit_entry_for(record: AnyRelease, tier: str) -> ManifestEntry | BundleEntry | None:
    """The entry of a model's or a bundle's release for ``tier``."""
    if isinstance(record, BundleRecord):
        return bundle_entry_for(record, tier)
    return entry_for(record, tier)


def build_manifests(
    state: RolloutState,
    releases: Mapping[str, AnyRelease],
    published_tiers: Iterable[str] = (),
) -> dict[str, Manifest]:
    """One manifest per tier known to the stable or the candidate release.

    Args:
        state: The rollout state the manifests reflect; they carry its
            sequence, expiry and report URL (so they derive from it alone).
        releases: Release records (of a model or of a bundle) by version;
            must hold stable and candidate.
        published_tiers: Tiers that already have a manifest in the registry.
            Those the current releases do not serve get a manifest with no
            entry, so their devices learn (signed) that the model was
            withdrawn instead of installing what an older manifest said.
    """
    stable = releases[state.stable] if state.stable else None
    candidate = releases[state.candidate] if state.candidate else None
    tiers: dict[str, None] = {}
    for record in (stable, candidate):
        if record is not None:
            tiers.update(dict.fromkeys(record.ordered_tiers()))
    tiers.update(dict.fromkeys(sorted(published_tiers)))
    manifests = {}
    for tier in tiers:
        stable_entry = unit_entry_for(stable, tier) if stable else None
        candidate_entry = unit_entry_for(candidate, tier) if candidate else None
        manifests[tier] = Manifest(
            model=state.model,
            tier=tier,
            sequence=state.sequence,
            expires=state.expires,
            stable=stable_entry,
            candidate=candidate_entry,
            percent=state.percent if candidate_entry else None,
            salt=state.salt if candidate_entry else None,
            paused=state.paused if candidate_entry else False,
            report_url=state.report_url,
        )
    return manifests
