"""Gather the builds of a bundle's members into one bundle release record.

A bundle ships its models together: one version, one rollout. Every member
must be fit to ship (each checked by :func:`prepare_release`, as if it were
published alone); every problem of every member is listed at once, so one
`dvc repro` fixes them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from edgereg.build.fit import ceiling_problems
from edgereg.config import Config
from edgereg.protocol.wire import AnyRelease, BundleMember, BundleRecord
from edgereg.registry._release import ReleaseError, prepare_release


@dataclass(frozen=True)
class PreparedBundle:
    """A bundle release record and the local files of every member's blobs."""

    record: BundleRecord
    blobs: dict[str, Path]

    def same_content(self, other: AnyRelease) -> bool:
        """True when ``other`` ships exactly the same members, artifacts and tiers."""
        if not isinstance(other, BundleRecord):
            return False
        return _content(other) == _content(self.record)


def _content(record: BundleRecord) -> dict[str, object]:
    return {
        name: (
            member.version,
            {variant: v.sha256 for variant, v in member.variants.items()},
            member.tiers,
        )
        for name, member in record.members.items()
    }


def prepare_bundle_release(
    config: Config, bundle_name: str, out_root: Path, *, version: str, now: datetime
) -> PreparedBundle:
    """Check every member's build and assemble the bundle release record.

    Each member keeps its own version (models.toml) and its own tier fallback
    (``Config.tier_variants``); the bundle's version names the set.

    Raises:
        ReleaseError: no such bundle, or a member is not fit to ship (not
            built, failed a gate, stale); the message lists every problem of
            every member.
    """
    if bundle_name not in config.bundles:
        known = ", ".join(config.bundles) or "none"
        raise ReleaseError(
            f"no bundle '{bundle_name}' in {config.path}; bundles: {known}",
            hint="Declare it under [bundles.NAME] with version and models.",
        )
    bundle = config.bundles[bundle_name]
    problems: list[str] = []
    members: dict[str, BundleMember] = {}
    blobs: dict[str, Path] = {}
    for name in bundle.models:
        try:
            prepared = prepare_release(
                config, name, out_root, version=config.models[name].version, now=now
            )
        except ReleaseError as exc:
            problems.append(_member_problems(name, exc.message))
            continue
        release = prepared.record
        members[name] = BundleMember(
            version=release.version,
            variants=dict(release.variants),
            tiers=dict(release.tiers),
            # The model's own requires (models.toml), whether or not the
            # model's release record carries it.
            requires=release.requires or config.models[name].requires,
        )
        blobs.update(prepared.blobs)
    if not problems:
        problems += [
            f"  {line}"
            for line in ceiling_problems(config, bundle_name, out_root, require_measured=True)
        ]
    if problems:
        raise ReleaseError(
            f"cannot publish bundle {bundle_name}: every member must be fit to ship\n"
            + "\n".join(problems),
            hint="Run `dvc repro` (or `edgereg build MODEL VARIANT`) and fix what the gates "
            "report, then publish the bundle again.",
        )
    record = BundleRecord(
        bundle=bundle_name,
        version=version,
        created=now,
        members=members,
        tier_order=list(config.tiers),
        requires=bundle.requires,
        metrics={name: m.declaration() for name, m in bundle.metrics.items()} or None,
    )
    return PreparedBundle(record=record, blobs=blobs)


def _member_problems(member: str, message: str) -> str:
    """A member's refusal as indented lines, without its own "cannot publish" heading."""
    heading = f"cannot publish {member}:"
    lines = message.splitlines()
    if lines and lines[0].strip() == heading:
        lines = lines[1:]
    else:
        lines = [f"{member}: {line}" for line in lines]
    return "\n".join(f"  {line.strip()}" for line in lines if line.strip())
