"""The client an app can live with, over real HTTP: bundles, contracts, fit, status, offline,
space, conditions, the install check and revert.

Manifests are written with edgereg.protocol.wire and signed (tests/clientkit.py) and served
by a static file server on loopback (tests/statichttp.py).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from clientkit import MEMBERS, Kit, device_id
from statichttp import StaticServer

from edgereg.cli.pull import pull_command
from edgereg.client import (
    BundledRelease,
    Client,
    Conditions,
    DownloadPolicy,
    FetchResult,
    MemberFiles,
    Rejected,
    TrustedKeys,
)
from edgereg.protocol.fields import Requirements, VersionRange
from edgereg.rollout import DeviceProfile

ROOT = Path(__file__).resolve().parent.parent
LABELS = [f"class-{i}" for i in range(10)]


@pytest.fixture
def kit(tmp_path: Path) -> Kit:
    return Kit(tmp_path / "registry")


@pytest.fixture
def server(kit: Kit) -> Iterator[StaticServer]:
    kit.root.mkdir(parents=True, exist_ok=True)
    with StaticServer(kit.root) as running:
        yield running


def client(
    kit: Kit,
    url: str,
    cache: Path,
    *,
    bundle: str | None = "ocr",
    model: str | None = None,
    device: str = "device-1",
    os_name: str | None = "android",
    os_version: str | None = "34",
    **options: Any,
) -> Client:
    return Client(
        url,
        TrustedKeys([kit.signer.public_key]),
        cache,
        bundle=None if model is not None else bundle,
        model=model,
        device=DeviceProfile(
            device_id=device,
            ram_mb=4096,
            cpu_cores=8,
            mnn_runtime="3.6.1",
            os=os_name,
            os_version=os_version,
        ),
        tier="high",
        timeout=5,
        **options,
    )


def installed_json(cache: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((cache / "installed.json").read_text())
    return data


def assert_set(result: FetchResult, kit: Kit, version: str) -> None:
    """Every member installed at ``version``, each artifact the bytes the registry holds."""
    assert result.bundle
    assert result.version == version
    assert sorted(result.members) == sorted(MEMBERS)
    for member in result.members.values():
        assert member.version == version
        assert member.path.read_bytes() == kit.blobs[member.sha256]


# --- bundles ----------------------------------------------------------------------------


def test_a_bundle_installs_every_member_with_its_contract_and_labels(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0", labels=LABELS, labels_as_blob=True))
    cache = tmp_path / "c"
    result = client(kit, server.url, cache).fetch()
    assert result.ok, result.error
    assert result.updated
    assert result.path is None  # a bundle's models are its members
    assert_set(result, kit, "1.0.0")
    for member in result.members.values():
        assert member.contract is not None
        assert member.contract.inputs[0].shape == [1, 3, 32, 32]
        assert member.contract.outputs[0].shape == ["batch", 10]
        assert member.labels == LABELS  # the verified labels blob, loaded
    pointer = installed_json(cache)["bundles"]["ocr"]
    assert pointer["version"] == "1.0.0"
    assert sorted(pointer["members"]) == sorted(MEMBERS)
    again = client(kit, server.url, cache).current()
    assert again is not None
    assert again.members == result.members


def test_a_model_returns_its_inline_labels_and_contract(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("digits", kit.entry("digits", "1.0.0", labels=LABELS))
    result = client(kit, server.url, tmp_path / "c", model="digits").fetch()
    assert result.ok, result.error
    assert result.path is not None
    assert result.labels == LABELS
    assert result.contract is not None
    assert result.contract.task.kind == "classification"


def test_a_bundle_rollout_gives_all_new_or_all_old(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    v1 = kit.bundle_entry("1.0.0")
    kit.publish("ocr", v1)
    inside, outside = device_id(True), device_id(False)
    caches = {inside: tmp_path / "in", outside: tmp_path / "out"}
    for dev, cache in caches.items():
        assert client(kit, server.url, cache, device=dev).fetch().ok
    kit.publish("ocr", v1, kit.bundle_entry("1.1.0"), percent=50.0)
    got_in = client(kit, server.url, caches[inside], device=inside).fetch()
    got_out = client(kit, server.url, caches[outside], device=outside).fetch()
    assert_set(got_in, kit, "1.1.0")
    assert got_in.is_candidate
    assert_set(got_out, kit, "1.0.0")
    assert not got_out.updated


def test_a_partly_downloaded_bundle_never_becomes_active(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    cache = tmp_path / "c"
    assert client(kit, server.url, cache).fetch().ok
    v2 = kit.bundle_entry("1.1.0")
    kit.publish("ocr", v2)
    last = v2.members[sorted(v2.members)[-1]]  # downloaded last: the others are complete
    server.state.drop_after[last.path] = 10_000
    broken = client(kit, server.url, cache).fetch()
    assert broken.error_code == "transport"
    assert_set(broken, kit, "1.0.0")  # the old set, whole
    assert installed_json(cache)["bundles"]["ocr"]["version"] == "1.0.0"
    status = client(kit, server.url, cache).status()
    assert status.version == "1.0.0"
    assert status.ready
    assert status.pending is not None
    assert status.pending.version == "1.1.0"
    assert status.pending.deferred is None
    assert 0 < status.pending.remaining_bytes < status.pending.total_bytes
    assert status.last_error is not None
    assert status.last_error.code == "transport"
    healed = client(kit, server.url, cache).fetch()
    assert_set(healed, kit, "1.1.0")
    after = client(kit, server.url, cache).status()
    assert after.pending is None
    assert after.last_error is None
    assert after.previous == "1.0.0"


def test_model_and_bundle_manifests_are_not_interchangeable(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    kit.publish("digits", kit.entry("digits", "1.0.0"))
    as_model = client(kit, server.url, tmp_path / "a", model="ocr").fetch()
    assert as_model.error_code == "malformed"
    assert "bundle" in (as_model.error or "")
    as_bundle = client(kit, server.url, tmp_path / "b", bundle="digits").fetch()
    assert as_bundle.error_code == "malformed"


def test_exactly_one_of_model_and_bundle(kit: Kit, tmp_path: Path) -> None:
    keys = TrustedKeys([kit.signer.public_key])
    phone = DeviceProfile(device_id="d", ram_mb=1, cpu_cores=1)
    url = "http://127.0.0.1:9/"
    with pytest.raises(ValueError, match="exactly one"):
        Client(url, keys, tmp_path, model="a", bundle="b", device=phone, tier="high")
    with pytest.raises(ValueError, match="exactly one"):
        Client(url, keys, tmp_path, device=phone, tier="high")
    with pytest.raises(ValueError, match="app_version"):
        client(kit, "http://127.0.0.1:9/", tmp_path, app_version="not a version")


# --- app and OS fit -----------------------------------------------------------------------


def test_a_candidate_needing_a_newer_app_falls_back_to_stable(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    needs_new_app = Requirements(app=VersionRange(">=3.0.0"))
    kit.publish(
        "ocr",
        kit.bundle_entry("1.0.0"),
        kit.bundle_entry("1.1.0", requires=needs_new_app),
        percent=100.0,
    )
    old_app = client(kit, server.url, tmp_path / "old", app_version="2.4.0").fetch()
    assert old_app.ok
    assert_set(old_app, kit, "1.0.0")
    assert old_app.fallback == "app-incompatible"
    new_app = client(kit, server.url, tmp_path / "new", app_version="3.1.0").fetch()
    assert_set(new_app, kit, "1.1.0")
    assert new_app.fallback is None


def test_a_stable_needing_a_newer_os_is_refused_and_nothing_installed(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish(
        "digits", kit.entry("digits", "1.0.0", requires=Requirements(android=VersionRange(">=35")))
    )
    result = client(kit, server.url, tmp_path / "c", model="digits", os_version="33").fetch()
    assert result.error_code == "os-incompatible"
    assert not result.installed
    assert "Android API >=35" in (result.error or "")


# --- status ----------------------------------------------------------------------------


def test_status_reports_ready_only_while_the_blobs_are_intact(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    fresh = client(kit, server.url, cache).status()
    assert fresh.version is None
    assert not fresh.ready
    kit.publish("ocr", kit.bundle_entry("1.0.0", probe=True))
    result = client(kit, server.url, cache).fetch()
    status = client(kit, server.url, cache).status()
    assert status.ready
    assert status.kind == "bundle"
    assert status.version == "1.0.0"
    assert {name: m.path for name, m in status.members.items()} == {
        name: m.path for name, m in result.members.items()
    }
    assert all(m.probe_path is not None and m.probe_path.is_file() for m in status.members.values())
    victim = status.members["rec"].path
    victim.write_bytes(b"x" + victim.read_bytes()[1:])  # same size, another digest
    assert not client(kit, server.url, cache).status().ready
    assert client(kit, server.url, cache).status(verify=False).ready


# --- download conditions ----------------------------------------------------------------


def test_conditions_defer_every_blob_byte_but_the_manifest_is_verified(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    cache = tmp_path / "c"
    wifi_only = DownloadPolicy(allow_metered=False, require_charging=True)
    on_cellular = client(kit, server.url, cache, policy=wifi_only).fetch(
        Conditions(metered=True, charging=True)
    )
    assert on_cellular.ok
    assert on_cellular.deferred == "metered"
    assert not on_cellular.installed
    assert server.state.body_bytes("blobs/") == 0
    assert [r.path for r in server.state.requests] == ["manifests/ocr/high.json"]
    status = client(kit, server.url, cache).status()
    assert status.pending is not None
    assert status.pending.deferred == "metered"
    assert status.pending.version == "1.0.0"
    unplugged = client(kit, server.url, cache, policy=wifi_only).fetch(
        Conditions(metered=False, charging=False)
    )
    assert unplugged.deferred == "not-charging"
    unknown = client(kit, server.url, cache, policy=wifi_only).fetch()
    assert unknown.deferred == "metered"  # an unknown network counts as metered
    assert server.state.body_bytes("blobs/") == 0
    allowed = client(kit, server.url, cache, policy=wifi_only).fetch(
        Conditions(metered=False, charging=True)
    )
    assert_set(allowed, kit, "1.0.0")
    assert client(kit, server.url, cache).status().pending is None


def test_idle_and_storage_conditions_defer_until_said_met(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    cache = tmp_path / "c"
    overnight = DownloadPolicy(require_idle=True, require_storage_not_low=True)
    steps = [
        (Conditions(), "not-idle"),  # nothing said: unknown is unmet
        (Conditions(idle=False, storage_low=False), "not-idle"),
        (Conditions(idle=True), "storage-low"),
        (Conditions(idle=True, storage_low=True), "storage-low"),
    ]
    for conditions, why in steps:
        result = client(kit, server.url, cache, policy=overnight).fetch(conditions)
        assert (result.deferred, result.installed) == (why, False), conditions
    assert server.state.body_bytes("blobs/") == 0
    met = client(kit, server.url, cache, policy=overnight).fetch(
        Conditions(idle=True, storage_low=False)
    )
    assert_set(met, kit, "1.0.0")


# --- storage preflight and eviction --------------------------------------------------


def test_preflight_refuses_a_download_the_free_space_cannot_hold(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    cache = tmp_path / "c"
    greedy = DownloadPolicy(reserve_bytes=shutil.disk_usage(tmp_path).free * 4)
    result = client(kit, server.url, cache, policy=greedy).fetch()
    assert result.error_code == "no-space"
    assert "needs" in (result.error or "")
    assert server.state.body_bytes("blobs/") == 0
    assert not list((cache / "blobs").glob("*")) if (cache / "blobs").exists() else True


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (we are root in CI); skipped where mounting is not allowed."""
    mount = tmp_path / "small"
    mount.mkdir()
    if shutil.which("mount") is None or os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root and mount(8)")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_no_space_on_a_real_small_filesystem(
    kit: Kit, server: StaticServer, small_fs: Path
) -> None:
    kit.publish("ocr", kit.bundle_entry("1.0.0", size=1_000_000))  # 3 MB on a 2 MiB disk
    cache = small_fs / "c"
    result = client(kit, server.url, cache, policy=DownloadPolicy(reserve_bytes=0)).fetch()
    assert result.error_code == "no-space"
    assert "3000000 to fetch" in (result.error or "")
    assert server.state.body_bytes("blobs/") == 0
    small = Kit(kit.root, signer=kit.signer, sequence=kit.sequence)
    small.publish("ocr", small.bundle_entry("1.0.1", size=200_000))
    assert client(kit, server.url, cache, policy=DownloadPolicy(reserve_bytes=0)).fetch().ok


def test_eviction_keeps_the_installed_and_the_last_good_set(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    sets = {}
    for version in ("1.0.0", "1.1.0", "1.2.0"):
        kit.publish("ocr", kit.bundle_entry(version, labels=LABELS, labels_as_blob=True))
        sets[version] = client(kit, server.url, cache).fetch()
        assert sets[version].ok
    on_disk = {p.name for p in (cache / "blobs").iterdir()}
    for version, expected in (("1.0.0", False), ("1.1.0", True), ("1.2.0", True)):
        digests = {m.sha256 for m in sets[version].members.values()}
        assert (digests <= on_disk) is expected, version
    assert installed_json(cache)["bundles"]["ocr"]["previous"]["version"] == "1.1.0"


# --- offline first launch ------------------------------------------------------------


def shipped(kit: Kit, tmp_path: Path, data: bytes) -> BundledRelease:
    """What an app ships: the manifest bytes and the blobs it names, by digest."""
    apk = tmp_path / "apk-assets"
    apk.mkdir(exist_ok=True)
    envelope = json.loads(data)
    payload = json.loads(base64.b64decode(envelope["payload"]))
    for member in payload["stable"]["members"].values():
        (apk / member["sha256"]).write_bytes(kit.blobs[member["sha256"]])
    return BundledRelease(manifest=data, blobs_dir=apk)


def test_offline_first_launch_installs_the_shipped_release_then_a_newer_replaces_it(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    long_ago = datetime.now(timezone.utc).replace(microsecond=0) - timedelta(days=400)
    data = kit.publish("ocr", kit.bundle_entry("1.0.0"), expires=long_ago)  # expired: fine
    release = shipped(kit, tmp_path, data)
    cache = tmp_path / "c"
    offline = client(kit, "http://127.0.0.1:9/", cache, bundled=release)
    first = offline.current()
    assert first is not None
    assert_set(first, kit, "1.0.0")
    assert first.bundled
    fetched = offline.fetch()  # no network: keeps the shipped set
    assert fetched.error_code == "transport"
    assert_set(fetched, kit, "1.0.0")
    kit.publish("ocr", kit.bundle_entry("1.1.0"))
    online = client(kit, server.url, cache, bundled=release).fetch()
    assert_set(online, kit, "1.1.0")
    assert not online.bundled
    # The app starts again with its old shipped copy: the newer release stays.
    restarted = client(kit, server.url, cache, bundled=release)
    current = restarted.current()
    assert current is not None
    assert current.version == "1.1.0"
    assert json.loads((cache / "state/ocr/sequence.json").read_text())["highest_sequence"] == 2


def test_a_shipped_release_with_the_highest_sequence_blocks_no_online_update(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    """Issue #22: a shipped release never raises the sequence devices remember."""
    data = kit.publish("ocr", kit.bundle_entry("1.0.0"), sequence=2**53 - 1)
    release = shipped(kit, tmp_path, data)
    cache = tmp_path / "c"
    first = client(kit, "http://127.0.0.1:9/", cache, bundled=release).current()
    assert first is not None
    assert first.bundled
    assert not (cache / "state/ocr/sequence.json").exists()
    kit.publish("ocr", kit.bundle_entry("1.1.0"), sequence=7)  # the registry's real history
    online = client(kit, server.url, cache, bundled=release).fetch()
    assert online.ok, online.error
    assert_set(online, kit, "1.1.0")
    # The next start does not put the shipped copy back over the online release ...
    restarted = client(kit, server.url, cache, bundled=release)
    current = restarted.current()
    assert current is not None
    assert current.version == "1.1.0"
    # ... and rollback protection holds from the online sequence on.
    kit.publish("ocr", kit.bundle_entry("1.0.0"), sequence=6)
    replayed = restarted.fetch()
    assert replayed.error_code == "rollback"
    assert json.loads((cache / "state/ocr/sequence.json").read_text())["highest_sequence"] == 7


def test_a_tampered_shipped_blob_is_not_installed(kit: Kit, tmp_path: Path) -> None:
    data = kit.publish("ocr", kit.bundle_entry("1.0.0"))
    release = shipped(kit, tmp_path, data)
    victim = sorted(release.blobs_dir.iterdir())[0]
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    cache = tmp_path / "c"
    c = client(kit, "http://127.0.0.1:9/", cache, bundled=release)
    assert c.current() is None
    status = c.status()
    assert status.last_error is not None
    assert status.last_error.code == "bad-blob"
    assert not list(cache.rglob("*.part"))


# --- the install check, bad releases and revert ---------------------------------------------


class Probe(Rejected):
    """What the self-test raises when a model miscomputes on this device."""

    reason = "probe-failed"
    permanent = True


def test_install_check_chooses_backends_or_rejects_for_good(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    seen: list[tuple[str, str, Mapping[str, MemberFiles]]] = []

    def on_cpu(unit: str, version: str, members: Mapping[str, MemberFiles]) -> dict[str, str]:
        seen.append((unit, version, members))
        for files in members.values():
            assert files.artifact.read_bytes() == kit.blobs[files.entry.sha256]
            assert files.probe is not None
            assert files.probe.is_file()
        return {name: "cpu" for name in members}

    kit.publish("ocr", kit.bundle_entry("1.0.0", probe=True))
    cache = tmp_path / "c"
    first = client(kit, server.url, cache, install_check=on_cpu).fetch()
    assert first.ok
    assert {m.backend for m in first.members.values()} == {"cpu"}
    assert seen[0][:2] == ("ocr", "1.0.0")
    assert client(kit, server.url, cache).current().members["det"].backend == "cpu"  # type: ignore[union-attr]

    def fails(unit: str, version: str, members: Mapping[str, MemberFiles]) -> None:
        raise Probe(f"{unit} {version}: outputs off by 0.4 on every backend")

    inside = device_id(True, 100.0)
    kit.publish(
        "ocr", kit.bundle_entry("1.0.0", probe=True), kit.bundle_entry("1.1.0"), percent=100.0
    )
    rejected = client(kit, server.url, cache, device=inside, install_check=fails).fetch()
    assert rejected.error_code == "probe-failed"
    assert rejected.version == "1.0.0"  # the last good stays
    assert client(kit, server.url, cache).status().bad_releases.keys() == {"1.1.0"}
    server.state.reset_counts()
    later = client(kit, server.url, cache, device=inside, install_check=on_cpu).fetch()
    assert later.ok
    assert later.version == "1.0.0"
    assert later.fallback == "bad-release"
    assert server.state.body_bytes("blobs/") == 0  # never downloaded again


def test_revert_switches_to_the_last_good_and_marks_the_current_bad(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    kit.publish("digits", kit.entry("digits", "1.0.0"))
    assert client(kit, server.url, cache, model="digits").fetch().ok
    kit.publish("digits", kit.entry("digits", "1.1.0"))
    assert client(kit, server.url, cache, model="digits").fetch().version == "1.1.0"
    reverted = client(kit, server.url, cache, model="digits").revert("crash loop: 3 starts")
    assert reverted is not None
    assert reverted.version == "1.0.0"
    again = client(kit, server.url, cache, model="digits").fetch()
    assert again.error_code == "bad-release"
    assert again.version == "1.0.0"
    status = client(kit, server.url, cache, model="digits").status()
    assert "crash loop" in status.bad_releases["1.1.0"]


# --- a crash at any moment leaves the old set or the new set ---------------------------

CHILD = """
import sys, time
from edgereg.client import Client, DeviceProfile, TrustedKeys
from edgereg.signing import load_public_key
url, cache, pem = sys.argv[1:4]
client = Client(url, TrustedKeys([load_public_key(open(pem, "rb").read())]), cache,
                bundle="ocr", device=DeviceProfile(device_id="device-1", ram_mb=4096,
                cpu_cores=8, mnn_runtime="3.6.1"), tier="high", timeout=5)
print("ready", flush=True)
started = time.monotonic()
result = client.fetch()
print(time.monotonic() - started, flush=True)
sys.exit(0 if result.ok else 3)
"""


def check_consistent(cache: Path, kit: Kit, versions: dict[str, set[str]]) -> str:
    """The bundle's pointer names one whole, verified set; returns its version."""
    pointer = installed_json(cache)["bundles"]["ocr"]
    version = pointer["version"]
    digests = {m["sha256"] for m in pointer["members"].values()}
    assert digests == versions[version], "a mix of two sets"
    for digest in digests:
        assert hashlib.sha256((cache / "blobs" / digest).read_bytes()).hexdigest() == digest
    return str(version)


def test_killing_the_client_at_random_moments_never_leaves_a_mix(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    pem = tmp_path / "registry.pub.pem"
    pem.write_bytes(kit.signer.public_pem())
    v1 = kit.bundle_entry("1.0.0", size=2_000_000)
    kit.publish("ocr", v1)
    base = tmp_path / "base"
    assert client(kit, server.url, base).fetch().ok
    v2 = kit.bundle_entry("1.1.0", size=2_000_000)
    kit.publish("ocr", v2)
    versions = {
        "1.0.0": {m.sha256 for m in v1.members.values()},
        "1.1.0": {m.sha256 for m in v2.members.values()},
    }
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    args = [sys.executable, "-c", CHILD, server.url]

    def start(cache: Path) -> subprocess.Popen[bytes]:
        process = subprocess.Popen(
            [*args, str(cache), str(pem)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
        assert process.stdout is not None
        assert process.stdout.readline().strip() == b"ready"  # imports done, fetch starts
        return process

    timing = tmp_path / "timing"
    shutil.copytree(base, timing)
    began = time.monotonic()
    calibration = start(timing)
    assert calibration.wait(timeout=60) == 0
    fetch_seconds = time.monotonic() - began
    calibration.stdout.close()  # type: ignore[union-attr]
    rng = random.Random(7)
    outcomes = []
    for attempt in range(12):
        cache = tmp_path / f"kill-{attempt}"
        shutil.copytree(base, cache)
        process = start(cache)
        # Anywhere in the fetch: manifest, any member's download, the switch, or after.
        time.sleep(rng.uniform(0.0, 1.1) * fetch_seconds)
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=10)
        process.stdout.close()  # type: ignore[union-attr]
        outcomes.append(check_consistent(cache, kit, versions))
        # The next start finishes the job (resuming any partial download).
        resumed = client(kit, server.url, cache).fetch()
        assert resumed.ok, resumed.error
        assert check_consistent(cache, kit, versions) == "1.1.0"
    assert set(outcomes) <= {"1.0.0", "1.1.0"}


# --- edgereg pull -----------------------------------------------------------------------


def test_pull_a_bundle_prints_the_contracts_and_status(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    pem = tmp_path / "registry.pub.pem"
    pem.write_bytes(kit.signer.public_pem())
    kit.publish("ocr", kit.bundle_entry("1.0.0", labels=LABELS))
    cache = tmp_path / "c"
    common = ["--registry", server.url, "--device-id", "d1", "--tier", "high"]
    common += ["--trusted-key", str(pem), "--out", str(cache)]
    runner = CliRunner()
    deferred = runner.invoke(
        pull_command, ["--bundle", "ocr", *common, "--metered", "--no-allow-metered"]
    )
    assert deferred.exit_code == 0, deferred.output
    assert "deferred (metered)" in deferred.output
    done = runner.invoke(pull_command, ["--bundle", "ocr", *common, "--app-version", "2.0.0"])
    assert done.exit_code == 0, done.output
    assert "ocr 1.0.0" in done.output
    assert "image float32 [1, 3, 32, 32] NCHW RGB" in done.output
    assert "10 labels" in done.output
    status = runner.invoke(
        pull_command, ["--bundle", "ocr", "--status", "--out", str(cache), "--json"]
    )
    assert status.exit_code == 0, status.output
    data = json.loads(status.output)
    assert data["ready"] is True
    assert data["version"] == "1.0.0"
    assert sorted(data["members"]) == sorted(MEMBERS)


HOSTILE_LABELS = ["\x1b]0;owned\x07title", "bidi\u202eexe.txt", "csi\x9b31m", "\x1b[2J"]
RAW_CONTROLS = ("\x1b", "\x07", "\x9b", "\u202e")


def test_pull_prints_publisher_labels_with_control_characters_escaped(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    """Issue #22: signed is not safe for a terminal."""
    pem = tmp_path / "registry.pub.pem"
    pem.write_bytes(kit.signer.public_pem())
    kit.publish("ocr", kit.bundle_entry("1.0.0", labels=HOSTILE_LABELS, labels_as_blob=True))
    cache = tmp_path / "c"
    common = ["--registry", server.url, "--device-id", "d1", "--tier", "high"]
    common += ["--trusted-key", str(pem), "--out", str(cache)]
    runner = CliRunner()
    done = runner.invoke(pull_command, ["--bundle", "ocr", *common])
    status = runner.invoke(pull_command, ["--bundle", "ocr", "--status", "--out", str(cache)])
    as_json = runner.invoke(
        pull_command, ["--bundle", "ocr", "--status", "--out", str(cache), "--json"]
    )
    for result in (done, status):
        assert result.exit_code == 0, result.output
        assert not any(c in result.output for c in RAW_CONTROLS), repr(result.output)
    assert "\\x1b]0;owned\\x07title" in done.output
    assert "bidi\\u202eexe.txt" in done.output
    # JSON escapes them its own way and stays exact.
    assert not any(c in as_json.output for c in RAW_CONTROLS)
    assert as_json.exit_code == 0, as_json.output


def test_pull_offline_release_installs_without_network(kit: Kit, tmp_path: Path) -> None:
    pem = tmp_path / "registry.pub.pem"
    pem.write_bytes(kit.signer.public_pem())
    kit.publish("ocr", kit.bundle_entry("1.0.0"))
    cache = tmp_path / "c"
    result = CliRunner().invoke(
        pull_command,
        [
            "--bundle", "ocr", "--registry", "http://127.0.0.1:9/", "--device-id", "d1",
            "--tier", "high", "--trusted-key", str(pem), "--out", str(cache),
            "--offline-release", str(kit.root),
        ],
    )  # fmt: skip
    assert "keeping ocr 1.0.0" in result.output, result.output
    assert result.exit_code == 10  # the online check failed; the shipped set is installed


def test_pull_usage_errors_are_clear(tmp_path: Path) -> None:
    runner = CliRunner()
    both = runner.invoke(pull_command, ["digits", "--bundle", "ocr", "--status", "--out", "x"])
    assert both.exit_code == 2
    assert "MODEL or --bundle" in both.output
    neither = runner.invoke(pull_command, ["--status", "--out", str(tmp_path)])
    assert neither.exit_code == 2


# --- bad input keeps the last good --------------------------------------------------------


def test_a_labels_blob_that_is_not_a_list_of_strings_refuses_the_release(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    cache = tmp_path / "c"
    kit.publish("digits", kit.entry("digits", "1.0.0"))
    assert client(kit, server.url, cache, model="digits").fetch().ok
    entry = kit.entry("digits", "1.1.0")
    assert entry.contract is not None
    not_labels = kit.blob(b'{"0": "cat"}')
    broken = entry.model_copy(
        update={"contract": entry.contract.model_copy(update={"labels_blob": not_labels})}
    )
    kit.publish("digits", broken)
    result = client(kit, server.url, cache, model="digits").fetch()
    assert result.error_code == "malformed"
    assert "labels" in (result.error or "")
    assert result.version == "1.0.0"


KEYS_OF_0_1_0 = ("sha256", "version", "variant", "tier", "is_candidate", "min_mnn_runtime")
KEYS_OF_0_1_0 += ("runtime", "sequence")


def test_an_install_pointer_written_by_0_1_0_is_still_read(
    kit: Kit, server: StaticServer, tmp_path: Path
) -> None:
    kit.publish("digits", kit.entry("digits", "1.0.0"))
    cache = tmp_path / "c"
    first = client(kit, server.url, cache, model="digits").fetch()
    assert first.sha256 is not None
    old = {  # the keys 0.1.0 wrote, nothing more
        "schema_version": 1,
        "models": {
            "digits": {key: installed_json(cache)["models"]["digits"][key] for key in KEYS_OF_0_1_0}
        },
    }
    (cache / "installed.json").write_text(json.dumps(old))
    current = client(kit, server.url, cache, model="digits").current()
    assert current is not None
    assert current.sha256 == first.sha256
    assert current.contract is None  # not recorded then; the next change brings it
    again = client(kit, server.url, cache, model="digits").fetch()
    assert again.ok
    assert not again.updated
    assert again.downloaded_bytes == 0
