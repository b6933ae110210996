"""A mixed fleet: Python, JVM and Swift devices, each kind played by ONE long-lived device program.

tests/test_fleet_mix.py drives it. Every client kind runs one device program
(docs/reference/device-program.md, started by tests/devicekit.py) that plays
many devices in turn: each ``configure`` gives it the device's own cache
directory, install id, tier facts, device class and self-test runner (the
host MNN runner, with ``--faulty opencl`` on a device whose GPU miscomputes),
and the cache directory persists across configures, as a phone's does across
app restarts. The kinds run side by side (one thread per program); within a
kind, devices take turns.

What is simulated is only what a host cannot be: the device (its facts, its
GPU's fault, an app that crash-loops on a release) and time: one
:class:`~fleetkit.SimClock` signs the registry's states, is every device's
fixed clock (``configure``'s ``now``) and stamps the reports the server
stores (:class:`ClockedStore`), so the soak days of ``rollout --auto`` pass
at once. The self-tests' host MNN runners are shared by fault set
(:class:`SharedRunners`).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from devicekit import DeviceProgram, hostrunner
from fleetkit import SimClock

from edgereg.protocol.reports import Report
from edgereg.reports import ReportStore

KINDS = ("python", "jvm", "swift")
#: The built project's [tiers] (tests/buildkit.py), best first, and facts that resolve to each.
TIER_RULES = {
    "high": {"min_ram_mb": 6144, "min_cpu_cores": 8},
    "mid": {"min_ram_mb": 3072},
    "low": {},
}
FACTS = {"high": (8192, 8), "mid": (4096, 6), "low": (2048, 4)}
#: Every backend a runtime hint may name: a broken device miscomputes on each.
ALL_BACKENDS = ("cpu", "opencl", "vulkan", "metal", "opengl", "nnapi", "coreml")


@dataclass(frozen=True)
class MixDevice:
    """One simulated phone, played by its kind's device program."""

    kind: str
    device_id: str
    tier: str
    cache_dir: Path
    faulty_gpu: bool = False

    @property
    def device_class(self) -> str:
        """Coarse and per kind, so the report store says which client each report came from."""
        return f"{self.kind}-{'mali' if self.faulty_gpu else 'adreno'}"


def make_mix(
    per_kind: int,
    where: Path,
    *,
    kinds: Sequence[str] = KINDS,
    tiers: Sequence[str] = ("high", "mid", "low"),
    faulty_every: int = 2,
    seed: int = 17,
    ids: Sequence[str] | None = None,
) -> list[MixDevice]:
    """``per_kind`` devices of each kind: the same install ids, tiers and GPUs on every kind.

    The j-th device of every kind has the same install id (each kind its own
    cache directory), so the cohort rule puts it in the same arm whatever
    client plays it and the kinds' outcomes compare one to one. It is in
    ``tiers[j % len(tiers)]``; every ``faulty_every``-th high-tier device
    (counting from the second) has a faulty GPU. Install ids are seeded random
    hex, as an app's would be, unless given as ``ids``.
    """
    if ids is None:
        rng = random.Random(seed)
        ids = [f"{rng.getrandbits(64):016x}" for _ in range(per_kind)]
    layout = []
    high_seen = 0
    for j, device_id in enumerate(ids):
        tier = tiers[j % len(tiers)]
        faulty = False
        if tier == "high":
            faulty = high_seen % faulty_every == 1
            high_seen += 1
        layout.append((device_id, tier, faulty))
    return [
        MixDevice(kind, device_id, tier, where / kind / device_id, faulty)
        for kind in kinds
        for device_id, tier, faulty in layout
    ]


#: The runner command a device's client starts: a pipe between its stdin/stdout and a Unix
#: socket (python -S: no site packages, so it starts in milliseconds, not MNN's seconds).
RELAY = """
import socket, sys, threading
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
def up():
    for line in sys.stdin.buffer:
        s.sendall(line)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
out = sys.stdout.buffer
while True:
    data = s.recv(65536)
    if not data:
        break
    out.write(data); out.flush()
"""


class SharedRunners:
    """One long-lived host MNN runner per fault set, shared by every simulated device.

    A device's ``runner.command`` is a relay to the runner of its fault set
    (healthy, ``--faulty opencl``, every backend faulty), so a hundred
    self-tests cost a hundred relay starts, not a hundred MNN imports: on a
    loaded two-core host that is most of a fleet run. The runner is the real
    tests/hostrunner.py; it names sessions with a counter, so devices of
    three kinds can share it, one request at a time (a lock per runner).
    """

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="mix-runners-")
        self._runners: dict[tuple[str, ...], tuple[subprocess.Popen[bytes], threading.Lock]] = {}
        self._servers: list[socket.socket] = []
        self._guard = threading.Lock()

    def command(self, faulty: Sequence[str]) -> list[str]:
        """The runner command for a device whose backends in ``faulty`` miscompute."""
        key = tuple(sorted(faulty))
        with self._guard:
            if key not in self._runners:
                process = subprocess.Popen(
                    hostrunner(faulty=key), stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
                self._runners[key] = (process, threading.Lock())
                path = os.path.join(self._dir, f"{len(self._servers)}.sock")
                server = socket.socket(socket.AF_UNIX)
                server.bind(path)
                server.listen(16)
                self._servers.append(server)
                threading.Thread(target=self._accept, args=(server, key), daemon=True).start()
            path = os.path.join(self._dir, f"{list(self._runners).index(key)}.sock")
        return [sys.executable, "-S", "-c", RELAY, path]

    def _accept(self, server: socket.socket, key: tuple[str, ...]) -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._pipe, args=(conn, key), daemon=True).start()

    def _pipe(self, conn: socket.socket, key: tuple[str, ...]) -> None:
        process, lock = self._runners[key]
        assert process.stdin is not None
        assert process.stdout is not None
        with conn, conn.makefile("rb") as lines:
            for line in lines:
                if not line.strip():
                    continue
                with lock:  # one request, one answer line: never interleaved
                    process.stdin.write(line.rstrip(b"\n") + b"\n")
                    process.stdin.flush()
                    answer = process.stdout.readline()
                if not answer:
                    return
                conn.sendall(answer)

    def close(self) -> None:
        for server in self._servers:
            server.close()
        for process, _ in self._runners.values():
            with contextlib.suppress(OSError):
                if process.stdin is not None:
                    process.stdin.close()
            process.wait(timeout=30)
        self._runners.clear()
        shutil.rmtree(self._dir, ignore_errors=True)


class ClockedStore:
    """The server's report store, each report stamped with the simulated clock on arrival."""

    def __init__(self, store: ReportStore, clock: SimClock) -> None:
        self.store = store
        self.sim_clock = clock

    def ingest(self, report: Report, received_at: datetime) -> None:
        self.store.ingest(report, self.sim_clock())

    def __getattr__(self, name: str) -> Any:
        # Everything but ingest reads the real store, whatever the analysis asks of it.
        return getattr(self.store, name)


@dataclass
class MixFleet:
    """The three device programs and the devices they play, against one server URL."""

    programs: Mapping[str, DeviceProgram]
    devices: list[MixDevice]
    url: str
    pem: str
    clock: SimClock
    unit: str
    max_unconfirmed_starts: int = 2
    # A device whose kernels miscompute on every backend (its runner: every backend faulty).
    broken: set[str] = field(default_factory=set)
    runners: SharedRunners | None = None

    def configure(self, device: MixDevice) -> dict[str, Any]:
        """Switch the kind's program to ``device`` (a later configure replaces the client)."""
        ram_mb, cores = FACTS[device.tier]
        faulty: Sequence[str] = ()
        if device.device_id in self.broken:
            faulty = ALL_BACKENDS
        elif device.faulty_gpu:
            faulty = ("opencl",)
        runner = hostrunner(faulty=faulty) if self.runners is None else self.runners.command(faulty)
        program = self.programs[device.kind]
        return program.request(
            "configure",
            registry=self.url,
            trusted_keys=[self.pem],
            cache_dir=str(device.cache_dir),
            unit=self.unit,
            bundle=True,
            device={
                "device_id": device.device_id,
                "ram_mb": ram_mb,
                "cpu_cores": cores,
                "soc": None,
                "os": "android" if device.kind != "swift" else "ios",
                "os_version": "14",
                "mnn_runtime": "3.6.1",
            },
            app_version="2.4.0",
            tier=None,
            tiers=[{"name": name, "rules": rules} for name, rules in TIER_RULES.items()],
            self_test=True,
            runner={"command": runner},
            reporting=True,
            device_class=device.device_class,
            max_unconfirmed_starts=self.max_unconfirmed_starts,
            policy={"allow_metered": True, "require_charging": False, "reserve_bytes": 8388608},
            timeout_s=30,
            deadline_s=300,
            min_rate=1024,
            bundled=None,
            source_address=None,
            now=self.clock().isoformat().replace("+00:00", "Z"),
        )

    def each_kind(self, work: Callable[[str, list[MixDevice]], Any]) -> dict[str, Any]:
        """``work(kind, its devices)`` for the three kinds at once (one thread per program)."""
        with ThreadPoolExecutor(len(self.programs)) as pool:
            futures = {kind: pool.submit(work, kind, self.of(kind)) for kind in self.programs}
            return {kind: future.result() for kind, future in futures.items()}

    def join(
        self,
        per_kind: int,
        *,
        seed: int,
        inside: Callable[[str], bool],
        each_arm: int = 0,
        stable_arm: bool = True,
    ) -> None:
        """New phones install the app: ``per_kind`` fresh devices of each kind, same layout.

        ``inside(device_id)`` is the cohort rule at the current percent; at
        least ``each_arm`` of the newcomers fall inside it and, when there is a
        ``stable_arm`` (below 100 %), ``each_arm`` outside (seeded ids drawn
        until both are met), so every arm of a step has reports whatever salt
        the publish drew.
        """
        rng = random.Random(seed)
        draws = [f"{rng.getrandbits(64):016x}" for _ in range(per_kind)]

        def short() -> bool:
            ins = sum(inside(i) for i in draws)
            return ins < each_arm or (stable_arm and len(draws) - ins < each_arm)

        while short():
            draws.append(f"{rng.getrandbits(64):016x}")
        ins = [i for i in draws if inside(i)]
        outs = [i for i in draws if not inside(i)]
        picked = ins[:each_arm] + outs[:each_arm]
        picked += [i for i in draws if i not in picked][: per_kind - len(picked)]
        where = self.devices[0].cache_dir.parent.parent
        tiers = list(dict.fromkeys(d.tier for d in self.devices))
        kinds = list(self.programs)
        self.devices += make_mix(per_kind, where, kinds=kinds, tiers=tiers, ids=picked)

    def of(self, kind: str) -> list[MixDevice]:
        return [d for d in self.devices if d.kind == kind]


def installed_set(result: Mapping[str, Any]) -> dict[str, str]:
    """Member -> version of a device program Result (or a status's ``installed``)."""
    return {name: member["version"] for name, member in sorted(result["members"].items())}


def store_rows(database: Path, unit: str) -> Iterator[dict[str, Any]]:
    """Every report row the server's SQLite store holds for ``unit``, as dicts.

    Read straight from the store's file: its summaries add every device class
    up, and the per-kind outcome is what this fleet checks.
    """
    conn = sqlite3.connect(database)
    try:
        conn.row_factory = sqlite3.Row
        for row in conn.execute("SELECT * FROM reports WHERE unit = ?", (unit,)):
            yield dict(row)
    finally:
        conn.close()
