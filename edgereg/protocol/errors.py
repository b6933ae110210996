"""The root of edgereg's error hierarchy, kept here so the protocol depends on nothing.

The transport error is here too: the client SDK reports it as a reason code
(``transport``, docs/protocol.md §10) and imports nothing but the protocol.
:mod:`edgereg.errors` re-exports these classes and defines the rest of the
hierarchy; catching :class:`EdgeregError` there catches the protocol's errors.
"""

from __future__ import annotations

__all__ = ["EdgeregError", "TransportError", "TrustError"]


class EdgeregError(Exception):
    """Base of every error edgereg reports to a user.

    Attributes:
        message: What was found and what was expected, in one sentence or two.
        hint: The next thing the user can do about it, if there is one.
    """

    exit_code = 1

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def diagnostics(self) -> str:
        """Return the full human-readable report: message, then hint."""
        if self.hint:
            return f"{self.message}\n{self.hint}"
        return self.message


class TrustError(EdgeregError):
    """A signature, key or signed document cannot be trusted.

    Bad or unknown-key signatures, malformed envelopes, expired or rolled-back
    documents, unreadable or unsafe keys. Never retried: trying again fetches
    the same untrustworthy bytes.
    """

    exit_code = 5


class TransportError(EdgeregError):
    """Fetching from a registry over HTTP (or a file:// URL) failed.

    The network is down, a request timed out, the server answered with an
    error status or closed the connection early. Retryable: the same request
    may succeed later (a download resumes where it stopped).

    Attributes:
        url: The URL that was being fetched, if known.
        status: The HTTP status the server answered with, if it answered.
        retryable: Whether trying again may succeed (a 404 will not).
    """

    exit_code = 10

    def __init__(
        self,
        message: str,
        *,
        url: str | None = None,
        status: int | None = None,
        hint: str | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message, hint=hint)
        self.url = url
        self.status = status
        self.retryable = retryable
