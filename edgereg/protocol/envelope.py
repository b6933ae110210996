"""Keys, DSSE envelopes, the signer input (PAE) and the one envelope parser.

Pure: bytes in, bytes or values out; no file, socket or clock.

Envelope format (DSSE, https://github.com/secure-systems-lab/dsse)::

    {"payload": "<base64 of the payload bytes>",
     "payloadType": "application/vnd.edgereg.<kind>+json",
     "signatures": [{"keyid": "<key id>", "sig": "<base64 Ed25519 signature>"}]}

Each signature is an Ed25519 signature over the DSSE pre-authentication
encoding (:func:`pae`) of the payload type and payload, so a payload can never
be passed off as another kind. Envelopes are written as canonical JSON.
See docs/decisions/0001-signed-envelopes.md.

Key id: the lowercase hex sha256 of the raw 32-byte Ed25519 public key
(RFC 8032 encoding), 64 characters.

:func:`verify_envelope` is the only code that reads an envelope: the client,
the registry and ``edgereg verify`` all go through it, so they accept and
refuse the same bytes for the same reason (docs/protocol.md §7, rules 2–5).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from edgereg.protocol._json import canonical_json, strict_json_loads
from edgereg.protocol.errors import TrustError
from edgereg.protocol.patterns import SHA256_RE
from edgereg.protocol.reasons import BadSignature, Malformed, UnknownKey

__all__ = [
    "KEY_ID_RULE",
    "Signer",
    "TrustedKeys",
    "envelope_payload_type",
    "generate_key",
    "key_id",
    "load_private_key",
    "load_public_key",
    "pae",
    "public_key_pem",
    "sign_envelope",
    "verify_envelope",
]

KEY_ID_RULE = "64 lowercase hex characters (sha256 of the raw Ed25519 public key)"
_PAYLOAD_TYPE = re.compile(r"^[\x21-\x7e]+$")  # printable ASCII, no spaces


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


def load_private_key(pem: bytes | str) -> Ed25519PrivateKey:
    """Parse an unencrypted PEM Ed25519 private key.

    Raises:
        TrustError: the text is not a PEM private key, is encrypted, or is not Ed25519.
    """
    data = pem.encode("utf-8") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:
        raise TrustError(
            "the private key is encrypted with a passphrase; edgereg needs an "
            "unencrypted PKCS#8 PEM key",
            hint="Store it unencrypted with permissions 0600, or in a secret environment variable.",
        ) from exc
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


def public_key_pem(public_key: Ed25519PublicKey) -> bytes:
    """Return a public key as SubjectPublicKeyInfo PEM (what keys/ in the registry holds)."""
    return public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def key_id(public_key: Ed25519PublicKey) -> str:
    """Return the key id: lowercase hex sha256 of the raw 32-byte public key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


def load_public_key(pem: bytes | str) -> Ed25519PublicKey:
    """Parse a PEM (SubjectPublicKeyInfo) Ed25519 public key.

    Raises:
        TrustError: the text is not a PEM public key or is not Ed25519.
    """
    data = pem.encode("utf-8") if isinstance(pem, str) else pem
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise TrustError(
            # Not quoted either: a private key pasted in the wrong place is still secret.
            f"not a PEM public key: expected '-----BEGIN PUBLIC KEY-----', found {_shape(data)}",
            hint="Use the .pub file `edgereg keys generate` wrote, or keys/ in the registry.",
        ) from exc
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
    """Check an envelope and return its payload bytes: the one envelope parser.

    Rules, in order (docs/protocol.md §7, rules 2–5):

    2. the bytes are strict JSON (no duplicate keys, nesting within the
       limit): an object with a string ``payload``, a string ``payloadType``
       and a non-empty list ``signatures`` of objects with a string ``keyid``;
       unknown fields are ignored, as DSSE asks — :class:`Malformed`;
    3. ``payloadType`` is the expected one — :class:`Malformed`;
    4. at least one signature's ``keyid`` is a trusted key id — :class:`UnknownKey`;
    5. every signature by a trusted key verifies: its ``sig`` is canonical
       standard base64 of an Ed25519 signature over the PAE of the canonical
       base64 payload; at least ``threshold`` distinct trusted keys signed —
       :class:`BadSignature` (or :class:`UnknownKey` below the threshold).

    A signature whose key id is not trusted is skipped whatever else it holds
    (a non-hex key id, a garbage or missing ``sig``): that is what makes key
    rotation work, and an extra signature can never make a valid envelope fail.

    Raises:
        Malformed, UnknownKey, BadSignature: the rule broken (all
            :class:`~edgereg.protocol.errors.TrustError`); the message says
            what was found and what was expected.
        ValueError: ``threshold`` is below 1.
    """
    if threshold < 1:
        raise ValueError(f"threshold must be at least 1, got {threshold}")
    envelope = _parse_envelope(envelope_bytes)
    found_type = envelope["payloadType"]
    if found_type != payload_type:
        raise Malformed(
            f"envelope payload type is {found_type!r}, expected '{payload_type}'",
            hint="The document is of another kind than the one asked for.",
        )
    signatures: list[dict[str, Any]] = envelope["signatures"]
    by_trusted = [(i, s) for i, s in enumerate(signatures) if s["keyid"] in trusted]
    if not by_trusted:
        signed_by = ", ".join(_short(s["keyid"]) for s in signatures)
        known = ", ".join(_short(k) for k in trusted) or "none"
        raise UnknownKey(
            f"no signature by a trusted key: envelope is signed by {signed_by}; "
            f"trusted keys are {known}",
            hint="If the key was rotated, the new public key must be trusted (pinned).",
        )
    payload = _b64decode(envelope["payload"], "payload")
    message = pae(found_type, payload)
    verified: set[str] = set()
    for index, signature in by_trusted:
        keyid = signature["keyid"]
        sig = signature.get("sig")
        if not isinstance(sig, str):
            raise BadSignature(f"signature {index} by trusted key {_short(keyid)} has no 'sig'")
        try:
            trusted[keyid].verify(_b64decode(sig, f"signatures[{index}].sig"), message)
        except InvalidSignature as exc:
            raise BadSignature(
                f"signature {index} by trusted key {_short(keyid)} does not verify: "
                "the payload, its type or the signature was altered",
                hint="Fetch the document again; if it persists, run `edgereg verify` on "
                "the registry.",
            ) from exc
        verified.add(keyid)
    if len(verified) < threshold:
        raise UnknownKey(
            f"signatures by {len(verified)} distinct trusted "
            f"key{'s' if len(verified) != 1 else ''}, {threshold} needed"
        )
    return payload


def envelope_payload_type(envelope_bytes: bytes) -> str:
    """The payloadType an envelope claims, unverified (to pick the document class).

    Raises:
        Malformed: not an envelope.
    """
    return str(_parse_envelope(envelope_bytes)["payloadType"])


def _parse_envelope(envelope_bytes: bytes) -> dict[str, Any]:
    try:
        data = strict_json_loads(envelope_bytes)
    except (ValueError, UnicodeDecodeError) as exc:
        raise Malformed(
            f"envelope is not JSON ({exc}); expected a signed envelope "
            '{"payload", "payloadType", "signatures"}'
        ) from exc
    if not isinstance(data, dict):
        raise Malformed(f"envelope is a JSON {_json_kind(data)}, expected an object")
    for field, kind in (("payload", str), ("payloadType", str), ("signatures", list)):
        if field not in data:
            raise Malformed(
                f"envelope has no '{field}'; found keys {sorted(data)[:8]}, expected "
                "payload, payloadType and signatures"
            )
        if not isinstance(data[field], kind):
            raise Malformed(
                f"envelope '{field}' is a JSON {_json_kind(data[field])}, expected a "
                f"{'string' if kind is str else 'list'}"
            )
    if not data["signatures"]:
        raise Malformed("envelope has no signatures, expected at least one")
    for index, signature in enumerate(data["signatures"]):
        where = f"envelope signatures[{index}]"
        if not isinstance(signature, dict):
            raise Malformed(f"{where} is a JSON {_json_kind(signature)}, expected an object")
        if not isinstance(signature.get("keyid"), str):
            raise Malformed(f"{where} has no string 'keyid'")
    return data


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
        raise BadSignature(
            f"envelope {field} is not canonical standard base64 (RFC 4648, padded): "
            f"found {text[:24]!r}{'…' if len(text) > 24 else ''}"
        )
    return data


def _json_kind(value: Any) -> str:
    kinds = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}
    return kinds.get(type(value), "number")


def _short(keyid: str) -> str:
    return keyid[:12] if SHA256_RE.match(keyid) else repr(keyid[:16])


def _shape(data: bytes) -> str:
    """Describe possibly secret bytes without quoting any of them."""
    text = data.strip()
    if not text:
        return "nothing (empty input)"
    if text.startswith(b"-----BEGIN "):
        label = text.split(b"\n", 1)[0][:40].decode("ascii", "replace")
        return f"a PEM block {label!r} (not an unencrypted Ed25519 private key)"
    return f"{len(text)} bytes without a PEM header"
