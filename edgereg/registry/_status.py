"""What `edgereg status` shows: one model's (or bundle's) rollout at a glance."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from edgereg.protocol.wire import AnyRelease, BundleRecord, ManifestEntry, format_time
from edgereg.registry._manifests import entry_for, member_entry_for
from edgereg.registry._registry import Registry


@dataclass(frozen=True)
class TierStatus:
    """What devices of one tier get."""

    tier: str
    stable_variant: str | None
    stable_size: int | None
    candidate_variant: str | None
    candidate_size: int | None
    member: str | None = None
    """The bundle member this row is about (a bundle has one row per tier and member)."""


@dataclass(frozen=True)
class MemberStatus:
    """One model of a bundle: its own version in the stable and the candidate bundle."""

    name: str
    stable: str | None
    candidate: str | None


@dataclass(frozen=True)
class ModelStatus:
    """The rollout of one model."""

    model: str
    stable: str | None
    candidate: str | None
    percent: float | None
    paused: bool
    sequence: int
    expires: str
    tiers: list[TierStatus]
    last_change: str | None
    warnings: list[str] = field(default_factory=list)
    """Tiers whose devices (some or all) get no model, in plain words."""
    bundle: bool = False
    """A bundle: its members ship as one set under one version and one rollout."""
    members: list[MemberStatus] = field(default_factory=list)
    """A bundle's members, by name."""

    def as_dict(self) -> dict[str, Any]:
        """Plain data for --json."""
        return asdict(self)


def model_status(registry: Registry, model: str) -> ModelStatus:
    """Read and verify one model's (or bundle's) state and the release records it names.

    Tiers are listed best first, in the order the newest release recorded; a
    bundle has one row per tier and member.
    """
    state, _ = registry.read_state(model)
    if state is None:
        raise KeyError(model)
    stable = registry.read_release(model, state.stable) if state.stable else None
    candidate = registry.read_release(model, state.candidate) if state.candidate else None
    tier_names: dict[str, None] = {}
    for record in (candidate, stable):  # the newest release knows the current order
        if record is not None:
            tier_names.update(dict.fromkeys(record.ordered_tiers()))
    members = _members(stable, candidate)
    tiers = []
    for tier in tier_names:
        names: list[str | None] = [m.name for m in members] or [None]
        for member in names:
            s = _entry(stable, tier, member)
            c = _entry(candidate, tier, member)
            tiers.append(
                TierStatus(
                    tier=tier,
                    stable_variant=s.variant if s else None,
                    stable_size=s.size if s else None,
                    candidate_variant=c.variant if c else None,
                    candidate_size=c.size if c else None,
                    member=member,
                )
            )
    last = state.history[-1] if state.history else None
    warnings = _no_model_warnings(model, tiers, state.percent, state.paused)
    return ModelStatus(
        model=model,
        stable=state.stable,
        candidate=state.candidate,
        percent=state.percent,
        paused=state.paused,
        sequence=state.sequence,
        expires=format_time(state.expires),
        tiers=tiers,
        last_change=(f"{format_time(last.at)} {last.action} by {last.actor}" if last else None),
        warnings=warnings,
        bundle=isinstance(stable or candidate, BundleRecord),
        members=members,
    )


def _members(stable: AnyRelease | None, candidate: AnyRelease | None) -> list[MemberStatus]:
    """A bundle's members with their versions (none for a model)."""
    names: dict[str, None] = {}
    for record in (candidate, stable):
        if isinstance(record, BundleRecord):
            names.update(dict.fromkeys(record.members))
    return [
        MemberStatus(
            name=name,
            stable=_member_version(stable, name),
            candidate=_member_version(candidate, name),
        )
        for name in names
    ]


def _member_version(record: AnyRelease | None, name: str) -> str | None:
    if isinstance(record, BundleRecord) and name in record.members:
        return record.members[name].version
    return None


def _entry(record: AnyRelease | None, tier: str, member: str | None) -> ManifestEntry | None:
    if record is None:
        return None
    if isinstance(record, BundleRecord):
        if member is None or member not in record.members:
            return None
        return member_entry_for(record.members[member], tier)
    return entry_for(record, tier)


def _no_model_warnings(
    model: str, tiers: list[TierStatus], percent: float | None, paused: bool
) -> list[str]:
    """Say which tiers' devices get no model, and how many of them."""
    if not tiers:
        return [
            f"{model} is withdrawn: the devices of every tier get no model "
            f"(publish a release: edgereg publish {model} --canary 5%)"
        ]
    by_problem: dict[str, dict[str, None]] = {}
    for tier in tiers:
        if tier.stable_variant is not None:
            continue
        if tier.candidate_variant is None:
            problem = "every device gets no model (withdrawn)"
        elif paused:
            problem = "every device gets no model (the rollout is paused and there is no stable)"
        elif percent is not None and percent < 100:
            problem = (
                f"{100 - percent:g}% of devices (outside the candidate's cohort) get no model; "
                f"there is no stable release (edgereg rollout {model} --next, then promote)"
            )
        else:
            continue
        # A bundle's rows repeat each tier once per member: name the tier once.
        by_problem.setdefault(problem, {})[tier.tier] = None
    return [
        f"{model}: tier{'s' if len(names) > 1 else ''} {', '.join(names)}: {problem}"
        for problem, names in by_problem.items()
    ]
