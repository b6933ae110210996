"""[rollout]: steps, soak time and the canary guardrails."""

from __future__ import annotations

import itertools
from typing import Annotated

from pydantic import Field, field_validator

from edgereg.config._base import MAX_HOURS, _Strict


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
    """What the canary analysis checks and automatic rollouts act on, per tier."""

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
    min_devices: int = Field(
        default=50,
        ge=1,
        description="Reports needed in each arm of a tier before a guardrail can pass "
        "(a clear failure needs only min_failing_devices).",
    )
    min_failing_devices: int = Field(
        default=3,
        ge=1,
        description="Candidate devices with the event a rate guardrail needs before it can "
        "fail (Argo Rollouts' failureLimit): one event on one device is never a verdict.",
    )
    min_failing_sources: int = Field(
        default=3,
        ge=1,
        description="Distinct source networks (IPv4 /24, IPv6 /48) the failing candidate "
        "devices of a rate guardrail must come from before it can fail, when the server "
        "knows sources (docs/operations/report-threats.md).",
    )
    count_networks: bool = Field(
        default=True,
        description="When the server knows sources, the candidate arm's evidence counts "
        "source networks, not devices: a fail counts each network as at most one failing "
        "device, a pass counts each network as one device (a forger mints tokens at will, "
        "networks slowly: a thousand forged reports from one /24 are one device). Turn off "
        "for fleets behind a few carrier NATs, where it slows both.",
    )
    revert_window_hours: float = Field(
        default=72.0,
        ge=0,
        le=MAX_HOURS,
        description="How long after its install a device can take to revert a crash-looping "
        "model (the app's max_unconfirmed_starts starts; 3 for an app started once a day): "
        "the revert guardrail counts only devices installed at least this long ago, and the "
        "unconfirmed guardrail passes only on them (it fails on every device), so a young "
        "cohort that has not crash-looped yet cannot pass either. 0 counts every device.",
    )
    min_soak_devices: int = Field(
        default=10,
        ge=1,
        description="Devices (counted in networks, like a pass) each arm of a tier must hold "
        "before max_soak_hours may step past a guardrail that is not proven within its limit: "
        "the guardrail must have had the devices to fail on. Below min_devices on purpose: an "
        "early step only has to rule out gross harm, which a few devices show.",
    )
    min_sources: int = Field(
        default=5,
        ge=1,
        description="Distinct source networks each arm's devices must come from before a "
        "guardrail can pass, when the server knows sources.",
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
        "fails and every one not proven within its limit saw min_soak_devices per arm with "
        "no harm shown (what Argo Rollouts and Flagger do at every step); the history names "
        "what was unproven and how large a harm its evidence rules out, so a fleet too small "
        "to prove its limits still moves. Never before min_soak_hours.",
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
