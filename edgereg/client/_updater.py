"""The client's I/O shell: fetch manifests and blobs, keep the cache, install atomically.

Trust decisions are not made here but in :mod:`edgereg.client._trust`; this
module moves bytes and records what the pure core accepted.

Cache directory layout (one client at a time per directory)::

    blobs/<sha256>              verified blobs, written once (os.replace from .part)
    blobs/<sha256>.part         an interrupted download, resumed with Range
    state/<model>/<tier>.json   last accepted manifest bytes, its ETag, and the
                                highest sequence seen (rollback protection)
    installed.json              model -> the installed blob, version, variant, hints

Every file is written to a temporary file in the same directory and renamed
into place, so a crash or a full disk never leaves half a file where a reader
looks. A blob is only ever renamed into ``blobs/`` after its size and sha256
matched the signed manifest.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import errno
import http.client
import json
import logging
import os
import re
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import TypeAdapter, ValidationError

from edgereg import __version__
from edgereg._files import atomic_write as write_whole
from edgereg.client._trust import (
    MAX_MANIFEST_BYTES,
    BlobCheck,
    Decision,
    Malformed,
    Rejected,
    compare_versions,
    decide,
)
from edgereg.config import Name, RuntimeHints, TierRules
from edgereg.errors import EdgeregError, TransportError, TrustError
from edgereg.protocol import layout
from edgereg.rollout import DeviceProfile, resolve_tier
from edgereg.signing import TrustedKeys, key_id, load_public_key, strict_json_loads
from edgereg.wire import ManifestEntry

__all__ = [
    "CacheError",
    "Client",
    "FetchResult",
    "Fetcher",
    "Limits",
    "ManifestNotFound",
    "manifest_path",
    "open_fetcher",
    "unsafe_registry_keys",
]

CHUNK = 64 * 1024
_log = logging.getLogger("edgereg.client")
USER_AGENT = f"edgereg/{__version__}"
_NAME: TypeAdapter[str] = TypeAdapter(Name)


manifest_path = layout.manifest_path


class ManifestNotFound(TransportError):
    """The registry has no manifest for this model and tier: a wrong name, not a blip."""

    exit_code = 2


class CacheError(EdgeregError):
    """The client's cache directory cannot be read or written (disk full, permissions).

    Attributes:
        errno: The operating system's error number, if there was one.
    """

    exit_code = 11

    def __init__(self, message: str, *, errno: int | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.errno = errno


# --- transport: one public method, one error type ---------------------------------


@dataclass(frozen=True)
class Limits:
    """How long and how slowly a server may keep the client waiting.

    Attributes:
        timeout: Seconds for connecting, for each read, and for the response
            headers of each request.
        deadline: Seconds for a whole :meth:`Client.fetch` (manifest and blob
            together): a server that trickles bytes is cut off here.
        min_rate: Bytes per second a body must average over each ``timeout``
            window (a real manifest arrives in one read; a blob at far more).
    """

    timeout: float = 30.0
    deadline: float = 600.0
    min_rate: int = 1024

    def __post_init__(self) -> None:
        for name in ("timeout", "deadline"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 < value < float("inf")):
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if (
            isinstance(self.min_rate, bool)
            or not isinstance(self.min_rate, int)
            or self.min_rate < 0
        ):
            raise ValueError(
                f"min_rate must be a whole number of bytes/s >= 0, got {self.min_rate!r}"
            )


class _Watchdog:
    """Shuts a connection's socket down when a time limit passes.

    A socket timeout bounds one read; a server sending one byte a second
    never trips it. This bounds the headers of a request and the whole fetch.
    """

    def __init__(self, connection: http.client.HTTPConnection) -> None:
        self._connection = connection
        self._timer: threading.Timer | None = None
        self.fired: str | None = None

    def arm(self, at: float, what: str) -> None:
        """Cut the connection at monotonic time ``at``; ``what`` names the limit."""
        self.cancel()
        self._timer = threading.Timer(max(0.0, at - time.monotonic()), self._fire, (what,))
        self._timer.daemon = True
        self._timer.start()

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _fire(self, what: str) -> None:
        self.fired = what
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Response:
    """An open response: status, validators and a body to read in chunks."""

    url: str
    status: int
    etag: str | None = None
    length: int | None = None
    range_start: int | None = None
    _read: Callable[[int], bytes] = field(default=lambda n: b"", repr=False)
    _close: Callable[[], None] = field(default=lambda: None, repr=False)
    min_rate: int = 0
    """Bytes/s the body must average over each ``rate_window`` seconds."""
    rate_window: float = 30.0
    watchdog: _Watchdog | None = field(default=None, repr=False)
    _window_start: float = field(default_factory=time.monotonic, repr=False)
    _window_bytes: int = field(default=0, repr=False)

    def read(self, size: int) -> bytes:
        """Read up to ``size`` bytes, as many as have arrived; b"" at the end.

        Raises:
            TransportError: the connection failed or timed out, the fetch
                passed its deadline, or the body arrives slower than ``min_rate``.
        """
        try:
            chunk = self._read(size)
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise self._failure(exc) from exc
        if self.watchdog is not None and self.watchdog.fired:
            raise self._failure(None)
        self._check_rate(len(chunk))
        return chunk

    def _check_rate(self, received: int) -> None:
        if not self.min_rate:
            return
        self._window_bytes += received
        elapsed = time.monotonic() - self._window_start
        if elapsed < self.rate_window:
            return
        if self._window_bytes < self.min_rate * elapsed:
            raise TransportError(
                f"{self.url} sent {self._window_bytes} bytes in {elapsed:.0f} s, slower than "
                f"the minimum of {self.min_rate} bytes/s; gave up",
                url=self.url,
                hint="A slow or hostile server; the next fetch tries again (a blob resumes).",
            )
        self._window_start, self._window_bytes = time.monotonic(), 0

    def _failure(self, exc: BaseException | None) -> TransportError:
        if self.watchdog is not None and self.watchdog.fired:
            return TransportError(
                f"reading {self.url}: {self.watchdog.fired}; gave up",
                url=self.url,
                hint="A slow or hostile server; the next fetch tries again (a blob resumes).",
            )
        assert exc is not None
        return TransportError(f"reading {self.url} failed: {_describe(exc)}", url=self.url)

    def close(self) -> None:
        """Release the connection or file."""
        if self.watchdog is not None:
            self.watchdog.cancel()
        with contextlib.suppress(OSError, http.client.HTTPException):
            self._close()

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Fetcher(abc.ABC):
    """Gets registry paths. :meth:`open` is the one guard: every failure is a TransportError.

    Implementations write only :meth:`_open`.
    """

    def __init__(self, base_url: str, *, timeout: float, limits: Limits | None = None) -> None:
        self.base_url = base_url if base_url.endswith("/") else base_url + "/"
        self.limits = limits or Limits(timeout=timeout)
        self.timeout = self.limits.timeout
        self._deadline_at: float | None = None

    def start_deadline(self) -> None:
        """Start the clock of one whole fetch (:attr:`Limits.deadline` from now)."""
        self._deadline_at = time.monotonic() + self.limits.deadline

    def _deadline(self) -> float:
        return self._deadline_at if self._deadline_at is not None else float("inf")

    def url(self, path: str) -> str:
        """The absolute URL of a registry path."""
        return self.base_url + urllib.parse.quote(path)

    def open(self, path: str, *, etag: str | None = None, start: int = 0) -> Response:
        """Request a registry path.

        Args:
            path: Relative to the registry root, like ``manifests/digits/high.json``.
            etag: Send ``If-None-Match``; a match answers status 304 with no body.
            start: Ask for the bytes from this offset on (``Range: bytes=N-``);
                the response is 206 when honoured, 200 (the whole body) when
                not, or 416 when the offset is past the end.

        Raises:
            TransportError: unreachable, timed out, or an error status.
        """
        url = self.url(path)
        if time.monotonic() >= self._deadline():
            raise TransportError(
                f"cannot fetch {url}: the fetch passed its deadline of {self.limits.deadline:g} s",
                url=url,
            )
        try:
            return self._open(url, etag, start)
        except TransportError:
            raise
        except (OSError, http.client.HTTPException, ValueError) as exc:
            raise TransportError(f"cannot fetch {url}: {_describe(exc)}", url=url) from exc

    @abc.abstractmethod
    def _open(self, url: str, etag: str | None, start: int) -> Response:
        """Open ``url``; may raise OSError or http.client.HTTPException."""


class HttpFetcher(Fetcher):
    """HTTP(S) with http.client: timeouts, conditional GET, Range, a few redirects.

    http.client rather than urllib so the request carries only what the
    protocol needs (an unchanged check costs a few hundred bytes on the wire:
    no ``Accept-Encoding``, no ``Connection: close``). HTTPS uses the system's
    default certificate checks. HTTP proxies are not used.
    """

    MAX_REDIRECTS = 5

    def _open(self, url: str, etag: str | None, start: int) -> Response:
        for _ in range(self.MAX_REDIRECTS + 1):
            parts = urllib.parse.urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise TransportError(f"cannot fetch {url}: not an http(s) URL", url=url)
            connection_class = (
                http.client.HTTPSConnection
                if parts.scheme == "https"
                else http.client.HTTPConnection
            )
            connection = connection_class(parts.hostname, parts.port, timeout=self.timeout)
            watchdog = _Watchdog(connection)
            # The status line and headers within one timeout (however they trickle).
            headers_by = min(self._deadline(), time.monotonic() + self.timeout)
            watchdog.arm(headers_by, f"the response headers took longer than {self.timeout:g} s")
            try:
                target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
                connection.putrequest("GET", target, skip_accept_encoding=True)
                connection.putheader("User-Agent", USER_AGENT)
                if etag is not None:
                    connection.putheader("If-None-Match", etag)
                if start:
                    connection.putheader("Range", f"bytes={start}-")
                connection.endheaders()
                raw = connection.getresponse()
            except BaseException as exc:
                watchdog.cancel()
                connection.close()
                if watchdog.fired:
                    raise TransportError(f"cannot fetch {url}: {watchdog.fired}", url=url) from exc
                raise
            location = raw.getheader("Location")
            if raw.status in (301, 302, 303, 307, 308) and location:
                watchdog.cancel()
                raw.close()
                connection.close()
                target_url = urllib.parse.urljoin(url, location)
                if parts.scheme == "https" and not target_url.startswith("https://"):
                    raise TransportError(f"{url} redirects to {target_url}: not https", url=url)
                url = target_url
                continue
            if self._deadline() < float("inf"):
                watchdog.arm(
                    self._deadline(),
                    f"the fetch took longer than its deadline of {self.limits.deadline:g} s",
                )
            else:
                watchdog.cancel()
            return self._response(url, raw, connection, watchdog)
        raise TransportError(f"{url}: more than {self.MAX_REDIRECTS} redirects", url=url)

    def _response(
        self,
        url: str,
        raw: http.client.HTTPResponse,
        connection: http.client.HTTPConnection,
        watchdog: _Watchdog,
    ) -> Response:
        def close() -> None:
            watchdog.cancel()
            raw.close()
            connection.close()

        status = raw.status
        if status in (304, 416):
            close()
            return Response(url, status, etag=raw.getheader("ETag"))
        if status not in (200, 206):
            close()
            # 408, 429 and 5xx may pass; any other status will not by retrying.
            retryable = status in (408, 429) or status >= 500
            raise TransportError(
                f"{url} answered HTTP {status} {raw.reason}",
                url=url,
                status=status,
                retryable=retryable,
                hint=None if retryable else "Check the registry URL, the model and the tier.",
            )
        length = raw.getheader("Content-Length")
        range_start = None
        if status == 206:
            match = re.match(r"bytes (\d+)-", raw.getheader("Content-Range") or "")
            range_start = int(match.group(1)) if match else None
        return Response(
            url,
            status,
            etag=raw.getheader("ETag"),
            length=int(length) if length and length.isdigit() else None,
            range_start=range_start,
            # read1: what has arrived, not a wait for the whole chunk, so the
            # rate and the deadline are checked as bytes trickle in.
            _read=raw.read1,
            _close=close,
            min_rate=self.limits.min_rate,
            rate_window=self.limits.timeout,
            watchdog=watchdog,
        )


class FileFetcher(Fetcher):
    """A registry directory through a ``file://`` URL; Range emulated by seeking."""

    def __init__(self, base_url: str, *, timeout: float, limits: Limits | None = None) -> None:
        super().__init__(base_url, timeout=timeout, limits=limits)
        parsed = urllib.parse.urlparse(self.base_url)
        self.root = Path(urllib.request.url2pathname(parsed.path))

    def _open(self, url: str, etag: str | None, start: int) -> Response:
        relative = urllib.parse.unquote(url[len(self.base_url) :])
        path = self.root / relative
        try:
            handle = path.open("rb")
        except FileNotFoundError as exc:
            raise TransportError(
                f"{url} does not exist", url=url, status=404, retryable=False
            ) from exc
        size = os.fstat(handle.fileno()).st_size
        if start >= size > 0:
            handle.close()
            return Response(url, 416)
        handle.seek(start)
        return Response(
            url,
            206 if start else 200,
            length=size - start,
            range_start=start if start else None,
            _read=handle.read,
            _close=handle.close,
        )


def open_fetcher(base_url: str, *, timeout: float = 30.0, limits: Limits | None = None) -> Fetcher:
    """The fetcher for a registry URL: ``http://``, ``https://`` or ``file://``.

    Raises:
        ValueError: another scheme.
    """
    scheme = urllib.parse.urlparse(base_url).scheme.lower()
    if scheme in ("http", "https"):
        return HttpFetcher(base_url, timeout=timeout, limits=limits)
    if scheme == "file":
        return FileFetcher(base_url, timeout=timeout, limits=limits)
    raise ValueError(f"registry URL {base_url!r} must start with http://, https:// or file://")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


# --- results ------------------------------------------------------------------


@dataclass(frozen=True)
class FetchResult:
    """What the app should run after a fetch, and what happened.

    On any failure the fields describe the last known good model (or no model,
    if none was ever installed) and ``error`` says why nothing new was installed.

    Attributes:
        model: The model asked for.
        tier: The device's tier.
        path: The installed, verified artifact to load; None when nothing was
            ever installed, or when the manifest offers this device nothing
            (a first release still a canary, device outside its cohort).
        version: Its release version.
        variant: Its variant name.
        sha256: Its digest.
        runtime: Recommended runtime settings (threads, backend order, precision).
        min_mnn_runtime: The oldest MNN runtime that loads it.
        is_candidate: It is the candidate of a rollout (this device is in the cohort).
        updated: This fetch installed a different artifact than before.
        error: Why the fetch failed, or None.
        error_code: A stable code for ``error``: a :class:`Rejected` reason
            (``expired``, ``rollback``, ``bad-signature`` ...), ``transport``
            or ``cache``.
        not_modified: The server answered 304 (the cached manifest was re-verified).
        downloaded_bytes: Blob bytes transferred by this fetch.
        runtime_fallback: In the candidate's cohort, but it needs a newer MNN
            than the app has, so stable was installed.
        exception: The error itself, for callers that want its type.
    """

    model: str
    tier: str
    path: Path | None
    version: str | None = None
    variant: str | None = None
    sha256: str | None = None
    runtime: RuntimeHints | None = None
    min_mnn_runtime: str | None = None
    is_candidate: bool = False
    updated: bool = False
    error: str | None = None
    error_code: str | None = None
    not_modified: bool = False
    downloaded_bytes: int = 0
    runtime_fallback: bool = False
    exception: EdgeregError | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        """True when the fetch succeeded (whether or not anything changed)."""
        return self.error is None


@dataclass(frozen=True)
class _Installed:
    sha256: str
    version: str
    variant: str
    tier: str
    is_candidate: bool
    min_mnn_runtime: str
    runtime: RuntimeHints
    sequence: int

    def to_json(self) -> dict[str, Any]:
        return {
            "sha256": self.sha256,
            "version": self.version,
            "variant": self.variant,
            "tier": self.tier,
            "is_candidate": self.is_candidate,
            "min_mnn_runtime": self.min_mnn_runtime,
            "runtime": self.runtime.model_dump(mode="json"),
            "sequence": self.sequence,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> _Installed:
        return cls(
            sha256=str(data["sha256"]),
            version=str(data["version"]),
            variant=str(data["variant"]),
            tier=str(data["tier"]),
            is_candidate=bool(data["is_candidate"]),
            min_mnn_runtime=str(data["min_mnn_runtime"]),
            runtime=RuntimeHints.model_validate(data["runtime"]),
            sequence=int(data["sequence"]),
        )


# --- the cache directory ------------------------------------------------------


@dataclass
class _TierState:
    envelope: bytes | None = None
    etag: str | None = None
    highest_sequence: int | None = None
    """Read from caches written before the sequence was kept per model."""


class _Cache:
    def __init__(self, root: Path) -> None:
        self.root = root

    def blob(self, sha256: str) -> Path:
        return self.root / "blobs" / sha256

    def part(self, sha256: str) -> Path:
        return self.root / "blobs" / f"{sha256}.part"

    def _state_file(self, model: str, tier: str) -> Path:
        return self.root / "state" / model / f"{tier}.json"

    def _sequence_file(self, model: str) -> Path:
        return self.root / "state" / model / "sequence.json"

    def read_state(self, model: str, tier: str) -> _TierState:
        path = self._state_file(model, tier)
        data = self._read_json(path, strict=True)
        if data is None:
            return _TierState()
        envelope = data.get("envelope")
        sequence = data.get("highest_sequence")
        etag = data.get("etag")
        try:
            decoded = (
                base64.b64decode(envelope, validate=True) if isinstance(envelope, str) else None
            )
        except ValueError as exc:
            raise _corrupt(path, "its envelope is not base64") from exc
        if sequence is not None and (type(sequence) is not int or sequence < 1):
            raise _corrupt(path, f"highest_sequence is {sequence!r}")
        return _TierState(
            envelope=decoded,
            etag=etag if isinstance(etag, str) else None,
            highest_sequence=sequence,
        )

    def write_state(self, model: str, tier: str, state: _TierState) -> None:
        data = {
            "envelope": base64.b64encode(state.envelope).decode() if state.envelope else None,
            "etag": state.etag,
            "highest_sequence": state.highest_sequence,
        }
        self._write_json(self._state_file(model, tier), data)

    def read_sequence(self, model: str) -> int | None:
        """The highest manifest sequence accepted for ``model``, whatever the tier.

        One per model, not per tier: every tier's manifest of a model carries
        the same sequence, so a device whose tier changed must not accept an
        older manifest of its new tier. Caches written before this kept it
        per tier; the highest of those counts too.

        Raises:
            CacheError: a file holding it is unreadable or corrupt. Refused,
                not reset: a reset would accept a replayed old manifest.
        """
        path = self._sequence_file(model)
        data = self._read_json(path, strict=True)
        found: list[int] = []
        if data is not None:
            sequence = data.get("highest_sequence")
            if type(sequence) is not int or sequence < 1:
                raise _corrupt(path, f"highest_sequence is {sequence!r}")
            found.append(sequence)
        tiers = self.root / "state" / model
        with contextlib.suppress(OSError):
            for tier_file in sorted(tiers.glob("*.json")):
                if tier_file.name != "sequence.json":
                    legacy = self.read_state(model, tier_file.stem).highest_sequence
                    if legacy is not None:
                        found.append(legacy)
        return max(found) if found else None

    def write_sequence(self, model: str, sequence: int) -> None:
        self._write_json(self._sequence_file(model), {"highest_sequence": sequence})

    def read_installed(self, model: str) -> _Installed | None:
        data = self._read_json(self.root / "installed.json")
        entry = (data or {}).get("models", {}).get(model)
        if not isinstance(entry, dict):
            return None
        try:
            installed = _Installed.from_json(entry)
        except (KeyError, TypeError, ValueError, ValidationError):
            return None
        # Only complete, verified blobs are ever renamed into blobs/; a missing
        # one (the app cleared its cache) means nothing is installed.
        return installed if self.blob(installed.sha256).is_file() else None

    def write_installed(self, model: str, installed: _Installed) -> None:
        path = self.root / "installed.json"
        data = self._read_json(path) or {}
        models = data.get("models") if isinstance(data.get("models"), dict) else {}
        assert isinstance(models, dict)
        models[model] = installed.to_json()
        self._write_json(path, {"schema_version": 1, "models": models})

    def has_blob(self, entry: ManifestEntry) -> bool:
        try:
            return self.blob(entry.sha256).stat().st_size == entry.size
        except OSError:
            return False

    def _read_json(self, path: Path, *, strict: bool = False) -> dict[str, Any] | None:
        """A JSON object from the cache, None when the file does not exist.

        With ``strict`` an unreadable or corrupt file raises :class:`CacheError`
        (rollback protection lives there); otherwise it counts as absent and
        is rewritten (the install pointer: the blobs it names are verified).
        """
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            if strict:
                raise _cache_error(f"cannot read {path}", exc) from exc
            return None
        try:
            value = strict_json_loads(data[: 1024 * 1024 + 1]) if len(data) <= 1024 * 1024 else None
        except (ValueError, RecursionError):
            value = None
        if isinstance(value, dict):
            return value
        if strict:
            raise _corrupt(path, "it is not a JSON object")
        _log.warning("cache file %s is unreadable; treating it as absent", path)
        return None

    def _write_json(self, path: Path, value: Any) -> None:
        atomic_write(path, json.dumps(value, indent=1, sort_keys=True).encode() + b"\n")


def atomic_write(path: Path, data: bytes) -> None:
    """Write a cache file whole or not at all (see :func:`edgereg._files.atomic_write`).

    Raises:
        CacheError: the write failed (disk full, permissions); the old file is untouched.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_whole(path, data)
    except OSError as exc:
        raise _cache_error(f"cannot write {path}", exc) from exc
    _fsync_dir(path.parent)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _fsync_dir(directory: Path) -> None:
    # Makes the rename durable on POSIX; not possible (nor needed) everywhere.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _corrupt(path: Path, why: str) -> CacheError:
    return CacheError(
        f"the client state {path} is corrupt ({why}); refusing to update, because starting "
        "over would drop rollback protection (an old, replayed manifest would be accepted)",
        hint=f"The installed model stays in use. If the disk was at fault, delete {path} "
        "to start over.",
    )


def _cache_error(what: str, exc: OSError) -> CacheError:
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return CacheError(
        f"{what}: {exc.strerror or exc}",
        errno=exc.errno,
        hint="Free some storage; the installed model stays in use." if full else None,
    )


# --- the client ---------------------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Client:
    """Fetches, verifies and installs one model for one device.

    Args:
        base_url: The registry root: ``https://…``, ``http://…`` or ``file://…``.
        trusted_keys: The public keys manifests must be signed by (key id -> key).
        cache_dir: Where verified blobs, the manifest state and the install pointer live.
        model: The model name.
        device: The device profile (its ``device_id`` decides the cohort, its
            ``mnn_runtime`` which entries fit).
        tier: The device's tier; when None, resolved from ``tiers``.
        tiers: The published tier rules (models.toml ``[tiers]``), best first.
        timeout: Seconds before a connection, a read or a response's headers give up.
        deadline: Seconds a whole :meth:`fetch` may take (manifest and blob).
        min_rate: Bytes per second a response body must average over each
            ``timeout`` window; slower is given up (a blob resumes next time).
        max_manifest_bytes: Larger manifests are refused unread.
        clock: Returns the current time, timezone-aware.

    Raises:
        ValueError: a bad URL, model name, runtime version, or neither tier nor tiers.
        EdgeregError: the device matches none of ``tiers``.
    """

    def __init__(
        self,
        base_url: str,
        trusted_keys: Mapping[str, Ed25519PublicKey],
        cache_dir: str | os.PathLike[str],
        *,
        model: str,
        device: DeviceProfile,
        tier: str | None = None,
        tiers: Mapping[str, TierRules] | None = None,
        timeout: float = 30.0,
        deadline: float = Limits.deadline,
        min_rate: int = Limits.min_rate,
        max_manifest_bytes: int = MAX_MANIFEST_BYTES,
        clock: Callable[[], datetime] = _utcnow,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not trusted_keys:
            raise ValueError("a client needs at least one trusted public key")
        try:
            self.model = _NAME.validate_python(model)
            if tier is None:
                if tiers is None:
                    raise ValueError("give the device's tier, or the tier rules to resolve it")
                tier = resolve_tier(tiers, device)
            self.tier = _NAME.validate_python(tier)
        except ValidationError as exc:
            raise ValueError(
                f"not a valid model or tier name: {exc.errors()[0]['input']!r}"
            ) from exc
        if device.mnn_runtime is not None:
            compare_versions(device.mnn_runtime, device.mnn_runtime)  # ValueError if malformed
        self.device = device
        self.trusted = trusted_keys
        limits = Limits(timeout=timeout, deadline=deadline, min_rate=min_rate)
        self.fetcher = open_fetcher(base_url, timeout=timeout, limits=limits)
        self.cache = _Cache(Path(cache_dir))
        self.max_manifest_bytes = max_manifest_bytes
        self.clock = clock
        # Told (bytes received, blob size) as a download goes, for progress bars.
        self.on_progress = on_progress

    # -- public ---------------------------------------------------------------

    def current(self) -> FetchResult | None:
        """The installed model, without touching the network (what an app loads at start)."""
        installed = self.cache.read_installed(self.model)
        return None if installed is None else self._result(installed)

    def fetch(self) -> FetchResult:
        """Check for an update and install it; on any failure keep the last known good.

        Never raises for network, server, trust or disk problems: the result's
        ``error`` and ``error_code`` say what went wrong and its other fields
        describe the model still installed.
        """
        installed = self.cache.read_installed(self.model)
        code: str
        self.fetcher.start_deadline()
        try:
            return self._fetch(installed)
        except Rejected as exc:
            error: EdgeregError = exc
            code = exc.reason
        except TrustError as exc:
            error, code = exc, "untrusted"
        except ManifestNotFound as exc:
            error, code = exc, "not-found"
        except TransportError as exc:
            error, code = exc, "transport"
        except CacheError as exc:
            error, code = exc, "cache"
        except OSError as exc:  # a cache operation not wrapped below
            error, code = _cache_error("cache directory", exc), "cache"
        if installed is None:
            return FetchResult(
                self.model,
                self.tier,
                None,
                error=error.message,
                error_code=code,
                exception=error,
            )
        return self._result(installed, error=error, code=code)

    # -- steps ------------------------------------------------------------------

    def _fetch(self, installed: _Installed | None) -> FetchResult:
        state = self.cache.read_state(self.model, self.tier)
        highest = self.cache.read_sequence(self.model)
        data, etag, not_modified = self._get_manifest(state)
        decision = decide(
            data,
            trusted=self.trusted,
            model=self.model,
            tier=self.tier,
            device_id=self.device.device_id,
            app_mnn_runtime=self.device.mnn_runtime,
            highest_seen_sequence=highest,
            now=self.clock(),
            max_manifest_bytes=self.max_manifest_bytes,
        )
        # Rollback protection first, before anything is downloaded.
        if decision.sequence != highest:
            self.cache.write_sequence(self.model, decision.sequence)
        accepted = _TierState(data, etag, decision.sequence)
        if accepted != state:
            self.cache.write_state(self.model, self.tier, accepted)
        entry = decision.entry
        if entry is None:
            return FetchResult(self.model, self.tier, None, not_modified=not_modified)
        assert isinstance(entry, ManifestEntry)  # decide() refuses a bundle's manifest here
        downloaded = 0 if self.cache.has_blob(entry) else self._download(entry)
        new = _Installed(
            sha256=entry.sha256,
            version=entry.version,
            variant=entry.variant,
            tier=self.tier,
            is_candidate=decision.is_candidate,
            min_mnn_runtime=entry.min_mnn_runtime,
            runtime=entry.runtime,
            sequence=decision.manifest.sequence,
        )
        if new != installed:
            self.cache.write_installed(self.model, new)
        return self._result(
            new,
            updated=installed is None or installed.sha256 != new.sha256,
            not_modified=not_modified,
            downloaded=downloaded,
            decision=decision,
        )

    def _get_manifest(self, state: _TierState) -> tuple[bytes, str | None, bool]:
        """The manifest bytes to verify, their ETag, and whether the server said 304."""
        cached = state.envelope
        path = manifest_path(self.model, self.tier)
        try:
            response = self.fetcher.open(path, etag=state.etag if cached else None)
        except TransportError as exc:
            if exc.status == 404:
                raise ManifestNotFound(
                    f"the registry has no manifest for model '{self.model}', tier "
                    f"'{self.tier}' ({exc.url} answered 404)",
                    url=exc.url,
                    status=404,
                    retryable=False,
                    hint="Check the model name and --tier (the tiers of models.toml), and "
                    "that the model was published to this registry.",
                ) from exc
            raise
        with response:
            if response.status == 304 and cached is not None:
                # Still verified again below: the cached copy may have expired.
                return cached, response.etag or state.etag, True
            if response.status != 200:
                raise TransportError(
                    f"{response.url} answered HTTP {response.status}, expected 200",
                    url=response.url,
                    status=response.status,
                )
            limit = self.max_manifest_bytes
            if response.length is not None and response.length > limit:
                raise Malformed(
                    f"manifest is {response.length} bytes, more than the limit of {limit}"
                )
            # One byte past the limit is enough to refuse it.
            data = _read_up_to(response, limit + 1)
            return data, response.etag, False

    def _download(self, entry: ManifestEntry) -> int:
        """Download, verify and move a blob into the cache; returns the bytes transferred.

        Raises:
            TransportError: interrupted; the ``.part`` file stays for a resume.
            BadBlob: wrong size or digest; the ``.part`` file is deleted.
            CacheError: the disk is full or not writable; the ``.part`` file is deleted.
        """
        part = self.cache.part(entry.sha256)
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise _cache_error(f"cannot create {part.parent}", exc) from exc
        check = BlobCheck(entry)
        have = self._resume_from(part, check)
        transferred = 0
        if check.remaining:
            transferred = self._transfer(entry, part, check, have)
        try:
            check.finish()
        except Rejected:
            _unlink(part)
            raise
        try:
            os.replace(part, self.cache.blob(entry.sha256))
        except OSError as exc:
            raise _cache_error(f"cannot install {part.name}", exc) from exc
        _fsync_dir(part.parent)
        return transferred

    def _resume_from(self, part: Path, check: BlobCheck) -> int:
        """Feed the bytes of an earlier interrupted download to the check; returns their count."""
        try:
            size = part.stat().st_size
        except FileNotFoundError:
            return 0
        except OSError as exc:
            raise _cache_error(f"cannot read {part}", exc) from exc
        if size > check.entry.size:
            _unlink(part)
            return 0
        try:
            with part.open("rb") as handle:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    check.update(chunk)
        except OSError as exc:
            raise _cache_error(f"cannot read {part}", exc) from exc
        return size

    def _transfer(self, entry: ManifestEntry, part: Path, check: BlobCheck, have: int) -> int:
        response = self.fetcher.open(entry.path, start=have)
        try:
            if have and not (response.status == 206 and response.range_start == have):
                # The server ignored the Range (200 and the whole body: a plain
                # static server) or refused it: start again from the first byte.
                _unlink(part)
                check.reset()
                if response.status != 200:
                    response.close()
                    response = self.fetcher.open(entry.path)
            if response.status not in (200, 206) or (
                response.status == 206 and response.range_start != check.received
            ):
                raise TransportError(
                    f"{response.url} answered HTTP {response.status} "
                    f"(range from {response.range_start}), expected 200",
                    url=response.url,
                    status=response.status,
                )
            check.expect(response.length)
            return self._stream(response, part, check)
        except Rejected:
            _unlink(part)
            raise
        finally:
            response.close()

    def _stream(self, response: Response, part: Path, check: BlobCheck) -> int:
        """Append the body to the .part file while checking it; returns the bytes read."""
        transferred = 0
        try:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError as exc:
            raise _cache_error(f"cannot write {part}", exc) from exc
        try:
            while check.remaining:
                # At most one byte past the declared size is ever read.
                chunk = response.read(min(CHUNK, check.remaining))
                if not chunk:
                    raise TransportError(
                        f"{response.url}: connection closed after {check.received} of "
                        f"{check.entry.size} bytes; the next fetch resumes",
                        url=response.url,
                    )
                check.update(chunk)
                transferred += len(chunk)
                _write_all(fd, chunk)
                if self.on_progress is not None:
                    self.on_progress(check.received, check.entry.size)
            check.update(response.read(1))  # anything more is BlobTooLarge
            os.fsync(fd)
        except OSError as exc:
            os.close(fd)
            fd = -1
            _unlink(part)  # free the space: the app needs it more than a resume
            raise _cache_error(f"cannot write {part}", exc) from exc
        finally:
            if fd >= 0:
                os.close(fd)
        return transferred

    def _result(
        self,
        installed: _Installed,
        *,
        error: EdgeregError | None = None,
        code: str | None = None,
        updated: bool = False,
        not_modified: bool = False,
        downloaded: int = 0,
        decision: Decision | None = None,
    ) -> FetchResult:
        return FetchResult(
            model=self.model,
            tier=self.tier,
            path=self.cache.blob(installed.sha256),
            version=installed.version,
            variant=installed.variant,
            sha256=installed.sha256,
            runtime=installed.runtime,
            min_mnn_runtime=installed.min_mnn_runtime,
            is_candidate=installed.is_candidate,
            updated=updated,
            error=None if error is None else error.message,
            error_code=code,
            not_modified=not_modified,
            downloaded_bytes=downloaded,
            runtime_fallback=decision.runtime_fallback if decision else False,
            exception=error,
        )


def _read_up_to(response: Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = response.read(min(CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)


def _unlink(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


# --- trust on first use (unsafe) ------------------------------------------------


def unsafe_registry_keys(fetcher: Fetcher, model: str, tier: str) -> TrustedKeys:
    """Trust whatever keys the registry publishes for the current manifest (TOFU).

    Reads the manifest's signature key ids, fetches ``keys/<keyid>.pem`` for
    each and keeps those whose key id matches. This only proves the manifest
    and the keys came from the same place: anyone who can change the registry
    or the connection can change both. For trying things out, never for apps.

    Raises:
        TransportError: the manifest or no key could be fetched.
        TrustError: no published key matches a signature's key id.
    """
    with fetcher.open(manifest_path(model, tier)) as response:
        if response.status != 200:
            raise TransportError(f"{response.url} answered HTTP {response.status}")
        data = _read_up_to(response, MAX_MANIFEST_BYTES + 1)
    try:
        envelope = strict_json_loads(data)
        keyids = [str(sig["keyid"]) for sig in envelope["signatures"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise Malformed("the manifest is not a signed envelope; no key ids to look up") from exc
    keys = []
    for keyid in _unique(keyids):
        if not re.fullmatch(r"[0-9a-f]{64}", keyid):
            continue
        with fetcher.open(layout.public_key_path(keyid)) as response:
            pem = _read_up_to(response, 16 * 1024)
        key = load_public_key(pem)
        if key_id(key) == keyid:
            keys.append(key)
    if not keys:
        raise TrustError("the registry publishes no key matching the manifest's signatures")
    return TrustedKeys(keys)


def _unique(items: list[str]) -> Iterator[str]:
    seen: set[str] = set()
    for item in items:
        if item not in seen:
            seen.add(item)
            yield item
