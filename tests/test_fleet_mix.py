"""A mixed fleet: Python, JVM and Swift devices reach the same outcomes (issue #17).

A third of the devices are played by each client's device program, one
long-lived program per kind that configures each of its devices in turn
(tests/mixkit.py), against ``edgereg serve``'s server with its SQLite report
store, over a registry published through the real publish path from the tiny
bundle project built with the real MNN converter (tests/fleetkit.py). The
self-test runs real MNN through tests/hostrunner.py; a device with a faulty
GPU gets ``--faulty opencl``.

Every kind plays the same install ids, tiers and GPUs, so each device's
outcome is checked against what the protocol's rules give it (the cohort
rule of edgereg.protocol.rules on the manifest's salt and percent) AND the
three kinds' outcome tables must be equal, row for row.

Test policy for ``rollout --auto`` (:data:`MIX_POLICY`): the default
guardrails want 50 reports per arm and tier, a fleet of thousands. Here the
loop runs one tier, 8 devices per kind before the canary and 6 new phones per
kind joining each day, 3 of them in the day's cohort and 3 outside it (their
seeded install ids drawn until the publish's random salt puts them so), so
an arm of a step holds about 9 to 30 devices. The policy asks for 3 per arm
and allows a 30-point rise of a failure rate: with none failing, 9 devices
rule that out at the 5 % level, 6 do not (as in tests/test_fleet.py, margins
are wide for so few devices). New phones join because the device program
has no op for the periodic latency report an app sends (the library's
``report_latency``): a device reports when it installs, confirms or
reverts, so without newcomers the stable arm would have no reports in a
step's period and every guardrail would stay inconclusive.
Latencies are not judged here (``enabled = false``): the load time is
measured for real by three clients on a shared host (the harness's, not the
model's), and evidence valid at every look cannot pass a latency on arms of
a few dozen devices. This file tests the loop across clients, not latency
detection (tests/test_analysis.py and tests/test_fleet.py do).

The self-tests share one host MNN runner per fault set (healthy, faulty
GPU, every backend faulty) through a relay (:class:`mixkit.SharedRunners`):
starting MNN once per device costs more than the whole fleet otherwise.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from devicekit import DeviceError, DeviceProgram, selected_clients, spawn
from fleetkit import BUNDLE, MEMBERS, FleetRegistry, SimClock, build_bundle_project
from mixkit import (
    ClockedStore,
    MixDevice,
    MixFleet,
    SharedRunners,
    installed_set,
    make_mix,
    store_rows,
)
from servekit import serve

from edgereg.config import RolloutPolicy
from edgereg.protocol.rules import in_cohort
from edgereg.protocol.wire import BundleEntry, Manifest
from edgereg.registry import run_auto
from edgereg.reports import open_store
from edgereg.reports.canary import rollout_analysis
from edgereg.serve._ratelimit import RateLimiter

PER_KIND = 10
#: The closed loop: devices per kind before the canary, and new phones per kind each day.
LOOP_START = 8
LOOP_JOIN = 6
MIX_POLICY = RolloutPolicy.model_validate(
    {
        "steps": [25, 50, 100],
        "min_soak_hours": 24,
        "guardrails": {
            "min_devices": 3,
            # An arm of a step holds 9 to 30 devices under a random salt, each on a network
            # of its own: the default 10 networks beyond the 3 tolerated, before a fail on
            # the comparison, would leave a crash loop's first looks to chance.
            "min_networks": 5,
            # The simulated apps start every simulated day: a crash loop reverts within it.
            "revert_window_hours": 24,
            "probe_failure": {"max_increase": 0.3},
            "load_failure": {"max_increase": 0.3},
            "revert": {"max_increase": 0.3},
            "unconfirmed": {"max_increase": 0.3},
            # Not judged here: whether a start ran an install (protocol §11) depends on
            # how each kind's device program maps simulated days to app processes, which
            # these programs do not model; tests/test_fleet.py judges first_start.
            "first_start": {"enabled": False},
            # Devices with a faulty GPU fall back alike in both arms: a shared rate that
            # 20-device arms cannot show within any limit (it never passes).
            "backend_fallback": {"enabled": False},
            # Load times here are the harness's, not the model's: one host process plays many
            # devices, and the kinds reach MNN differently (in process, or through the host
            # runner), so the arms differ by 10x or more with the same files. Not judged here.
            "load_ms": {"enabled": False},
            # Latency evidence valid at every look cannot pass on arms of a few dozen
            # devices (the bands are tens of points wide): not judged here either.
            "inference_ms": {"enabled": False},
        },
    }
)
#: What the app measures per member on every device, in ms (equal arms: see the docstring).
LATENCIES = (9.0, 10.0, 11.0, 10.5, 9.5)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle_project(tmp_path_factory.mktemp("mix") / "project")


@pytest.fixture(scope="module")
def programs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, DeviceProgram]]:
    """One device program per client kind, for the whole module: each plays many devices."""
    logs = tmp_path_factory.mktemp("programs")
    started: dict[str, DeviceProgram] = {}
    try:
        for kind in selected_clients():
            started[kind] = spawn(kind, logs / f"{kind}.log")
        yield started
    finally:
        for program in started.values():
            with contextlib.suppress(DeviceError):
                program.quit(timeout=30)


@pytest.fixture(scope="module")
def runners() -> Iterator[SharedRunners]:
    """The host MNN runners the devices' self-tests share, one per fault set."""
    shared = SharedRunners()
    yield shared
    shared.close()


@contextlib.contextmanager
def mixed_fleet(
    project: Path,
    programs: dict[str, DeviceProgram],
    runners: SharedRunners,
    work: Path,
    tiers: tuple[str, ...],
    *,
    per_kind: int = PER_KIND,
) -> Iterator[tuple[FleetRegistry, MixFleet, ClockedStore, Path]]:
    """1.0.0 published --full, served with a report store; the devices (none updated yet)."""
    kit = FleetRegistry.create(work / "registry", project, clock=SimClock())
    # The first release already names where to report: a device reports an install
    # only to the URL of the manifest it installed from.
    kit.report_url = "v1/reports"
    kit.publish_bundle("1.0.0", percent=None)
    database = work / "reports.sqlite"
    with open_store(f"sqlite:///{database}") as store:
        sink = ClockedStore(store, kit.clock)
        # Every device posts from 127.0.0.1: the per-address report limit is lifted.
        limiter = RateLimiter(1e6, 10**6)
        with serve(kit.storage, reports=sink, report_limiter=limiter) as base_url:
            devices = make_mix(per_kind, work / "devices", kinds=list(programs), tiers=tiers)
            fleet = MixFleet(
                programs, devices, base_url + "/", kit.signer.public_pem().decode(), kit.clock,
                BUNDLE, runners=runners,
            )  # fmt: skip
            yield kit, fleet, sink, database


def entry_of(manifest: Manifest, device_id: str) -> tuple[BundleEntry, bool]:
    """The entry the cohort rule gives ``device_id`` from ``manifest``; True: the candidate."""
    inside = (
        manifest.candidate is not None
        and manifest.salt is not None
        and manifest.percent is not None
        and in_cohort(device_id, manifest.salt, manifest.percent)
    )
    entry = manifest.candidate if inside else manifest.stable
    assert isinstance(entry, BundleEntry)
    return entry, inside


def in_arm(manifest: Manifest, device_id: str) -> bool:
    """Whether the cohort rule gives ``device_id`` the candidate of ``manifest``."""
    return entry_of(manifest, device_id)[1]


def expected_backend(device: MixDevice, entry: BundleEntry, member: str) -> str:
    """The first hinted backend that computes right on ``device`` (a faulty GPU: not opencl)."""
    backends = list(entry.members[member].runtime.backends or ["cpu"])
    return next(b for b in [*backends, "cpu"] if not (device.faulty_gpu and b == "opencl"))


def update_all(fleet: MixFleet) -> dict[str, list[dict[str, Any]]]:
    """Every device checks once: its kind's program configured for it, then ``update``."""

    def run(kind: str, devices: list[MixDevice]) -> list[dict[str, Any]]:
        program = fleet.programs[kind]
        rows = []
        for device in devices:
            configured = fleet.configure(device)
            result = program.request("update", timeout=300)
            status = program.request("status")
            rows.append({"configured": configured, "result": result, "status": status})
        return rows

    return fleet.each_kind(run)


def normalized(device: MixDevice, row: dict[str, Any]) -> dict[str, Any]:
    """The outcome of one device, without what differs by kind and not by rule (paths, sizes)."""
    result, status = row["result"], row["status"]
    return {
        "tier": row["configured"]["tier"],
        "ok": result["ok"],
        "error_code": result["error_code"],
        "version": result["version"],
        "is_candidate": result["is_candidate"],
        "members": {
            name: (m["version"], m["sha256"], m["backend"])
            for name, m in sorted(result["members"].items())
        },
        "installed": status["installed"],
        "refused": sorted(status["refused"]),
    }


def expect(
    device: MixDevice,
    manifest: Manifest,
    *,
    code: str | None = None,
    kept: BundleEntry | None = None,
    refused: tuple[str, ...] = (),
) -> dict[str, Any]:
    """What the rules say ``device`` ends with: the entry its cohort gives it, or ``kept``."""
    entry, inside = entry_of(manifest, device.device_id)
    if kept is not None:
        entry, inside = kept, False
    members = {
        name: (m.version, m.sha256, expected_backend(device, entry, name))
        for name, m in sorted(entry.members.items())
    }
    return {
        "tier": device.tier,
        "ok": code is None,
        "error_code": code,
        "version": entry.version,
        "is_candidate": inside,
        "members": members,
        "installed": {
            "version": entry.version,
            "members": {n: {"version": v, "sha256": s} for n, (v, s, _) in members.items()},
        },
        "refused": sorted(refused),
    }


def broken_outcome(
    device: MixDevice, manifest: Manifest, code: str | None = "probe-failed"
) -> dict[str, Any]:
    """The candidate failed its probe on every backend: refused, the stable set kept.

    ``code`` None: it failed at an earlier check, and is not tried again.
    """
    stable = manifest.stable
    assert isinstance(stable, BundleEntry)
    assert stable.version == "1.0.0"
    return expect(device, manifest, code=code, kept=stable, refused=("2.0.0",))


def by_kind(
    fleet: MixFleet, rows: dict[str, list[dict[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    return {
        kind: [normalized(d, r) for d, r in zip(fleet.of(kind), found, strict=True)]
        for kind, found in rows.items()
    }


def assert_same_on_every_kind(outcomes: dict[str, list[dict[str, Any]]]) -> None:
    """Row j of every kind is the same device (same id, tier, GPU): the same outcome."""
    first, *others = outcomes
    for kind in others:
        diff = [
            (j, outcomes[first][j], outcomes[kind][j])
            for j in range(len(outcomes[first]))
            if outcomes[first][j] != outcomes[kind][j]
        ]
        assert diff == [], f"{kind} differs from {first}: {diff[:3]}"


def test_a_bundle_canary_reaches_every_client_kind_as_one_set(
    project: Path, programs: dict[str, DeviceProgram], runners: SharedRunners, tmp_path: Path
) -> None:
    """The canary by the cohort rule, a faulty GPU on CPU, a broken probe never installed."""
    with mixed_fleet(project, programs, runners, tmp_path, ("high", "mid", "low")) as (
        kit,
        fleet,
        _,
        _,
    ):
        manifests = {
            tier: kit.registry.read_manifest(BUNDLE, tier) for tier in ("high", "mid", "low")
        }
        first = by_kind(fleet, update_all(fleet))
        for kind, outcomes in first.items():
            for device, got in zip(fleet.of(kind), outcomes, strict=True):
                assert got == expect(device, manifests[device.tier]), (kind, device)

        # Per kind: two devices (a high and a mid one) get kernels that miscompute every
        # backend; whenever the candidate reaches them (in the 50 % cohort or at 100 %),
        # it must not install. The salt is random per publish: which step it is, is not.
        layout = fleet.of(next(iter(programs)))
        broken_ids = {layout[0].device_id, layout[1].device_id}
        assert [layout[0].tier, layout[1].tier, layout[0].faulty_gpu] == ["high", "mid", False]
        fleet.broken |= broken_ids
        kit.publish_bundle("2.0.0", percent=50.0)
        kit.clock.advance(1)
        manifests = {tier: kit.registry.read_manifest(BUNDLE, tier) for tier in manifests}
        canary = by_kind(fleet, update_all(fleet))

        kit.set_percent(BUNDLE, 100.0)
        kit.clock.advance(1)
        full = {tier: kit.registry.read_manifest(BUNDLE, tier) for tier in manifests}
        last = by_kind(fleet, update_all(fleet))

    for kind in programs:
        devices = fleet.of(kind)
        for device, got in zip(devices, canary[kind], strict=True):
            manifest = manifests[device.tier]
            if device.device_id in broken_ids and entry_of(manifest, device.device_id)[1]:
                assert got == broken_outcome(device, manifest), (kind, device)
            else:
                assert got == expect(device, manifest), (kind, device)
            assert len({v for v, _, _ in got["members"].values()}) == 1, (kind, device)  # one set
            assert set(got["members"]) == set(MEMBERS)
        faulty = [(d, got) for d, got in zip(devices, canary[kind], strict=True) if d.faulty_gpu]
        assert faulty, kind
        for device, got in faulty:  # the GPU miscomputes: skipped, CPU chosen, installed
            assert got["ok"], (kind, device)
            assert {got["members"][m][2] for m in ("vision", "sensor")} == {"cpu"}, (kind, got)
        healthy_high = [
            got for d, got in zip(devices, canary[kind], strict=True)
            if d.tier == "high" and not d.faulty_gpu
        ]  # fmt: skip
        assert {got["members"]["vision"][2] for got in healthy_high} == {"opencl"}, kind

        for device, got in zip(devices, last[kind], strict=True):
            if device.device_id in broken_ids:
                refused_at_50 = in_arm(manifests[device.tier], device.device_id)
                code = None if refused_at_50 else "probe-failed"
                assert got == broken_outcome(device, full[device.tier], code), (kind, device)
            else:
                assert got == expect(device, full[device.tier]), (kind, device)
                assert got["version"] == "2.0.0", (kind, device)
        mixed = [g for g in last[kind] if len({v for v, _, _ in g["members"].values()}) != 1]
        assert mixed == [], kind
        failed = [canary[kind], last[kind]]
        assert sum(g["error_code"] == "probe-failed" for r in failed for g in r) == 2, kind
    assert_same_on_every_kind(first)
    assert_same_on_every_kind(canary)
    assert_same_on_every_kind(last)


# --- the closed loop: confirm, crash-loop, report; the serve's store; run_auto ----------------


def day(
    fleet: MixFleet, crashes_on: frozenset[str]
) -> dict[str, list[tuple[MixDevice, dict[str, Any]]]]:
    """One day of use on every device: check for an update, start the app, report.

    An app that crash-loops on a version in ``crashes_on`` dies before its first
    inference on each start, never confirming, until ``app_started`` reverts it
    (past ``max_unconfirmed_starts``); the app then runs on the last good set.
    """

    def run(kind: str, devices: list[MixDevice]) -> list[tuple[MixDevice, dict[str, Any]]]:
        program = fleet.programs[kind]
        rows = []
        for device in devices:
            fleet.configure(device)
            result = program.request("update", timeout=300)
            starts: list[bool] = []
            for _ in range(fleet.max_unconfirmed_starts + 2):
                started = program.request("app_started")
                starts.append(started["reverted"])
                if started["reverted"]:
                    continue  # the app starts again, on the last good set
                installed = program.request("current")
                version = installed["version"]
                if version is None or version in crashes_on:
                    continue  # dies before its first inference: no confirmation
                for member in sorted(installed["members"]):
                    for ms in LATENCIES:
                        program.request("record_inference", ms=ms, model=member)
                program.request("confirm", version=version)
                break
            program.request("flush", timeout=120)
            status = program.request("status")
            rows.append((device, {"result": result, "starts": starts, "status": status}))
        return rows

    return fleet.each_kind(run)


def loop_outcome(row: dict[str, Any]) -> dict[str, Any]:
    """One device's day, without what differs by kind and not by rule (paths, timings)."""
    result, status = row["result"], row["status"]
    installed = status["installed"]
    return {
        "error_code": result["error_code"],
        "is_candidate": result["is_candidate"],
        "updated": result["updated"],
        "starts": row["starts"],
        "installed": None if installed is None else installed["version"],
        "refused": sorted(status["refused"]),
    }


def auto(kit: FleetRegistry, store: ClockedStore) -> Any:
    """``edgereg rollout kit --auto`` on the simulated clock: the library's one workflow."""
    # edgereg serve marks its clock in the store every minute: install ages run on.
    store.mark_clock(kit.clock())
    return run_auto(
        kit.registry,
        BUNDLE,
        policy=MIX_POLICY,
        analyse=lambda state, now: rollout_analysis(
            store, state, guardrails=MIX_POLICY.guardrails, tiers=["high"], now=now
        ),
        now=kit.clock(),
        signers=lambda: kit.signer,
        actor="mix-cron",
        expires_days=kit.expires_days,
    )


@pytest.mark.parametrize("crashes", [False, True], ids=["good-candidate", "crash-loop"])
def test_the_closed_loop_promotes_a_good_candidate_and_rolls_back_a_crash_loop(
    project: Path,
    programs: dict[str, DeviceProgram],
    runners: SharedRunners,
    tmp_path: Path,
    crashes: bool,
) -> None:
    crashes_on = frozenset({"2.0.0"}) if crashes else frozenset()
    with mixed_fleet(project, programs, runners, tmp_path, ("high",), per_kind=LOOP_START) as (
        kit,
        fleet,
        store,
        database,
    ):
        day(fleet, crashes_on)  # 1.0.0 installed and confirmed on the first devices
        kit.clock.advance(1)
        kit.publish_bundle("2.0.0", percent=25.0)
        days, decisions, reasons = [], [], []
        for n in range(7):  # new phones join, a day of use, then cron's `rollout --auto`
            kit.clock.advance(1)
            manifest = kit.registry.read_manifest(BUNDLE, "high")
            fleet.join(
                LOOP_JOIN,
                seed=100 + n,
                inside=partial(in_arm, manifest),
                each_arm=3,
                stable_arm=manifest.percent is not None and manifest.percent < 100,
            )
            days.append(day(fleet, crashes_on))
            kit.clock.advance(24)
            result = auto(kit, store)
            decisions.append((result.decision.action, result.decision.percent))
            reasons.append(result.decision.reason)
            if result.decision.action in ("promote", "rollback", "pause"):
                break
        kit.clock.advance(1)
        final = day(fleet, crashes_on)
        state, _ = kit.registry.read_state(BUNDLE)
        rows = list(store_rows(database, BUNDLE))

    if crashes:
        # Rolled back at the first look, or at the second when the first day's cohort
        # had too few failing networks beyond the tolerated ones to fail on.
        assert decisions[-1] == ("rollback", None), reasons
        assert len(decisions) <= 2, reasons
        assert all(d[0] == "wait" for d in decisions[:-1]), reasons
        assert "revert" in reasons[-1]
        landing = "1.0.0"
    else:
        # Step by step to stable; a day may wait while a guardrail is still inconclusive
        # (latency is judged per member and device, so the first day can be short of it).
        moves = [d for d in decisions if d[0] != "wait"]
        assert moves == [("step", 50.0), ("step", 100.0), ("promote", None)], reasons
        waits = [r for d, r in zip(decisions, reasons, strict=True) if d[0] == "wait"]
        assert len(waits) <= 2, reasons
        assert all("inconclusive" in r for r in waits), reasons
        landing = "2.0.0"
    assert state is not None
    assert (state.stable, state.candidate) == (landing, None)
    assert state.history[-1].automatic
    assert state.history[-1].evidence

    # Row j of each kind is the same device (install id, GPU): the same day, every day.
    assert_same_on_every_kind(
        {
            kind: [loop_outcome(row) for d in [*days, final] for _, row in d[kind]]
            for kind in programs
        }
    )
    for kind in programs:
        # Every device of every kind ends on the landing release, as one set.
        for device, row in final[kind]:
            assert row["status"]["installed"]["version"] == landing, (kind, device)
            assert set(installed_set(row["result"]).values()) == {landing}, (kind, device)
        # The canary day: the cohort got 2.0.0; with a crash loop each of them reverted
        # on its third unconfirmed start and refuses 2.0.0 for good.
        cohort = [row for _, row in days[0][kind] if row["result"]["is_candidate"]]
        assert cohort, kind
        for row in cohort:
            if crashes:
                assert row["starts"][: fleet.max_unconfirmed_starts + 1] == [False, False, True]
                assert "2.0.0" in row["status"]["refused"], (kind, row)
            else:
                assert row["starts"] == [False], (kind, row)
        # The report store has each kind's reports: confirmations, reverts, the backends.
        mine = [r for r in rows if r["device_class"].startswith(f"{kind}-")]
        # Every install of 2.0.0: once promoted, its rows say stable (a device reports the
        # release it keeps every period, and the newer report's arm is the row's).
        candidate = {r["token"] for r in mine if r["unit_version"] == "2.0.0"}
        reverted = {r["token"] for r in mine if r["reverted"]}
        confirmed = {r["token"] for r in mine if r["confirmed"] and r["unit_version"] == "2.0.0"}
        assert candidate, kind
        if crashes:
            assert reverted == candidate, kind
            assert confirmed == set(), kind
        else:
            assert reverted == set(), kind
            assert confirmed == candidate, kind
        # The faulty GPU: skipped by each kind's self-test, CPU chosen, the probe passed.
        gpu = {
            (r["device_class"], r["backend"], r["backends_skipped"], r["probe"])
            for r in mine
            if r["model"] != "tagger"  # its one variant hints no GPU
        }
        assert gpu == {
            (f"{kind}-mali", "cpu", "opencl", "passed"),
            (f"{kind}-adreno", "opencl", "", "passed"),
        }, kind
