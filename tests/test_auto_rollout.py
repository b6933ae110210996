"""`edgereg rollout --auto`: the pure rule as a table, its signed evidence, and the command.

The rule is tested on real transitions and real analyses of ArmSummary values;
the command on a real registry (tests/registrykit.py) for the cases that need
no reports. The command with a real report store comes with the store.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from armkit import arm
from registrykit import MODEL, OTHER, TIERS, Site, add_table, assert_refused, ok

from edgereg.analysis import POOL, Analysis, analyze
from edgereg.config import Guardrails, RolloutPolicy
from edgereg.protocol.reports import LatencySummary, Report
from edgereg.registry import RolloutError
from edgereg.registry._auto import AutoDecision, apply, decide, precheck
from edgereg.registry._transitions import pause, publish, set_percent
from edgereg.reports import open_store
from edgereg.reports.summary import ArmSummary, latency_bucket
from edgereg.wire import RolloutState

T0 = datetime(2026, 12, 1, 8, 0, tzinfo=timezone.utc)
EXPIRES = T0 + timedelta(days=60)
POLICY = RolloutPolicy(steps=[5, 25, 100], min_soak_hours=24)
SALT = "0123456789abcdef"


def released(*steps: float, paused: bool = False, stable: str | None = "1.0.0") -> RolloutState:
    """1.0.0 stable (unless None); 1.1.0 published at steps[0], then each step a day apart."""
    state = None
    if stable is not None:
        state = publish(
            None,
            MODEL,
            stable,
            percent=None,
            full=True,
            salt=SALT,
            now=T0,
            expires=EXPIRES,
            actor="t",
        )
    at = T0 + timedelta(hours=1)
    state = publish(
        state,
        MODEL,
        "1.1.0",
        percent=steps[0],
        full=False,
        salt=SALT,
        now=at,
        expires=EXPIRES,
        actor="t",
    )
    for step in steps[1:]:
        at += timedelta(hours=25)
        state = set_percent(state, MODEL, step, policy=POLICY, now=at, expires=EXPIRES, actor="t")
    if paused:
        state = pause(state, MODEL, now=at, expires=EXPIRES, actor="t")
    return state


def summary(arm_name: str, devices: int = 2000, **fields: object) -> ArmSummary:
    latencies = {latency_bucket(30.0) + offset: devices // 4 for offset in range(4)}
    values: dict[str, object] = {"load_ms": latencies, "inference_p50_ms": latencies, **fields}
    return arm(arm_name, devices, unit=MODEL, **values)


def analysis_of(*summaries: ArmSummary, guardrails: Guardrails | None = None) -> Analysis:
    first = all(s.arm == "candidate" for s in summaries)
    return analyze(
        summaries,
        unit=MODEL,
        candidate="1.1.0",
        stable=None if first else "1.0.0",
        since=T0,
        guardrails=guardrails or POLICY.guardrails,
        tiers=sorted({s.tier for s in summaries}),
    )


LATENCIES = {latency_bucket(30.0) + offset: 3 for offset in range(4)}
GOOD = (summary("candidate"), summary("stable"))
CRASHING = (summary("candidate", probe_failed=400), summary("stable"))
FEW = (summary("candidate", 20), summary("stable"))
TINY = (summary("candidate", 9), summary("stable"))
# 12 of 30 candidate installs past the revert window: too few of the arm to stand for it.
YOUNG = (summary("candidate", 30, aged_devices=12), summary("stable", aged_devices=2000))
# Five failing devices of 150 against none: no harm shown, but an estimate beyond the limit
# even with the three tolerated networks most against the candidate set aside (2 of 147).
LEANING = (summary("candidate", 150, probe_failed=5), summary("stable"))
# One failing device of 20: an estimate beyond the limit only while a network a forger may
# hold is counted, so it holds nothing (before, it held the step to 100 % for good).
ONE_OF_TWENTY = (summary("candidate", 20, probe_failed=1), summary("stable"))
# 2,000 healthy candidate tokens from one network: one device, for a soak step as for a pass.
FORGED = (
    summary("candidate", sources=1, sourced_devices=2000),
    summary("stable", sources=900, sourced_devices=2000),
)  # below min_soak_devices (10)
# Five failing devices of 20: a harm shown beyond the three tolerated networks, short of
# the min_failing_devices (3) beyond them that a fail needs.
SUSPECT = (summary("candidate", 20, probe_failed=5), summary("stable"))
# Two of 20: a harm three forged networks could make alone, which holds no step.
FORGEABLE = (summary("candidate", 20, probe_failed=2), summary("stable"))
SLOW = (summary("candidate", load_ms={latency_bucket(60.0): 2000}), summary("stable"))
# Ten times slower on 13 devices: the time-uniform bands of 10 values (13 less the three
# tolerated) are too wide to show any harm, so it is "observed without harm"; its estimate
# is +846 % (the histogram buckets: 13 at 300 ms against 187 at 30 ms).
TEN_FOLD_ON_FEW = (
    summary("candidate", 13, inference_p50_ms={latency_bucket(300.0): 13}),
    summary("stable", 187),
)
LATENCY_CRITICAL = RolloutPolicy(
    steps=[5, 25, 100],
    min_soak_hours=24,
    guardrails=Guardrails.model_validate(
        {"min_networks": 5, "inference_ms": {"max_increase_pct": 100, "critical": True}}
    ),
)
# Two tiers, the second a 3 % tier: 12 candidate devices, too few to be judged alone.
TIERED_TINY = (
    *FEW,
    arm("candidate", 12, tier="low", unit=MODEL, load_ms=LATENCIES, inference_p50_ms=LATENCIES),
    arm("stable", 300, tier="low", unit=MODEL, load_ms=LATENCIES, inference_p50_ms=LATENCIES),
)
TIERED_TINY_CRASHING = (
    *FEW,
    arm("candidate", 14, tier="low", unit=MODEL, probe_failed=14),
    arm("stable", 300, tier="low", unit=MODEL),
)
# A first release: no stable arm, judged by the absolute limits.
FIRST_GOOD = (summary("candidate"),)
FIRST_CRASHING = (summary("candidate", 62, reverted=62),)


@dataclass(frozen=True)
class Row:
    state: RolloutState | None
    reports: tuple[ArmSummary, ...] | None
    hours_after_last_change: float
    action: str
    percent: float | None = None
    reason: str = ""
    policy: RolloutPolicy = POLICY


NO_ROLLBACK = RolloutPolicy(
    steps=[5, 25, 100], min_soak_hours=24, guardrails=Guardrails(rollback_on_critical=False)
)

PROOF = RolloutPolicy(steps=[5, 25, 100], min_soak_hours=24, require_proof=True)

TABLE = {
    "never-published": Row(None, None, 48, "nothing", reason="no release"),
    "no-candidate": Row(
        publish(
            None,
            MODEL,
            "1.0.0",
            percent=None,
            full=True,
            salt=SALT,
            now=T0,
            expires=EXPIRES,
            actor="t",
        ),
        None,
        48,
        "nothing",
        reason="no rollout in progress",
    ),
    "paused": Row(released(5, paused=True), None, 48, "nothing", reason="never resume"),
    "first-release-healthy-waits-for-a-person": Row(
        released(5, stable=None), FIRST_GOOD, 48, "wait", reason="by hand"
    ),
    "first-release-crash-looping-rolls-back": Row(
        released(5, stable=None), FIRST_CRASHING, 1, "rollback", reason="absolute limit"
    ),
    "good-after-soak-steps": Row(released(5), GOOD, 25, "step", 25.0, "on to 25%"),
    "good-during-soak-waits": Row(released(5), GOOD, 2, "wait", reason="22 h 0 min of the minimum"),
    "good-at-last-step-promotes": Row(released(5, 25, 100), GOOD, 25, "promote"),
    "crashing-rolls-back-at-once": Row(
        released(5), CRASHING, 1, "rollback", reason="probe_failure"
    ),
    "crashing-pauses-by-policy": Row(
        released(5), CRASHING, 1, "pause", reason="critical", policy=NO_ROLLBACK
    ),
    "too-few-waits": Row(released(5), FEW, 48, "wait", reason="high probe_failure inconclusive"),
    "slow-not-critical-waits": Row(
        released(5), SLOW, 48, "wait", reason="high load_ms failed (not critical)"
    ),
    # max_soak_hours (72 h): a step without proof once enough devices showed no harm.
    "few-before-max-soak-waits": Row(released(5), FEW, 48, "wait", reason="(24 h 0 min left)"),
    "few-after-max-soak-steps-unproven": Row(
        released(5), FEW, 73, "step", 25.0, "no harm in 73 h 0 min at 5%, unproven: high"
    ),
    "few-at-last-step-promotes-unproven": Row(
        released(5, 25, 100), FEW, 73, "promote", reason="unproven: high probe_failure (up to"
    ),
    "leaning-over-the-limit-never-promotes-unproven": Row(
        released(5, 25, 100), LEANING, 500, "wait", reason="high probe_failure is +1.4 pt"
    ),
    "one-failing-network-of-twenty-promotes-unproven": Row(
        released(5, 25, 100), ONE_OF_TWENTY, 500, "promote", reason="unproven: high probe_failure"
    ),
    "mostly-young-arm-waits-for-its-installs-to-age": Row(
        released(5), YOUNG, 500, "wait", reason="high revert"
    ),
    "tiny-never-steps-without-proof": Row(
        released(5), TINY, 500, "wait", reason="not observed without harm on min_networks"
    ),
    "harm-on-too-few-to-fail-never-steps": Row(
        released(5), SUSPECT, 500, "wait", reason="high probe_failure"
    ),
    "harm-the-tolerated-networks-could-make-steps-unproven": Row(
        released(5), FORGEABLE, 500, "step", 25.0, "no harm in 500 h 0 min at 5%, unproven"
    ),
    "slow-not-critical-never-steps": Row(
        released(5), SLOW, 500, "wait", reason="high load_ms failed"
    ),
    "forged-installs-from-one-network-never-step": Row(
        released(5), FORGED, 500, "wait", reason="not observed without harm on min_networks"
    ),
    "require-proof-waits-for-it": Row(
        released(5), FEW, 500, "wait", reason="not every guardrail passes", policy=PROOF
    ),
    # A step without proof needs every unproven estimate within its limit, at every step: a
    # harm too small for the evidence to show is not a harm too large to see.
    "leaning-never-steps-unproven": Row(
        released(5), LEANING, 500, "wait", reason="goes to 25% only when each estimate"
    ),
    "ten-fold-slower-on-few-never-steps-unproven": Row(
        released(5),
        TEN_FOLD_ON_FEW,
        500,
        "wait",
        reason="high inference_ms is +846%",
        policy=LATENCY_CRITICAL,
    ),
    "leaning-never-goes-to-100-unproven": Row(
        released(5, 25), LEANING, 500, "wait", reason="goes to 100% only when each estimate"
    ),
    "few-goes-to-100-unproven-when-within": Row(
        released(5, 25), FEW, 73, "step", 100.0, "no harm in 73 h 0 min at 25%"
    ),
    # A tier too small to be judged alone does not hold the rollout: the pool judges it.
    "a-tiny-tier-is-judged-within-the-pool": Row(
        released(5), TIERED_TINY, 73, "step", 25.0, "no harm in 73 h 0 min at 5%"
    ),
    # ... but its own fail halts the rollout like any other tier's.
    "a-tiny-tier-that-fails-halts": Row(
        released(5), TIERED_TINY_CRASHING, 1, "rollback", reason="low probe_failure"
    ),
}


@pytest.mark.parametrize("row", TABLE.values(), ids=TABLE.keys())
def test_auto_rule(row: Row) -> None:
    last = row.state.last_change_at() if row.state else None
    now = (last or T0) + timedelta(hours=row.hours_after_last_change)
    analysis = (
        analysis_of(*row.reports, guardrails=row.policy.guardrails)
        if row.reports is not None
        else None
    )
    decision = decide(row.state, MODEL, analysis, policy=row.policy, now=now)
    assert decision.action == row.action, decision.reason
    assert decision.percent == row.percent
    assert row.reason in decision.reason


def test_a_critical_failure_halts_whatever_the_soak_time() -> None:
    state = released(5)
    decision = decide(
        state, MODEL, analysis_of(*CRASHING), policy=POLICY, now=state.last_change_at()
    )  # type: ignore[arg-type]
    assert decision.action == "rollback"


def test_decide_needs_the_analysis_of_the_states_versions() -> None:
    state = released(5)
    with pytest.raises(ValueError, match="needs a canary analysis"):
        decide(state, MODEL, None, policy=POLICY, now=T0)
    other = analyze(
        [], unit=MODEL, candidate="1.2.0", stable="1.0.0", since=T0, guardrails=Guardrails()
    )
    with pytest.raises(ValueError, match=r"compares 1\.2\.0 with 1\.0\.0"):
        decide(state, MODEL, other, policy=POLICY, now=T0)


@pytest.mark.parametrize(
    ("steps", "reports", "action", "after"),
    [
        pytest.param((5,), GOOD, "step", {"candidate": "1.1.0", "percent": 25.0}, id="step"),
        pytest.param(
            (5, 25, 100), GOOD, "promote", {"stable": "1.1.0", "candidate": None}, id="promote"
        ),
        pytest.param(
            (5,), CRASHING, "rollback", {"stable": "1.0.0", "candidate": None}, id="rollback"
        ),
    ],
)
def test_every_automatic_change_is_signed_with_its_evidence_and_then_settles(
    steps: tuple[float, ...], reports: tuple[ArmSummary, ...], action: str, after: dict[str, object]
) -> None:
    state = released(*steps)
    now = state.last_change_at() + timedelta(hours=25)  # type: ignore[operator]
    analysis = analysis_of(*reports)
    decision = decide(state, MODEL, analysis, policy=POLICY, now=now)
    assert decision.action == action
    new = apply(
        decision,
        state,
        MODEL,
        analysis=analysis,
        policy=POLICY,
        now=now,
        expires=EXPIRES,
        actor="cron@ci",
        expected_sequence=state.sequence,
    )
    assert new.sequence == state.sequence + 1
    assert new.snapshot().model_dump(include=set(after)) == after
    event = new.history[-1]
    assert event.automatic
    assert event.actor == "cron@ci"
    assert event.note is not None
    assert event.note.startswith("automatic: ")
    assert event.evidence == analysis.evidence()
    assert event.evidence["verdict"] == analysis.verdict  # type: ignore[index]
    # The history before the new event is untouched, and it round-trips as a signed state does.
    assert new.history[:-1] == state.history
    assert RolloutState.model_validate_json(new.model_dump_json()) == new
    # Idempotent: the same reports a moment later change nothing.
    again = decide(new, MODEL, analysis if new.candidate else None, policy=POLICY, now=now)
    assert not again.changes_state, again


def test_apply_refuses_a_state_that_moved_since_the_analysis() -> None:
    state = released(5)
    decision = AutoDecision("step", "every guardrail passes", 25.0)
    with pytest.raises(RolloutError, match="changed while the reports were analysed"):
        apply(
            decision,
            state,
            MODEL,
            analysis=analysis_of(*GOOD),
            policy=POLICY,
            now=T0 + timedelta(days=3),
            expires=EXPIRES,
            actor="t",
            expected_sequence=state.sequence - 1,
        )


def test_precheck_decides_without_reports_only_when_there_is_nothing_to_compare() -> None:
    assert precheck(released(5), MODEL) is None
    decision = precheck(released(5, paused=True), MODEL)
    assert decision is not None
    assert decision.action == "nothing"


# --- the command, on a real registry -----------------------------------------------

# The tests' reports arrive all at once, crash loops included: no revert window.
NO_SOAK = """
[rollout]
steps = [5, 25, 100]
min_soak_hours = 0
[rollout.guardrails]
revert_window_hours = 0
"""


@pytest.fixture
def auto_site(site: Site) -> Site:
    add_table(site.project, NO_SOAK)
    return site


def test_auto_with_nothing_in_flight_does_nothing_and_exits_0(auto_site: Site) -> None:
    ok(auto_site.run("publish", MODEL, "--full", "--version", "1.0.0"))
    before = auto_site.objects()
    result = ok(auto_site.run("rollout", MODEL, "--auto"))
    assert "nothing to do: no rollout in progress: stable is 1.0.0" in result.stdout
    assert auto_site.objects() == before


def test_auto_leaves_a_paused_rollout_to_people(auto_site: Site) -> None:
    ok(auto_site.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(auto_site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    ok(auto_site.run("pause", MODEL))
    before = auto_site.objects()
    result = ok(auto_site.run("rollout", MODEL, "--auto", "--json"))
    decision = json.loads(result.stdout)
    assert (decision["action"], decision["changed"], decision["paused"]) == ("nothing", False, True)
    assert auto_site.objects() == before


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (("--auto", "--next"), "drop --to, --next and --force"),
        (("--auto", "--to", "25%"), "drop --to, --next and --force"),
        (("--reports", "sqlite:///r.sqlite"), "--reports is for --auto"),
    ],
)
def test_auto_options_that_do_not_go_together(
    auto_site: Site, args: tuple[str, ...], fragment: str
) -> None:
    assert_refused(auto_site.run("rollout", MODEL, *args), 2, fragment)


def test_auto_on_a_model_never_published_is_an_error(auto_site: Site) -> None:
    ok(auto_site.run("publish", MODEL, "--full", "--version", "1.0.0"))
    assert_refused(auto_site.run("rollout", "nosuch", "--auto"), 7, "no release")


def test_analyze_without_a_rollout_in_flight_is_refused(auto_site: Site) -> None:
    ok(auto_site.run("publish", MODEL, "--full", "--version", "1.0.0"))
    assert_refused(auto_site.run("analyze", MODEL), 7, "no rollout in progress")


# --- the commands with a real report store (SQLite) -------------------------------------

STORE = "reports.sqlite"


def reports_of(
    site: Site,
    arm: str,
    version: str,
    devices: int,
    *,
    probe_failed: int = 0,
    load_ms: float = 30.0,
    unit: str = MODEL,
    members: tuple[str, ...] = (MODEL,),
) -> list[Report]:
    """``devices`` reports per tier of one arm; the first ``probe_failed`` rejected the model.

    A bundle's install reports once per member under one token (the members
    keep models.toml's version 1.0.0); only the first member fails its probe.
    """
    made = []
    sequence = site.state(unit).sequence
    for tier in TIERS:
        for index in range(devices):
            token = secrets.token_hex(16)
            for position, member in enumerate(members):
                failed = index < probe_failed and position == 0
                made.append(
                    _report(
                        token, unit, member, version, tier, arm, sequence, failed, index, load_ms
                    )
                )
    return made


def _report(
    token: str,
    unit: str,
    model: str,
    unit_version: str,
    tier: str,
    arm: str,
    sequence: int,
    failed: bool,
    index: int,
    load_ms: float,
) -> Report:
    return Report(
        token=token,
        unit=unit,
        model=model,
        version=unit_version if unit == model else "1.0.0",
        unit_version=unit_version,
        variant=tier,
        tier=tier,
        arm=arm,  # type: ignore[arg-type]
        sequence=sequence,
        probe="failed" if failed else "passed",
        backend=None if failed else "cpu",
        load_ms=None if failed else load_ms * (1 + (index % 7) / 100),
        inference=None
        if failed
        else LatencySummary(count=20, p50_ms=5.0 + index % 3, p90_ms=9.0, p99_ms=12.0),
        confirmed=not failed,
    )


def next_second() -> None:
    """Wait for the next whole second: a period starts at the second after its change."""
    time.sleep(1.02 - datetime.now(timezone.utc).microsecond / 1e6)


def ingest(site: Site, reports: list[Report]) -> None:
    with open_store(f"sqlite:///{STORE}", base_dir=site.root) as store:
        store.ingest_many((report, datetime.now(timezone.utc)) for report in reports)


@pytest.fixture
def canary(auto_site: Site) -> Site:
    """1.0.0 stable, 1.1.0 a 5% canary, a report store beside models.toml."""
    ok(auto_site.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(auto_site.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    next_second()
    return auto_site


def test_analyze_reads_the_store_and_prints_every_guardrail(canary: Site) -> None:
    ingest(canary, reports_of(canary, "stable", "1.0.0", 300))
    ingest(canary, reports_of(canary, "candidate", "1.1.0", 300, probe_failed=45))
    result = canary.run("analyze", MODEL)
    assert result.exit_code == 12, result.output
    assert "Traceback" not in result.output
    lines = result.stdout.splitlines()
    assert lines[0].startswith(f"{MODEL}: candidate 1.1.0 vs stable 1.0.0, reports since ")
    assert "tier high: fail (candidate 300 devices, stable 300 devices)" in lines
    assert any(
        line.startswith("  fail         probe_failure, critical: candidate 15.00% (45/300)")
        for line in lines
    ), result.stdout
    assert lines[-1] == "verdict: fail"
    data = json.loads(canary.run("analyze", MODEL, "--json").stdout)
    assert data["verdict"] == "fail"
    assert [tier["tier"] for tier in data["tiers"]] == list(TIERS)
    (probe,) = (g for g in data["tiers"][0]["guardrails"] if g["name"] == "probe_failure")
    assert (probe["candidate_events"], probe["stable_events"]) == (45, 0)
    assert probe["p_worse"] < 0.05


def test_analyze_fails_installs_stalled_before_any_revert_at_the_declared_starts(
    canary: Site,
) -> None:
    # 45 of 300 candidate installs started twice without a confirmation (report schema 2),
    # none reverted yet: the unconfirmed guardrail fails, the revert guardrail does not.
    ingest(canary, reports_of(canary, "stable", "1.0.0", 300))
    candidate = reports_of(canary, "candidate", "1.1.0", 300)
    stalled = {"confirmed": False, "inference": None, "schema_version": 2, "unconfirmed_starts": 2}
    ingest(
        canary,
        [
            Report.model_validate({**r.model_dump(), **stalled}) if i % 300 < 45 else r
            for i, r in enumerate(candidate)
        ],
    )
    result = canary.run("analyze", MODEL)
    assert result.exit_code == 12, result.output
    lines = result.stdout.splitlines()
    assert any(
        line.startswith("  fail         unconfirmed, critical: candidate 15.00% (45/300)")
        for line in lines
    ), result.stdout
    data = json.loads(canary.run("analyze", MODEL, "--json").stdout)
    guardrails = {g["name"]: g for g in data["tiers"][0]["guardrails"]}
    assert guardrails["unconfirmed"]["verdict"] == "fail"
    assert guardrails["unconfirmed"]["stalled_starts"] == 2
    assert (guardrails["revert"]["candidate_events"], guardrails["revert"]["verdict"]) == (
        0,
        "inconclusive",
    )
    # Declared at three starts, the same reports hold no stalled install: the threshold
    # goes from models.toml to the store's query.
    add_table(canary.project, "[rollout.guardrails.unconfirmed]\nstalled_starts = 3")
    data = json.loads(canary.run("analyze", MODEL, "--json").stdout)
    guardrails = {g["name"]: g for g in data["tiers"][0]["guardrails"]}
    assert (
        guardrails["unconfirmed"]["candidate_events"],
        guardrails["unconfirmed"]["verdict"],
    ) == (
        0,
        "inconclusive",
    )
    assert guardrails["unconfirmed"]["stalled_starts"] == 3


def test_analyze_with_too_few_reports_is_inconclusive(canary: Site) -> None:
    ingest(canary, reports_of(canary, "stable", "1.0.0", 10))
    ingest(canary, reports_of(canary, "candidate", "1.1.0", 10))
    result = canary.run("analyze", MODEL, "--reports", f"sqlite:///{canary.root / STORE}")
    assert result.exit_code == 13, result.output
    assert (
        "too few networks to pass (candidate 10, stable 10 of 50 needed per arm beyond the 3 "
        "tolerated)"
    ) in result.stdout


def test_auto_walks_a_good_candidate_to_stable_one_step_per_run(canary: Site) -> None:
    # Each step starts a new period: the reports of the step before do not count.
    # With no failures in either arm, about 500 devices per arm and tier show, with
    # always-valid evidence, a rate within one point; 1000 do (300 do not).
    for expected in ("rolled out", "rolled out", "promoted"):
        next_second()
        ingest(canary, reports_of(canary, "stable", "1.0.0", 1000))
        ingest(canary, reports_of(canary, "candidate", "1.1.0", 1000))
        result = ok(canary.run("rollout", MODEL, "--auto"))
        assert result.stdout.startswith(f"{MODEL}: {expected}: every guardrail passes"), (
            result.stdout
        )
        # Right after a move nothing has been reported for the new period: the same
        # command again changes nothing.
        before = canary.objects()
        again = ok(canary.run("rollout", MODEL, "--auto"))
        assert ": waiting: " in again.stdout or ": nothing to do: " in again.stdout, again.stdout
        assert canary.objects() == before
    state = canary.state()
    assert (state.stable, state.candidate) == ("1.1.0", None)
    automatic = [event for event in state.history if event.automatic]
    assert [event.action for event in automatic] == ["rollout", "rollout", "promote"]
    for event in automatic:
        assert event.evidence is not None
        assert event.evidence["verdict"] == "pass"
        # Every tier, and the pool of them the promotion's estimates are read on.
        assert set(event.evidence["tiers"]) == {*TIERS, POOL}  # type: ignore[arg-type]
    history = json.loads(ok(canary.run("history", MODEL, "--json")).stdout)
    assert history[-1]["automatic"] is True
    assert history[-1]["evidence"]["candidate"] == "1.1.0"


def test_auto_rolls_back_a_crashing_candidate_and_then_rests(canary: Site) -> None:
    ingest(canary, reports_of(canary, "stable", "1.0.0", 200))
    ingest(canary, reports_of(canary, "candidate", "1.1.0", 200, probe_failed=30))
    result = canary.run("rollout", MODEL, "--auto", "--json")
    assert result.exit_code == 12, result.output
    decision = json.loads(result.stdout)
    assert (decision["action"], decision["changed"], decision["candidate"]) == (
        "rollback",
        True,
        None,
    )
    assert "probe_failure" in decision["reason"]
    assert decision["analysis"]["verdict"] == "fail"
    state = canary.state()
    assert (state.stable, state.candidate) == ("1.0.0", None)
    assert state.history[-1].automatic
    before = canary.objects()
    assert "nothing to do" in ok(canary.run("rollout", MODEL, "--auto")).stdout
    assert canary.objects() == before


def test_a_bad_store_url_is_a_clear_error_and_changes_nothing(canary: Site) -> None:
    before = canary.objects()
    assert_refused(canary.run("rollout", MODEL, "--auto", "--reports", "mysql://x"), 2, "mysql")
    assert_refused(
        canary.run("analyze", MODEL, "--reports", "sqlite:///no/such/dir/r.sqlite"),
        6,
        "does not exist",
    )
    assert canary.objects() == before


BUNDLE_TABLE = f"""
[bundles.kit]
version = "1.0.0"
models = ["{MODEL}", "{OTHER}"]
"""


def test_analyze_a_bundle_counts_an_install_once_and_fails_it_when_a_member_fails(
    auto_site: Site,
) -> None:
    add_table(auto_site.project, BUNDLE_TABLE)
    ok(auto_site.run("publish", "kit", "--full"))
    ok(auto_site.run("publish", "kit", "--canary", "5%", "--version", "1.1.0"))
    next_second()
    members = (MODEL, OTHER)
    ingest(auto_site, reports_of(auto_site, "stable", "1.0.0", 300, unit="kit", members=members))
    ingest(
        auto_site,
        reports_of(
            auto_site, "candidate", "1.1.0", 300, probe_failed=30, unit="kit", members=members
        ),
    )
    result = auto_site.run("analyze", "kit", "--json")
    assert result.exit_code == 12, result.output
    data = json.loads(result.stdout)
    assert (data["unit"], data["candidate"], data["stable"]) == ("kit", "1.1.0", "1.0.0")
    high = data["tiers"][0]
    assert (high["candidate_devices"], high["stable_devices"]) == (300, 300)
    (probe,) = (g for g in high["guardrails"] if g["name"] == "probe_failure")
    assert (probe["verdict"], probe["candidate_events"]) == ("fail", 30)
    # Latencies per member, one value per device (not one per member row).
    names = {g["name"] for g in high["guardrails"]}
    assert {f"load_ms/{MODEL}", f"load_ms/{OTHER}", f"inference_ms/{OTHER}"} <= names
    assert "load_ms" not in names
    # One value per install: 300 for the member every device loaded, 270 for the one
    # 30 devices rejected (no load time), never 600.
    loaded = {g["name"]: g["candidate_devices"] for g in high["guardrails"]}
    assert (loaded[f"load_ms/{OTHER}"], loaded[f"load_ms/{MODEL}"]) == (300, 270)


def test_analyze_raises_an_alarm_when_the_stable_arm_itself_fails(canary: Site) -> None:
    # The stable arm rejects the model on most devices: comparing with it cannot see a
    # candidate as bad, so the stable's own absolute limit raises an alarm.
    ingest(canary, reports_of(canary, "stable", "1.0.0", 100, probe_failed=90))
    ingest(canary, reports_of(canary, "candidate", "1.1.0", 100))
    result = canary.run("analyze", MODEL)
    assert "Traceback" not in result.output
    assert "alarm: high: the stable arm's probe_failure rate is 90.0% (90/100)" in result.stdout
    data = json.loads(canary.run("analyze", MODEL, "--json").stdout)
    assert len(data["alarms"]) == len(TIERS)


def test_analyze_splits_by_cpu_class(canary: Site) -> None:
    # Report schema 2's cpu_class: the failures sit on armv9 devices only.
    def classed(reports: list[Report], cpu_class: str) -> list[Report]:
        return [
            Report.model_validate(
                {
                    **r.model_dump(),
                    "token": f"{cpu_class[-1]}{r.token[1:]}",
                    "schema_version": 2,
                    "cpu_class": cpu_class,
                }
            )
            for r in reports
        ]

    ingest(canary, classed(reports_of(canary, "stable", "1.0.0", 150), "armv8"))
    ingest(canary, classed(reports_of(canary, "stable", "1.0.0", 150), "armv9"))
    ingest(canary, classed(reports_of(canary, "candidate", "1.1.0", 150), "armv8"))
    ingest(canary, classed(reports_of(canary, "candidate", "1.1.0", 150, probe_failed=45), "armv9"))
    data = json.loads(canary.run("analyze", MODEL, "--json", "--by-cpu-class").stdout)
    assert data["verdict"] == "fail"
    split = data["by_cpu_class"]
    assert sorted(split) == ["armv8", "armv9"]
    assert split["armv9"]["verdict"] == "fail"
    assert split["armv8"]["verdict"] != "fail"
    assert split["armv9"]["tiers"][0]["candidate_devices"] == 150
    text = canary.run("analyze", MODEL, "--by-cpu-class")
    assert "cpu_class armv9:" in text.stdout
    assert "Traceback" not in text.output
