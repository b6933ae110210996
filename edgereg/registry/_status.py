"""What `edgereg status` shows: one model's rollout at a glance."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from edgereg.registry._manifests import entry_for
from edgereg.registry._registry import Registry
from edgereg.wire import format_time


@dataclass(frozen=True)
class TierStatus:
    """What devices of one tier get."""

    tier: str
    stable_variant: str | None
    stable_size: int | None
    candidate_variant: str | None
    candidate_size: int | None


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

    def as_dict(self) -> dict[str, Any]:
        """Plain data for --json."""
        return asdict(self)


def model_status(registry: Registry, model: str) -> ModelStatus:
    """Read and verify one model's state and the release records it names.

    Tiers are listed best first, in the order the newest release recorded.
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
    tiers = []
    for tier in tier_names:
        s = entry_for(stable, tier) if stable else None
        c = entry_for(candidate, tier) if candidate else None
        tiers.append(
            TierStatus(
                tier=tier,
                stable_variant=s.variant if s else None,
                stable_size=s.size if s else None,
                candidate_variant=c.variant if c else None,
                candidate_size=c.size if c else None,
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
    )


def _no_model_warnings(
    model: str, tiers: list[TierStatus], percent: float | None, paused: bool
) -> list[str]:
    """Say which tiers' devices get no model, and how many of them."""
    if not tiers:
        return [
            f"{model} is withdrawn: the devices of every tier get no model "
            f"(publish a release: edgereg publish {model} --canary 5%)"
        ]
    by_problem: dict[str, list[str]] = {}
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
        by_problem.setdefault(problem, []).append(tier.tier)
    return [
        f"{model}: tier{'s' if len(names) > 1 else ''} {', '.join(names)}: {problem}"
        for problem, names in by_problem.items()
    ]
