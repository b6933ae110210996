"""Fleet simulation: a couple of hundred real clients against a real `edgereg serve`.

Every device is the reference client with its own cache directory; the
registry is published through the real publish path from a tiny project
built with the real MNN converter; the device's self-test judges real MNN
outputs with the protocol's probe check (tests/fleetkit.py says what is
simulated: the device, its GPU's faults, the clock).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from fleetkit import (
    BUNDLE,
    MEMBERS,
    Device,
    Fleet,
    FleetRegistry,
    HostOutputs,
    ProbeLedger,
    build_bundle_project,
    device_self_test,
    make_devices,
)
from servekit import serve

from edgereg.client import InstallCheck

DEVICES = 200


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_bundle_project(tmp_path_factory.mktemp("fleet") / "project")


@pytest.fixture
def kit(project: Path, tmp_path: Path) -> FleetRegistry:
    kit = FleetRegistry.create(tmp_path / "registry", project)
    kit.publish_bundle("1.0.0", percent=None)
    return kit


def test_a_bundle_canary_reaches_real_clients_as_one_set(
    kit: FleetRegistry, tmp_path: Path
) -> None:
    kit.publish_bundle("2.0.0", percent=5.0)
    with serve(kit.storage) as base_url:
        fleet = Fleet(base_url, kit.trusted, make_devices(DEVICES, tmp_path / "d"), kit.clock)
        seen: dict[float, dict[str, int]] = {}
        for percent in (5.0, 50.0, 100.0):
            if percent != 5.0:
                kit.set_percent(BUNDLE, percent)
                kit.clock.advance(24)
            results = fleet.check_all()
            assert [r.error for r in results if not r.ok] == []
            assert fleet.mixed() == []
            seen[percent] = fleet.versions()
        again = fleet.check_all()
    assert all(r.ok and r.not_modified for r in again)
    assert set(seen[5.0]) <= {"1.0.0", "2.0.0"}
    assert seen[5.0]["1.0.0"] >= DEVICES * 0.85
    assert abs(seen[50.0].get("2.0.0", 0) - DEVICES / 2) <= 0.15 * DEVICES
    assert seen[100.0] == {"2.0.0": DEVICES}


def test_a_faulty_gpu_falls_back_to_cpu_and_a_failed_probe_is_never_installed(
    kit: FleetRegistry, tmp_path: Path
) -> None:
    # 2.0.0 of every member miscomputes on every backend of one device in
    # five (a kernel bug in its class): those devices must keep 1.0.0.
    host, ledger = HostOutputs(), ProbeLedger()
    devices = make_devices(DEVICES, tmp_path / "d")
    broken_on = {d.device_id for d in devices[::5]}

    def check_of(device: Device) -> InstallCheck:
        broken = frozenset({"2.0.0"}) if device.device_id in broken_on else frozenset()
        return device_self_test(device, host, ledger, broken=broken)

    with serve(kit.storage) as base_url:
        fleet = Fleet(base_url, kit.trusted, devices, kit.clock, install_check=check_of)
        assert all(r.ok for r in fleet.check_all())
        kit.publish_bundle("2.0.0", percent=100.0)
        kit.clock.advance(1)
        results = {d.device_id: r for d, r in zip(devices, fleet.check_all(), strict=True)}
        statuses = {d.device_id: fleet.client(d).status() for d in devices}

    faulty = [d for d in devices if d.kind.faulty_gpu]
    assert faulty, "the fleet mix has devices with a faulty GPU"
    for device in faulty:
        for member in ("vision", "sensor"):  # the members hinted ["opencl", "cpu"] on high
            key = (device.device_id, member, "1.0.0")
            assert ledger.skipped[key] == ["opencl"]
            assert ledger.passed[key] == "cpu"
            assert statuses[device.device_id].members[member].version in {"1.0.0", "2.0.0"}
    healthy_high = [d for d in devices if d.tier == "high" and not d.kind.faulty_gpu]
    assert all(ledger.passed[(d.device_id, "vision", "1.0.0")] == "opencl" for d in healthy_high)

    for device in devices:
        status = statuses[device.device_id]
        installed = {(device.device_id, m, model.version) for m, model in status.members.items()}
        assert not installed & ledger.failed, f"{device.device_id} installed a failed probe"
        assert set(status.members) == set(MEMBERS)
        assert len({*installed}) == len(MEMBERS)
        if device.device_id in broken_on:
            assert status.version == "1.0.0"
            assert "2.0.0" in status.bad_releases
            assert results[device.device_id].error_code == "probe-failed"
        else:
            assert status.version == "2.0.0"
            assert results[device.device_id].ok
            backends = {m: model.backend for m, model in status.members.items()}
            want = "cpu" if device.kind.faulty_gpu or device.tier != "high" else "opencl"
            assert backends["vision"] == want
    assert len(ledger.failed) >= len(broken_on)
