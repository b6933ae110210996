"""A static file server for client tests: no edgereg code on the server side.

Serves a registry directory the way nginx does: ``ETag`` (from mtime and
size), ``If-None-Match`` -> 304, ``Range: bytes=N-`` -> 206 (416 past the
end). ``ranges=False`` and ``etags=False`` turn it into a plain server like
``http.server.SimpleHTTPRequestHandler``. Tests can also make it misbehave:
serve other bytes at a path, drop the connection part way through a body,
leave out Content-Length; and it counts the bytes it sends.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO


@dataclass
class Request:
    path: str
    headers: dict[str, str]
    status: int
    body_bytes: int
    wire_in: int
    wire_out: int


@dataclass
class ServerState:
    root: Path
    ranges: bool = True
    etags: bool = True
    overrides: dict[str, bytes] = field(default_factory=dict)
    drop_after: dict[str, int] = field(default_factory=dict)  # one-shot
    omit_length: set[str] = field(default_factory=set)
    redirects: dict[str, str] = field(default_factory=dict)  # path -> Location
    log: list[Request] = field(default_factory=list)
    in_flight: int = 0
    lock: threading.Condition = field(default_factory=threading.Condition)

    @property
    def requests(self) -> list[Request]:
        """Every request answered so far (waits for those still being answered)."""
        with self.lock:
            # A client may return before the handler thread has logged its
            # request; the count went up before the first response byte.
            self.lock.wait_for(lambda: self.in_flight == 0, timeout=5)
            return list(self.log)

    def body_bytes(self, prefix: str = "") -> int:
        return sum(r.body_bytes for r in self.requests if r.path.startswith(prefix))

    def statuses(self, prefix: str = "") -> list[int]:
        return [r.status for r in self.requests if r.path.startswith(prefix)]

    def reset_counts(self) -> None:
        with self.lock:
            self.lock.wait_for(lambda: self.in_flight == 0, timeout=5)
            self.log.clear()


class _Counting:
    """Wraps a socket file to count the bytes through it."""

    def __init__(self, inner: BinaryIO) -> None:
        self.inner = inner
        self.count = 0

    def write(self, data: bytes) -> int:
        self.count += len(data)
        return self.inner.write(data)

    def read(self, size: int = -1) -> bytes:
        data = self.inner.read(size)
        self.count += len(data)
        return data

    def readline(self, size: int = -1) -> bytes:
        data = self.inner.readline(size)
        self.count += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "static"
    sys_version = ""
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.rfile = _Counting(self.rfile)  # type: ignore[assignment]
        self.wfile = _Counting(self.wfile)  # type: ignore[assignment]

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        self._serve(head=False)

    def _serve(self, *, head: bool) -> None:
        state = self.server.state
        rel = self.path.split("?", 1)[0].lstrip("/")
        in_before = self.rfile.count  # type: ignore[attr-defined]
        out_before = self.wfile.count  # type: ignore[attr-defined]
        with state.lock:
            state.in_flight += 1
        try:
            status, sent = self._respond(state, rel, head)
        except BaseException:
            with state.lock:
                state.in_flight -= 1
                state.lock.notify_all()
            raise
        with state.lock:
            state.in_flight -= 1
            state.lock.notify_all()
            state.log.append(
                Request(
                    rel,
                    dict(self.headers.items()),
                    status,
                    sent,
                    self.rfile.count - in_before + len(self.raw_requestline),  # type: ignore[attr-defined]
                    self.wfile.count - out_before,  # type: ignore[attr-defined]
                )
            )

    def _respond(self, state: ServerState, rel: str, head: bool) -> tuple[int, int]:
        with state.lock:
            override = state.overrides.get(rel)
            location = state.redirects.get(rel)
        if location is not None:
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return 302, 0
        if override is not None:
            data = override
            etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        else:
            path = (state.root / rel).resolve()
            if state.root.resolve() not in path.parents or not path.is_file():
                return self._plain(404), 0
            data = path.read_bytes()
            info = path.stat()
            etag = f'"{info.st_mtime_ns:x}-{info.st_size:x}"'
        if state.etags and self.headers.get("If-None-Match") == etag:
            self.send_response(304)
            self.send_header("ETag", etag)
            self.end_headers()
            return 304, 0
        start = 0
        status = 200
        range_header = self.headers.get("Range")
        if state.ranges and range_header:
            match = re.fullmatch(r"bytes=(\d+)-", range_header.strip())
            if match:
                start = int(match.group(1))
                if start >= len(data):
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{len(data)}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return 416, 0
                status = 206
        body = data[start:]
        self.send_response(status)
        if state.etags:
            self.send_header("ETag", etag)
        if state.ranges:
            self.send_header("Accept-Ranges", "bytes")
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
        if rel in state.omit_length:
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if head:
            return status, 0
        with state.lock:
            drop = state.drop_after.pop(rel, None)
        if drop is not None:
            self.wfile.write(body[:drop])
            self.wfile.flush()
            self.close_connection = True
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)
            return status, drop
        try:
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client stopped reading (a refused body)
            return status, 0
        return status, len(body)

    def _plain(self, status: int) -> int:
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()
        return status


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    state: ServerState


class StaticServer:
    """A running static server on 127.0.0.1 (a context manager)."""

    def __init__(self, root: Path, *, ranges: bool = True, etags: bool = True) -> None:
        self.state = ServerState(root, ranges=ranges, etags=etags)
        self._server = _Server(("127.0.0.1", 0), _Handler)
        self._server.state = self.state
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self.port = self._server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}/"

    def start(self) -> StaticServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def __enter__(self) -> StaticServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class TcpProxy:
    """A loopback TCP proxy that counts bytes, can cut one connection short, or trickle.

    ``cut_after``: the first connection whose response reaches this many bytes
    (headers included) gets only that many, then both sides are closed: a
    connection dropped mid-download, in front of any server. ``rate``: the
    server's answers reach the client at about this many bytes per second.
    """

    def __init__(
        self, upstream_port: int, *, cut_after: int | None = None, rate: int | None = None
    ) -> None:
        self.upstream_port = upstream_port
        self.cut_after = cut_after
        self.rate = rate  # server -> client bytes per second, when set (a slow server)
        self.sent_up = 0  # client -> server bytes
        self.sent_down = 0  # server -> client bytes
        self.per_connection: list[tuple[int, int]] = []
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/"
        self._closed = False
        self._threads: list[threading.Thread] = []

    def __enter__(self) -> TcpProxy:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def reset(self) -> None:
        with self._lock:
            self.sent_up = self.sent_down = 0
            self.per_connection.clear()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            thread = threading.Thread(target=self._relay, args=(client,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _relay(self, client: socket.socket) -> None:
        upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
        counts = [0, 0]

        def pump(src: socket.socket, dst: socket.socket, index: int) -> None:
            with contextlib.suppress(OSError):
                while True:
                    data = src.recv(65536)
                    if not data:
                        break
                    if index == 1:
                        with self._lock:
                            cut = self.cut_after
                            if cut is not None and counts[1] + len(data) >= cut:
                                data = data[: cut - counts[1]]
                                self.cut_after = None
                            else:
                                cut = None
                        if cut is not None:
                            dst.sendall(data)
                            counts[1] += len(data)
                            for sock in (src, dst):
                                with contextlib.suppress(OSError):
                                    sock.shutdown(socket.SHUT_RDWR)
                            break
                    if index == 1 and self.rate:
                        step = max(1, self.rate // 20)
                        for start in range(0, len(data), step):
                            dst.sendall(data[start : start + step])
                            time.sleep(0.05)
                    else:
                        dst.sendall(data)
                    counts[index] += len(data)
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)

        down = threading.Thread(target=pump, args=(upstream, client, 1), daemon=True)
        down.start()
        pump(client, upstream, 0)
        down.join(timeout=30)
        client.close()
        upstream.close()
        with self._lock:
            self.sent_up += counts[0]
            self.sent_down += counts[1]
            self.per_connection.append((counts[0], counts[1]))


@contextlib.contextmanager
def serve(root: Path, **options: Any) -> Iterator[StaticServer]:
    with StaticServer(root, **options) as server:
        yield server


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


__all__ = ["Request", "ServerState", "StaticServer", "TcpProxy", "free_port", "serve"]
