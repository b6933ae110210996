"""File and folder names of a project, apart from the schema (no pydantic: any command may ask)."""

from __future__ import annotations

DEFAULT_CONFIG_FILE = "models.toml"
#: Where the publisher's public keys are pinned, beside models.toml (committed).
DEFAULT_TRUSTED_KEYS = "publisher-keys"
#: What `edgereg validate` says about a models.toml that declares no model yet.
NO_MODELS_NOTE = (
    "no models yet: run `edgereg add path/to/model.onnx --evaluation path/to/evaluation.npz`"
)
