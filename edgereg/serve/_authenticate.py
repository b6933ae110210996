"""The report authenticator hook: a last check of a report before it is stored.

Reports are anonymous (docs/operations/report-threats.md); an app with
attestation (Play Integrity, App Attest) can prove a report came from a
genuine install of it. The server calls its :class:`ReportAuthenticator`
after the served-state check and before the per-network cap of new tokens
and the store (a refused report uses up nothing of its network's); a
refusal is answered 401 and counted under the reason it returns.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping
from typing import Protocol

from edgereg.protocol.reports import Report

__all__ = ["AUTH_HEADER", "HmacAuthenticator", "ReportAuthenticator"]

#: The header :class:`HmacAuthenticator` reads: hex HMAC-SHA256 of the body.
AUTH_HEADER = "x-edgereg-report-auth"


class ReportAuthenticator(Protocol):
    """Decides whether a parsed, admitted report is genuine."""

    def authenticate(
        self, report: Report, body: bytes, headers: Mapping[str, str], client: str
    ) -> str | None:
        """None to store the report, else a short reason code (a metrics label).

        Args:
            report: The parsed report.
            body: Its bytes as received (what a signature covers).
            headers: Request headers by lowercase name.
            client: The client address (after trusted proxies).
        """
        ...


class HmacAuthenticator:
    """An HMAC-SHA256 of the body under a key the app ships, in :data:`AUTH_HEADER`.

    It keeps out anyone without the app, not someone who extracts the key
    from it: a local stand-in for platform attestation, and its test bed.

    Args:
        key: The shared key (at least 16 bytes).
    """

    def __init__(self, key: bytes) -> None:
        if len(key) < 16:
            raise ValueError("an HMAC key needs at least 16 bytes")
        self._key = key

    def sign(self, body: bytes) -> str:
        """The header value for a body (what the app sends)."""
        return hmac.new(self._key, body, hashlib.sha256).hexdigest()

    def authenticate(
        self, report: Report, body: bytes, headers: Mapping[str, str], client: str
    ) -> str | None:
        """Check the header against the body."""
        given = headers.get(AUTH_HEADER)
        if given is None:
            return "unauthenticated"
        if not hmac.compare_digest(given.strip().lower(), self.sign(body)):
            return "bad-authenticator"
        return None
