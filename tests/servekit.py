"""Helpers for tests (and benchmarks) that talk HTTP to `edgereg serve`.

* :func:`serve` / the ``serve_registry`` fixture: start a server over an
  existing registry (a directory, a URL or a Storage) on a free loopback
  port and give back its base URL; the server is stopped after the test.
* :func:`make_registry`: publish small releases through the library
  (edgereg.registry.Registry.publish with blobs of random bytes): two models,
  three tiers, a stable and a canary, a real signed history. No MNN needed.

Use them from a test module::

    from servekit import make_registry, serve_registry  # noqa: F401 (fixture)

    def test_x(serve_registry, tmp_path):
        reg = make_registry(tmp_path / "registry")
        base_url = serve_registry(reg.root)
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # benchmarks import this module by path
    sys.path.insert(0, str(ROOT))

from edgereg.config import RuntimeHints  # noqa: E402
from edgereg.protocol.wire import Metrics, ReleaseRecord, ReleaseVariant  # noqa: E402
from edgereg.registry import PreparedRelease, Registry  # noqa: E402
from edgereg.registry import _transitions as transitions  # noqa: E402
from edgereg.serve import RegistryServer, start_in_thread  # noqa: E402
from edgereg.signing import Signer, generate_key  # noqa: E402
from edgereg.storage import Storage, open_storage  # noqa: E402

TIERS = ("high", "mid", "low")
# The serve command alone, without the group: the same code `edgereg serve` runs.
SERVE_CMD = [sys.executable, "-c", "from edgereg.cli.serve import serve_command; serve_command()"]
NOW = datetime(2025, 1, 31, 12, 0, tzinfo=timezone.utc)


@contextlib.contextmanager
def serve(registry: Storage | str | os.PathLike[str], **options: Any) -> Iterator[str]:
    """Serve ``registry`` on a free loopback port for a ``with`` block; yields the base URL."""
    server, base_url = start_in_thread(registry, **options)
    try:
        yield base_url
    finally:
        server.close()


@contextlib.contextmanager
def serve_process(log: Path, *args: str, cwd: Path | None = None) -> Iterator[tuple[Any, str]]:
    """Run the `edgereg serve` command in a child process on a free port.

    Yields (process, base URL); the process is killed after the block if it
    still runs. ``args`` are command-line options (``--registry DIR`` ...).
    ``cwd``: where it runs, the log's directory by default, never the
    repository (whose models.toml would pin its trusted keys and default
    report store on the server, and leave files in the checkout).
    """
    cwd = cwd if cwd is not None else log.parent
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*SERVE_CMD, "--port", "0", *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=cwd,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            found = re.search(r" on (http://[0-9.:]+) ", log.read_text(errors="replace"))
            if found:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"edgereg serve did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield proc, found.group(1)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def peak_rss(pid: int) -> int:
    """The peak resident set size of a running process, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/<pid>/status")  # pragma: no cover


def current_rss(pid: int) -> int:
    """The resident set size of a running process now, in bytes (Linux)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/<pid>/status")  # pragma: no cover


@pytest.fixture
def serve_registry() -> Iterator[Callable[..., str]]:
    """A function ``serve_registry(registry, **options) -> base_url``; servers stop after the test.

    ``registry`` is a directory, a registry URL or a Storage; options are
    those of :func:`edgereg.serve.make_server` (``manifest_max_age``, ``timeout``).
    """
    servers: list[RegistryServer] = []

    def start(registry: Storage | str | os.PathLike[str], **options: Any) -> str:
        server, base_url = start_in_thread(registry, **options)
        servers.append(server)
        return base_url

    yield start
    for server in servers:
        server.close()


@dataclass
class Blob:
    digest: str
    data: bytes


@dataclass
class FakeRegistry:
    """What :func:`make_registry` published."""

    root: Path | None
    storage: Storage
    signer: Signer
    # (model, version) -> tier -> blob
    blobs: dict[tuple[str, str], dict[str, Blob]] = field(default_factory=dict)

    @property
    def registry(self) -> Registry:
        return Registry(self.storage)

    def blob(self, model: str = "digits", version: str = "1.1.0", tier: str = "high") -> Blob:
        return self.blobs[(model, version)][tier]


def _release(
    model: str,
    version: str,
    sizes: dict[str, int],
    workdir: Path,
    *,
    seed: str,
    metrics: Metrics | None = None,
) -> tuple[PreparedRelease, dict[str, Blob]]:
    variants: dict[str, ReleaseVariant] = {}
    files: dict[str, Path] = {}
    made: dict[str, Blob] = {}
    for tier, size in sizes.items():
        # Deterministic pseudo-random bytes, different per model/version/tier.
        data = hashlib.shake_256(f"{seed}:{model}:{version}:{tier}".encode()).digest(size)
        digest = hashlib.sha256(data).hexdigest()
        path = workdir / f"{digest}.mnn"
        path.write_bytes(data)
        files[digest] = path
        made[tier] = Blob(digest, data)
        variants[f"{tier}-int8"] = ReleaseVariant(
            tier=tier,
            sha256=digest,
            size=size,
            metrics={"accuracy": 0.97, "size_bytes": size},
            provenance={"builder": "servekit", "source_sha256": "0" * 64},
            min_mnn_runtime="3.6.1",
            runtime=RuntimeHints(threads=2 if tier == "low" else 4),
        )
    record = ReleaseRecord(
        model=model,
        version=version,
        created=NOW,
        variants=variants,
        tiers={tier: f"{tier}-int8" for tier in sizes},
        metrics=metrics,
    )
    return PreparedRelease(record=record, blobs=files), made


def make_registry(
    where: Path | Storage,
    *,
    models: tuple[str, ...] = ("digits", "sensor"),
    sizes: dict[str, int] | None = None,
    actor: str = "release-bot@ci",
    workdir: Path | None = None,
    expires_days: int = 3650,
    metrics: Metrics | None = None,
) -> FakeRegistry:
    """Publish, for each model, 1.0.0 (stable, published --full) and 1.1.0 (a 5% canary).

    Args:
        where: A registry directory (created) or a Storage (e.g. S3).
        models: Model names.
        sizes: Blob size per tier (bytes); default high 300 KB, mid 120 KB, low 40 KB.
        actor: Who the history says acted (kept in the signed history, never on the status page).
        workdir: Where the blob files are staged (default: next to the registry).
        expires_days: Validity of the signed state and manifests.
        metrics: The app metrics every release declares (none by default).
    """
    sizes = sizes or {"high": 300_000, "mid": 120_000, "low": 40_000}
    if isinstance(where, Storage):
        storage, root = where, None
        staging = workdir or Path(os.environ.get("TMPDIR", "/tmp"))
    else:
        storage, root = open_storage(str(where)), where
        staging = workdir or where.parent / f"{where.name}-staging"
    staging.mkdir(parents=True, exist_ok=True)
    signer = Signer.from_pem(generate_key()[0])
    clock = iter(NOW + timedelta(hours=hour) for hour in range(1000))
    registry = Registry(storage, clock=lambda: next(clock))
    fake = FakeRegistry(root, storage, signer)
    for model in models:
        for version in ("1.0.0", "1.1.0"):
            prepared, made = _release(model, version, sizes, staging, seed=version, metrics=metrics)
            fake.blobs[(model, version)] = made
            registry.publish(
                prepared,
                signer=signer,
                percent=None if version == "1.0.0" else 5.0,
                full=version == "1.0.0",
                actor=actor,
                expires_days=expires_days,
            )
            # A first --full release is stable already; older edgereg needed a promote.
            if version == "1.0.0" and registry.read_state(model)[0].candidate:  # type: ignore[union-attr]
                registry.change(
                    model,
                    lambda state, now, expires, model=model: transitions.promote(
                        state, model, now=now, expires=expires, actor=actor
                    ),
                    signer=signer,
                    expires_days=expires_days,
                )
    return fake
