"""Keys and signatures at the edges: key files, the environment, pinned publisher keys.

The pure parts (key ids, envelopes, the PAE, the one envelope parser) live in
:mod:`edgereg.protocol.envelope` and are re-exported here, so
``edgereg.signing`` keeps working for code outside the package; edgereg
itself imports them from the protocol (ruff's banned-api rule, ``TID251``).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgereg.errors import TrustError
from edgereg.protocol._json import MAX_JSON_DEPTH, canonical_json, json_depth, strict_json_loads
from edgereg.protocol.envelope import (
    KEY_ID_RULE,
    Signer,
    TrustedKeys,
    generate_key,
    key_id,
    load_private_key,
    load_public_key,
    pae,
    public_key_pem,
    sign_envelope,
    verify_envelope,
)

__all__ = [
    "KEY_ID_RULE",
    "MAX_JSON_DEPTH",
    "Signer",
    "TrustedKeys",
    "canonical_json",
    "generate_key",
    "json_depth",
    "key_id",
    "load_private_key",
    "load_public_key",
    "looks_like_private_key",
    "pae",
    "private_key_from_env",
    "public_key_pem",
    "read_private_key_file",
    "read_trusted_keys",
    "sign_envelope",
    "strict_json_loads",
    "verify_envelope",
]


# --- key files and the environment: the only I/O in this module -------------


def read_private_key_file(path: str | os.PathLike[str]) -> Signer:
    """Load a signer from a PEM key file that only its owner can read.

    Raises:
        TrustError: the file is missing or unreadable, group or others may
            read or write it (the message says ``chmod 600 <path>``), or it
            does not hold an Ed25519 private key.
    """
    path = Path(path)
    try:
        with path.open("rb") as handle:
            mode = os.fstat(handle.fileno()).st_mode
            # Checked on the open file, so the file read is the file checked.
            if os.name == "posix" and stat.S_IMODE(mode) & 0o077:
                raise TrustError(
                    f"private key {path} is accessible by group or others "
                    f"(mode {stat.S_IMODE(mode):04o}), expected 0600",
                    hint=f"Run: chmod 600 {path}",
                )
            pem = handle.read()
    except FileNotFoundError as exc:
        raise TrustError(
            f"private key file {path} does not exist",
            hint="Create a key pair with `edgereg keys generate`, or point to the key "
            "with --key PATH.",
        ) from exc
    except OSError as exc:
        raise TrustError(f"cannot read private key file {path}: {exc.strerror}") from exc
    try:
        return Signer.from_pem(pem)
    except TrustError as exc:
        raise TrustError(f"{path}: {exc.message}", hint=exc.hint) from exc


def private_key_from_env(var: str) -> Signer:
    """Load a signer from an environment variable holding the PEM text.

    Raises:
        TrustError: the variable is unset or empty, or does not hold an
            Ed25519 private key.
    """
    value = os.environ.get(var, "")
    if not value.strip():
        raise TrustError(
            f"environment variable {var} is not set or empty; expected a PEM private key",
            hint=f"Set {var} to the contents of the private key file.",
        )
    try:
        return Signer.from_pem(value)
    except TrustError as exc:
        raise TrustError(f"environment variable {var}: {exc.message}", hint=exc.hint) from exc


def looks_like_private_key(data: bytes) -> bool:
    """True when bytes hold a PEM private key of any kind (never publish or serve those)."""
    return b"PRIVATE KEY-----" in data[:4096]


def read_trusted_keys(paths: Iterable[str | os.PathLike[str]]) -> TrustedKeys:
    """Load the publisher keys pinned in the project.

    Each path is a PEM public key file, or a directory whose ``*.pem`` files
    are. A directory that does not exist pins nothing (no key generated yet);
    a named file that does not exist is an error.

    Raises:
        TrustError: a file is missing or unreadable, is not an Ed25519 public
            key, or holds a private key.
    """
    files: list[Path] = []
    for entry in paths:
        path = Path(entry)
        if path.is_dir():
            files.extend(sorted(p for p in path.iterdir() if p.suffix == ".pem" and p.is_file()))
        elif path.exists() or path.suffix == ".pem":
            files.append(path)
    keys: list[Ed25519PublicKey] = []
    for path in files:
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise TrustError(
                f"cannot read pinned publisher key {path}: {exc.strerror or exc}",
                hint="Fix the path in [registry] trusted_keys of models.toml, or pass "
                "--trusted-key PUBLIC_KEY.pem.",
            ) from exc
        if looks_like_private_key(data):
            raise TrustError(
                f"pinned publisher key {path} is a PRIVATE key; only public keys are pinned "
                "(and a private key must never be committed)",
                hint="Move it out of the project, treat it as leaked, and pin its .pub.pem "
                "instead (docs/operations/keys.md).",
            )
        try:
            keys.append(load_public_key(data))
        except TrustError as exc:
            raise TrustError(f"pinned publisher key {path}: {exc.message}", hint=exc.hint) from exc
    return TrustedKeys(keys)
