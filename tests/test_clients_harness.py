"""One harness for every client: the same live scenarios through each client's device program.

Each test runs once per client named in ``EDGEREG_CLIENTS`` (the Python
reference, the JVM library, the Swift package; tests/devicekit.py) against a
real ``edgereg serve`` child process over a registry published with the
project's own commands (the tiny built project: real MNN models with their
golden probes, a bundle) or its library (``Registry.publish`` with blobs of
random bytes, for scenarios that need sizes and versions the models do not
have). Every scenario asserts one normalized outcome (error code, version,
candidate or not, each member's version and digest, the status) computed
from what the registry signed, so every client must end in the same state
with the same reason codes.

The model runner of the self-test is tests/hostrunner.py: real MNN on this
machine, with a faulty or missing GPU played on top of it.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import importlib.metadata
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import devicekit
import pytest
from devicekit import DeviceProgram, hostrunner
from pydantic import TypeAdapter
from registrykit import PUBLIC_KEY_FILE, Site, add_table, ok
from servekit import _release, serve, serve_process

from edgereg.config import RolloutPolicy
from edgereg.protocol.rules import in_cohort
from edgereg.protocol.wire import BundleEntry, Manifest, ManifestEntry, Metrics, sign_document
from edgereg.registry import Registry, manifest_key, set_percent
from edgereg.registry import _transitions as transitions
from edgereg.reports import ReportStore, open_store
from edgereg.reports._metrics import decode as decode_metrics
from edgereg.signing import Signer, generate_key, key_id
from edgereg.storage import open_storage

ROOT = Path(__file__).resolve().parent.parent
VECTORS = ROOT / "tests" / "vectors"
MNN_VERSION = importlib.metadata.version("MNN")
BUNDLE = "kit"
BUNDLE_TABLE = f"""
[bundles.{BUNDLE}]
version = "1.0.0"
models = ["vision", "sensor"]
"""
#: models.toml's [tiers] of the built project, best first.
TIERS = [
    {"name": "high", "rules": {"min_ram_mb": 6144, "min_cpu_cores": 8}},
    {"name": "mid", "rules": {"min_ram_mb": 3072}},
    {"name": "low", "rules": {}},
]
SIZES = {"high": 300_000, "mid": 120_000, "low": 40_000}
#: The app metrics a release declares in the metric scenarios (docs/protocol.md §3).
METRICS = {
    "accepted": {"kind": "rate"},
    "confidence": {"kind": "distribution", "buckets": [0.5, 0.7, 0.9]},
}


# --- registries --------------------------------------------------------------------------


@dataclass
class LibRegistry:
    """A registry published with the library: one model, blobs of random bytes per tier."""

    root: Path
    model: str = "digits"
    signer: Signer = field(default_factory=lambda: Signer.from_pem(generate_key()[0]))

    @property
    def registry(self) -> Registry:
        return Registry(open_storage(str(self.root)))

    @property
    def pem(self) -> str:
        return self.signer.public_pem().decode()

    def publish(
        self, version: str, percent: float | None = None, metrics: dict[str, Any] | None = None
    ) -> Manifest:
        """Publish ``version``: the first release --full, later ones as a canary at ``percent``.

        ``metrics``: the app metrics the release declares (its record's, so its entries').
        """
        staging = self.root.parent / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        prepared, _ = _release(self.model, version, SIZES, staging, seed=version)
        if metrics is not None:
            record = prepared.record.model_copy(
                update={"metrics": TypeAdapter(Metrics).validate_python(metrics)}
            )
            prepared = dataclasses.replace(prepared, record=record)
        first = not self.registry.versions(self.model)
        self.registry.publish(
            prepared,
            signer=self.signer,
            percent=None if first else percent,
            full=first,
            actor="harness@tests",
            expires_days=30,
            # Devices report to the server's endpoint (docs/protocol.md §11-§12).
            report_url="v1/reports",
        )
        return self.manifest()

    def rollout(self, percent: float) -> Manifest:
        """Move the candidate to ``percent``: a new rollout period (`rollout --to P --force`)."""
        self.registry.change(
            self.model,
            lambda state, now, expires: set_percent(
                state,
                self.model,
                percent,
                policy=RolloutPolicy(),
                now=now,
                expires=expires,
                actor="harness@tests",
                force=True,  # no soak time in a test
            ),
            signer=self.signer,
            expires_days=30,
        )
        return self.manifest()

    def manifest(self, tier: str = "high") -> Manifest:
        return self.registry.read_manifest(self.model, tier)

    def roll_back(self) -> Manifest:
        """``edgereg rollback``: the candidate is dropped, every device back to stable."""
        self.registry.change(
            self.model,
            lambda state, now, expires: transitions.rollback(
                state,
                self.model,
                to_version=None,
                published=set(self.registry.versions(self.model)),
                now=now,
                expires=expires,
                actor="harness@tests",
            ),
            signer=self.signer,
            expires_days=30,
        )
        return self.manifest()

    def manifest_file(self, tier: str = "high") -> Path:
        return self.root / manifest_key(self.model, tier)

    def blob_file(self, sha256: str) -> Path:
        return self.root / "blobs" / "sha256" / sha256


@pytest.fixture
def lib(tmp_path: Path) -> LibRegistry:
    reg = LibRegistry(tmp_path / "lib" / "registry")
    reg.publish("1.0.0")
    return reg


@pytest.fixture
def reports(tmp_path: Path) -> Iterator[ReportStore]:
    """The report store behind the server's ``POST /v1/reports``."""
    with open_store(f"sqlite:///{tmp_path}/reports.sqlite") as store:
        yield store


@pytest.fixture
def lib_url(lib: LibRegistry, reports: ReportStore) -> Iterator[str]:
    """``edgereg serve``'s server (in a thread: a process start per test is too slow)."""
    with serve(f"file://{lib.root}", reports=reports) as url:
        yield url + "/"


def arms(store: ReportStore, unit: str, **want: int) -> dict[tuple[str, str], dict[str, int]]:
    """What the devices reported, per (arm, version): the counts named in ``want``."""
    deadline = time.monotonic() + 10
    while True:
        found: dict[tuple[str, str], dict[str, int]] = {
            (s.arm, s.version): {
                name: s.devices if name == "devices" else s.all.count(name) for name in want
            }
            for s in store.summaries(unit)
        }
        if time.monotonic() > deadline or want in found.values():
            return found
        time.sleep(0.1)


def rows(
    tmp_path: Path, unit: str, until: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """The report store's rows of ``unit`` (one per install and model), once ``until`` holds.

    Read from the SQLite file of the ``reports`` fixture: the sequence, arm, probe and
    latency of each install's row are what these scenarios check, beyond the summaries.
    """
    deadline = time.monotonic() + 10
    while True:
        uri = f"file:{tmp_path / 'reports.sqlite'}?mode=ro"
        try:
            with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
                db.row_factory = sqlite3.Row
                found = [
                    dict(row)
                    for row in db.execute(
                        "SELECT * FROM reports WHERE unit = ? ORDER BY first_received_at, version",
                        (unit,),
                    )
                ]
        except sqlite3.OperationalError:
            found = []  # the store writes its file and tables with the first report
        if until(found) or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


@dataclass
class Project:
    """The built tiny project (real MNN models, probes) as the current directory, and its server."""

    site: Site
    url: str = ""

    @property
    def pem(self) -> str:
        return (self.site.root / PUBLIC_KEY_FILE).read_text()

    @property
    def registry_root(self) -> Path:
        return self.site.root / "registry"

    def publish(self, unit: str, *args: str) -> None:
        ok(self.site.run("publish", unit, *args))

    def manifest(self, unit: str, tier: str) -> Manifest:
        return self.site.registry().read_manifest(unit, tier)

    def blob_file(self, sha256: str) -> Path:
        return self.registry_root / "blobs" / "sha256" / sha256


def _served(made: Project) -> Iterator[Project]:
    with serve(f"file://{made.registry_root}") as url:
        made.url = url + "/"
        yield made


@pytest.fixture
def bundle_project(site: Site) -> Iterator[Project]:
    """The project with a bundle ``kit`` (vision and sensor) published --full, served."""
    add_table(site.project, BUNDLE_TABLE)
    made = Project(site)
    made.publish(BUNDLE, "--full")
    yield from _served(made)


@pytest.fixture
def model_project(site: Site) -> Iterator[Project]:
    """The project with its model ``vision`` published --full, served."""
    made = Project(site)
    made.publish("vision", "--full")
    yield from _served(made)


# --- a proxy that trickles, stalls or goes silent -----------------------------------------


class Proxy:
    """A loopback HTTP proxy in front of ``edgereg serve`` that misbehaves on demand.

    ``mode``: ``pass`` relays everything; ``slow`` relays blob bodies at
    ``rate`` bytes per second (a trickling server); ``silent`` reads each
    request and never answers; ``down`` closes each connection unanswered
    (the server unreachable, the device offline). Each request goes upstream with
    ``Connection: close``, so the relay ends with the response. ``reports``
    holds every report body relayed, in arrival order.
    """

    def __init__(self, upstream: str) -> None:
        host_port = upstream.removeprefix("http://").strip("/")
        host, _, port = host_port.partition(":")
        self.upstream = (host, int(port))
        self.mode = "pass"
        self.rate = 200
        self.peers: list[str] = []
        self.slow_bytes = 0  # blob body bytes relayed in slow mode
        self.reports: list[dict[str, Any]] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/"
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.thread.join(timeout=2)

    def _serve(self) -> None:
        self.listener.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, peer = self.listener.accept()
            except OSError:
                continue
            self.peers.append(str(peer[0]))
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            if self.mode == "down":
                return
            try:
                read = _read_head(conn)
                if read is None:
                    return
                head, body = read
                if self.mode == "silent":
                    conn.settimeout(0.2)
                    while not self.stop.is_set():
                        try:
                            if not conn.recv(1024):
                                return
                        except TimeoutError:
                            continue
                    return
                path = head.split(b" ", 2)[1]
                if head.startswith(b"POST ") and path.endswith(b"/reports"):
                    self.reports.append(json.loads(body))
                lines = [
                    line
                    for line in head.split(b"\r\n")
                    if line and not line.lower().startswith(b"connection:")
                ]
                request = b"\r\n".join([*lines, b"Connection: close", b"", b""])
                with socket.create_connection(self.upstream, timeout=30) as up:
                    up.sendall(request + body)  # a report's JSON body goes along
                    slow = self.mode == "slow" and path.startswith(b"/blobs/")
                    self._relay(up, conn, slow)
            except OSError:
                pass  # the client gave up or was killed: what these scenarios do

    def _relay(self, up: socket.socket, conn: socket.socket, slow: bool) -> None:
        pending = b""
        if slow:
            while b"\r\n\r\n" not in pending:
                chunk = up.recv(65536)
                if not chunk:
                    break
                pending += chunk
            end = pending.find(b"\r\n\r\n") + 4
            conn.sendall(pending[:end])
            pending = pending[end:]
        while not self.stop.is_set():
            if not pending:
                pending = up.recv(65536)
                if not pending:
                    return
            if not slow:
                conn.sendall(pending)
                pending = b""
                continue
            step = max(1, self.rate // 10)
            conn.sendall(pending[:step])
            self.slow_bytes += len(pending[:step])
            pending = pending[step:]
            time.sleep(0.1)


def _read_head(conn: socket.socket) -> tuple[bytes, bytes] | None:
    """A request's head (without the blank line) and its body (``Content-Length`` bytes)."""
    conn.settimeout(10)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(4096)
        if not chunk:
            return None
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        body += chunk
    return head, body


@pytest.fixture
def proxy(lib_url: str) -> Iterator[Proxy]:
    running = Proxy(lib_url)
    yield running
    running.close()


# --- the device and its normalized outcome ----------------------------------------------


def configure(
    device: DeviceProgram,
    url: str,
    pem: str,
    cache: Path,
    *,
    unit: str = "digits",
    bundle: bool = False,
    device_id: str = "device-1",
    ram_mb: int = 8192,
    cpu_cores: int = 8,
    facts: dict[str, Any] | None = None,
    **options: Any,
) -> dict[str, Any]:
    """``configure`` with a full request (every key of the doc), ``options`` overriding.

    ``facts``: device facts overriding the request's ``device`` (its ``os_version``, say).
    """
    request: dict[str, Any] = {
        "registry": url,
        "trusted_keys": [pem],
        "cache_dir": str(cache),
        "unit": unit,
        "bundle": bundle,
        "device": {
            "device_id": device_id,
            "ram_mb": ram_mb,
            "cpu_cores": cpu_cores,
            "soc": None,
            "os": "android",
            "os_version": "34",
            "mnn_runtime": MNN_VERSION,
        },
        "app_version": "2.4.0",
        "tier": "high",
        "tiers": None,
        "self_test": False,
        "runner": None,
        "reporting": True,
        "device_class": "ram4-8c",
        "max_unconfirmed_starts": 3,
        "policy": {"allow_metered": True, "require_charging": False, "reserve_bytes": 8388608},
        "timeout_s": 10,
        "deadline_s": 120,
        "min_rate": 1024,
        "bundled": None,
        "source_address": None,
        "now": None,
    }
    request["device"].update(facts or {})
    request.update(options)
    return device.request("configure", **request)


def members_of(unit: str, entry: ManifestEntry | BundleEntry | None) -> dict[str, Any]:
    if entry is None:
        return {}
    if isinstance(entry, BundleEntry):
        return {
            name: {"version": m.version, "sha256": m.sha256}
            for name, m in sorted(entry.members.items())
        }
    return {unit: {"version": entry.version, "sha256": entry.sha256}}


def want(
    unit: str,
    installed: ManifestEntry | BundleEntry | None,
    *,
    code: str | None = None,
    candidate: bool = False,
    refused: tuple[str, ...] = (),
) -> dict[str, Any]:
    """The normalized outcome every client must reach: ``installed`` kept or installed."""
    members = members_of(unit, installed)
    version = None if installed is None else installed.version
    return {
        "ok": code is None,
        "error_code": code,
        "version": version,
        "is_candidate": candidate,
        "members": members,
        "status": {
            "installed": None if installed is None else {"version": version, "members": members},
            "last_error_code": code,
            "refused": sorted(refused),
            "ready": installed is not None,
        },
    }


def outcome(device: DeviceProgram, result: dict[str, Any]) -> dict[str, Any]:
    """What the client says happened and what its status says now, normalized."""
    status = device.request("status")
    assert result["ok"] == (result["error_code"] is None), result
    return {
        "ok": result["ok"],
        "error_code": result["error_code"],
        "version": result["version"],
        "is_candidate": result["is_candidate"],
        "members": {
            name: {"version": m["version"], "sha256": m["sha256"]}
            for name, m in sorted(result["members"].items())
        },
        "status": {
            "installed": status["installed"],
            "last_error_code": status["last_error_code"],
            "refused": sorted(status["refused"]),
            "ready": status["ready"],
        },
    }


def update(device: DeviceProgram, timeout: float = 120.0, **args: Any) -> dict[str, Any]:
    return outcome(device, device.request("update", timeout=timeout, **args))


def device_in_cohort(manifest: Manifest, inside: bool) -> str:
    assert manifest.salt is not None
    assert manifest.percent is not None
    n = 0
    while in_cohort(f"device-{n}", manifest.salt, manifest.percent) != inside:
        n += 1
    return f"device-{n}"


def device_between(manifest: Manifest, outside: float, inside: float) -> str:
    """A device id outside the cohort at ``outside`` percent and inside it at ``inside``."""
    assert manifest.salt is not None
    n = 0
    while in_cohort(f"device-{n}", manifest.salt, outside) or not in_cohort(
        f"device-{n}", manifest.salt, inside
    ):
        n += 1
    return f"device-{n}"


Devices = Callable[[], DeviceProgram]

# The fixtures: every test here runs once per client of EDGEREG_CLIENTS.
device_client = devicekit.device_client
devices = devicekit.devices


# --- rollouts -------------------------------------------------------------------------------


def test_canary_split_gives_the_cohort_the_candidate_and_the_rest_stable(
    devices: Devices, lib: LibRegistry, tmp_path: Path
) -> None:
    """Through the `edgereg serve` command itself, in its own process."""
    manifest = lib.publish("1.1.0", percent=50.0)
    log = tmp_path / "serve.log"
    with serve_process(log, "--registry", f"file://{lib.root}", cwd=tmp_path) as (_, url):
        _canary_split(devices, lib, url + "/", manifest, tmp_path)


def _canary_split(
    devices: Devices, lib: LibRegistry, lib_url: str, manifest: Manifest, tmp_path: Path
) -> None:
    assert manifest.stable is not None
    assert manifest.candidate is not None
    for inside, entry in ((True, manifest.candidate), (False, manifest.stable)):
        device = devices()
        cache = tmp_path / f"cache-{inside}"
        configure(device, lib_url, lib.pem, cache, device_id=device_in_cohort(manifest, inside))
        assert update(device) == want("digits", entry, candidate=inside)
        again = device.request("update")
        assert (again["not_modified"], again["updated"], again["version"]) == (
            True,
            False,
            entry.version,
        ), again


def test_a_device_with_an_avoided_cpu_feature_installs_the_entrys_instead(
    devices: Devices, lib: LibRegistry, lib_url: str, reports: ReportStore, tmp_path: Path
) -> None:
    high, mid = lib.manifest("high"), lib.manifest("mid")
    assert isinstance(high.stable, ManifestEntry)
    assert isinstance(mid.stable, ManifestEntry)
    # High's variant must not run on i8mm (MNN's int8 kernel fault); mid's variant of the
    # same release is what such a device installs in its place (docs/protocol.md §7, e).
    avoiding = high.stable.model_copy(update={"avoid_cpu": ["i8mm"], "instead": mid.stable})
    lib.manifest_file().write_bytes(
        sign_document(high.model_copy(update={"stable": avoiding}), [lib.signer])
    )
    cases = [
        ("device-a710", ["dotprod", "fp16", "i8mm"], mid.stable, "cpu-unsupported"),
        ("device-a76", ["dotprod", "fp16"], high.stable, None),
    ]
    for device_id, features, installed, substitute in cases:
        device = devices()
        configure(
            device,
            lib_url,
            lib.pem,
            tmp_path / device_id,
            device_id=device_id,
            cpu_features=features,
            memory_budget_mb=4096,
        )
        result = device.request("update")
        assert result["substitute"] == substitute, (device_id, result)
        assert outcome(device, result) == want("digits", installed), device_id
        assert result["members"]["digits"]["variant"] == installed.variant
        assert device.request("confirm", version="1.0.0") == {"confirmed": True}
        device.request("flush")
    counts = {"devices": 2, "confirmed": 2}
    assert arms(reports, "digits", **counts) == {("stable", "1.0.0"): counts}


def test_a_release_over_the_devices_memory_budget_is_refused_and_nothing_installs(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    high = lib.manifest("high")
    assert isinstance(high.stable, ManifestEntry)
    heavy = high.stable.model_copy(update={"peak_memory_mb": 900.0})
    lib.manifest_file().write_bytes(
        sign_document(high.model_copy(update={"stable": heavy}), [lib.signer])
    )
    for budget, code, installed in ((512, "insufficient-memory", None), (900, None, heavy)):
        device = devices()
        configure(device, lib_url, lib.pem, tmp_path / f"cache-{budget}", memory_budget_mb=budget)
        assert update(device) == want("digits", installed, code=code), budget


def test_a_bundle_installs_as_one_set_on_two_tiers(
    devices: Devices, bundle_project: Project, tmp_path: Path
) -> None:
    project = bundle_project
    for ram_mb, cores, tier in ((8192, 8, "high"), (2048, 4, "low")):
        device = devices()
        configured = configure(
            device,
            project.url,
            project.pem,
            tmp_path / f"cache-{tier}",
            unit=BUNDLE,
            bundle=True,
            ram_mb=ram_mb,
            cpu_cores=cores,
            tier=None,
            tiers=TIERS,
        )
        assert configured["tier"] == tier, configured
        expected = project.manifest(BUNDLE, tier).stable
        assert isinstance(expected, BundleEntry)
        assert update(device) == want(BUNDLE, expected)
        assert outcome(device, device.request("current")) == want(BUNDLE, expected)
    high = project.manifest(BUNDLE, "high").stable
    low = project.manifest(BUNDLE, "low").stable
    assert members_of(BUNDLE, high) != members_of(BUNDLE, low)  # two sets, really


# --- tampered registry copies ------------------------------------------------------------


def _swap_member(project: Project, entry: BundleEntry) -> str:
    """Serve a larger member's bytes as a smaller one's (no key needed for that)."""
    small, large = sorted(entry.members.values(), key=lambda m: m.size)[:2]
    assert small.size < large.size
    shutil.copyfile(project.blob_file(large.sha256), project.blob_file(small.sha256))
    return "blob-too-large"  # rule 13: its Content-Length is over the size, refused unread


def _wrong_probe(project: Project, entry: BundleEntry) -> str:
    """Change one byte of a member's golden probe: its digest no longer matches the manifest."""
    probes = [m.probe for m in entry.members.values() if m.probe is not None]
    assert probes, "the built members have golden probes"
    path = project.blob_file(probes[0].sha256)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return "bad-blob"  # rule 14: the right size, another digest


@pytest.mark.parametrize(
    "tamper", [_swap_member, _wrong_probe], ids=["swapped-member", "wrong-probe-digest"]
)
def test_a_tampered_bundle_member_is_refused_and_the_last_good_set_stays(
    devices: Devices,
    bundle_project: Project,
    tmp_path: Path,
    tamper: Callable[[Project, BundleEntry], str],
) -> None:
    project = bundle_project
    low = project.manifest(BUNDLE, "low").stable
    high = project.manifest(BUNDLE, "high").stable
    assert isinstance(low, BundleEntry)
    assert isinstance(high, BundleEntry)
    # A client downloads a probe only to run its self-test (docs/protocol.md §8).
    checked: dict[str, Any] = {}
    if tamper is _wrong_probe:
        checked = {"self_test": True, "runner": {"command": hostrunner()}}
    cache = tmp_path / "cache"
    device = devices()
    configure(
        device, project.url, project.pem, cache, unit=BUNDLE, bundle=True, tier="low", **checked
    )
    assert update(device) == want(BUNDLE, low)
    code = tamper(project, high)
    # The same device moves up a tier (more RAM after an OS update): the high set is tampered.
    configure(
        device, project.url, project.pem, cache, unit=BUNDLE, bundle=True, tier="high", **checked
    )
    assert update(device) == want(BUNDLE, low, code=code)
    fresh = devices()
    configure(
        fresh, project.url, project.pem, tmp_path / "fresh", unit=BUNDLE, bundle=True, **checked
    )
    assert update(fresh) == want(BUNDLE, None, code=code)


def test_an_expired_manifest_installs_nothing_new(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    later = (newer.expires + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    device.request("set_clock", now=later)
    assert update(device) == want("digits", first.stable, code="expired")


def test_a_replayed_older_manifest_is_a_rollback(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    old_bytes = lib.manifest_file().read_bytes()
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    assert update(device)["version"] == "1.0.0"
    newer = lib.publish("1.1.0", percent=100.0)
    assert update(device) == want("digits", newer.candidate, candidate=True)
    lib.manifest_file().write_bytes(old_bytes)  # a mirror serving last month's copy
    assert update(device) == want("digits", newer.candidate, candidate=True, code="rollback")


def test_a_key_planted_in_the_registry_is_not_trusted(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    assert first.stable is not None
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    attacker = Signer.from_pem(generate_key()[0])
    keys = lib.root / "keys"
    keys.mkdir(exist_ok=True)
    (keys / f"{key_id(attacker.public_key)}.pem").write_bytes(attacker.public_pem())
    evil = b"not the model " * 1000
    digest = hashlib.sha256(evil).hexdigest()
    lib.blob_file(digest).write_bytes(evil)
    forged_entry = first.stable.model_copy(
        update={
            "version": "9.0.0",
            "sha256": digest,
            "size": len(evil),
            "path": f"blobs/sha256/{digest}",
        }
    )
    forged = first.model_copy(update={"sequence": first.sequence + 1, "stable": forged_entry})
    lib.manifest_file().write_bytes(sign_document(forged, [attacker]))
    assert update(device) == want("digits", first.stable, code="unknown-key")


# --- hostile networks, a full disk, a crash ----------------------------------------------------


def test_a_trickling_server_is_given_up_and_the_last_good_stays(
    devices: Devices, lib: LibRegistry, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, proxy.url, lib.pem, tmp_path / "cache", timeout_s=1)
    assert update(device) == want("digits", first.stable)
    lib.publish("1.1.0", percent=100.0)
    proxy.mode, proxy.rate = "slow", 200  # 200 bytes/s: under the minimum rate of 1024
    started = time.monotonic()
    assert update(device) == want("digits", first.stable, code="transport")
    assert time.monotonic() - started < 15


def test_a_silent_server_is_given_up_and_the_last_good_stays(
    devices: Devices, lib: LibRegistry, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    # No reports: a silent collector would only hold the program's exit for their timeout.
    configure(device, proxy.url, lib.pem, tmp_path / "cache", timeout_s=1, reporting=False)
    assert update(device) == want("digits", first.stable)
    proxy.mode = "silent"
    started = time.monotonic()
    assert update(device) == want("digits", first.stable, code="transport")
    assert time.monotonic() - started < 15


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 512 KiB tmpfs: one 300 KB model fits, a second one does not."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(mount)],
        capture_output=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"cannot mount a tmpfs for the full-disk scenario: {done.stderr.decode()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_no_space_before_any_byte_and_the_last_good_stays(
    devices: Devices, lib: LibRegistry, lib_url: str, small_disk: Path
) -> None:
    first = lib.manifest()
    device = devices()
    policy = {"allow_metered": True, "require_charging": False, "reserve_bytes": 0}
    configure(device, lib_url, lib.pem, small_disk / "cache", policy=policy)
    assert update(device) == want("digits", first.stable)
    lib.publish("1.1.0", percent=100.0)
    assert update(device) == want("digits", first.stable, code="no-space")


def test_a_kill_mid_install_leaves_the_old_set_and_the_next_start_finishes(
    devices: Devices, lib: LibRegistry, lib_url: str, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    cache = tmp_path / "cache"
    device = devices()
    configure(device, proxy.url, lib.pem, cache)
    assert update(device) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    proxy.mode, proxy.rate = "slow", 40_000  # 300 KB in about 8 s: a download to interrupt
    device.send_only("update")
    deadline = time.monotonic() + 30
    while proxy.slow_bytes < 60_000:  # well into the download, far from its end
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.05)
    device.kill()
    restarted = devices()
    configure(restarted, lib_url, lib.pem, cache)
    assert outcome(restarted, restarted.request("current")) == want("digits", first.stable)
    assert update(restarted) == want("digits", newer.candidate, candidate=True)


# --- cancel, progress, changes: what an app drives while an update runs ---------------------


def test_a_cancel_mid_download_stops_at_once_installs_nothing_and_the_next_update_resumes(
    devices: Devices, lib: LibRegistry, lib_url: str, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, proxy.url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    assert newer.candidate is not None
    proxy.mode, proxy.rate = "slow", 40_000  # 300 KB in about 8 s: a download to cancel
    device.request("start_update")
    deadline = time.monotonic() + 30
    while proxy.slow_bytes < 60_000:  # well into the download, far from its end
        assert time.monotonic() < deadline, "the download never started"
        time.sleep(0.05)
    asked = time.monotonic()
    device.request("cancel")
    device.request("cancel")  # twice: idempotent
    result = device.request("wait_update", timeout=60)
    took = time.monotonic() - asked
    # The target is 1 s (benchmarks/sdk.py measures it); here only "not the whole download".
    assert took < 5, f"{device.client} took {took:.1f} s to stop after the cancel"
    kept = want("digits", first.stable, code="cancelled")
    assert outcome(device, result) == kept
    pending = device.request("status")["pending"]
    assert pending is not None
    assert pending["version"] == "1.1.0"
    assert 0 < pending["remaining_bytes"] < newer.candidate.size  # the part is kept
    assert device.request("events") == {
        "events": [{"unit": "digits", "kind": "installed", "version": "1.0.0", "previous": None}]
    }
    proxy.mode = "pass"
    device.request("start_update")
    resumed = device.request("wait_update", timeout=60)
    assert outcome(device, resumed) == want("digits", newer.candidate, candidate=True)
    assert 0 < resumed["downloaded_bytes"] < newer.candidate.size, resumed["downloaded_bytes"]
    progress = resumed["progress"]
    # The total is known before the first byte, and the bytes kept count as done.
    assert progress[0] == [newer.candidate.size - pending["remaining_bytes"], newer.candidate.size]
    assert progress[-1] == [newer.candidate.size, newer.candidate.size]


def test_a_cancel_while_the_registry_holds_its_answer_is_cancelled_within_a_second(
    devices: Devices, lib: LibRegistry, lib_url: str, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    # The client's own timeout (30 s) far from the second a cancel must take.
    configure(device, proxy.url, lib.pem, tmp_path / "cache", timeout_s=30, reporting=False)
    assert update(device) == want("digits", first.stable)
    lib.publish("1.1.0", percent=100.0)
    proxy.mode = "silent"  # the manifest's request is read and never answered
    asked_before = len(proxy.peers)
    device.request("start_update")
    deadline = time.monotonic() + 30
    while len(proxy.peers) == asked_before:
        assert time.monotonic() < deadline, "the update never asked for the manifest"
        time.sleep(0.05)
    time.sleep(0.3)  # the request is out, its answer held
    asked = time.monotonic()
    device.request("cancel")
    result = device.request("wait_update", timeout=60)
    took = time.monotonic() - asked
    # The connection the cancel cut is the cancel, not the network failing (an app retries
    # a transport error as one), and a held answer does not hold the cancel.
    assert outcome(device, result) == want("digits", first.stable, code="cancelled")
    assert took < 5, f"{device.client} took {took:.1f} s to stop after the cancel"


def test_progress_says_the_total_before_the_first_byte_and_ends_at_it(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    assert isinstance(first.stable, ManifestEntry)
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    device.request("start_update")
    result = device.request("wait_update", timeout=60)
    assert outcome(device, result) == want("digits", first.stable)
    progress = result["progress"]
    size = first.stable.size
    assert progress[0] == [0, size], progress[:3]
    assert progress[-1] == [size, size]
    assert all(total == size for _, total in progress)
    assert [done for done, _ in progress] == sorted(done for done, _ in progress)
    again = device.request("start_update")
    assert again == {}
    unchanged = device.request("wait_update", timeout=60)
    assert unchanged["progress"] == []  # nothing to download: no progress at all


def test_changes_are_heard_across_an_install_a_server_rollback_and_a_delete(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    check = device.request("check")
    assert newer.candidate is not None
    assert (check["available"], check["version"], check["installed"]) == (True, "1.1.0", "1.0.0")
    assert (check["download_bytes"], check["is_candidate"]) == (newer.candidate.size, True)
    assert update(device) == want("digits", newer.candidate, candidate=True)
    rolled = lib.roll_back()  # the release manager takes 1.1.0 back
    assert update(device) == want("digits", rolled.stable)
    assert device.request("check")["available"] is False  # up to date
    assert device.request("installed")["units"] == [
        {"unit": "digits", "kind": "model", "version": "1.0.0", "is_candidate": False}
    ]
    assert device.request("delete") == {"deleted": True}
    assert device.request("delete") == {"deleted": False}  # twice: idempotent
    assert device.request("installed")["units"] == []
    assert outcome(device, device.request("current")) == want("digits", None)
    assert device.request("events")["events"] == [
        {"unit": "digits", "kind": "installed", "version": "1.0.0", "previous": None},
        {"unit": "digits", "kind": "installed", "version": "1.1.0", "previous": "1.0.0"},
        {"unit": "digits", "kind": "rolled-back", "version": "1.0.0", "previous": "1.1.0"},
        {"unit": "digits", "kind": "deleted", "version": None, "previous": "1.0.0"},
    ]
    # The rollback protection stays: the next update installs this device's release again.
    assert update(device) == want("digits", rolled.stable)


def test_unknown_conditions_are_unmet_and_the_shortest_update_defers(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    wifi_only = {"allow_metered": False, "require_charging": False, "reserve_bytes": 8388608}
    configure(device, lib_url, lib.pem, tmp_path / "cache", policy=wifi_only)
    deferred = device.request("update")  # no conditions at all: the network is unknown
    assert (deferred["deferred"], deferred["downloaded_bytes"]) == ("metered", 0), deferred
    assert outcome(device, deferred) == want("digits", None)
    partial = device.request("update", conditions={"charging": True})  # still not the network
    assert partial["deferred"] == "metered"
    check = device.request("check")
    assert (check["available"], check["deferred"]) == (True, "metered")
    idle_and_storage = {**wifi_only, "allow_metered": True, "require_idle": True}
    idle_and_storage["require_storage_not_low"] = True
    configure(device, lib_url, lib.pem, tmp_path / "cache", policy=idle_and_storage)
    assert device.request("update", conditions={"idle": True})["deferred"] == "storage-low"
    assert device.request("update", conditions={"storage_low": False})["deferred"] == "not-idle"
    met = device.request("update", conditions={"idle": True, "storage_low": False})
    assert outcome(device, met) == want("digits", first.stable)


# --- what the app allows, what it ships ------------------------------------------------------


def test_download_conditions_defer_the_blob_until_they_are_met(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    policy = {"allow_metered": False, "require_charging": True, "reserve_bytes": 8388608}
    configure(device, lib_url, lib.pem, tmp_path / "cache", policy=policy)
    for conditions, why in (
        ({"metered": True, "charging": True}, "metered"),
        ({"metered": False, "charging": False}, "not-charging"),
    ):
        deferred = device.request("update", conditions=conditions)
        assert (deferred["deferred"], deferred["downloaded_bytes"]) == (why, 0), deferred
        assert outcome(device, deferred) == want("digits", None)
        assert device.request("status")["pending"]["version"] == "1.0.0"
    met = device.request("update", conditions={"metered": False, "charging": True})
    assert outcome(device, met) == want("digits", first.stable)
    assert met["deferred"] is None


def test_a_release_shipped_in_the_app_installs_offline_and_a_newer_replaces_it(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    assert isinstance(first.stable, ManifestEntry)
    shipped = tmp_path / "app-assets"
    shipped.mkdir()
    (shipped / "manifest.json").write_bytes(lib.manifest_file().read_bytes())
    shutil.copyfile(lib.blob_file(first.stable.sha256), shipped / first.stable.sha256)
    bundled = {"manifest": str(shipped / "manifest.json"), "blobs_dir": str(shipped)}
    device = devices()
    offline = "http://127.0.0.1:9/"  # nothing listens: the first launch is offline
    configure(device, offline, lib.pem, tmp_path / "cache", bundled=bundled)
    current = device.request("current")
    assert current["bundled"] is True, current
    assert outcome(device, current) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    configure(device, lib_url, lib.pem, tmp_path / "cache", bundled=bundled)
    assert update(device) == want("digits", newer.candidate, candidate=True)


# --- confirmation, crash loops, reverts, reports ------------------------------------------------


def test_an_unconfirmed_release_is_reverted_after_a_crash_loop_and_never_again(
    devices: Devices, lib: LibRegistry, lib_url: str, reports: ReportStore, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache", max_unconfirmed_starts=2)
    assert update(device) == want("digits", first.stable)
    assert device.request("app_started")["reverted"] is False
    assert device.request("confirm", version="1.0.0") == {"confirmed": True}
    assert isinstance(device.request("flush")["sent"], int)
    counts = {"devices": 1, "confirmed": 1, "reverted": 0}
    assert arms(reports, "digits", **counts) == {("stable", "1.0.0"): counts}
    newer = lib.publish("1.1.0", percent=100.0)
    assert update(device) == want("digits", newer.candidate, candidate=True)
    starts = []
    for _ in range(4):  # the app crashes before it can confirm 1.1.0
        started = device.request("app_started")
        starts.append(started["reverted"])
        if started["reverted"]:
            assert started["version"] == "1.1.0", started
            break
    # Installed after app_started: this start runs 1.1.0 and dies; the next start counts it (1),
    # the one after counts the second (2) and reverts (docs/protocol.md section 11).
    assert starts == [False, True]
    kept = want("digits", first.stable, refused=("1.1.0",))
    kept["status"]["last_error_code"] = "reverted"
    assert outcome(device, device.request("current")) == kept
    # The bad candidate is never installed again here: stable instead, and why.
    again = device.request("update")
    assert again["fallback"] == "bad-release", again
    assert outcome(device, again) == want("digits", first.stable, refused=("1.1.0",))
    device.request("flush")
    # The revert keeps its count of unconfirmed starts: the unconfirmed guardrail's stall.
    counts = {"devices": 1, "confirmed": 0, "reverted": 1, "stalled": 1}
    assert arms(reports, "digits", **counts)[("candidate", "1.1.0")] == counts


def test_the_app_reverts_a_release_that_fails_its_first_inference(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    newer = lib.publish("1.1.0", percent=100.0)
    assert update(device) == want("digits", newer.candidate, candidate=True)
    device.request("record_inference", ms=12.5, model=None)
    reverted = device.request("revert", reason="first inference crashed")
    kept = want("digits", first.stable, refused=("1.1.0",))
    kept["status"]["last_error_code"] = "reverted"
    assert outcome(device, reverted) == kept
    assert device.request("confirm", version="1.1.0") == {"confirmed": False}


def test_each_device_binds_its_own_source_address(
    devices: Devices, lib: LibRegistry, proxy: Proxy, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, proxy.url, lib.pem, tmp_path / "cache", source_address="127.0.0.9")
    assert update(device) == want("digits", first.stable)
    assert proxy.peers
    assert set(proxy.peers) == {"127.0.0.9"}


# --- reports in every rollout period, kept until delivered (docs/protocol.md §11) -------------


def test_a_stable_device_reports_again_in_each_new_rollout_period(
    devices: Devices, lib: LibRegistry, lib_url: str, reports: ReportStore, tmp_path: Path
) -> None:
    canary = lib.publish("1.1.0", percent=10.0)
    device = devices()
    configure(
        device, lib_url, lib.pem, tmp_path / "cache", device_id=device_between(canary, 50, 100)
    )
    assert update(device) == want("digits", canary.stable)
    device.request("record_inference", ms=12.5, model=None)
    stepped = lib.rollout(50.0)
    assert stepped.sequence > canary.sequence
    assert update(device) == want("digits", canary.stable)  # outside the cohort still

    def landed(found: list[dict[str, Any]]) -> bool:
        return any(r["sequence"] == stepped.sequence for r in found)

    found = rows(tmp_path, "digits", landed)
    # One install, one row: the stable arm heard from in the new period, with the calls since.
    assert [(r["arm"], r["version"], r["sequence"], r["inference_count"]) for r in found] == [
        ("stable", "1.0.0", stepped.sequence, 1)
    ]


NEXT_RC = f"{int(MNN_VERSION.split('.')[0]) + 1}.0.0-rc.2"
#: A device's versions: any of §7's grammar is sent as it is (§11 "Always sent").
ODD_FACTS = [
    pytest.param(
        {"mnn_runtime": f"v{MNN_VERSION}"}, {"mnn_runtime": f"v{MNN_VERSION}"}, id="leading-v"
    ),
    # A pre-release of the next major: 3.6.1-rc.2 would be older than the entry's minimum.
    pytest.param({"mnn_runtime": NEXT_RC}, {"mnn_runtime": NEXT_RC}, id="pre-release"),
    pytest.param(
        {"mnn_runtime": f"{MNN_VERSION} (123)"},
        {"mnn_runtime": f"{MNN_VERSION} (123)"},
        id="store-build",
    ),
    # The OS's version likewise (one grammar): past the short text, a version all the same.
    pytest.param(
        {"os_version": "17.4 (21E219)"}, {"os_version": "17.4 (21E219)"}, id="os-version-build"
    ),
    pytest.param(
        {"os_version": "14" + ".1" * 20}, {"os_version": "14" + ".1" * 20}, id="os-version-long"
    ),
]


@pytest.mark.parametrize(("facts", "stored"), ODD_FACTS)
def test_a_device_always_reports_whatever_its_facts_look_like(
    devices: Devices,
    lib: LibRegistry,
    lib_url: str,
    reports: ReportStore,
    tmp_path: Path,
    facts: dict[str, str],
    stored: dict[str, str | None],
) -> None:
    """Any version of §7's grammar is sent as it is; a fact the report refuses goes as null."""
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache", facts=facts)
    assert update(device) == want("digits", lib.manifest().stable)
    [row] = rows(tmp_path, "digits", bool)
    assert {key: row[key] for key in stored} == stored
    assert (row["arm"], row["version"]) == ("stable", "1.0.0")


def test_a_candidate_rejected_by_its_self_test_reports_the_rejection_in_each_period(
    devices: Devices, site: Site, reports: ReportStore, tmp_path: Path
) -> None:
    add_table(site.project, '[reports]\nurl = "v1/reports"')
    project = Project(site)
    project.publish("vision", "--full")
    first = project.manifest("vision", "high").stable
    assert isinstance(first, ManifestEntry)
    project.site.project.edit_table("models.vision", 'version = "1.0.0"', 'version = "1.1.0"')
    project.publish("vision", "--canary", "10%")
    canary = project.manifest("vision", "high")
    inside = device_between(canary, 0, 10)
    broken = {"command": hostrunner(faulty=list(first.runtime.backends))}
    good = {"command": hostrunner(unavailable=list(first.runtime.backends[:-1]))}
    cache = tmp_path / "cache"
    with serve(f"file://{project.registry_root}", reports=reports) as url:
        device = devices()
        configure(
            device, url + "/", project.pem, cache, device_id=inside,
            unit="vision", self_test=True, runner=broken,
        )  # fmt: skip
        assert update(device) == want("vision", None, code="probe-failed", refused=("1.1.0",))
        ok(project.site.run("rollout", "vision", "--to", "50%", "--force"))
        stepped = project.manifest("vision", "high")
        assert stepped.sequence > canary.sequence
        configure(  # the app starts again with a runner that can run the stable
            device, url + "/", project.pem, cache, device_id=inside,
            unit="vision", self_test=True, runner=good,
        )  # fmt: skip
        result = device.request("update")
        assert result["fallback"] == "bad-release", result
        assert outcome(device, result) == want("vision", first, refused=("1.1.0",))

        def landed(found: list[dict[str, Any]]) -> bool:
            return any(r["version"] == "1.1.0" and r["sequence"] == stepped.sequence for r in found)

        found = rows(tmp_path, "vision", landed)
    rejected = [r for r in found if r["version"] == "1.1.0"]
    # Intention to treat: the device counts in the candidate arm, as a failure, in this period.
    assert [
        (r["arm"], r["probe"], r["sequence"], r["backend"], r["inference_count"]) for r in rejected
    ] == [("candidate", "failed", stepped.sequence, None, None)]


def test_a_reverted_candidate_reports_its_revert_in_each_period_without_latency(
    devices: Devices, lib: LibRegistry, lib_url: str, reports: ReportStore, tmp_path: Path
) -> None:
    canary = lib.publish("1.1.0", percent=10.0)
    device = devices()
    configure(
        device, lib_url, lib.pem, tmp_path / "cache",
        device_id=device_between(canary, 10, 50), max_unconfirmed_starts=1,
    )  # fmt: skip
    assert update(device) == want("digits", canary.stable)
    assert device.request("confirm", version="1.0.0") == {"confirmed": True}
    fifty = lib.rollout(50.0)
    assert update(device) == want("digits", fifty.candidate, candidate=True)
    assert device.request("app_started")["reverted"] is False  # crashed before confirming
    assert device.request("app_started")["reverted"] is True  # a crash loop: reverted
    device.request("record_inference", ms=9.0, model=None)  # the fallback 1.0.0 runs it
    sixty = lib.rollout(60.0)
    result = device.request("update")
    assert result["fallback"] == "bad-release", result
    assert outcome(device, result) == want("digits", fifty.stable, refused=("1.1.0",))

    def landed(found: list[dict[str, Any]]) -> bool:
        return any(r["version"] == "1.1.0" and r["sequence"] == sixty.sequence for r in found)

    reverted = [r for r in rows(tmp_path, "digits", landed) if r["version"] == "1.1.0"]
    # The fallback's call is in no report of the reverted release.
    assert [
        (r["arm"], r["reverted"], r["unconfirmed_starts"], r["sequence"], r["inference_count"])
        for r in reverted
    ] == [("candidate", 1, 1, sixty.sequence, None)]


def test_a_report_made_while_the_server_is_unreachable_waits_for_the_first_reachable_check(
    devices: Devices, lib: LibRegistry, proxy: Proxy, reports: ReportStore, tmp_path: Path
) -> None:
    first = lib.manifest()
    device = devices()
    configure(device, proxy.url, lib.pem, tmp_path / "cache")
    assert update(device) == want("digits", first.stable)
    installed = {"devices": 1, "confirmed": 0}
    assert arms(reports, "digits", **installed) == {("stable", "1.0.0"): installed}
    proxy.mode = "down"
    assert device.request("confirm", version="1.0.0") == {"confirmed": True}  # made offline
    device.request("flush")  # its try is over (no answer), and a retry of it too
    for _ in range(2):  # two more checks, the server still unreachable
        assert update(device) == want("digits", first.stable, code="transport")
        device.request("flush")
    assert arms(reports, "digits", **installed) == {("stable", "1.0.0"): installed}
    proxy.mode = "pass"
    assert update(device) == want("digits", first.stable)
    # Delivered by that check itself (no flush): kept, not dropped after one more try.
    confirmed = {"devices": 1, "confirmed": 1}
    assert arms(reports, "digits", **confirmed) == {("stable", "1.0.0"): confirmed}


# --- app metrics: counted on the device, sent as totals (docs/protocol.md §3, §11) ----------


def _at(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def _metric_device(
    devices: Devices, lib: LibRegistry, proxy: Proxy, cache: Path, start: datetime
) -> tuple[DeviceProgram, Manifest]:
    """A device on 1.1.0, a release declaring a rate and a distribution (every device's)."""
    declared = lib.publish("1.1.0", percent=100.0, metrics=METRICS)
    device = devices()
    configure(device, proxy.url, lib.pem, cache, now=_at(start))
    assert update(device) == want("digits", declared.candidate, candidate=True)
    return device, declared


def stored_metrics(tmp_path: Path, unit: str, want: dict[str, list[int]]) -> dict[str, list[int]]:
    """The report store's app metric counts of ``unit`` (the server's one install), once ``want``.

    Read from the SQLite file of the ``reports`` fixture, the install's ``metrics`` column: a
    rate as its failed and succeeded events, a distribution as its counts per bucket.
    """
    deadline = time.monotonic() + 10
    while True:
        uri = f"file:{tmp_path / 'reports.sqlite'}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            found = {}
            for (text,) in db.execute(
                "SELECT metrics FROM reports WHERE unit = ? AND metrics IS NOT NULL", (unit,)
            ):
                found.update(decode_metrics(text))
        if found == want or time.monotonic() > deadline:
            return found
        time.sleep(0.1)


def _sent(proxy: Proxy, version: str) -> list[dict[str, Any]]:
    """The reports of ``version`` the device sent, in order."""
    return [r for r in proxy.reports if r["version"] == version]


def test_app_metrics_are_counted_and_the_report_store_holds_them_after_the_next_report(
    devices: Devices, lib: LibRegistry, proxy: Proxy, reports: ReportStore, tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(microsecond=0)
    device, declared = _metric_device(devices, lib, proxy, tmp_path / "cache", start)
    for success in (True, False, True):
        assert device.request("record", metric="accepted", success=success) == {"counted": True}
    # (-inf, 0.5], (0.5, 0.7], (0.7, 0.9], (0.9, +inf): 0.7 falls in the bucket it closes.
    for value in (0.83, 0.2, 0.7):
        assert device.request("observe", metric="confidence", value=value) == {"counted": True}
    device.request("flush")
    assert all("metrics" not in r for r in _sent(proxy, "1.1.0")), "counted, not sent yet"
    # The next update check 12 hours after the install's report sends the counts.
    device.request("set_clock", now=_at(start + timedelta(hours=12)))
    assert update(device) == want("digits", declared.candidate, candidate=True)
    device.request("flush")
    last = _sent(proxy, "1.1.0")[-1]
    assert last["schema_version"] == 3
    assert last["metrics"] == {
        "accepted": {"events": 3, "successes": 2},
        "confidence": {"counts": [1, 1, 1, 0]},
    }
    # Stored (accepted by the server: the release declares both): a rate's failed, succeeded.
    counts = {"accepted": [1, 2], "confidence": [1, 1, 1, 0]}
    assert stored_metrics(tmp_path, "digits", counts) == counts


def test_an_undeclared_app_metric_is_refused_at_the_call_site_and_nothing_is_sent(
    devices: Devices, lib: LibRegistry, proxy: Proxy, tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(microsecond=0)
    device, declared = _metric_device(devices, lib, proxy, tmp_path / "cache", start)
    device.request("flush")
    made = len(proxy.reports)
    for op, args in [
        ("record", {"metric": "retried", "success": True}),  # not declared
        ("observe", {"metric": "accepted", "value": 0.5}),  # a rate
        ("record", {"metric": "confidence", "success": False}),  # a distribution
        ("observe", {"metric": "confidence", "value": "NaN"}),  # not a finite number
    ]:
        answer = device.request(op, **args)
        assert answer["counted"] is False, (op, args, answer)
        assert isinstance(answer["error"], str), (op, args, answer)
        assert answer["error"], (op, args, answer)
    device.request("set_clock", now=_at(start + timedelta(hours=13)))
    assert update(device) == want("digits", declared.candidate, candidate=True)
    device.request("flush")
    assert len(proxy.reports) == made, "nothing was counted, so nothing was sent"
    assert device.request("confirm", version="1.1.0") == {"confirmed": True}
    device.request("flush")
    assert "metrics" not in _sent(proxy, "1.1.0")[-1]


def test_app_metric_counts_survive_a_restart_of_the_app(
    devices: Devices, lib: LibRegistry, proxy: Proxy, reports: ReportStore, tmp_path: Path
) -> None:
    start = datetime.now(timezone.utc).replace(microsecond=0)
    cache = tmp_path / "cache"
    device, _ = _metric_device(devices, lib, proxy, cache, start)
    assert device.request("record", metric="accepted", success=True) == {"counted": True}
    assert device.request("observe", metric="confidence", value=0.95) == {"counted": True}
    configure(device, proxy.url, lib.pem, cache, now=_at(start))  # the app starts again
    assert device.request("record", metric="accepted", success=False) == {"counted": True}
    assert device.request("confirm", version="1.1.0") == {"confirmed": True}
    device.request("flush")
    assert _sent(proxy, "1.1.0")[-1]["metrics"] == {
        "accepted": {"events": 2, "successes": 1},
        "confidence": {"counts": [0, 0, 0, 1]},
    }
    counts = {"accepted": [1, 1], "confidence": [0, 0, 0, 1]}
    assert stored_metrics(tmp_path, "digits", counts) == counts


def test_a_device_on_the_entrys_instead_counts_the_entrys_app_metrics(
    devices: Devices, lib: LibRegistry, lib_url: str, tmp_path: Path
) -> None:
    high, mid = lib.manifest("high"), lib.manifest("mid")
    assert isinstance(high.stable, ManifestEntry)
    assert isinstance(mid.stable, ManifestEntry)
    # The release's metrics are on its entry; the instead (another variant of the same
    # release, docs/protocol.md §3) declares none of its own and runs under them.
    declaring = high.stable.model_copy(
        update={
            "avoid_cpu": ["i8mm"],
            "instead": mid.stable,
            "metrics": TypeAdapter(Metrics).validate_python(METRICS),
        }
    )
    lib.manifest_file().write_bytes(
        sign_document(high.model_copy(update={"stable": declaring}), [lib.signer])
    )
    device = devices()
    configure(device, lib_url, lib.pem, tmp_path / "cache", cpu_features=["i8mm"])
    result = device.request("update")
    assert result["substitute"] == "cpu-unsupported", result
    assert result["members"]["digits"]["variant"] == mid.stable.variant
    assert device.request("record", metric="accepted", success=True) == {"counted": True}
    assert device.request("observe", metric="confidence", value=0.6) == {"counted": True}


# --- the self-test on real MNN through the host runner --------------------------------------


def test_self_test_skips_a_faulty_gpu_and_installs_on_cpu(
    devices: Devices, model_project: Project, tmp_path: Path
) -> None:
    project = model_project
    entry = project.manifest("vision", "high").stable
    assert isinstance(entry, ManifestEntry)
    assert entry.probe is not None
    assert entry.runtime.backends[0] != "cpu"
    gpu = entry.runtime.backends[0]
    tried = {
        "faulty": ["load " + gpu, "run " + gpu, "load cpu", "run cpu"],  # ran, missed, skipped
        "unavailable": ["load " + gpu, "load cpu", "run cpu"],  # not there: never run
    }
    for case, expected_trials in tried.items():
        device = devices()
        log = tmp_path / f"runner-{case}.log"
        runner = {
            "command": hostrunner(
                faulty=[gpu] if case == "faulty" else [],
                unavailable=[gpu] if case == "unavailable" else [],
                log=log,
            )
        }
        configure(
            device, project.url, project.pem, tmp_path / f"cache-{case}",
            unit="vision", self_test=True, runner=runner,
        )  # fmt: skip
        result = device.request("update")
        assert outcome(device, result) == want("vision", entry)
        assert result["members"]["vision"]["backend"] == "cpu"
        trials = [line for line in log.read_text().splitlines() if line]
        # Each probe case is one run; what matters is the order of backends.
        assert [t for i, t in enumerate(trials) if i == 0 or t != trials[i - 1]] == (
            expected_trials
        ), trials


def test_self_test_failing_on_every_backend_is_probe_failed_and_the_last_good_stays(
    devices: Devices, model_project: Project, tmp_path: Path
) -> None:
    project = model_project
    first = project.manifest("vision", "high").stable
    assert isinstance(first, ManifestEntry)
    cache = tmp_path / "cache"
    device = devices()
    good = {"command": hostrunner(unavailable=list(first.runtime.backends[:-1]))}
    configure(device, project.url, project.pem, cache, unit="vision", self_test=True, runner=good)
    assert update(device) == want("vision", first)
    project.site.project.edit_table("models.vision", 'version = "1.0.0"', 'version = "1.1.0"')
    project.publish("vision", "--full")
    broken = {"command": hostrunner(faulty=list(first.runtime.backends))}
    configure(device, project.url, project.pem, cache, unit="vision", self_test=True, runner=broken)
    assert update(device) == want("vision", first, code="probe-failed", refused=("1.1.0",))
    fresh = devices()
    configure(
        fresh, project.url, project.pem, tmp_path / "fresh",
        unit="vision", self_test=True, runner=broken,
    )  # fmt: skip
    assert update(fresh) == want("vision", None, code="probe-failed", refused=("1.1.0",))


# --- the conformance vectors through the device program ----------------------------------


#: The device program's op for each folder of tests/vectors/ ("" is the folder itself).
VECTOR_OPS = {
    "": "decide",
    "blobs": "check_blob",
    "probes": "check_probe",
    "versions": "check_version",
    "reports": "check_report",
    "labels": "check_labels",
    "conditions": "check_conditions",
    "selftest": "check_selftest",
    "tiers": "check_tiers",
    "health": "check_health",
    "metrics": "check_metrics",
    "hints": "check_hints",
}

#: Vector folders a client's device program does not run yet, with the issue that adds them
#: (none today: every client runs every folder).
NOT_YET: dict[str, set[str]] = {}


def test_every_vector_file_through_the_device_program(devices: Devices) -> None:
    """Every file of every folder (docs/reference/device-program.md); a new folder fails here."""
    device = devices()
    checked, skipped, wrong = 0, 0, []
    for path in sorted(VECTORS.rglob("*.json")):
        folder = "/".join(path.relative_to(VECTORS).parts[:-1])
        if folder in ("keys", "rules"):
            continue  # keys are keys; rules/ is the next test
        assert folder in VECTOR_OPS, f"no device op for tests/vectors/{folder}/"
        if folder in NOT_YET.get(device.client, set()):
            skipped += 1
            continue
        vector = json.loads(path.read_text("utf-8"))
        answer = device.call(VECTOR_OPS[folder], vector=vector["input"])
        checked += 1
        got = answer.get("result") if answer.get("ok") else answer
        if got != vector["expected"]:
            wrong.append(f"{path.relative_to(VECTORS)}: {got} != {vector['expected']}")
    # All but rules/ and the folders this client does not run yet.
    assert checked == len(list(VECTORS.rglob("*.json"))) - 2 - skipped, checked
    assert not wrong, f"{len(wrong)} of {checked} differ:\n" + "\n".join(wrong)


def test_the_tier_and_cohort_rules_through_the_device_program(devices: Devices) -> None:
    device = devices()
    tiers = json.loads((VECTORS / "rules" / "tiers.json").read_text("utf-8"))
    got = [
        device.request("resolve_tier", tiers=tiers["tiers"], device=case["device"])["tier"]
        for case in tiers["cases"]
    ]
    assert got == [case["tier"] for case in tiers["cases"]]
    cohorts = json.loads((VECTORS / "rules" / "cohorts.json").read_text("utf-8"))
    for case in cohorts["cases"]:
        answer = device.request(
            "cohort",
            salt=case["salt"],
            device_id=case["device_id"],
            percents=list(case["in_cohort"]),
        )
        assert answer == {"bucket": case["bucket"], "in_cohort": case["in_cohort"]}, case


def test_bad_requests_are_refused_without_a_crash(devices: Devices) -> None:
    device = devices()
    assert device.raw(b"not json")["ok"] is False
    assert device.call("no-such-op")["ok"] is False
    assert device.call("update")["ok"] is False  # before configure
    assert device.call("check_json")["ok"] is False  # no data
    assert device.call("decide", vector={})["ok"] is False  # not a vector input
    assert device.call("set_clock", now="yesterday")["ok"] is False
    bad_key = device.call(
        "configure", registry="http://127.0.0.1:9/", trusted_keys=["not a PEM"],
        cache_dir="/nonexistent/cache", unit="digits", bundle=False, tier="high",
        device={"device_id": "d", "ram_mb": 1, "cpu_cores": 1},
    )  # fmt: skip
    assert bad_key["ok"] is False, bad_key
    assert device.request("hello")["client"] == device.client  # still alive
    assert device.call("check_json", data=base64.b64encode(b"{}").decode())["result"] == {
        "valid": True
    }
    assert device.quit() == 0


# --- teams' own repositories: a large input, an LSTM ----------------------------------------

VENV_BIN = Path(sys.executable).parent


def _isolated_env(home: Path) -> dict[str, str]:
    """What a command of a module-scoped repository runs with (conftest isolates per test)."""
    env = {
        **os.environ,
        "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "DVC_SITE_CACHE_DIR": str(home / "dvc-site"),
        "DVC_NO_ANALYTICS": "1",
        "GIT_CONFIG_GLOBAL": str(home / ".gitconfig"),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "edgereg tests",
        "GIT_AUTHOR_EMAIL": "tests@edgereg.invalid",
        "GIT_COMMITTER_NAME": "edgereg tests",
        "GIT_COMMITTER_EMAIL": "tests@edgereg.invalid",
        "PYTHONPATH": str(ROOT),
    }
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text("", encoding="utf-8")
    return env


def _sh(cwd: Path, env: dict[str, str], *args: str, expect: int = 0) -> str:
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    output = done.stdout + done.stderr
    assert done.returncode == expect, f"{' '.join(args)} exited {done.returncode}:\n{output}"
    return output


@dataclass
class OwnRepo:
    """A team's repository: `edgereg init`, `add`, `dvc repro`, `publish --full`; then served."""

    root: Path
    model: str
    built: str  # what `dvc repro` printed
    url: str = ""

    @property
    def pem(self) -> str:
        keys = sorted((self.root / "publisher-keys").glob("*.pem"))
        assert keys, "keys generate pins the public key in publisher-keys/"
        return keys[0].read_text()

    def manifest(self, tier: str) -> Manifest:
        registry = Registry(open_storage(f"file://{self.root / 'registry'}"))
        return registry.read_manifest(self.model, tier)

    def metrics(self, variant: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(
            (self.root / "build" / self.model / variant / "metrics.json").read_text()
        )
        return data


def own_repo(
    root: Path, model: str, write: Callable[[Path], Any], evaluation: dict[str, Any], task: str
) -> OwnRepo:
    """Init a repository, add the model written by ``write``, build, publish --full."""
    import numpy as np

    env = _isolated_env(root.parent / f"{root.name}-home")
    root.mkdir()
    _sh(root, env, "git", "init", "--quiet")
    _sh(root, env, "edgereg", "init")
    (root / "models").mkdir()
    (root / "data").mkdir()
    write(root / "models" / f"{model}.onnx")
    np.savez(root / "data" / f"{model}_eval.npz", **evaluation)
    # x86 only: these tests are about the probe and the MNN API, not the ARM classes.
    text = (root / "models.toml").read_text()
    assert text.count("[toolchain]\n") == 1
    (root / "models.toml").write_text(text.replace("[toolchain]\n", "[toolchain]\narm = []\n"))
    _sh(
        root, env, "edgereg", "add", f"models/{model}.onnx",
        "--evaluation", f"data/{model}_eval.npz", "--task", task,
    )  # fmt: skip
    built = _sh(root, env, "dvc", "repro")
    _sh(root, env, "edgereg", "keys", "generate")
    _sh(root, env, "edgereg", "publish", model, "--full")
    return OwnRepo(root, model, built)


@contextlib.contextmanager
def _served_repo(repo: OwnRepo, log: Path) -> Iterator[OwnRepo]:
    with serve_process(log, "--registry", f"file://{repo.root / 'registry'}") as (_, url):
        repo.url = url + "/"
        yield repo


@pytest.fixture(scope="module")
def large_input(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRepo]:
    """A 1x3x1024x1024 float segmenter: its one-sample probe is 16.8 MB in base64."""
    import numpy as np
    import tiny_models

    size = tiny_models.LARGE_SIZE
    images = np.random.default_rng(29).uniform(-1, 1, (2, 1, 3, size, size)).astype(np.float32)
    base = tmp_path_factory.mktemp("large")
    repo = own_repo(
        base / "repo", "seg", tiny_models.large_input_segmenter, {"image": images}, "generic"
    )
    with _served_repo(repo, base / "serve.log") as served:
        yield served


@pytest.mark.slow
def test_a_1024_input_model_ships_with_its_probe_data_blob(
    devices: Devices, large_input: OwnRepo, tmp_path: Path
) -> None:
    repo = large_input
    for variant in ("fp32", "w8"):
        out = repo.root / "build" / "seg" / variant
        assert f"Running stage 'build-seg-{variant}'" in repo.built
        assert repo.metrics(variant)["status"] == "passed"
        # The probe's tensors are a blob beside it: the JSON stays small.
        assert (out / "probe.json").stat().st_size < 64 * 1024
        assert (out / "probe-data.bin").stat().st_size > 12 * 1024 * 1024
    entry = repo.manifest("high").stable
    assert isinstance(entry, ManifestEntry)
    assert entry.probe is not None
    assert entry.probe_data is not None
    assert entry.probe_data.size >= 3 * 1024 * 1024 * 4  # the input alone: 12 MiB
    device = devices()
    log = tmp_path / "runner.log"
    configure(
        device, repo.url, repo.pem, tmp_path / "cache", unit="seg", self_test=True,
        runner={"command": hostrunner(log=log)}, deadline_s=600,
    )  # fmt: skip
    result = device.request("update", timeout=600)
    assert outcome(device, result) == want("seg", entry)
    assert result["members"]["seg"]["backend"] == "cpu"
    # The probe ran: the runner loaded the model and ran the probe's case on it.
    assert log.read_text().split() == ["load", "cpu", "run", "cpu"]
    status = device.request("status")
    assert status["installed"]["members"]["seg"]["sha256"] == entry.sha256


def _lstm_evaluation() -> dict[str, Any]:
    import numpy as np
    import tiny_models

    shape = (24, tiny_models.TAGGER_STEPS, 1, tiny_models.TAGGER_FEATURES)
    return {"x": np.random.default_rng(30).normal(0, 1, shape).astype(np.float32)}


@pytest.fixture(scope="module")
def lstm_tagger(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnRepo]:
    """A bidirectional-LSTM tagger: MNN's converter makes two While subgraphs of it."""
    import tiny_models

    base = tmp_path_factory.mktemp("lstm")
    repo = own_repo(
        base / "repo", "tagger", tiny_models.lstm_tagger_model, _lstm_evaluation(), "generic"
    )
    with _served_repo(repo, base / "serve.log") as served:
        yield served


@pytest.mark.slow
def test_an_lstm_needs_the_module_api_a_session_runner_refuses_it_a_module_runner_installs(
    devices: Devices, lstm_tagger: OwnRepo, tmp_path: Path
) -> None:
    repo = lstm_tagger
    for variant in ("fp32", "w8"):
        metrics = repo.metrics(variant)
        assert metrics["status"] == "passed"
        assert metrics["mnn_api"]["api"] == "module"
        assert [name[:5] for name in metrics["mnn_api"]["subgraphs"]] == ["While", "While"]
        # Never "built" with a stage unmeasured and no reason.
        assert metrics["memory"]["measured"] is False
        assert "run only through MNN's Module API" in metrics["memory"]["problem"]
    entry = repo.manifest("high").stable
    assert isinstance(entry, ManifestEntry)
    assert entry.contract is not None
    assert entry.contract.mnn_api == "module"

    # The guides' session-API runner: refused before any download, nothing marked bad.
    session = devices()
    log = tmp_path / "session.log"
    runner = {"command": hostrunner(api="session", log=log), "mnn_apis": ["session"]}
    configure(
        session, repo.url, repo.pem, tmp_path / "session", unit="tagger", self_test=True,
        runner=runner,
    )  # fmt: skip
    result = session.request("update")
    assert outcome(session, result) == want("tagger", None, code="api-unsupported")
    assert "Module API" in result["error"]
    assert not log.exists()  # never loaded: refused at the decision
    assert not list((tmp_path / "session").glob("blobs/*"))

    # The same runner told it calls the Module API (what it really does not) loads it and fails
    # the self-test: the session API cannot shape a While ("Compute Shape Error").
    lying = devices()
    configure(
        lying, repo.url, repo.pem, tmp_path / "lying", unit="tagger", self_test=True,
        runner={"command": hostrunner(api="session"), "mnn_apis": ["module"]},
    )  # fmt: skip
    refused = lying.request("update")
    assert refused["error_code"] == "probe-failed"
    assert "session API cannot run this model" in refused["error"]

    # The Module-API runner installs it, its self-test passed on the CPU.
    module = devices()
    configure(
        module, repo.url, repo.pem, tmp_path / "module", unit="tagger", self_test=True,
        runner={"command": hostrunner(), "mnn_apis": ["module"]},
    )  # fmt: skip
    installed = module.request("update")
    assert outcome(module, installed) == want("tagger", entry)
    assert installed["members"]["tagger"]["backend"] == "cpu"
