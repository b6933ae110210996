"""Health confirmation and local revert: the crash-loop rule as a table, and its ledger on disk."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path
from typing import Any

import pytest
from loopkit import LoopRegistry, serve

from edgereg.client import Client, DeviceProfile
from edgereg.client._health import HealthLedger, Revert, UnitHealth, on_start

# Each case: the events in order ("install X", "start", "confirm", "confirm X", "reverted"),
# and what the last start decided: None, or (bad version, version reverted to).
CASES = {
    "confirmed on the first start: never reverted": (
        ["install 1.0.0", "start", "confirm", "start", "start", "start", "start"],
        None,
    ),
    "three unconfirmed starts are allowed": (
        ["install 1.0.0", "start", "start", "start"],
        None,
    ),
    "the fourth unconfirmed start reverts to nothing when nothing was confirmed": (
        ["install 1.0.0", "start", "start", "start", "start"],
        ("1.0.0", None),
    ),
    "a crash-looping update goes back to the last confirmed version": (
        ["install 1.0.0", "start", "confirm", "install 1.1.0", "start", "start", "start", "start"],
        ("1.1.0", "1.0.0"),
    ),
    "starts before the install do not count against it": (
        ["install 1.0.0", "confirm", "start", "start", "start", "install 1.1.0", "start"],
        None,
    ),
    "confirming the old model does not vouch for the update": (
        ["install 1.0.0", "confirm 1.0.0", "install 1.1.0", "confirm 1.0.0"] + ["start"] * 4,
        ("1.1.0", "1.0.0"),
    ),
    "a revert not yet carried out is said again at the next start": (
        ["install 1.0.0", "confirm", "install 1.1.0"] + ["start"] * 5,
        ("1.1.0", "1.0.0"),
    ),
    "after the revert the last good model runs confirmed": (
        ["install 1.0.0", "confirm", "install 1.1.0"]
        + ["start"] * 4
        + ["reverted"]
        + ["start"] * 5,
        None,
    ),
    "after a revert to nothing, a new install counts afresh": (
        ["install 1.0.0"] + ["start"] * 4 + ["reverted", "install 1.1.0"] + ["start"] * 3,
        None,
    ),
    "a confirmation after the revert was decided does not cancel it": (
        ["install 1.0.0", "confirm", "install 1.1.0"] + ["start"] * 4 + ["confirm", "start"],
        ("1.1.0", "1.0.0"),
    ),
}


def _play(ledger: HealthLedger, events: list[str]) -> Revert | None:
    decided: Revert | None = None
    for event in events:
        word, _, arg = event.partition(" ")
        if word == "install":
            ledger.installed("digits", arg)
        elif word == "start":
            decided = ledger.app_started("digits")
        elif word == "confirm":
            ledger.confirm("digits", arg or None)
        elif word == "reverted":
            ledger.reverted("digits", arg or None)
    return decided


@pytest.mark.parametrize("name", list(CASES))
def test_crash_loop_rule(name: str, tmp_path: Path) -> None:
    events, expected = CASES[name]
    decided = _play(HealthLedger(tmp_path), events)
    if expected is None:
        assert decided is None
    else:
        assert decided is not None
        assert (decided.version, decided.to_version) == expected


def test_a_reverted_version_is_marked_bad_for_good(tmp_path: Path) -> None:
    ledger = HealthLedger(tmp_path, max_unconfirmed_starts=1)
    _play(ledger, ["install 1.0.0", "confirm", "install 1.1.0", "start", "start", "reverted 1.0.0"])
    assert ledger.is_bad("digits", "1.1.0")
    assert not ledger.is_bad("digits", "1.0.0")
    health = ledger.health("digits")
    assert (health.installed, health.confirmed, health.last_good) == ("1.0.0", True, "1.0.0")
    # The ledger is a file: a new process (the next app start) sees the same.
    again = HealthLedger(tmp_path)
    assert again.is_bad("digits", "1.1.0")
    assert "not confirmed after 1 app starts" in again.health("digits").bad["1.1.0"]


def test_the_app_declares_how_many_starts(tmp_path: Path) -> None:
    events = ["install 1.0.0"] + ["start"] * 5
    assert _play(HealthLedger(tmp_path / "a", max_unconfirmed_starts=5), events) is None
    assert _play(HealthLedger(tmp_path / "b", max_unconfirmed_starts=5), [*events, "start"])
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="max_unconfirmed_starts"):
            HealthLedger(tmp_path, max_unconfirmed_starts=bad)  # type: ignore[arg-type]


def test_units_are_counted_apart(tmp_path: Path) -> None:
    ledger = HealthLedger(tmp_path, max_unconfirmed_starts=1)
    ledger.installed("digits", "1.0.0")
    ledger.installed("ocr", "2.0.0")
    ledger.confirm("ocr")
    for _ in range(2):
        ledger.app_started("ocr")
        decided = ledger.app_started("digits")
    assert decided is not None
    assert decided.unit == "digits"
    assert ledger.app_started("ocr") is None


def test_the_rule_is_pure() -> None:
    health = UnitHealth(installed="1.0.0", starts=3, last_good="0.9.0")
    new, revert = on_start(health, "digits", 3)
    assert revert == Revert("digits", "1.0.0", "0.9.0", 3)
    assert health.reverting is None  # the input is untouched
    assert new.reverting == revert


def test_an_unreadable_ledger_is_logged_and_started_afresh(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "health.json").write_text('{"units": {"digits": {"starts": "many"}}}')
    ledger = HealthLedger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgereg.client"):
        assert ledger.app_started("digits") is None
    assert "starting afresh" in caplog.text
    ledger.installed("digits", "1.0.0")
    assert json.loads((tmp_path / "health.json").read_text())["units"]["digits"]["installed"] == (
        "1.0.0"
    )


@pytest.mark.parametrize("flag", ["false", "no", 1, [], {}])
def test_a_ledger_flag_other_than_true_reads_as_false(flag: object, tmp_path: Path) -> None:
    # "running" and "confirmed" as another writer (or a damaged file) left them: only a JSON
    # true counts, as in the JVM and Swift clients; bool("false") would confirm the install.
    unit = {"installed": "1.0.0", "confirmed": flag, "starts": 1, "running": flag}
    (tmp_path / "health.json").write_text(json.dumps({"units": {"digits": unit}}))
    ledger = HealthLedger(tmp_path, max_unconfirmed_starts=2)
    health = ledger.health("digits")
    assert (health.confirmed, health.running) == (False, False)
    assert ledger.app_started("digits") is None  # no start was under way: nothing counted
    assert ledger.health("digits").starts == 1
    assert ledger.app_started("digits") is not None  # this start ran it and ended: 2, reverted


def test_a_revert_the_app_makes_itself_marks_the_version_bad(tmp_path: Path) -> None:
    ledger = HealthLedger(tmp_path)
    _play(ledger, ["install 1.0.0", "confirm", "install 1.1.0", "start", "reverted 1.0.0"])
    assert ledger.is_bad("digits", "1.1.0")
    assert ledger.health("digits").confirmed


# --- the client runs it: real registry over real HTTP, reports collected ---------------


def _two_releases(tmp_path: Path) -> tuple[LoopRegistry, Any, Any]:
    registry = LoopRegistry(tmp_path / "registry")
    blobs = []
    for version in ("1.0.0", "1.1.0"):
        blob = tmp_path / f"model-{version}.mnn"
        blob.write_bytes(random.Random(version).randbytes(2000))
        blobs.append(registry.entry(blob, None, version=version, backends=("cpu",)))
    return registry, blobs[0], blobs[1]


def _launch(url: str, registry: LoopRegistry, cache: Path, starts: int = 2) -> Client:
    """One run of the app's process: a new client over the same cache."""
    return Client(
        url,
        registry.trusted,
        cache,
        model="digits",
        device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
        tier="high",
        max_unconfirmed_starts=starts,
    )


def test_a_crash_looping_candidate_is_reverted_marked_bad_and_reported(tmp_path: Path) -> None:
    registry, stable, candidate = _two_releases(tmp_path)
    registry.publish(stable)
    cache = tmp_path / "cache"
    with serve(registry.root) as served:
        # The app installs before it calls app_started, and confirms: no start counts.
        client = _launch(served.url, registry, cache)
        assert client.fetch().version == "1.0.0"
        assert client.app_started() is None
        client.record_inference(4.0)
        assert client.confirm()
        client.close()
        registry.publish(stable, candidate)  # 100%: this device gets it
        # app_started first this time; the install runs in this start, which dies
        # before its first inference with 1.1.0, and so does the next one.
        for _ in range(2):
            client = _launch(served.url, registry, cache)
            assert client.app_started() is None
            assert client.fetch().version == "1.1.0"
            client.close()
        client = _launch(served.url, registry, cache)
        revert = client.app_started()
        assert revert is not None
        assert (revert.version, revert.to_version, revert.starts) == ("1.1.0", "1.0.0", 2)
        current = client.current()
        assert current is not None
        assert current.version == "1.0.0"
        assert "1.1.0" in client.status().bad_releases
        client.close()
        client = _launch(served.url, registry, cache)
        assert client.app_started() is None  # 1.0.0 was confirmed: nothing to count
        after = client.fetch()
        assert (after.version, after.fallback) == ("1.0.0", "bad-release")
        client.close()
        reports = served.reports()
    # Each start that counts against an unconfirmed install is reported as it happens
    # (unconfirmed_starts), so the crash loop shows before the revert.
    assert [(r.version, r.unconfirmed_starts, r.confirmed, r.reverted) for r in reports] == [
        ("1.0.0", None, False, False),
        ("1.0.0", None, True, False),
        ("1.1.0", None, False, False),
        ("1.1.0", 1, False, False),
        ("1.1.0", 2, False, False),
        ("1.1.0", 2, False, True),
    ]
    assert all(r.schema_version == 2 for r in reports if r.unconfirmed_starts is not None)
    assert reports[1].inference is not None
    assert reports[1].inference.count == 1
    assert reports[1].first_inference_ms == 4.0
    assert reports[2].arm == "candidate"
    assert len({r.token for r in reports[:2]}) == 1
    assert len({r.token for r in reports[2:]}) == 1
    assert reports[0].token != reports[2].token


@pytest.mark.parametrize("order", ["install first", "app_started first"])
def test_a_crash_at_the_first_launch_reports_one_start_in_either_order(
    order: str, tmp_path: Path
) -> None:
    """first_start's signal (docs/protocol.md section 11): 0 for a good install, 1 for a
    first launch that died, whether the app installs before or after app_started."""
    registry, stable, _ = _two_releases(tmp_path)
    registry.publish(stable)
    with serve(registry.root) as served:
        for cache, crash in ((tmp_path / "good", False), (tmp_path / "bad", True)):
            client = _launch(served.url, registry, cache, starts=3)
            if order == "install first":
                assert client.fetch().version == "1.0.0"
                assert client.app_started() is None
            else:
                assert client.app_started() is None
                assert client.fetch().version == "1.0.0"
            if crash:
                client.close()  # the process dies before the first inference
                client = _launch(served.url, registry, cache, starts=3)
                assert client.app_started() is None
            client.record_inference(3.0)
            assert client.confirm("1.0.0")
            client.close()
        reports = served.reports()
    good = [r for r in reports if r.unconfirmed_starts is None]
    bad = [r.unconfirmed_starts for r in reports if r.unconfirmed_starts is not None]
    assert len(good) == 3  # the good install's and confirmation, the bad install's
    assert bad == [1, 1]  # the crashed start counted at the next, kept at the confirmation
    assert reports[-1].confirmed


def test_without_a_report_url_or_with_reporting_off_nothing_is_sent(tmp_path: Path) -> None:
    registry = LoopRegistry(tmp_path / "registry")
    blob = tmp_path / "model.mnn"
    blob.write_bytes(b"x" * 100)
    registry.publish(
        registry.entry(blob, None, version="1.0.0", backends=("cpu",)), report_url=None
    )
    with serve(registry.root) as served:
        for reporting, cache in ((True, "a"), (False, "b")):
            client = Client(
                served.url,
                registry.trusted,
                tmp_path / cache,
                model="digits",
                device=DeviceProfile(device_id="d1", ram_mb=6144, cpu_cores=8),
                tier="high",
                reporting=reporting,
            )
            assert client.fetch().version == "1.0.0"
            assert client.confirm()
            client.close()
            registry.publish(registry.entry(blob, None, version="1.0.0", backends=("cpu",)))
        assert served.posted == []


def test_a_ledger_that_cannot_be_written_fails_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "health.json").mkdir()  # not a file: every write fails
    ledger = HealthLedger(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edgereg.client"):
        ledger.installed("digits", "1.0.0")
        assert ledger.app_started("digits") is None
    assert "cannot be written" in caplog.text
