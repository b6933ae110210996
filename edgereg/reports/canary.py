"""A rollout's canary analysis as it stands: periods from the signed state, arms from the store.

One place for what `edgereg analyze`, `edgereg rollout --auto` and the status
page compute, so the three never disagree about a rollout's health.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from edgereg.analysis import (
    Analysis,
    analysis_periods,
    analysis_sequences,
    analyze,
    metric_specs,
)
from edgereg.config import AppMetric, Guardrails
from edgereg.protocol.wire import RolloutState
from edgereg.reports.store import POOLED_TIER
from edgereg.reports.summary import ArmSummary, SummarySource

__all__ = ["SummarySource", "rollout_analysis"]


#: A report server's clock this far from the analysing host's is said in the analysis
#: (it changes no verdict: ages are counted on the report servers' own clock).
SKEW_NOTED = timedelta(minutes=5)
#: ... and a store's clock this far behind it (a server marks it every minute).
STALE_NOTED = timedelta(minutes=15)


def rollout_analysis(
    store: SummarySource,
    state: RolloutState,
    *,
    guardrails: Guardrails,
    tiers: Sequence[str],
    now: datetime,
    since: datetime | None = None,
    cpu_class: str | None = None,
    metrics: Mapping[str, AppMetric] | None = None,
    bundle: bool | None = None,
) -> Analysis:
    """Compare a rollout's candidate arm with its concurrent stable arm, per tier.

    A period is the reports whose manifest sequence is at least the one of
    the period's start (every device reports in each, docs/protocol.md §11),
    so no clock is compared to cut it. Install ages (the revert window) are
    counted on the store's own clock, the newest report's arrival, which the
    report servers stamped like every install's first report: a report
    server whose clock is off from this host's moves no age. A skew seen
    between the two is said in the analysis's notes.

    Args:
        store: Where the reports are.
        state: The verified rollout state; it must have a candidate. Without a
            stable (a first release) the candidate is judged by the absolute limits.
        guardrails: The unit's declared guardrails.
        tiers: The tiers the candidate is released to, best first.
        now: The current time on this host (a period that has not started counts from now).
        since: Count both arms from this time instead of the state's periods.
        cpu_class: Only the reports of this CPU class (the store must take
            ``cpu_class=``, as :class:`~edgereg.reports.ReportStore` does).
        metrics: The app metrics the unit declares (models.toml): the guardrails
            on them are judged too.
        bundle: Whether the unit is a bundle, as the registry says (its release
            record): the store need not look through its rows for members (a
            store that takes ``bundle=``, as :class:`~edgereg.reports.ReportStore`
            does). None: the store finds out.

    Raises:
        ValueError: the state has no candidate.
        StorageError: the store cannot be read.
    """
    if state.candidate is None:
        raise ValueError(f"{state.model} has no candidate to analyse")
    candidate_start, stable_start = analysis_periods(state)
    candidate_seq, stable_seq = analysis_sequences(state)
    if since is not None:
        candidate_since = stable_since = since
        windows: tuple[dict[str, Any], dict[str, Any]] = ({"since": since}, {"since": since})
    else:
        candidate_since = candidate_start or now
        stable_since = stable_start or candidate_since
        if candidate_seq is None:
            # No percent change in the history the state keeps: count from now.
            windows = ({"since": now}, {"since": now})
        else:
            windows = (
                {"since_sequence": candidate_seq},
                {"since_sequence": stable_seq if stable_seq is not None else candidate_seq},
            )

    # A crash loop is reported as a revert only after the app's unconfirmed starts:
    # only installs that old can show one (and pass the unconfirmed guardrail). Their
    # age is read on the report servers' clock: the newest report's arrival.
    notes: list[str] = []
    store_now = store.clock(state.model)
    if store_now is not None and store_now - now > SKEW_NOTED:
        notes.append(
            f"the report store's clock is {_minutes(store_now - now)} ahead of this host's: "
            "a report server's clock runs ahead (install ages are counted on the report "
            "servers' clock, so no verdict moves; fix the clocks)"
        )
    elif store_now is not None and now - store_now > STALE_NOTED:
        notes.append(
            f"the report store's clock is {_minutes(now - store_now)} behind this host's: "
            "no report server marked it since (edgereg serve marks it every minute), or its "
            "clock runs behind; install ages are counted on the store's clock"
        )
    reference = store_now if store_now is not None else now
    window = guardrails.revert_window_hours
    aged = reference - timedelta(hours=window) if window else None
    # What the store binds into the rate guardrails' events (the unconfirmed guardrail's).
    stalled = int(guardrails.event_parameters()["stalled_starts"])

    # Only when asked: a front of a store (a simulation's) need not know CPU classes.
    only: dict[str, Any] = {} if cpu_class is None else {"cpu_class": cpu_class}
    if bundle is not None:
        only["bundle"] = bundle
    # What the guardrails on app metrics read (none asked of a store when none is set).
    statistics = {
        spec.name: spec.metric.statistic()
        for spec in metric_specs(guardrails, metrics or {})
        if spec.metric is not None
    }

    def period(member: str | None = None, **pooled: Any) -> list[ArmSummary]:
        if member is None and statistics:
            pooled = {**pooled, "statistics": statistics}
        found = store.summaries(
            state.model,
            model=member,
            aged_before=aged,
            stalled_starts=stalled,
            **windows[0],
            **only,
            **pooled,
        )
        if windows[1] == windows[0]:
            return found
        # At 100 %: the candidate's reports since the move, the stable arm's of the step before.
        return [s for s in found if s.arm == "candidate"] + [
            s
            for s in store.summaries(
                state.model,
                model=member,
                aged_before=aged,
                stalled_starts=stalled,
                **windows[1],
                **only,
                **pooled,
            )
            if s.arm == "stable"
        ]

    # Every tier together, each network once: the pool, read in the same snapshot as the
    # tiers (each app metric read once for both).
    pool: list[ArmSummary] | None = None
    if len(tiers) > 1:
        found = period(with_pool=True)
        summaries = [s for s in found if s.tier != POOLED_TIER]
        pool = [s for s in found if s.tier == POOLED_TIER]
    else:
        summaries = period()
    # A store that lists a bundle's members gives each its own latencies (one per device).
    listed = getattr(store, "members", None) if bundle is not False else None
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
        notes=notes,
        pool=pool,
        metrics=metrics,
    )


def _minutes(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if hours else f"{minutes} min"
