"""The local-directory backend: a registry that is a plain directory tree.

Every write goes to a temporary file in the target's directory, is fsynced,
and only then takes the final name, so a reader (or a static web server) sees
the old object or the new one, never half of one. Temporary files of a write
that crashed keep their ``.tmp-`` prefix and are ignored by :meth:`list`;
lock files (``.lock-<name>``) likewise.

* write once: ``os.link(temp, final)`` fails if ``final`` exists, so of two
  writers exactly one wins and nothing is overwritten;
* compare-and-swap: an exclusive ``flock`` on ``.lock-<name>`` next to the
  object, then a check of the current version, then ``os.replace``. The lock
  is advisory and held only by edgereg writers; it is released by the kernel
  if a writer dies. It needs a filesystem with working ``flock`` (local disks
  do; some network filesystems do not);
* version tokens are the SHA-256 of the content, so they survive copies and
  do not depend on timestamps;
* stamps (:meth:`~edgereg.storage.Storage.stamp`, what lets ``edgereg serve``
  answer a 304 without opening the file) are the file's device, inode, size,
  mtime and ctime from one ``stat`` (a tuple). Every write here makes a new file
  (a new inode and ctime); ctime cannot be set back by any tool, so a file
  changed in place also shows. A file changed within the last
  ``settle_seconds`` gets no stamp (git's "racily clean" rule): a second
  change within the same clock tick of the file system would leave every
  field as it was, so such a file is read again until it has settled. This
  needs the file system's clock to be the server's (a local disk, or NFS with
  synchronized clocks).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import hashlib
import os
import secrets
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from edgereg.errors import StorageError
from edgereg.storage import RESERVED_PREFIXES, NotFound, Stamp, Storage, UnsafeObject

_COPY_CHUNK = 1024 * 1024
_READ_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
_LOCK_TIMEOUT_S = 30.0
#: Seconds after its last change before a file gets a stamp: longer than the
#: coarsest timestamp granularity of a file system edgereg expects (1-2 s).
SETTLE_SECONDS = 2.0


def _token(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _stamp_of(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


class LocalStorage(Storage):
    """A registry rooted at a local directory (created on the first write)."""

    def __init__(
        self,
        root: Path,
        *,
        lock_timeout: float = _LOCK_TIMEOUT_S,
        settle_seconds: float = SETTLE_SECONDS,
    ) -> None:
        """Use ``root`` (an absolute path) as the registry root.

        ``settle_seconds``: how long after its last change a file gets no
        stamp (see the module docstring).
        """
        self.root = root
        self.url = f"file://{root}"
        self._lock_timeout = lock_timeout
        self._settle_ns = int(settle_seconds * 1e9)
        self._real_root_cache: str | None = None
        self._root_prefix = os.path.join(os.fspath(root), "")

    # -- reads ------------------------------------------------------------------------

    def _get(self, key: str) -> bytes:
        return self._read(key)[0]

    def _get_stamped(self, key: str) -> tuple[bytes, Stamp | None]:
        data, st = self._read(key)
        return data, None if st is None else self._settled_stamp(st)

    def _read(self, key: str) -> tuple[bytes, os.stat_result | None]:
        """The whole file and its stat when read (None: it grew while being read)."""
        # Straight from the descriptor: the hot path of serving a manifest.
        fd, st = self._open_fd(key)
        try:
            size = st.st_size
            data = os.read(fd, size + 1)
            if len(data) <= size:  # a regular file reads short only at its end
                return data, st
            chunks = [data]
            while chunks[-1]:  # the file grew since fstat: read to the end
                chunks.append(os.read(fd, 1 << 20))
            return b"".join(chunks), None
        finally:
            os.close(fd)

    def _size_stamped(self, key: str) -> tuple[int, Stamp | None]:
        fd, st = self._open_fd(key)
        os.close(fd)
        return st.st_size, self._settled_stamp(st)

    def _stamp(self, key: str) -> Stamp:
        # No open and no root check: the stamp only ever compares with one of a
        # file that was opened and checked; the same device and inode is that file.
        try:
            st = os.stat(self._root_prefix + key)
        except (FileNotFoundError, NotADirectoryError) as exc:
            raise self._not_found(key) from exc
        if not stat.S_ISREG(st.st_mode):
            raise self._not_found(key)
        return _stamp_of(st)

    def _settled_stamp(self, st: os.stat_result) -> Stamp | None:
        """The stamp of a file that last changed over ``settle_seconds`` ago, else None."""
        if time.time_ns() - max(st.st_mtime_ns, st.st_ctime_ns) < self._settle_ns:
            return None
        return _stamp_of(st)

    def _get_versioned(self, key: str) -> tuple[bytes, str]:
        data = self._get(key)
        return data, _token(data)

    def _get_range(self, key: str, start: int, length: int) -> bytes:
        with self._open(key) as f:
            f.seek(start)
            return f.read(length)

    def _open_read(self, key: str) -> BinaryIO:
        return self._open(key)

    def _exists(self, key: str) -> bool:
        try:
            os.close(self._open_fd(key)[0])
        except NotFound:
            return False
        return True

    def _size(self, key: str) -> int:
        fd, st = self._open_fd(key)
        os.close(fd)
        return st.st_size

    def _list(self, prefix: str) -> builtins.list[str]:
        directory, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*directory.split("/")) if directory else self.root
        if not start.is_dir():
            return []
        keys = []

        def fail(exc: OSError) -> None:
            raise exc

        for dirpath, dirnames, filenames in os.walk(start, onerror=fail):
            dirnames[:] = [d for d in dirnames if not d.startswith(RESERVED_PREFIXES)]
            rel = Path(dirpath).relative_to(self.root).as_posix()
            base = "" if rel == "." else rel + "/"
            for name in filenames:
                if name.startswith(RESERVED_PREFIXES):
                    continue  # our own temp and lock files
                key = base + name
                if key.startswith(prefix):
                    keys.append(key)
        return keys

    # -- writes -----------------------------------------------------------------------

    def _put_if_absent(self, key: str, data: bytes) -> bool:
        return self._create(key, lambda f: f.write(data))

    def _put_file_if_absent(self, key: str, path: Path) -> bool:
        if self._check_target(key).is_file():
            return False  # do not even copy
        with path.open("rb") as source:
            return self._create(key, lambda f: shutil.copyfileobj(source, f, _COPY_CHUNK))

    def _put_if_unchanged(self, key: str, data: bytes, token: str | None) -> str:
        target = self._check_target(key)
        with self._lock(target):
            try:
                current: str | None = _token(target.read_bytes())
            except FileNotFoundError:
                current = None
            if current != token:
                raise self._conflict(key, token)
            if token is None:
                # link, not replace: a concurrent put_if_absent (which takes
                # no lock) must not be overwritten either.
                if not self._create(key, lambda f: f.write(data)):
                    raise self._conflict(key, token)
            else:
                self._replace(target, lambda f: f.write(data))
        return _token(data)

    def _put(self, key: str, data: bytes) -> None:
        target = self._check_target(key)
        with self._lock(target):
            self._replace(target, lambda f: f.write(data))

    def _delete(self, key: str) -> None:
        path = self._path(key)
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            path.unlink()

    # -- helpers ----------------------------------------------------------------------

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*key.split("/"))

    def _open_fd(self, key: str) -> tuple[int, os.stat_result]:
        """Open ``key`` for reading; refused if what was opened lies outside the root.

        Links inside the registry are followed; a link to the signing key or
        ``/etc/passwd`` is how a registry would leak them. The check is on the
        file actually opened (``/proc/self/fd``), so a link swapped in between
        a check and the open cannot slip through; ``O_NONBLOCK`` keeps a FIFO
        planted in the registry from hanging the reader.
        """
        path = self._root_prefix + key  # a valid key has no '..' and no empty part
        try:
            fd = os.open(path, _READ_FLAGS)
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError) as exc:
            raise self._not_found(key) from exc
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):  # a directory, a FIFO, a device
                raise self._not_found(key)
            try:
                opened = os.readlink(f"/proc/self/fd/{fd}")
            except OSError:  # no /proc (not Linux): resolve the path instead
                opened = os.path.realpath(path)
            if not opened.startswith(self._real_root()):
                raise UnsafeObject(
                    key, "is a symbolic link leading outside the registry root", url=self.url
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, st

    def _real_root(self) -> str:
        """The root with every link resolved, ending in '/' (cached once it exists)."""
        if self._real_root_cache is not None:
            return self._real_root_cache
        real = os.path.join(os.path.realpath(self.root), "")
        if self.root.is_dir():
            self._real_root_cache = real
        return real

    def _open(self, key: str) -> BinaryIO:
        return os.fdopen(self._open_fd(key)[0], "rb")

    def _check_target(self, key: str) -> Path:
        target = self._path(key)
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, "a directory is in the way", str(target))
        return target

    def _create(self, key: str, write: Callable[[BinaryIO], object]) -> bool:
        """Write a new object via a temp file and link(2); False if it exists."""
        target = self._check_target(key)
        if target.is_file():
            return False
        tmp = self._write_temp(target, write)
        try:
            try:
                os.link(tmp, target)
            except FileExistsError:
                return False
            _fsync_dir(target.parent)
            return True
        finally:
            tmp.unlink(missing_ok=True)

    def _replace(self, target: Path, write: Callable[[BinaryIO], object]) -> None:
        tmp = self._write_temp(target, write)
        try:
            os.replace(tmp, target)
            _fsync_dir(target.parent)
        finally:
            tmp.unlink(missing_ok=True)  # only still there if replace failed

    def _write_temp(self, target: Path, write: Callable[[BinaryIO], object]) -> Path:
        """Write a complete, fsynced temp file next to ``target``; never leave it on error."""
        target.parent.mkdir(parents=True, exist_ok=True)
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
        while True:
            tmp = target.parent / f".tmp-{target.name}-{secrets.token_hex(6)}"
            try:
                # 0o666 minus the umask, like any other file the user creates:
                # the registry directory may be served as static files.
                fd = os.open(tmp, flags, 0o666)
                break
            except FileExistsError:
                continue
        try:
            with os.fdopen(fd, "wb") as f:
                write(f)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        return tmp

    @contextlib.contextmanager
    def _lock(self, target: Path) -> Iterator[None]:
        import fcntl  # POSIX only; imported here so reads work everywhere

        target.parent.mkdir(parents=True, exist_ok=True)
        lock_path = target.parent / f".lock-{target.name}"
        fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
        try:
            deadline = time.monotonic() + self._lock_timeout
            delay = 0.001
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError as exc:
                    if time.monotonic() >= deadline:
                        raise StorageError(
                            f"'{lock_path}' is still locked after {self._lock_timeout:g}s",
                            url=self.url,
                            hint="Another edgereg process is writing to this registry; "
                            "wait for it to finish and run the command again.",
                        ) from exc
                    time.sleep(delay)
                    delay = min(delay * 2, 0.05)
            yield  # the lock is released when fd is closed
        finally:
            os.close(fd)

    def _translate(self, exc: Exception, operation: str, key: str) -> StorageError:
        error = super()._translate(exc, operation, key)
        if isinstance(exc, PermissionError):
            error.hint = f"Check that you may read and write the registry directory {self.root}."
        elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            error.hint = f"The disk holding {self.root} is full."
        elif isinstance(exc, (NotADirectoryError, IsADirectoryError, FileExistsError)):
            error.hint = (
                f"Something in {self.root} is not laid out as a registry; check the registry URL."
            )
        return error


def _fsync_dir(directory: Path) -> None:
    """Make a rename or link in ``directory`` durable (best effort where unsupported)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
