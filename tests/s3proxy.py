"""A dishonest S3 store for tests: a loopback HTTP proxy in front of moto.

Real S3 protocol, real sockets; only the conditional headers are tampered with:

* ``ignore``: strips ``If-None-Match`` and ``If-Match`` from writes before
  moto sees them, like a store that accepts conditional PUTs and overwrites
  anyway (the store of issue 11, finding 6);
* ``refuse``: answers such writes ``501 NotImplemented``, like a store that
  does not implement them; ``refuse-400`` answers ``400 InvalidArgument``;
* ``no-etag``: forwards everything but leaves ``ETag`` out of the answers, like
  a store that does not answer as S3 does;
* ``honest``: forwards everything (to count requests).

Every request line is recorded in :attr:`S3Proxy.requests`.
"""

from __future__ import annotations

import http.client
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

CONDITIONS = ("if-none-match", "if-match")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "upgrade", "proxy-connection"}
NOT_IMPLEMENTED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>NotImplemented</Code>'
    b"<Message>A header you provided implies functionality that is not implemented"
    b"</Message></Error>"
)

INVALID_ARGUMENT = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code>'
    b"<Message>Unsupported header If-None-Match</Message></Error>"
)


class S3Proxy:
    """Forward S3 requests to ``upstream``, tampering per ``mode``."""

    def __init__(self, upstream: str, mode: str) -> None:
        if mode not in ("ignore", "refuse", "refuse-400", "no-etag", "honest"):
            raise ValueError(mode)
        self.mode = mode
        self.requests: list[str] = []
        parts = urlsplit(upstream)
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _body(self) -> bytes:
                if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                    data = b""
                    while True:
                        size = int(self.rfile.readline().split(b";")[0], 16)
                        if size == 0:
                            while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                                pass
                            return data
                        data += self.rfile.read(size)
                        self.rfile.readline()
                return self.rfile.read(int(self.headers.get("Content-Length") or 0))

            def _forward(self) -> None:
                body = self._body()
                conditional = any(name in self.headers for name in CONDITIONS)
                write = self.command in ("PUT", "POST")
                proxy.requests.append(f"{self.command} {self.path}{' (if)' if conditional else ''}")
                if write and conditional and proxy.mode.startswith("refuse"):
                    status, error = (
                        (400, INVALID_ARGUMENT)
                        if proxy.mode == "refuse-400"
                        else (501, NOT_IMPLEMENTED)
                    )
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(error)))
                    self.end_headers()
                    self.wfile.write(error)
                    return
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in HOP_BY_HOP
                    and not (write and proxy.mode == "ignore" and k.lower() in CONDITIONS)
                }
                headers["Content-Length"] = str(len(body))
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=60)
                try:
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    answer = upstream.getresponse()
                    data = answer.read()
                finally:
                    upstream.close()
                self.send_response(answer.status, answer.reason)
                for k, v in answer.getheaders():
                    if k.lower() in HOP_BY_HOP or k.lower() == "content-length":
                        continue
                    if proxy.mode == "no-etag" and k.lower() == "etag":
                        continue
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _forward

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> S3Proxy:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
