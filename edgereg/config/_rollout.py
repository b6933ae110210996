"""[rollout]: steps, soak time and the canary guardrails."""

from __future__ import annotations

import itertools
from typing import Annotated, Any

from pydantic import ConfigDict, Field, field_validator, model_validator

from edgereg.config._base import MAX_HOURS, _rule_error, _Strict
from edgereg.config._metrics import MetricGuardrail


class RateGuardrail(_Strict):
    """A failure rate the candidate arm may not raise above the stable arm's."""

    max_increase: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Largest allowed candidate rate minus stable rate (0.01 = one point).",
    )
    max_rate: float = Field(
        default=0.2,
        gt=0,
        le=1,
        description="Absolute limit of the candidate's rate, whatever the stable arm's: a "
        "candidate shown above it fails even when the stable fails alike (a stable shown "
        "above it raises an alarm); a first release is judged by it alone.",
    )
    critical: bool = Field(
        default=True, description="A failure pauses the rollout (and rolls back by policy)."
    )


class UnconfirmedGuardrail(RateGuardrail):
    """Installs not confirmed after a declared number of app starts: a crash loop, early."""

    stalled_starts: int = Field(
        default=2,
        ge=1,
        description="App starts without a confirmation that make an install stalled (the "
        "failing device of this guardrail; report schema 2's unconfirmed_starts, sent at each "
        "start as it happens). 2: one start the user ended before the model ran is not a "
        "failure yet. Keep it at most the app's max_unconfirmed_starts (3 by default): a "
        "revert's report keeps the count it reverted at, so a higher one never counts it.",
    )


class LatencyGuardrail(_Strict):
    """A latency the candidate arm may not shift above the stable arm's."""

    max_increase_pct: float = Field(
        default=10.0,
        ge=0,
        description="Largest allowed slowdown, in percent of the stable (a scale shift, "
        "judged with confidence bands valid at every look).",
    )
    critical: bool = Field(default=False, description="A failure pauses the rollout.")
    enabled: bool = Field(
        default=True,
        description="false: not analysed at all (say, where the values measure the harness, "
        "not the model). Evidence valid at any look cannot pass a latency on a few dozen "
        "devices per arm, so a small fleet that wants --auto to promote turns it off.",
    )


class Guardrails(_Strict):
    """What the canary analysis checks and automatic rollouts act on, per tier.

    Besides the built-in guardrails below, a table of any other name is a guardrail
    on an app metric the unit declares: `[rollout.guardrails.accepted]` with
    `metric = "accepted"` and `max_worse = 0.01`.
    """

    model_config = ConfigDict(
        extra="allow", frozen=True, strict=True, allow_inf_nan=False, defer_build=True
    )
    __pydantic_extra__: dict[str, MetricGuardrail] = Field(init=False)

    def metric_guardrails(self) -> dict[str, MetricGuardrail]:
        """The guardrails on app metrics, by name."""
        return dict(self.__pydantic_extra__ or {})

    @model_validator(mode="before")
    @classmethod
    def _others_name_a_metric(cls, data: Any) -> Any:
        # A table that is neither a built-in guardrail nor names a metric is a typo.
        if isinstance(data, dict):
            for name, value in data.items():
                if name in cls.model_fields:
                    continue
                if not isinstance(value, dict) or "metric" not in value:
                    builtin = ", ".join(
                        n for n, f in cls.model_fields.items() if f.annotation in _TABLES
                    )
                    raise _rule_error(
                        name,
                        f"unknown guardrail '{name}': the built-in ones are {builtin}; a "
                        'guardrail on an app metric names it: metric = "<metric>"',
                    )
        return data

    # Above 0.5 a one-sided test could call identical arms different.
    alpha: float = Field(
        default=0.05,
        gt=0,
        le=0.5,
        description="Error allowed at each rollout step over every look: rate evidence is "
        "always valid (a mixture SPRT), and so is latency evidence (time-uniform "
        "confidence bands), so running --auto often does not raise it; intervals are "
        "1 - alpha confidence sequences.",
    )
    tolerated_networks: int = Field(
        default=3,
        ge=0,
        le=100,
        description="Source networks (IPv4 /24, IPv6 /48) a forger may hold without moving "
        "any verdict: every fail, pass, harm and estimate must hold whichever this many "
        "networks are set aside, in either arm (docs/operations/report-threats.md). Each "
        "network counts once whatever its devices (or forged tokens); a device whose "
        "network the server did not see counts as a network of its own.",
    )
    min_devices: int = Field(
        default=50,
        ge=1,
        description="Networks (one per device where each has its own) each arm of a tier "
        "needs, beyond the tolerated ones, before a guardrail can pass.",
    )
    min_networks: int = Field(
        default=10,
        ge=1,
        description="Networks each arm needs, beyond the tolerated ones, before a guardrail "
        "can fail on the comparison, show a harm, or be stepped past by max_soak_hours; a "
        "tier with fewer in an arm is judged within the pool of every tier for its passes "
        "(its fails still count). Below min_devices on purpose: an early step only has to "
        "rule out gross harm, which a few networks show.",
    )
    min_failing_devices: int = Field(
        default=3,
        ge=1,
        description="Failing candidate networks, beyond the tolerated ones, a rate guardrail "
        "needs before it can fail (Argo Rollouts' failureLimit): one event on one device is "
        "never a verdict.",
    )
    revert_window_hours: float = Field(
        default=72.0,
        ge=0,
        le=MAX_HOURS,
        description="How long after its install a device can take to revert a crash-looping "
        "model (the app's max_unconfirmed_starts starts; 3 for an app started once a day): "
        "the revert guardrail counts only installs that first reported at least this long "
        "before the report store's newest report (the report servers' clock), and the "
        "unconfirmed and first_start guardrails pass only on them (they fail on every "
        "install), so a young cohort that has not crash-looped yet cannot pass either. 0 "
        "counts every install.",
    )
    probe_failure: RateGuardrail = Field(
        default_factory=RateGuardrail,
        description="Devices whose self-test failed on every backend (the model was rejected).",
    )
    load_failure: RateGuardrail = Field(
        default_factory=RateGuardrail, description="Devices where loading the model failed."
    )
    revert: RateGuardrail = Field(
        default_factory=RateGuardrail,
        description="Devices that reverted the model (not confirmed after the app's "
        "max_unconfirmed_starts starts, or reverted by the app).",
    )
    unconfirmed: UnconfirmedGuardrail = Field(
        default_factory=UnconfirmedGuardrail,
        description="Devices installed and not confirmed after stalled_starts app starts, "
        "reverted since or not: a crash loop seen as it happens, before the revert.",
    )
    first_start: RateGuardrail = Field(
        default_factory=lambda: RateGuardrail(max_increase=0.05, max_rate=1.0),
        description="Installs whose app started again before the model was ever confirmed "
        "(report schema 2's unconfirmed_starts of 1 or more, confirmed since or not): a "
        "crash at the first launch, which neither reverts nor stalls. A first launch that "
        "did not use the model counts too, in both arms alike, so the limit is wider "
        "(5 points) and there is no absolute one.",
    )
    load_ms: LatencyGuardrail = Field(
        default_factory=LatencyGuardrail, description="Model load time, one value per device."
    )
    inference_ms: LatencyGuardrail = Field(
        default_factory=LatencyGuardrail,
        description="Each device's median inference time over the app's real calls.",
    )
    memory_peak_mb: LatencyGuardrail = Field(
        default_factory=LatencyGuardrail,
        description="Each device's peak memory for the model (report schema 2's "
        "memory_peak_mb), judged like a latency: max_increase_pct of the stable. Left out "
        "of a tier where no device reports it.",
    )
    rollback_on_critical: bool = Field(
        default=True,
        description="When a critical guardrail fails, an automatic rollout rolls back (else "
        "it only pauses).",
    )


_TABLES = (RateGuardrail, UnconfirmedGuardrail, LatencyGuardrail)


class RolloutPolicy(_Strict):
    """How a candidate moves from canary to everyone."""

    steps: list[Annotated[float, Field(gt=0, le=100)]] = Field(
        default_factory=lambda: [5.0, 25.0, 50.0, 100.0],
        min_length=1,
        description="Percentages `edgereg rollout --next` moves through, ending at 100.",
    )
    min_soak_hours: float = Field(
        default=24.0, ge=0, le=MAX_HOURS, description="Minimum time at one step before the next."
    )
    max_soak_hours: float = Field(
        default=72.0,
        ge=0,
        le=MAX_HOURS,
        description="After this long at one step, `rollout --auto` goes on when no guardrail "
        "fails and every one not proven within its limit saw min_networks per arm with "
        "no harm shown (what Argo Rollouts and Flagger do at every step); the history names "
        "what was unproven and how large a harm its evidence rules out, so a fleet too small "
        "to prove its limits still moves. The step to 100 % and the promote need, besides, "
        "every unproven estimate within its limit (full exposure is a promotion in all but "
        "name). Never before min_soak_hours.",
    )
    require_proof: bool = Field(
        default=False,
        description="true: `rollout --auto` steps and promotes only when every guardrail "
        "passes (max_soak_hours is not used), for a fleet large enough to prove its limits.",
    )
    guardrails: Guardrails = Field(
        default_factory=Guardrails,
        description="Canary analysis limits: what automatic rollouts act on.",
    )

    @field_validator("steps")
    @classmethod
    def _increasing(cls, value: list[float]) -> list[float]:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"steps must increase strictly, got {value}")
        if value[-1] != 100:
            raise ValueError(f"steps must end at 100, got {value}")
        return value
