"""Fleet benchmark: 1,000 real clients, with their self-tests, through two rollouts of a bundle.

The simulator of tests/fleetkit.py: every device is the reference client with
its own cache directory against a real ``edgereg serve`` on loopback; the
bundle of three (tests/buildkit.py's tiny models and ``tagger``) is built with
the real MNN converter; each device's install check runs the golden probe on
each hinted backend, judging real MNN outputs with the protocol's probe check.
A quarter of the high tier's devices have a faulty GPU (``opencl`` outputs
perturbed).

Rollouts:

1. a good 2.0.0: 5 % -> 25 % -> 50 % -> 100 % (24 simulated hours between steps),
   then promoted;
2. a bad 3.0.0 that miscomputes on every backend of one device in ten:
   5 % -> 50 %.

Targets:

1. zero mixed installed sets after any step;
2. every device with a faulty GPU that installs a member hinted
   ``["opencl", "cpu"]`` skips opencl and runs it on cpu;
3. no device has a member installed whose probe failed on it; each device
   that failed 3.0.0 keeps 2.0.0 and has 3.0.0 marked bad;
4. a device's update check (reported: ms per device with and without a new
   release, the host MNN runs the self-test needed).

Usage: .venv/bin/python benchmarks/fleet.py [--devices 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fleetkit import (  # noqa: E402
    BUNDLE,
    Device,
    Fleet,
    FleetRegistry,
    HostOutputs,
    ProbeLedger,
    build_bundle_project,
    device_self_test,
    make_devices,
)

from edgereg.client import InstallCheck  # noqa: E402
from edgereg.serve import start_in_thread  # noqa: E402

results: list[tuple[str, bool, str]] = []


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


def step(fleet: Fleet, kit: FleetRegistry, label: str, ledger: ProbeLedger) -> None:
    """One update check per device, then the targets that hold after every step."""
    failed_before = len(ledger.failed)
    started = time.perf_counter()
    checked = fleet.check_all()
    took = time.perf_counter() - started
    errors = {r.error_code for r in checked if not r.ok}
    mixed = fleet.mixed()
    print(
        f"\n{label}: {len(fleet.devices)} checks in {took:.1f}s "
        f"({1000 * took / len(fleet.devices):.1f} ms each); installed {fleet.versions()}; "
        f"{len(ledger.failed) - failed_before} new probe failures; errors {sorted(errors)}"
    )
    report(f"{label}: zero mixed installed sets", not mixed, f"{len(mixed)} mixed")
    installed_failed = 0
    for device in fleet.devices:
        status = fleet.client(device).status(verify=False)
        keys = {(device.device_id, m, model.version) for m, model in status.members.items()}
        installed_failed += bool(keys & ledger.failed)
    report(
        f"{label}: no device runs a model that failed its own probe",
        installed_failed == 0 and errors <= {"probe-failed"},
        f"{installed_failed} devices",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        project = build_bundle_project(tmp / "project")
        print(f"tiny project (3 models, 7 variants) built in {time.perf_counter() - started:.1f}s")
        kit = FleetRegistry.create(tmp / "registry", project)
        kit.publish_bundle("1.0.0", percent=None)
        devices = make_devices(args.devices, tmp / "devices")
        broken_on = {d.device_id for d in devices[::10]}
        host, ledger = HostOutputs(), ProbeLedger()

        def check_of(device: Device) -> InstallCheck:
            broken = frozenset({"3.0.0"}) if device.device_id in broken_on else frozenset()
            return device_self_test(device, host, ledger, broken=broken)

        server, base_url = start_in_thread(kit.storage)
        try:
            fleet = Fleet(base_url, kit.trusted, devices, kit.clock, install_check=check_of)
            step(fleet, kit, "1.0.0 for everyone", ledger)
            kit.publish_bundle("2.0.0", percent=5.0)
            for percent in (5.0, 25.0, 50.0, 100.0):
                if percent != 5.0:
                    kit.clock.advance(24)
                    kit.set_percent(BUNDLE, percent)
                step(fleet, kit, f"good 2.0.0 at {percent:g}%", ledger)
            started = time.perf_counter()
            again = fleet.check_all()
            unchanged_ms = 1000 * (time.perf_counter() - started) / len(devices)
            kit.promote(BUNDLE)
            step(fleet, kit, "2.0.0 promoted", ledger)
            kit.clock.advance(24)
            kit.publish_bundle("3.0.0", percent=5.0)
            step(fleet, kit, "bad 3.0.0 at 5%", ledger)
            kit.clock.advance(24)
            kit.set_percent(BUNDLE, 50.0)
            step(fleet, kit, "bad 3.0.0 at 50%", ledger)
        finally:
            server.close()

        faulty = [d for d in devices if d.kind.faulty_gpu]
        wrong = [
            (d.device_id, member, version)
            for d in faulty
            for member in ("vision", "sensor")
            for version in ("1.0.0", "2.0.0", "3.0.0")
            if (key := (d.device_id, member, version)) in ledger.passed
            and (ledger.skipped[key] != ["opencl"] or ledger.passed[key] != "cpu")
        ]
        report(
            "faulty GPU: opencl skipped, cpu chosen, the probe passes",
            not wrong and bool(faulty),
            f"{len(faulty)} devices, {len(wrong)} installs on another backend",
        )
        failed_devices = {device for device, _, _ in ledger.failed}
        kept = [
            d
            for d in devices
            if d.device_id in failed_devices
            and (
                (status := fleet.client(d).status(verify=False)).version != "2.0.0"
                or "3.0.0" not in status.bad_releases
            )
        ]
        report(
            "a device whose probe failed on 3.0.0 keeps 2.0.0, 3.0.0 marked bad",
            not kept and bool(failed_devices),
            f"{len(failed_devices)} devices failed 3.0.0 (of {len(broken_on)} broken, "
            f"the rest outside the cohort), {len(kept)} not as expected",
        )
        report(
            "an unchanged check of every device",
            all(r.ok and r.not_modified for r in again),
            f"{unchanged_ms:.1f} ms per device (304); "
            f"{host.runs} host MNN runs served {len(ledger.passed)} member self-tests",
        )

    failed = [target for target, passed, _ in results if not passed]
    print(f"\n{len(results) - len(failed)}/{len(results)} targets met")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
