"""Registry storage: one small interface over a local directory and S3.

Every backend stores opaque byte objects under '/'-separated keys relative to
the registry root (``blobs/sha256/<hex>``, ``models/<name>/state.json``, ...).
:class:`Storage` holds the one shared guard: its public methods validate the
key and turn any backend failure into :class:`~edgereg.errors.StorageError`
carrying the registry URL and the operation. Backends implement only the
private primitives (``_get``, ``_put_if_absent``, ...).

Two writes make the registry safe for concurrent publishers:

* :meth:`Storage.put_if_absent` / :meth:`Storage.put_file_if_absent` never
  overwrite: immutable blobs and release records are written once.
* :meth:`Storage.put_if_unchanged` is a compare-and-swap on a version token
  read with :meth:`Storage.get_versioned`: of two publishers updating the
  rollout state from the same version, one wins and the other gets
  :class:`~edgereg.errors.ConflictError` and retries from a fresh read.

The registry never deletes blobs; :meth:`Storage.delete` exists for tests
and cleanup tools only.

Use :func:`open_storage` to get a backend from a registry URL.
"""

from __future__ import annotations

import abc
import builtins
import contextlib
import os
import re
from collections.abc import Callable, Hashable
from pathlib import Path
from types import TracebackType
from typing import Protocol, TypeAlias, TypeVar

from edgereg.errors import ConflictError, StorageError

__all__ = [
    "ConflictError",
    "NotFound",
    "ReadStream",
    "Stamp",
    "Storage",
    "StorageError",
    "UnsafeObject",
    "open_storage",
    "validate_key",
]

T = TypeVar("T")

#: A version of a stored object, compared with ``==`` only (see :meth:`Storage.stamp`).
Stamp: TypeAlias = Hashable

#: Exceptions that mean a programming error, whichever backend raised them.
_BUGS = (
    TypeError,
    AttributeError,
    NameError,
    AssertionError,
    LookupError,
    NotImplementedError,
    RecursionError,
    ArithmeticError,
)

#: Environment variable naming the S3 endpoint (for S3-compatible stores).
ENDPOINT_ENV = "EDGEREG_S3_ENDPOINT_URL"

#: File names starting with these are the local backend's own bookkeeping
#: (temporary files of an interrupted write, lock files); keys may not use them.
RESERVED_PREFIXES = (".tmp-", ".lock-")

_URL_HINT = "use file://PATH or s3://BUCKET/PREFIX"
_SCHEME_RE = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


class NotFound(StorageError):
    """The object does not exist in the registry.

    Attributes:
        key: The key that was looked up.
    """

    def __init__(self, key: str, *, url: str) -> None:
        super().__init__(f"'{key}' does not exist in registry {url}", url=url, retryable=False)
        self.key = key


class UnsafeObject(StorageError):
    """The object exists but must never be read through the registry.

    A local registry entry that is a symbolic link to somewhere outside the
    registry root (``keys/x.pem`` -> the private signing key, ``/etc/passwd``).
    Never retryable: the same link is there next time.

    Attributes:
        key: The key that was refused.
    """

    def __init__(self, key: str, reason: str, *, url: str) -> None:
        super().__init__(
            f"'{key}' in registry {url} {reason}; edgereg never reads it",
            url=url,
            retryable=False,
            hint="Remove the link and copy the file into the registry if it belongs there.",
        )
        self.key = key


#: S3's limit for a whole key, and the usual file system limit for one name.
MAX_KEY_BYTES = 1024
MAX_PART_BYTES = 255
#: Keys that are plainly valid: ASCII parts of at most 255 characters that start
#: with a letter, digit or '_' (so never '.', '..' or a reserved prefix).
_PLAIN_PART = r"[A-Za-z0-9_][A-Za-z0-9_.+-]{0,254}"
_PLAIN_KEY = re.compile(f"{_PLAIN_PART}(?:/{_PLAIN_PART})*")


def validate_key(key: str, *, prefix: bool = False) -> str:
    """Check that ``key`` is a safe relative, '/'-separated registry key.

    Args:
        key: The key to check.
        prefix: Check a listing prefix instead: it may be empty and may end
            with '/'.

    Returns:
        The key, unchanged.

    Raises:
        ValueError: The key is absolute, empty, contains '..', '.', an empty
            part, a backslash or a reserved name; the message says which.
    """
    if not isinstance(key, str):
        raise ValueError(f"a key must be a string, not {type(key).__name__}")
    if _PLAIN_KEY.fullmatch(key) and len(key) <= MAX_KEY_BYTES:
        return key  # every rule below holds for it (the hot path of serving)
    body = key[:-1] if prefix and key.endswith("/") else key
    if prefix and body == "":
        return key
    if body == "":
        raise ValueError("a key may not be empty")
    if body.startswith("/"):
        raise ValueError("a key is relative to the registry root and may not start with '/'")
    if "\\" in body:
        raise ValueError("a key is '/'-separated and may not contain a backslash")
    if "\x00" in body:
        raise ValueError("a key may not contain a NUL character")
    if len(body.encode("utf-8")) > MAX_KEY_BYTES:
        raise ValueError(f"a key may be at most {MAX_KEY_BYTES} bytes long (as on S3)")
    for part in body.split("/"):
        if len(part.encode("utf-8")) > MAX_PART_BYTES:
            # Longer than a file name may be on disk: such a key can never exist.
            raise ValueError(f"a key part may be at most {MAX_PART_BYTES} bytes long")
        if part == "":
            raise ValueError("a key may not contain an empty part ('//' or a trailing '/')")
        if part in (".", ".."):
            raise ValueError(f"a key may not contain a '{part}' part")
        if part.startswith(RESERVED_PREFIXES):
            raise ValueError(
                f"a key part may not start with {' or '.join(map(repr, RESERVED_PREFIXES))}"
            )
    return key


class ReadStream:
    """A binary stream over one stored object whose read errors are StorageErrors.

    Use it as a context manager, or call :meth:`close`.
    """

    def __init__(
        self,
        raw: _RawStream,
        *,
        storage: Storage,
        key: str,
    ) -> None:
        self._raw = raw
        self._storage = storage
        self._key = key

    def read(self, size: int = -1) -> bytes:
        """Read up to ``size`` bytes (all remaining bytes when ``size`` < 0)."""
        if size < 0:
            return self._storage._guard("read", self._key, lambda: self._raw.read())
        return self._storage._guard("read", self._key, lambda: self._raw.read(size))

    def iter_chunks(self, chunk_size: int = 1024 * 1024) -> _ChunkIterator:
        """Iterate over the remaining bytes in chunks of at most ``chunk_size``."""
        return _ChunkIterator(self, chunk_size)

    def close(self) -> None:
        """Release the underlying file or connection."""
        # Closing is best effort: whatever was read has been read.
        with contextlib.suppress(Exception):
            self._raw.close()

    def __enter__(self) -> ReadStream:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class _ChunkIterator:
    def __init__(self, stream: ReadStream, chunk_size: int) -> None:
        self._stream = stream
        self._chunk_size = chunk_size

    def __iter__(self) -> _ChunkIterator:
        return self

    def __next__(self) -> bytes:
        chunk = self._stream.read(self._chunk_size)
        if not chunk:
            raise StopIteration
        return chunk


class _RawStream(Protocol):
    """What a backend's ``_open_read`` returns (a file object or a botocore body)."""

    def read(self, size: int = ..., /) -> bytes: ...

    def close(self) -> None: ...


class Storage(abc.ABC):
    """A registry root holding byte objects under '/'-separated keys.

    Public methods validate keys and raise only :class:`StorageError`
    (:class:`NotFound` for a missing object, :class:`ConflictError` for a
    lost compare-and-swap). Subclasses implement the underscore primitives
    and may override :meth:`_translate` to add backend-specific fix-it hints.

    Attributes:
        url: The canonical registry URL (``file:///abs/path`` or
            ``s3://bucket/prefix``).
    """

    url: str

    # -- public API: the shared guard ------------------------------------------------

    def get(self, key: str) -> bytes:
        """Return the whole object. Raises NotFound if it does not exist."""
        return self._call("get", key, lambda: self._get(key))

    def get_versioned(self, key: str) -> tuple[bytes, str]:
        """Return the object and an opaque version token for :meth:`put_if_unchanged`.

        The token is tied to exactly the bytes returned. Raises NotFound if the
        object does not exist.
        """
        return self._call("get", key, lambda: self._get_versioned(key))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        """Return up to ``length`` bytes of the object starting at offset ``start``."""
        if start < 0 or length < 0:
            raise ValueError("start and length must not be negative")
        if length == 0:
            self.size(key)  # still report a missing object
            return b""
        return self._call("read", key, lambda: self._get_range(key, start, length))

    def get_stamped(self, key: str) -> tuple[bytes, Stamp | None]:
        """Return the whole object and the stamp of exactly these bytes (see :meth:`stamp`).

        The stamp is None when the backend has no cheap one, or cannot yet
        tell a later change from this version (a local file changed in the
        last seconds); then nothing made from these bytes may be reused.
        """
        return self._call("get", key, lambda: self._get_stamped(key))

    def size_stamped(self, key: str) -> tuple[int, Stamp | None]:
        """Return the object's size and the stamp of that version (as :meth:`get_stamped`)."""
        return self._call("check", key, lambda: self._size_stamped(key))

    def stamp(self, key: str) -> Stamp | None:
        """A cheap token of the object's current version, read without opening the object.

        Equal to a stamp that :meth:`get_stamped` or :meth:`size_stamped`
        returned, it means the object is still the one read then (same bytes,
        same checks passed), so an answer made from them still holds: what
        ``edgereg serve`` uses to answer a 304 without reading the object.
        It proves nothing on its own (a local stamp follows links without
        the root check): compare it, never trust it. None when the backend has
        no cheap way to tell. Raises NotFound if the object does not exist.
        """
        return self._call("check", key, lambda: self._stamp(key))

    def open_read(self, key: str) -> ReadStream:
        """Open the object for streaming reads (for serving large blobs)."""
        raw = self._call("open", key, lambda: self._open_read(key))
        return ReadStream(raw, storage=self, key=key)

    def check_conditional_writes(self) -> None:
        """Prove that this store refuses a conditional write it must refuse.

        Run before the first write (cached per process and store, so it costs
        a few requests once); a registry opened for writing may call it up
        front. A no-op where the guarantee comes from the file system.

        Raises:
            StorageError: (not retryable) the store accepts ``If-None-Match``
                or ``If-Match`` writes without honouring them, or does not
                implement them: two publishers at once would lose changes.
        """
        self._guard("check", "conditional writes", self._check_conditional_writes)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Write the object unless it exists; never overwrite.

        Returns:
            True if this call created the object, False if it already existed
            (its content is left as it was).
        """
        return self._call("write", key, lambda: self._put_if_absent(key, bytes(data)))

    def put_file_if_absent(self, key: str, path: str | os.PathLike[str]) -> bool:
        """Stream a file into the object unless it exists; never overwrite.

        An existing object costs one metadata request and no upload. Large
        files are uploaded in parts and never read into memory whole.

        Returns:
            True if this call created the object, False if it already existed.
        """
        source = Path(path)
        return self._call("write", key, lambda: self._put_file_if_absent(key, source))

    def put_if_unchanged(self, key: str, data: bytes, token: str | None) -> str:
        """Compare-and-swap: replace the object only if it is still at ``token``.

        Args:
            key: The object to write.
            data: The new content.
            token: The version from :meth:`get_versioned`, or None to require
                that the object does not exist yet.

        Returns:
            The version token of the content just written.

        Raises:
            ConflictError: The object changed (or appeared, or vanished) since
                ``token`` was read. Read it again and retry.
        """
        return self._call("write", key, lambda: self._put_if_unchanged(key, bytes(data), token))

    def put(self, key: str, data: bytes) -> None:
        """Atomically create or overwrite the object (readers see old or new, never half)."""
        self._call("write", key, lambda: self._put(key, bytes(data)))

    def exists(self, key: str) -> bool:
        """Return whether the object exists."""
        return self._call("check", key, lambda: self._exists(key))

    def size(self, key: str) -> int:
        """Return the object's size in bytes. Raises NotFound if it does not exist."""
        return self._call("check", key, lambda: self._size(key))

    def list(self, prefix: str = "") -> builtins.list[str]:
        """Return every key starting with ``prefix``, recursively, sorted.

        ``prefix`` is a plain string prefix (as on S3): ``"models/"`` lists
        everything under ``models``, ``"models/dig"`` also matches
        ``models/digits/...``.
        """
        self._check_key(prefix, prefix=True)
        return sorted(self._guard("list", prefix or "/", lambda: self._list(prefix)))

    def delete(self, key: str) -> None:
        """Remove the object if it exists.

        For tests and cleanup tools only: the registry itself never deletes
        blobs, release records or manifests.
        """
        self._call("delete", key, lambda: self._delete(key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    # -- the guard ------------------------------------------------------------------

    def _call(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        self._check_key(key)
        if operation == "write":
            self.check_conditional_writes()
        return self._guard(operation, key, fn)

    def _check_key(self, key: str, *, prefix: bool = False) -> None:
        try:
            validate_key(key, prefix=prefix)
        except ValueError as exc:
            raise StorageError(
                f"invalid registry key {key!r}: {exc}", url=self.url, retryable=False
            ) from exc

    def _guard(self, operation: str, key: str, fn: Callable[[], T]) -> T:
        try:
            return fn()
        except StorageError:
            raise
        except _BUGS:
            # A bug in edgereg (or in boto3), not a storage failure: it must
            # surface as an internal error (exit 70), never as "retry".
            raise
        except Exception as exc:
            raise self._translate(exc, operation, key) from exc

    def _translate(self, exc: Exception, operation: str, key: str) -> StorageError:
        """Turn a backend exception into a StorageError; override to add hints."""
        return StorageError(
            f"could not {operation} '{key}' in registry {self.url}: {exc}", url=self.url
        )

    def _not_found(self, key: str) -> NotFound:
        return NotFound(key, url=self.url)

    def _conflict(self, key: str, token: str | None) -> ConflictError:
        expected = "not to exist yet" if token is None else f"to be at version {token}"
        return ConflictError(
            f"'{key}' in registry {self.url} was changed by someone else (expected it {expected})",
            url=self.url,
            hint="Another publisher updated it at the same time; run the command again.",
        )

    # -- primitives: what a backend implements ---------------------------------------

    def _check_conditional_writes(self) -> None:  # noqa: B027 - optional, not abstract
        """Backends whose conditional writes can fail silently override this."""

    @abc.abstractmethod
    def _get(self, key: str) -> bytes: ...

    @abc.abstractmethod
    def _get_versioned(self, key: str) -> tuple[bytes, str]: ...

    @abc.abstractmethod
    def _get_range(self, key: str, start: int, length: int) -> bytes: ...

    # Optional: a backend without cheap version stamps reads as before, never reused.
    def _get_stamped(self, key: str) -> tuple[bytes, Stamp | None]:
        return self._get(key), None

    def _size_stamped(self, key: str) -> tuple[int, Stamp | None]:
        return self._size(key), None

    def _stamp(self, key: str) -> Stamp | None:
        self._size(key)  # still report a missing object
        return None

    @abc.abstractmethod
    def _open_read(self, key: str) -> _RawStream: ...

    @abc.abstractmethod
    def _put_if_absent(self, key: str, data: bytes) -> bool: ...

    @abc.abstractmethod
    def _put_file_if_absent(self, key: str, path: Path) -> bool: ...

    @abc.abstractmethod
    def _put_if_unchanged(self, key: str, data: bytes, token: str | None) -> str: ...

    @abc.abstractmethod
    def _put(self, key: str, data: bytes) -> None: ...

    @abc.abstractmethod
    def _exists(self, key: str) -> bool: ...

    @abc.abstractmethod
    def _size(self, key: str) -> int: ...

    @abc.abstractmethod
    def _list(self, prefix: str) -> builtins.list[str]: ...

    @abc.abstractmethod
    def _delete(self, key: str) -> None: ...


def open_storage(
    url: str,
    *,
    endpoint_url: str | None = None,
    base_dir: str | os.PathLike[str] | None = None,
) -> Storage:
    """Open the registry at ``url``.

    Args:
        url: ``file:///abs/path``, ``file://relative/path``, a bare path, or
            ``s3://bucket/prefix``.
        endpoint_url: S3 endpoint for S3-compatible stores; defaults to
            ``$EDGEREG_S3_ENDPOINT_URL``, then ``$AWS_ENDPOINT_URL``, then AWS.
        base_dir: Directory that relative paths are resolved against
            (default: the current directory).

    Returns:
        A :class:`Storage`. Nothing is read or created until it is used.

    Raises:
        StorageError: The URL has another scheme or is malformed.
    """
    raw = url.strip() if isinstance(url, str) else ""
    scheme_match = _SCHEME_RE.match(raw)
    scheme = scheme_match.group(1).lower() if scheme_match else None
    if not raw or (scheme is not None and not raw[len(scheme) + 1 :].startswith("//")):
        raise _unsupported(url)

    if scheme is None or scheme == "file":
        path_text = raw if scheme is None else raw[len("file://") :]
        if not path_text:
            raise _unsupported(url)
        path = Path(path_text).expanduser()
        if not path.is_absolute():
            path = Path(base_dir if base_dir is not None else os.getcwd()) / path
        from edgereg.storage._local import LocalStorage

        return LocalStorage(Path(os.path.abspath(path)))

    if scheme == "s3":
        bucket, _, prefix = raw[len("s3://") :].partition("/")
        if not bucket:
            raise _unsupported(url, "no bucket is named")
        if not _BUCKET_RE.fullmatch(bucket) or ".." in bucket:
            raise _unsupported(
                url,
                f"'{bucket}' is not a valid S3 bucket name (3-63 lowercase letters, "
                "digits, '.' and '-')",
            )
        prefix = prefix.strip("/")
        if prefix:
            try:
                validate_key(prefix)
            except ValueError as exc:
                raise _unsupported(url, f"bad prefix: {exc}") from exc
        endpoint = (
            endpoint_url
            or os.environ.get(ENDPOINT_ENV)
            or os.environ.get("AWS_ENDPOINT_URL")
            or None
        )
        from edgereg.storage._s3 import S3Storage

        return S3Storage(bucket, prefix, endpoint_url=endpoint)

    raise _unsupported(url)


def _unsupported(url: object, why: str | None = None) -> StorageError:
    reason = f" ({why})" if why else ""
    return StorageError(
        f"registry URL {str(url)!r} is not supported{reason}; {_URL_HINT}",
        url=str(url),
        retryable=False,
        hint="Check the registry URL (models.toml [registry] url).",
    )
