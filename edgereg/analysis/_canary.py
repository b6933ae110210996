"""The canary analysis: every guardrail of every tier, candidate arm against stable arm."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from edgereg.analysis._bands import shift_evidence
from edgereg.analysis._ranks import compare_latency, total
from edgereg.analysis._rates import check_rate_limit, compare_rates
from edgereg.config import Guardrails, LatencyGuardrail, RateGuardrail, UnconfirmedGuardrail
from edgereg.protocol.wire import RolloutState
from edgereg.reports.summary import ArmSummary

Verdict = Literal["pass", "fail", "inconclusive"]

RATE_GUARDRAILS: tuple[str, ...] = ("probe_failure", "load_failure", "revert", "unconfirmed")
"""Rate guardrails, each named as in ``[rollout.guardrails]``."""
LATENCY_GUARDRAILS: tuple[str, ...] = ("load_ms", "inference_ms", "memory_peak_mb")
"""Latency-like guardrails (a scale shift in percent), each named as in ``[rollout.guardrails]``.

``memory_peak_mb`` is judged like a latency; a tier where no device reports it
(clients of report schema 1) leaves it out rather than waiting for it."""
#: Guardrails left out of a tier whose arms have no value of them at all.
OPTIONAL_GUARDRAILS = frozenset({"memory_peak_mb"})

# Which ArmSummary field each guardrail reads.
_RATE_FIELD = {
    "probe_failure": "probe_failed",
    "load_failure": "load_failed",
    "revert": "reverted",
    "unconfirmed": "stalled",
}
_SOURCE_FIELD = {
    "probe_failure": "probe_failed_sources",
    "load_failure": "load_failed_sources",
    "revert": "reverted_sources",
    "unconfirmed": "stalled_sources",
}
_LATENCY_FIELD = {
    "load_ms": "load_ms",
    "inference_ms": "inference_p50_ms",
    "memory_peak_mb": "memory_peak_mb",
}
_UNIT = {"memory_peak_mb": "MB"}

Number = float | int | None


def min_failing_devices(guardrails: Guardrails) -> int:
    """Failing candidate devices a fail needs (``min_failing_devices``)."""
    return guardrails.min_failing_devices


def max_rate(rule: RateGuardrail) -> float:
    """A rate guardrail's absolute limit (``max_rate``)."""
    return rule.max_rate


@dataclass(frozen=True)
class GuardrailResult:
    """One guardrail of one tier.

    Attributes:
        name: The guardrail (``probe_failure``, ``load_ms``, ...).
        critical: A failure halts the rollout.
        verdict: pass, fail or inconclusive.
        reason: One line for people, with the numbers.
        numbers: The numbers, for scripts and the signed evidence (rates are
            fractions, shifts in ms and in percent of the stable median).
        observed: An inconclusive result for want of proof alone: each arm held
            ``min_soak_devices`` (counted like a pass) from enough networks,
            the revert window passed, and no harm is shown (the confidence
            sequence still holds "no worse than the stable at all"), so
            ``max_soak_hours`` may step past it. False for any other
            inconclusive result (too few devices, a harm shown on too few).
    """

    name: str
    critical: bool
    verdict: Verdict
    reason: str
    numbers: dict[str, Number] = field(default_factory=dict)
    observed: bool = False

    @property
    def harmless(self) -> bool:
        """Passed, or observed without harm: what a step after ``max_soak_hours`` needs."""
        return self.verdict == "pass" or (self.verdict == "inconclusive" and self.observed)

    @property
    def beyond_limit(self) -> str | None:
        """The estimate, said with its unit, when it lies beyond the limit; else None."""
        difference, limit = self.numbers.get("difference"), self.numbers.get("limit")
        if isinstance(difference, int | float) and isinstance(limit, int | float):
            return f"{100 * difference:+.1f} pt" if difference > limit else None
        shift, limit_pct = self.numbers.get("shift_pct"), self.numbers.get("limit_pct")
        if isinstance(shift, int | float) and isinstance(limit_pct, int | float):
            return f"{shift:+.0f}%" if shift > limit_pct else None
        return None

    @property
    def harm_left_open(self) -> str | None:
        """The upper end of the interval, said with its unit (what the evidence cannot exclude)."""
        high, high_pct = self.numbers.get("ci_high"), self.numbers.get("ci_high_pct")
        if isinstance(high, int | float):
            return f"{100 * high:+.1f} pt"
        if isinstance(high_pct, int | float):
            return f"{high_pct:+.0f}%"
        return None


@dataclass(frozen=True)
class TierAnalysis:
    """Every guardrail of one tier.

    Attributes:
        tier: The device tier.
        candidate_devices: Candidate devices that reported in the period.
        stable_devices: Stable devices that reported in the period.
        guardrails: One result per guardrail.
        alarms: What is wrong with the stable arm itself (its rates above the
            absolute limits): the comparison cannot see it, so it is said apart.
    """

    tier: str
    candidate_devices: int
    stable_devices: int
    guardrails: tuple[GuardrailResult, ...]
    alarms: tuple[str, ...] = ()

    @property
    def verdict(self) -> Verdict:
        """Fail if a critical guardrail fails, pass if all pass, else inconclusive."""
        return combine(self.guardrails)


@dataclass(frozen=True)
class Analysis:
    """The canary analysis of one unit's rollout.

    Attributes:
        unit: The model or bundle.
        candidate: The candidate version.
        stable: The stable version, or None for a first release (judged by the
            absolute limits alone).
        since: Start of the period the candidate arm is counted over.
        tiers: One analysis per tier.
        stable_since: Start of the stable arm's period, when it differs (at 100 %).
    """

    unit: str
    candidate: str
    stable: str | None
    since: datetime
    tiers: tuple[TierAnalysis, ...]
    stable_since: datetime | None = None

    @property
    def verdict(self) -> Verdict:
        """Fail if a critical guardrail fails anywhere, pass if all pass, else inconclusive."""
        return combine(result for tier in self.tiers for result in tier.guardrails)

    @property
    def alarms(self) -> tuple[str, ...]:
        """Every tier's alarms about the stable arm."""
        return tuple(alarm for tier in self.tiers for alarm in tier.alarms)

    def to_json(self) -> dict[str, object]:
        """Everything, for ``edgereg analyze --json``."""
        return {
            "unit": self.unit,
            "candidate": self.candidate,
            "stable": self.stable,
            "since": _iso(self.since),
            "stable_since": _iso(self.stable_since or self.since),
            "verdict": self.verdict,
            "alarms": list(self.alarms),
            "tiers": [
                {
                    "tier": tier.tier,
                    "verdict": tier.verdict,
                    "alarms": list(tier.alarms),
                    "candidate_devices": tier.candidate_devices,
                    "stable_devices": tier.stable_devices,
                    "guardrails": [
                        {
                            "name": result.name,
                            "critical": result.critical,
                            "verdict": result.verdict,
                            "reason": result.reason,
                            "observed": result.observed,
                            **result.numbers,
                        }
                        for result in tier.guardrails
                    ],
                }
                for tier in self.tiers
            ],
        }

    def evidence(self) -> dict[str, object]:
        """A compact summary for the signed history: verdicts and the key numbers, rounded.

        Kept small because the signed state keeps up to 200 history events.
        """
        tiers: dict[str, object] = {}
        for tier in self.tiers:
            tiers[tier.tier] = {
                "verdict": tier.verdict,
                "devices": [tier.candidate_devices, tier.stable_devices],
                "guardrails": {
                    result.name: {
                        "verdict": result.verdict,
                        **(
                            {"observed": True}
                            if result.verdict == "inconclusive" and result.observed
                            else {}
                        ),
                        **{
                            key: _round(value)
                            for key, value in result.numbers.items()
                            if key in _EVIDENCE_KEYS
                        },
                    }
                    for result in tier.guardrails
                },
            }
        return {
            "verdict": self.verdict,
            "candidate": self.candidate,
            "stable": self.stable,
            "since": _iso(self.since),
            **({"stable_since": _iso(self.stable_since)} if self.stable_since else {}),
            **({"alarms": list(self.alarms)} if self.alarms else {}),
            "tiers": tiers,
        }


_EVIDENCE_KEYS = frozenset(
    {
        "candidate_rate",
        "stable_rate",
        "difference",
        "ci_low",
        "ci_high",
        "p_worse",
        "p_above_max_rate",
        "limit",
        "shift_pct",
        "ci_low_pct",
        "ci_high_pct",
        "limit_pct",
        "p_slower",
        # What made an install stalled: the verdict is read against it.
        "stalled_starts",
    }
)


def _round(value: Number) -> Number:
    return float(f"{value:.4g}") if isinstance(value, float) else value


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _p(value: float) -> str:
    # Below double precision's resolution of 1 - p a printed 0 would claim certainty.
    return "p<1e-16" if value < 1e-16 else f"p={value:.2g}"


def combine(results: Iterable[GuardrailResult]) -> Verdict:
    """Fail if any critical guardrail fails, pass if every one passes, else inconclusive.

    A non-critical failure does not halt a rollout, but it does not let it go on either.
    """
    verdicts = [(result.verdict, result.critical) for result in results]
    if any(verdict == "fail" and critical for verdict, critical in verdicts):
        return "fail"
    if verdicts and all(verdict == "pass" for verdict, _ in verdicts):
        return "pass"
    return "inconclusive"


def analysis_periods(state: RolloutState) -> tuple[datetime | None, datetime | None]:
    """Where the candidate's and the stable arm's periods start.

    Reports before a percent change came from a different cohort size, so
    only the time since the candidate's last percent change counts, for both
    arms. At 100 % no device gets the stable release any more: the stable
    arm's period then starts at the last step below 100 %, so that step's
    stable reports are the comparison, while the candidate's still starts at
    the move to 100 % (so a decision at 100 % rests on reports of 100 %, and a
    second run right after the move finds none and waits).

    The signed history keeps whole seconds, so a report in the second of a
    change may be from before it: each period starts at the next second.

    Returns:
        (candidate start, stable start); the stable start is None when the
        candidate was never below 100 % (published ``--full``: no stable arm).
    """
    changed, stable = state.last_change_at(), _stable_since(state)
    return (
        changed + _SECOND if changed is not None else None,
        stable + _SECOND if stable is not None else None,
    )


_SECOND = timedelta(seconds=1)


def _stable_since(state: RolloutState) -> datetime | None:
    if state.candidate is None:
        return None
    for event in reversed(state.history):
        if event.action not in ("publish", "rollout") or event.after.candidate != state.candidate:
            continue
        if event.after.percent is not None and event.after.percent < 100:
            return event.at
        if event.action == "publish":
            break
    return None


def _merge(summaries: Iterable[ArmSummary]) -> ArmSummary | None:
    """One arm's summaries (the store may split an arm, say by variant) added up."""
    merged: ArmSummary | None = None
    for summary in summaries:
        if merged is None:
            merged = replace(
                summary,
                load_ms=dict(summary.load_ms),
                inference_p50_ms=dict(summary.inference_p50_ms),
                memory_peak_mb=dict(summary.memory_peak_mb),
            )
            continue
        for histogram, more in (
            (merged.load_ms, summary.load_ms),
            (merged.inference_p50_ms, summary.inference_p50_ms),
            (merged.memory_peak_mb, summary.memory_peak_mb),
        ):
            for index, count in more.items():
                histogram[index] = histogram.get(index, 0) + count
        merged = replace(
            merged,
            devices=merged.devices + summary.devices,
            probe_failed=merged.probe_failed + summary.probe_failed,
            load_failed=merged.load_failed + summary.load_failed,
            reverted=merged.reverted + summary.reverted,
            confirmed=merged.confirmed + summary.confirmed,
            # Parts of one arm may share networks: the sum is an upper bound.
            sources=merged.sources + summary.sources,
            sourced_devices=merged.sourced_devices + summary.sourced_devices,
            probe_failed_sources=merged.probe_failed_sources + summary.probe_failed_sources,
            load_failed_sources=merged.load_failed_sources + summary.load_failed_sources,
            reverted_sources=merged.reverted_sources + summary.reverted_sources,
            aged_devices=None
            if merged.aged_devices is None or summary.aged_devices is None
            else merged.aged_devices + summary.aged_devices,
            aged_reverted=merged.aged_reverted + summary.aged_reverted,
            aged_reverted_sources=merged.aged_reverted_sources + summary.aged_reverted_sources,
            aged_sources=merged.aged_sources + summary.aged_sources,
            stalled=merged.stalled + summary.stalled,
            stalled_sources=merged.stalled_sources + summary.stalled_sources,
            aged_stalled=merged.aged_stalled + summary.aged_stalled,
            aged_stalled_sources=merged.aged_stalled_sources + summary.aged_stalled_sources,
        )
    return merged


def analyze(
    summaries: Iterable[ArmSummary],
    *,
    unit: str,
    candidate: str,
    stable: str | None,
    since: datetime,
    guardrails: Guardrails,
    tiers: Sequence[str] = (),
    stable_since: datetime | None = None,
    members: Mapping[str, Iterable[ArmSummary]] | None = None,
) -> Analysis:
    """Compare the candidate arm with the concurrent stable arm in every tier.

    Args:
        summaries: What the report store holds for the period; summaries of
            other units, arms or versions are ignored.
        unit: The model or bundle.
        candidate: The candidate version (only candidate-arm reports of it count).
        stable: The stable version (only stable-arm reports of it count), or
            None for a first release: judged by the absolute limits alone.
        since: Start of the candidate's period (for the record: the store cut it).
        guardrails: The declared guardrails.
        tiers: The tiers the candidate is released to; a tier without reports
            is then inconclusive rather than absent. Tiers seen in the reports
            are analysed as well.
        stable_since: Start of the stable arm's period when it differs.
        members: For a bundle, each member's own summaries (the store's
            ``summaries(unit, model=member)``): latencies are then judged per
            member, one value per device, instead of over every member's rows.
    """
    arms = _arms(summaries, unit, candidate, stable)
    member_arms = {
        member: _arms(found, unit, candidate, stable)
        for member, found in sorted((members or {}).items())
    }
    seen = sorted({tier for tier, _ in arms} - set(tiers))
    results = []
    for tier in (*tiers, *seen):
        results.append(
            analyze_tier(
                tier,
                _merge(arms.get((tier, "candidate"), [])),
                _merge(arms.get((tier, "stable"), [])),
                guardrails,
                first_release=stable is None,
                members={
                    member: (
                        _merge(found.get((tier, "candidate"), [])),
                        _merge(found.get((tier, "stable"), [])),
                    )
                    for member, found in member_arms.items()
                },
            )
        )
    return Analysis(
        unit=unit,
        candidate=candidate,
        stable=stable,
        since=since,
        tiers=tuple(results),
        stable_since=stable_since if stable_since != since else None,
    )


def _arms(
    summaries: Iterable[ArmSummary], unit: str, candidate: str, stable: str | None
) -> dict[tuple[str, str], list[ArmSummary]]:
    arms: dict[tuple[str, str], list[ArmSummary]] = {}
    for summary in summaries:
        wanted = candidate if summary.arm == "candidate" else stable
        if summary.unit == unit and summary.version == wanted:
            arms.setdefault((summary.tier, summary.arm), []).append(summary)
    return arms


def analyze_tier(
    tier: str,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    guardrails: Guardrails,
    *,
    first_release: bool = False,
    members: Mapping[str, tuple[ArmSummary | None, ArmSummary | None]] | None = None,
) -> TierAnalysis:
    """Every guardrail of one tier (an arm without reports is None).

    With ``first_release`` there is no stable arm: rates are judged by their
    absolute limits, and latencies (which have no absolute limit) stay inconclusive.
    With ``members`` (a bundle) each latency guardrail is judged per member
    (``load_ms/det``): a member's rows are one per device, where the bundle's
    together would count each install once per member.
    """
    results: list[GuardrailResult] = []
    for name in RATE_GUARDRAILS:
        rule: RateGuardrail = getattr(guardrails, name)
        results.append(
            _rate_result(name, rule, candidate, stable, guardrails, first_release=first_release)
        )
    for name in LATENCY_GUARDRAILS:
        latency_rule: LatencyGuardrail = getattr(guardrails, name)
        if not latency_rule.enabled:
            continue
        if name in OPTIONAL_GUARDRAILS and not _reported(name, candidate, stable, members):
            continue
        if not members:
            results.append(_latency_result(name, latency_rule, candidate, stable, guardrails))
            continue
        for member, (member_candidate, member_stable) in members.items():
            result = _latency_result(
                name, latency_rule, member_candidate, member_stable, guardrails
            )
            results.append(replace(result, name=f"{name}/{member}"))
    return TierAnalysis(
        tier=tier,
        candidate_devices=candidate.devices if candidate else 0,
        stable_devices=stable.devices if stable else 0,
        guardrails=tuple(results),
        alarms=stable_alarms(tier, stable, guardrails),
    )


def _reported(
    name: str,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    members: Mapping[str, tuple[ArmSummary | None, ArmSummary | None]] | None,
) -> bool:
    """Whether any device of either arm reported the guardrail's value."""
    arms = [candidate, stable] + [arm for pair in (members or {}).values() for arm in pair]
    return any(arm is not None and getattr(arm, _LATENCY_FIELD[name]) for arm in arms)


def _too_few(candidate_n: int, stable_n: int, needed: int) -> str:
    short = [
        f"{arm} {count}"
        for arm, count in (("candidate", candidate_n), ("stable", stable_n))
        if count < needed
    ]
    return f"too few devices to pass ({', '.join(short)} of {needed} needed per arm)"


def _also_too_few(candidate_n: int, stable_n: int, needed: int) -> str:
    return (
        f"; {_too_few(candidate_n, stable_n, needed)}"
        if min(candidate_n, stable_n) < needed
        else ""
    )


def _points(rate: float) -> str:
    return f"{100 * rate:+.2f} pt"


def _rate_result(
    name: str,
    rule: RateGuardrail,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    guardrails: Guardrails,
    *,
    first_release: bool = False,
) -> GuardrailResult:
    alpha = guardrails.alpha
    needed = min_failing_devices(guardrails)
    ceiling = max_rate(rule)
    limit: dict[str, Number] = {
        "limit": rule.max_increase,
        "max_rate": ceiling,
        "alpha": alpha,
        "min_failing_devices": needed,
    }
    if isinstance(rule, UnconfirmedGuardrail):
        limit["stalled_starts"] = rule.stalled_starts
    # A soak step past revert or unconfirmed waits for most of the arm to be old
    # enough to show them: its first aged installs are too few to stand for it.
    mostly_aged = (
        name not in ("revert", "unconfirmed")
        or candidate is None
        or candidate.aged_devices is None
        or 2 * candidate.aged_devices >= candidate.devices
    )
    if name == "revert":
        young = candidate is not None and candidate.devices > 0 and candidate.aged_devices == 0
        candidate, stable = _aged(candidate), _aged(stable)
        if young:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"no candidate device installed {guardrails.revert_window_hours:g} h ago yet "
                "(revert_window_hours): a crash loop shows as a revert only after the app's "
                "unconfirmed starts",
                limit,
            )
    # A stall is reported as it happens: every install's counts toward a fail. A pass
    # needs installs old enough to have stalled, the revert guardrail's (_aged).
    pass_candidate, pass_stable = (
        (_aged(candidate), _aged(stable)) if name == "unconfirmed" else (candidate, stable)
    )
    if candidate is None or candidate.devices < 1:
        both = "" if first_release or (stable is not None and stable.devices) else " and stable"
        return GuardrailResult(
            name, rule.critical, "inconclusive", f"no candidate{both} reports in the period", limit
        )
    candidate_events = getattr(candidate, _RATE_FIELD[name])
    failing = failing_count(name, candidate, guardrails)
    # Counted in networks, both the failing devices and the arm (failing_count,
    # passing_devices): a forger's healthy tokens from one network cannot dilute a
    # real failure either.
    networks = passing_devices(candidate, guardrails)
    absolute = check_rate_limit(candidate_events, candidate.devices, limit=ceiling, alpha=alpha)
    above = (
        absolute
        if (failing, networks) == (candidate_events, candidate.devices)
        else check_rate_limit(failing, networks, limit=ceiling, alpha=alpha, interval=False)
    )
    own = {
        "candidate_events": candidate_events,
        "candidate_devices": candidate.devices,
        "candidate_rate": absolute.rate,
        "failing_counted": failing,
        "p_above_max_rate": above.p_above,
        **limit,
    }
    own_line = (
        f"candidate {100 * absolute.rate:.2f}% ({candidate_events}/{candidate.devices}), "
        f"{round(100 * (1 - alpha))}% CS {100 * absolute.ci_low:.2f}% to "
        f"{100 * absolute.ci_high:.2f}%, absolute limit {100 * ceiling:g}%"
    )
    # The absolute limit needs no stable arm: a candidate most of whose devices
    # fail is bad even when the stable fails alike (then both are, and the
    # stable's own alarm says so).
    short = _short_of_failing(name, candidate, guardrails)
    if above.p_above < alpha and short is None:
        failed_numbers = dict(own)
        beside = ""
        if stable is not None and stable.devices >= 1:
            stable_events = getattr(stable, _RATE_FIELD[name])
            failed_numbers.update(
                stable_events=stable_events,
                stable_devices=stable.devices,
                stable_rate=stable_events / stable.devices,
            )
            beside = (
                f" (stable {100 * stable_events / stable.devices:.2f}%, "
                f"{stable_events}/{stable.devices})"
            )
        return GuardrailResult(
            name,
            rule.critical,
            "fail",
            f"{own_line}{beside}; above the absolute limit ({_p(above.p_above)})"
            + _networks_note(failing, candidate_events),
            failed_numbers,
        )
    if stable is None or stable.devices < 1:
        if not first_release:
            return GuardrailResult(
                name, rule.critical, "inconclusive", "no stable reports in the period", own
            )
        # A first release has no stable arm: the absolute limit is all it is judged by.
        few_sources = _short_of_sources(guardrails, pass_candidate)
        pass_events, pass_devices = _passing_counts(name, pass_candidate, guardrails)
        if pass_devices < 1:
            p_below = 1.0
        elif (pass_events, pass_devices) == (candidate_events, candidate.devices):
            p_below = absolute.p_below
        else:
            p_below = check_rate_limit(
                pass_events, pass_devices, limit=ceiling, alpha=alpha, interval=False
            ).p_below
        networks_note = _counted(pass_devices, _devices(pass_candidate))
        if p_below < alpha and pass_devices >= guardrails.min_devices and few_sources is None:
            return GuardrailResult(
                name,
                rule.critical,
                "pass",
                f"{own_line}; no stable release: below the absolute limit ({_p(p_below)})"
                + _aged_note(pass_candidate, candidate, guardrails),
                own,
            )
        return GuardrailResult(
            name,
            rule.critical,
            "inconclusive",
            f"{own_line}; no stable release: not yet shown below the absolute limit"
            + (
                f"; too few devices to pass (candidate {pass_devices} of "
                f"{guardrails.min_devices} needed{networks_note})"
                if pass_devices < guardrails.min_devices
                else ""
            )
            + _aged_note(pass_candidate, candidate, guardrails),
            own,
        )
    stable_events = getattr(stable, _RATE_FIELD[name])
    result = compare_rates(
        candidate_events,
        candidate.devices,
        stable_events,
        stable.devices,
        margin=rule.max_increase,
        alpha=alpha,
    )
    # The evidence of a pass counts the candidate's networks as its devices (passing_counts),
    # of the unconfirmed guardrail only the installs old enough to have stalled.
    pass_events, pass_devices = _passing_counts(name, pass_candidate, guardrails)
    pass_stable_events = int(getattr(pass_stable, _RATE_FIELD[name], 0))
    pass_stable_devices = _devices(pass_stable)
    if min(pass_devices, pass_stable_devices) < 1:
        p_within = 1.0
    elif (pass_events, pass_devices, pass_stable_events, pass_stable_devices) == (
        candidate_events,
        candidate.devices,
        stable_events,
        stable.devices,
    ):
        p_within = result.p_within
    else:
        p_within = compare_rates(
            pass_events,
            pass_devices,
            pass_stable_events,
            pass_stable_devices,
            margin=rule.max_increase,
            alpha=alpha,
        ).p_within
    # The evidence of a fail counts the candidate in networks too (failing_count).
    worse = (
        result
        if (failing, networks) == (candidate_events, candidate.devices)
        else compare_rates(
            failing,
            networks,
            stable_events,
            stable.devices,
            margin=rule.max_increase,
            alpha=alpha,
        )
    )
    numbers: dict[str, Number] = {
        **own,
        "stable_events": result.stable_events,
        "stable_devices": result.stable_devices,
        "stable_rate": result.stable_rate,
        "difference": result.difference,
        "ci_low": result.ci_low,
        "ci_high": result.ci_high,
        "log_evidence": result.log_evidence,
        "p_worse": worse.p_worse,
        "p_within": p_within,
        "passing_devices": pass_devices,
    }
    level = round(100 * (1 - alpha))
    described = (
        f"candidate {100 * result.candidate_rate:.2f}% ({result.candidate_events}/"
        f"{result.candidate_devices}) vs stable {100 * result.stable_rate:.2f}% "
        f"({result.stable_events}/{result.stable_devices}): {_points(result.difference)}, "
        f"{level}% CS {_points(result.ci_low)} to {_points(result.ci_high)}, "
        f"limit {_points(rule.max_increase)}"
    )
    if worse.p_worse < alpha:
        if short is not None:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"{described}; above the limit ({_p(worse.p_worse)}) but {short}",
                numbers,
            )
        return GuardrailResult(
            name,
            rule.critical,
            "fail",
            f"{described}; above the limit ({_p(worse.p_worse)})"
            + _networks_note(failing, candidate_events),
            numbers,
        )
    counted = _counted(pass_devices, _devices(pass_candidate)) + _aged_note(
        pass_candidate, candidate, guardrails
    )
    # No harm shown: not even worse than the stable at all (the candidate's
    # networks counted, as for a fail), which a good candidate is shown with
    # probability alpha at most, however often it is looked at; and, for the
    # guardrails a young install cannot show yet, most of the arm aged.
    observed = (
        worse.ci_low <= 0
        and mostly_aged
        and _observed(guardrails, pass_devices, pass_stable_devices, pass_candidate, pass_stable)
    )
    if p_within < alpha:
        if min(pass_devices, pass_stable_devices) < guardrails.min_devices:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"{described}; "
                + _too_few(pass_devices, pass_stable_devices, guardrails.min_devices)
                + counted,
                numbers,
                observed=observed,
            )
        few_sources = _short_of_sources(guardrails, pass_candidate, pass_stable)
        if few_sources is not None:
            return GuardrailResult(
                name, rule.critical, "inconclusive", f"{described}; {few_sources}", numbers
            )
        return GuardrailResult(
            name,
            rule.critical,
            "pass",
            f"{described}; within the limit ({_p(p_within)})" + counted,
            numbers,
        )
    return GuardrailResult(
        name,
        rule.critical,
        "inconclusive",
        f"{described}; not enough evidence either way "
        f"({_p(min(worse.p_worse, p_within))})"
        + _networks_note(failing, candidate_events)
        + _also_too_few(pass_devices, pass_stable_devices, guardrails.min_devices)
        + counted,
        numbers,
        observed=observed,
    )


def _devices(arm: ArmSummary | None) -> int:
    return arm.devices if arm is not None else 0


def _passing_counts(name: str, arm: ArmSummary | None, guardrails: Guardrails) -> tuple[int, int]:
    return passing_counts(name, arm, guardrails) if arm is not None else (0, 0)


def _counted(networks: int, devices: int) -> str:
    if networks == devices:
        return ""
    return f" (a pass counts the candidate's {networks} networks as its devices, not {devices})"


def _networks_note(failing: int, events: int) -> str:
    if failing == events:
        return ""
    return f" (a fail counts {failing} of the {events} failing devices: one per network)"


def _aged(arm: ArmSummary | None) -> ArmSummary | None:
    """The arm's installs old enough to have reverted, or stalled (``revert_window_hours``).

    The revert guardrail counts only them; the unconfirmed guardrail passes only on them.
    """
    if arm is None or arm.aged_devices is None:
        return arm
    return replace(
        arm,
        devices=arm.aged_devices,
        reverted=arm.aged_reverted,
        reverted_sources=arm.aged_reverted_sources,
        stalled=arm.aged_stalled,
        stalled_sources=arm.aged_stalled_sources,
        sources=arm.aged_sources,
    )


def _aged_note(pass_arm: ArmSummary | None, arm: ArmSummary, guardrails: Guardrails) -> str:
    """What a pass of the unconfirmed guardrail counted, when not the whole arm."""
    if pass_arm is arm:
        return ""
    aged = pass_arm.devices if pass_arm is not None else 0
    return (
        f" (a pass counts only the {aged} candidate device(s) installed "
        f"{guardrails.revert_window_hours:g} h ago or more, revert_window_hours)"
    )


def failing_count(name: str, arm: ArmSummary, guardrails: Guardrails) -> int:
    """The failing devices a verdict rests on: one per source network, when sources are known.

    A forger mints tokens at will but networks slowly, so with
    ``count_networks`` (the default) each network counts as at most one
    failing device of the arm: a dozen forged reverts from one /24 are one.
    Genuine failures spread over the networks their devices sit in, so this
    loses little where devices have networks of their own, and makes fails
    slower where many sit behind a few carrier NATs. The arm itself is
    counted in networks too (:func:`passing_devices`), for fails and passes.
    """
    events = int(getattr(arm, _RATE_FIELD[name]))
    if not guardrails.count_networks or not _sourced(arm):
        return events
    return min(events, int(getattr(arm, _SOURCE_FIELD[name])))


def passing_devices(arm: ArmSummary, guardrails: Guardrails) -> int:
    """The candidate devices a verdict rests on: its networks, when sources are known.

    A forger's thousand healthy tokens from one network would otherwise
    outweigh the arm's genuine devices (pass a bad candidate, or dilute its
    failures below a fail); counted as one device they cannot (``count_networks``).
    """
    if not guardrails.count_networks or not _sourced(arm):
        return arm.devices
    return min(arm.devices, arm.sources)


def passing_counts(name: str, arm: ArmSummary, guardrails: Guardrails) -> tuple[int, int]:
    """(events, devices) of the candidate arm for a pass: its networks, each a device.

    The events stay whole (capped at the networks), so the rate a pass is
    judged on is never below the arm's own.
    """
    devices = passing_devices(arm, guardrails)
    return min(int(getattr(arm, _RATE_FIELD[name])), devices), devices


def _short_of_failing(name: str, candidate: ArmSummary, guardrails: Guardrails) -> str | None:
    """Why the candidate's failing devices are too few to fail on, or None when enough.

    Sources count only when the server knew them for most of the arm's devices.
    """
    events = failing_count(name, candidate, guardrails)
    if events < guardrails.min_failing_devices:
        networks = " (one per network)" if events < getattr(candidate, _RATE_FIELD[name]) else ""
        return (
            f"only {events} failing candidate device(s){networks}, "
            f"{guardrails.min_failing_devices} needed to fail"
        )
    sources = getattr(candidate, _SOURCE_FIELD[name])
    if _sourced(candidate) and sources < guardrails.min_failing_sources:
        return (
            f"the failing candidate devices come from {sources} network(s), "
            f"{guardrails.min_failing_sources} needed to fail"
        )
    return None


def _sourced(arm: ArmSummary) -> bool:
    """Whether the arm's sources are known for most of its devices.

    Behind a proxy that is not trusted the server knows no device's network;
    a few reports with a known one (say, a forger's through a trusted path)
    must not then decide for the rest.
    """
    return arm.sources > 0 and 2 * arm.sourced_devices >= arm.devices


def _observed(
    guardrails: Guardrails,
    candidate_devices: int,
    stable_devices: int,
    *arms: ArmSummary | None,
) -> bool:
    """Whether a guardrail not shown harmful saw enough to have shown a gross harm.

    The floor is ``min_soak_devices`` per arm, counted like a pass (in networks),
    from ``min_sources`` networks: forged installs cannot buy a soak step any
    more than a pass.
    """
    return (
        min(candidate_devices, stable_devices) >= guardrails.min_soak_devices
        and _short_of_sources(guardrails, *arms) is None
    )


def _short_of_sources(guardrails: Guardrails, *arms: ArmSummary | None) -> str | None:
    """Why the arms' devices come from too few networks to pass on, or None."""
    short = [
        f"{arm.arm} {arm.sources}"
        for arm in arms
        if arm is not None and _sourced(arm) and arm.sources < guardrails.min_sources
    ]
    if not short:
        return None
    return (
        f"devices from too few networks to pass ({', '.join(short)} of "
        f"{guardrails.min_sources} needed per arm)"
    )


def stable_alarms(tier: str, stable: ArmSummary | None, guardrails: Guardrails) -> tuple[str, ...]:
    """The rate guardrails whose absolute limit the stable arm itself is shown above.

    The candidate is compared with the stable; a stable that crash-loops on
    most devices hides a candidate that does too, so it is an alarm of its own.
    """
    if stable is None or stable.devices < 1:
        return ()
    alarms = []
    for name in RATE_GUARDRAILS:
        rule: RateGuardrail = getattr(guardrails, name)
        events = getattr(stable, _RATE_FIELD[name])
        check = check_rate_limit(
            events, stable.devices, limit=max_rate(rule), alpha=guardrails.alpha, interval=False
        )
        if check.p_above < guardrails.alpha and events >= min_failing_devices(guardrails):
            alarms.append(
                f"{tier}: the stable arm's {name} rate is {100 * check.rate:.1f}% "
                f"({events}/{stable.devices}), above the absolute limit "
                f"{100 * max_rate(rule):g}% ({_p(check.p_above)})"
            )
    return tuple(alarms)


def _latency_result(
    name: str,
    rule: LatencyGuardrail,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    guardrails: Guardrails,
) -> GuardrailResult:
    field_name = _LATENCY_FIELD[name]
    limit: dict[str, Number] = {"limit_pct": rule.max_increase_pct, "alpha": guardrails.alpha}
    histograms = [
        getattr(summary, field_name) if summary is not None else {}
        for summary in (candidate, stable)
    ]
    missing = [
        arm
        for arm, histogram in zip(("candidate", "stable"), histograms, strict=True)
        if not total(histogram)
    ]
    if missing:
        return GuardrailResult(
            name,
            rule.critical,
            "inconclusive",
            f"no {' and '.join(missing)} {name} values in the period",
            limit,
        )
    result = compare_latency(histograms[0], histograms[1], alpha=guardrails.alpha)
    # The verdict and the interval: time-uniform CDF bands, valid however often it looks.
    evidence = shift_evidence(
        histograms[0], histograms[1], limit_pct=rule.max_increase_pct, alpha=guardrails.alpha
    )
    shift, low, high = (
        result.percent(result.shift_ms),
        evidence.ci_low_pct,
        evidence.ci_high_pct,
    )
    numbers: dict[str, Number] = {
        "candidate_devices": result.candidate_devices,
        "stable_devices": result.stable_devices,
        "candidate_median_ms": result.candidate_median_ms,
        "stable_median_ms": result.stable_median_ms,
        "shift_ms": result.shift_ms,
        "shift_pct": shift,
        "ci_low_pct": low,
        # JSON has no infinity: no upper end shown yet is null.
        "ci_high_pct": None if math.isinf(high) else high,
        "u": result.u,
        "p_slower": result.p_slower,
        **limit,
    }
    level = round(100 * (1 - guardrails.alpha))
    unit = _UNIT.get(name, "ms")
    described = (
        f"median {result.candidate_median_ms:.3g} {unit} vs {result.stable_median_ms:.3g} {unit} "
        f"({result.candidate_devices} vs {result.stable_devices} devices): shift {shift:+.1f}% "
        f"of the stable median, {level}% CS {_pct(low)} to {_pct(high)}, limit "
        f"+{rule.max_increase_pct:g}%"
    )
    if evidence.slower:
        return GuardrailResult(name, rule.critical, "fail", f"{described}; slower", numbers)
    # A pass counts the candidate's networks as its devices (passing_devices).
    counted = (
        min(result.candidate_devices, passing_devices(candidate, guardrails))
        if candidate is not None
        else result.candidate_devices
    )
    observed = low <= 0 and _observed(guardrails, counted, result.stable_devices, candidate, stable)
    if evidence.within:
        if min(counted, result.stable_devices) < guardrails.min_devices:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"{described}; "
                + _too_few(counted, result.stable_devices, guardrails.min_devices)
                + _counted(counted, result.candidate_devices),
                numbers,
                observed=observed,
            )
        few_sources = _short_of_sources(guardrails, candidate, stable)
        if few_sources is not None:
            return GuardrailResult(
                name, rule.critical, "inconclusive", f"{described}; {few_sources}", numbers
            )
        return GuardrailResult(name, rule.critical, "pass", f"{described}; within", numbers)
    return GuardrailResult(
        name,
        rule.critical,
        "inconclusive",
        f"{described}; the sequence holds the limit"
        + _also_too_few(result.candidate_devices, result.stable_devices, guardrails.min_devices),
        numbers,
        observed=observed,
    )


def _pct(value: float) -> str:
    if math.isinf(value):
        return "+inf%"
    return f"{value:+.1f}%"
