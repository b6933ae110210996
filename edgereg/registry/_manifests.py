"""Per-tier manifests derived from the rollout state and release records (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from edgereg.wire import Manifest, ManifestEntry, ReleaseRecord, RolloutState, blob_path


def entry_for(record: ReleaseRecord, tier: str) -> ManifestEntry | None:
    """The entry an app of ``tier`` gets from a release, or None if the tier is unknown."""
    variant_name = record.tiers.get(tier)
    if variant_name is None:
        return None
    variant = record.variants[variant_name]
    return ManifestEntry(
        version=record.version,
        variant=variant_name,
        path=blob_path(variant.sha256),
        sha256=variant.sha256,
        size=variant.size,
        min_mnn_runtime=variant.min_mnn_runtime,
        runtime=variant.runtime,
    )


def build_manifests(
    state: RolloutState,
    releases: Mapping[str, ReleaseRecord],
    published_tiers: Iterable[str] = (),
) -> dict[str, Manifest]:
    """One manifest per tier known to the stable or the candidate release.

    Args:
        state: The rollout state the manifests reflect; they carry its
            sequence and expiry.
        releases: Release records by version; must hold stable and candidate.
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
            tiers.update(dict.fromkeys(record.tiers))
    tiers.update(dict.fromkeys(sorted(published_tiers)))
    manifests = {}
    for tier in tiers:
        stable_entry = entry_for(stable, tier) if stable else None
        candidate_entry = entry_for(candidate, tier) if candidate else None
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
        )
    return manifests
