"""Bundle benchmark: a fleet of devices against a bundle of three on a canary.

Builds the tiny project of tests/buildkit.py (its two models plus a third,
``tagger``, with a single variant that every tier falls back to), publishes
the three models as one bundle through the real publish path to a local
registry, and asks the protocol's own ``decide(..., bundle=True)`` what each
of 1,000 simulated device ids installs, for every tier, at a 5 % and then a
50 % canary of the next bundle version (every member at a new version).

For comparison the same three models are published on their own, each with
its own 5 % and 50 % canary (its own salt, as before bundles existed), and
the same devices counted.

Targets:

1. zero mixed installs with the bundle (a device has every member at the
   stable bundle's versions or every member at the candidate's);
2. the bundle's cohort is the share of the rollout (within 3 standard errors);
3. the signed manifest of a bundle of three per tier (reported, bytes),
   against the three manifests of the models on their own.

Usage: .venv/bin/python benchmarks/bundles.py [--devices 1000]
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fleetkit import (  # noqa: E402
    BUNDLE,
    MEMBERS,
    TIERS,
    Fleet,
    FleetRegistry,
    SimClock,
    build_bundle_project,
    make_devices,
    set_member_versions,
)
from statichttp import TcpProxy  # noqa: E402

from edgereg import config as config_module  # noqa: E402
from edgereg.client import Client  # noqa: E402
from edgereg.protocol.decision import decide  # noqa: E402
from edgereg.protocol.envelope import Signer, TrustedKeys, generate_key  # noqa: E402
from edgereg.protocol.wire import BundleEntry, ManifestEntry  # noqa: E402
from edgereg.registry import (  # noqa: E402
    Registry,
    manifest_key,
    prepare_bundle_release,
    prepare_release,
    utcnow,
)
from edgereg.registry._transitions import set_percent  # noqa: E402
from edgereg.serve import start_in_thread  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

WIRE_TARGET_BYTES = 400
results: list[tuple[str, bool, str]] = []


def report(target: str, passed: bool, measured: str) -> None:
    results.append((target, passed, measured))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}", flush=True)


def publish(registry: Registry, prepared: Any, signer: Signer, percent: float | None) -> None:
    """``percent`` None: published --full."""
    registry.publish(
        prepared,
        signer=signer,
        percent=percent,
        full=percent is None,
        actor="bench",
        expires_days=30,
    )


def change_percent(registry: Registry, name: str, percent: float, signer: Signer) -> None:
    registry.change(
        name,
        lambda state, now, expires: set_percent(
            state,
            name,
            percent,
            policy=config_module.RolloutPolicy(),
            now=now,
            expires=expires,
            actor="bench",
            force=True,
        ),
        signer=signer,
        expires_days=30,
    )


def decided(
    registry: Registry, trusted: TrustedKeys, name: str, tier: str, device: str, *, bundle: bool
) -> ManifestEntry | BundleEntry | None:
    data = registry.storage.get(manifest_key(name, tier))
    return decide(
        data,
        trusted=trusted,
        model=name,
        tier=tier,
        device_id=device,
        app_mnn_runtime="3.6.1",
        highest_seen_sequence=None,
        now=utcnow(),
        bundle=bundle,
    ).entry


def fleet(
    registry: Registry, trusted: TrustedKeys, devices: int, *, bundled: bool
) -> dict[str, Any]:
    """What every device of every tier installs: version sets, mixes, cohort share."""
    mixed = candidate = 0
    combos: set[tuple[str, ...]] = set()
    started = time.perf_counter()
    for tier in TIERS:
        for index in range(devices):
            device = f"device-{index:05d}"
            if bundled:
                entry = decided(registry, trusted, BUNDLE, tier, device, bundle=True)
                assert isinstance(entry, BundleEntry)
                versions = tuple(entry.members[m].version for m in MEMBERS)
            else:
                found = [decided(registry, trusted, m, tier, device, bundle=False) for m in MEMBERS]
                versions = tuple(e.version if e else "-" for e in found)
            combos.add(versions)
            mixed += len(set(versions)) > 1
            candidate += versions[0] == "2.0.0"
    took = time.perf_counter() - started
    total = devices * len(TIERS)
    return {
        "mixed": mixed,
        "combos": len(combos),
        "share": 100 * candidate / total,
        "decide_us": 1e6 * took / total,
    }


def real_clients(project: Path, work: Path, devices: int) -> None:
    """The same canary through the REAL client against a real ``edgereg serve``.

    Every device is an ``edgereg.client.Client`` with its own cache directory
    (tiers drawn per device class); what each has installed is read back from
    its cache (``status()``) after each step. Then a sample of devices checks
    again through a counting TCP proxy: the bytes of that unchanged check.
    """
    kit = FleetRegistry.create(work / "registry", project, clock=SimClock())
    kit.publish_bundle("1.0.0", percent=None)
    kit.publish_bundle("2.0.0", percent=5.0)
    server, base_url = start_in_thread(kit.storage)
    try:
        fleet = Fleet(base_url, kit.trusted, make_devices(devices, work / "devices"), kit.clock)
        for percent in (5.0, 50.0):
            if percent != 5.0:
                kit.set_percent(BUNDLE, percent)
                kit.clock.advance(24)
            started = time.perf_counter()
            results = fleet.check_all()
            took = time.perf_counter() - started
            failed = [r.error for r in results if not r.ok]
            sets = fleet.installed_sets()
            mixed = [d for d, versions in sets.items() if len(set(versions)) > 1]
            candidate = sum(versions == ("2.0.0",) * len(MEMBERS) for versions in sets.values())
            print(
                f"\nreal clients, {percent:g}% canary: {devices} devices checked in {took:.1f}s "
                f"({1000 * took / devices:.0f} ms each), {candidate} on 2.0.0, "
                f"{len(sets) - candidate - len(mixed)} on 1.0.0, {len(failed)} failed"
                + (f" (first: {failed[0]})" if failed else "")
            )
            report(
                f"real clients: zero mixed installed sets at a {percent:g}% canary",
                not mixed and not failed,
                f"{len(mixed)} of {devices} mixed, {len(failed)} fetch errors",
            )
        unchanged_check_bytes(fleet, server.port, work, sample=min(50, devices))
    finally:
        server.close()


def unchanged_check_bytes(fleet: Fleet, port: int, work: Path, *, sample: int) -> None:
    """Bytes on the socket of one device's unchanged bundle check (request + 304)."""
    totals: list[int] = []
    requests: list[int] = []
    bad: list[str] = []
    for device in fleet.devices[:sample]:
        with TcpProxy(port) as proxy:
            # The device's own cache (its manifest and ETag), reached through the proxy.
            client = Client(
                proxy.url,
                fleet.trusted,
                device.cache_dir,
                bundle=BUNDLE,
                device=device.profile(),
                tier=device.tier,
                clock=fleet.clock,
                timeout=10,
            )
            result = client.fetch()
            deadline = time.monotonic() + 5
            while not proxy.per_connection and time.monotonic() < deadline:
                time.sleep(0.005)
            time.sleep(0.02)  # a second connection, if the client opened one, would show here
            requests.append(len(proxy.per_connection))
            totals.append(sum(up + down for up, down in proxy.per_connection))
            if not (result.ok and result.not_modified):
                bad.append(result.error or "not a 304")
    worst = max(totals)
    report(
        f"real clients: unchanged check of the bundle is one conditional request < "
        f"{WIRE_TARGET_BYTES} bytes",
        worst < WIRE_TARGET_BYTES and set(requests) == {1} and not bad,
        f"{min(totals)}-{worst} bytes sent+received per device ({sample} devices, "
        f"{max(requests)} connection(s) each)" + (f", {len(bad)} not 304: {bad[0]}" if bad else ""),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=1000)
    parser.add_argument(
        "--client-devices", type=int, default=1000, help="devices in the real-client run (0: skip)"
    )
    args = parser.parse_args()
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        started = time.perf_counter()
        project = build_bundle_project(tmp / "project")
        print(f"tiny project (3 models) built in {time.perf_counter() - started:.1f}s")
        private_pem, public_pem = generate_key()
        signer = Signer.from_pem(private_pem)
        trusted = TrustedKeys.from_pems([public_pem])
        out = project / "build"

        bundled = Registry(open_storage(f"file://{tmp / 'bundled'}"), trusted=trusted)
        alone = Registry(open_storage(f"file://{tmp / 'alone'}"), trusted=trusted)
        config = config_module.load(project / "models.toml")
        now = utcnow()
        publish(
            bundled,
            prepare_bundle_release(config, BUNDLE, out, version="1.0.0", now=now),
            signer,
            None,
        )
        for model in MEMBERS:
            publish(
                alone, prepare_release(config, model, out, version="1.0.0", now=now), signer, None
            )
        config = set_member_versions(project, "2.0.0")
        started = time.perf_counter()
        publish(
            bundled,
            prepare_bundle_release(config, BUNDLE, out, version="2.0.0", now=now),
            signer,
            5.0,
        )
        print(f"bundle publish of 3 members: {time.perf_counter() - started:.2f}s")
        for model in MEMBERS:
            publish(
                alone, prepare_release(config, model, out, version="2.0.0", now=now), signer, 5.0
            )

        for percent in (5.0, 50.0):
            if percent != 5.0:
                change_percent(bundled, BUNDLE, percent, signer)
                for model in MEMBERS:
                    change_percent(alone, model, percent, signer)
            together = fleet(bundled, trusted, args.devices, bundled=True)
            apart = fleet(alone, trusted, args.devices, bundled=False)
            devices = args.devices * len(TIERS)
            print(
                f"\n{percent:g}% canary, {devices} device/tier pairs: bundle {together['mixed']} "
                f"mixed, {together['combos']} version combinations; models alone "
                f"{apart['mixed']} mixed ({100 * apart['mixed'] / devices:.1f}%), "
                f"{apart['combos']} combinations; decide() {together['decide_us']:.0f} us per "
                f"device for the bundle, {apart['decide_us']:.0f} us for its three models"
            )
            report(
                f"zero mixed installs at a {percent:g}% canary",
                together["mixed"] == 0,
                f"{together['mixed']} of {devices} (models alone: {apart['mixed']})",
            )
            # The tiers share the device ids: ``devices`` independent draws.
            tolerance = 300 * math.sqrt(percent / 100 * (1 - percent / 100) / args.devices)
            report(
                f"the bundle's cohort is {percent:g}% of devices (within 3 standard errors, "
                f"{tolerance:.1f} points)",
                abs(together["share"] - percent) <= tolerance,
                f"{together['share']:.1f}%",
            )

        print("\nmanifest sizes (signed envelope bytes)")
        for tier in TIERS:
            size = len(bundled.storage.get(manifest_key(BUNDLE, tier)))
            sizes = [len(alone.storage.get(manifest_key(m, tier))) for m in MEMBERS]
            report(
                f"bundle manifest of tier {tier} vs its three models' manifests",
                True,
                f"{size} bytes vs {sum(sizes)} ({' + '.join(map(str, sizes))}): "
                f"{size / sum(sizes):.2f}x",
            )

        if args.client_devices:
            real_clients(project, tmp / "clients", args.client_devices)

    failed = [target for target, passed, _ in results if not passed]
    print(f"\n{len(results) - len(failed)}/{len(results)} targets met")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
