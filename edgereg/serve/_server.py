"""The socket layer: HTTP/1.1 on the standard library's threading server.

One thread per connection, persistent connections, ``Content-Length`` on
every answer, ``TCP_NODELAY`` and small answers written in one send, an
idle/IO timeout per connection, a deep listen backlog for bursts of
clients. The request devices send most, a GET of a manifest they hold
(304), takes a short path: its head is parsed in one match and the app
answers it from memory (:meth:`App.remembered`) before any routing; the
answer is the one the long path gives, byte for byte.
:meth:`RegistryServer.drain` is the graceful stop: no new connections, idle
keep-alive connections closed, requests in flight finished (up to a deadline).

Hostile clients are bounded: a request head must arrive whole within
``head_timeout`` once begun (408) and stay within the size limits below
(414, 431), and so must a request body (a report). A connection costs at
most one thread and ~100 KiB. Idle sockets cannot starve the clients being
served: when ``max_connections`` are open, or one source address holds
``max_per_address``, a new connection closes the oldest idle one (of that
address first); a connection still receiving its request, head or body,
counts as idle, so one host holding thousands of sockets, silent or
trickling bodies, only churns its own; only when every connection is busy
answering is a new one answered 503 on the accepting thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import socket
import threading
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import TYPE_CHECKING, Any

from edgereg.errors import StorageError
from edgereg.protocol.envelope import TrustedKeys
from edgereg.serve._app import App, ReportSink, Request, Response, error_response
from edgereg.serve._authenticate import ReportAuthenticator
from edgereg.serve._ratelimit import Network, RateLimiter, SourceCaps
from edgereg.serve._validators import encode_headers
from edgereg.storage import Storage, open_storage

if TYPE_CHECKING:
    from edgereg.config import AppMetric, RolloutPolicy

log = logging.getLogger(__name__)
# A child of its own, so an operator can silence the access log and keep errors.
access_log = logging.getLogger(f"{__name__}.access")

#: Seconds a connection may stay idle, or a read or write may stall.
DEFAULT_TIMEOUT = 30.0
#: Bodies up to this size go out in the same send as the headers.
_SMALL_BODY = 64 * 1024
#: Seconds a client has to send a whole request head once it started one.
DEFAULT_HEAD_TIMEOUT = 10.0
#: Connections served at once; past it the oldest idle one is closed for a new
#: one, and with none idle a new one is answered 503 and closed at once.
DEFAULT_MAX_CONNECTIONS = 1024
#: Connections one source address may hold; past it its oldest idle one is
#: closed for its new one. Generous: devices behind a carrier NAT share one.
DEFAULT_MAX_PER_ADDRESS = 256
#: Limits of a request head (nginx's defaults are of the same order): longer
#: request line -> 414, longer header line, more header bytes or lines -> 431.
_MAX_REQUEST_LINE = 8192
_MAX_HEADER_LINE = 8192
_MAX_HEADER_BYTES = 32768
_MAX_HEADERS = 100
_RECV_SIZE = 65536
#: Seconds spent reading what a client still sends before a close (see _lingering_close).
_LINGER_SECONDS = 2.0
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
#: The common head (see _Handler._parse_simple): a GET or HEAD of a plain target,
#: HTTP/1.1, header lines of a token, a colon and a value, LF or CRLF.
_SIMPLE_HEAD = re.compile(
    rb"(GET|HEAD) (/[!-~]*) HTTP/1\.1((?:\r?\n[!#$%&'*+.^_`|~0-9A-Za-z-]+:[^\r\n]*)*)"
)
_SIMPLE_FIELD = re.compile(rb"\n([!#$%&'*+.^_`|~0-9A-Za-z-]+):([^\r\n]*)")
#: A head this short has no line over the line limits (and no more header bytes).
_SIMPLE_HEAD_BYTES = 8192
_VERSION = re.compile(r"HTTP/([0-9])\.([0-9])")


@dataclasses.dataclass
class _Conn:
    """What the server knows of one open connection."""

    address: str
    busy: bool = False  # answering a request
    since: float = dataclasses.field(default_factory=time.monotonic)  # idle since
    # Receiving a request body: evictable like an idle one (a trickled body must
    # not hold a slot it cannot lose), but a drain lets it finish.
    receiving: bool = False


class RegistryServer(ThreadingHTTPServer):
    """An HTTP server answering with an :class:`App`.

    Use :func:`make_server` or :func:`start_in_thread` rather than the constructor.

    Attributes:
        app: The request logic (holds the storage and the metrics).
        timeout_s: Idle and IO timeout per connection, in seconds.
    """

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 1024

    def __init__(
        self,
        address: tuple[str, int],
        app: App,
        *,
        timeout: float,
        head_timeout: float = DEFAULT_HEAD_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_per_address: int = DEFAULT_MAX_PER_ADDRESS,
        reuse_port: bool = False,
    ) -> None:
        # Worker processes each bind the same port; the kernel spreads connections.
        self.allow_reuse_port = reuse_port
        self.app = app
        self.timeout_s = timeout
        self.head_timeout_s = min(head_timeout, timeout)
        self.max_connections = max_connections
        self.max_per_address = max(1, min(max_per_address, max_connections))
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._connections: dict[_Handler, _Conn] = {}
        self._evicted: set[_Handler] = set()  # told to close, not gone yet: not counted
        self._per_address: dict[str, int] = {}  # open and starting connections, by address
        self._starting = 0  # accepted, handler thread not running yet
        self.evictions = 0  # idle connections closed to make room, since the start
        self._draining = False
        self._serving_thread: threading.Thread | None = None
        #: Called from the accept loop at least every 50 ms while it runs: a worker's
        #: heartbeat (``edgereg serve --workers``), silent when the loop is stuck.
        self.heartbeat: Callable[[], None] | None = None
        if ":" in address[0]:
            self.address_family = socket.AF_INET6
        super().__init__(address, _Handler)

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return int(self.server_address[1])

    @property
    def base_url(self) -> str:
        """``http://host:port`` of this server (IPv6 hosts in brackets)."""
        host = str(self.server_address[0])
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def draining(self) -> bool:
        """True once :meth:`drain` has begun."""
        return self._draining

    def service_actions(self) -> None:
        """Once per pass of the accept loop (``serve_forever``): beat the heartbeat."""
        super().service_actions()
        if self.heartbeat is not None:
            self.heartbeat()

    # -- connection bookkeeping (called by handlers) --------------------------------

    def process_request(self, request: Any, client_address: Any) -> None:
        """Count an accepted connection at once, before its thread starts.

        At a limit (``max_connections`` in all, ``max_per_address`` for its
        address) the oldest idle connection makes room, that address's own
        first; with none idle, answer 503 on the accepting thread and close:
        a flood of connections costs no threads and cannot exhaust memory.
        """
        address = _address_of(client_address)
        with self._lock:
            full = not self._make_room(address)
            if not full:
                self._starting += 1
                self._per_address[address] = self._per_address.get(address, 0) + 1
        if full:
            self.app.metrics.started()
            self.app.metrics.observe("other", "", 503, len(_BUSY), 0.0)
            with contextlib.suppress(OSError):
                request.setblocking(False)  # never wait for a client here
                request.send(_BUSY)
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            with self._lock:
                self._starting -= 1
                self._forget_address(address)
            raise

    def _make_room(self, address: str) -> bool:
        """Under the lock: whether a connection from ``address`` fits (an idle one may close)."""
        if self._per_address.get(address, 0) >= self.max_per_address:
            return self._evict_oldest_idle(address)
        open_now = len(self._connections) - len(self._evicted) + self._starting
        if open_now >= self.max_connections:
            return self._evict_oldest_idle(None)
        return True

    def _evict_oldest_idle(self, address: str | None) -> bool:
        """Close the oldest idle connection (of ``address``, else of anyone); False if none."""
        oldest: tuple[float, _Handler] | None = None
        for handler, conn in self._connections.items():
            if conn.busy or handler in self._evicted:
                continue
            if address is not None and conn.address != address:
                continue
            if oldest is None or conn.since < oldest[0]:
                oldest = (conn.since, handler)
        if oldest is None:
            return False
        handler = oldest[1]
        self._evicted.add(handler)
        self._forget_address(self._connections[handler].address)
        self.evictions += 1
        handler.stop_reading()
        return True

    def _forget_address(self, address: str) -> None:
        left = self._per_address.get(address, 0) - 1
        if left > 0:
            self._per_address[address] = left
        else:
            self._per_address.pop(address, None)

    def _register(self, handler: _Handler) -> None:
        conn = _Conn(_address_of(handler.client_address))
        handler._conn = conn
        with self._lock:
            self._starting -= 1
            self._connections[handler] = conn

    def _unregister(self, handler: _Handler) -> None:
        with self._lock:
            conn = self._connections.pop(handler, None)
            if conn is not None and handler not in self._evicted:
                self._forget_address(conn.address)
            self._evicted.discard(handler)
            self._changed.notify_all()

    def _set_receiving(self, handler: _Handler, receiving: bool) -> None:
        """Mark a connection as receiving a request body (still evictable) or not.

        Without the lock, as :meth:`_set_busy` (once per report: a wait among the
        request threads): the flag is written by its own connection's thread only.
        """
        handler._conn.receiving = receiving

    def _set_busy(self, handler: _Handler, busy: bool) -> bool:
        """Mark a connection busy or idle; returns whether the server is draining.

        Without the lock (twice per request, it was a tenth of a 304's time
        under load): each flag is written by its own connection's thread only,
        and what reads them under the lock (eviction, drain) already had to
        live with a request whose head was read just before it was marked busy.
        Only a drain waits on the change, and it also looks every 50 ms.
        """
        conn = handler._conn
        conn.busy = busy
        conn.receiving = False
        if not busy:
            conn.since = time.monotonic()
            if self._draining:
                with self._lock:
                    self._changed.notify_all()
        return self._draining

    # -- running --------------------------------------------------------------------

    def start(self) -> threading.Thread:
        """Run :meth:`serve_forever` in a daemon thread; returns the thread."""
        thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"edgereg-serve-{self.port}",
            daemon=True,
        )
        self._serving_thread = thread
        thread.start()
        return thread

    # -- stopping -------------------------------------------------------------------

    def drain(self, timeout: float = DEFAULT_TIMEOUT) -> bool:
        """Stop gracefully: refuse new connections, finish the requests in flight.

        Idle keep-alive connections are closed at once; a connection in the
        middle of an answer (a long blob download) is closed after it.
        Call from any thread but the one running :meth:`serve_forever`.

        Args:
            timeout: Seconds to wait for answers in flight.

        Returns:
            True if every connection finished in time.
        """
        with self._lock:
            self._draining = True
        if self._serving_thread is not None and self._serving_thread.is_alive():
            self.shutdown()  # the accept loop ends (waits for it: never from its thread)
        self.socket.close()  # the kernel refuses new connections from now on
        deadline = time.monotonic() + timeout
        with self._lock:
            while self._connections or self._starting:
                for handler, conn in self._connections.items():
                    if not conn.busy and not conn.receiving:
                        handler.stop_reading()
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.05))
            finished = not self._connections and not self._starting
        self.server_close()
        if self._serving_thread is not None:
            self._serving_thread.join(timeout=5)
        return finished

    def close(self, timeout: float = 5.0) -> None:
        """Drain (see :meth:`drain`) if serving, then release the socket."""
        if self._serving_thread is not None and self._serving_thread.is_alive():
            self.drain(timeout)
        else:
            self.server_close()

    def __exit__(self, *args: object) -> None:
        self.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Log an error that escaped a handler (the connection is dropped)."""
        log.exception("error on the connection from %s", client_address)


def blank_line(buffer: bytes) -> tuple[int, int] | None:
    r"""Where the first blank line of ``buffer`` starts and ends: the end of a request head.

    The first match of ``\r?\n\r?\n`` (a bare LF is tolerated, as RFC 9112
    allows), found with two ``bytes.find`` instead of a regex search, which tries
    a match at every CR of the head (8 us of a 304's time under load).
    """
    bare = buffer.find(b"\n\n")
    crlf = buffer.find(b"\n\r\n")
    if bare < 0 and crlf < 0:
        return None
    first = crlf if bare < 0 or 0 <= crlf < bare else bare  # the blank line's first LF
    start = first - 1 if first > 0 and buffer[first - 1] == 0x0D else first
    return start, first + (2 if buffer[first + 1] == 0x0A else 3)


def _address_of(client_address: Any) -> str:
    """The source host of a connection (its port is not part of who it is)."""
    if isinstance(client_address, tuple) and client_address:
        return str(client_address[0])
    return str(client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    server: RegistryServer
    _conn: _Conn

    def setup(self) -> None:
        self._unread_body = False
        self._buffer = b""
        self._simple = False
        self.timeout = self.server.timeout_s  # type: ignore[misc]  # per connection
        self._socket_timeout: float | None = self.timeout
        self.server._register(self)
        try:
            super().setup()
        except BaseException:
            self.server._unregister(self)  # finish() does not run when setup() fails
            raise

    def finish(self) -> None:
        try:
            super().finish()
            if self._unread_body:
                self._lingering_close()
        finally:
            self.server._unregister(self)

    def _lingering_close(self) -> None:
        """Read what the client still sends before closing.

        Closing a socket with unread bytes makes the kernel reset the
        connection, and the client may lose the answer it was sent.
        """
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + _LINGER_SECONDS
            for _ in range(64):  # at most 4 MiB, at most _LINGER_SECONDS
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self.connection.settimeout(left)
                if not self.connection.recv(65536):
                    break

    def stop_reading(self) -> None:
        """Wake an idle keep-alive read so the connection ends (used while draining)."""
        with contextlib.suppress(OSError):
            self.request.shutdown(socket.SHUT_RD)

    def handle_one_request(self) -> None:
        head = self._read_head()
        if head is None:
            self.close_connection = True
            return
        started = time.perf_counter()
        self.server.app.metrics.started()
        self._sent = 0
        self._route = "other"
        self._status = 0
        self.command = ""
        self.request_version = "HTTP/1.1"
        self._simple = False
        try:
            if isinstance(head, tuple):
                problem: tuple[int, str] | None = head
            else:
                self._simple = self._parse_simple(head)
                problem = None if self._simple else self._parse(head)
            body = b""
            if (
                problem is None
                and not self._simple
                and (
                    self._headers.get("content-length", "0").strip() not in ("", "0")
                    or "transfer-encoding" in self._headers
                )
            ):
                # Received while the connection still counts as idle: a body trickled
                # in (by up to --head-timeout) can be closed for a new client, as a
                # trickled head can, and never holds a slot busy (issue #30).
                self.server._set_receiving(self, True)
                read = self._read_body()
                if read is None:
                    # A body this server does not read would be taken for the next
                    # request: answer, then close (lingering, see finish()).
                    self.close_connection = True
                    self._unread_body = True
                elif isinstance(read, tuple):
                    problem = read
                else:
                    body = read
            if self.server._set_busy(self, True):  # draining
                self.close_connection = True
            if problem is not None:
                self.send_error(*problem)
                return
            self._answer(started, body)
        except OSError as exc:  # timeouts, resets, broken pipes
            log.debug("connection from %s ended: %s", self.client_address[0], exc)
            self.close_connection = True
        finally:
            self.server.app.metrics.observe(
                self._route, self.command, self._status, self._sent, time.perf_counter() - started
            )
            if self.server._set_busy(self, False):
                self.close_connection = True

    def _read_body(self) -> bytes | tuple[int, str] | None:
        """Read the body the app takes for this request: its bytes, an error, or None.

        None (nothing read) unless the app allows a body here and the
        Content-Length is within its limit: an oversized report is answered
        413 from its header alone. The body must arrive within ``head_timeout_s``.
        """
        limit = self.server.app.body_limit(self.command, self.path)
        declared = self._headers.get("content-length", "").strip()
        if limit is None or "transfer-encoding" in self._headers or not declared.isdigit():
            return None
        length = int(declared)
        if length > limit:
            return None
        body = self._buffer[:length]
        self._buffer = self._buffer[length:]  # a pipelined request after the body stays
        if len(body) < length and self._headers.get("expect", "").lower() == "100-continue":
            # curl asks before sending a body over 1 KiB, and waits a second otherwise.
            self.wfile.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        deadline = time.monotonic() + self.server.head_timeout_s
        while len(body) < length:
            left = deadline - time.monotonic()
            if left <= 0:
                return 408, "the request body did not arrive in time"
            self._set_timeout(left)
            try:
                chunk = self.connection.recv(min(_RECV_SIZE, length - len(body)))
            except TimeoutError:
                return 408, "the request body did not arrive in time"
            if not chunk:
                raise ConnectionResetError("the client closed in the middle of a body")
            body += chunk
        return body

    def _set_timeout(self, seconds: float) -> None:
        if seconds != self._socket_timeout:
            self.connection.settimeout(seconds)
            self._socket_timeout = seconds

    def _read_head(self) -> bytes | tuple[int, str] | None:
        """Read the next request head: its bytes, an error to answer, or None to close.

        The server owns the read buffer (``rfile`` is never used), so limits
        hold for the whole head, not per line: a keep-alive connection may be
        idle up to ``timeout_s``; once a request starts, its whole head must
        arrive within ``head_timeout_s`` (a client trickling a byte at a time
        is cut off) and may not exceed the size limits (each connection holds
        at most ~40 KiB of it in memory).
        """
        buffer = self._buffer
        deadline = None
        while True:
            end = blank_line(buffer)
            if end is not None:
                if end[0] > self._head_limit(buffer):
                    break
                self._buffer = buffer[end[1] :]  # pipelined requests stay buffered
                return buffer[: end[0]]
            if len(buffer) > self._head_limit(buffer):
                break
            if deadline is None and buffer:
                deadline = time.monotonic() + self.server.head_timeout_s
            try:
                if deadline is None:
                    self._set_timeout(self.server.timeout_s)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError
                    self._set_timeout(left)
                chunk = self.connection.recv(_RECV_SIZE)
            except TimeoutError:
                if not buffer:
                    return None  # idle keep-alive connection: just close
                return 408, "the request head did not arrive in time"
            except OSError:  # reset, or stop_reading() while draining
                return None
            if not chunk:
                return None  # the client closed (a half-sent head is dropped)
            buffer += chunk
        self._buffer = b""
        line_end = buffer.find(b"\n")
        if line_end < 0 or line_end > _MAX_REQUEST_LINE:
            return 414, f"the request line is longer than {_MAX_REQUEST_LINE} bytes"
        return 431, f"the request header fields are longer than {_MAX_HEADER_BYTES} bytes"

    @staticmethod
    def _head_limit(buffer: bytes) -> int:
        """How long a head starting like ``buffer`` may be, up to its blank line."""
        line_end = buffer.find(b"\n", 0, _MAX_REQUEST_LINE + 2)
        if line_end < 0:
            return _MAX_REQUEST_LINE + 1
        return line_end + 1 + _MAX_HEADER_BYTES + 4

    def _parse_simple(self, head: bytes) -> bool:
        """Parse the common head in one match: a GET or HEAD, HTTP/1.1, no body; False: not one.

        What devices polling manifests send. Every head it takes, :meth:`_parse`
        takes too, and reads the same way (its rules are a superset: limits,
        tokens, no folding); anything else goes there.
        """
        if len(head) > _SIMPLE_HEAD_BYTES or head.count(b"\n") > _MAX_HEADERS:
            return False
        found = _SIMPLE_HEAD.fullmatch(head)
        if found is None:
            return False
        headers: dict[str, str] = {}
        for name, value in _SIMPLE_FIELD.findall(found.group(3)):
            key = name.decode("ascii").lower()
            text = value.decode("latin-1").strip()
            headers[key] = f"{headers[key]}, {text}" if key in headers else text
        if "content-length" in headers or "transfer-encoding" in headers:
            return False  # what to do with a body is _parse's and _read_body's
        self.requestline = head[: head.find(b"\n")].decode("latin-1").rstrip("\r")
        self.command = found.group(1).decode("ascii")
        self.path = found.group(2).decode("latin-1")
        self.request_version = "HTTP/1.1"
        self._headers = headers
        connection = headers.get("connection")
        self.close_connection = connection is not None and "close" in {
            token.strip().lower() for token in connection.split(",")
        }
        return True

    def _parse(self, head: bytes) -> tuple[int, str] | None:
        """Parse the request line and headers (RFC 9112); an error to answer, or None.

        Stricter and much cheaper than the standard library's email-based
        parser: no HTTP/0.9, no obsolete line folding, tokens for names.
        """
        self.close_connection = True
        lines = head.decode("latin-1").split("\n")
        self.requestline = lines[0].rstrip("\r")
        if len(self.requestline) > _MAX_REQUEST_LINE:
            self.requestline = self.requestline[:200]
            return 414, f"the request line is longer than {_MAX_REQUEST_LINE} bytes"
        parts = self.requestline.split(" ")
        if len(parts) != 3 or not all(parts):
            return 400, "malformed request line"
        self.command, self.path, version = parts
        if not _TOKEN.fullmatch(self.command):
            return 400, "malformed method"
        found = _VERSION.fullmatch(version)
        if found is None:
            return 400, f"malformed HTTP version {version[:20]!r}"
        if found.group(1) != "1":
            return 505, "only HTTP/1.0 and HTTP/1.1 are supported"
        self.request_version = version
        if len(lines) - 1 > _MAX_HEADERS:
            return 431, f"more than {_MAX_HEADERS} header lines"
        headers: dict[str, str] = {}
        for raw in lines[1:]:
            if len(raw) > _MAX_HEADER_LINE:
                return 431, f"a header line is longer than {_MAX_HEADER_LINE} bytes"
            if raw[:1] in (" ", "\t"):
                return 400, "obsolete header line folding"
            name, sep, value = raw.partition(":")
            if not sep or not _TOKEN.fullmatch(name):
                return 400, "malformed header line"
            key = name.lower()
            value = value.strip()
            headers[key] = f"{headers[key]}, {value}" if key in headers else value
        self._headers = headers
        tokens = {t.strip().lower() for t in headers.get("connection", "").split(",")}
        if version == "HTTP/1.1":
            self.close_connection = "close" in tokens
        else:
            self.close_connection = "keep-alive" not in tokens
        return None

    def _answer(self, started: float, body: bytes = b"") -> None:
        app = self.server.app
        response = None
        if self._simple:
            response = app.remembered(self.command, self.path, self._headers.get("if-none-match"))
        if response is None:
            request = Request(
                self.command, self.path, self._headers, body=body, client=self.client_address[0]
            )
            response = app.handle(request)
        try:
            self._write(response, head=self.command == "HEAD")
        finally:
            response.close()
        if access_log.isEnabledFor(logging.INFO):
            access_log.info(
                '%s "%s %s" %d %d %.1fms',
                self.client_address[0],
                self.command,
                self.path[:200],
                response.status,
                self._sent,
                (time.perf_counter() - started) * 1000,
            )

    def _write(self, response: Response, *, head: bool) -> None:
        self._route = response.route
        self._status = response.status
        status_line = _STATUS_LINES.get(response.status)
        if status_line is None:
            status_line = f"HTTP/1.1 {response.status} {_reason(response.status)}\r\n".encode()
        encoded = response.encoded_headers
        if encoded is None:
            encoded = encode_headers(response.headers)
        parts = [status_line, _http_date_line(), encoded]
        length = response.content_length
        if length is not None:
            parts.append(b"Content-Length: %d\r\n" % length)
        if self.close_connection:
            parts.append(b"Connection: close\r\n")
        elif self.request_version == "HTTP/1.0":
            parts.append(b"Connection: keep-alive\r\n")
        parts.append(b"\r\n")
        head_bytes = b"".join(parts)
        body = response.body
        if head or length is None:
            self._send(head_bytes)
            return
        if isinstance(body, bytes):
            if len(body) <= _SMALL_BODY:
                self._send(head_bytes + body)
            else:
                self._send(head_bytes)
                self._send(body)
            return
        self._send(head_bytes)
        left = length
        try:
            for chunk in body.chunks():
                piece = chunk[:left]
                self._send(piece)
                left -= len(piece)
                if left == 0:
                    break
        except StorageError as exc:
            log.error("reading %s failed mid-answer: %s", self.path[:200], exc.message)
        if left:
            # The object was shorter than its size said: the framing is broken,
            # so the client must see the connection end, not wait for bytes.
            log.error("%s ended %d bytes early; closing the connection", self.path[:200], left)
            self.close_connection = True

    def _send(self, data: bytes) -> None:
        self.connection.sendall(data)  # what wfile.write does, less a memoryview per call
        self._sent += len(data)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Answer a request that could not be parsed, then close the connection."""
        self.close_connection = True
        self._unread_body = True  # the rest of what it sent is unread
        self._route = "other"
        response = error_response(code, message or _reason(code))
        with contextlib.suppress(OSError):
            self._write(response, head=self.command == "HEAD")

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format, *args)


_BUSY_BODY = b'{"error": "unavailable", "detail": "too many connections; try again shortly"}'
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
    b"Cache-Control: no-store\r\nRetry-After: 1\r\nConnection: close\r\n"
    b"Content-Length: %d\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)

_date_cache: tuple[int, bytes] = (0, b"")


def _http_date_line() -> bytes:
    """The Date header line, formatted once per second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        _date_cache = (now, f"Date: {formatdate(now, usegmt=True)}\r\n".encode("ascii"))
    return _date_cache[1]


def _reason(status: int) -> str:
    reasons = BaseHTTPRequestHandler.responses
    return reasons[status][0] if status in reasons else "Unknown"


#: Every status line this server sends, made once ("HTTP/1.1 304 Not Modified\r\n").
_STATUS_LINES = {
    int(status): f"HTTP/1.1 {int(status)} {reason}\r\n".encode("latin-1")
    for status, (reason, _) in BaseHTTPRequestHandler.responses.items()
}


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


def make_server(
    storage: Storage | str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 8080,
    *,
    manifest_max_age: int = 60,
    timeout: float = DEFAULT_TIMEOUT,
    head_timeout: float = DEFAULT_HEAD_TIMEOUT,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    max_per_address: int = DEFAULT_MAX_PER_ADDRESS,
    reuse_port: bool = False,
    endpoint_url: str | None = None,
    trusted: Callable[[], TrustedKeys] | None = None,
    policy: Callable[[str], RolloutPolicy] | None = None,
    declared_metrics: Callable[[str], Mapping[str, AppMetric]] | None = None,
    reports: ReportSink | None = None,
    report_limiter: RateLimiter | None = None,
    check_reports: bool = True,
    source_caps: SourceCaps | None = None,
    trusted_proxies: tuple[Network, ...] = (),
    report_authenticator: ReportAuthenticator | None = None,
    clock: Callable[[], datetime] | None = None,
    monotonic: Callable[[], float] | None = None,
) -> RegistryServer:
    """Bind a server over a registry (not serving yet: call ``serve_forever``).

    Args:
        storage: A :class:`~edgereg.storage.Storage`, or a registry URL or
            directory (opened with :func:`~edgereg.storage.open_storage`).
        host: Address to listen on.
        port: Port to listen on; 0 picks a free one (see ``server.port``).
        manifest_max_age: ``max-age`` of signed documents, in seconds.
        timeout: Idle and IO timeout per connection, in seconds.
        head_timeout: Seconds a client has to send a whole request head once
            it began one (slow clients are cut off; at most ``timeout``).
        max_connections: Connections open at once; past it a new connection
            closes the oldest idle one, and with none idle it is answered 503.
        max_per_address: Connections one source address may hold; past it
            its new connection closes its own oldest idle one (or gets 503).
        reuse_port: Bind with SO_REUSEPORT, so several worker processes
            listen on one port (``edgereg serve --workers``).
        endpoint_url: S3 endpoint, when ``storage`` is an ``s3://`` URL.
        trusted: The publisher keys the operator pinned, for the status page
            (serving manifests and blobs needs none: apps verify them).
        policy: A model's rollout policy (models.toml), for the status page's
            next step and soak time.
        declared_metrics: A unit's app metrics (models.toml), for the status
            page's guardrails on them.
        reports: The report store behind ``POST /v1/reports`` (404 without).
        report_limiter: The per-address rate limit of reports (the default when None).
        check_reports: Refuse reports of what the registry never served (see :class:`App`).
        source_caps: New report tokens per source network per period (the default when None).
        trusted_proxies: Proxies whose X-Forwarded-For names the client.
        report_authenticator: A last check of each report (app attestation).
        clock: The time a report is received (UTC); a simulation passes its own.
        monotonic: The report limits' clock, in seconds (rate limit, source caps,
            the served index); a simulation passes its own, so the limits hold
            in simulated time.

    Raises:
        OSError: The address cannot be bound (in use, not permitted).
        StorageError: ``storage`` is a URL that cannot be opened.
    """
    if not isinstance(storage, Storage):
        storage = open_storage(os.fspath(storage), endpoint_url=endpoint_url)
    app = App(
        storage,
        manifest_max_age=manifest_max_age,
        trusted=trusted,
        policy=policy,
        declared_metrics=declared_metrics,
        reports=reports,
        report_limiter=report_limiter,
        check_reports=check_reports,
        source_caps=source_caps,
        trusted_proxies=trusted_proxies,
        report_authenticator=report_authenticator,
        clock=clock or _utc_now,
        monotonic=monotonic or time.monotonic,
    )
    return RegistryServer(
        (host, port),
        app,
        timeout=timeout,
        head_timeout=head_timeout,
        max_connections=max_connections,
        max_per_address=max_per_address,
        reuse_port=reuse_port,
    )


def start_in_thread(
    storage: Storage | str | os.PathLike[str],
    host: str = "127.0.0.1",
    port: int = 0,
    **options: Any,
) -> tuple[RegistryServer, str]:
    """Serve a registry from a background thread (for tests and tools).

    Takes the arguments of :func:`make_server`, but ``port`` defaults to 0
    (a free port). Stop it with ``server.close()`` (or use the server as a
    context manager).

    Returns:
        The server and its base URL, e.g. ``http://127.0.0.1:41234``.
    """
    server = make_server(storage, host, port, **options)
    server.start()
    return server, server.base_url


class _Serving:
    """Context manager form of :func:`start_in_thread` (see :func:`serving`)."""

    def __init__(self, server: RegistryServer, url: str) -> None:
        self.server = server
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.server.close()


def serving(storage: Storage | str | os.PathLike[str], **options: Any) -> _Serving:
    """Run a server in a background thread for the length of a ``with`` block.

    Example: ``with serving(registry_dir) as base_url: ...``; takes the
    arguments of :func:`start_in_thread`.
    """
    server, url = start_in_thread(storage, **options)
    return _Serving(server, url)
