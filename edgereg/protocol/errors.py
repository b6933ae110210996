"""The root of edgereg's error hierarchy, kept here so the protocol depends on nothing.

:mod:`edgereg.errors` re-exports both classes and defines the rest of the
hierarchy; catching :class:`EdgeregError` there catches the protocol's errors.
"""

from __future__ import annotations

__all__ = ["EdgeregError", "TrustError"]


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
