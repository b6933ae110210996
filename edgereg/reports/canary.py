"""A rollout's canary analysis as it stands: periods from the signed state, arms from the store.

One place for what `edgereg analyze`, `edgereg rollout --auto` and the status
page compute, so the three never disagree about a rollout's health.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Protocol

from edgereg.analysis import Analysis, analysis_periods, analyze
from edgereg.config import Guardrails
from edgereg.protocol.wire import RolloutState
from edgereg.reports.summary import ArmSummary

__all__ = ["SummarySource", "rollout_analysis"]


class SummarySource(Protocol):
    """What the analysis reads: a :class:`~edgereg.reports.ReportStore` (or a front of one)."""

    def summaries(
        self,
        unit: str,
        since: datetime | None = None,
        *,
        model: str | None = None,
        aged_before: datetime | None = None,
        stalled_starts: int = 2,
    ) -> list[ArmSummary]:
        """Per (tier, arm, version) of ``unit`` since ``since`` (of one member: ``model``).

        ``aged_before``: also count the installs that first reported by then.
        ``stalled_starts``: count as stalled the installs not confirmed after that many starts.
        """
        ...


def rollout_analysis(
    store: SummarySource,
    state: RolloutState,
    *,
    guardrails: Guardrails,
    tiers: Sequence[str],
    now: datetime,
    since: datetime | None = None,
    cpu_class: str | None = None,
) -> Analysis:
    """Compare a rollout's candidate arm with its concurrent stable arm, per tier.

    Args:
        store: Where the reports are.
        state: The verified rollout state; it must have a candidate. Without a
            stable (a first release) the candidate is judged by the absolute limits.
        guardrails: The unit's declared guardrails.
        tiers: The tiers the candidate is released to, best first.
        now: The current time (a period that has not started counts from now).
        since: Count both arms from this time instead of the state's periods.
        cpu_class: Only the reports of this CPU class (the store must take
            ``cpu_class=``, as :class:`~edgereg.reports.ReportStore` does).

    Raises:
        ValueError: the state has no candidate.
        StorageError: the store cannot be read.
    """
    if state.candidate is None:
        raise ValueError(f"{state.model} has no candidate to analyse")
    if since is not None:
        candidate_since = stable_since = since
    else:
        candidate_start, stable_start = analysis_periods(state)
        candidate_since = candidate_start or now
        stable_since = stable_start or candidate_since

    # A crash loop is reported as a revert only after the app's unconfirmed starts:
    # only installs that old can show one (and pass the unconfirmed guardrail).
    window = guardrails.revert_window_hours
    aged = now - timedelta(hours=window) if window else None
    stalled = guardrails.unconfirmed.stalled_starts

    # Only when asked: a front of a store (a simulation's) need not know CPU classes.
    only: dict[str, str] = {} if cpu_class is None else {"cpu_class": cpu_class}

    def period(member: str | None = None) -> list[ArmSummary]:
        found = store.summaries(
            state.model,
            candidate_since,
            model=member,
            aged_before=aged,
            stalled_starts=stalled,
            **only,
        )
        if stable_since == candidate_since:
            return found
        # At 100 %: the candidate's reports since the move, the stable arm's of the step before.
        return [s for s in found if s.arm == "candidate"] + [
            s
            for s in store.summaries(
                state.model,
                stable_since,
                model=member,
                aged_before=aged,
                stalled_starts=stalled,
                **only,
            )
            if s.arm == "stable"
        ]

    summaries = period()
    # A store that lists a bundle's members gives each its own latencies (one per device).
    listed = getattr(store, "members", None)
    names: list[str] = listed(state.model) if callable(listed) else []
    members = {name: period(name) for name in names} or None
    return analyze(
        summaries,
        unit=state.model,
        candidate=state.candidate,
        stable=state.stable,
        since=candidate_since,
        stable_since=stable_since,
        guardrails=guardrails,
        tiers=tiers,
        members=members,
    )
