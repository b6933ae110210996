"""A fleet simulator: many devices, each a real reference client, against a real `edgereg serve`.

Used by tests/test_fleet.py (a couple of hundred devices) and the benchmarks
(benchmarks/bundles.py, benchmarks/fleet.py: a thousand). Nothing is faked
on the delivery path: every device is an :class:`edgereg.client.Client` with
its own cache directory, talking HTTP on loopback to ``edgereg serve`` over a
registry published through the real publish path from a tiny project built
with the real MNN converter (tests/buildkit.py).

What is simulated is only what a host cannot be:

* **the device**: an install id, a tier, a coarse device class, a cache
  directory (:class:`Device`, made by :func:`make_devices`);
* **time**: one :class:`SimClock` given to the registry and to every
  client, so soak hours pass instantly and manifests stay unexpired;
* **what the app measures**: inference latencies drawn from a log-normal
  distribution per device class, shifted per release (:func:`latencies`,
  seeded, so a run is reproducible);
* **faults**: a device class may carry a faulty GPU backend or crash-loop on a
  given release (:attr:`DeviceClass.faulty_gpu`, :meth:`Device.crashes_on`),
  for the self-test and health checks to act on.

Typical use::

    project = build_bundle_project(tmp / "project")
    kit = FleetRegistry.create(tmp / "registry", project)
    kit.publish_bundle("1.0.0", percent=None)
    kit.publish_bundle("2.0.0", percent=5.0)
    with serve(kit.storage) as base_url:
        fleet = Fleet(base_url, kit.trusted, make_devices(200, tmp / "devices"), clock=kit.clock)
        fleet.check_all()
        assert fleet.mixed() == []
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # benchmarks import this module by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from edgereg import config as config_module  # noqa: E402
from edgereg.build.probe import probe_outputs_on_host  # noqa: E402
from edgereg.client import (  # noqa: E402
    Client,
    DeviceProfile,
    FetchResult,
    InstallCheck,
    MemberFiles,
    Rejected,
)
from edgereg.protocol.probe import GoldenProbe, check_probe  # noqa: E402
from edgereg.protocol.wire import from_bytes  # noqa: E402
from edgereg.registry import Registry, prepare_bundle_release, promote, set_percent  # noqa: E402
from edgereg.signing import Signer, TrustedKeys, generate_key  # noqa: E402
from edgereg.storage import Storage, open_storage  # noqa: E402

BUNDLE = "kit"
MEMBERS = ("vision", "sensor", "tagger")
TIERS = ("high", "mid", "low")
START = datetime(2026, 12, 1, 9, 0, tzinfo=timezone.utc)


# --- time -----------------------------------------------------------------------


@dataclass
class SimClock:
    """The one clock of a simulation: the registry's and every client's ``clock=``."""

    now: datetime = START

    def __call__(self) -> datetime:
        return self.now

    def advance(self, hours: float) -> None:
        self.now += timedelta(hours=hours)


# --- devices --------------------------------------------------------------------


@dataclass(frozen=True)
class DeviceClass:
    """A coarse kind of phone: its tier, what the app measures on it, its faults.

    Attributes:
        name: The coarse device class a report may carry (never a model name).
        tier: The tier this class resolves to.
        latency_ms: Median inference latency the app measures on the stable release.
        latency_sigma: Log-normal spread of that latency.
        faulty_gpu: The GPU backend computes wrong outputs on this class (the
            self-test must skip it and fall back to CPU).
    """

    name: str
    tier: str
    latency_ms: float
    latency_sigma: float = 0.25
    faulty_gpu: bool = False


CLASSES = (
    DeviceClass("flagship", "high", 9.0),
    DeviceClass("flagship-mali", "high", 11.0, faulty_gpu=True),
    DeviceClass("midrange", "mid", 22.0),
    DeviceClass("budget", "low", 48.0, latency_sigma=0.35),
)
"""The default fleet mix, each class drawn with equal odds: half the devices are high tier
(half of those with a faulty GPU), a quarter mid, a quarter low."""


@dataclass
class Device:
    """One simulated phone: an install id, a class, a cache directory, its own client."""

    device_id: str
    kind: DeviceClass
    cache_dir: Path
    # Releases this device's app crashes on before its first real inference.
    crash_versions: frozenset[str] = frozenset()
    client: Client | None = field(default=None, repr=False)

    @property
    def tier(self) -> str:
        return self.kind.tier

    def crashes_on(self, version: str | None) -> bool:
        return version is not None and version in self.crash_versions

    def profile(self) -> DeviceProfile:
        return DeviceProfile(
            device_id=self.device_id, ram_mb=6144, cpu_cores=8, mnn_runtime="3.6.1"
        )


def make_devices(
    count: int,
    where: Path,
    *,
    classes: Sequence[DeviceClass] = CLASSES,
    seed: int = 7,
    crash_share: float = 0.0,
    crash_versions: Iterable[str] = (),
) -> list[Device]:
    """``count`` devices, classes drawn with a seeded RNG; ``crash_share`` of them crash-loop.

    Device ids are random hex (as an app's install id would be), so cohorts are
    not biased by a counter.
    """
    rng = random.Random(seed)
    crashing = frozenset(crash_versions)
    devices = []
    for index in range(count):
        kind = classes[rng.randrange(len(classes))]
        device_id = f"{rng.getrandbits(64):016x}"
        crashes = crashing if rng.random() < crash_share else frozenset()
        devices.append(Device(device_id, kind, where / f"{index:05d}", crashes))
    return devices


def latencies(device: Device, *, shift: float = 0.0, count: int = 50, seed: int = 0) -> list[float]:
    """What the app measures on ``device`` for ``count`` inferences, in ms.

    ``shift`` is the release's relative regression (0.3: 30 % slower). Seeded by
    the device id so the same device measures the same numbers in every run.
    """
    rng = random.Random(f"{seed}:{device.device_id}")
    median = device.kind.latency_ms * (1.0 + shift)
    mu = math.log(median)
    return [rng.lognormvariate(mu, device.kind.latency_sigma) for _ in range(count)]


# --- the registry -----------------------------------------------------------------


def build_bundle_project(root: Path) -> Path:
    """The tiny project of tests/buildkit.py, a third model ``tagger``, bundle ``kit``; built.

    ``tagger`` has a single low-tier variant that every tier falls back to.
    Takes about 10 s (nine real MNN builds).
    """
    import buildkit

    project = buildkit.write_project(root)
    text = project.toml()
    start = text.index("[models.vision]\n")
    end = text.index("[models.vision.variants.fp32]")
    third = text[start:end].replace("[models.vision", "[models.tagger")
    third = third.replace("[[models.vision", "[[models.tagger")
    third += '[models.tagger.variants.w8]\ntier = "low"\n'
    third += 'quantization = { mode = "weight", bits = 8 }\nruntime = { threads = 1 }\n'
    members = ", ".join(f'"{m}"' for m in MEMBERS)
    bundle = f'\n[bundles.{BUNDLE}]\nversion = "1.0.0"\nmodels = [{members}]\n'
    project.config_path.write_text(text + "\n" + third + bundle, encoding="utf-8")
    for model, variants in {**buildkit.VARIANTS, "tagger": ("w8",)}.items():
        for variant in variants:
            project.build(model, variant)
    return root


def set_member_versions(project: Path, version: str) -> config_module.Config:
    """models.toml with every member (and the bundle) at ``version``; builds stay current."""
    path = project / "models.toml"
    lines = [
        f'version = "{version}"' if line.startswith("version = ") else line
        for line in path.read_text(encoding="utf-8").splitlines()
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return config_module.load(path)


@dataclass
class FleetRegistry:
    """A registry the simulation publishes to, on the simulated clock."""

    storage: Storage
    project: Path
    signer: Signer
    trusted: TrustedKeys
    clock: SimClock
    expires_days: int = 30
    # Signed into the state when set: where devices POST their reports.
    report_url: str | None = None

    @classmethod
    def create(
        cls, where: Path | Storage, project: Path, *, clock: SimClock | None = None
    ) -> FleetRegistry:
        storage = where if isinstance(where, Storage) else open_storage(f"file://{where}")
        private_pem, public_pem = generate_key()
        return cls(
            storage,
            project,
            Signer.from_pem(private_pem),
            TrustedKeys.from_pems([public_pem]),
            clock or SimClock(),
        )

    @property
    def registry(self) -> Registry:
        return Registry(self.storage, trusted=self.trusted, clock=self.clock)

    def publish_bundle(self, version: str, *, percent: float | None) -> None:
        """Every member and the bundle at ``version``; ``percent`` None: published --full."""
        config = set_member_versions(self.project, version)
        prepared = prepare_bundle_release(
            config, BUNDLE, self.project / "build", version=version, now=self.clock()
        )
        extra: dict[str, Any] = {} if self.report_url is None else {"report_url": self.report_url}
        self.registry.publish(
            prepared,
            signer=self.signer,
            percent=percent,
            full=percent is None,
            actor="fleet",
            expires_days=self.expires_days,
            **extra,
        )

    def set_percent(self, name: str, percent: float) -> None:
        """A manual rollout step (``edgereg rollout NAME --percent P --force``)."""
        self.registry.change(
            name,
            lambda state, now, expires: set_percent(
                state,
                name,
                percent,
                policy=config_module.RolloutPolicy(),
                now=now,
                expires=expires,
                actor="fleet",
                force=True,
            ),
            signer=self.signer,
            expires_days=self.expires_days,
        )

    def promote(self, name: str) -> None:
        """``edgereg promote NAME``: the candidate becomes stable for every device."""
        self.registry.change(
            name,
            lambda state, now, expires: promote(
                state, name, now=now, expires=expires, actor="fleet"
            ),
            signer=self.signer,
            expires_days=self.expires_days,
        )


# --- the device's self-test -------------------------------------------------------


class DeviceProbeFailed(Rejected):
    """Every hinted backend missed the probe's tolerance on this device: never installed."""

    reason = "probe-failed"
    permanent = True


@dataclass
class ProbeLedger:
    """What every device's self-test found, for the assertions: (device, member, version)."""

    passed: dict[tuple[str, str, str], str] = field(default_factory=dict)  # -> backend
    skipped: dict[tuple[str, str, str], list[str]] = field(default_factory=dict)
    failed: set[tuple[str, str, str]] = field(default_factory=set)


class HostOutputs:
    """Real MNN outputs of each artifact on its probe's inputs, computed once per digest.

    The host's MNN CPU backend is deterministic for one artifact, so the fleet
    runs each distinct artifact once (one child process) and every device
    reuses the numbers; what differs per device is the backend's fault.
    """

    def __init__(self) -> None:
        self._outputs: dict[str, list[list[dict[str, list[float]]]]] = {}

    @property
    def runs(self) -> int:
        """How many artifacts were run on the host's MNN so far."""
        return len(self._outputs)

    def __call__(
        self, files: MemberFiles, probe: GoldenProbe
    ) -> list[list[dict[str, list[float]]]]:
        digest = files.entry.sha256
        if digest not in self._outputs:
            assert files.entry.contract is not None
            self._outputs[digest] = probe_outputs_on_host(
                files.artifact, probe, files.entry.contract
            )
        return self._outputs[digest]


def perturbed(
    outputs: list[list[dict[str, list[float]]]], seed: str, scale: float = 0.5
) -> list[list[dict[str, list[float]]]]:
    """A miscomputing backend: every value moved by noise of ``scale`` times the output's spread."""
    rng = random.Random(seed)
    result = []
    for case in outputs:
        steps = []
        for step in case:
            moved = {}
            for name, values in step.items():
                spread = (max(values) - min(values)) or 1.0
                moved[name] = [v + rng.gauss(0.0, scale * spread) for v in values]
            steps.append(moved)
        result.append(steps)
    return result


def device_self_test(
    device: Device, host: HostOutputs, ledger: ProbeLedger, *, broken: frozenset[str] = frozenset()
) -> InstallCheck:
    """The install check of one simulated device: each member's probe on each hinted backend.

    The outputs are real MNN outputs (:class:`HostOutputs`); the judge is the
    protocol's real :func:`~edgereg.protocol.probe.check_probe`. On a device
    with a faulty GPU the ``opencl`` backend's outputs are perturbed; a model
    version in ``broken`` miscomputes on every backend of this device (a
    kernel bug), so it must be rejected and never installed.
    """

    def check(unit: str, version: str, files: Mapping[str, MemberFiles]) -> dict[str, str]:
        chosen: dict[str, str] = {}
        for member, found in files.items():
            key = (device.device_id, member, found.entry.version)
            if found.probe is None:
                raise DeviceProbeFailed(f"{member} {found.entry.version} has no golden probe")
            probe = from_bytes(GoldenProbe, found.probe.read_bytes())
            outputs = host(found, probe)
            backends = list(found.entry.runtime.backends or ["cpu"])
            if "cpu" not in backends:
                backends.append("cpu")
            skipped = []
            for backend in backends:
                faulty = found.entry.version in broken or (
                    backend == "opencl" and device.kind.faulty_gpu
                )
                computed = perturbed(outputs, f"{key}:{backend}") if faulty else outputs
                if check_probe(probe, computed).passed:
                    chosen[member] = backend
                    break
                skipped.append(backend)
            ledger.skipped[key] = skipped
            if member not in chosen:
                ledger.failed.add(key)
                raise DeviceProbeFailed(
                    f"{member} {found.entry.version} failed its probe on {', '.join(skipped)}"
                )
        for member, backend in chosen.items():
            ledger.passed[(device.device_id, member, files[member].entry.version)] = backend
        return chosen

    return check


# --- the fleet --------------------------------------------------------------------


CheckFactory = Callable[[Device], InstallCheck | None]


@dataclass
class Fleet:
    """Every device's client against one registry URL, on one clock.

    ``install_check(device)`` gives each device's install check (the self-test
    of the real client, with the device's simulated GPU); None for none.
    """

    base_url: str
    trusted: TrustedKeys
    devices: list[Device]
    clock: SimClock
    unit: str = BUNDLE
    bundle: bool = True
    install_check: CheckFactory | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    # Per device: more Client options (self_test=, device_class=).
    device_options: Callable[[Device], Mapping[str, Any]] | None = None
    last: dict[str, FetchResult] = field(default_factory=dict)

    def client(self, device: Device) -> Client:
        if device.client is None:
            device.client = Client(
                self.base_url,
                self.trusted,
                device.cache_dir,
                model=None if self.bundle else self.unit,
                bundle=self.unit if self.bundle else None,
                device=device.profile(),
                tier=device.tier,
                install_check=None if self.install_check is None else self.install_check(device),
                clock=self.clock,
                timeout=10,
                **self.options,
                **(self.device_options(device) if self.device_options else {}),
            )
        return device.client

    def check_all(self) -> list[FetchResult]:
        """One update check per device, in order; every result is kept in ``last``."""
        results = []
        for device in self.devices:
            result = self.client(device).fetch()
            self.last[device.device_id] = result
            results.append(result)
        return results

    def installed(self, device: Device) -> dict[str, str]:
        """The member versions installed on ``device`` now, read back from its cache."""
        status = self.client(device).status()
        return {name: model.version for name, model in status.members.items()}

    def installed_sets(self) -> dict[str, tuple[str, ...]]:
        """Device id -> its installed member versions in ``MEMBERS`` order ('-': none)."""
        sets = {}
        for device in self.devices:
            versions = self.installed(device)
            sets[device.device_id] = tuple(versions.get(m, "-") for m in MEMBERS)
        return sets

    def mixed(self) -> list[str]:
        """Devices whose installed set mixes versions (or misses a member)."""
        return [
            device_id
            for device_id, versions in self.installed_sets().items()
            if len(set(versions)) > 1
        ]

    def versions(self) -> dict[str, int]:
        """Installed bundle version -> number of devices."""
        counts: dict[str, int] = {}
        for device in self.devices:
            version = self.client(device).status().version or "-"
            counts[version] = counts.get(version, 0) + 1
        return counts


__all__ = [
    "BUNDLE",
    "CLASSES",
    "MEMBERS",
    "TIERS",
    "ClosedLoop",
    "Device",
    "DeviceClass",
    "DeviceProbeFailed",
    "Fleet",
    "FleetRegistry",
    "HostOutputs",
    "ProbeLedger",
    "Release",
    "SimClock",
    "build_bundle_project",
    "device_self_test",
    "latencies",
    "make_devices",
    "open_closed_loop",
    "set_member_versions",
]


# --- the closed loop: the client's own self-test, health, reports; the store; --auto ---------
#
# Everything below needs the self-test, health ledger and reporter of the client
# (edgereg.client._selftest/_health/_reporter), the report store (edgereg.reports.open_store)
# and the canary analysis (edgereg.analysis, edgereg.registry.run_auto); they are imported
# where used, so the delivery half of this module works without them.


class _PerturbedSession:
    """A model session whose every output is moved by noise: a miscomputing backend."""

    def __init__(self, session: Any, seed: str) -> None:
        self._session = session
        self._seed = seed

    def input_shapes(self) -> Any:
        return self._session.input_shapes()

    def run(self, feeds: Mapping[str, Any]) -> dict[str, Any]:
        import numpy as np

        # hashlib, not hash(): str hashes change per process, the noise must not.
        rng = np.random.default_rng(int(hashlib.sha256(self._seed.encode()).hexdigest()[:8], 16))
        out = {}
        for name, value in self._session.run(feeds).items():
            array = np.asarray(value, dtype=np.float64)
            spread = float(array.max() - array.min()) or 1.0
            out[name] = (array + rng.normal(0.0, 0.5 * spread, array.shape)).astype(np.float32)
        return out


class DeviceRunner:
    """The self-test's backend runner on one simulated device (real MNN underneath).

    Every backend runs on the host's MNN CPU backend (the host has no GPU), so
    a healthy GPU computes what the CPU does; on a device class with a faulty
    GPU the ``opencl`` outputs are perturbed, and a model version that is
    broken on this device (a kernel bug) is perturbed on every backend.
    ``version`` is set by :func:`device_selftest` before each model's trials:
    the releases of the simulation share artifacts, so the digest cannot say.
    """

    def __init__(self, device: Device, broken: Callable[[Device], frozenset[str]]) -> None:
        from edgereg.client._selftest import MnnRunner

        self.device = device
        self.broken = broken
        self.version = ""
        self._mnn = MnnRunner()

    def load(self, artifact: Path, backend: str, runtime: Any, inputs: Any, outputs: Any) -> Any:
        session = self._mnn.load(artifact, "cpu", runtime, inputs, outputs)
        faulty = self.version in self.broken(self.device) or (
            backend == "opencl" and self.device.kind.faulty_gpu
        )
        seed = f"{self.device.device_id}:{self.version}:{backend}"
        return _PerturbedSession(session, seed) if faulty else session


def device_selftest(device: Device, broken: Callable[[Device], frozenset[str]]) -> Any:
    """The client's real :class:`SelfTest` over a :class:`DeviceRunner` for ``device``."""
    from edgereg.client._selftest import SelfTest

    class DeviceSelfTest(SelfTest):
        def run(self, model: str, artifact: Any, entry: Any, probe: Any) -> Any:
            runner.version = entry.version
            return super().run(model, artifact, entry, probe)

    runner = DeviceRunner(device, broken)
    return DeviceSelfTest(device.cache_dir, runner=runner)


class _ClockedSink:
    """The server's report store, stamped with the simulated clock (the server takes a store)."""

    def __init__(self, store: Any, clock: SimClock) -> None:
        self.store = store
        self.sim_clock = clock

    def ingest(self, report: Any, received_at: datetime) -> None:
        self.store.ingest(report, self.sim_clock())


@dataclass
class Release:
    """How a published version behaves on the fleet."""

    latency_shift: float = 0.0  # +0.3: the app measures 30 % slower inferences
    probe_broken_share: float = 0.0  # devices whose kernels miscompute it on every backend
    crash_share: float = 0.0  # devices whose app crash-loops on it (never confirms)


class ClosedLoop:
    """Devices that self-test, confirm or crash-loop, and report; a store; ``rollout --auto``.

    Each device is the reference client with its own self-test (a
    :class:`DeviceRunner` for the device's GPU), health ledger and reporter:
    the app calls ``app_started``, ``record_inference`` and ``confirm``.

    Args:
        kit: The registry (its clock is the devices' and the store's).
        base_url: Where ``edgereg serve`` (with ``sink`` behind ``POST /v1/reports``) listens.
        devices: The fleet.
        sink: The report sink given to the server (:meth:`make_sink`).
        releases: How each version behaves (latency shift, broken probes, crashes).
        seed: For which devices a release breaks or crashes on.
    """

    def __init__(
        self,
        kit: FleetRegistry,
        base_url: str,
        devices: list[Device],
        sink: _ClockedSink,
        releases: Mapping[str, Release],
        *,
        seed: int = 11,
        max_unconfirmed_starts: int = 3,
    ) -> None:
        self.kit = kit
        self.sink = sink
        self.releases = dict(releases)
        self.seed = seed
        self.rejected: set[tuple[str, str]] = set()  # (device, unit version) refused by probe
        self.reverts: set[tuple[str, str]] = set()  # (device, unit version) reverted
        self.last_analysis: Any = None
        self.fleet = Fleet(
            base_url,
            kit.trusted,
            devices,
            kit.clock,
            options={"max_unconfirmed_starts": max_unconfirmed_starts},
            device_options=lambda device: {
                "self_test": device_selftest(device, self._broken),
                "device_class": device.kind.name,
            },
        )

    @staticmethod
    def make_sink(store: Any, clock: SimClock) -> _ClockedSink:
        return _ClockedSink(store, clock)

    def _chosen(self, device: Device, version: str, share: float, what: str) -> bool:
        draw = random.Random(f"{self.seed}:{what}:{version}:{device.device_id}").random()
        return draw < share

    def _broken(self, device: Device) -> frozenset[str]:
        """The versions that miscompute on every backend of ``device``."""
        return frozenset(
            version
            for version, release in self.releases.items()
            if self._chosen(device, version, release.probe_broken_share, "probe")
        )

    def day(self, starts: int = 4) -> None:
        """One simulated day: every device checks for an update, starts the app, reports."""
        for device in self.fleet.devices:
            self._device_day(device, starts)
        for device in self.fleet.devices:
            self.fleet.client(device).close()  # the reports of the day are in
            # Tomorrow is another process: an install in it comes before its app_started
            # (protocol §11: a start counts against the installs it ran).
            device.client = None

    def _device_day(self, device: Device, starts: int) -> None:
        client = self.fleet.client(device)
        result = client.fetch()
        if result.error_code == "probe-failed":
            state, _ = self.kit.registry.read_state(BUNDLE)
            if state is not None and state.candidate is not None:
                self.rejected.add((device.device_id, state.candidate))
        for start in range(starts):
            installed = client.status(verify=False)
            revert = client.app_started()
            if revert is not None:
                self.reverts.add((device.device_id, revert.version))
                continue  # the app starts again on the last good set
            if installed.version is None:
                return
            release = self.releases.get(installed.version, Release())
            if self._chosen(device, installed.version, release.crash_share, "crash"):
                continue  # the app dies before its first inference: no confirmation
            for member in installed.members:
                for ms in latencies(device, shift=release.latency_shift, count=20, seed=start):
                    client.record_inference(ms, member)
            if not client.confirm(installed.version):
                client.report_latency()
            return

    def sent(self) -> list[Any]:
        """The last report of each member on each device (as kept in its cache)."""
        import json

        from edgereg.protocol.reports import Report

        found = []
        for device in self.fleet.devices:
            path = device.cache_dir / "reports.json"
            if path.is_file():
                state = json.loads(path.read_text(encoding="utf-8"))
                # reports.json keeps each model's reports by unit version, newest last.
                for versions in state.get("reports", {}).values():
                    if versions:
                        kept = list(versions.values())[-1]
                        found.append(Report.model_validate(kept["report"]))
        return found

    def run_auto(self, policy: config_module.RolloutPolicy, days: int) -> list[Any]:
        """A day of use, then ``rollout --auto`` from cron, until it promotes or halts."""
        decisions = []
        for _ in range(days):
            self.kit.clock.advance(1)
            self.day()
            self.kit.clock.advance(24)
            decision = self.auto(policy)
            decisions.append(decision)
            if decision.action in ("promote", "rollback", "pause"):
                break
        return decisions

    def auto(self, policy: config_module.RolloutPolicy) -> Any:
        """``edgereg rollout kit --auto`` on the simulated clock: the command's own workflow.

        :func:`edgereg.registry.run_auto` over the store's per-arm summaries
        (:func:`edgereg.reports.canary.rollout_analysis`), with the fleet's
        tiers and clock. Returns the :class:`~edgereg.registry.AutoDecision`.
        """
        from edgereg.registry import run_auto
        from edgereg.reports.canary import rollout_analysis

        # The fleet's tiers (the command uses every tier of the manifests).
        tiers = sorted({device.tier for device in self.fleet.devices})
        # edgereg serve marks its clock in the store every minute: install ages run on.
        self.sink.store.mark_clock(self.kit.clock())
        result = run_auto(
            self.kit.registry,
            BUNDLE,
            policy=policy,
            analyse=lambda state, now: rollout_analysis(
                self.sink.store, state, guardrails=policy.guardrails, tiers=tiers, now=now
            ),
            now=self.kit.clock(),
            signers=lambda: self.kit.signer,
            actor="fleet-cron",
            expires_days=self.kit.expires_days,
        )
        self.last_analysis = result.analysis
        return result.decision


@contextlib.contextmanager
def open_closed_loop(
    kit: FleetRegistry,
    work: Path,
    candidate: Release,
    devices: int,
    *,
    classes: Sequence[DeviceClass] = CLASSES,
    store_url: str | None = None,
    canary_percent: float = 5.0,
) -> Iterator[ClosedLoop]:
    """1.0.0 installed and confirmed on ``devices`` devices, then 2.0.0 (as told) as a canary.

    ``kit`` must be a registry with nothing published yet.

    The registry is served by ``edgereg serve`` with the report store behind
    ``POST /v1/reports`` (SQLite in ``work`` unless ``store_url``), the report
    URL signed into the manifests; every device posts from 127.0.0.1, so the
    per-address rate limit is lifted.
    """
    from servekit import serve

    from edgereg.reports import open_store
    from edgereg.serve._ratelimit import RateLimiter

    # The first release already names where to report: a device reports an install
    # only to the URL of the manifest it installed from.
    kit.report_url = "v1/reports"
    kit.publish_bundle("1.0.0", percent=None)
    with open_store(store_url or f"sqlite:///{work}/reports.sqlite") as store:
        sink = ClosedLoop.make_sink(store, kit.clock)
        with serve(kit.storage, reports=sink, report_limiter=RateLimiter(1e6, 10**6)) as base_url:
            fleet = make_devices(devices, work / "devices", classes=classes)
            loop = ClosedLoop(kit, base_url, fleet, sink, {"2.0.0": candidate})
            loop.day()
            kit.clock.advance(1)
            kit.publish_bundle("2.0.0", percent=canary_percent)
            yield loop
