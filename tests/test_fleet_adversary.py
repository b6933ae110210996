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
    # Stored, and counted one per network: one failing device, three needed to fail.
    assert "(a fail counts 1 of the 12 failing devices: one per network)" in revert, revert


def test_the_price_of_a_forced_rollback_is_six_networks(tmp_path: Path) -> None:
    # A failing device counts once per network, and a fail needs three from three
    # networks with evidence: the same dozen from three /24s moves nothing, from six it
    # does, once the forged installs are the oldest of the arm (revert_window_hours).
    # docs/operations/report-threats.md says why a forced rollback stays the cheap side.
    for networks, rolled_back in ((3, False), (6, True)):
        world = FleetWorld(tmp_path / str(networks), DEVICES, GOOD)
        forger = Forger(networks=networks, kind="reverted", per_period=12)
        with world.running():
            outcome = world.rollout(DAYS, forger)
        assert forger.sent == {202: 12}
        assert (outcome.result == "rolled back") == rolled_back, (networks, outcome.actions)
        if rolled_back:
            assert 3 <= outcome.days <= 4.5


def test_forged_passes_from_one_network_do_not_walk_a_crash_loop_forward(tmp_path: Path) -> None:
    # 80 % of the candidate's devices crash-loop; 1,500 forged healthy installs from one
    # /24 (never more than its 200 new tokens an hour) would swamp the arm's rates, but a
    # pass counts the arm's networks as its devices (count_networks), and nothing passes.
    world = FleetWorld(tmp_path, DEVICES, Behaviour(crash_loop=0.8))
    forger = Forger(networks=1, kind="passes", per_period=1500)
    with world.running():
        outcome = world.rollout(DAYS, forger)
        assert world.last.analysis is not None
        (tier,) = world.last.analysis.tiers
        reasons = {result.name: result.reason for result in tier.guardrails}
    assert forger.sent == {202: 1500}
    # Never a step: stuck at 5 %, or rolled back when the cohort (a random salt) holds
    # enough crash-looping devices from enough networks to fail despite the forgery.
    assert [action for _, action, _ in outcome.actions] in ([], ["rollback"]), outcome.actions
    assert tier.candidate_devices > 1000
    # Counted by network, the 1,500 forged installs are one device of the 50 a pass needs.
    assert "(a pass counts the candidate's" in reasons["revert"], reasons
