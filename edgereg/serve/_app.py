"""The request logic of ``edgereg serve``, apart from any socket.

:meth:`App.handle` takes a :class:`Request` (method, raw target, headers)
and returns a :class:`Response` (status, headers, body). It routes, checks
parameters, reads the registry through :class:`~edgereg.storage.Storage`,
and applies the caching rules:

* signed documents (manifests, rollout states, release records, keys):
  ``Cache-Control: public, max-age=<manifest_max_age>`` and a strong ETag,
  the quoted lowercase hex SHA-256 of the bytes; ``If-None-Match`` → 304.
  The ETag and bytes are made once per version of the file and answered
  from memory while its storage stamp is unchanged (:mod:`._validators`):
  a 304, or a 200 of an unchanged document, opens no file;
* blobs: the ETag is the quoted digest from the path (which, the registry
  being content-addressed, is the SHA-256 of the bytes too), immutable
  caching, single byte ranges (206, or 416 with ``Content-Range: bytes */size``),
  ``If-Range``; the body streams from storage in chunks.

``POST /v1/reports`` (with a report store; 404 without) takes one device
report: rate-limited per client address (429 with Retry-After), JSON of at
most :data:`~edgereg.protocol.reports.MAX_REPORT_BYTES` (415, 411, 413),
parsed by :func:`~edgereg.protocol.reports.parse_report` (400 with its
message), stored by the store's upsert (202; 503 while the store is down).
It never touches the registry storage.

Never served, answered 403 and logged instead: an object that is a
symbolic link out of the registry root, anything holding a PEM private key
block, and anything under ``keys/`` that is not exactly one PEM public key.

The socket layer (:mod:`edgereg.serve._server`) writes the response and
records metrics; tests call :meth:`App.handle` directly.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, NamedTuple, Protocol

from edgereg.errors import StorageError
from edgereg.protocol import layout
from edgereg.protocol.envelope import TrustedKeys
from edgereg.protocol.reports import MAX_REPORT_BYTES, Report, ReportError, parse_report
from edgereg.reports.admission import REFUSALS
from edgereg.reports.summary import SummarySource
from edgereg.serve import _routes as routes
from edgereg.serve._http import (
    BadTarget,
    Unsatisfiable,
    if_range_matches,
    none_match,
    parse_range,
    quote_etag,
    request_path,
)
from edgereg.serve._metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgereg.serve._metrics import Metrics
from edgereg.serve._ratelimit import (
    Network,
    RateLimiter,
    SourceCaps,
    forwarded_client,
    retry_after,
)
from edgereg.serve._validators import Document, Remembered, Seen, encode_headers
from edgereg.storage import NotFound, ReadStream, Storage, UnsafeObject

if TYPE_CHECKING:
    from edgereg.config import AppMetric, RolloutPolicy
    from edgereg.serve._admission import ServedIndex
    from edgereg.serve._authenticate import ReportAuthenticator

log = logging.getLogger(__name__)

ALLOW = "GET, HEAD"
IMMUTABLE_CACHE = "public, max-age=31536000, immutable"
NO_STORE = "no-store"
#: Bytes read from storage per chunk when streaming a blob.
CHUNK_SIZE = 256 * 1024
#: Bytes fetched per ranged storage read when serving a Range from an offset.
RANGE_CHUNK_SIZE = 1024 * 1024

#: Any PEM private key block (PKCS#8, encrypted, RSA, EC, OpenSSH ...): never served.
_PRIVATE_KEY = re.compile(rb"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
#: What ``keys/<id>.pem`` must be: one PEM public key block and nothing else.
_PUBLIC_KEY = re.compile(
    rb"-----BEGIN PUBLIC KEY-----\r?\n(?:[A-Za-z0-9+/=]{1,76}\r?\n){1,40}"
    rb"-----END PUBLIC KEY-----(?:\r?\n)?"
)
#: Bytes at the start of a blob checked for a private key before a ranged answer.
_SNIFF_BYTES = 4096
#: Request targets whose route is remembered (then forgotten all at once).
_MAX_TARGETS = 4096

_CONTENT_TYPES = {
    routes.MANIFEST.name: "application/json",
    routes.STATE.name: "application/json",
    routes.RELEASE.name: "application/json",
    routes.KEY.name: "application/x-pem-file",
}


class _Target(NamedTuple):
    """What a request target names: its decoded path, route and parameters."""

    path: str
    route: routes.Route
    params: dict[str, str]
    key: str | None  # the registry key, for a registry object


@dataclass(frozen=True)
class Request:
    """One HTTP request as the app sees it.

    Attributes:
        method: The method token, as sent (``GET``, ``HEAD``, ...).
        target: The raw request target (``/manifests/digits/high.json``).
        headers: Header values by lowercase name; repeated headers joined with ", ".
        body: The request body, read only where :meth:`App.body_limit` allows one.
        client: The peer's address (the rate limit's key).
    """

    method: str
    target: str
    headers: Mapping[str, str] = field(default_factory=dict)
    body: bytes = b""
    client: str = ""

    def header(self, name: str) -> str | None:
        """A header's value, or None."""
        return self.headers.get(name.lower())


class Body(Protocol):
    """A response body streamed from storage."""

    length: int

    def chunks(self) -> Iterator[bytes]:
        """Yield the body's bytes; at most ``length`` in total."""
        ...

    def close(self) -> None:
        """Release the storage stream (called after the body is sent or abandoned)."""
        ...


class StreamBody:
    """The first ``length`` bytes of an open storage stream.

    ``first`` is what was already read from the stream (it is sent first).
    """

    def __init__(
        self,
        stream: ReadStream,
        length: int,
        chunk_size: int = CHUNK_SIZE,
        *,
        first: bytes = b"",
    ) -> None:
        self.length = length
        self._stream = stream
        self._chunk_size = chunk_size
        self._first = first

    def chunks(self) -> Iterator[bytes]:
        """Yield chunks until ``length`` bytes or the end of the stream."""
        left = self.length
        if self._first:
            first, self._first = self._first[:left], b""
            left -= len(first)
            yield first
        while left > 0:
            chunk = self._stream.read(min(self._chunk_size, left))
            if not chunk:
                return
            left -= len(chunk)
            yield chunk

    def close(self) -> None:
        """Close the storage stream."""
        self._stream.close()


class RangeBody:
    """``length`` bytes from offset ``start`` of a stored object, read in ranged chunks."""

    def __init__(
        self,
        storage: Storage,
        key: str,
        start: int,
        length: int,
        chunk_size: int = RANGE_CHUNK_SIZE,
    ) -> None:
        self.length = length
        self._storage = storage
        self._key = key
        self._start = start
        self._chunk_size = chunk_size

    def chunks(self) -> Iterator[bytes]:
        """Yield ranged reads until ``length`` bytes or the end of the object."""
        offset, left = self._start, self.length
        while left > 0:
            chunk = self._storage.get_range(self._key, offset, min(self._chunk_size, left))
            if not chunk:
                return
            offset += len(chunk)
            left -= len(chunk)
            yield chunk

    def close(self) -> None:
        """Nothing to release: each chunk is its own read."""


@dataclass
class Response:
    """What to send back.

    Attributes:
        status: The status code.
        headers: Header name/value pairs, in order; the socket layer adds
            ``Date``, ``Content-Length`` and ``Connection``.
        body: The bytes of the body, or a :class:`Body` streamed from storage.
            For a HEAD request the body is never sent, but its length is the
            Content-Length.
        route: The route name (a metrics label).
    """

    status: int
    headers: list[tuple[str, str]]
    body: bytes | Body = b""
    route: str = routes.OTHER
    #: ``headers`` as they go on the wire ("Name: value\r\n" each), when made once
    #: for many answers (a remembered document): the socket layer sends them as they are.
    encoded_headers: bytes | None = None

    @property
    def content_length(self) -> int | None:
        """The Content-Length to send; None for a status that has no body (304)."""
        if self.status == 304 or self.status < 200 or self.status == 204:
            return None
        return len(self.body) if isinstance(self.body, bytes) else self.body.length

    def header(self, name: str) -> str | None:
        """The first value of a response header, or None."""
        lowered = name.lower()
        return next((v for k, v in self.headers if k.lower() == lowered), None)

    def close(self) -> None:
        """Release a streamed body's storage resources."""
        if not isinstance(self.body, bytes):
            self.body.close()


def error_response(status: int, message: str, route: str = routes.OTHER) -> Response:
    """A small JSON error: ``{"error": <reason>, "detail": <message>}``, never cached."""
    body = json.dumps({"error": _REASONS.get(status, "error"), "detail": message}).encode()
    headers = [
        ("Content-Type", "application/json"),
        ("Cache-Control", NO_STORE),
        ("X-Content-Type-Options", "nosniff"),
    ]
    if status == 405:
        headers.append(("Allow", ALLOW))
    return Response(status, headers, body, route)


_REASONS = {
    400: "bad request",
    401: "not authenticated",
    403: "forbidden",
    404: "not found",
    405: "method not allowed",
    408: "request timeout",
    411: "length required",
    413: "request too large",
    414: "request line too long",
    415: "unsupported media type",
    416: "range not satisfiable",
    422: "report refused",
    429: "too many requests",
    431: "request header fields too large",
    500: "internal error",
    503: "unavailable",
    505: "http version not supported",
}


class ReportSink(SummarySource, Protocol):
    """Where ``POST /v1/reports`` puts a report (a :class:`~edgereg.reports.ReportStore`).

    Its failures are :class:`~edgereg.errors.StorageError` (the store's error
    type is one): the endpoint answers 503 and the registry is unaffected.
    """

    def ingest(self, report: Report, received_at: datetime, source: str | None = None) -> None:
        """Store one report; ``source`` is its network (an IPv4 /24, an IPv6 /48) when known."""
        ...


#: The answer to a stored report (its header lines encoded once).
_ACCEPTED_BODY = b'{"status": "accepted"}'
_ACCEPTED = (("Content-Type", "application/json"), ("Cache-Control", NO_STORE))
_ACCEPTED_WIRE = encode_headers(_ACCEPTED)

#: Reports per second and burst per client address, by default (``--reports-rate``).
DEFAULT_REPORT_RATE = 5.0
DEFAULT_REPORT_BURST = 50


def _refused(route: str) -> Response:
    # The reason is in the server log only: a client learns nothing about the file.
    return error_response(403, "this object is not served; see the server log", route)


class App:
    """The read-only registry over HTTP.

    Args:
        storage: The registry to serve.
        manifest_max_age: ``max-age`` (seconds) for manifests, rollout states,
            release records and keys: how long a CDN or client may reuse one
            without asking again.
        metrics: Where the server counts requests (a fresh one by default).
        trusted: The pinned publisher keys the status page verifies against;
            without them the page says that it shows unverified state.
        policy: A model's rollout policy (from models.toml), for the status
            page's next step and soak time; unknown without.
        declared_metrics: A unit's app metrics (from models.toml), for the
            status page's guardrails on them; none without.
        reports: Where ``POST /v1/reports`` stores reports; without one the
            path answers 404.
        report_limiter: The per-address rate limit of reports (a default one
            when None; pass a generous one to benchmark).
        clock: The time a report is received (UTC); injected for tests.
        monotonic: The rate limiter's clock, in seconds; injected for tests.
        check_reports: Refuse (422, counted) a report whose unit, tier,
            sequence, arm and version the signed state and manifests never
            served (:mod:`edgereg.reports.admission`). On by default.
        source_caps: New report tokens per source network per period (a
            default :class:`SourceCaps` when None).
        trusted_proxies: Networks of reverse proxies whose X-Forwarded-For is
            believed for the client address; none by default (the header is
            then ignored: any client can write it).
        report_authenticator: A last check of each admitted report (app
            attestation); a refusal is answered 401 and counted.
    """

    def __init__(
        self,
        storage: Storage,
        *,
        manifest_max_age: int = 60,
        metrics: Metrics | None = None,
        trusted: Callable[[], TrustedKeys] | None = None,
        policy: Callable[[str], RolloutPolicy] | None = None,
        declared_metrics: Callable[[str], Mapping[str, AppMetric]] | None = None,
        reports: ReportSink | None = None,
        report_limiter: RateLimiter | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc),
        monotonic: Callable[[], float] = time.monotonic,
        check_reports: bool = True,
        source_caps: SourceCaps | None = None,
        trusted_proxies: tuple[Network, ...] = (),
        report_authenticator: ReportAuthenticator | None = None,
    ) -> None:
        if manifest_max_age < 0:
            raise ValueError("manifest_max_age must not be negative")
        self.storage = storage
        self.trusted = trusted
        self.policy = policy
        self.declared_metrics = declared_metrics
        self.manifest_max_age = manifest_max_age
        self.metrics = metrics if metrics is not None else Metrics()
        self.reports = reports
        self.report_limiter = report_limiter or RateLimiter(
            DEFAULT_REPORT_RATE, DEFAULT_REPORT_BURST
        )
        self._clock = clock
        self._monotonic = monotonic
        self._openapi: bytes | None = None
        self.source_caps = source_caps or SourceCaps()
        self.trusted_proxies = trusted_proxies
        self.report_authenticator = report_authenticator
        # Raw request target -> its path, route and parameters: a pure function of
        # the target, kept for the registry's objects (what devices poll).
        self._targets: dict[str, _Target] = {}
        self.documents: Remembered[Document] = Remembered()
        self.blobs_seen: Remembered[Seen] = Remembered()
        self._cache_control = f"public, max-age={manifest_max_age}"
        self.served: ServedIndex | None = None
        if check_reports and reports is not None:
            from edgereg.serve._admission import ServedIndex

            self.served = ServedIndex(storage, trusted=trusted, monotonic=monotonic)

    def body_limit(self, method: str, target: str) -> int | None:
        """The most body bytes the socket layer may read for a request; None: read none.

        Only a report to a server that keeps reports has a body worth reading;
        any other body is left unread and the connection closed after the answer.
        """
        if method != "POST" or self.reports is None:
            return None
        if target == routes.REPORTS.template:  # the usual spelling, without decoding it
            return MAX_REPORT_BYTES
        try:
            path = request_path(target)
        except BadTarget:
            return None
        return MAX_REPORT_BYTES if routes.REPORTS.shape.fullmatch(path) else None

    def remembered(self, method: str, target: str, if_none_match: str | None) -> Response | None:
        """The answer to a GET or HEAD of an unchanged document, from memory; None otherwise.

        What :meth:`handle` would answer (the same status, headers and body),
        for a target it resolved before and a document whose storage stamp is
        the one remembered; None sends the request down :meth:`handle`. The
        socket layer asks this first: the hot path of devices polling their
        manifest costs one stat and no parsing of the target.
        """
        resolved = self._targets.get(target)
        if resolved is None or method not in ("GET", "HEAD") or resolved.route is routes.BLOB:
            return None
        key = resolved.key
        if key is None:
            return None
        document = self.documents.get(key)
        if document is None:
            return None
        try:
            if self.storage.stamp(key) != document.stamp:
                return None
        except StorageError:
            return None  # handle() answers it (404, 403, 503) and forgets the document
        return self._document_answer(document, if_none_match, resolved.route.name)

    def handle(self, request: Request) -> Response:
        """Answer one request (never raises for anything a client can send)."""
        try:
            return self._handle(request)
        except Exception:  # the server must answer; the log keeps the traceback
            log.exception("internal error answering %s %r", request.method, request.target[:200])
            return error_response(500, "internal error; see the server log")

    def _handle(self, request: Request) -> Response:
        resolved = self._targets.get(request.target)
        if resolved is None:
            try:
                path = request_path(request.target)
            except BadTarget as exc:
                return error_response(400, str(exc))
            if routes.REPORTS.shape.fullmatch(path):
                return self._report(request)
            try:
                found = routes.match(path)
            except routes.BadParameter as exc:
                if request.method not in ("GET", "HEAD"):
                    return error_response(405, f"{request.method} is not allowed; use GET or HEAD")
                return error_response(400, str(exc))
            if found is None:
                if request.method not in ("GET", "HEAD"):
                    return error_response(405, f"{request.method} is not allowed; use GET or HEAD")
                return error_response(404, f"no such resource: {path[:200]}")
            resolved = _Target(path, found[0], found[1], found[0].key(found[1]))
            if resolved.key is not None:  # a registry object: polled, worth keeping
                if len(self._targets) >= _MAX_TARGETS:
                    self._targets.clear()  # a flood of odd targets only costs the parsing
                self._targets[request.target] = resolved
        path, route, params, key = resolved
        if request.method not in ("GET", "HEAD"):
            return error_response(
                405, f"{request.method} is not allowed; use GET or HEAD", route.name
            )
        try:
            if route is routes.BLOB:
                return self._blob(request, params["digest"])
            if route is routes.STATUS_PAGE:
                return self._status_page()
            if route is routes.HEALTHZ:
                return self._healthz()
            if route is routes.METRICS:
                return self._metrics()
            if route is routes.OPENAPI:
                return self._openapi_document(request)
            assert key is not None
            return self._document(request, route, key)
        except NotFound:
            return error_response(404, f"not in the registry: {path[:200]}", route.name)
        except UnsafeObject as exc:
            log.error("refusing %s: %s", exc.key, exc.message)
            return _refused(route.name)
        except StorageError as exc:
            log.warning("storage error answering %s: %s", path[:200], exc.message)
            response = error_response(503, "the registry storage is unavailable", route.name)
            response.headers.append(("Retry-After", "5"))
            return response

    # -- registry objects -----------------------------------------------------------

    def _document(self, request: Request, route: routes.Route, key: str) -> Response:
        document = self._current_document(route, key)
        if document is None:
            return _refused(route.name)
        return self._document_answer(document, request.headers.get("if-none-match"), route.name)

    @staticmethod
    def _document_answer(document: Document, if_none_match: str | None, route: str) -> Response:
        if none_match(if_none_match, document.etag):
            return Response(
                304, list(document.not_modified), b"", route, document.not_modified_wire
            )
        return Response(200, list(document.ok), document.body, route, document.ok_wire)

    def _current_document(self, route: routes.Route, key: str) -> Document | None:
        """The document at ``key`` as served now; None when it must not be served (logged).

        From memory while its stamp is unchanged; read, checked and hashed otherwise.
        """
        known = self.documents.get(key)
        if known is not None:
            try:
                if self.storage.stamp(key) == known.stamp:
                    return known
            except NotFound:
                self.documents.forget(key)
                raise
        data, stamp = self.storage.get_stamped(key)
        if b"PRIVATE KEY-----" in data and _PRIVATE_KEY.search(data):
            log.error(
                "refusing %s: it holds a private key; remove it from the registry and "
                "rotate that key (docs/operations/keys.md)",
                key,
            )
            self.documents.forget(key)
            return None
        if route is routes.KEY and not _PUBLIC_KEY.fullmatch(data):
            log.error("refusing %s: it is not one PEM public key and nothing else", key)
            self.documents.forget(key)
            return None
        etag = quote_etag(hashlib.sha256(data).hexdigest())
        cache = self._cache_control
        document = Document.of(
            stamp,
            etag,
            data,
            ok=(
                ("Content-Type", _CONTENT_TYPES[route.name]),
                ("ETag", etag),
                ("Cache-Control", cache),
                ("X-Content-Type-Options", "nosniff"),
            ),
            not_modified=(("ETag", etag), ("Cache-Control", cache)),
        )
        if stamp is None:
            self.documents.forget(key)  # changed just now: read it again next time
        else:
            self.documents.put(key, document, len(data))
        return document

    def _check_blob(self, key: str) -> None:
        """Raise NotFound (or UnsafeObject) unless the blob is there; no read once seen."""
        known = self.blobs_seen.get(key)
        if known is not None:
            try:
                if self.storage.stamp(key) == known.stamp:
                    return
            except NotFound:
                self.blobs_seen.forget(key)
                raise
        _, stamp = self.storage.size_stamped(key)
        if stamp is not None:
            self.blobs_seen.put(key, Seen(stamp))

    def _blob(self, request: Request, digest: str) -> Response:
        key = layout.blob_path(digest)
        name = routes.BLOB.name
        etag = quote_etag(digest)
        if none_match(request.header("if-none-match"), etag):
            self._check_blob(key)  # a 304 still means "it exists"
            return Response(304, [("ETag", etag), ("Cache-Control", IMMUTABLE_CACHE)], b"", name)
        size = self.storage.size(key)
        headers = [
            ("Content-Type", "application/octet-stream"),
            ("ETag", etag),
            ("Cache-Control", IMMUTABLE_CACHE),
            ("Accept-Ranges", "bytes"),
            ("X-Content-Type-Options", "nosniff"),
        ]
        byte_range = None
        if request.method == "GET" and if_range_matches(request.header("if-range"), etag):
            try:
                byte_range = parse_range(request.header("range"), size)
            except Unsatisfiable as exc:
                response = error_response(416, f"{exc}; the blob has {size} bytes", name)
                response.headers += [
                    ("Content-Range", f"bytes */{size}"),
                    ("Accept-Ranges", "bytes"),
                ]
                return response
        if request.method == "HEAD":
            # HEAD answers what GET would, so the same check (one small read).
            if _PRIVATE_KEY.search(self.storage.get_range(key, 0, _SNIFF_BYTES)):
                return self._refuse_blob(key)
            return Response(200, headers, _Unopened(size), name)
        if byte_range is None or byte_range.start == 0:
            length = size if byte_range is None else byte_range.length
            stream = self.storage.open_read(key)
            try:
                # The first chunk is read before anything is sent, to check it.
                first = stream.read(min(CHUNK_SIZE, length))
            except BaseException:
                stream.close()
                raise
            if _PRIVATE_KEY.search(first):
                stream.close()
                return self._refuse_blob(key)
            body: Body = StreamBody(stream, length, first=first)
        else:
            if _PRIVATE_KEY.search(self.storage.get_range(key, 0, _SNIFF_BYTES)):
                return self._refuse_blob(key)
            body = RangeBody(self.storage, key, byte_range.start, byte_range.length)
        if byte_range is None:
            return Response(200, headers, body, name)
        headers.append(("Content-Range", byte_range.content_range()))
        return Response(206, headers, body, name)

    def _refuse_blob(self, key: str) -> Response:
        log.error("refusing %s: it holds a private key; remove it from the registry", key)
        return _refused(routes.BLOB.name)

    # -- device reports ---------------------------------------------------------------

    def _report(self, request: Request) -> Response:
        name = routes.REPORTS.name
        if request.method != "POST":
            response = error_response(405, f"{request.method} is not allowed; use POST", name)
            response.headers = [(k, "POST" if k == "Allow" else v) for k, v in response.headers]
            return response
        if self.reports is None:
            return error_response(
                404,
                "this server keeps no reports; start edgereg serve with --reports STORE_URL "
                "(or [reports] store in models.toml), or send reports to your collector",
                name,
            )
        client = forwarded_client(
            request.client, request.header("x-forwarded-for"), self.trusted_proxies
        )
        wait = self.report_limiter.take(client, self._monotonic())
        if wait:
            response = error_response(429, "too many reports from this address; slow down", name)
            response.headers.append(("Retry-After", retry_after(wait)))
            return response
        headers = request.headers
        if headers.get("transfer-encoding") is not None:
            return error_response(411, "send a report with Content-Length, not chunked", name)
        declared = headers.get("content-length")
        if declared is None or not declared.strip().isdigit():
            return error_response(411, "a report needs a Content-Length", name)
        if int(declared) > MAX_REPORT_BYTES:
            return error_response(
                413,
                f"a report is at most {MAX_REPORT_BYTES} bytes; this one says {declared[:20]}",
                name,
            )
        media = (headers.get("content-type") or "").split(";", 1)[0].strip().lower()
        if media != "application/json":
            return error_response(
                415, f"a report is application/json, not {media[:60] or 'untyped'}", name
            )
        if len(request.body) != int(declared):
            return error_response(400, "the body is shorter than its Content-Length", name)
        try:
            report = parse_report(request.body)
        except ReportError as exc:
            return error_response(400, str(exc), name)
        refusal = self._admission(report)
        # Authenticated before the source cap counts it: a report the authenticator
        # refuses must not use up its network's new tokens (issue #30).
        if refusal is None and self.report_authenticator is not None:
            reason = self.report_authenticator.authenticate(
                report, request.body, request.headers, client
            )
            if reason is not None:
                self.metrics.refused(reason[:40])
                refusal = error_response(
                    401, f"{reason[:40]}: the report is not authenticated", name
                )
        if refusal is None:
            refusal = self._source_cap(report, client)
        if refusal is not None:
            return refusal
        source = self.source_caps.source(client)
        try:
            if source is None:
                self.reports.ingest(report, self._clock())
            else:
                self.reports.ingest(report, self._clock(), source=source)
        except StorageError as exc:
            log.warning("report store error: %s", exc.message)
            response = error_response(503, "the report store is unavailable; retry later", name)
            response.headers.append(("Retry-After", "30"))
            return response
        return Response(202, list(_ACCEPTED), _ACCEPTED_BODY, name, _ACCEPTED_WIRE)

    def _admission(self, report: Report) -> Response | None:
        """The answer refusing a report the registry never served, or None."""
        name = routes.REPORTS.name
        if self.served is not None:
            try:
                reason = self.served.check(report)
            except StorageError as exc:
                log.warning("cannot check a report against the registry: %s", exc.message)
                response = error_response(503, "the registry storage is unavailable", name)
                response.headers.append(("Retry-After", "5"))
                return response
            if reason is not None:
                self.metrics.refused(reason)
                return error_response(
                    422, f"{reason}: {REFUSALS[reason]} (docs/operations/report-threats.md)", name
                )
        return None

    def _source_cap(self, report: Report, client: str) -> Response | None:
        """The answer refusing a new token past its network's cap, or None (counted)."""
        name = routes.REPORTS.name
        wait = self.source_caps.take(client, report.token, self._monotonic())
        if wait:
            self.metrics.refused("source-cap")
            response = error_response(
                429, "too many new report tokens from this network; try later", name
            )
            response.headers.append(("Retry-After", retry_after(wait)))
            return response
        return None

    # -- built-in pages -------------------------------------------------------------

    def _healthz(self) -> Response:
        name = routes.HEALTHZ.name
        try:
            self.storage.list(layout.KEYS_PREFIX)
        except StorageError as exc:
            log.warning("health check failed: %s", exc.message)
            body = json.dumps(
                {"status": "unavailable", "detail": "the registry storage is unreachable"}
            ).encode()
            headers = [("Content-Type", "application/json"), ("Cache-Control", NO_STORE)]
            return Response(503, headers, body, name)
        body = json.dumps({"status": "ok"}).encode()
        return Response(
            200, [("Content-Type", "application/json"), ("Cache-Control", NO_STORE)], body, name
        )

    def _metrics(self) -> Response:
        body = self.metrics.render().encode()
        headers = [("Content-Type", METRICS_CONTENT_TYPE), ("Cache-Control", NO_STORE)]
        return Response(200, headers, body, routes.METRICS.name)

    def _openapi_document(self, request: Request) -> Response:
        if self._openapi is None:
            from edgereg.serve._openapi import openapi_document

            self._openapi = json.dumps(openapi_document(), indent=1).encode()
        etag = quote_etag(hashlib.sha256(self._openapi).hexdigest())
        headers = [("ETag", etag), ("Cache-Control", "no-cache")]
        if none_match(request.header("if-none-match"), etag):
            return Response(304, headers, b"", routes.OPENAPI.name)
        return Response(
            200,
            [("Content-Type", "application/json"), *headers],
            self._openapi,
            routes.OPENAPI.name,
        )

    def _status_page(self) -> Response:
        from edgereg.serve._status_page import render_status_page

        body = render_status_page(
            self.storage,
            trusted=self.trusted,
            policy=self.policy,
            declared_metrics=self.declared_metrics,
            reports=self.reports,
        ).encode()
        headers = [
            ("Content-Type", "text/html; charset=utf-8"),
            ("Cache-Control", "no-cache"),
            # No script, font or image from anywhere: the page is plain HTML + inline CSS.
            ("Content-Security-Policy", "default-src 'none'; style-src 'unsafe-inline'"),
            ("X-Content-Type-Options", "nosniff"),
        ]
        return Response(200, headers, body, routes.STATUS_PAGE.name)


class _Unopened:
    """The body of a HEAD answer: a length, nothing to read."""

    def __init__(self, length: int) -> None:
        self.length = length

    def chunks(self) -> Iterator[bytes]:
        return iter(())

    def close(self) -> None:
        pass
