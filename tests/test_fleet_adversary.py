"""A 60-device fleet with the default policy, `--auto` every 30 minutes, and a forger.

Every device posts its reports over real HTTP from a loopback address of its
own (127.x.y.2, a /24 each) to the server's real report endpoint, with its
default rate limit, source caps and admission checks running on the
simulated clock; `--auto` is the command's own ``run_auto`` with the default
policy and guardrails (tests/fleetsim.py says what is simulated). The forger
posts valid-looking reports of what the manifests serve, inside the limits.

What a fleet of 60 can conclude with the defaults: nothing at a 5 % step (3
candidate devices; a pass needs 50 networks per arm, a fail 3 failing
networks and 10 in each arm beyond the 3 tolerated ones), so an honest
rollout waits there, and the proof is that forged reports do not move it
either way.
"""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fleetsim import (
    CANDIDATE,
    GOOD,
    STABLE,
    TIER,
    UNIT,
    Behaviour,
    FleetWorld,
    Forger,
    device_address,
    forger_address,
)
from servekit import serve_process

from edgereg.protocol.reports import Report

DEVICES = 60
DAYS = 8


def _revert(world: FleetWorld) -> str:
    assert world.last.analysis is not None
    (tier,) = world.last.analysis.tiers
    (revert,) = (result for result in tier.guardrails if result.name == "revert")
    return f"{revert.verdict}: {revert.reason}"


def test_a_dozen_forged_reverts_from_one_network_do_not_roll_back_a_good_candidate(
    tmp_path: Path,
) -> None:
    world = FleetWorld(tmp_path, DEVICES, GOOD)
    forger = Forger(networks=1, kind="reverted", per_period=12)
    with world.running():
        outcome = world.rollout(DAYS, forger)
        revert = _revert(world)
    # Every forged report was inside the limits and described what was served: stored.
    assert forger.sent == {202: 12}
    assert outcome.reports == {202: sum(outcome.reports.values())}
    assert outcome.result == "stuck at 5%", outcome.actions
    # Stored, and one network whatever its tokens, among the three set aside.
    assert not revert.startswith("fail"), revert


@pytest.mark.parametrize(
    ("networks", "rolled_back"),
    [(3, False), (13, True)],
    ids=["three-networks-never", "thirteen-networks-can"],
)
def test_a_forced_rollback_takes_networks_beyond_the_tolerated_ones(
    tmp_path: Path, networks: int, rolled_back: bool
) -> None:
    # Each of the forger's /24s is one failing network, and a fail must hold with the
    # three tolerated networks set aside, with min_failing_devices (3) failing and
    # min_networks (10) in the arm beyond them: forged reverts from three /24s never roll
    # a good candidate back; at 60 devices (3 genuine candidates at 5 %) thirteen can.
    # docs/operations/report-threats.md says why a forced rollback stays the cheap side.
    world = FleetWorld(tmp_path, DEVICES, GOOD)
    forger = Forger(networks=networks, kind="reverted", per_period=networks)
    with world.running():
        outcome = world.rollout(DAYS, forger)
    assert forger.sent == {202: networks}
    assert (outcome.result == "rolled back") == rolled_back, (networks, outcome.actions)
    if rolled_back:
        assert 3 <= outcome.days <= 4.5  # once the forged installs are old enough


def test_forged_passes_from_one_network_do_not_walk_a_crash_loop_forward(tmp_path: Path) -> None:
    # 80 % of the candidate's devices crash-loop; 1,500 forged healthy installs from one
    # /24 (never more than its 200 new tokens an hour) would swamp the arm's rates, but
    # the arm counts networks, each by its devices' share: the 1,500 are one network.
    world = FleetWorld(tmp_path, DEVICES, Behaviour(crash_loop=0.8))
    forger = Forger(networks=1, kind="passes", per_period=1500)
    with world.running():
        outcome = world.rollout(DAYS, forger)
        assert world.last.analysis is not None
        (tier,) = world.last.analysis.tiers
    assert forger.sent == {202: 1500}
    # Never a step: stuck at 5 %, or rolled back once the cohort's own crash loops show.
    assert [action for _, action, _ in outcome.actions] in ([], ["rollback"]), outcome.actions
    assert tier.candidate_devices > 1000
    assert tier.candidate_networks <= DEVICES


@pytest.mark.parametrize(
    ("kind", "candidate"),
    [("stable-reverted", Behaviour(crash_loop=0.8)), ("reverted", GOOD)],
    ids=["stable-failures-mask-a-bad-candidate", "candidate-failures-fail-a-good-one"],
)
def test_a_forger_in_either_arm_from_three_networks_changes_no_outcome(
    tmp_path: Path, kind: str, candidate: Behaviour
) -> None:
    """Both arms are counted alike (issue 30, item 1): the same rollout with and without."""
    outcomes = []
    for forged in (False, True):
        world = FleetWorld(tmp_path / str(forged), 200, candidate, tiers=((TIER, 1.0),))
        forger = Forger(networks=3, kind=kind, per_period=60) if forged else None  # type: ignore[arg-type]
        with world.running():
            outcome = world.rollout(6, forger)
        outcomes.append((outcome.result, [action for _, action, _ in outcome.actions]))
        if forger is not None:
            assert forger.sent == {202: 60}
    assert outcomes[0] == outcomes[1], outcomes


def test_a_report_server_twelve_hours_behind_moves_no_verdict(tmp_path: Path) -> None:
    """Ages are counted on the report servers' clock (docs/operations/canary-analysis.md)."""
    outcomes = []
    for skew in (timedelta(0), timedelta(hours=12)):
        world = FleetWorld(
            tmp_path / str(skew.total_seconds()), 400, Behaviour(crash_loop=0.8), serve_skew=skew
        )
        with world.running():
            outcome = world.rollout(6)
        outcomes.append((outcome.result, [(round(d, 1), a) for d, a, _ in outcome.actions]))
    assert outcomes[0] == outcomes[1], outcomes
    assert outcomes[0][0] == "rolled back", outcomes


def _report(world: FleetWorld, n: int, arm: str, **outcome: object) -> Report:
    state = world.state()
    version = CANDIDATE if arm == "candidate" else STABLE
    return Report.model_validate(
        {
            "token": f"{n:032x}",
            "unit": UNIT,
            "model": UNIT,
            "version": version,
            "unit_version": version,
            "variant": "high-int8",
            "tier": TIER,
            "arm": arm,
            "sequence": state.sequence,
            "probe": "passed",
            "backend": "cpu",
            "load_ms": 40.0,
            "confirmed": True,
            **outcome,
        }
    )


def test_the_real_commands_shrug_off_one_networks_forgeries_and_act_on_many(
    tmp_path: Path,
) -> None:
    # `edgereg serve` and `edgereg rollout --auto` as a user runs them, on the real clock:
    # 300 stable and 30 candidate devices report healthy from their own addresses, then a
    # forger posts failed self-tests (a guardrail without a revert window) for the candidate.
    world = FleetWorld(tmp_path, 0, GOOD)
    world.clock.now = datetime.now(timezone.utc) - timedelta(days=3)
    world.publish(STABLE, None)
    world.clock.now = datetime.now(timezone.utc) - timedelta(minutes=5)
    world.publish(CANDIDATE, 5.0)
    (tmp_path / "publisher.pem").write_bytes(world.public_pem)
    (tmp_path / "signing.pem").write_bytes(world.private_pem)
    (tmp_path / "signing.pem").chmod(0o600)
    store = f"sqlite:///{tmp_path / 'reports.sqlite'}"
    registry = f"file://{tmp_path / 'registry'}"
    auto = [
        sys.executable,
        "-m",
        "edgereg.cli",
        "rollout",
        UNIT,
        "--auto",
        "--json",
        "--registry",
        registry,
        "--trusted-key",
        str(tmp_path / "publisher.pem"),
        "--key",
        str(tmp_path / "signing.pem"),
        "--reports",
        store,
    ]

    def run_auto() -> dict[str, object]:
        done = subprocess.run(auto, capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert "Traceback" not in done.stderr, done.stderr
        assert done.stdout, done.stderr
        found: dict[str, object] = json.loads(done.stdout)
        return found

    serving = (
        "--registry",
        registry,
        "--trusted-key",
        str(tmp_path / "publisher.pem"),
        "--reports",
        store,
    )
    with serve_process(tmp_path / "serve.log", *serving, cwd=tmp_path) as (_, url):
        world._host = url.removeprefix("http://")
        genuine = [
            world.post(device_address(n), _report(world, n, "stable" if n >= 30 else "candidate"))
            for n in range(330)
        ]
        assert genuine == [202] * 330
        failed = {"probe": "failed", "backend": None, "load_ms": None, "confirmed": False}
        # A forged report of what was never served is refused and never stored.
        never = _report(world, 10_000, "candidate").model_copy(update={"unit_version": "9.9.9"})
        assert world.post(forger_address(0, 0), never) == 422
        # A dozen from one /24: stored, counted as one failing device, and the rollout waits.
        one = [
            world.post(forger_address(0, n), _report(world, 1000 + n, "candidate", **failed))
            for n in range(12)
        ]
        assert one == [202] * 12
        first = run_auto()
        assert first["action"] == "wait", first
        state, _ = world.registry.read_state(UNIT)
        assert state is not None
        assert state.candidate == CANDIDATE
        # The same dozen from twelve /24s: twelve failing networks, the command rolls back.
        many = [
            world.post(forger_address(n, 0), _report(world, 2000 + n, "candidate", **failed))
            for n in range(1, 13)
        ]
        assert many == [202] * 12
        second = run_auto()
    assert second["action"] == "rollback", second
    world._state = None
    assert world.state().candidate is None


def test_the_defaults_walk_a_good_candidate_to_stable_on_a_thousand_devices(
    tmp_path: Path,
) -> None:
    """max_soak_hours: a fleet that cannot prove a one-point margin still promotes.

    1,000 devices (50 over HTTP, the rest stored with the source the server
    would give them): each step waits 72 hours, sees no harm on enough
    networks, and goes on unproven; a dozen forged reverts from one /24 do
    not stop it. With require_proof (the rule before) it waits at 5 %.
    """
    world = FleetWorld(tmp_path, 1000, GOOD, http_devices=50)
    forger = Forger(networks=1, kind="reverted", per_period=12)
    with world.running():
        outcome = world.rollout(18, forger)
    assert [action for _, action, _ in outcome.actions] == ["step", "step", "step", "promote"]
    assert all(day >= 3 for day, _, _ in outcome.actions[:1]), outcome.actions
    # Each move says it was not proven, and what its evidence leaves open.
    for _, _, reason in outcome.actions:
        assert "no harm in" in reason, reason
        assert "unproven:" in reason, reason
        assert "probe_failure (up to" in reason, reason
    assert outcome.reports == {202: sum(outcome.reports.values())}


def test_the_same_seed_is_the_same_rollout_whatever_the_machine_does(tmp_path: Path) -> None:
    """Issue 30 item 18: the thousand-device verdict once depended on the run.

    The cohort's salt was the registry's random one, so each run put other
    devices in the candidate arm and a step's evidence could fall the other
    way (one step instead of four, once, on a loaded machine). Everything a
    verdict reads now comes from the seed and the simulated clock: two runs
    of one seed agree in the salt, every move and every stored row; another
    seed draws another cohort. benchmarks/fleet_seeds.py measures how often
    other seeds walk the thousand devices to stable.
    """
    runs = []
    for n, seed in enumerate((7, 7, 8)):
        world = FleetWorld(tmp_path / str(n), 120, GOOD, http_devices=10, seed=seed)
        with world.running():
            outcome = world.rollout(3)
            rows = world.store.summaries(UNIT, since=datetime(2026, 1, 1, tzinfo=timezone.utc))
            runs.append((world.state().salt, outcome.actions, outcome.reports, rows))
    first, again, other = runs
    assert first[0] is not None
    assert first[3], "nothing stored"
    assert again == first
    assert other[0] != first[0]
