"""Reading a models.toml file as TOML, before any table is validated."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from edgereg.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


def read_toml(path: Path) -> dict[str, Any]:
    """The tables of the file at ``path``.

    Raises:
        ConfigError: the file is missing, unreadable, or not TOML.
    """
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            "file not found",
            file=str(path),
            hint="Run edgereg inside the project (it looks for models.toml here and in the "
            "parent folders up to the repository root), pass --config PATH, or create one "
            "with `edgereg init`.",
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from exc
    return parse_toml(text, file=str(path))


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
