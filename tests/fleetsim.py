"""A reporting fleet in the world users live in: defaults, `--auto` every 30 minutes, a forger.

Used by tests/test_fleet_adversary.py (60 devices, every report over HTTP) and
benchmarks/canary.py (1,000 and 20,000 devices, a real-HTTP subset). What is
real: the registry (published through :meth:`edgereg.registry.Registry.publish`,
signed states and manifests), ``edgereg serve``'s report endpoint with its
default rate limit, source caps and admission checks (the server's own
``make_server``), the report store (SQLite), and ``rollout --auto``: the
command's own :func:`edgereg.registry.run_auto` over
:func:`edgereg.reports.canary.rollout_analysis` with the **default** policy and
guardrails (steps 5 → 25 → 50 → 100 %, 24 h soak, 50 devices per arm, ...).

What is simulated, and how:

* **time**: one :class:`~fleetkit.SimClock` for the registry, the server's
  received-at stamps and its limits (rate limit and source caps run on the
  simulated clock, so "200 new tokens per hour" means a simulated hour);
* **devices**: each has an install id, its own source address 127.x.y.2 (Linux
  routes all of 127.0.0.0/8 to loopback, so the server sees a host of its own,
  in a /24 of its own) and an hour of the day its app starts, once a day. At
  each start it reads the signed rollout state (the one the manifests derive
  from), picks its arm with the protocol's cohort rule, and reports as the
  reference client does: an install (self-test passed or failed, load time or
  load failure), a confirmation with its median inference time at the first
  start that does not crash, each start that crashes with its count of
  unconfirmed starts (report schema 2's ``unconfirmed_starts``, as it
  happens: the unconfirmed guardrail's stalls), a revert after three
  unconfirmed starts (the client's ``max_unconfirmed_starts``), and, at the
  first start after each new manifest sequence, the report of the release
  the manifest gives it again, under its token, installed or refused
  (docs/protocol.md §11: so each rollout period hears from every device that
  starts its app in it, in both arms, healthy or not);
* **tiers**: each device in one of the tiers (three by default, one of them
  3 % of the fleet), the release built for each;
* **behaviour**: per release, the share of devices whose probe fails, whose
  load fails, whose app crash-loops, and the latency (log-normal per device);
* **the forger** (:class:`Forger`): ``k`` /24 networks of its own, posting
  valid-looking reports of what the manifests serve (the current sequence,
  the arm and its version) from several addresses each, never more new
  tokens per network per simulated hour than the server's cap: forged
  candidate reverts, healthy candidate installs, or stable-arm reverts;
* **the report server's clock** may run behind the --auto host's
  (``serve_skew``).

Devices with ``http=True`` post over real HTTP from their own address;
the others are stored in-process with the source the server would give them
(a fleet of 20,000 posting over HTTP every half hour is a load test, not this).
"""

from __future__ import annotations

import http.client
import math
import random
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
for _path in (ROOT, ROOT / "tests"):  # benchmarks import this module by path
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from fleetkit import START, SimClock  # noqa: E402

from edgereg.config import RolloutPolicy  # noqa: E402
from edgereg.protocol.reports import LatencySummary, Report  # noqa: E402
from edgereg.protocol.rules import in_cohort  # noqa: E402
from edgereg.protocol.wire import RolloutState, to_bytes  # noqa: E402
from edgereg.registry import Registry, run_auto  # noqa: E402
from edgereg.registry import _registry as _registry_module  # noqa: E402
from edgereg.reports import open_store  # noqa: E402
from edgereg.reports.canary import rollout_analysis  # noqa: E402
from edgereg.serve import start_in_thread  # noqa: E402
from edgereg.serve._ratelimit import (  # noqa: E402
    DEFAULT_TOKENS_PER_SOURCE,
    source_key,
)
from edgereg.signing import Signer, TrustedKeys, generate_key  # noqa: E402
from edgereg.storage import open_storage  # noqa: E402

UNIT = "vision"
TIER = "high"
#: The fleet's tiers and their shares, by default: one of them tiny.
TIERS: tuple[tuple[str, float], ...] = (("high", 0.40), ("mid", 0.57), ("low", 0.03))
STABLE = "1.0.0"
CANDIDATE = "1.1.0"
LOOK = timedelta(minutes=30)
#: The client's default: starts without a confirmation before it reverts.
MAX_UNCONFIRMED_STARTS = 3


@dataclass(frozen=True)
class Behaviour:
    """How a release runs on the fleet (shares of devices; latencies in ms)."""

    probe_failure: float = 0.005
    load_failure: float = 0.005
    crash_loop: float = 0.02
    load_ms: float = 40.0
    inference_ms: float = 12.0
    spread: float = 0.35


GOOD = Behaviour()


@dataclass
class Device:
    """One simulated phone."""

    index: int
    device_id: str
    address: str
    start_hour: float
    http: bool
    tier: str = TIER
    # What it runs now: (version, arm, token); None before its first install.
    installed: tuple[str, str, str] | None = None
    unconfirmed: int = 0
    confirmed: bool = False
    bad: set[str] = field(default_factory=set)
    tokens: dict[str, str] = field(default_factory=dict)  # version -> its install token
    # Version -> the outcome keys of its latest report, and that report's sequence.
    reported: dict[str, dict[str, Any]] = field(default_factory=dict)
    reported_at: dict[str, int] = field(default_factory=dict)


def device_address(index: int) -> str:
    """Device ``index``'s own loopback address, in a /24 of its own (127.1.0.2, 127.1.1.2, ...)."""
    return f"127.{1 + index // 256}.{index % 256}.2"


def forger_address(network: int, host: int) -> str:
    """An address of the forger's ``network``-th /24 (127.250.0.0/16 and up: no device's)."""
    return f"127.{250 + network // 256}.{network % 256}.{2 + host % 250}"


@dataclass
class Forger:
    """An adversary posting fabricated reports from ``networks`` /24s of its own.

    Attributes:
        networks: Its source networks.
        kind: ``reverted`` (fail a good candidate), ``passes`` (healthy
            candidate installs that confirm, to dilute a bad one) or
            ``stable-reverted`` (stable-arm reverts, to mask a bad candidate).
        per_period: Forged devices it brings in each rollout period (at each
            step it starts again: the analysis counts reports since the step).
        per_address: Reports one address sends (under the per-address burst).
        sent: HTTP status -> count, of every forged report.
    """

    networks: int
    kind: Literal["reverted", "passes", "stable-reverted"]
    per_period: int
    per_address: int = 20
    sent: dict[int, int] = field(default_factory=dict)
    _queue: int = 0
    _period: int = -1
    _serial: int = 0

    def act(self, world: FleetWorld, state: RolloutState) -> None:
        """Post this half hour's share, never past the per-network token cap."""
        if state.candidate is None or state.paused or state.percent is None:
            return
        stable_arm = self.kind == "stable-reverted"
        if stable_arm and state.stable is None:
            return
        version = state.stable if stable_arm else state.candidate
        assert version is not None
        changed = state.last_change_at()
        period = int(changed.timestamp()) if changed else 0
        if period != self._period:
            self._period, self._queue = period, self.per_period
        # Half the hourly cap per network per half hour: inside the limit.
        budget = min(self._queue, self.networks * DEFAULT_TOKENS_PER_SOURCE // 2)
        for n in range(budget):
            network = n % self.networks
            self._serial += 1
            address = forger_address(network, self._serial // self.per_address)
            report = Report(
                token=f"{random.Random(f'forged:{self._serial}').getrandbits(128):032x}",
                unit=UNIT,
                model=UNIT,
                version=version,
                unit_version=version,
                variant=f"{world.tiers[-1]}-int8",
                # The tier where a network weighs most: the tiny one.
                tier=world.tiers[-1],
                arm="stable" if stable_arm else "candidate",
                sequence=state.sequence,
                probe="passed",
                backend="cpu",
                load_ms=GOOD.load_ms,
                confirmed=self.kind == "passes",
                reverted=self.kind != "passes",
                inference=LatencySummary(
                    count=50, p50_ms=GOOD.inference_ms, p90_ms=20.0, p99_ms=30.0
                )
                if self.kind == "passes"
                else None,
            )
            status = world.post(address, report)
            self.sent[status] = self.sent.get(status, 0) + 1
        self._queue -= budget


@dataclass
class Outcome:
    """How a simulated rollout ended."""

    result: str  # promoted, rolled back, paused, or "stuck at P%"
    days: float
    actions: list[tuple[float, str, str]]  # (day, action, reason) of every move
    reports: dict[int, int]  # HTTP status -> count, of the devices' reports sent over HTTP


class FleetWorld:
    """A registry, `edgereg serve` over it with a report store, a fleet, and the clock.

    Args:
        work: A scratch directory.
        devices: Fleet size (one tier).
        candidate: How the candidate behaves (the stable behaves as :data:`GOOD`).
        http_devices: How many devices (the first ones) post over HTTP; None: all.
        seed: For device ids, start hours and who fails.
        policy: The rollout policy; the default one unless told.
    """

    def __init__(
        self,
        work: Path,
        devices: int,
        candidate: Behaviour,
        *,
        http_devices: int | None = None,
        seed: int = 1,
        policy: RolloutPolicy | None = None,
        tiers: tuple[tuple[str, float], ...] = ((TIER, 1.0),),
        serve_skew: timedelta = timedelta(0),
    ) -> None:
        self.work = work
        self.candidate = candidate
        self.policy = policy or RolloutPolicy()
        self.seed = seed
        self.clock = SimClock(START)
        self.tiers = [name for name, _ in tiers]
        self.serve_skew = serve_skew
        rng = random.Random(seed)
        limit = devices if http_devices is None else http_devices
        self.devices = [
            Device(
                index,
                f"{rng.getrandbits(64):016x}",
                device_address(index),
                rng.random() * 24,
                index < limit,
                tier=rng.choices(self.tiers, weights=[share for _, share in tiers])[0],
            )
            for index in range(devices)
        ]
        self.statuses: dict[int, int] = {}
        self.storage = open_storage(f"file://{work / 'registry'}")
        self.private_pem, self.public_pem = generate_key()
        self.signer = Signer.from_pem(self.private_pem)
        self.trusted = TrustedKeys([self.signer.public_key])
        self.registry = Registry(self.storage, trusted=self.trusted, clock=self.clock)
        self._host: str | None = None
        self._state: RolloutState | None = None
        # The in-process devices' reports of one half hour, stored at its end in one batch.
        self._pending: list[tuple[Report, Any, str | None]] = []

    # -- the registry ----------------------------------------------------------------

    def publish(self, version: str, percent: float | None) -> None:
        from servekit import _release

        staging = self.work / "staging"
        staging.mkdir(parents=True, exist_ok=True)
        prepared, _ = _release(
            UNIT, version, dict.fromkeys(self.tiers, 2000), staging, seed=version
        )
        # The cohort's salt from the seed, not the registry's random one: the same seed,
        # the same cohort, the same rollout (a random salt made runs differ).
        salt = f"{random.Random(f'{self.seed}:salt:{version}').getrandbits(64):016x}"
        with mock.patch.object(_registry_module.secrets, "token_hex", return_value=salt):
            self._publish(prepared, percent)
        self._state = None

    def _publish(self, prepared: Any, percent: float | None) -> None:
        self.registry.publish(
            prepared,
            signer=self.signer,
            percent=percent,
            full=percent is None,
            actor="fleet",
            expires_days=365,
            report_url="v1/reports",
        )

    def state(self) -> RolloutState:
        if self._state is None:
            state, _ = self.registry.read_state(UNIT)
            assert state is not None
            self._state = state
        return self._state

    # -- reports -------------------------------------------------------------------

    def post(self, address: str, report: Report) -> int:
        """POST a report from ``address`` (a loopback address of its own) to the server."""
        assert self._host is not None
        host, port = self._host.rsplit(":", 1)
        conn = http.client.HTTPConnection(host, int(port), timeout=30, source_address=(address, 0))
        try:
            conn.request(
                "POST",
                "/v1/reports",
                body=to_bytes(report),
                headers={"Content-Type": "application/json"},
            )
            response = conn.getresponse()
            response.read()
            return response.status
        finally:
            conn.close()

    def _send(self, device: Device, report: Report) -> None:
        if device.http:
            status = self.post(device.address, report)
            self.statuses[status] = self.statuses.get(status, 0) + 1
        else:
            # Stamped by the report server's clock, as the server would.
            self._pending.append(
                (report, self.clock() - self.serve_skew, source_key(device.address))
            )

    def _report(self, device: Device, version: str, arm: str, **outcome: Any) -> None:
        token = device.tokens.setdefault(
            version,
            f"{random.Random(f'{self.seed}:{device.device_id}:{version}').getrandbits(128):032x}",
        )
        state = self.state()
        # The report kept for the periods after (its outcome keys, not its latency).
        kept = {k: v for k, v in outcome.items() if k != "inference"}
        device.reported[version] = {**device.reported.get(version, {}), **kept}
        device.reported_at[version] = state.sequence
        self._send(
            device,
            # Report schema 2 when an outcome holds one of its keys (unconfirmed_starts).
            Report.versioned(
                token=token,
                unit=UNIT,
                model=UNIT,
                version=version,
                unit_version=version,
                variant=f"{device.tier}-int8",
                tier=device.tier,
                arm=arm,  # type: ignore[arg-type]
                sequence=state.sequence,
                **outcome,
            ),
        )

    # -- devices -------------------------------------------------------------------

    def behaviour(self, version: str) -> Behaviour:
        return self.candidate if version == CANDIDATE else GOOD

    def _draw(self, device: Device, version: str, what: str) -> float:
        return random.Random(f"{self.seed}:{what}:{version}:{device.device_id}").random()

    def _latency(self, device: Device, version: str, what: str, median: float) -> float:
        rng = random.Random(f"{self.seed}:{what}:{version}:{device.device_id}")
        return round(rng.lognormvariate(math.log(median), self.behaviour(version).spread), 3)

    def _assigned(self, device: Device, state: RolloutState) -> tuple[str, str] | None:
        """The release the manifest gives the device, before its own refusals."""
        if (
            state.candidate is not None
            and not state.paused
            and state.salt is not None
            and state.percent is not None
            and in_cohort(device.device_id, state.salt, state.percent)
        ):
            return state.candidate, "candidate"
        if state.stable is not None:
            return state.stable, "stable"
        return None

    def app_start(self, device: Device) -> None:
        """The app starts: count the start, check for an update, report, then run (or crash)."""
        state = self.state()
        if device.installed is not None and not device.confirmed:
            # app_started: a start against an unconfirmed install counts, and the client
            # reports it as it happens (the unconfirmed guardrail's stall); the count
            # reaching max_unconfirmed_starts is a revert to the last good.
            version, arm, _ = device.installed
            device.unconfirmed += 1
            reverted = device.unconfirmed >= MAX_UNCONFIRMED_STARTS
            self._report(
                device,
                version,
                arm,
                **self._install_keys(device, version),
                unconfirmed_starts=device.unconfirmed,
                reverted=reverted,
            )
            if reverted:
                device.bad.add(version)
                device.installed = None
        assigned = self._assigned(device, state)
        if assigned is None:
            return
        version, arm = assigned
        if version in device.bad:
            # Refused here (rejected or reverted): its report again in each new period, as
            # it was; the device falls back to the stable.
            self._period(device, version, arm, running=False)
            if arm == "candidate" and state.stable is not None and state.stable not in device.bad:
                version, arm = state.stable, "stable"
            else:
                return
        if device.installed is None or device.installed[0] != version:
            behaviour = self.behaviour(version)
            if version not in device.reported:
                if self._draw(device, version, "probe") < behaviour.probe_failure:
                    device.bad.add(version)
                    self._report(device, version, arm, probe="failed")
                    return
                if self._draw(device, version, "load") < behaviour.load_failure:
                    device.bad.add(version)
                    self._report(device, version, arm, probe="failed", load_failed=True)
                    return
            device.installed = (version, arm, "")
            device.unconfirmed, device.confirmed = 0, False
            self._report(device, version, arm, **self._install_keys(device, version))
        else:
            self._period(device, version, arm, running=True)
        if device.confirmed:
            return
        if self._draw(device, version, "crash") < self.behaviour(version).crash_loop:
            return  # crashed before the model's first inference: counted at the next start
        device.confirmed = True
        self._confirmed_report(device, version, arm)

    def _install_keys(self, device: Device, version: str) -> dict[str, Any]:
        behaviour = self.behaviour(version)
        return {
            "probe": "passed",
            "backend": "cpu",
            "load_ms": self._latency(device, version, "load", behaviour.load_ms),
        }

    def _period(self, device: Device, version: str, arm: str, *, running: bool) -> None:
        """A new manifest sequence: the release's latest report again (docs/protocol.md §11)."""
        if device.reported_at.get(version, self.state().sequence) >= self.state().sequence:
            return
        keys = dict(device.reported[version])
        if running and device.confirmed:
            p50 = self._latency(device, version, "inference", self.behaviour(version).inference_ms)
            keys["inference"] = LatencySummary(
                count=50, p50_ms=p50, p90_ms=p50 * 1.5, p99_ms=p50 * 2
            )
        self._report(device, version, arm, **keys)

    def _confirmed_report(self, device: Device, version: str, arm: str) -> None:
        behaviour = self.behaviour(version)
        p50 = self._latency(device, version, "inference", behaviour.inference_ms)
        self._report(
            device,
            version,
            arm,
            probe="passed",
            backend="cpu",
            load_ms=self._latency(device, version, "load", behaviour.load_ms),
            confirmed=True,
            inference=LatencySummary(count=50, p50_ms=p50, p90_ms=p50 * 1.5, p99_ms=p50 * 2),
        )

    # -- the run -------------------------------------------------------------------

    @contextmanager
    def running(self) -> Iterator[FleetWorld]:
        """The stable published and installed everywhere, the server up, the candidate at 5 %."""
        seconds = lambda: (self.clock() - START).total_seconds()  # noqa: E731
        with open_store(f"sqlite:///{self.work}/reports.sqlite") as store:
            self.store = store
            self.publish(STABLE, None)
            server, base_url = start_in_thread(
                self.storage,
                reports=store,
                trusted=lambda: self.trusted,
                # The report server's clock, behind the --auto host's by serve_skew.
                clock=lambda: self.clock() - self.serve_skew,
                monotonic=seconds,
            )
            self._host = base_url.removeprefix("http://")
            try:
                # A day on the stable release: every device installs it and reports.
                self.advance(timedelta(days=1), auto=False)
                self.publish(CANDIDATE, self.policy.steps[0])
                yield self
            finally:
                server.close()

    def advance(
        self, span: timedelta, *, auto: bool = True, forger: Forger | None = None
    ) -> list[tuple[float, str, str]]:
        """Let ``span`` pass in half hours: apps start, the forger posts, `--auto` looks."""
        moves = []
        end = self.clock() + span
        while self.clock() < end:
            before = self.clock()
            self.clock.now = before + LOOK
            low = (before - START).total_seconds() / 3600 % 24
            high = low + LOOK.total_seconds() / 3600
            for device in self.devices:
                if low < device.start_hour <= high:
                    self.app_start(device)
            if self._pending:
                self.store.ingest_many(self._pending)
                self._pending = []
            # edgereg serve marks its clock in the store every minute; here each half hour.
            self.store.mark_clock(self.clock() - self.serve_skew)
            if forger is not None:
                forger.act(self, self.state())
            if auto:
                decision = self.auto()
                if decision.changes_state:
                    day = (self.clock() - START).total_seconds() / 86400
                    moves.append((day, decision.action, decision.reason))
                    if decision.action != "step":
                        break
        return moves

    def auto(self) -> Any:
        """``edgereg rollout vision --auto``: the command's workflow on the simulated clock."""
        policy = self.policy
        result = run_auto(
            self.registry,
            UNIT,
            policy=policy,
            analyse=lambda state, now: rollout_analysis(
                self.store, state, guardrails=policy.guardrails, tiers=self.tiers, now=now
            ),
            now=self.clock(),
            signers=lambda: self.signer,
            actor="cron",
            expires_days=365,
        )
        self.last = result
        if result.decision.changes_state:
            self._state = None
        return result.decision

    def rollout(self, days: float, forger: Forger | None = None) -> Outcome:
        """Run ``--auto`` every 30 minutes until it promotes, halts, or ``days`` pass."""
        start = self.clock()
        moves = self.advance(timedelta(days=days), forger=forger)
        state = self.state()
        days_run = (self.clock() - start).total_seconds() / 86400
        if moves and moves[-1][1] != "step":
            result = {"promote": "promoted", "rollback": "rolled back", "pause": "paused"}[
                moves[-1][1]
            ]
        else:
            result = f"stuck at {state.percent:g}%"
        return Outcome(result, days_run, moves, dict(self.statuses))
