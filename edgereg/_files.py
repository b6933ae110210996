"""File helpers every layer uses: content digests and all-or-nothing writes."""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file, read in chunks (never whole into memory)."""
    hasher = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(CHUNK), b""):
            hasher.update(chunk)
    return hasher.hexdigest()


def atomic_write(path: Path, data: bytes | str, *, mode: int | None = None) -> None:
    """Write a file whole or not at all: temp file in the same directory, fsync, rename.

    Readers see the old file or the new one, never half of one; a crash leaves
    at most a ``.<name>.*.tmp`` file next to it.

    Args:
        path: The file to (over)write; its directory must exist.
        data: The content; text is written as UTF-8.
        mode: Permission bits of the new file (0o600 for a private key),
            set before any byte is written; the umask default when None.

    Raises:
        OSError: the write failed (disk full, permissions); ``path`` is untouched.
    """
    payload = data.encode("utf-8") if isinstance(data, str) else data
    fd, tmp = _create_temp(path)
    try:
        if mode is not None:
            os.fchmod(fd, mode)
        else:
            umask = os.umask(0)
            os.umask(umask)
            os.fchmod(fd, 0o666 & ~umask)  # mkstemp's 0600 is for secrets only
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


_TEMP_FLAGS = (
    os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
)


def _create_temp(path: Path) -> tuple[int, str]:
    """A new private file ``.<name>.<random>.tmp`` beside ``path``: (descriptor, path).

    What ``tempfile.mkstemp`` does, without importing tempfile (and with it
    shutil, bz2 and lzma) into every command that writes a file.
    """
    while True:
        tmp = os.path.join(path.parent, f".{path.name}.{os.urandom(6).hex()}.tmp")
        try:
            return os.open(tmp, _TEMP_FLAGS, 0o600), tmp
        except FileExistsError:
            continue
