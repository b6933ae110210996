"""The name and digest rules as patterns, each written once.

Everything that checks a name or a sha256 (a blob digest, and a key id,
which is the sha256 of a public key) uses these: pydantic field types,
registry paths, the server's route parameters and models.toml errors.
This module imports nothing, so every other protocol module can use it.
"""

from __future__ import annotations

import re

__all__ = [
    "NAME",
    "NAME_PATTERN",
    "NAME_RE",
    "NAME_RULE",
    "SHA256",
    "SHA256_PATTERN",
    "SHA256_RE",
    "SHA256_RULE",
]

NAME_RULE = "a lowercase letter, then up to 62 lowercase letters, digits, '_' or '-'"
#: The name rule, unanchored: for building larger patterns (registry paths).
NAME = r"[a-z][a-z0-9_-]{0,62}"
#: A model, bundle, variant or tier name, anchored (JSON Schema, OpenAPI).
NAME_PATTERN = rf"^{NAME}$"
NAME_RE = re.compile(NAME_PATTERN)

SHA256_RULE = "64 lowercase hex characters"
#: A sha256 digest, unanchored: for building larger patterns.
SHA256 = r"[0-9a-f]{64}"
#: A sha256 digest or a key id, anchored.
SHA256_PATTERN = rf"^{SHA256}$"
SHA256_RE = re.compile(SHA256_PATTERN)
