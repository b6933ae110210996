"""Reading a models.toml file as TOML, before any table is validated."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from edgereg.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


#: The largest models.toml read, in bytes (a project of a hundred models is ~100 KB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_toml(path: Path) -> dict[str, Any]:
    """The tables of the file at ``path``.

    Raises:
        ConfigError: the file cannot be read (see :func:`read_config_text`) or is not TOML.
    """
    return parse_toml(read_config_text(path), file=str(path))


def read_config_text(path: str | Path) -> str:
    """The text of a models.toml: a regular file of at most :data:`MAX_CONFIG_BYTES`, UTF-8.

    A device (``--config /dev/zero``, ``/dev/urandom``), a pipe or a directory is
    refused before anything is read; a file past the limit is refused after
    reading one byte more than it, never read to its end.

    Raises:
        ConfigError: what is wrong, naming the file.
    """
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused below).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError as exc:
        raise ConfigError(
            "file not found",
            file=str(path),
            hint="Run edgereg inside the project (it looks for models.toml here and in the "
            "parent folders up to the repository root), pass --config PATH, or create one "
            "with `edgereg init`.",
        ) from exc
    except OSError as exc:
        raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(path)) from exc
    with os.fdopen(fd, "rb") as handle:
        try:
            mode = os.fstat(handle.fileno()).st_mode
            if not stat.S_ISREG(mode):
                kind = "a directory" if stat.S_ISDIR(mode) else "a device, pipe or socket"
                raise ConfigError(
                    f"not a regular file ({kind}); models.toml is read from a file",
                    file=str(path),
                    hint="Pass --config PATH of a models.toml file.",
                )
            data = handle.read(MAX_CONFIG_BYTES + 1)
        except OSError as exc:
            raise ConfigError(f"cannot read: {exc.strerror or exc}", file=str(path)) from exc
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError(
            f"larger than {MAX_CONFIG_BYTES // (1024 * 1024)} MiB; a models.toml is a few "
            "kilobytes per model",
            file=str(path),
            hint="Is --config the right file?",
        )
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"cannot read: not UTF-8 text ({exc})", file=str(path)) from exc


def parse_toml(text: str, *, file: str) -> dict[str, Any]:
    """The tables of a models.toml's text; ``file`` names it in errors."""
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not valid TOML: {exc}",
            file=file,
            hint="Fix the syntax at the line and column shown.",
        ) from exc
