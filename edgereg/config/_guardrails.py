"""The built-in canary guardrails, one spec each, in one table: :data:`BUILTIN_GUARDRAILS`.

A spec says everything about a guardrail: the report keys it reads and how the
report store counts them (an event per install, or a histogram of one value per
install), the test that judges it (``rate``: a failure rate in points;
``shift``: a latency-like value, in percent of the stable), its default limits
and whether it is critical by default (:attr:`BuiltinGuardrail.default`), which
way is worse, the line the analysis says of it and its models.toml text.

Everything else reads this table: ``[rollout.guardrails]``'s keys and schema
(:class:`~edgereg.config.Guardrails`), the report store's counts and histograms
(:mod:`edgereg.reports.store`, :data:`edgereg.reports.summary.EVENTS`), the
analysis (:data:`edgereg.analysis.SPECS`), the status page and the generated
reference (docs/reference/models-toml.md). Adding a guardrail on a value the
store already keeps is one entry here, plus its tests.

Guardrails on app metrics are not built in: they are tables of any other name
under ``[rollout.guardrails]`` (:class:`~edgereg.config.MetricGuardrail`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import Field

from edgereg.config._base import _Strict

__all__ = [
    "BUILTIN_GUARDRAILS",
    "BuiltinGuardrail",
    "LatencyGuardrail",
    "RateGuardrail",
    "RelativeRateGuardrail",
    "UnconfirmedGuardrail",
    "builtin_guardrail",
]


# -- the tables a guardrail's limits are written in, one per test ---------------------------


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
    enabled: bool = Field(
        default=True,
        description="false: not analysed at all, so it neither fails nor holds a step. For "
        "a fleet too small to judge it: a rate both arms share (devices without a GPU "
        "falling back alike) passes only on many networks per arm.",
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


class RelativeRateGuardrail(RateGuardrail):
    """A failure rate judged against the stable arm's alone: devices fail in both arms alike.

    No absolute limit and not critical, by default (the keys a table leaves out).
    """

    max_rate: float = Field(
        default=1.0,
        gt=0,
        le=1,
        description=RateGuardrail.model_fields["max_rate"].description,
    )
    critical: bool = Field(
        default=False,
        description="A failure pauses the rollout (and rolls back by policy); else it holds it.",
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


# -- the spec -------------------------------------------------------------------------------


@dataclass(frozen=True)
class BuiltinGuardrail:
    """One built-in guardrail: what it reads, how it is judged, its defaults and its words.

    Attributes:
        name: Its table, ``[rollout.guardrails.<name>]``, and its name in every result.
        test: ``rate`` (a share of failing devices, compared in points, with an
            absolute limit) or ``shift`` (one value per device, compared as a
            scale shift in percent of the stable).
        reads: The report keys it reads (docs/protocol.md §12), for people.
        worse: Which way is worse, for people (both tests judge a higher value worse).
        label: What a failing device is (a rate) or the value (a shift), in the
            analysis's sentences.
        doc: Its description in models.toml's schema and reference.
        default: Its limits when models.toml does not set them, critical or not by
            default; its type is the table users write (a rate's or a shift's).
        event: A rate's store event: the name the report store counts it under.
        when: A rate's event of one ``reports`` row, 0 or 1, in SQL both databases
            run (a bundle's install has it when any member has); ``{key}`` binds
            that key of the guardrail's table (``{stalled_starts}``).
        fail_aged: A fail counts only installs old enough to have shown the event
            (``revert_window_hours``): a revert comes after the app's starts.
        pass_aged: A pass (and a step without proof) counts only those: a young
            install has not had the starts to show it yet.
        histogram: A shift's histogram kind in the report store.
        column: The ``reports`` column that holds a shift's bucket per install.
        unit: How a shift's values read (``ms``, ``MB``).
        optional: Left out of a tier where no device of either arm reports it
            (clients of an older report schema).
    """

    name: str
    test: Literal["rate", "shift"]
    reads: str
    worse: str
    label: str
    doc: str
    default: RateGuardrail | LatencyGuardrail
    event: str = ""
    when: str = ""
    fail_aged: bool = False
    pass_aged: bool = False
    histogram: str = ""
    column: str = ""
    unit: str = "ms"
    optional: bool = False

    def __post_init__(self) -> None:
        # A spec that does not say what its test needs is a mistake in this table.
        if self.test == "rate":
            complete = isinstance(self.default, RateGuardrail) and bool(self.event and self.when)
        else:
            complete = isinstance(self.default, LatencyGuardrail) and bool(
                self.histogram and self.column
            )
        if not complete:
            raise ValueError(
                f"built-in guardrail {self.name}: a {self.test} guardrail needs "
                + (
                    "a RateGuardrail default, event and when"
                    if self.test == "rate"
                    else "a LatencyGuardrail default, histogram and column"
                )
            )

    @property
    def table(self) -> type[RateGuardrail] | type[LatencyGuardrail]:
        """The table its limits are written in."""
        return type(self.default)

    @property
    def critical(self) -> bool:
        """Whether a failure halts a rollout, unless models.toml says otherwise."""
        return self.default.critical

    @property
    def parameters(self) -> tuple[str, ...]:
        """Keys of its table beyond its test's limits: they bind into :attr:`when`."""
        base = RateGuardrail if self.test == "rate" else LatencyGuardrail
        return tuple(key for key in self.table.model_fields if key not in base.model_fields)


BUILTIN_GUARDRAILS: tuple[BuiltinGuardrail, ...] = (
    BuiltinGuardrail(
        "probe_failure",
        "rate",
        reads="probe, load_failed",
        worse="a higher share of devices",
        label="the self-test failed on every backend (the model was rejected)",
        doc="Devices whose self-test failed on every backend (the model was rejected).",
        default=RateGuardrail(),
        event="probe_failed",
        # A self-test that cannot load the model fails too: one failing device is
        # one failure, counted as a load failure only.
        when="(CASE WHEN probe = 'failed' AND load_failed = 0 THEN 1 ELSE 0 END)",
    ),
    BuiltinGuardrail(
        "load_failure",
        "rate",
        reads="load_failed",
        worse="a higher share of devices",
        label="the model loaded on no backend",
        doc="Devices where loading the model failed.",
        default=RateGuardrail(),
        event="load_failed",
        when="load_failed",
    ),
    BuiltinGuardrail(
        "revert",
        "rate",
        reads="reverted",
        worse="a higher share of devices",
        label="reverted: not confirmed after the app's max_unconfirmed_starts starts",
        doc="Devices that reverted the model (not confirmed after the app's "
        "max_unconfirmed_starts starts, or reverted by the app).",
        default=RateGuardrail(),
        event="reverted",
        when="reverted",
        fail_aged=True,
        pass_aged=True,
    ),
    BuiltinGuardrail(
        "unconfirmed",
        "rate",
        reads="confirmed, unconfirmed_starts (report schema 2)",
        worse="a higher share of devices",
        label="stalled: not confirmed after stalled_starts app starts (a crash loop, early)",
        doc="Devices installed and not confirmed after stalled_starts app starts, "
        "reverted since or not: a crash loop seen as it happens, before the revert.",
        default=UnconfirmedGuardrail(),
        event="stalled",
        # Reports without unconfirmed_starts (schema 1) never count; a revert's report
        # keeps the count it reverted at.
        when="(CASE WHEN confirmed = 0 AND unconfirmed_starts >= {stalled_starts} "
        "THEN 1 ELSE 0 END)",
        pass_aged=True,
    ),
    BuiltinGuardrail(
        "first_start",
        "rate",
        reads="unconfirmed_starts (report schema 2)",
        worse="a higher share of devices",
        label="a start that ran the model ended before it was ever confirmed (a crash at "
        "the first launch)",
        doc="Installs where a start of the app that ran the model ended before the model "
        "was ever confirmed (report schema 2's unconfirmed_starts of 1 or more, confirmed "
        "since or not): a crash at the first launch, which neither reverts nor stalls. "
        "Clients count it alike whether the app installs before or after app_started "
        "(docs/protocol.md section 11). A first launch that did not use the model counts "
        "too, in both arms alike, so the limit is wider (5 points) and there is no "
        "absolute one.",
        default=RateGuardrail(max_increase=0.05, max_rate=1.0),
        event="first_start",
        when="(CASE WHEN unconfirmed_starts >= 1 THEN 1 ELSE 0 END)",
        pass_aged=True,
    ),
    BuiltinGuardrail(
        "backend_fallback",
        "rate",
        reads="backend, backends_skipped",
        worse="a higher share of devices",
        label="the model runs, but on a fallback: a backend tried before it missed the "
        "probe or failed to load",
        doc="Devices where the model runs, but not on the first backend the app asked for: "
        "one before it missed the self-test's outputs or failed to load (backends_skipped), "
        "so it fell back (to the CPU, say). A new model's op or precision a GPU backend "
        "does not handle shows here, on the devices of that GPU alone, before any crash. "
        "Devices without the backend skip it in both arms alike, so there is no absolute "
        "limit; not critical by default: the model still runs, and the latency guardrails "
        "judge what the fallback costs.",
        default=RelativeRateGuardrail(),
        event="fell_back",
        # A rejected model (backend null) skipped every backend: a probe or load failure.
        when="(CASE WHEN backend IS NOT NULL AND backends_skipped <> '' THEN 1 ELSE 0 END)",
    ),
    BuiltinGuardrail(
        "load_ms",
        "shift",
        reads="load_ms",
        worse="higher: slower",
        label="model load time",
        doc="Model load time, one value per device.",
        default=LatencyGuardrail(),
        histogram="load_ms",
        column="load_bucket",
    ),
    BuiltinGuardrail(
        "inference_ms",
        "shift",
        reads="inference.p50_ms",
        worse="higher: slower",
        label="median inference time",
        doc="Each device's median inference time over the app's real calls.",
        default=LatencyGuardrail(),
        histogram="inference_ms",
        column="inference_p50_bucket",
    ),
    BuiltinGuardrail(
        "memory_peak_mb",
        "shift",
        reads="memory_peak_mb (report schema 2)",
        worse="higher: more memory",
        label="peak memory",
        doc="Each device's peak memory for the model (report schema 2's "
        "memory_peak_mb), judged like a latency: max_increase_pct of the stable. Left out "
        "of a tier where no device reports it.",
        default=LatencyGuardrail(),
        histogram="memory_peak_mb",
        column="memory_peak_bucket",
        unit="MB",
        optional=True,
    ),
)
"""Every built-in guardrail, in the order models.toml's reference and the analysis list them."""

_BY_NAME = {spec.name: spec for spec in BUILTIN_GUARDRAILS}
if len(_BY_NAME) != len(BUILTIN_GUARDRAILS):
    raise ValueError("two built-in guardrails share a name")


def builtin_guardrail(name: str) -> BuiltinGuardrail | None:
    """The built-in guardrail ``name``, or None (a guardrail on an app metric).

    A bundle member's result (``load_ms/det``) is its guardrail's.
    """
    return _BY_NAME.get(name.split("/", 1)[0])
