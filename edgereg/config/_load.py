"""Reading models.toml: TOML, validation, and the JSON Schema."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from edgereg.config._base import DEFAULT_CONFIG_FILE
from edgereg.config._config import Config
from edgereg.config._errors import _config_error
from edgereg.config._toml import parse_toml, read_config_text
from edgereg.tasks import SHORTHAND_KINDS


def load(path: str | Path = DEFAULT_CONFIG_FILE) -> Config:
    """Read and validate a models.toml.

    Raises:
        ConfigError: the file is missing, is not a regular file, is larger than
            :data:`MAX_CONFIG_BYTES`, is not TOML, or breaks the schema; the
            message names the file, the key path and what is allowed.
    """
    return parse(read_config_text(path), file=str(path))


def parse(text: str, *, file: str = DEFAULT_CONFIG_FILE) -> Config:
    """Validate the text of a models.toml; ``file`` is used in errors and paths."""
    return _validated(parse_toml(text, file=file), file=file)


def _validated(data: dict[str, Any], *, file: str) -> Config:
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
    schema["$defs"]["Model"]["properties"]["task"] = {
        **described,
        "anyOf": [{"type": "string", "enum": list(SHORTHAND_KINDS)}, task],
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
