"""One error hierarchy for edgereg; each error carries the text that helps fix it.

The CLI maps these to a message and an exit code in one place
(:mod:`edgereg.cli`); the library raises and never prints.
"""

from __future__ import annotations

from edgereg.protocol.errors import EdgeregError, ExitCode, TransportError, TrustError

__all__ = [
    "BuildError",
    "ConfigError",
    "ConflictError",
    "EdgeregError",
    "ExitCode",
    "GateError",
    "StorageError",
    "ToolchainError",
    "TransportError",
    "TrustError",
    "UsageError",
]


class ConfigError(EdgeregError):
    """models.toml (or another config file) is malformed or inconsistent."""

    exit_code = ExitCode.USAGE

    def __init__(
        self,
        message: str,
        *,
        file: str,
        key_path: str | None = None,
        hint: str | None = None,
    ) -> None:
        where = f"{file}: {key_path}" if key_path else file
        super().__init__(f"{where}: {message}", hint=hint)
        self.file = file
        self.key_path = key_path
        self.detail = message


class UsageError(EdgeregError):
    """A command was called with options that do not go together, or without a required one."""

    exit_code = ExitCode.USAGE


class BuildError(EdgeregError):
    """A build stage failed: a tool crashed, an input is wrong or a gate failed."""

    exit_code = ExitCode.BUILD_FAILED

    def __init__(
        self,
        message: str,
        *,
        stage: str,
        hint: str | None = None,
        tool: str | None = None,
        exit_status: int | None = None,
        output_tail: str | None = None,
    ) -> None:
        super().__init__(message, hint=hint)
        self.stage = stage
        self.tool = tool
        self.exit_status = exit_status
        self.output_tail = output_tail

    def diagnostics(self) -> str:
        """Return the stage, the message, the tool's status and its last output."""
        lines = [f"build stage '{self.stage}' failed: {self.message}"]
        if self.tool is not None:
            status = "" if self.exit_status is None else f" (exit status {self.exit_status})"
            lines.append(f"tool: {self.tool}{status}")
        if self.output_tail:
            lines.append("last output:")
            lines.extend("  " + line for line in self.output_tail.rstrip().splitlines())
        if self.hint:
            lines.append(self.hint)
        return "\n".join(lines)


class ToolchainError(BuildError):
    """The installed toolchain differs from the pinned one."""


class GateError(BuildError):
    """A built variant exceeds one or more of its budgets."""

    exit_code = ExitCode.GATE_FAILED


class StorageError(EdgeregError):
    """Reading or writing the registry's storage (a directory or S3) failed.

    Most storage failures are transient (a network blip, a lock held by another
    publisher), so they are marked retryable unless the cause says otherwise.

    Attributes:
        url: The registry URL the operation was addressed to.
        retryable: Whether running the same command again may succeed.
    """

    exit_code = ExitCode.STORAGE

    def __init__(
        self,
        message: str,
        *,
        url: str,
        hint: str | None = None,
        retryable: bool = True,
    ) -> None:
        super().__init__(message, hint=hint)
        self.url = url
        self.retryable = retryable


class ConflictError(StorageError):
    """A compare-and-swap lost: someone else changed the object first; retry."""
