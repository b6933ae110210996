"""Keys, signed envelopes and their verification.

Everything above the key-file helpers at the bottom is pure: it takes bytes and
returns bytes or values, and touches no file, socket or clock.

Envelope format (DSSE, https://github.com/secure-systems-lab/dsse)::

    {"payload": "<base64 of the payload bytes>",
     "payloadType": "application/vnd.edgereg.<kind>+json",
     "signatures": [{"keyid": "<key id>", "sig": "<base64 Ed25519 signature>"}]}

Each signature is an Ed25519 signature over the DSSE pre-authentication
encoding (:func:`pae`) of the payload type and payload, so a payload can never
be passed off as another kind. Envelopes are written as canonical JSON
(:func:`canonical_json`). See docs/decisions/0001-signed-envelopes.md.

Key id: the lowercase hex sha256 of the raw 32-byte Ed25519 public key
(RFC 8032 encoding), 64 characters. Anyone holding the public key, in any
language, can recompute it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from edgereg.errors import TrustError

__all__ = [
    "KEY_ID_RULE",
    "Signer",
    "TrustedKeys",
    "canonical_json",
    "generate_key",
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
    "verify_envelope",
]

KEY_ID_RULE = "64 lowercase hex characters (sha256 of the raw Ed25519 public key)"
_KEY_ID = re.compile(r"^[0-9a-f]{64}$")
_PAYLOAD_TYPE = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


def canonical_json(value: Any) -> bytes:
    """Return the canonical JSON bytes edgereg signs and stores.

    Keys sorted, no whitespace, UTF-8, NaN and infinities refused. The bytes
    are produced once, by the signer; verifiers check signatures over the
    bytes as received and never re-serialize, so this need not be RFC 8785.

    Raises:
        ValueError: the value holds NaN or an infinity, or is not JSON data.
    """
    text = json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


MAX_JSON_DEPTH = 64
"""Deepest nesting of arrays and objects any edgereg document may have (real ones: 8)."""

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(data: bytes) -> int:
    """The deepest nesting of ``[`` and ``{`` in JSON bytes, strings skipped (no parsing)."""
    brackets = _JSON_STRING.sub(b"", data).translate(None, _NOT_A_BRACKET)
    depth = deepest = 0
    for byte in brackets:
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


def strict_json_loads(data: bytes, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse UTF-8 JSON, refusing duplicate keys, NaN, infinities and deep nesting.

    Two parsers that disagree on a duplicate key would see two documents
    behind one signature; refusing them leaves one reading. Nesting deeper
    than ``max_depth`` is refused before parsing, so 60,000 ``[`` cannot
    exhaust the parser's stack.

    Raises:
        ValueError: not UTF-8, not JSON, a duplicate key, a non-finite number,
            or nested deeper than ``max_depth``.
    """
    # Decoded here, not by json.loads, which would guess UTF-16 or UTF-32.
    text = data.decode("utf-8")
    depth = json_depth(data)
    if depth > max_depth:
        raise ValueError(f"nested {depth} levels deep, more than the limit of {max_depth}")
    try:
        return json.loads(text, object_pairs_hook=_no_duplicate_keys, parse_constant=_no_constant)
    except RecursionError as exc:  # pragma: no cover - the depth check comes first
        raise ValueError("nested too deeply") from exc


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding: what a signature actually covers.

    ``"DSSEv1" SP LEN(type) SP type SP LEN(body) SP body``, lengths as ASCII
    decimal byte counts.
    """
    type_bytes = payload_type.encode("utf-8")
    return b"DSSEv1 %d %b %d %b" % (len(type_bytes), type_bytes, len(payload), payload)


# --- keys -------------------------------------------------------------------


def generate_key() -> tuple[bytes, bytes]:
    """Make a new Ed25519 key pair.

    Returns:
        (private key as unencrypted PKCS#8 PEM, public key as SubjectPublicKeyInfo PEM).
    """
    private = Ed25519PrivateKey.generate()
    private_pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return private_pem, public_key_pem(private.public_key())


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    """Return a public key as SubjectPublicKeyInfo PEM (what keys/ in the registry holds)."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(public_key: Ed25519PublicKey) -> str:
    """Return the key id: lowercase hex sha256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_private_key(pem: bytes | str) -> Ed25519PrivateKey:
    """Parse an unencrypted PEM Ed25519 private key.

    Raises:
        TrustError: the text is not a PEM private key, is encrypted, or is not Ed25519.
    """
    data = pem.encode("utf-8") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise TrustError(
            "the private key is encrypted with a passphrase; edgereg needs an "
            "unencrypted PKCS#8 PEM key",
            hint="Store it unencrypted with permissions 0600, or in a secret environment variable.",
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        # Never quote the text: a key pasted without its header is still secret.
        raise TrustError(
            "not a PEM private key: expected text starting with "
            f"'-----BEGIN PRIVATE KEY-----', found {_shape(data)}",
            hint="Create one with `edgereg keys generate`; a CI secret must hold the whole "
            "PEM file, header and footer lines included.",
        ) from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise TrustError(
            f"the private key is {type(key).__name__.removeprefix('_')}, expected Ed25519",
            hint="Create an Ed25519 key with `edgereg keys generate`.",
        )
    return key


def load_public_key(pem: bytes | str) -> Ed25519PublicKey:
    """Parse a PEM (SubjectPublicKeyInfo) Ed25519 public key.

    Raises:
        TrustError: the text is not a PEM public key or is not Ed25519.
    """
    data = pem.encode("utf-8") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm):
        raise TrustError(
            f"not a PEM public key: expected '-----BEGIN PUBLIC KEY-----', found {_preview(data)}",
            hint="Use the .pub file `edgereg keys generate` wrote, or keys/ in the registry.",
        ) from None
    if not isinstance(key, Ed25519PublicKey):
        raise TrustError(
            f"the public key is {type(key).__name__.removeprefix('_')}, expected Ed25519"
        )
    return key


class Signer:
    """A private key and its key id, so callers never handle raw key bytes."""

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self._public_key = private_key.public_key()
        self._key_id = key_id(self._public_key)

    @classmethod
    def from_pem(cls, pem: bytes | str) -> Signer:
        """Build a signer from an unencrypted PEM private key (see :func:`load_private_key`)."""
        return cls(load_private_key(pem))

    @property
    def key_id(self) -> str:
        """The key id every signature by this signer carries."""
        return self._key_id

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self._public_key

    def public_pem(self) -> bytes:
        """The matching public key as PEM."""
        return public_key_pem(self._public_key)

    def sign(self, data: bytes) -> bytes:
        """Return the 64-byte Ed25519 signature of ``data``."""
        return self._private_key.sign(data)

    def __repr__(self) -> str:
        return f"Signer(key_id={self._key_id[:12]}…)"


class TrustedKeys(Mapping[str, Ed25519PublicKey]):
    """The public keys a verifier trusts, by key id. Immutable."""

    def __init__(self, keys: Iterable[Ed25519PublicKey] = ()) -> None:
        self._keys = {key_id(key): key for key in keys}

    @classmethod
    def from_pems(cls, pems: Iterable[bytes | str]) -> TrustedKeys:
        """Build from PEM public keys; the same key twice counts once.

        Raises:
            TrustError: a PEM is not an Ed25519 public key.
        """
        return cls(load_public_key(pem) for pem in pems)

    def __getitem__(self, keyid: str) -> Ed25519PublicKey:
        return self._keys[keyid]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return f"TrustedKeys({', '.join(_short(k) for k in self._keys)})"


# --- envelopes --------------------------------------------------------------


def sign_envelope(
    payload: bytes,
    payload_type: str,
    private_keys: Sequence[Signer | Ed25519PrivateKey],
) -> bytes:
    """Sign a payload with every given key and return the envelope's canonical JSON.

    Signing with several keys is how a key is rotated: sign with the old and
    the new key while apps still trust only the old one.

    Raises:
        ValueError: no key, the same key twice, or a payload type that is not
            printable ASCII.
    """
    if not private_keys:
        raise ValueError("sign_envelope needs at least one key")
    if not _PAYLOAD_TYPE.match(payload_type):
        raise ValueError(f"payload type must be printable ASCII, got {payload_type!r}")
    signers = [key if isinstance(key, Signer) else Signer(key) for key in private_keys]
    ids = [signer.key_id for signer in signers]
    if len(set(ids)) != len(ids):
        raise ValueError("sign_envelope got the same key more than once")
    message = pae(payload_type, payload)
    envelope = {
        "payload": _b64encode(payload),
        "payloadType": payload_type,
        "signatures": [
            {"keyid": signer.key_id, "sig": _b64encode(signer.sign(message))} for signer in signers
        ],
    }
    return canonical_json(envelope)


def verify_envelope(
    envelope_bytes: bytes,
    trusted: Mapping[str, Ed25519PublicKey],
    *,
    payload_type: str,
    threshold: int = 1,
) -> bytes:
    """Check an envelope and return its payload bytes.

    Rules, in order: the bytes are a JSON object with ``payload``,
    ``payloadType`` and ``signatures`` (unknown fields are ignored, as DSSE
    asks); base64 is standard, padded and canonical; the payload type is the
    expected one; every signature whose key id is trusted verifies (a bad
    signature by a trusted key means tampering and fails the whole envelope);
    at least ``threshold`` distinct trusted keys signed. Signatures by keys
    not in ``trusted`` are ignored, which is what makes rotation work.

    Raises:
        TrustError: any rule is broken; the message says what was found and
            what was expected.
        ValueError: ``threshold`` is below 1.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, got {threshold}")
    envelope = _parse_envelope(envelope_bytes)

    found_type = envelope["payloadType"]
    if found_type != payload_type:
        raise TrustError(
            f"envelope payload type is '{found_type}', expected '{payload_type}'",
            hint="The document is of another kind than the one asked for.",
        )
    payload = _b64decode(envelope["payload"], "payload")
    message = pae(found_type, payload)

    signed_by: list[str] = []
    verified: set[str] = set()
    for index, signature in enumerate(envelope["signatures"]):
        keyid = signature["keyid"]
        signed_by.append(keyid)
        sig = _b64decode(signature["sig"], f"signatures[{index}].sig")
        public_key = trusted.get(keyid)
        if public_key is None:
            continue
        try:
            public_key.verify(sig, message)
        except InvalidSignature:
            raise TrustError(
                f"signature {index} by trusted key {_short(keyid)} does not verify: "
                "the payload, its type or the signature was altered",
                hint="Fetch the document again from the registry; if it persists, "
                "run `edgereg verify` on the registry.",
            ) from None
        verified.add(keyid)

    if len(verified) < threshold:
        signers = ", ".join(_short(k) for k in signed_by) or "no key"
        known = ", ".join(_short(k) for k in trusted) or "none"
        if threshold == 1:
            what = "no signature by a trusted key"
        else:
            what = (
                f"signatures by {len(verified)} distinct trusted "
                f"key{'s' if len(verified) != 1 else ''}, {threshold} needed"
            )
        raise TrustError(
            f"{what}: envelope is signed by {signers}; trusted keys are {known}",
            hint="If the registry key was rotated, add its new public key to the trusted keys.",
        )
    return payload


def _parse_envelope(envelope_bytes: bytes) -> dict[str, Any]:
    try:
        data = strict_json_loads(envelope_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise TrustError(
            f"envelope is not JSON ({exc}); expected a signed envelope "
            '{"payload", "payloadType", "signatures"}'
        ) from None
    if not isinstance(data, dict):
        raise TrustError(f"envelope is a JSON {_json_kind(data)}, expected an object")
    for field, kind in (("payload", str), ("payloadType", str), ("signatures", list)):
        if field not in data:
            raise TrustError(
                f"envelope has no '{field}'; found keys {sorted(data)}, expected "
                "payload, payloadType and signatures"
            )
        if not isinstance(data[field], kind):
            raise TrustError(
                f"envelope '{field}' is a JSON {_json_kind(data[field])}, expected a "
                f"{'string' if kind is str else 'list'}"
            )
    if not data["signatures"]:
        raise TrustError("envelope has no signatures, expected at least one")
    for index, signature in enumerate(data["signatures"]):
        where = f"envelope signatures[{index}]"
        if not isinstance(signature, dict):
            raise TrustError(f"{where} is a JSON {_json_kind(signature)}, expected an object")
        for field in ("keyid", "sig"):
            if not isinstance(signature.get(field), str):
                raise TrustError(f"{where} has no string '{field}'; found {signature!r}")
        if not _KEY_ID.match(signature["keyid"]):
            raise TrustError(
                f"{where} keyid {signature['keyid']!r} is not a key id: expected {KEY_ID_RULE}"
            )
    return data


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"duplicate key {key!r}")
        result[key] = value
    return result


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _b64encode(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _b64decode(text: str, field: str) -> bytes:
    """Decode standard padded base64, refusing any other spelling of the same bytes.

    Without the round-trip check, changing the unused low bits of the last
    character would give a different envelope with the same payload.
    """
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        data = None
    if data is None or _b64encode(data) != text:
        raise TrustError(
            f"envelope {field} is not canonical standard base64 (RFC 4648, padded): "
            f"found {text[:24]!r}{'…' if len(text) > 24 else ''}"
        )
    return data


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _short(keyid: str) -> str:
    return keyid[:12] if _KEY_ID.match(keyid) else repr(keyid)


def _shape(data: bytes) -> str:
    """Describe possibly secret bytes without quoting any of them."""
    text = data.strip()
    if not text:
        return "nothing (empty input)"
    if text.startswith(b"-----BEGIN "):
        label = text.split(b"\n", 1)[0][:40].decode("ascii", "replace")
        return f"a PEM block {label!r} (not an unencrypted Ed25519 private key)"
    return f"{len(text)} bytes without a PEM header"


def _preview(data: bytes) -> str:
    first = data.strip().split(b"\n", 1)[0][:40]
    return repr(first.decode("utf-8", "replace")) if first else "nothing (empty input)"


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
    except FileNotFoundError:
        raise TrustError(
            f"private key file {path} does not exist",
            hint="Create a key pair with `edgereg keys generate`, or point to the key "
            "with --key PATH.",
        ) from None
    except OSError as exc:
        raise TrustError(f"cannot read private key file {path}: {exc.strerror}") from None
    try:
        return Signer.from_pem(pem)
    except TrustError as exc:
        raise TrustError(f"{path}: {exc.message}", hint=exc.hint) from None


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
        raise TrustError(f"environment variable {var}: {exc.message}", hint=exc.hint) from None


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
