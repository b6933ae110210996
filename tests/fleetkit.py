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

import math
import random
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
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
from edgereg.registry import Registry, prepare_bundle_release  # noqa: E402
from edgereg.registry._transitions import promote, set_percent  # noqa: E402
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
"""The default fleet mix, drawn uniformly: a quarter of high-tier... devices per class."""


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
        self.registry.publish(
            prepared,
            signer=self.signer,
            percent=percent,
            full=percent is None,
            actor="fleet",
            expires_days=self.expires_days,
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
    "Device",
    "DeviceClass",
    "DeviceProbeFailed",
    "Fleet",
    "FleetRegistry",
    "HostOutputs",
    "ProbeLedger",
    "SimClock",
    "build_bundle_project",
    "device_self_test",
    "latencies",
    "make_devices",
    "set_member_versions",
]
