"""``edgereg serve``: the registry over read-only HTTP.

Paths mirror the registry layout (``/manifests/<model>/<tier>.json``,
``/blobs/sha256/<hex>``, ``/models/<model>/releases/<v>.json``,
``/models/<model>/state.json``, ``/keys/<keyid>.pem``), so a client works
the same against this server, a static web server, or S3 behind a CDN. Also
``/`` (status page), ``/healthz``, ``/metrics`` (Prometheus) and
``/openapi.json``. With a report store (``make_server(..., reports=store)``,
``edgereg serve --reports URL``), ``POST /v1/reports`` takes device reports
into that store, never the registry (docs/protocol.md §12).

Caching: signed documents carry ``Cache-Control: public, max-age=60``
(configurable) and a strong ETag, the quoted lowercase hex SHA-256 of their
bytes; blobs carry their digest as ETag (``"<hex>"``, which is also the
SHA-256 of their bytes) and ``public, max-age=31536000, immutable``.
``If-None-Match`` answers 304; blobs take one byte range (206, or 416).

For tests and tools::

    from edgereg.serve import start_in_thread

    server, base_url = start_in_thread("path/to/registry")  # a free port
    ...  # GET f"{base_url}/manifests/digits/high.json"
    server.close()  # graceful: finishes answers in flight

or ``with serving("path/to/registry") as base_url: ...``.

The server keeps no state of its own beyond its metrics counters, so any
number can run behind a load balancer.

It never serves a symbolic link out of the registry, a PEM private key, or
anything under ``keys/`` that is not one public key (403, logged), bounds
request heads (414/431) and slow clients (408 past ``head_timeout``), and
answers 503 past ``max_connections`` (see docs/operations/s3-cdn.md).
"""

from edgereg.serve._app import App, Request, Response
from edgereg.serve._authenticate import HmacAuthenticator, ReportAuthenticator
from edgereg.serve._metrics import Metrics
from edgereg.serve._openapi import openapi_document
from edgereg.serve._server import (
    DEFAULT_TIMEOUT,
    RegistryServer,
    make_server,
    serving,
    start_in_thread,
)
from edgereg.serve._status_page import render_status_page

__all__ = [
    "DEFAULT_TIMEOUT",
    "App",
    "HmacAuthenticator",
    "Metrics",
    "RegistryServer",
    "ReportAuthenticator",
    "Request",
    "Response",
    "make_server",
    "openapi_document",
    "render_status_page",
    "serving",
    "start_in_thread",
]
