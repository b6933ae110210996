"""The client's trust decisions: pure, no sockets, no files, the clock passed in.

:func:`decide` takes the manifest bytes exactly as received and everything
the client knows (trusted keys, which model and tier it asked for, the device
id, the app's MNN runtime, the highest sequence it has seen, the time) and
either returns a :class:`Decision` or raises one :class:`Rejected` subclass
per reason. :class:`BlobCheck` checks a download chunk by chunk against the
entry the decision chose. The updater (:mod:`edgereg.client._updater`) owns
the network and the disk and only acts on what these say.

Rules, in the order they are checked (docs/protocol.md explains each):

1. size: at most ``max_manifest_bytes`` (64 KiB by default), before parsing;
2. envelope: a JSON object with ``payload``, ``payloadType`` (the manifest
   type) and ``signatures``;
3. key: at least one signature by a trusted key id;
4. signature: every signature by a trusted key verifies over the DSSE PAE;
5. payload: a valid manifest (strict schema);
6. model, then tier: the ones asked for;
7. rollback: ``sequence`` not lower than the highest already seen (equal is
   a re-fetch of the same manifest and accepted);
8. expiry: ``now < expires``;
9. choice: candidate inside the cohort (not paused), else stable, else none;
10. runtime: a chosen candidate that needs a newer MNN than the app has falls
    back to stable when stable fits; an entry that does not fit is refused.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, ClassVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgereg.errors import TrustError
from edgereg.rollout import choose_entry
from edgereg.signing import verify_envelope
from edgereg.wire import PAYLOAD_TYPE_MANIFEST, Manifest, ManifestEntry, format_time, from_bytes

__all__ = [
    "MAX_MANIFEST_BYTES",
    "BadBlob",
    "BadSignature",
    "BlobCheck",
    "BlobTooLarge",
    "Decision",
    "Expired",
    "Malformed",
    "Rejected",
    "Rollback",
    "RuntimeTooOld",
    "UnknownKey",
    "WrongModel",
    "WrongTier",
    "compare_versions",
    "decide",
]

MAX_MANIFEST_BYTES = 64 * 1024
"""Default limit on a manifest's size; a real one is about 1 KiB."""


# --- reasons ------------------------------------------------------------------


class Rejected(TrustError):
    """The client refuses a manifest or a blob; ``reason`` names the rule broken.

    Never retried with the same bytes: the last known good model stays.
    """

    reason: ClassVar[str] = "rejected"


class Malformed(Rejected):
    """Too large, not a signed envelope of a manifest, or a payload that breaks the schema."""

    reason = "malformed"


class UnknownKey(Rejected):
    """No signature by any trusted key."""

    reason = "unknown-key"


class BadSignature(Rejected):
    """A signature by a trusted key does not verify: the bytes were altered."""

    reason = "bad-signature"


class WrongModel(Rejected):
    """A validly signed manifest of another model (served at this model's path)."""

    reason = "wrong-model"


class WrongTier(Rejected):
    """A validly signed manifest of another tier."""

    reason = "wrong-tier"


class Rollback(Rejected):
    """The sequence is lower than one already seen: an old manifest replayed."""

    reason = "rollback"


class Expired(Rejected):
    """The manifest's ``expires`` time has passed (or a frozen copy is being served)."""

    reason = "expired"


class RuntimeTooOld(Rejected):
    """The entry for this device needs a newer MNN runtime than the app has."""

    reason = "runtime-too-old"


class BadBlob(Rejected):
    """A downloaded blob's size or sha256 differs from the manifest's entry."""

    reason = "bad-blob"


class BlobTooLarge(BadBlob):
    """The server sent more bytes than the entry's declared size."""

    reason = "blob-too-large"


# --- decision -----------------------------------------------------------------


@dataclass(frozen=True)
class Decision:
    """What a verified manifest means for this device.

    Attributes:
        manifest: The verified manifest.
        entry: What the device should run, or None when the manifest offers it
            nothing (the first release of a model, as a canary, outside the cohort).
        is_candidate: The entry is the candidate of a rollout.
        sequence: The highest sequence seen, this manifest's included: what
            the client persists for rollback protection.
        runtime_fallback: The device is in the candidate's cohort but the
            candidate needs a newer MNN runtime than the app has, so it got stable.
    """

    manifest: Manifest
    entry: ManifestEntry | None
    is_candidate: bool
    sequence: int
    runtime_fallback: bool = False


def decide(
    manifest_bytes: bytes,
    *,
    trusted: Mapping[str, Ed25519PublicKey],
    model: str,
    tier: str,
    device_id: str,
    app_mnn_runtime: str | None,
    highest_seen_sequence: int | None,
    now: datetime,
    max_manifest_bytes: int = MAX_MANIFEST_BYTES,
) -> Decision:
    """Verify a manifest and choose what this device runs.

    Args:
        manifest_bytes: The envelope bytes exactly as fetched.
        trusted: Public keys by key id (:class:`~edgereg.signing.TrustedKeys`).
        model: The model the client asked for.
        tier: The tier the client asked for.
        device_id: The sticky device id that places the device in or out of a cohort.
        app_mnn_runtime: The MNN runtime version in the app (like ``3.6.1``);
            None skips the runtime rule.
        highest_seen_sequence: The highest manifest sequence accepted before
            for this model and tier, None on first use.
        now: The current time, timezone-aware.
        max_manifest_bytes: Refuse larger manifests without parsing them.

    Raises:
        Malformed, UnknownKey, BadSignature, WrongModel, WrongTier, Rollback,
        Expired, RuntimeTooOld: the rule broken (all :class:`Rejected`,
        a :class:`~edgereg.errors.TrustError`).
        ValueError: ``now`` has no timezone or ``app_mnn_runtime`` is not a version.
    """
    if now.tzinfo is None:
        raise ValueError("decide needs a timezone-aware time")
    if app_mnn_runtime is not None:
        _version_key(app_mnn_runtime)  # a bad app version is the caller's bug, not the server's

    manifest = _verify(manifest_bytes, trusted, max_manifest_bytes)
    if manifest.model != model:
        raise WrongModel(
            f"manifest is for model '{manifest.model}', expected '{model}'",
            hint="The server returned another model's manifest at this path.",
        )
    if manifest.tier != tier:
        raise WrongTier(
            f"manifest is for tier '{manifest.tier}', expected '{tier}'",
            hint="The server returned another tier's manifest at this path.",
        )
    if highest_seen_sequence is not None and manifest.sequence < highest_seen_sequence:
        raise Rollback(
            f"sequence {manifest.sequence} is older than {highest_seen_sequence} already seen",
            hint="An old manifest is being replayed (a stale cache or an attack); "
            "the installed model stays.",
        )
    if now >= manifest.expires:
        raise Expired(
            f"manifest expired at {format_time(manifest.expires)} (now {format_time(now)})",
            hint="The registry must re-sign its manifests (`edgereg resign`); check the "
            "device clock too.",
        )
    sequence = max(manifest.sequence, highest_seen_sequence or 0)

    chosen = choose_entry(manifest, device_id)
    if chosen is None:
        return Decision(manifest, None, False, sequence)
    entry, is_candidate = chosen
    if app_mnn_runtime is None or _fits(entry, app_mnn_runtime):
        return Decision(manifest, entry, is_candidate, sequence)
    stable = manifest.stable
    if is_candidate and stable is not None and _fits(stable, app_mnn_runtime):
        return Decision(manifest, stable, False, sequence, runtime_fallback=True)
    role = "candidate" if is_candidate else "stable"
    needs = f"{role} {entry.version} ({entry.variant}) needs MNN {entry.min_mnn_runtime}"
    if is_candidate and stable is not None:
        needs += f" and stable {stable.version} needs MNN {stable.min_mnn_runtime}"
    raise RuntimeTooOld(
        f"{needs}, the app has {app_mnn_runtime}",
        hint="Update the app's MNN runtime, or publish a variant converted for it.",
    )


def _verify(data: bytes, trusted: Mapping[str, Ed25519PublicKey], max_bytes: int) -> Manifest:
    if len(data) > max_bytes:
        raise Malformed(f"manifest is {len(data)} bytes, more than the limit of {max_bytes}")
    envelope = _envelope_shape(data)
    if envelope["payloadType"] != PAYLOAD_TYPE_MANIFEST:
        raise Malformed(
            f"envelope payload type is {envelope['payloadType']!r}, "
            f"expected '{PAYLOAD_TYPE_MANIFEST}'"
        )
    keyids = [sig["keyid"] for sig in envelope["signatures"]]
    if not any(keyid in trusted for keyid in keyids):
        signed_by = ", ".join(_short(k) for k in keyids)
        known = ", ".join(_short(k) for k in trusted) or "none"
        raise UnknownKey(
            f"no signature by a trusted key: signed by {signed_by}; trusted keys are {known}",
            hint="If the registry key was rotated, the app needs the new public key.",
        )
    try:
        payload = verify_envelope(data, trusted, payload_type=PAYLOAD_TYPE_MANIFEST)
    except TrustError as exc:
        # Shape, type and key were checked above: what is left is an altered
        # payload or signature (or a non-canonical base64 spelling of one).
        raise BadSignature(exc.message, hint=exc.hint) from None
    try:
        return from_bytes(Manifest, payload)
    except TrustError as exc:
        raise Malformed(f"signed {exc.message}") from None


def _envelope_shape(data: bytes) -> dict[str, Any]:
    """Check the envelope's JSON shape, so later failures mean tampering or a key problem."""
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise Malformed(f"manifest is not a JSON envelope: {exc}") from None
    if not isinstance(value, dict):
        raise Malformed("manifest envelope is not a JSON object")
    for field, kind in (("payload", str), ("payloadType", str), ("signatures", list)):
        if not isinstance(value.get(field), kind):
            raise Malformed(f"manifest envelope has no {kind.__name__} '{field}'")
    if not value["signatures"]:
        raise Malformed("manifest envelope has no signatures")
    for index, sig in enumerate(value["signatures"]):
        if not isinstance(sig, dict) or not isinstance(sig.get("keyid"), str):
            raise Malformed(f"manifest envelope signatures[{index}] has no string 'keyid'")
    return value


# --- runtime versions ---------------------------------------------------------

_PART = re.compile(r"^([0-9]*)(.*)$")


def _version_key(version: str) -> tuple[tuple[int, str], ...]:
    if not re.fullmatch(r"[0-9]+(\.[0-9A-Za-z]+)*", version):
        raise ValueError(f"{version!r} is not an MNN runtime version like 3.6.1")
    parts = []
    for part in version.split("."):
        match = _PART.match(part)
        assert match is not None
        digits, rest = match.groups()
        parts.append((int(digits) if digits else 0, rest))
    while parts and parts[-1] == (0, ""):
        parts.pop()  # 3.7 == 3.7.0
    return tuple(parts)


def compare_versions(a: str, b: str) -> int:
    """Compare two MNN runtime versions: -1, 0 or 1.

    Dot-separated parts compare by their leading number, then by the rest
    as text; missing parts count as 0 (``3.7`` equals ``3.7.0``).

    Raises:
        ValueError: a version is not like ``3.6.1``.
    """
    ka, kb = _version_key(a), _version_key(b)
    return (ka > kb) - (ka < kb)


def _fits(entry: ManifestEntry, app_runtime: str) -> bool:
    return compare_versions(entry.min_mnn_runtime, app_runtime) <= 0


# --- blobs --------------------------------------------------------------------


class BlobCheck:
    """Check a blob chunk by chunk against its manifest entry (pure, incremental).

    Feed every byte in order with :meth:`update` (a resumed download feeds the
    bytes already on disk first), then call :meth:`finish`.
    """

    def __init__(self, entry: ManifestEntry) -> None:
        self.entry = entry
        self.received = 0
        self._hash = hashlib.sha256()

    @property
    def remaining(self) -> int:
        """Bytes still expected."""
        return self.entry.size - self.received

    def reset(self) -> None:
        """Forget every byte fed so far (a download starting again from byte 0)."""
        self.received = 0
        self._hash = hashlib.sha256()

    def expect(self, length: int | None) -> None:
        """Refuse up front a body announced (Content-Length) longer than what remains.

        Raises:
            BlobTooLarge: ``length`` is more than :attr:`remaining`.
        """
        if length is not None and length > self.remaining:
            raise BlobTooLarge(
                f"the server announces {self.received + length} bytes for blob "
                f"{_short(self.entry.sha256)}, the manifest declares {self.entry.size}",
                hint="The server holds a different file under this digest.",
            )

    def update(self, chunk: bytes) -> None:
        """Account for the next bytes.

        Raises:
            BlobTooLarge: the bytes go past the declared size.
        """
        if len(chunk) > self.remaining:
            raise BlobTooLarge(
                f"blob {_short(self.entry.sha256)} is larger than the {self.entry.size} bytes "
                "the manifest declares; stopped reading",
                hint="The server holds a different file under this digest.",
            )
        self.received += len(chunk)
        self._hash.update(chunk)

    def finish(self) -> None:
        """Check the whole blob.

        Raises:
            BadBlob: fewer bytes than declared, or a different sha256.
        """
        if self.received != self.entry.size:
            raise BadBlob(
                f"blob {_short(self.entry.sha256)} is {self.received} bytes, "
                f"the manifest declares {self.entry.size}"
            )
        digest = self._hash.hexdigest()
        if digest != self.entry.sha256:
            raise BadBlob(
                f"blob has sha256 {_short(digest)}…, the manifest declares "
                f"{_short(self.entry.sha256)}…",
                hint="The file was altered on the server or on the way; it was discarded.",
            )


def _short(hexdigest: str) -> str:
    return hexdigest[:12]
