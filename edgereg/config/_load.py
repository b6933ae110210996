"""Reading models.toml: TOML, validation, and the JSON Schema."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgereg.config._base import DEFAULT_CONFIG_FILE
from edgereg.config._config import Config
from edgereg.config._errors import _config_error
from edgereg.config._tasks import TASK_KINDS
from edgereg.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib


#: The largest models.toml read, in bytes (a project of a hundred models is ~100 KB).
MAX_CONFIG_BYTES = 4 * 1024 * 1024


def load(path: str | Path = DEFAULT_CONFIG_FILE) -> Config:
    """Read and validate a models.toml.

    Raises:
        ConfigError: the file is missing, is not a regular file, is larger than
            :data:`MAX_CONFIG_BYTES`, is not TOML, or breaks the schema; the
            message names the file, the key path and what is allowed.
    """
    return parse(read_config_text(path), file=str(path))


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


def parse(text: str, *, file: str = DEFAULT_CONFIG_FILE) -> Config:
    """Validate the text of a models.toml; ``file`` is used in errors and paths."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not valid TOML: {exc}",
            file=file,
            hint="Fix the syntax at the line and column shown.",
        ) from exc
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, data, file) from exc
    config._path = Path(file)
    return config


def json_schema() -> dict[str, Any]:
    """The JSON Schema of models.toml, for editors and the reference docs."""
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgereg models.toml"
    _forbid_unnamed_keys(schema)
    # `task = "dense_map"` is shorthand for `task = { kind = "dense_map" }` (the
    # loader's BeforeValidator); the schema says so too, for the kinds that need
    # no settings.
    task = schema["$defs"]["Model"]["properties"]["task"]
    described = {key: task.pop(key) for key in ("description", "title") if key in task}
    shorthand = [kind for kind in TASK_KINDS if kind not in ("ctc", "custom")]
    schema["$defs"]["Model"]["properties"]["task"] = {
        **described,
        "anyOf": [{"type": "string", "enum": shorthand}, task],
    }
    return schema


def _forbid_unnamed_keys(node: Any) -> None:
    """Make tables keyed by names (tiers, models, variants) reject keys that are not names.

    pydantic describes them with ``patternProperties`` only, which lets any
    other key through; the loader rejects those, so the schema should too.
    """
    if isinstance(node, dict):
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _forbid_unnamed_keys(value)
    elif isinstance(node, list):
        for value in node:
            _forbid_unnamed_keys(value)
