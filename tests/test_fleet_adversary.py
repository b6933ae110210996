"""A 60-device fleet with the default policy, `--auto` every 30 minutes, and a forger.

Every device posts its reports over real HTTP from a loopback address of its
own (127.x.y.2, a /24 each) to the server's real report endpoint, with its
default rate limit, source caps and admission checks running on the
simulated clock; `--auto` is the command's own ``run_auto`` with the default
policy and guardrails (tests/fleetsim.py says what is simulated). The forger
posts valid-looking reports of what the manifests serve, inside the limits.

What a fleet of 60 can conclude with the defaults: nothing at a 5 % step (3
candidate devices; a pass needs 50 per arm, a fail 3 failing devices from 3
networks), so an honest rollout waits there, and the proof is that forged
reports do not move it either way.
"""

from __future__ import annotations

from pathlib import Path

from fleetsim import GOOD, Behaviour, FleetWorld, Forger

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
    # Counted, and not enough: the failing devices come from one network.
    assert "1 network(s), 3 needed to fail" in revert, revert


def test_a_forged_campaign_from_three_networks_is_the_documented_price(tmp_path: Path) -> None:
    # The same dozen from three /24s meets every floor once the forged installs are the
    # oldest of the arm (revert_window_hours): a forced rollback costs three networks
    # for one half hour (docs/operations/report-threats.md says why that stays cheap).
    world = FleetWorld(tmp_path, DEVICES, GOOD)
    forger = Forger(networks=3, kind="reverted", per_period=12)
    with world.running():
        outcome = world.rollout(DAYS, forger)
    assert forger.sent == {202: 12}
    assert outcome.result == "rolled back", outcome.actions
    assert 3 <= outcome.days <= 4.5


def test_forged_passes_from_one_network_do_not_walk_a_crash_loop_forward(tmp_path: Path) -> None:
    # 80 % of the candidate's devices crash-loop; 1,500 forged healthy installs from one
    # /24 (never more than its 200 new tokens an hour) swamp the arm's rates, but one
    # network cannot bring the arm to min_sources, and nothing passes.
    world = FleetWorld(tmp_path, DEVICES, Behaviour(crash_loop=0.8))
    forger = Forger(networks=1, kind="passes", per_period=1500)
    with world.running():
        outcome = world.rollout(DAYS, forger)
        assert world.last.analysis is not None
        (tier,) = world.last.analysis.tiers
        reasons = {result.name: result.reason for result in tier.guardrails}
    assert forger.sent == {202: 1500}
    assert outcome.result == "stuck at 5%", outcome.actions
    assert tier.candidate_devices > 1000
    assert "too few networks to pass" in reasons["inference_ms"], reasons
