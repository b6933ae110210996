"""The client's transport: one public method, one error type (python-tuf's fetcher seam).

:class:`Fetcher` turns every failure of a request (refused, reset, timed
out, trickled, an error status) into :class:`~edgereg.protocol.errors.TransportError`;
:class:`HttpFetcher` and :class:`FileFetcher` write only the private
primitive. A watchdog bounds the response headers and the whole fetch, which
a socket timeout alone does not.
"""

from __future__ import annotations

import abc
import contextlib
import http.client
import os
import re
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgereg import __version__
from edgereg.protocol.errors import ExitCode, TransportError

__all__ = [
    "CHUNK",
    "USER_AGENT",
    "Fetcher",
    "FileFetcher",
    "HttpFetcher",
    "Limits",
    "ManifestNotFound",
    "Response",
    "open_fetcher",
    "read_up_to",
]


CHUNK = 64 * 1024
USER_AGENT = f"edgereg/{__version__}"


class ManifestNotFound(TransportError):
    """The registry has no manifest for this model and tier: a wrong name, not a blip."""

    exit_code = ExitCode.USAGE


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

    def abort(self, why: str) -> None:
        """Cut the connection now, from any thread: a wait or read in progress fails at once."""
        self.cancel()
        self._fire(why)

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

    def abort(self, why: str) -> None:
        """Cut the connection now, from any thread: a read in progress fails at once."""
        if self.watchdog is not None:
            self.watchdog.abort(why)

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
        # The connections waiting for their response headers, and why the fetch was cut.
        self._opening: set[_Watchdog] = set()
        self._opening_lock = threading.Lock()
        self._aborted: str | None = None

    def start_deadline(self) -> None:
        """Start the clock of one whole fetch (:attr:`Limits.deadline` from now)."""
        self._deadline_at = time.monotonic() + self.limits.deadline
        with self._opening_lock:
            self._aborted = None

    def abort(self, why: str) -> None:
        """Cut every request of this fetch still waiting for its answer, now and until the next.

        From any thread (an app's cancel): a server that holds its answer does not
        hold the cancel. A body being read is cut through its :class:`Response`.
        """
        with self._opening_lock:
            self._aborted = why
            opening = list(self._opening)
        for watchdog in opening:
            watchdog.abort(why)

    def _watch_opening(self, watchdog: _Watchdog, url: str) -> None:
        with self._opening_lock:
            if self._aborted is not None:
                raise TransportError(f"cannot fetch {url}: {self._aborted}", url=url)
            self._opening.add(watchdog)

    def _opened(self, watchdog: _Watchdog) -> None:
        with self._opening_lock:
            self._opening.discard(watchdog)

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
                self._watch_opening(watchdog, url)
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
            finally:
                self._opened(watchdog)
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
        from urllib.request import url2pathname  # file:// only (urllib.request is large)

        self.root = Path(url2pathname(parsed.path))

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


def read_up_to(response: Response, limit: int) -> bytes:
    chunks: list[bytes] = []
    total = 0
    while total < limit:
        chunk = response.read(min(CHUNK, limit - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
