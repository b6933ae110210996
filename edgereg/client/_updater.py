"""The client's I/O shell: fetch manifests and blobs, keep the cache, install atomically.

Trust decisions are not made here but in :mod:`edgereg.client._trust`; this
module moves bytes and records what the pure core accepted.

Cache directory layout (one client at a time per directory)::

    blobs/<sha256>              verified blobs (artifacts, probes, labels), written
                                once (os.replace from .part)
    blobs/<sha256>.part         an interrupted download, resumed with Range
    state/<unit>/sequence.json  highest sequence seen (rollback protection)
    state/<unit>/<tier>.json    last accepted manifest bytes and its ETag
    state/<unit>/_status.json   the pending release (downloading or deferred), last error
    state/<unit>/_bad.json      versions refused for good on this device
    installed.json              models: model -> blob, version, variant, hints, contract;
                                bundles: bundle -> version and every member; each with
                                ``previous``, the last good set

A unit is a model or a bundle. A bundle's pointer names every member, so a
set switches in one rename: a crash leaves the old set or the new one.

Every file is written to a temporary file in the same directory and renamed
into place, so a crash or a full disk never leaves half a file where a reader
looks. A blob is only ever renamed into ``blobs/`` after its size and sha256
matched the signed manifest.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import dataclasses
import errno
import http.client
import json
import logging
import os
import re
import shutil
import socket
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import TypeAdapter, ValidationError

from edgereg import __version__
from edgereg._files import atomic_write as write_whole
from edgereg._files import sha256_file
from edgereg.client._health import DEFAULT_MAX_UNCONFIRMED_STARTS, HealthLedger, Revert
from edgereg.client._installed import (
    InstallCheck,
    InstalledModel,
    LastError,
    MemberFiles,
    Pending,
    Status,
    UnitKind,
    _Installed,
    _Member,
)
from edgereg.client._policy import BundledRelease, Conditions, DownloadPolicy
from edgereg.client._reporter import SHORT_TEXT, DeviceFacts, InstallFacts, Reporter
from edgereg.client._selftest import SelfTest
from edgereg.client._trust import (
    MAX_MANIFEST_BYTES,
    BlobCheck,
    Decision,
    Malformed,
    Rejected,
    decide,
)
from edgereg.config import Name, RuntimeHints, TierRules
from edgereg.errors import EdgeregError, TransportError, TrustError
from edgereg.protocol import layout
from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.decision import AppFacts, unfit
from edgereg.protocol.envelope import TrustedKeys, key_id, load_public_key
from edgereg.protocol.fields import format_time
from edgereg.protocol.rules import DeviceProfile, resolve_tier
from edgereg.protocol.wire import BundleEntry, Manifest, ManifestEntry, verify_document

__all__ = [
    "BadRelease",
    "CacheError",
    "Client",
    "FetchResult",
    "Fetcher",
    "Limits",
    "ManifestNotFound",
    "NoSpace",
    "manifest_path",
    "open_fetcher",
    "unit_status",
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

    On any failure the fields describe the last known good model or bundle
    (or nothing, if none was ever installed) and ``error`` says why nothing
    new was installed.

    Attributes:
        model: The model (or bundle) asked for.
        tier: The device's tier.
        path: The installed, verified artifact to load; None when nothing was
            ever installed, when the manifest offers this device nothing
            (a first release still a canary, device outside its cohort), and
            for a bundle (its models are in ``members``).
        version: Its release version (a bundle's own version for a bundle).
        variant: Its variant name (None for a bundle).
        sha256: Its digest (None for a bundle).
        runtime: Recommended runtime settings (threads, backend order, precision).
        min_mnn_runtime: The oldest MNN runtime that loads it.
        is_candidate: It is the candidate of a rollout (this device is in the cohort).
        updated: This fetch installed a different release than before.
        error: Why the fetch failed, or None.
        error_code: A stable code for ``error``: a :class:`Rejected` reason
            (``expired``, ``rollback``, ``bad-signature``, ``app-incompatible``
            ...), ``transport``, ``not-found``, ``cache``, ``no-space`` or
            ``bad-release``.
        not_modified: The server answered 304 (the cached manifest was re-verified).
        downloaded_bytes: Blob bytes transferred by this fetch.
        runtime_fallback: In the candidate's cohort, but the candidate does not
            fit this app or device, so stable was installed (``fallback`` says why).
        exception: The error itself, for callers that want its type.
        members: Every installed model by name, with its contract and labels
            (for a model: one, the model itself).
        bundle: The unit is a bundle.
        fallback: Why the candidate was passed over for stable
            (``runtime-too-old``, ``app-incompatible``, ``os-incompatible``,
            ``bad-release``), else None.
        deferred: The download waits for the app's conditions (``metered``,
            ``not-charging``); nothing new was downloaded.
        bundled: What is installed is the release shipped inside the app.
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
    members: Mapping[str, InstalledModel] = field(default_factory=dict)
    bundle: bool = False
    fallback: str | None = None
    deferred: str | None = None
    bundled: bool = False

    @property
    def ok(self) -> bool:
        """True when the fetch succeeded (whether or not anything changed)."""
        return self.error is None

    @property
    def installed(self) -> bool:
        """Something verified is installed (a model, or every member of a bundle)."""
        return bool(self.members)

    @property
    def contract(self) -> IOContract | None:
        """The installed model's I/O contract (a model, not a bundle: see ``members``)."""
        single = self._single()
        return single.contract if single else None

    @property
    def labels(self) -> list[str] | None:
        """The installed model's labels (a model, not a bundle: see ``members``)."""
        single = self._single()
        return single.labels if single else None

    @property
    def backend(self) -> str | None:
        """The backend the install check chose for the model, if one ran."""
        single = self._single()
        return single.backend if single else None

    def _single(self) -> InstalledModel | None:
        return None if self.bundle else self.members.get(self.model)


# --- the cache directory ------------------------------------------------------

_DIGEST_NAME = re.compile(r"^([0-9a-f]{64})(\.part)?$")
_SECTIONS: dict[UnitKind, str] = {"model": "models", "bundle": "bundles"}
MAX_LABELS_BYTES = 4 * 1024 * 1024
"""A labels blob larger than this is refused (a real one is a few KiB)."""


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

    def status_file(self, unit: str) -> Path:
        # A leading "_" keeps these apart from <tier>.json: a tier name starts with a letter.
        return self.root / "state" / unit / "_status.json"

    def _bad_file(self, unit: str) -> Path:
        return self.root / "state" / unit / "_bad.json"

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
                if tier_file.stem != "sequence" and not tier_file.stem.startswith("_"):
                    legacy = self.read_state(model, tier_file.stem).highest_sequence
                    if legacy is not None:
                        found.append(legacy)
        return max(found) if found else None

    def write_sequence(self, model: str, sequence: int) -> None:
        self._write_json(self._sequence_file(model), {"highest_sequence": sequence})

    # -- the install pointer --------------------------------------------------------

    def read_record(self, kind: UnitKind, unit: str) -> _Installed | None:
        """The unit's pointer as written, whether or not its blobs are still there."""
        data = self._read_json(self.root / "installed.json")
        section = (data or {}).get(_SECTIONS[kind], {})
        entry = section.get(unit) if isinstance(section, dict) else None
        if not isinstance(entry, dict):
            return None
        try:
            return _Installed.from_json(kind, unit, entry)
        except (KeyError, TypeError, ValueError, ValidationError):
            _log.warning("the install record of %s in installed.json is damaged; ignoring it", unit)
            return None

    def read_installed(self, kind: UnitKind, unit: str) -> _Installed | None:
        installed = self.read_record(kind, unit)
        # Only complete, verified blobs are ever renamed into blobs/; a missing
        # one (the app cleared its cache) means nothing is installed.
        if installed is None or not all(self.blob(d).is_file() for d in installed.blobs):
            return None
        return installed

    def write_installed(self, kind: UnitKind, unit: str, installed: _Installed | None) -> None:
        """Switch the unit's pointer (every member at once: one atomic rename)."""
        path = self.root / "installed.json"
        data = self._read_json(path) or {}
        out: dict[str, Any] = {"schema_version": 1}
        for section in _SECTIONS.values():
            value = data.get(section)
            if isinstance(value, dict) and (value or section == "models"):
                out[section] = dict(value)
            elif section == "models":
                out[section] = {}
        units = out.setdefault(_SECTIONS[kind], {})
        if installed is None:
            units.pop(unit, None)
        else:
            units[unit] = installed.to_json()
        self._write_json(path, out)

    def has_blob(self, sha256: str, size: int) -> bool:
        try:
            return self.blob(sha256).stat().st_size == size
        except OSError:
            return False

    # -- status and bad releases ---------------------------------------------------

    def read_status(self, unit: str) -> dict[str, Any]:
        return self._read_json(self.status_file(unit)) or {}

    def write_status(self, unit: str, status: dict[str, Any]) -> None:
        if self.read_status(unit) != status:
            self._write_json(self.status_file(unit), status)

    def read_bad(self, unit: str) -> dict[str, str]:
        """Versions of ``unit`` refused for good on this device -> why."""
        data = self._read_json(self._bad_file(unit)) or {}
        releases = data.get("releases")
        if not isinstance(releases, dict):
            return {}
        return {str(k): str(v) for k, v in releases.items()}

    def mark_bad(self, unit: str, version: str, why: str) -> None:
        releases = self.read_bad(unit)
        releases[version] = why
        self._write_json(self._bad_file(unit), {"releases": releases})

    # -- eviction ---------------------------------------------------------------------

    def referenced(self) -> set[str]:
        """Digests some unit needs: installed, its last good set, or a pending download."""
        keep: set[str] = set()
        data = self._read_json(self.root / "installed.json") or {}
        for kind, section in _SECTIONS.items():
            units = data.get(section)
            if not isinstance(units, dict):
                continue
            for unit in units:
                record = self.read_record(kind, str(unit))
                while record is not None:
                    keep |= record.blobs
                    record = record.previous
        with contextlib.suppress(OSError):
            for status_file in (self.root / "state").glob("*/_status.json"):
                pending = self.read_status(status_file.parent.name).get("pending")
                if isinstance(pending, dict):
                    blobs = pending.get("blobs")
                    if isinstance(blobs, list):
                        keep |= {
                            b["sha256"]
                            for b in blobs
                            if isinstance(b, dict) and isinstance(b.get("sha256"), str)
                        }
        return keep

    def evict(self) -> int:
        """Delete blobs and partial downloads nothing references; returns the bytes freed."""
        keep = self.referenced()
        freed = 0
        try:
            names = list((self.root / "blobs").iterdir())
        except OSError:
            return 0
        for path in names:
            found = _DIGEST_NAME.match(path.name)
            if found is None or found.group(1) in keep:
                continue
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                freed += size
        if freed:
            _log.info("evicted %d bytes of blobs no installed or pending release uses", freed)
        return freed

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


def _error_code(exc: EdgeregError) -> str:
    """The stable code of a fetch failure (docs/protocol.md §10)."""
    if isinstance(exc, Rejected):
        return exc.reason
    if isinstance(exc, NoSpace):
        return "no-space"
    if isinstance(exc, TrustError):
        return "untrusted"
    if isinstance(exc, ManifestNotFound):
        return "not-found"
    if isinstance(exc, TransportError):
        return "transport"
    return "cache"


def _blob_refs(entries: Mapping[str, ManifestEntry]) -> list[BlobRef]:
    """Every blob a release needs (artifacts, probes, labels), each once, in member order."""
    refs: dict[str, BlobRef] = {}
    for name in sorted(entries):
        entry = entries[name]
        refs.setdefault(entry.sha256, BlobRef.of(entry.sha256, entry.size))
        for extra in (entry.probe, entry.contract.labels_blob if entry.contract else None):
            if extra is not None:
                refs.setdefault(extra.sha256, extra)
    return list(refs.values())


def _parse_labels(data: bytes, where: str) -> list[str]:
    try:
        value = strict_json_loads(data)
    except (ValueError, RecursionError) as exc:
        raise Malformed(f"the labels blob of {where} is not JSON: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise Malformed(f"the labels blob of {where} is not a JSON array of strings")
    return value


# --- the client ---------------------------------------------------------------


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


class Client:
    """Fetches, verifies and installs one model, or one bundle of models, for one device.

    Args:
        base_url: The registry root: ``https://…``, ``http://…`` or ``file://…``.
        trusted_keys: The public keys manifests must be signed by (key id -> key).
        cache_dir: Where verified blobs, the manifest state and the install pointer live.
        model: The model name (give exactly one of ``model`` and ``bundle``).
        bundle: The bundle name: every member is installed at one version, or none.
        device: The device profile (its ``device_id`` decides the cohort, its
            ``mnn_runtime``, ``os`` and ``os_version`` which entries fit).
        tier: The device's tier; when None, resolved from ``tiers``.
        tiers: The published tier rules (models.toml ``[tiers]``), best first.
        app_version: The app's own version, for releases that declare
            ``requires.app`` (a release that needs one does not reach an app
            that does not say its version).
        policy: When blobs may be downloaded (metered network, charging) and
            the free space to leave.
        bundled: A release shipped inside the app: installed without network
            when nothing (newer) is installed.
        install_check: Called after every blob of a new release is verified and
            before the switch (see :data:`~edgereg.client.InstallCheck`).
        self_test: Run each member's golden probe on its hinted backends before
            the switch (True, or a :class:`~edgereg.client.SelfTest` with its own
            runner); the install check then (docs/protocol.md §11).
        reporting: Send the anonymous reports the manifest asks for (§11);
            False sends and stores nothing.
        device_class: A coarse bucket of the app's own (``ram4-8c``) for reports.
        max_unconfirmed_starts: App starts a new release gets to be confirmed
            (:meth:`confirm`) before :meth:`app_started` reverts it.
        timeout: Seconds before a connection, a read or a response's headers give up.
        deadline: Seconds a whole :meth:`fetch` may take (manifest and blobs).
        min_rate: Bytes per second a response body must average over each
            ``timeout`` window; slower is given up (a blob resumes next time).
        max_manifest_bytes: Larger manifests are refused unread.
        clock: Returns the current time, timezone-aware.

    Raises:
        ValueError: a bad URL, name, version, both or neither of model and
            bundle, or neither tier nor tiers.
        EdgeregError: the device matches none of ``tiers``.
    """

    def __init__(
        self,
        base_url: str,
        trusted_keys: Mapping[str, Ed25519PublicKey],
        cache_dir: str | os.PathLike[str],
        *,
        model: str | None = None,
        bundle: str | None = None,
        device: DeviceProfile,
        tier: str | None = None,
        tiers: Mapping[str, TierRules] | None = None,
        app_version: str | None = None,
        policy: DownloadPolicy | None = None,
        bundled: BundledRelease | None = None,
        install_check: InstallCheck | None = None,
        self_test: bool | SelfTest = False,
        reporting: bool = True,
        device_class: str | None = None,
        max_unconfirmed_starts: int = DEFAULT_MAX_UNCONFIRMED_STARTS,
        timeout: float = 30.0,
        deadline: float = Limits.deadline,
        min_rate: int = Limits.min_rate,
        max_manifest_bytes: int = MAX_MANIFEST_BYTES,
        clock: Callable[[], datetime] = _utcnow,
        on_progress: Callable[[int, int], None] | None = None,
    ) -> None:
        if not trusted_keys:
            raise ValueError("a client needs at least one trusted public key")
        if (model is None) == (bundle is None):
            raise ValueError("give exactly one of model= and bundle=")
        unit = model if model is not None else bundle
        try:
            self.model = _NAME.validate_python(unit)
            if tier is None:
                if tiers is None:
                    raise ValueError("give the device's tier, or the tier rules to resolve it")
                tier = resolve_tier(tiers, device)
            self.tier = _NAME.validate_python(tier)
        except ValidationError as exc:
            raise ValueError(
                f"not a valid model, bundle or tier name: {exc.errors()[0]['input']!r}"
            ) from exc
        self.kind: UnitKind = "bundle" if bundle is not None else "model"
        self.app = AppFacts(
            mnn_runtime=device.mnn_runtime,
            app_version=app_version,
            os=device.os,
            os_version=device.os_version,
        )
        self.app.check()  # ValueError for a version that is not one
        self.device = device
        self.trusted = trusted_keys
        limits = Limits(timeout=timeout, deadline=deadline, min_rate=min_rate)
        self.fetcher = open_fetcher(base_url, timeout=timeout, limits=limits)
        self.cache = _Cache(Path(cache_dir))
        self.policy = policy if policy is not None else DownloadPolicy()
        self.bundled = bundled
        self.install_check = install_check
        self.self_test: SelfTest | None = None
        if self_test is not False:
            if install_check is not None:
                raise ValueError("give self_test= or install_check=, not both")
            self.self_test = SelfTest(self.cache.root) if self_test is True else self_test
            self.install_check = self.self_test
        self.health = HealthLedger(self.cache.root, max_unconfirmed_starts=max_unconfirmed_starts)
        os_version = device.os_version
        if os_version is not None and not SHORT_TEXT.match(os_version):
            os_version = None  # reports carry a short, coarse version or none
        self.reporter = Reporter(
            base_url,
            self.cache.root,
            device=DeviceFacts(
                os=device.os,
                os_version=os_version,
                device_class=device_class,
                mnn_runtime=device.mnn_runtime,
            ),
            enabled=reporting,
        )
        self.max_manifest_bytes = max_manifest_bytes
        self.clock = clock
        # Told (bytes received, blob size) as a download goes, for progress bars.
        self.on_progress = on_progress

    @property
    def unit(self) -> str:
        """The model or bundle this client installs."""
        return self.model

    @property
    def is_bundle(self) -> bool:
        """This client installs a bundle."""
        return self.kind == "bundle"

    # -- public ---------------------------------------------------------------

    def current(self) -> FetchResult | None:
        """What is installed, without touching the network (what an app loads at start).

        On the first launch with a shipped release (``bundled=``) and nothing
        installed, installs that release from the app's files first.
        """
        if self.bundled is not None:
            self._install_shipped_or_record()
        installed = self.cache.read_installed(self.kind, self.model)
        return None if installed is None else self._result(installed)

    def fetch(self, conditions: Conditions | None = None) -> FetchResult:
        """Check for an update and install it; on any failure keep the last known good.

        Args:
            conditions: The network and power state now; the download waits
                (``deferred``) when they break the client's :class:`DownloadPolicy`.

        Never raises for network, server, trust or disk problems: the result's
        ``error`` and ``error_code`` say what went wrong and its other fields
        describe what is still installed.
        """
        if self.bundled is not None:
            self._install_shipped_or_record()
        installed = self.cache.read_installed(self.kind, self.model)
        self.reporter.retry_pending()
        self.fetcher.start_deadline()
        try:
            result = self._fetch(installed, conditions or Conditions())
        except (EdgeregError, OSError) as exc:
            error = exc if isinstance(exc, EdgeregError) else _cache_error("cache directory", exc)
            if not isinstance(error, (TrustError, TransportError, CacheError, NoSpace)):
                raise
            code = _error_code(error)
            self._record_error(code, error.message)
            if installed is None:
                return FetchResult(
                    self.model,
                    self.tier,
                    None,
                    error=error.message,
                    error_code=code,
                    exception=error,
                    bundle=self.is_bundle,
                )
            return self._result(installed, error=error, code=code)
        self._record_error(None, None)
        return result

    def status(self, *, verify: bool = True) -> Status:
        """What is installed, pending and failing for this unit; whether it is ready to load.

        Reads the cache only. With ``verify`` (the default) every installed
        blob is hashed again, so ``ready`` means present and intact.
        """
        return unit_status(self.cache.root, self.model, self.kind, self.tier, verify=verify)

    def revert(self, reason: str) -> FetchResult | None:
        """Switch back to the last good set and mark the current release bad on this device.

        For a model that fails in the app (a crash loop, a failed first
        inference): the current version is never installed again here. When
        there is no last good set, nothing is installed afterwards.

        Returns:
            What is installed now, or None.
        """
        record = self.cache.read_record(self.kind, self.model)
        if record is None:
            return None
        self.cache.mark_bad(self.model, record.version, f"reverted: {reason}")
        previous = record.previous
        if previous is not None and not all(self.cache.blob(d).is_file() for d in previous.blobs):
            previous = None
        self.cache.write_installed(self.kind, self.model, previous)
        self._record_error("reverted", f"{record.version} reverted: {reason}")
        self.cache.evict()
        _log.warning("%s %s reverted (%s)", self.model, record.version, reason)
        self.health.reverted(self.model, None if previous is None else previous.version)
        for name in sorted(record.members):
            self.reporter.reverted(self.model, name)
        return None if previous is None else self._result(previous, updated=True)

    def app_started(self) -> Revert | None:
        """Call once at every start of the app, before it loads the model.

        Counts the start against an unconfirmed install; when the installed
        release was not confirmed within ``max_unconfirmed_starts`` starts (a
        crash loop), reverts it to the last good set and marks it bad
        (docs/protocol.md §11). Reads and writes the cache only.

        Returns:
            The revert carried out (load :meth:`current` then), or None.
        """
        revert = self.health.app_started(self.model)
        if revert is None:
            return None
        record = self.cache.read_record(self.kind, self.model)
        if record is None or record.version != revert.version:
            # Something else is installed by now: nothing to take back.
            self.health.reverted(self.model, None if record is None else record.version)
            return None
        self.revert(revert.reason)
        return revert

    def confirm(self, version: str | None = None) -> bool:
        """The app's first real inference with the installed release succeeded.

        Args:
            version: The version the app ran (the bundle's for a bundle);
                a confirmation of another version than the installed one
                does not count.

        Returns:
            True when this confirmed a release that was waiting for it.
        """
        confirmed = self.health.confirm(self.model, version)
        if confirmed:
            record = self.cache.read_record(self.kind, self.model)
            for name in sorted(record.members if record is not None else {}):
                self.reporter.confirmed(self.model, name)
        return confirmed

    def record_inference(self, ms: float, model: str | None = None) -> None:
        """Add one real inference's latency (``model``: a bundle member) to the next report."""
        self.reporter.record_inference(model or self.model, ms)

    def report_latency(self) -> None:
        """Send the latency recorded since the last report now (for a periodic send)."""
        record = self.cache.read_record(self.kind, self.model)
        for name in sorted(record.members if record is not None else {}):
            self.reporter.summary(self.model, name)

    def close(self, timeout: float = 11.0) -> None:
        """Wait up to ``timeout`` seconds for reports still being sent."""
        self.reporter.close(timeout)

    # -- steps ------------------------------------------------------------------

    def _fetch(self, installed: _Installed | None, conditions: Conditions) -> FetchResult:
        state = self.cache.read_state(self.model, self.tier)
        highest = self.cache.read_sequence(self.model)
        data, etag, not_modified = self._get_manifest(state)
        decision = self._decide(data, highest, self.clock())
        # Rollback protection first, before anything is downloaded.
        if decision.sequence != highest:
            self.cache.write_sequence(self.model, decision.sequence)
        accepted = _TierState(data, etag, decision.sequence)
        if accepted != state:
            self.cache.write_state(self.model, self.tier, accepted)
        return self._apply(
            self._avoid_bad(decision), installed, conditions, not_modified=not_modified
        )

    def _decide(self, data: bytes, highest: int | None, now: datetime) -> Decision:
        return decide(
            data,
            trusted=self.trusted,
            model=self.model,
            tier=self.tier,
            device_id=self.device.device_id,
            app_mnn_runtime=self.device.mnn_runtime,
            highest_seen_sequence=highest,
            now=now,
            max_manifest_bytes=self.max_manifest_bytes,
            app=self.app,
            bundle=self.is_bundle,
        )

    def _avoid_bad(self, decision: Decision) -> Decision:
        """A release this device refused for good counts as not fitting (§10)."""
        entry = decision.entry
        if entry is None:
            return decision
        bad = self.cache.read_bad(self.model)
        if entry.version not in bad:
            return decision
        stable = decision.manifest.stable
        if (
            decision.is_candidate
            and stable is not None
            and stable.version not in bad
            and unfit(stable, self.app) is None
        ):
            return dataclasses.replace(
                decision, entry=stable, is_candidate=False, fallback="bad-release"
            )
        raise BadRelease(
            f"{self.model} {entry.version} was refused on this device before "
            f"({bad[entry.version]}); it is not installed again",
            hint="The installed release stays; a newer release replaces it.",
        )

    def _entries(self, entry: ManifestEntry | BundleEntry) -> dict[str, ManifestEntry]:
        if isinstance(entry, BundleEntry):
            return dict(entry.members)
        return {self.model: entry}

    def _apply(
        self,
        decision: Decision,
        installed: _Installed | None,
        conditions: Conditions,
        *,
        not_modified: bool,
        shipped: BundledRelease | None = None,
    ) -> FetchResult:
        """Install what the decision chose: every blob verified, then one pointer switch."""
        entry = decision.entry
        if entry is None:
            self._set_pending(None)
            return FetchResult(
                self.model, self.tier, None, not_modified=not_modified, bundle=self.is_bundle
            )
        entries = self._entries(entry)
        new = _Installed(
            kind=self.kind,
            version=entry.version,
            tier=self.tier,
            is_candidate=decision.is_candidate,
            sequence=decision.manifest.sequence,
            members={name: _Member.of(e) for name, e in entries.items()},
            bundled=shipped is not None,
        )
        if installed is not None and new.same_release(installed):
            # Same blobs (a promote, a re-fetch): keep the check's backends and the last good.
            kept = dataclasses.replace(
                new,
                members={
                    name: dataclasses.replace(m, backend=installed.members[name].backend)
                    for name, m in new.members.items()
                },
                previous=installed.previous,
                bundled=installed.bundled and shipped is not None,
            )
            if kept.to_json() != installed.to_json():
                self.cache.write_installed(self.kind, self.model, kept)
            self._set_pending(None)
            return self._result(kept, not_modified=not_modified, decision=decision)
        missing = [
            ref for ref in _blob_refs(entries) if not self.cache.has_blob(ref.sha256, ref.size)
        ]
        downloaded = 0
        if missing:
            if shipped is None:
                deferred = self.policy.unmet(conditions)
                self._set_pending(new, missing, deferred=deferred)
                if deferred is not None:
                    return self._deferred(installed, deferred, not_modified)
            self._preflight(missing)
            for ref in missing:
                if shipped is None:
                    downloaded += self._download(ref)
                else:
                    self._copy_shipped(ref, shipped)
        for name, member_entry in entries.items():
            self._labels_of(name, member_entry)  # a bad labels blob refuses the release
        try:
            new = self._check(new, entries)
        except Rejected:
            self._set_pending(None)
            self._report_rejected(new, decision)
            raise
        if installed is not None:
            new = dataclasses.replace(new, previous=installed.without_previous())
        self.cache.write_installed(self.kind, self.model, new)
        self._set_pending(None)
        self.cache.evict()
        self._report_installed(new, decision)
        return self._result(
            new,
            updated=True,
            not_modified=not_modified,
            downloaded=downloaded,
            decision=decision,
        )

    def _deferred(self, installed: _Installed | None, why: str, not_modified: bool) -> FetchResult:
        _log.info("%s: download deferred (%s)", self.model, why)
        if installed is None:
            return FetchResult(
                self.model,
                self.tier,
                None,
                not_modified=not_modified,
                bundle=self.is_bundle,
                deferred=why,
            )
        return dataclasses.replace(self._result(installed, not_modified=not_modified), deferred=why)

    def _facts(self, new: _Installed, name: str, decision: Decision) -> InstallFacts:
        member = new.members[name]
        return InstallFacts(
            unit=self.model,
            model=name,
            version=member.version,
            unit_version=new.version,
            variant=member.variant,
            tier=self.tier,
            arm="candidate" if new.is_candidate else "stable",
            sequence=decision.manifest.sequence,
        )

    def _report_installed(self, new: _Installed, decision: Decision) -> None:
        """A new release is installed: its count of starts begins, each member is reported."""
        self.health.installed(self.model, new.version)
        results = self.self_test.results if self.self_test is not None else {}
        for name in sorted(new.members):
            facts = self._facts(new, name, decision)
            result = results.get(name)
            if result is not None:
                facts = dataclasses.replace(
                    facts,
                    probe=result.probe,
                    backend=result.backend,
                    backends_skipped=result.skipped,
                    load_ms=result.load_ms,
                )
            self.reporter.installed(facts, decision.manifest.report_url)

    def _report_rejected(self, new: _Installed, decision: Decision) -> None:
        """The self-test refused a member: report it (the release is not installed)."""
        failed = self.self_test.failed if self.self_test is not None else {}
        for name, trials in sorted(failed.items()):
            if name not in new.members:
                continue
            tried = [t for t in trials if t.outcome == "failed"]
            facts = dataclasses.replace(
                self._facts(new, name, decision),
                probe="failed",
                backends_skipped=[
                    t.backend for t in trials if t.outcome in ("failed", "remembered")
                ],
                load_failed=bool(tried)
                and all((t.detail or "").startswith("does not load") for t in tried),
            )
            self.reporter.installed(facts, decision.manifest.report_url)

    def _check(self, new: _Installed, entries: Mapping[str, ManifestEntry]) -> _Installed:
        """Run the app's install check; store the backend it chose per member."""
        if self.install_check is None:
            return new
        files = {
            name: MemberFiles(
                entry,
                self.cache.blob(entry.sha256),
                self.cache.blob(entry.probe.sha256) if entry.probe is not None else None,
            )
            for name, entry in entries.items()
        }
        try:
            chosen = self.install_check(self.model, new.version, files)
        except Rejected as exc:
            if getattr(exc, "permanent", False) is True:
                self.cache.mark_bad(self.model, new.version, f"{exc.reason}: {exc.message}")
                _log.warning("%s %s marked bad on this device: %s", self.model, new.version, exc)
            raise
        if chosen is None:
            return new
        members = dict(new.members)
        for name, backend in chosen.items():
            if name not in entries:
                raise ValueError(f"install_check chose a backend for {name!r}, not a member")
            if backend not in entries[name].runtime.backends:
                raise ValueError(
                    f"install_check chose backend {backend!r} for {name}, not one of its hints "
                    f"{entries[name].runtime.backends}"
                )
            members[name] = dataclasses.replace(members[name], backend=backend)
        return dataclasses.replace(new, members=members)

    def _preflight(self, missing: list[BlobRef]) -> None:
        """Refuse, before any byte, a download the free space cannot hold (``no-space``)."""
        remaining = 0
        for ref in missing:
            try:
                have = self.cache.part(ref.sha256).stat().st_size
            except OSError:
                have = 0
            remaining += max(0, ref.size - have)
        try:
            self.cache.root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.cache.root).free
        except OSError as exc:
            raise _cache_error(f"cannot check the free space of {self.cache.root}", exc) from exc
        needed = remaining + self.policy.reserve_bytes
        if free < needed:
            raise NoSpace(
                f"the download needs {needed} bytes ({remaining} to fetch and a reserve of "
                f"{self.policy.reserve_bytes}) and {self.cache.root} has {free} free; "
                "nothing was downloaded",
                needed=needed,
                free=free,
            )

    def _copy_shipped(self, ref: BlobRef, shipped: BundledRelease) -> None:
        """Verify a blob the app ships and move a copy into the cache."""
        source = shipped.blob(ref.sha256)
        if source is None:
            raise Malformed(
                f"the shipped release has no blob {ref.sha256[:12]} in {shipped.blobs_dir}",
                hint="Ship every blob of the bundled manifest, named by its sha256.",
            )
        part = self.cache.part(ref.sha256)
        check = BlobCheck(ref)
        try:
            part.parent.mkdir(parents=True, exist_ok=True)
            _unlink(part)
            with source.open("rb") as handle, part.open("wb") as out:
                for chunk in iter(lambda: handle.read(CHUNK), b""):
                    check.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            check.finish()
            os.replace(part, self.cache.blob(ref.sha256))
        except Rejected:
            _unlink(part)
            raise
        except OSError as exc:
            _unlink(part)
            raise _cache_error(f"cannot copy the shipped blob {source}", exc) from exc
        _fsync_dir(part.parent)

    def _labels_of(self, name: str, entry: ManifestEntry | _Member) -> list[str] | None:
        contract = entry.contract
        if contract is None:
            return None
        if contract.labels is not None:
            return list(contract.labels)
        blob = contract.labels_blob
        if blob is None:
            return None
        if blob.size > MAX_LABELS_BYTES:
            raise Malformed(
                f"the labels blob of {name} is {blob.size} bytes, more than {MAX_LABELS_BYTES}"
            )
        try:
            data = self.cache.blob(blob.sha256).read_bytes()
        except OSError as exc:
            raise _cache_error(f"cannot read the labels of {name}", exc) from exc
        return _parse_labels(data, name)

    def _install_shipped_or_record(self) -> None:
        try:
            self._install_shipped()
        except (TrustError, CacheError, NoSpace) as exc:
            code = _error_code(exc)
            _log.warning("the release shipped in the app was not installed (%s): %s", code, exc)
            with contextlib.suppress(CacheError):
                self._record_error(code, f"shipped release: {exc.message}")

    def _install_shipped(self) -> None:
        """Install the app's shipped release when nothing, or something older, is installed.

        Verified like a fetched manifest (signature, model or bundle, tier,
        digests) except for its expiry: a copy inside the app cannot be
        re-signed, and it never overrides a newer release (docs/protocol.md §10).
        """
        assert self.bundled is not None
        data = self.bundled.manifest
        manifest = verify_document(Manifest, data, self.trusted)
        installed = self.cache.read_installed(self.kind, self.model)
        highest = self.cache.read_sequence(self.model)
        if installed is not None and manifest.sequence <= max(installed.sequence, highest or 0):
            return
        now = min(self.clock(), manifest.expires - timedelta(seconds=1))
        decision = self._avoid_bad(self._decide(data, None, now))
        if decision.manifest.sequence > (highest or 0):
            self.cache.write_sequence(self.model, decision.manifest.sequence)
        if decision.entry is None:
            return
        self._apply(decision, installed, Conditions(), not_modified=False, shipped=self.bundled)
        _log.info("installed the release shipped in the app (%s)", decision.entry.version)

    # -- status bookkeeping -------------------------------------------------------------

    def _set_pending(
        self,
        new: _Installed | None,
        missing: list[BlobRef] | None = None,
        *,
        deferred: str | None = None,
    ) -> None:
        status = self.cache.read_status(self.model)
        if new is None:
            if status.get("pending") is None:
                return
            status["pending"] = None
        else:
            old = status.get("pending")
            since = (
                old.get("since")
                if isinstance(old, dict) and old.get("version") == new.version
                else format_time(self.clock())
            )
            status["pending"] = {
                "version": new.version,
                "is_candidate": new.is_candidate,
                "blobs": [{"sha256": r.sha256, "size": r.size} for r in missing or []],
                "deferred": deferred,
                "since": since,
            }
        self.cache.write_status(self.model, status)

    def _record_error(self, code: str | None, message: str | None) -> None:
        status = self.cache.read_status(self.model)
        if code is None:
            if status.get("last_error") is None:
                return
            status["last_error"] = None
        else:
            status["last_error"] = {
                "code": code,
                "message": message,
                "at": format_time(self.clock()),
            }
        with contextlib.suppress(CacheError):
            self.cache.write_status(self.model, status)

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

    def _download(self, entry: BlobRef) -> int:
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

    def _transfer(self, entry: BlobRef, part: Path, check: BlobCheck, have: int) -> int:
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
        members = _installed_models(self.cache, installed)
        single = None if self.is_bundle else members.get(self.model)
        return FetchResult(
            model=self.model,
            tier=self.tier,
            path=single.path if single else None,
            version=installed.version,
            variant=single.variant if single else None,
            sha256=single.sha256 if single else None,
            runtime=single.runtime if single else None,
            min_mnn_runtime=single.min_mnn_runtime if single else None,
            is_candidate=installed.is_candidate,
            updated=updated,
            error=None if error is None else error.message,
            error_code=code,
            not_modified=not_modified,
            downloaded_bytes=downloaded,
            runtime_fallback=decision.runtime_fallback if decision else False,
            exception=error,
            members=members,
            bundle=self.is_bundle,
            fallback=decision.fallback if decision else None,
            bundled=installed.bundled,
        )


class NoSpace(CacheError):
    """The free space cannot hold the download plus the reserve; nothing was downloaded.

    Attributes:
        needed: Bytes the download needs (the bytes still to fetch plus the reserve).
        free: Bytes free where the cache lives.
    """

    def __init__(self, message: str, *, needed: int, free: int) -> None:
        super().__init__(
            message,
            errno=errno.ENOSPC,
            hint="Free some storage; the installed model stays in use.",
        )
        self.needed = needed
        self.free = free


class BadRelease(Rejected):
    """The release chosen for this device was refused here for good before (a failed check)."""

    reason = "bad-release"


def _installed_models(cache: _Cache, installed: _Installed) -> dict[str, InstalledModel]:
    models = {}
    for name, member in sorted(installed.members.items()):
        labels: list[str] | None = None
        if member.contract is not None:
            labels = member.contract.labels
            blob = member.contract.labels_blob
            if blob is not None:
                try:
                    labels = _parse_labels(cache.blob(blob.sha256).read_bytes(), name)
                except (OSError, Malformed):
                    _log.warning("the labels blob of %s cannot be read", name)
        models[name] = InstalledModel(
            name=name,
            path=cache.blob(member.sha256),
            version=member.version,
            variant=member.variant,
            sha256=member.sha256,
            runtime=member.runtime,
            min_mnn_runtime=member.min_mnn_runtime,
            contract=member.contract,
            labels=None if labels is None else list(labels),
            probe_path=None if member.probe_sha256 is None else cache.blob(member.probe_sha256),
            backend=member.backend,
        )
    return models


def _pending_of(cache: _Cache, pend: object) -> Pending | None:
    if not isinstance(pend, dict):
        return None
    blobs = [b for b in pend.get("blobs") or [] if isinstance(b, dict)]
    total = sum(int(b.get("size", 0)) for b in blobs)
    remaining = 0
    for item in blobs:
        digest, size = str(item.get("sha256")), int(item.get("size", 0))
        if cache.has_blob(digest, size):
            continue
        try:
            remaining += max(0, size - cache.part(digest).stat().st_size)
        except OSError:
            remaining += size
    deferred = pend.get("deferred")
    return Pending(
        version=str(pend.get("version")),
        is_candidate=pend.get("is_candidate") is True,
        total_bytes=total,
        remaining_bytes=remaining,
        deferred=deferred if isinstance(deferred, str) else None,
        since=str(pend.get("since")),
    )


def unit_status(
    cache_dir: str | os.PathLike[str],
    unit: str,
    kind: UnitKind = "model",
    tier: str | None = None,
    *,
    verify: bool = True,
) -> Status:
    """The status of a model or bundle in a client cache directory, read from disk only.

    Needs no keys and no network (``edgereg pull --status``); see :meth:`Client.status`.
    """
    cache = _Cache(Path(cache_dir))
    record = cache.read_record(kind, unit)
    raw = cache.read_status(unit)
    try:
        pending = _pending_of(cache, raw.get("pending"))
    except (TypeError, ValueError):
        _log.warning("the pending record of %s is damaged; ignoring it", unit)
        pending = None
    err = raw.get("last_error")
    last_error = (
        LastError(code=str(err.get("code")), message=str(err.get("message")), at=str(err.get("at")))
        if isinstance(err, dict)
        else None
    )
    ready = False
    members: Mapping[str, InstalledModel] = {}
    if record is not None:
        members = _installed_models(cache, record)
        sizes = {m.sha256: m.size for m in record.members.values()}
        ready = True
        for digest in record.blobs:
            path = cache.blob(digest)
            if not path.is_file() or (sizes.get(digest) not in (None, path.stat().st_size)):
                ready = False
                break
            if verify and sha256_file(path) != digest:
                ready = False
                break
    return Status(
        unit=unit,
        kind=kind,
        tier=record.tier if record is not None else (tier or ""),
        version=record.version if record is not None else None,
        is_candidate=record.is_candidate if record is not None else False,
        bundled=record.bundled if record is not None else False,
        members=members,
        previous=record.previous.version if record and record.previous else None,
        pending=pending,
        last_error=last_error,
        bad_releases=cache.read_bad(unit),
        ready=ready,
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
