"""What an app holds while a fetch runs: a cancel token, progress, and the changes it hears of.

Kept apart from the updater: these are the app's handles on it, usable from
any thread, and they change for other reasons (a UI, a background task) than
the update rules do.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

from edgereg.protocol.errors import EdgeregError

__all__ = ["CancelToken", "Cancelled", "ModelChange", "UpdateCheck"]

_log = logging.getLogger(__name__)


class Cancelled(EdgeregError):
    """The app cancelled the fetch before the switch; nothing was installed (``cancelled``)."""


class Abortable(Protocol):
    """What a cancel cuts: a response being read, a fetcher's requests waiting for answers."""

    def abort(self, why: str) -> None: ...


class CancelToken:
    """Cancels one :meth:`~edgereg.client.Client.fetch` from any thread.

    :meth:`cancel` returns at once and may be called any number of times (also
    before the fetch starts, or after it ended). A download in progress is cut
    within a read (its connection is shut down from the cancelling thread, so a
    stalled server does not hold it), the ``.part`` file is kept for a later
    resume, and nothing is installed: a cancel that arrives after the pointer
    switch is too late and changes nothing.
    """

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._open: list[Abortable] = []

    @property
    def cancelled(self) -> bool:
        """Whether :meth:`cancel` was called."""
        return self._event.is_set()

    def cancel(self) -> None:
        """Cancel the fetch: idempotent, safe from any thread, never raises."""
        with self._lock:
            self._event.set()
            responses = list(self._open)
        for response in responses:
            response.abort("cancelled by the app")

    def check(self) -> None:
        """Raise :class:`Cancelled` when cancelled (the fetch's checkpoints call it)."""
        if self._event.is_set():
            raise self.error()

    @staticmethod
    def error() -> Cancelled:
        """The error a cancelled fetch ends with."""
        return Cancelled(
            "the fetch was cancelled by the app; nothing was installed",
            hint="A later fetch resumes the download from the part kept.",
        )

    def watch(self, target: Abortable) -> None:
        """Cut ``target`` when the token is cancelled (now, if it already is)."""
        with self._lock:
            self._open.append(target)
            already = self._event.is_set()
        if already:
            target.abort("cancelled by the app")

    def unwatch(self, target: Abortable) -> None:
        """Stop watching ``target`` (it is closed, or its fetch ended)."""
        with self._lock:
            if target in self._open:
                self._open.remove(target)


ChangeKind = Literal["installed", "rolled-back", "reverted", "deleted"]


@dataclass(frozen=True)
class ModelChange:
    """Something changed what is installed for a unit (a listener's event).

    Attributes:
        unit: The model or bundle.
        kind: ``installed`` (a newer or first release), ``rolled-back`` (the
            server took a release back: a lower version was installed),
            ``reverted`` (the app or a crash loop reverted the release),
            ``deleted`` (the app deleted the unit).
        version: What is installed now (None after a delete, or a revert with
            no last good set).
        previous: What was installed before.
    """

    unit: str
    kind: ChangeKind
    version: str | None
    previous: str | None


Listener = Callable[[ModelChange], None]


def notify(listeners: list[Listener], change: ModelChange) -> None:
    """Tell each listener; one that raises is logged and never breaks the update."""
    for listener in list(listeners):
        try:
            listener(change)
        except Exception:  # the app's code: logged, never into the client
            _log.exception("a model change listener raised on %s", change)


@dataclass(frozen=True)
class UpdateCheck:
    """What :meth:`~edgereg.client.Client.check` found, without downloading a blob.

    Attributes:
        available: A release other than the installed one would install now.
        version: The release this device would install (the installed one when
            up to date), or None.
        installed: The version installed now, or None.
        is_candidate: That release is the rollout's candidate.
        download_bytes: Bytes a fetch would still download (0 when cached).
        deferred: Why a fetch would wait (an unmet download condition), or None.
        fallback: Why the candidate was passed over, if it was.
        error_code: Why nothing can be installed (a reason code), or None.
        error: The message of ``error_code``.
    """

    available: bool
    version: str | None
    installed: str | None
    is_candidate: bool = False
    download_bytes: int = 0
    deferred: str | None = None
    fallback: str | None = None
    error_code: str | None = None
    error: str | None = None
