"""The root of edgereg's error hierarchy, kept here so the protocol depends on nothing.

The transport error is here too: the client SDK reports it as a reason code
(``transport``, docs/protocol.md §10) and imports nothing but the protocol.
:mod:`edgereg.errors` re-exports these classes and defines the rest of the
hierarchy; catching :class:`EdgeregError` there catches the protocol's errors.
"""

from __future__ import annotations

from enum import IntEnum

__all__ = ["EdgeregError", "ExitCode", "TransportError", "TrustError"]


class ExitCode(IntEnum):
    """Every status an edgereg command exits with; :attr:`meaning` says what it tells a script.

    The one list: errors name their code with it, the CLI exits with it, and
    `edgereg --help` and docs/reference/exit-codes.md are generated from it.
    """

    OK = 0
    ERROR = 1
    USAGE = 2
    BUILD_FAILED = 3
    GATE_FAILED = 4
    TRUST = 5
    STORAGE = 6
    ROLLOUT_REFUSED = 7
    NOT_PUBLISHABLE = 8
    VERIFY_FAILED = 9
    UNREACHABLE = 10
    CACHE = 11
    ANALYZE_FAILED = 12
    ANALYZE_INCONCLUSIVE = 13
    INTERNAL_ERROR = 70
    INTERRUPTED = 130

    @property
    def meaning(self) -> str:
        """One line: when a command exits with this code."""
        return _MEANINGS[self]


_MEANINGS: dict[ExitCode, str] = {
    ExitCode.OK: "success (also: nothing to do, up to date)",
    ExitCode.ERROR: "other error; dvc sync --check: dvc.yaml is stale",
    ExitCode.USAGE: "bad models.toml or command-line usage",
    ExitCode.BUILD_FAILED: "a build stage failed",
    ExitCode.GATE_FAILED: "a variant failed a gate",
    ExitCode.TRUST: "trust: a signature, key or signed document is not acceptable",
    ExitCode.STORAGE: "storage: the registry could not be read or written (usually retryable)",
    ExitCode.ROLLOUT_REFUSED: "rollout command not allowed in the current state",
    ExitCode.NOT_PUBLISHABLE: "build outputs cannot be published",
    ExitCode.VERIFY_FAILED: "verify found problems",
    ExitCode.UNREACHABLE: "pull: the registry could not be reached or was too slow (retryable)",
    ExitCode.CACHE: "pull: the client cache could not be read or written",
    ExitCode.ANALYZE_FAILED: (
        "analyze: a critical guardrail failed (rollout --auto: and the rollout was halted)"
    ),
    ExitCode.ANALYZE_INCONCLUSIVE: "analyze: inconclusive, not every guardrail passes yet",
    ExitCode.INTERNAL_ERROR: "internal error: please report it with the --verbose traceback",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C)",
}


class EdgeregError(Exception):
    """Base of every error edgereg reports to a user.

    Attributes:
        message: What was found and what was expected, in one sentence or two.
        hint: The next thing the user can do about it, if there is one.
    """

    exit_code: ExitCode = ExitCode.ERROR

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

    exit_code = ExitCode.TRUST


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

    exit_code = ExitCode.UNREACHABLE

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
