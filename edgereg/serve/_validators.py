"""What ``edgereg serve`` remembers of the registry: each object's answer, made when it changes.

Devices poll their manifest with ``If-None-Match`` far more often than
anything changes, so the unchanged check is the hot path. Reading and
hashing the file for every poll made a 304 cost as much as a 200. Instead
the server keeps, per registry key, what it made of the version it last
read (its ETag and bytes, once the private-key checks passed) together with
that version's storage stamp (:meth:`~edgereg.storage.Storage.stamp`: one
``stat`` of a local file, one HEAD on S3). A request compares the stamp and
answers from memory while it is equal. Any change of the object (a publish,
a rollout step, a copy from elsewhere) changes its stamp, and the object is
read and checked again: nothing is trusted for a time. Each worker process
of ``--workers`` keeps its own, checked the same way.

The memory is bounded: at most ``max_entries`` objects and ``max_bytes`` of
bodies (the oldest entries go first); an object larger than
``max_body_bytes`` is never kept (it is read each time, as before).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from edgereg.storage import Stamp

#: Objects remembered per process (manifests, states, release records, keys, blobs).
MAX_ENTRIES = 8192
#: Bytes of bodies remembered per process.
MAX_BYTES = 64 * 1024 * 1024
#: A larger document is never kept in memory.
MAX_BODY_BYTES = 1024 * 1024

T = TypeVar("T")


@dataclass(frozen=True)
class Document:
    """A signed document as served: the bytes, their ETag, and the version they are of.

    Attributes:
        stamp: The storage stamp of the version these bytes are.
        etag: The quoted SHA-256 of ``body``.
        body: The bytes served.
        ok: The headers of its 200 answer.
        not_modified: The headers of its 304 answer.
        ok_wire: ``ok`` as header lines on the wire.
        not_modified_wire: ``not_modified`` as header lines on the wire.
    """

    stamp: Stamp
    etag: str
    body: bytes
    ok: tuple[tuple[str, str], ...]
    not_modified: tuple[tuple[str, str], ...]
    ok_wire: bytes
    not_modified_wire: bytes

    @classmethod
    def of(
        cls,
        stamp: Stamp,
        etag: str,
        body: bytes,
        ok: tuple[tuple[str, str], ...],
        not_modified: tuple[tuple[str, str], ...],
    ) -> Document:
        """A document with its answers' headers, on the wire too (made once per version)."""
        return cls(
            stamp, etag, body, ok, not_modified, encode_headers(ok), encode_headers(not_modified)
        )


def encode_headers(headers: Sequence[tuple[str, str]]) -> bytes:
    """Header lines as they go on the wire: ``Name: value`` and CRLF each, Latin-1."""
    return "".join(f"{name}: {value}\r\n" for name, value in headers).encode("latin-1")


@dataclass(frozen=True)
class Seen:
    """An object whose existence was checked (a blob for a 304): its version."""

    stamp: Stamp


class Remembered(Generic[T]):
    """A bounded map of registry key -> what was made of its last version (thread-safe).

    Reads take no lock (a dict lookup is atomic in CPython); a race between
    two writers of one key only costs a second read of the object.
    """

    def __init__(
        self,
        *,
        max_entries: int = MAX_ENTRIES,
        max_bytes: int = MAX_BYTES,
        max_body_bytes: int = MAX_BODY_BYTES,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self.max_body_bytes = max_body_bytes
        self._entries: dict[str, tuple[T, int]] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: str) -> T | None:
        """What is remembered of ``key``, or None."""
        found = self._entries.get(key)
        return None if found is None else found[0]

    def put(self, key: str, value: T, size: int = 0) -> None:
        """Remember ``value`` for ``key`` (``size``: its bytes), dropping the oldest to fit."""
        if size > self.max_body_bytes:
            self.forget(key)
            return
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]
            while self._entries and (
                len(self._entries) >= self.max_entries or self._bytes + size > self.max_bytes
            ):
                oldest = next(iter(self._entries))
                self._bytes -= self._entries.pop(oldest)[1]
            self._entries[key] = (value, size)
            self._bytes += size

    def forget(self, key: str) -> None:
        """Drop what is remembered of ``key`` (it changed, or is gone)."""
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._bytes -= old[1]

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        """Bytes of bodies remembered now."""
        return self._bytes
