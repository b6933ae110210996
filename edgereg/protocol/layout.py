"""Where everything lives in a registry: the one spelling of every path.

The same on a directory, S3, any static host and ``edgereg serve``::

    blobs/sha256/<hex>                    immutable artifacts
    models/<name>/releases/<semver>.json  signed release records
    models/<name>/state.json              signed rollout state
    manifests/<name>/<tier>.json          signed, what an app of that tier fetches
    keys/<keyid>.pem                      public keys only (never trusted from here)
"""

from __future__ import annotations

import re

from edgereg.protocol.patterns import NAME

__all__ = [
    "BLOBS_PREFIX",
    "KEYS_PREFIX",
    "MANIFESTS_PREFIX",
    "MODELS_PREFIX",
    "blob_path",
    "is_public_key_path",
    "manifest_path",
    "manifest_prefix",
    "parse_manifest_path",
    "parse_state_path",
    "public_key_path",
    "release_path",
    "releases_prefix",
    "state_path",
]

BLOBS_PREFIX = "blobs/sha256/"
MODELS_PREFIX = "models/"
MANIFESTS_PREFIX = "manifests/"
KEYS_PREFIX = "keys/"

_MANIFEST = re.compile(rf"^{re.escape(MANIFESTS_PREFIX)}({NAME})/({NAME})\.json$")
_STATE = re.compile(rf"^{re.escape(MODELS_PREFIX)}({NAME})/state\.json$")
_PUBLIC_KEY_SUFFIX = ".pem"


def blob_path(sha256: str) -> str:
    """The registry path (and URL path) of a blob: ``blobs/sha256/<hex>``."""
    return f"{BLOBS_PREFIX}{sha256}"


def state_path(model: str) -> str:
    """Where a model's signed rollout state lives."""
    return f"{MODELS_PREFIX}{model}/state.json"


def releases_prefix(model: str) -> str:
    """The prefix under which a model's release records live."""
    return f"{MODELS_PREFIX}{model}/releases/"


def release_path(model: str, version: str) -> str:
    """Where a release record lives."""
    return f"{releases_prefix(model)}{version}.json"


def manifest_prefix(model: str) -> str:
    """The prefix under which a model's manifests live."""
    return f"{MANIFESTS_PREFIX}{model}/"


def manifest_path(model: str, tier: str) -> str:
    """Where the manifest of one tier lives (the URL path an app fetches)."""
    return f"{manifest_prefix(model)}{tier}.json"


def parse_manifest_path(path: str) -> tuple[str, str] | None:
    """(model, tier) of a manifest path, or None when ``path`` is not one."""
    match = _MANIFEST.match(path)
    return (match.group(1), match.group(2)) if match else None


def parse_state_path(path: str) -> str | None:
    """The unit (model or bundle) whose rollout state ``path`` is, or None when it is not one."""
    match = _STATE.match(path)
    return match.group(1) if match else None


def public_key_path(keyid: str) -> str:
    """Where a public key is published."""
    return f"{KEYS_PREFIX}{keyid}{_PUBLIC_KEY_SUFFIX}"


def is_public_key_path(path: str) -> bool:
    """True for a path where keys/ publishes a public key (``keys/*.pem``)."""
    return path.startswith(KEYS_PREFIX) and path.endswith(_PUBLIC_KEY_SUFFIX)
