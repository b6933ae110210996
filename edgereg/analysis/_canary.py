"""The canary analysis: every guardrail of every tier, candidate arm against stable arm.

Each guardrail is one :class:`GuardrailSpec` in :data:`SPECS` (what it counts,
which installs a fail and a pass count, its unit); its limits come from
``[rollout.guardrails.<name>]``. Verdicts rest on source networks in both arms,
robust to ``tolerated_networks`` of them (:mod:`edgereg.analysis._evidence`).
A tier whose arms are too small to be judged alone is judged within the pool
of every tier (:attr:`TierAnalysis.pooled`, :attr:`Analysis.pool`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Literal

from edgereg.analysis._evidence import (
    RateArm,
    rate_evidence,
    rate_limit_evidence,
    shift_evidence_robust,
)
from edgereg.analysis._rates import RateComparison
from edgereg.config import (
    BUILTIN_GUARDRAILS,
    AppMetric,
    BuiltinGuardrail,
    Guardrails,
    LatencyGuardrail,
    RateGuardrail,
)
from edgereg.protocol.wire import HistoryEvent, RolloutState
from edgereg.reports.summary import ArmSummary, MetricTally, Statistic, Tally, merge

Verdict = Literal["pass", "fail", "inconclusive"]
Number = float | int | None


@dataclass(frozen=True)
class GuardrailSpec:
    """One guardrail as the analysis runs it (its limits are ``[rollout.guardrails.<name>]``).

    A built-in one holds its entry of :data:`~edgereg.config.BUILTIN_GUARDRAILS`
    (``builtin``), which says what it counts and which installs a fail and a pass
    count; one on an app metric comes from :func:`metric_specs`.

    Attributes:
        name: As in ``[rollout.guardrails]``.
        kind: ``rate`` (a failure rate, in points), ``shift`` (a latency-like
            value, in percent of the stable) or ``metric`` (an app metric, judged
            as a rate of "worse").
        builtin: The built-in guardrail's entry; None for one on an app metric.
        label: For a guardrail on an app metric, what it judges, for people.
        metric: For a guardrail on an app metric, how it reads the metric's tallies.
        rule: For a guardrail on an app metric, its limits as a rate's.
    """

    name: str
    kind: Literal["rate", "shift", "metric"]
    builtin: BuiltinGuardrail | None = None
    label: str = ""
    metric: MetricView | None = None
    rule: RateGuardrail | None = None

    @classmethod
    def of(cls, builtin: BuiltinGuardrail) -> GuardrailSpec:
        """The spec of a built-in guardrail."""
        return cls(builtin.name, builtin.test, builtin)

    @property
    def event(self) -> str:
        """For a rate, the store's event (:data:`~edgereg.reports.summary.EVENTS`)."""
        return self.builtin.event if self.builtin is not None else ""

    @property
    def histogram(self) -> str:
        """For a shift, the store's histogram (:data:`~edgereg.reports.summary.HISTOGRAMS`)."""
        return self.builtin.histogram if self.builtin is not None else ""

    @property
    def fail_aged(self) -> bool:
        """A fail counts only installs old enough to have shown the event."""
        return self.builtin is not None and self.builtin.fail_aged

    @property
    def pass_aged(self) -> bool:
        """A pass (and a step without proof) counts only those."""
        return self.builtin is not None and self.builtin.pass_aged

    @property
    def unit(self) -> str:
        """How a shift's values read (``ms``, ``MB``)."""
        return self.builtin.unit if self.builtin is not None else ""

    @property
    def optional(self) -> bool:
        """Left out of a tier where no device of either arm reports it."""
        return self.builtin is not None and self.builtin.optional

    @property
    def what(self) -> str:
        """One line for people: what a failing device is."""
        return self.builtin.label if self.builtin is not None else self.label

    @property
    def parameters(self) -> tuple[str, ...]:
        """Keys of its table the store's count binds (``stalled_starts``)."""
        return self.builtin.parameters if self.builtin is not None else ()


@dataclass(frozen=True)
class MetricView:
    """How a guardrail on an app metric reads its tallies: as a rate of "worse" per device.

    A device's statistic (its success rate, its mean, its share below an edge) is
    a weighted sum of its bucket shares (:class:`~edgereg.reports.summary.MetricTally`),
    between the lowest and highest weight. Mapped onto [0, 1] in the worse
    direction, it is a rate like any other guardrail's, judged by the same
    always-valid evidence, per network (each network by its devices' mean), robust
    to the tolerated networks: the likelihood ratio stays a supermartingale for
    outcomes in [0, 1] (:mod:`edgereg.analysis._evidence`). The evidence treats each
    device's value as if it were a coin flip of that mean, which bounds its
    variance from above: valid, and slower than a test that knew the spread.

    Attributes:
        name: The app metric.
        weights: Per bucket, what a device's share in it adds to its statistic.
        worse_when_higher: Whether a higher statistic is worse.
        percent: Said in points (a rate, a share) rather than in ``unit`` (a mean).
        unit: How a mean reads.
    """

    name: str
    weights: tuple[float, ...]
    worse_when_higher: bool
    percent: bool
    unit: str = ""

    @property
    def low(self) -> float:
        return min(self.weights)

    @property
    def scale(self) -> float:
        """The statistic's range: a worse share of 1 is this much worse."""
        return max(self.weights) - min(self.weights)

    def statistic(self) -> Statistic:
        """What the store tallies for it."""
        return Statistic(self.name, len(self.weights), self.weights)

    def worse(self, tally: MetricTally) -> RateArm:
        """The tally as a rate-like arm: each network's statistic mapped onto its share of worse."""
        # worse = a + b * statistic, linear: sums and sums of squares map in closed form.
        b = (1 if self.worse_when_higher else -1) / self.scale
        a = -self.low * b if self.worse_when_higher else (self.low + self.scale) / self.scale
        n, total = tally.networks, tally.network_total
        return RateArm(
            n * a + b * total,
            n,
            tally.devices * a + b * tally.total,
            tally.devices,
            squares=n * a * a + 2 * a * b * total + b * b * tally.network_squares,
        )

    def value(self, worse_share: float) -> float:
        """A statistic, from the share of worse it maps to."""
        above = worse_share if self.worse_when_higher else 1 - worse_share
        return self.low + above * self.scale

    def said(self, worse_share: float) -> str:
        """A statistic as people read it."""
        value = self.value(worse_share)
        return f"{100 * value:.1f}%" if self.percent else f"{value:.3g}{_unit(self.unit)}"

    def said_worse(self, difference: float) -> str:
        """A difference of worse shares as people read it: how much worse."""
        if math.isnan(difference):
            return "nan"
        if self.percent:
            return f"{100 * difference:+.1f} pt"
        return f"{difference * self.scale:+.3g}{_unit(self.unit)}"


def _unit(unit: str) -> str:
    return f" {unit}" if unit else ""


def metric_specs(
    guardrails: Guardrails, declared: Mapping[str, AppMetric]
) -> tuple[GuardrailSpec, ...]:
    """The guardrails on app metrics the unit declares, as specs (the others judge nothing)."""
    specs = []
    for name, guardrail in sorted(guardrails.metric_guardrails().items()):
        metric = declared.get(guardrail.metric)
        if metric is None or not guardrail.enabled:
            continue
        weights = guardrail.weights(metric) or (0.0, 1.0)
        view = MetricView(
            guardrail.metric,
            tuple(weights),
            guardrail.worse_when_higher(metric),
            percent=guardrail.kind_of(metric) != "mean",
            unit=metric.unit,
        )
        if view.scale <= 0:
            continue
        judged = guardrail.kind_of(metric)
        if judged == "rate":
            what = f"{guardrail.metric}'s rate of success"
        elif judged == "mean":
            what = f"{guardrail.metric}'s mean"
        else:
            side = "at or below" if guardrail.stat == "share_below" else "above"
            what = f"{guardrail.metric}'s share {side} {guardrail.threshold:g}"
        specs.append(
            GuardrailSpec(
                name,
                "metric",
                label=what,
                metric=view,
                rule=RateGuardrail(
                    max_increase=min(1.0, guardrail.max_worse / view.scale),
                    max_rate=1.0,
                    critical=guardrail.critical,
                ),
            )
        )
    return tuple(specs)


SPECS: tuple[GuardrailSpec, ...] = tuple(GuardrailSpec.of(spec) for spec in BUILTIN_GUARDRAILS)
"""Every built-in guardrail (:data:`~edgereg.config.BUILTIN_GUARDRAILS`), in that order."""

SPEC: dict[str, GuardrailSpec] = {spec.name: spec for spec in SPECS}
RATE_GUARDRAILS: tuple[str, ...] = tuple(s.name for s in SPECS if s.kind == "rate")
"""Rate guardrails, each named as in ``[rollout.guardrails]``."""
LATENCY_GUARDRAILS: tuple[str, ...] = tuple(s.name for s in SPECS if s.kind == "shift")
"""Latency-like guardrails (a scale shift in percent), each named as in ``[rollout.guardrails]``."""

POOL = "all tiers"
"""The name of the pool a tier too small to be judged alone is judged in."""


@dataclass(frozen=True)
class GuardrailResult:
    """One guardrail of one tier.

    Attributes:
        name: The guardrail (``probe_failure``, ``load_ms``, ...).
        critical: A failure halts the rollout.
        verdict: pass, fail or inconclusive.
        reason: One line for people, with the numbers.
        numbers: The numbers, for scripts and the signed evidence (rates are
            fractions of networks, shifts in ms and in percent of the stable median).
        observed: An inconclusive result for want of proof alone: each arm held
            ``min_networks`` networks beyond the tolerated ones, most of the
            candidate arm was old enough where that matters, and no harm is
            shown with any tolerated networks set aside, so ``max_soak_hours``
            may step past it. False for any other inconclusive result.
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
        """The estimate a promotion reads, said with its unit, when beyond the limit; else None.

        Holding full exposure on it is a claim of harm, so, as a fail and a harm
        shown, it must survive setting aside the tolerated networks most against
        the candidate (its failing ones, the stable's healthy ones): the estimate
        is read with them set aside, and forged failures hold nothing.
        """
        estimate, limit = self.numbers.get("estimate"), self.numbers.get("limit")
        if isinstance(estimate, int | float) and isinstance(limit, int | float):
            return self._said(estimate) if estimate > limit else None
        shift, limit_pct = self.numbers.get("estimate_pct"), self.numbers.get("limit_pct")
        if isinstance(shift, int | float) and isinstance(limit_pct, int | float):
            return f"{shift:+.0f}%" if shift > limit_pct else None
        return None

    @property
    def clearly_beyond_limit(self) -> str | None:
        """The estimate, with its unit, when even its one-look lower end is beyond the limit.

        A tier's own estimate on a few hundred devices is too noisy to hold a good
        candidate on; one whose one-look 95 % interval lies beyond the limit is a harm
        confined to that tier that the pool would dilute.
        """
        low, limit = self.numbers.get("estimate_low"), self.numbers.get("limit")
        estimate = self.numbers.get("estimate")
        if isinstance(low, int | float) and isinstance(limit, int | float):
            return self._said(float(estimate or 0)) if low > limit else None
        low_pct, limit_pct = self.numbers.get("estimate_low_pct"), self.numbers.get("limit_pct")
        estimate_pct = self.numbers.get("estimate_pct")
        if isinstance(low_pct, int | float) and isinstance(limit_pct, int | float):
            return f"{float(estimate_pct or 0):+.0f}%" if low_pct > limit_pct else None
        return None

    @property
    def harm_left_open(self) -> str | None:
        """The upper end of the interval, said with its unit (what the evidence cannot exclude)."""
        high, high_pct = self.numbers.get("ci_high"), self.numbers.get("ci_high_pct")
        # No interval (an arm without networks in some case) is NaN: nothing to say.
        if isinstance(high, int | float) and math.isfinite(high):
            return self._said(high)
        if isinstance(high_pct, int | float) and math.isfinite(high_pct):
            return f"{high_pct:+.0f}%"
        return None

    def _said(self, rate: float) -> str:
        """A difference of rates in points, or an app metric's mean in its own terms."""
        scale = self.numbers.get("scale")
        if self.numbers.get("in_points") == 0 and isinstance(scale, int | float):
            return f"{rate * scale:+.3g} worse"
        return f"{100 * rate:+.1f} pt"


@dataclass(frozen=True)
class TierAnalysis:
    """Every guardrail of one tier (or of the pool of tiers).

    Attributes:
        tier: The device tier (:data:`POOL` for the pool).
        candidate_devices: Candidate devices that reported in the period.
        stable_devices: Stable devices that reported in the period.
        guardrails: One result per guardrail.
        alarms: What is wrong with the stable arm itself (its rates above the
            absolute limits): the comparison cannot see it, so it is said apart.
        candidate_networks: The candidate devices' source networks.
        stable_networks: The stable devices'.
        pooled: Too few networks in an arm to be judged alone (fewer than
            ``min_devices``, what a pass needs, beyond the tolerated ones): its
            fails still count, but its passes and observations are the pool's.
    """

    tier: str
    candidate_devices: int
    stable_devices: int
    guardrails: tuple[GuardrailResult, ...]
    alarms: tuple[str, ...] = ()
    candidate_networks: int = 0
    stable_networks: int = 0
    pooled: bool = False

    @property
    def verdict(self) -> Verdict:
        """Fail if a critical guardrail fails, pass if all pass, else inconclusive."""
        return combine(self.guardrails)

    @property
    def label(self) -> str:
        """How people read its name (the pool is "the pool of tiers")."""
        return "the pool of tiers" if self.tier == POOL else self.tier


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
        pool: Every tier's devices together (None with one tier): judged when
            some tier is too small to be judged alone, and what a promotion
            without proof reads the estimates of.
        notes: What the reader should know beside the verdicts (a clock skew).
    """

    unit: str
    candidate: str
    stable: str | None
    since: datetime
    tiers: tuple[TierAnalysis, ...]
    stable_since: datetime | None = None
    pool: TierAnalysis | None = None
    notes: tuple[str, ...] = ()

    @property
    def judged(self) -> tuple[TierAnalysis, ...]:
        """The analyses whose passes and observations count.

        The tiers judged alone, and the pool when a tier is too small to be.
        """
        alone = tuple(tier for tier in self.tiers if not tier.pooled)
        pooled = self.pool is not None and any(tier.pooled for tier in self.tiers)
        return alone + ((self.pool,) if pooled and self.pool is not None else ())

    @property
    def estimated(self) -> TierAnalysis | None:
        """Whose estimates a promotion (or the step to 100 %) without proof reads.

        The pool of every tier when there are several: a tier's own estimate
        on a few hundred devices is too noisy to hold a good candidate on, and
        a harm in one tier shows in the pool in proportion to its share (its
        own harm, once the evidence shows it, holds the rollout by itself).
        """
        if self.pool is not None:
            return self.pool
        return self.tiers[0] if self.tiers else None

    @property
    def verdict(self) -> Verdict:
        """Fail if a critical guardrail fails anywhere; pass if every judged one passes."""
        everywhere = [r for t in (*self.tiers, *self.judged) for r in t.guardrails]
        if combine(everywhere) == "fail":
            return "fail"
        return combine(r for t in self.judged for r in t.guardrails)

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
            "notes": list(self.notes),
            "tiers": [_tier_json(tier) for tier in self.tiers],
            "pool": None if self.pool is None else _tier_json(self.pool),
        }

    def evidence(self) -> dict[str, object]:
        """A compact summary for the signed history: verdicts and the key numbers, rounded.

        Kept small because the signed state keeps up to 200 history events.
        """
        tiers: dict[str, object] = {}
        for tier in (*self.tiers, *((self.pool,) if self.pool is not None else ())):
            tiers[tier.tier] = {
                "verdict": tier.verdict,
                **({"pooled": True} if tier.pooled else {}),
                "devices": [tier.candidate_devices, tier.stable_devices],
                "networks": [tier.candidate_networks, tier.stable_networks],
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
            **({"notes": list(self.notes)} if self.notes else {}),
            "tiers": tiers,
        }


def _tier_json(tier: TierAnalysis) -> dict[str, object]:
    return {
        "tier": tier.tier,
        "verdict": tier.verdict,
        "pooled": tier.pooled,
        "alarms": list(tier.alarms),
        "candidate_devices": tier.candidate_devices,
        "stable_devices": tier.stable_devices,
        "candidate_networks": tier.candidate_networks,
        "stable_networks": tier.stable_networks,
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


_EVIDENCE_KEYS = frozenset(
    {
        "candidate_rate",
        "stable_rate",
        "difference",
        "estimate",
        "ci_low",
        "ci_high",
        "p_worse",
        "p_above_max_rate",
        "limit",
        "shift_pct",
        "estimate_pct",
        "ci_low_pct",
        "ci_high_pct",
        "limit_pct",
        # What made a device fail (an install stalled): the verdict is read against it.
        *(key for spec in BUILTIN_GUARDRAILS for key in spec.parameters),
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
    """Where the candidate's and the stable arm's periods start, in time (see :func:`periods`).

    The signed history keeps whole seconds, so a report in the second of a
    change may be from before it: each period starts at the next second.

    Returns:
        (candidate start, stable start); the stable start is None when the
        candidate was never below 100 % (published ``--full``: no stable arm).
    """
    candidate, stable = _period_events(state)
    return (
        candidate.at + _SECOND if candidate is not None else None,
        stable.at + _SECOND if stable is not None else None,
    )


def analysis_sequences(state: RolloutState) -> tuple[int | None, int | None]:
    """Where the candidate's and the stable arm's periods start, as manifest sequences.

    Reports before a percent change came from a cohort of another size, and
    devices move from stable to candidate when the percent rises, so only
    the period since the candidate's last percent change counts, for both
    arms. Every device reports in each period (docs/protocol.md §11) with the
    sequence of the manifest it has, so a period is the reports whose
    sequence is at least the one of the change: no clock is compared. At
    100 % no device gets the stable release any more: the stable arm's period
    then starts at the last step below 100 %, while the candidate's still
    starts at the move to 100 % (so a decision at 100 % rests on reports of
    100 %, and a second run right after the move finds none and waits).

    Returns:
        (candidate start, stable start); the stable start is None when the
        candidate was never below 100 %.
    """
    candidate, stable = _period_events(state)
    return (
        candidate.sequence if candidate is not None else None,
        stable.sequence if stable is not None else None,
    )


_SECOND = timedelta(seconds=1)


def _period_events(state: RolloutState) -> tuple[HistoryEvent | None, HistoryEvent | None]:
    changed = None
    for event in reversed(state.history):
        if event.action in ("publish", "rollout"):
            changed = event
            break
    return changed, _stable_event(state)


def _stable_event(state: RolloutState) -> HistoryEvent | None:
    if state.candidate is None:
        return None
    for event in reversed(state.history):
        if event.action not in ("publish", "rollout") or event.after.candidate != state.candidate:
            continue
        if event.after.percent is not None and event.after.percent < 100:
            return event
        if event.action == "publish":
            break
    return None


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
    notes: Sequence[str] = (),
    intervals: bool = True,
    pool: Iterable[ArmSummary] | None = None,
    metrics: Mapping[str, AppMetric] | None = None,
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
            is then named (and judged within the pool) rather than absent.
            Tiers seen in the reports are analysed as well.
        stable_since: Start of the stable arm's period when it differs.
        members: For a bundle, each member's own summaries (the store's
            ``summaries(unit, model=member)``): latencies are then judged per
            member, one value per device, instead of over every member's rows.
        notes: Said beside the verdicts (a clock skew seen by the caller).
        intervals: False leaves the confidence sequences out (NaN in the numbers
            and the reasons): the verdicts are the same, at a fraction of the cost,
            for a simulation that looks thousands of times.
        pool: Every tier's installs together (the store's ``summaries(pooled=True)``:
            each network once); without it the tiers' summaries are added up, and
            the pool sets aside the tolerated networks once per tier (a network in
            several tiers would count in each).
        metrics: The app metrics the unit declares (models.toml): the guardrails
            on them are judged with the built-in ones (summaries carry their tallies).
    """
    arms = _arms(summaries, unit, candidate, stable)
    on_metrics = metric_specs(guardrails, metrics or {})
    member_arms = {
        member: _arms(found, unit, candidate, stable)
        for member, found in sorted((members or {}).items())
    }
    seen = sorted({tier for tier, _ in arms} - set(tiers))
    first_release = stable is None
    k = guardrails.tolerated_networks
    results = []
    for tier in (*tiers, *seen):
        cand = merge(arms.get((tier, "candidate"), []))
        stab = merge(arms.get((tier, "stable"), []))
        analysed = analyze_tier(
            tier,
            cand,
            stab,
            guardrails,
            first_release=first_release,
            members={
                member: (
                    merge(found.get((tier, "candidate"), [])),
                    merge(found.get((tier, "stable"), [])),
                )
                for member, found in member_arms.items()
            },
            intervals=intervals,
            metrics=on_metrics,
        )
        small = _networks(cand) - k < guardrails.min_devices or (
            not first_release and _networks(stab) - k < guardrails.min_devices
        )
        results.append(analysed if not small else _pooled(analysed))
    pool_analysis = None
    if len(results) > 1:
        # Every tier's devices together: what a tier too small to be judged alone is
        # judged within, and the estimates a promotion without proof reads.
        if pool is not None:
            pooled = _arms(pool, unit, candidate, stable)
            pool_c = merge(s for (_, a), found in pooled.items() if a == "candidate" for s in found)
            pool_s = merge(s for (_, a), found in pooled.items() if a == "stable" for s in found)
            tolerated = k
        else:
            pool_c = merge(s for (_, a), found in arms.items() if a == "candidate" for s in found)
            pool_s = merge(s for (_, a), found in arms.items() if a == "stable" for s in found)
            tolerated = k * len(results)
        pool_analysis = analyze_tier(
            POOL,
            pool_c,
            pool_s,
            guardrails,
            first_release=first_release,
            members={
                member: (
                    merge(s for (_, a), f in found.items() if a == "candidate" for s in f),
                    merge(s for (_, a), f in found.items() if a == "stable" for s in f),
                )
                for member, found in member_arms.items()
            },
            tolerated=tolerated,
            intervals=intervals,
            metrics=on_metrics,
        )
    else:
        # One tier: there is no pool to judge it in; it is judged alone, whatever its size.
        results = [replace(tier, pooled=False) for tier in results]
    return Analysis(
        unit=unit,
        candidate=candidate,
        stable=stable,
        since=since,
        tiers=tuple(results),
        stable_since=stable_since if stable_since != since else None,
        pool=pool_analysis,
        notes=tuple(notes),
    )


def _pooled(tier: TierAnalysis) -> TierAnalysis:
    return TierAnalysis(
        tier.tier,
        tier.candidate_devices,
        tier.stable_devices,
        tier.guardrails,
        tier.alarms,
        tier.candidate_networks,
        tier.stable_networks,
        pooled=True,
    )


def _networks(arm: ArmSummary | None) -> int:
    return arm.networks if arm is not None else 0


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
    tolerated: int | None = None,
    intervals: bool = True,
    metrics: Sequence[GuardrailSpec] = (),
) -> TierAnalysis:
    """Every guardrail of one tier (an arm without reports is None).

    With ``first_release`` there is no stable arm: rates are judged by their
    absolute limits, and latencies (which have no absolute limit) stay inconclusive.
    With ``members`` (a bundle) each latency guardrail is judged per member
    (``load_ms/det``): a member's rows are one per device, where the bundle's
    together would count each install once per member. ``tolerated``: the
    networks every verdict must hold without (``tolerated_networks`` by default).
    ``metrics``: the guardrails on the unit's app metrics (:func:`metric_specs`).
    """
    k = guardrails.tolerated_networks if tolerated is None else tolerated
    results: list[GuardrailResult] = []
    for spec in (*SPECS, *metrics):
        if spec.kind in ("rate", "metric"):
            rule = spec.rule or guardrails.rate_rule(spec.name)
            if not rule.enabled:  # a metric's is already left out by metric_specs
                continue
            results.append(
                _rate_result(spec, rule, candidate, stable, guardrails, k, first_release, intervals)
            )
            continue
        latency_rule = guardrails.shift_rule(spec.name)
        if not latency_rule.enabled:
            continue
        if spec.optional and not _reported(spec, candidate, stable, members):
            continue
        if not members:
            results.append(
                _shift_result(spec, latency_rule, candidate, stable, guardrails, k, intervals)
            )
            continue
        for member, (member_candidate, member_stable) in members.items():
            result = _shift_result(
                spec, latency_rule, member_candidate, member_stable, guardrails, k, intervals
            )
            results.append(
                GuardrailResult(
                    f"{spec.name}/{member}",
                    result.critical,
                    result.verdict,
                    result.reason,
                    result.numbers,
                    result.observed,
                )
            )
    return TierAnalysis(
        tier=tier,
        candidate_devices=candidate.devices if candidate else 0,
        stable_devices=stable.devices if stable else 0,
        guardrails=tuple(results),
        alarms=stable_alarms(tier, stable, guardrails, k),
        candidate_networks=_networks(candidate),
        stable_networks=_networks(stable),
    )


def _reported(
    spec: GuardrailSpec,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    members: Mapping[str, tuple[ArmSummary | None, ArmSummary | None]] | None,
) -> bool:
    """Whether any device of either arm reported the guardrail's value."""
    arms = [candidate, stable] + [arm for pair in (members or {}).values() for arm in pair]
    return any(arm is not None and arm.histogram(spec.histogram) for arm in arms)


def _points(rate: float) -> str:
    return f"{100 * rate:+.2f} pt"


def _tally(arm: ArmSummary | None, aged: bool) -> Tally | None:
    if arm is None:
        return None
    return arm.aged_or_all if aged else arm.all


def _rate_arm(tally: Tally | None, event: str) -> RateArm:
    """One arm's counts for a rate verdict: each network by the share of its devices.

    The devices' own rate is for people only: a forger's tokens move it, its
    networks do not (beyond the tolerated ones). A harm confined to one
    carrier NAT weighs one network, as its devices' share.
    """
    if tally is None:
        return RateArm(0.0, 0)
    return RateArm(tally.network_count(event), tally.networks, tally.count(event), tally.devices)


def _arm_of(spec: GuardrailSpec, summary: ArmSummary | None, aged: bool) -> RateArm:
    """One arm's counts for a rate-like verdict: the guardrail's event, or its app metric."""
    view = spec.metric
    if view is None:
        return _rate_arm(_tally(summary, aged), spec.event)
    tally = summary.metric(spec.name) if summary is not None else None
    if tally is None or tally.networks < 1:
        return RateArm(0.0, 0, squares=0.0)
    return view.worse(tally)


def _line(
    spec: GuardrailSpec,
    comparison: RateComparison,
    c: RateArm,
    s: RateArm,
    level: int,
    aside: int,
    margin: float,
) -> str:
    """A rate comparison for people: in points of failing devices, or in the app metric's terms."""
    view = spec.metric
    if view is None:
        return _rate_line(comparison, c, s, level, aside, margin)
    note = f", {aside} network(s) set aside" if aside else ""
    return (
        f"{spec.what}: candidate {view.said(c.events / c.networks)} vs stable "
        f"{view.said(s.events / s.networks)} ({_of(round(c.devices), c.networks)} vs "
        f"{_of(round(s.devices), s.networks)}): {view.said_worse(comparison.difference)} worse, "
        f"{level}% CS {view.said_worse(comparison.ci_low)} to "
        f"{view.said_worse(comparison.ci_high)}{note}, limit {view.said_worse(margin)} worse"
    )


def _counted(arm: RateArm) -> str:
    """``5/200`` of networks, with the devices when they differ."""
    text = f"{_share(arm.events)}/{arm.networks}"
    if (arm.device_events, arm.devices) != (round(arm.events), arm.networks) or arm.events != round(
        arm.events
    ):
        text += f" networks; {arm.device_events}/{arm.devices} devices"
    return text


def _share(value: float) -> str:
    return f"{value:.0f}" if abs(value - round(value)) < 1e-9 else f"{value:.2f}"


def _rate_line(
    comparison: RateComparison, c: RateArm, s: RateArm, level: int, aside: int, margin: float
) -> str:
    note = f", {aside} network(s) set aside" if aside else ""
    return (
        f"candidate {100 * c.events / c.networks:.2f}% ({_counted(c)}) vs stable "
        f"{100 * s.events / s.networks:.2f}% ({_counted(s)}): {_points(comparison.difference)}, "
        f"{level}% CS {_points(comparison.ci_low)} to {_points(comparison.ci_high)}{note}, "
        f"limit {_points(margin)}"
    )


def _rate_result(
    spec: GuardrailSpec,
    rule: RateGuardrail,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    guardrails: Guardrails,
    k: int,
    first_release: bool,
    intervals: bool = True,
) -> GuardrailResult:
    name, alpha = spec.name, guardrails.alpha
    level = round(100 * (1 - alpha))
    limit: dict[str, Number] = {
        "limit": rule.max_increase,
        "max_rate": rule.max_rate,
        "alpha": alpha,
        "tolerated_networks": k,
        "min_failing_devices": guardrails.min_failing_devices,
    }
    for key in spec.parameters:
        limit[key] = getattr(rule, key)
    if spec.metric is not None:
        # Rates here are shares of "worse" on [0, 1]: what one of them is in the metric's terms.
        limit["scale"] = spec.metric.scale
        limit["in_points"] = int(spec.metric.percent)

    def result(
        verdict: Verdict, reason: str, numbers: dict[str, Number], *, observed: bool = False
    ) -> GuardrailResult:
        return GuardrailResult(name, rule.critical, verdict, reason, numbers, observed)

    if candidate is None or candidate.devices < 1:
        both = "" if first_release or (stable is not None and stable.devices) else " and stable"
        return result("inconclusive", f"no candidate{both} reports in the period", limit)
    window = f"{guardrails.revert_window_hours:g} h"
    fail_c = _arm_of(spec, candidate, spec.fail_aged)
    pass_c = _arm_of(spec, candidate, spec.pass_aged)
    if spec.metric is not None:
        counted_by = f"counted {spec.metric.name}"
        if fail_c.networks < 1:
            return result("inconclusive", f"no candidate device {counted_by} in the period", limit)
        if first_release:
            # An app metric has no absolute limit: only the stable arm is a measure.
            return result(
                "pass",
                f"no stable release to compare {spec.what} with "
                f"(candidate {spec.metric.said(fail_c.events / fail_c.networks)})",
                limit,
            )
        if _arm_of(spec, stable, spec.fail_aged).networks < 1:
            return result("inconclusive", f"no stable device {counted_by} in the period", limit)
    if spec.fail_aged and fail_c.devices == 0:
        return result(
            "inconclusive",
            f"no candidate device installed {window} ago yet (revert_window_hours): a crash "
            "loop shows as a revert only after the app's unconfirmed starts",
            limit,
        )
    plain, above, _below = rate_limit_evidence(
        fail_c, limit=rule.max_rate, alpha=alpha, k=k, intervals=intervals
    )
    own: dict[str, Number] = {
        "candidate_events": fail_c.device_events,
        "candidate_devices": fail_c.devices,
        "candidate_networks": fail_c.networks,
        "candidate_failing_networks": round(fail_c.events, 4),
        "candidate_rate": plain.rate,
        "p_above_max_rate": above.p_above if above is not None else 1.0,
        **limit,
    }
    own_line = (
        f"candidate {100 * plain.rate:.2f}% ({_counted(fail_c)}), {level}% CS "
        f"{100 * plain.ci_low:.2f}% to {100 * plain.ci_high:.2f}%, absolute limit "
        f"{100 * rule.max_rate:g}%"
    )
    # Enough to fail on: failing networks and networks beyond the tolerated ones.
    failing_beyond = fail_c.events - k

    def short_of_failing(*arms: RateArm) -> str | None:
        if failing_beyond < guardrails.min_failing_devices:
            return (
                f"only {_share(max(failing_beyond, 0.0))} failing candidate network(s) beyond "
                f"the {k} tolerated, {guardrails.min_failing_devices} needed to fail"
            )
        if spec.metric is None:
            # A rate's evidence is exact at any count, and a fail already survives setting
            # aside the tolerated networks with min_failing_devices failing beyond them: a
            # forger's networks cannot make one. So a small arm fails when it shows it
            # (12 canary devices, 10 failing): min_networks would leave it unhalted forever.
            return None
        # An app metric's evidence is asymptotic (the means nearly normal): it needs networks.
        few = [a for a in arms if a.networks - k < guardrails.min_networks]
        if few:
            return (
                f"too few networks to fail on ({', '.join(str(a.networks) for a in few)}; "
                f"min_networks {guardrails.min_networks} beyond the {k} tolerated per arm)"
            )
        return None

    if above is not None and above.p_above < alpha and short_of_failing(fail_c) is None:
        failed_numbers = dict(own)
        beside = ""
        if stable is not None and stable.devices >= 1:
            s = _arm_of(spec, stable, spec.fail_aged)
            if s.networks:
                failed_numbers.update(
                    stable_events=s.device_events,
                    stable_devices=s.devices,
                    stable_networks=s.networks,
                    stable_rate=s.events / s.networks,
                )
                beside = f" (stable {100 * s.events / s.networks:.2f}%, {_counted(s)})"
        return result(
            "fail",
            f"{own_line}{beside}; above the absolute limit with {k} failing network(s) set "
            f"aside ({_p(above.p_above)})",
            failed_numbers,
        )
    if stable is None or stable.devices < 1:
        if not first_release:
            return result("inconclusive", "no stable reports in the period", own)
        # A first release has no stable arm: the absolute limit is all it is judged by.
        below_pass = (
            rate_limit_evidence(pass_c, limit=rule.max_rate, alpha=alpha, k=k)[2]
            if pass_c.networks
            else None
        )
        enough = pass_c.networks - k >= guardrails.min_devices
        if below_pass is not None and below_pass.p_below < alpha and enough:
            return result(
                "pass",
                f"{own_line}; no stable release: below the absolute limit "
                f"({_p(below_pass.p_below)})" + _aged_note(spec, candidate, guardrails),
                own,
            )
        return result(
            "inconclusive",
            f"{own_line}; no stable release: not yet shown below the absolute limit"
            + (
                f"; too few networks to pass (candidate {pass_c.networks} of "
                f"{guardrails.min_devices} needed beyond the {k} tolerated)"
                if not enough
                else ""
            )
            + _aged_note(spec, candidate, guardrails),
            own,
        )
    fail_s = _arm_of(spec, stable, spec.fail_aged)
    pass_s = _arm_of(spec, stable, spec.pass_aged)
    if fail_s.networks < 1:
        return result("inconclusive", f"no stable device installed {window} ago yet", own)
    fail_side = rate_evidence(
        fail_c, fail_s, margin=rule.max_increase, alpha=alpha, k=k, intervals=intervals
    )
    pass_side = (
        fail_side
        if (pass_c, pass_s) == (fail_c, fail_s)
        else (
            rate_evidence(
                pass_c, pass_s, margin=rule.max_increase, alpha=alpha, k=k, intervals=intervals
            )
            if pass_c.networks and pass_s.networks
            else None
        )
    )
    plain_cmp = fail_side.plain
    numbers: dict[str, Number] = {
        **own,
        "stable_events": fail_s.device_events,
        "stable_devices": fail_s.devices,
        "stable_networks": fail_s.networks,
        "stable_rate": plain_cmp.stable_rate,
        "difference": plain_cmp.difference,
        "ci_low": plain_cmp.ci_low,
        "ci_high": pass_side.ci_high if pass_side is not None else plain_cmp.ci_high,
        "log_evidence": plain_cmp.log_evidence,
        "p_worse": fail_side.p_worse,
        "p_within": pass_side.p_within if pass_side is not None else 1.0,
        "estimate": pass_side.estimate if pass_side is not None else plain_cmp.difference,
        "estimate_low": pass_side.estimate_low if pass_side is not None else None,
        "passing_networks": pass_c.networks,
    }
    if fail_side.p_worse < alpha:
        shown = fail_side.fail_case or plain_cmp
        described = _line(spec, shown, fail_c, fail_s, level, k, rule.max_increase)
        numbers.update(ci_low=shown.ci_low, ci_high=shown.ci_high)
        short = short_of_failing(fail_c, fail_s)
        if short is not None:
            return result(
                "inconclusive",
                f"{described}; above the limit ({_p(fail_side.p_worse)}) but {short}",
                numbers,
            )
        return result("fail", f"{described}; above the limit ({_p(fail_side.p_worse)})", numbers)
    pass_networks = min(pass_c.networks, pass_s.networks) - k
    mostly_aged = not spec.pass_aged or 2 * pass_c.networks >= _networks(candidate)
    observed = (
        pass_side is not None
        and pass_side.harmless
        and mostly_aged
        and pass_networks >= guardrails.min_networks
    )
    counted = _aged_note(spec, candidate, guardrails)
    if pass_side is not None and pass_side.p_within < alpha:
        shown = pass_side.pass_case or plain_cmp
        described = _line(spec, shown, pass_c, pass_s, level, k, rule.max_increase)
        numbers.update(ci_low=shown.ci_low, ci_high=shown.ci_high)
        if pass_networks < guardrails.min_devices:
            return result(
                "inconclusive",
                described
                + _too_few(pass_c.networks, pass_s.networks, guardrails.min_devices, k)
                + counted,
                numbers,
                observed=observed,
            )
        return result(
            "pass",
            f"{described}; within the limit ({_p(pass_side.p_within)})" + counted,
            numbers,
        )
    described = _line(spec, plain_cmp, fail_c, fail_s, level, 0, rule.max_increase)
    harm = (
        "; a harm is shown whichever networks are set aside"
        if pass_side is not None and pass_side.harm_shown and not pass_side.harmless
        else ""
    )
    return result(
        "inconclusive",
        f"{described}; not enough evidence either way "
        f"({_p(min(fail_side.p_worse, numbers['p_within'] or 1.0))})"
        + harm
        + _too_few(pass_c.networks, pass_s.networks, guardrails.min_devices, k)
        + counted,
        numbers,
        observed=observed,
    )


def _too_few(candidate: int, stable: int, needed: int, k: int) -> str:
    """Which arm is short of networks to pass, or ""."""
    short = [
        f"{arm} {count}"
        for arm, count in (("candidate", candidate), ("stable", stable))
        if count - k < needed
    ]
    if not short:
        return ""
    return (
        f"; too few networks to pass ({', '.join(short)} of {needed} needed per arm beyond "
        f"the {k} tolerated)"
    )


def _aged_note(spec: GuardrailSpec, candidate: ArmSummary, guardrails: Guardrails) -> str:
    """What a pass of a guardrail that needs old installs counted, when not the whole arm."""
    if not spec.pass_aged or candidate.aged is None:
        return ""
    return (
        f" (a pass counts only the {candidate.aged.networks} candidate network(s) installed "
        f"{guardrails.revert_window_hours:g} h ago or more, revert_window_hours)"
    )


def stable_alarms(
    tier: str, stable: ArmSummary | None, guardrails: Guardrails, k: int | None = None
) -> tuple[str, ...]:
    """The rate guardrails whose absolute limit the stable arm itself is shown above.

    The candidate is compared with the stable; a stable that crash-loops on
    most devices hides a candidate that does too, so it is an alarm of its own.
    """
    if stable is None or stable.devices < 1:
        return ()
    k = guardrails.tolerated_networks if k is None else k
    alarms = []
    for spec in SPECS:
        if spec.kind != "rate":
            continue
        rule = guardrails.rate_rule(spec.name)
        if not rule.enabled:
            continue
        arm = _rate_arm(_tally(stable, spec.fail_aged), spec.event)
        if arm.networks < 1:
            continue
        _, above, _ = rate_limit_evidence(
            arm, limit=rule.max_rate, alpha=guardrails.alpha, k=k, intervals=False
        )
        if (
            above is not None
            and above.p_above < guardrails.alpha
            and arm.events - k >= guardrails.min_failing_devices
        ):
            alarms.append(
                f"{tier}: the stable arm's {spec.name} rate is "
                f"{100 * arm.events / arm.networks:.1f}% ({_counted(arm)}), above the "
                f"absolute limit {100 * rule.max_rate:g}% ({_p(above.p_above)})"
            )
    return tuple(alarms)


def _shift_result(
    spec: GuardrailSpec,
    rule: LatencyGuardrail,
    candidate: ArmSummary | None,
    stable: ArmSummary | None,
    guardrails: Guardrails,
    k: int,
    intervals: bool = True,
) -> GuardrailResult:
    name = spec.name
    limit: dict[str, Number] = {
        "limit_pct": rule.max_increase_pct,
        "alpha": guardrails.alpha,
        "tolerated_networks": k,
    }
    histograms = [
        arm.histogram(spec.histogram) if arm is not None else None for arm in (candidate, stable)
    ]
    missing = [
        arm
        for arm, histogram in zip(("candidate", "stable"), histograms, strict=True)
        if not histogram
    ]
    if missing:
        return GuardrailResult(
            name,
            rule.critical,
            "inconclusive",
            f"no {' and '.join(missing)} {name} values in the period",
            limit,
        )
    c, s = histograms
    assert c is not None
    assert s is not None
    evidence = shift_evidence_robust(
        (c.devices, c.low, c.high),
        (s.devices, s.low, s.high),
        limit_pct=rule.max_increase_pct,
        alpha=guardrails.alpha,
        k=k,
        intervals=intervals,
    )
    plain = evidence.plain
    shift = plain.percent(plain.shift_ms)
    numbers: dict[str, Number] = {
        "candidate_devices": plain.candidate_devices,
        "stable_devices": plain.stable_devices,
        "candidate_networks": evidence.candidate_networks,
        "stable_networks": evidence.stable_networks,
        "candidate_median_ms": plain.candidate_median_ms,
        "stable_median_ms": plain.stable_median_ms,
        "shift_ms": plain.shift_ms,
        "shift_pct": shift,
        "estimate_pct": evidence.estimate_pct,
        "estimate_low_pct": evidence.estimate_low_pct,
        "ci_low_pct": evidence.ci_low_pct,
        # JSON has no infinity: no upper end shown yet is null.
        "ci_high_pct": None if math.isinf(evidence.ci_high_pct) else evidence.ci_high_pct,
        "u": plain.u,
        "p_slower": plain.p_slower,
        **limit,
    }
    level = round(100 * (1 - guardrails.alpha))
    networks = min(evidence.candidate_networks, evidence.stable_networks) - k
    described = (
        f"median {plain.candidate_median_ms:.3g} {spec.unit} vs {plain.stable_median_ms:.3g} "
        f"{spec.unit} ({_of(plain.candidate_devices, evidence.candidate_networks)} vs "
        f"{_of(plain.stable_devices, evidence.stable_networks)}): shift {shift:+.1f}% of the "
        f"stable median, {level}% CS {_pct(evidence.ci_low_pct)} to "
        f"{_pct(evidence.ci_high_pct)} with {k} network(s) set aside, limit "
        f"+{rule.max_increase_pct:g}%"
    )
    if evidence.slower:
        if networks < guardrails.min_networks:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"{described}; slower, but too few networks to fail on (min_networks "
                f"{guardrails.min_networks} beyond the {k} tolerated per arm)",
                numbers,
            )
        return GuardrailResult(name, rule.critical, "fail", f"{described}; slower", numbers)
    observed = evidence.harmless and networks >= guardrails.min_networks
    if evidence.within:
        if networks < guardrails.min_devices:
            return GuardrailResult(
                name,
                rule.critical,
                "inconclusive",
                f"{described}; within, but too few networks to pass (min_devices "
                f"{guardrails.min_devices} beyond the {k} tolerated per arm)",
                numbers,
                observed=observed,
            )
        return GuardrailResult(name, rule.critical, "pass", f"{described}; within", numbers)
    return GuardrailResult(
        name,
        rule.critical,
        "inconclusive",
        f"{described}; the sequence holds the limit"
        + ("; a slowdown is shown" if evidence.harm_shown else "")
        + (
            f"; too few networks (min_networks {guardrails.min_networks} beyond the {k} "
            "tolerated per arm)"
            if networks < guardrails.min_networks
            else ""
        ),
        numbers,
        observed=observed,
    )


def _of(devices: int, networks: int) -> str:
    return f"{devices} devices" if devices == networks else f"{networks} networks"


def _pct(value: float) -> str:
    if math.isinf(value):
        return "+inf%"
    return f"{value:+.1f}%"
