"""[rollout]: steps, soak time and the canary guardrails."""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Annotated, Any

from pydantic import ConfigDict, Field, create_model, field_validator, model_validator

from edgereg.config._base import MAX_HOURS, _rule_error, _Strict
from edgereg.config._guardrails import (
    BUILTIN_GUARDRAILS,
    BuiltinGuardrail,
    LatencyGuardrail,
    RateGuardrail,
    UnconfirmedGuardrail,
    builtin_guardrail,
)
from edgereg.config._metrics import MetricGuardrail

__all__ = [
    "Guardrails",
    "LatencyGuardrail",
    "RateGuardrail",
    "RolloutPolicy",
    "UnconfirmedGuardrail",
]


class _GuardrailSettings(_Strict):
    """The keys of ``[rollout.guardrails]`` every guardrail shares (see :class:`Guardrails`)."""

    model_config = ConfigDict(
        extra="allow", frozen=True, strict=True, allow_inf_nan=False, defer_build=True
    )
    __pydantic_extra__: dict[str, MetricGuardrail] = Field(init=False)

    @model_validator(mode="before")
    @classmethod
    def _others_name_a_metric(cls, data: Any) -> Any:
        # A table that is neither a built-in guardrail nor names a metric is a typo.
        if isinstance(data, dict):
            data = {name: _with_defaults(name, value) for name, value in data.items()}
            for name, value in data.items():
                if name in cls.model_fields:
                    continue
                if not isinstance(value, dict) or "metric" not in value:
                    builtin = ", ".join(spec.name for spec in BUILTIN_GUARDRAILS)
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
        "can show a harm or be stepped past by max_soak_hours, and before a latency or an "
        "app metric can fail; a tier with fewer in an arm is judged within the pool of every "
        "tier for its passes (its fails still count). A failure rate fails without it, on "
        "min_failing_devices failing networks beyond the tolerated ones: a small canary arm "
        "that fails is rolled back. Below min_devices on purpose: an early step only has to "
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


def _with_defaults(name: str, value: Any) -> Any:
    """A built-in guardrail's table as written, its missing keys from the guardrail's defaults.

    Its table's own defaults are the usual ones; a guardrail whose defaults differ
    (first_start has no absolute limit) keeps them for the keys a table leaves out.
    """
    spec = builtin_guardrail(name)
    if spec is None or "/" in name or not isinstance(value, dict):
        return value
    return {**spec.default.model_dump(), **value}


def _builtin_field(spec: BuiltinGuardrail) -> tuple[type[_Strict], Any]:
    """The key of a built-in guardrail: its table, its default limits, its words."""
    return (
        spec.table,
        Field(
            default_factory=lambda: spec.default,
            description=spec.doc,
            # pydantic leaves a default_factory's value out of the schema: editors and the
            # reference show the guardrail's own defaults.
            json_schema_extra={"default": spec.default.model_dump()},
        ),
    )


# One key per built-in guardrail, from the table (edgereg/config/_guardrails.py): the
# analysis reaches them by name (Guardrails.rule), never as attributes.
if TYPE_CHECKING:
    _WithBuiltins = _GuardrailSettings
else:
    _WithBuiltins = create_model(
        "_WithBuiltins",
        __base__=_GuardrailSettings,
        __module__=__name__,
        **{spec.name: _builtin_field(spec) for spec in BUILTIN_GUARDRAILS},
    )


class Guardrails(_WithBuiltins):
    """What the canary analysis checks and automatic rollouts act on, per tier.

    Besides the built-in guardrails below, a table of any other name is a guardrail
    on an app metric the unit declares: `[rollout.guardrails.accepted]` with
    `metric = "accepted"` and `max_worse = 0.01`.
    """

    rollback_on_critical: bool = Field(
        default=True,
        description="When a critical guardrail fails, an automatic rollout rolls back (else "
        "it only pauses).",
    )

    def metric_guardrails(self) -> dict[str, MetricGuardrail]:
        """The guardrails on app metrics, by name."""
        return dict(self.__pydantic_extra__ or {})

    def rule(self, name: str) -> RateGuardrail | LatencyGuardrail:
        """The limits of the built-in guardrail ``name`` (:data:`BUILTIN_GUARDRAILS`).

        Raises:
            KeyError: no built-in guardrail has that name.
        """
        if builtin_guardrail(name) is None or "/" in name:
            raise KeyError(f"no built-in guardrail is named {name!r}")
        value: RateGuardrail | LatencyGuardrail = getattr(self, name)
        return value

    def rate_rule(self, name: str) -> RateGuardrail:
        """The limits of the built-in rate guardrail ``name``."""
        value = self.rule(name)
        if not isinstance(value, RateGuardrail):
            raise KeyError(f"{name!r} is not a rate guardrail")
        return value

    def shift_rule(self, name: str) -> LatencyGuardrail:
        """The limits of the built-in shift (latency-like) guardrail ``name``."""
        value = self.rule(name)
        if not isinstance(value, LatencyGuardrail):
            raise KeyError(f"{name!r} is not a shift guardrail")
        return value

    def event_parameters(self) -> dict[str, int | float]:
        """What the report store binds into the rate guardrails' events, by key.

        The keys of a guardrail's table beyond its test's limits
        (:attr:`BuiltinGuardrail.parameters`): ``{"stalled_starts": 2}``.
        """
        return {
            key: getattr(self.rule(spec.name), key)
            for spec in BUILTIN_GUARDRAILS
            for key in spec.parameters
        }


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
        "no harm shown and its estimate within its limit (what Argo Rollouts and Flagger do "
        "at every step); the history names what was unproven and how large a harm its "
        "evidence rules out, so a fleet too small to prove its limits still moves. Never "
        "before min_soak_hours.",
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
