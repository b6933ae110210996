"""Moving a release through its rollout: rollout, promote, rollback, pause, resume, resign.

Every command signs a new rollout state whose sequence is one higher, and
rewrites every tier's manifest from it; a refused command changes nothing.
The policy (steps, soak time) comes from models.toml.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta

import buildkit
import pytest
from registrykit import (
    MODEL,
    OTHER,
    TIERS,
    Site,
    add_table,
    assert_refused,
    ok,
)

from edgereg.errors import ExitCode
from edgereg.registry import build_manifests
from edgereg.wire import Manifest, RolloutState

WALK = """
[rollout]
steps = [5, 25, 50, 100]
min_soak_hours = 0
"""


@pytest.fixture
def walk(site: Site) -> Site:
    """No soak time, so tests can walk the steps."""
    add_table(site.project, WALK)
    return site


def check_consistent(site: Site, model: str = MODEL) -> tuple[RolloutState, dict[str, Manifest]]:
    """Manifests are exactly what the state and its releases say, at the state's sequence."""
    registry = site.registry()
    state = site.state(model)
    releases = {v: registry.read_release(model, v) for v in (state.stable, state.candidate) if v}
    expected = build_manifests(state, releases, registry.manifest_tiers(model))
    manifests = {tier: registry.read_manifest(model, tier) for tier in expected}
    assert manifests == expected
    assert {m.sequence for m in manifests.values()} == {state.sequence}
    report = registry.verify()
    assert (report.errors, report.warnings) == ([], [])
    return state, manifests


def last_event(site: Site) -> dict[str, object]:
    events: list[dict[str, object]] = json.loads(ok(site.run("history", MODEL, "--json")).stdout)
    return events[-1]


# --- rollout ---------------------------------------------------------------------------


def test_rollout_respects_the_soak_time_unless_forced(site: Site) -> None:
    ok(site.run("publish", MODEL, "--canary", "5%"))
    before = site.snapshot()
    message = assert_refused(
        site.run("rollout", MODEL, "--to", "25%"),
        7,
        "has been at 5% for less than the minimum soak time of 24 h",
        "--force",
    )
    left = re.search(r"(\d+) h (\d+) min left", message)
    assert left is not None, message
    assert (
        timedelta(hours=23, minutes=58)
        <= timedelta(hours=int(left[1]), minutes=int(left[2]))
        <= timedelta(hours=24)
    )
    assert_refused(site.run("rollout", MODEL, "--next"), 7, "min left")
    assert site.snapshot() == before

    ok(site.run("rollout", MODEL, "--to", "25%", "--force"))
    state, manifests = check_consistent(site)
    assert (state.percent, state.sequence) == (25.0, 2)
    assert all(m.percent == 25.0 for m in manifests.values())
    event = last_event(site)
    assert (event["action"], event["forced"]) == ("rollout", True)
    assert "FORCED" in ok(site.run("history", MODEL)).stdout

    # Lowering the share needs no soak, and is not forced.
    ok(site.run("rollout", MODEL, "--to", "2%"))
    assert site.state().percent == 2.0
    assert last_event(site)["forced"] is False


def test_next_walks_the_policy_steps_from_models_toml(walk: Site) -> None:
    # Global steps, and a model of its own with other ones.
    add_table(
        walk.project,
        f"""
        [models.{OTHER}.rollout]
        steps = [1, 10, 100]
        min_soak_hours = 0
        """.replace("        ", ""),
    )
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    ok(walk.run("publish", OTHER, "--canary", "1%"))
    seen = []
    for _ in range(3):
        ok(walk.run("rollout", MODEL, "--next"))
        seen.append(walk.state().percent)
        check_consistent(walk)
    assert seen == [25.0, 50.0, 100.0]
    assert_refused(walk.run("rollout", MODEL, "--next"), 7, "last step", "promote")

    ok(walk.run("rollout", OTHER, "--next"))
    assert walk.state(OTHER).percent == 10.0
    ok(walk.run("rollout", OTHER, "--next"))
    assert walk.state(OTHER).percent == 100.0

    # Between steps after a manual move, --next goes to the next step above.
    ok(walk.run("promote", MODEL))
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    ok(walk.run("rollout", MODEL, "--to", "30%"))
    ok(walk.run("rollout", MODEL, "--next"))
    assert walk.state().percent == 50.0


@pytest.mark.parametrize(
    ("args", "exit_code", "fragments"),
    [
        pytest.param([], 2, ["--to PERCENT", "--next"], id="neither"),
        pytest.param(["--to", "25%", "--next"], 2, ["--next", "not both"], id="both"),
        pytest.param(["--to", "0%"], 2, ["--to must be", "'0%'"], id="zero"),
        pytest.param(["--to", "101"], 2, ["'101'"], id="over-100"),
        pytest.param(["--to", "5%"], 7, ["already at 5%"], id="same"),
    ],
)
def test_bad_rollout_is_refused(
    walk: Site, args: list[str], exit_code: int, fragments: list[str]
) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    before = walk.snapshot()
    assert_refused(walk.run("rollout", MODEL, *args), exit_code, *fragments)
    assert walk.snapshot() == before


@pytest.mark.parametrize("command", ["rollout --next", "promote", "rollback", "pause", "resign"])
def test_commands_on_a_model_never_published(walk: Site, command: str) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    before = walk.snapshot()
    assert_refused(walk.run(*command.split(" ", 1), OTHER), 7, f"'{OTHER}' has no release")
    assert walk.snapshot() == before


# --- promote ---------------------------------------------------------------------------


def test_promote_needs_a_rollout_beyond_the_canary(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    before = walk.snapshot()
    assert_refused(
        walk.run("promote", MODEL), 7, "still a 5% canary", "never been rolled out", "--next"
    )
    assert walk.snapshot() == before

    ok(walk.run("rollout", MODEL, "--next"))
    ok(walk.run("promote", MODEL))
    state, manifests = check_consistent(walk)
    assert (state.stable, state.candidate, state.percent, state.salt) == ("1.0.0", None, None, None)
    for tier, manifest in manifests.items():
        assert manifest.stable is not None
        assert manifest.stable.version == "1.0.0"
        assert manifest.candidate is None
        assert manifest.percent is None
        assert manifest.salt is None
        assert manifest.stable.variant == {"high": "fp32", "mid": "int8", "low": "w8"}[tier]
    assert last_event(walk)["forced"] is False
    assert_refused(walk.run("promote", MODEL), 7, "no rollout in progress", "stable is 1.0.0")


def test_a_first_full_release_is_stable_at_once(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--full"))
    state, manifests = check_consistent(walk)
    assert (state.stable, state.candidate, state.percent) == ("1.0.0", None, None)
    assert all(m.stable and m.stable.version == "1.0.0" for m in manifests.values())
    assert_refused(walk.run("promote", MODEL), 7, "no rollout in progress")


def test_promote_right_after_full_over_a_stable(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(walk.run("publish", MODEL, "--full", "--version", "1.1.0"))
    assert (walk.state().candidate, walk.state().percent) == ("1.1.0", 100.0)
    ok(walk.run("promote", MODEL))
    assert walk.state().stable == "1.1.0"
    assert last_event(walk)["forced"] is False


def test_promote_force_is_recorded(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    ok(walk.run("promote", MODEL, "--force"))
    assert walk.state().stable == "1.0.0"
    assert (last_event(walk)["action"], last_event(walk)["forced"]) == ("promote", True)


def test_a_dropped_candidate_published_again_starts_over_as_a_canary(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    ok(walk.run("rollout", MODEL, "--next"))
    ok(walk.run("rollback", MODEL))
    # The same release again: a canary once more, whatever its earlier rollout did.
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    assert walk.state().candidate == "1.1.0"
    assert_refused(walk.run("promote", MODEL), 7, "never been rolled out")


# --- rollback --------------------------------------------------------------------------


def test_rollback_drops_the_candidate(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.1.0"))
    ok(walk.run("rollout", MODEL, "--next"))
    ok(walk.run("rollback", MODEL))
    state, manifests = check_consistent(walk)
    assert (state.stable, state.candidate, state.percent) == ("1.0.0", None, None)
    assert all(
        m.candidate is None and m.stable and m.stable.version == "1.0.0" for m in manifests.values()
    )
    assert "dropped candidate 1.1.0" in str(last_event(walk)["note"])
    # The release itself stays: a published version never changes or disappears.
    assert walk.registry().versions(MODEL) == ["1.0.0", "1.1.0"]
    assert_refused(walk.run("rollback", MODEL), 7, "no rollout in progress")


def test_rollback_to_version_restores_an_older_stable(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--full", "--version", "1.0.0"))
    ok(walk.run("publish", MODEL, "--full", "--version", "1.1.0"))
    ok(walk.run("promote", MODEL))
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.2.0"))
    before = walk.snapshot()
    assert_refused(
        walk.run("rollback", MODEL, "--to-version", "0.5.0"),
        7,
        "0.5.0 was never published here (published: 1.0.0, 1.1.0, 1.2.0)",
    )
    # Forward is not back: that would skip the canary and rollout promote requires.
    assert_refused(
        walk.run("rollback", MODEL, "--to-version", "1.2.0"), 7, "not older than the stable"
    )
    assert walk.snapshot() == before

    ok(walk.run("rollback", MODEL, "--to-version", "1.0.0"))
    state, manifests = check_consistent(walk)
    assert (state.stable, state.candidate) == ("1.0.0", None)
    assert {m.stable.version for m in manifests.values() if m.stable} == {"1.0.0"}
    assert "stable 1.1.0 -> 1.0.0" in str(last_event(walk)["note"])
    assert_refused(walk.run("rollback", MODEL, "--to-version", "1.0.0"), 7, "already the stable")
    # Moving on from there takes a new, higher version.
    assert_refused(walk.run("publish", MODEL, "--canary", "5%", "--version", "0.9.0"), 7)
    ok(walk.run("publish", MODEL, "--canary", "5%", "--version", "1.3.0"))


# --- pause, resume, resign ---------------------------------------------------------------


def test_pause_and_resume_keep_the_percent(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    ok(walk.run("rollout", MODEL, "--to", "25%"))
    ok(walk.run("pause", MODEL))
    state, manifests = check_consistent(walk)
    assert (state.paused, state.percent) == (True, 25.0)
    assert all(m.paused and m.percent == 25.0 and m.candidate for m in manifests.values())
    assert "25% paused" in ok(walk.run("status")).stdout
    assert json.loads(ok(walk.run("status", "--json")).stdout)[0]["paused"] is True

    before = walk.snapshot()
    assert_refused(walk.run("pause", MODEL), 7, "already paused")
    assert_refused(walk.run("rollout", MODEL, "--next"), 7, "is paused", "edgereg resume")
    assert walk.snapshot() == before

    ok(walk.run("resume", MODEL))
    state, manifests = check_consistent(walk)
    assert (state.paused, state.percent) == (False, 25.0)
    assert all(not m.paused and m.percent == 25.0 for m in manifests.values())
    assert_refused(walk.run("resume", MODEL), 7, "not paused")
    ok(walk.run("rollout", MODEL, "--next"))
    assert walk.state().percent == 50.0


def test_resign_raises_sequence_and_expiry(site: Site) -> None:
    add_table(site.project, "[registry]\nexpires_days = 1")
    ok(site.run("publish", MODEL, "--canary", "5%"))
    first = site.state()
    assert first.expires - first.history[-1].at == timedelta(days=1)

    site.project.edit("expires_days = 1", "expires_days = 30")
    ok(site.run("resign", MODEL))
    state, manifests = check_consistent(site)
    assert state.sequence == first.sequence + 1
    assert state.expires - first.expires >= timedelta(days=29)
    assert all(m.expires == state.expires for m in manifests.values())
    # Nothing an app gets changes but the sequence and the expiry.
    assert state.snapshot() == first.snapshot()
    assert state.salt == first.salt
    assert last_event(site)["action"] == "resign"


# --- invariants across every command -------------------------------------------------------


def test_sequence_grows_by_one_with_every_command_and_manifests_follow(walk: Site) -> None:
    commands = [
        ("publish", MODEL, "--canary", "5%", "--version", "1.0.0"),
        ("rollout", MODEL, "--to", "10%"),
        ("pause", MODEL),
        ("resume", MODEL),
        ("rollout", MODEL, "--next"),
        ("promote", MODEL),
        ("publish", MODEL, "--canary", "5%", "--version", "1.1.0"),
        ("publish", MODEL, "--canary", "20%", "--version", "1.2.0"),  # replaces 1.1.0
        ("rollback", MODEL),
        ("publish", MODEL, "--full", "--version", "2.0.0"),
        ("rollout", MODEL, "--to", "50%"),
        ("promote", MODEL),
        ("rollback", MODEL, "--to-version", "1.0.0"),
        ("resign", MODEL),
    ]
    # Each with its own code: a crash (70) would not pass for a refusal.
    refused = [
        (("rollout", MODEL, "--to", "0%"), ExitCode.USAGE),
        (("publish", MODEL, "--canary", "5%", "--version", "0.1.0"), ExitCode.ROLLOUT_REFUSED),
        (("rollback", MODEL, "--to-version", "0.0.1"), ExitCode.ROLLOUT_REFUSED),
    ]
    sequence = 0
    salts = set()
    for number, command in enumerate(commands, start=1):
        ok(walk.run(*command))
        state, manifests = check_consistent(walk)
        assert state.sequence == sequence + 1, command
        sequence = state.sequence
        assert [e.sequence for e in state.history] == list(range(1, number + 1))
        assert state.history[-1].action == command[0]
        if state.salt:
            salts.add(state.salt)
        for tier in TIERS:
            assert manifests[tier].sequence == sequence
        # A refused command in between changes nothing.
        for bad, code in refused:
            result = walk.run(*bad)
            assert result.exit_code == code, f"{bad} after {command}: {result.output}"
        assert walk.state() == state
    assert len(salts) == 4  # every publish draws a fresh salt
    assert walk.state().stable == "1.0.0"


def test_a_tier_without_its_own_variant_gets_the_next_lower_ones(walk: Site) -> None:
    text = walk.project.toml()
    start = text.index(f"[models.{OTHER}.variants.fp16]\n")
    end = text.index("\n[", start + 1)
    walk.project.config_path.write_text(text[:start] + text[end + 1 :], encoding="utf-8")
    assert buildkit.VARIANTS[OTHER][0] == "fp16"

    ok(walk.run("publish", OTHER, "--canary", "5%"))
    registry = walk.registry()
    record = registry.read_release(OTHER, "1.0.0")
    assert sorted(record.variants) == ["int8", "w8"]
    assert record.tiers == {"high": "int8", "mid": "int8", "low": "w8"}
    manifests = walk.manifests(OTHER)
    int8 = record.variants["int8"]
    high = manifests["high"].candidate
    assert high is not None
    assert (high.variant, high.sha256, high.size) == ("int8", int8.sha256, int8.size)
    assert manifests["high"].candidate == manifests["mid"].candidate
    assert manifests["low"].candidate is not None
    assert manifests["low"].candidate.variant == "w8"
    status = json.loads(ok(walk.run("status", OTHER, "--json")).stdout)[0]
    assert {t["tier"]: t["candidate_variant"] for t in status["tiers"]} == record.tiers
    check_consistent(walk, OTHER)


# --- finding 4: states that always mean something for a device -----------------------------


def _status(site: Site) -> dict[str, object]:
    status: dict[str, object] = json.loads(ok(site.run("status", MODEL, "--json")).stdout)[0]
    return status


ROLLOUT_STATES = [
    # id, commands before, the command, exit code, fragments of its message (stderr)
    ("first-full-is-stable", [], ["publish", MODEL, "--full"], 0, ["stable"]),
    (
        "canary-over-a-first-canary-is-refused",
        [["publish", MODEL, "--canary", "5%"]],
        ["publish", MODEL, "--canary", "5%", "--version", "1.1.0"],
        7,
        ["no stable release", "no model", "promote", "rollback"],
    ),
    (
        "full-over-a-first-canary-is-refused",
        [["publish", MODEL, "--canary", "5%"]],
        ["publish", MODEL, "--full", "--version", "1.1.0"],
        7,
        ["no stable release", "promote", "rollback"],
    ),
    (
        "canary-over-a-first-canary-at-100-is-refused",
        [["publish", MODEL, "--canary", "5%"], ["rollout", MODEL, "--to", "100%"]],
        ["publish", MODEL, "--canary", "5%", "--version", "1.1.0"],
        7,
        ["candidate at 100% with no stable release"],
    ),
    (
        "canary-over-a-candidate-with-a-stable-replaces-it",
        [["publish", MODEL, "--full"], ["publish", MODEL, "--canary", "5%", "--version", "1.1.0"]],
        ["publish", MODEL, "--canary", "5%", "--version", "1.2.0"],
        0,
        [],
    ),
    (
        "rollback-with-no-stable-withdraws",
        [["publish", MODEL, "--canary", "5%"]],
        ["rollback", MODEL],
        0,
        ["withdrawn"],
    ),
]


@pytest.mark.parametrize(
    ("before", "command", "exit_code", "fragments"),
    [pytest.param(*row[1:], id=row[0]) for row in ROLLOUT_STATES],
)
def test_rollout_states_never_strand_devices(
    walk: Site,
    before: list[list[str]],
    command: list[str],
    exit_code: int,
    fragments: list[str],
) -> None:
    for earlier in before:
        ok(walk.run(*earlier))
    snapshot = walk.snapshot()
    result = walk.run(*command)
    if exit_code:
        assert_refused(result, exit_code, *fragments)
        assert walk.snapshot() == snapshot
        return
    ok(result)
    assert "None" not in result.stderr
    for fragment in fragments:
        assert fragment in result.output
    state, manifests = check_consistent(walk)
    assert set(manifests) == set(TIERS)
    if state.stable is None and state.candidate is None:
        # Withdrawn: every tier's manifest is re-signed with no entry.
        assert all(m.stable is None and m.candidate is None for m in manifests.values())
        assert _status(walk)["warnings"] == [
            f"{MODEL} is withdrawn: the devices of every tier get no model "
            f"(publish a release: edgereg publish {MODEL} --canary 5%)"
        ]
    else:
        assert all(m.stable is not None for m in manifests.values())
        assert _status(walk)["warnings"] == []


def test_status_warns_when_a_paused_first_canary_serves_nobody(walk: Site) -> None:
    ok(walk.run("publish", MODEL, "--canary", "5%"))
    ok(walk.run("pause", MODEL))
    shown = ok(walk.run("status", MODEL))
    assert "WARNING" in shown.stderr
    assert "every device gets no model (the rollout is paused" in shown.stderr
