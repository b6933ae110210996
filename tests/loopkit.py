"""A real registry over real HTTP for the closed-loop client tests: real MNN models, real probes.

:class:`LoopRegistry` writes converted ``.mnn`` blobs, their golden probes
(made from real MNN CPU outputs by tests/probekit.py) and signed manifests
that name a ``report_url``. :func:`serve` serves the directory over HTTP on
loopback (GET) and collects what devices POST to ``/v1/reports``, parsed by
the protocol's one report parser.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from probekit import entry_for, probe_blob

from edgereg.protocol.fields import Backend
from edgereg.protocol.layout import public_key_path, state_path
from edgereg.protocol.probe import GoldenProbe
from edgereg.protocol.reports import Report, parse_report
from edgereg.protocol.wire import (
    BundleEntry,
    Manifest,
    ManifestEntry,
    RolloutState,
    blob_path,
    sign_document,
)
from edgereg.signing import Signer, TrustedKeys, generate_key

SALT = "0123456789abcdef"


@dataclass
class LoopRegistry:
    """A registry directory with one model; every manifest asks for reports at ``v1/reports``."""

    root: Path
    model: str = "digits"
    tier: str = "high"
    signer: Signer = field(default_factory=lambda: Signer.from_pem(generate_key()[0]))
    sequence: int = 0

    @property
    def trusted(self) -> TrustedKeys:
        return TrustedKeys([self.signer.public_key])

    def _blob(self, data: bytes) -> str:
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / blob_path(digest)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        return digest

    def entry(
        self,
        artifact: Path,
        probe: GoldenProbe | None,
        *,
        version: str,
        backends: tuple[Backend, ...] = ("opencl", "cpu"),
    ) -> ManifestEntry:
        self._blob(artifact.read_bytes())
        ref = None
        if probe is not None:
            data, ref = probe_blob(probe)
            self._blob(data)
        return entry_for(artifact, version=version, backends=backends, probe=ref)

    def publish(
        self,
        stable: ManifestEntry | BundleEntry | None,
        candidate: ManifestEntry | BundleEntry | None = None,
        *,
        percent: float = 100.0,
        report_url: str | None = "v1/reports",
    ) -> None:
        self.sequence += 1
        manifest = Manifest(
            model=self.model,
            tier=self.tier,
            sequence=self.sequence,
            expires=datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=30),
            stable=stable,
            candidate=candidate,
            percent=percent if candidate is not None else None,
            salt=SALT if candidate is not None else None,
            report_url=report_url,
        )
        path = self.root / "manifests" / self.model / f"{self.tier}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(sign_document(manifest, [self.signer]))
        # The signed state and the public key too: a report receiver admits only what
        # the verified state served (docs/operations/report-threats.md).
        state = RolloutState(
            model=self.model,
            sequence=self.sequence,
            expires=manifest.expires,
            stable=stable.version if stable is not None else None,
            candidate=candidate.version if candidate is not None else None,
            percent=manifest.percent,
            salt=manifest.salt,
            report_url=report_url,
        )
        state_file = self.root / state_path(self.model)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        state_file.write_bytes(sign_document(state, [self.signer]))
        key_file = self.root / public_key_path(self.signer.key_id)
        key_file.parent.mkdir(parents=True, exist_ok=True)
        key_file.write_bytes(self.signer.public_pem())


@dataclass
class Served:
    url: str
    posted: list[bytes] = field(default_factory=list)

    def reports(self) -> list[Report]:
        return [parse_report(body) for body in self.posted]


@contextmanager
def serve(root: Path) -> Iterator[Served]:
    """Serve ``root`` at ``http://127.0.0.1:PORT/`` and collect POSTs to ``/v1/reports``."""
    served = Served("")

    class Handler(SimpleHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["Content-Length"]))
            ok = self.path == "/v1/reports" and self.headers["Content-Type"] == "application/json"
            if ok:
                served.posted.append(body)
            self.send_response(204 if ok else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Handler, directory=str(root)))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    served.url = f"http://127.0.0.1:{server.server_address[1]}/"
    try:
        yield served
    finally:
        server.shutdown()
        server.server_close()
