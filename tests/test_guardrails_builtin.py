"""The built-in guardrails as one table: models.toml, the store and the analysis all read it.

Each guardrail of ``BUILTIN_GUARDRAILS`` is judged here end to end on a real
report store (SQLite and PostgreSQL): devices report what makes one of them
fail (a row of ``FAILING`` or ``WORSE`` below), the store counts it as the
spec says, and the analysis fails that guardrail and no other rate one.
A guardrail added to the table needs its row here.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
from pgkit import PostgresServer, free_port, postgres_server, postgres_url  # noqa: F401 (fixtures)
from pydantic import ValidationError

from edgereg.analysis import SPECS, analyze
from edgereg.config import (
    BUILTIN_GUARDRAILS,
    Guardrails,
    LatencyGuardrail,
    RateGuardrail,
    RolloutPolicy,
    builtin_guardrail,
    json_schema,
)
from edgereg.protocol.reports import Report
from edgereg.reports import ReportStore, open_store
from edgereg.reports.store import HISTOGRAM_COLUMNS, counts_sql
from edgereg.reports.summary import EVENTS, HISTOGRAMS

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
RATES = [spec for spec in BUILTIN_GUARDRAILS if spec.test == "rate"]
SHIFTS = [spec for spec in BUILTIN_GUARDRAILS if spec.test == "shift"]

#: Per rate guardrail: the report keys of a device it counts as failing (and no other).
FAILING: dict[str, dict[str, Any]] = {
    "probe_failure": {"probe": "failed", "backend": None, "inference": None, "confirmed": False},
    "load_failure": {
        "probe": "failed",
        "backend": None,
        "load_failed": True,
        "load_ms": None,
        "inference": None,
        "confirmed": False,
    },
    "revert": {"reverted": True, "inference": None},
    # Two starts and never confirmed: stalled (stalled_starts 2) and a first start.
    "unconfirmed": {"confirmed": False, "unconfirmed_starts": 2, "schema_version": 2},
    "first_start": {"unconfirmed_starts": 1, "schema_version": 2},
    # The GPU backend missed the probe: the model runs on the CPU.
    "backend_fallback": {"backend": "cpu", "backends_skipped": ["opencl"]},
}
#: Rate guardrails a failing row of another also fails, by design.
ALSO: dict[str, set[str]] = {"unconfirmed": {"first_start"}}

#: Per shift guardrail: the report keys of a device whose value is ``v``.
WORSE: dict[str, Any] = {
    "load_ms": lambda v: {"load_ms": v},
    "inference_ms": lambda v: {
        "inference": {"count": 50, "p50_ms": v, "p90_ms": 2 * v, "p99_ms": 3 * v}
    },
    "memory_peak_mb": lambda v: {"memory_peak_mb": v, "schema_version": 2},
}


def report(n: int, arm: str, **fields: Any) -> Report:
    """Device ``n``'s report of the candidate (1.1.0) or the stable (1.0.0), healthy by default."""
    version = "1.1.0" if arm == "candidate" else "1.0.0"
    data: dict[str, Any] = {
        "token": f"{n:032x}",
        "unit": "digits",
        "model": "digits",
        "version": version,
        "unit_version": version,
        "variant": "int8",
        "tier": "high",
        "arm": arm,
        "sequence": 7,
        "probe": "passed",
        "backend": "cpu",
        "load_ms": 20.0,
        "inference": {"count": 50, "p50_ms": 3.0, "p90_ms": 4.0, "p99_ms": 6.0},
        "confirmed": True,
    }
    data.update(fields)
    return Report.model_validate(data)


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReportStore]:
    url = (
        f"sqlite:///{tmp_path}/reports.sqlite"
        if request.param == "sqlite"
        else str(request.getfixturevalue("postgres_url"))
    )
    with open_store(url) as opened:
        yield opened


#: Small arms judged: no network tolerated, every install old enough.
LIMITS = Guardrails.model_validate(
    {"min_devices": 5, "min_networks": 5, "tolerated_networks": 0, "revert_window_hours": 0.0}
)


def judged(store: ReportStore, *, candidate: list[dict[str, Any]], stable: list[dict[str, Any]]):
    """Each guardrail's verdict once the devices' reports (one network each) are stored."""
    reports = [
        (report(n, arm, **fields), T0, f"10.{n // 256}.{n % 256}.0/24")
        for n, (arm, fields) in enumerate(
            [("candidate", f) for f in candidate] + [("stable", f) for f in stable]
        )
    ]
    store.ingest_many(reports)
    summaries = store.summaries("digits", **LIMITS.event_parameters())
    analysis = analyze(
        summaries,
        unit="digits",
        candidate="1.1.0",
        stable="1.0.0",
        since=T0,
        guardrails=LIMITS,
    )
    ((tier,),) = [analysis.tiers]
    return {result.name: result for result in tier.guardrails}


@pytest.mark.parametrize("spec", RATES, ids=[spec.name for spec in RATES])
def test_each_rate_guardrail_fails_on_its_own_devices(store: ReportStore, spec: Any) -> None:
    failing = FAILING[spec.name]
    found = judged(store, candidate=[failing] * 40 + [{}] * 20, stable=[{}] * 60)
    failed = {name for name, result in found.items() if result.verdict == "fail"}
    rates = {s.name for s in RATES}
    assert failed & rates == {spec.name} | ALSO.get(spec.name, set()), {
        name: found[name].reason for name in failed
    }
    assert found[spec.name].numbers["candidate_events"] == 40
    for key in spec.parameters:
        assert found[spec.name].numbers[key] == getattr(LIMITS.rule(spec.name), key)


@pytest.mark.parametrize("spec", SHIFTS, ids=[spec.name for spec in SHIFTS])
def test_each_shift_guardrail_fails_on_a_slower_candidate(store: ReportStore, spec: Any) -> None:
    worse = WORSE[spec.name]
    spread = [10.0 + (i % 7) for i in range(80)]
    found = judged(
        store,
        candidate=[worse(3 * v) for v in spread],
        stable=[worse(v) for v in spread],
    )
    result = found[spec.name]
    assert result.verdict == "fail", result.reason
    assert spec.unit in result.reason
    assert result.critical is spec.critical
    # The same values in both arms: no shift guardrail fails.
    alike = judged(store, candidate=[worse(v) for v in spread], stable=[worse(v) for v in spread])
    assert alike[spec.name].verdict != "fail"


def test_healthy_arms_fail_no_guardrail(store: ReportStore) -> None:
    found = judged(store, candidate=[{}] * 60, stable=[{}] * 60)
    assert [name for name, r in found.items() if r.verdict == "fail"] == []
    # memory_peak_mb is optional: no device reports it, so it is left out.
    assert set(found) == {spec.name for spec in BUILTIN_GUARDRAILS if not spec.optional}


def test_every_spec_is_a_key_of_rollout_guardrails_with_its_defaults() -> None:
    schema = json_schema()["$defs"]["Guardrails"]["properties"]
    defaults = Guardrails()
    for spec in BUILTIN_GUARDRAILS:
        assert defaults.rule(spec.name) == spec.default
        assert isinstance(defaults.rule(spec.name), spec.table)
        assert schema[spec.name]["default"] == spec.default.model_dump()
        assert schema[spec.name]["description"] == spec.doc
    assert [s.name for s in SPECS] == [spec.name for spec in BUILTIN_GUARDRAILS]
    assert EVENTS[:-1] == tuple(spec.event for spec in RATES)
    assert tuple(spec.histogram for spec in SHIFTS) == HISTOGRAMS
    assert {spec.histogram: spec.column for spec in SHIFTS} == HISTOGRAM_COLUMNS


def test_the_rules_are_typed_by_test() -> None:
    guardrails = Guardrails()
    for spec in RATES:
        assert isinstance(guardrails.rate_rule(spec.name), RateGuardrail)
    for spec in SHIFTS:
        assert isinstance(guardrails.shift_rule(spec.name), LatencyGuardrail)
    with pytest.raises(KeyError, match="not a shift guardrail"):
        guardrails.shift_rule(RATES[0].name)
    with pytest.raises(KeyError, match="no built-in guardrail"):
        guardrails.rule("accepted")
    assert builtin_guardrail(f"{SHIFTS[0].name}/det") is SHIFTS[0]
    assert builtin_guardrail("accepted") is None


def test_a_partial_table_keeps_the_guardrails_own_defaults() -> None:
    # first_start has no absolute limit by default: setting its margin alone keeps it so.
    first_start = builtin_guardrail("first_start")
    assert first_start is not None
    assert isinstance(first_start.default, RateGuardrail)
    assert first_start.default.max_rate == 1.0
    policy = RolloutPolicy.model_validate(
        {"guardrails": {"first_start": {"max_increase": 0.3}, "revert": {"max_increase": 0.3}}}
    )
    assert policy.guardrails.rate_rule("first_start") == RateGuardrail(
        max_increase=0.3, max_rate=1.0
    )
    assert policy.guardrails.rate_rule("revert") == RateGuardrail(max_increase=0.3)


def test_an_unknown_guardrail_names_every_builtin_one() -> None:
    with pytest.raises(ValidationError) as caught:
        Guardrails.model_validate({"probe_failures": {"max_increase": 0.1}})
    message = str(caught.value)
    assert "unknown guardrail 'probe_failures'" in message
    for spec in BUILTIN_GUARDRAILS:
        assert spec.name in message


def test_each_event_binds_its_parameters_by_name() -> None:
    _sql, names = counts_sql("?", since=False, model=False, bundle=False)
    parameters = [key for spec in RATES for key in spec.parameters]
    # The events' parameters bind first, in the order of the table, then the aged cut.
    assert list(names) == [*parameters, "aged"]
    assert set(parameters) == set(Guardrails().event_parameters())


def test_a_fallback_the_stable_arm_shares_is_not_the_candidates_fault(store: ReportStore) -> None:
    # A quarter of the devices have no working OpenCL: they skip it in both arms alike.
    fell_back = FAILING["backend_fallback"]
    found = judged(
        store, candidate=[fell_back] * 100 + [{}] * 300, stable=[fell_back] * 100 + [{}] * 300
    )
    fallback = found["backend_fallback"]
    assert fallback.verdict != "fail", fallback.reason
    assert (fallback.numbers["candidate_rate"], fallback.numbers["stable_rate"]) == (0.25, 0.25)
    # Not critical by default: a fallback still runs the model.
    assert fallback.critical is False


def test_a_rejected_model_is_no_fallback(store: ReportStore) -> None:
    # A rejected model skipped every backend: a probe failure, not a fallback.
    rejected = judged(
        store,
        candidate=[{**FAILING["probe_failure"], "backends_skipped": ["opencl", "cpu"]}] * 40,
        stable=[{}] * 40,
    )
    assert rejected["backend_fallback"].numbers["candidate_events"] == 0


def test_a_backend_fallback_table_keeps_no_absolute_limit() -> None:
    # Setting the margin alone leaves it relative and not critical (its table's defaults).
    guardrails = Guardrails.model_validate({"backend_fallback": {"max_increase": 0.05}})
    rule = guardrails.rate_rule("backend_fallback")
    assert (rule.max_increase, rule.max_rate, rule.critical) == (0.05, 1.0, False)
    assert (
        Guardrails().rate_rule("backend_fallback") == builtin_guardrail("backend_fallback").default
    )  # type: ignore[union-attr]
