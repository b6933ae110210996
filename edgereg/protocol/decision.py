"""The client's decision: pure, no sockets, no files, the clock passed in.

:func:`decide` takes the manifest bytes exactly as received and everything
the client knows (trusted keys, which model and tier it asked for, the device
id, the app's MNN runtime, the highest sequence it has seen, the time) and
either returns a :class:`Decision` or raises one
:class:`~edgereg.protocol.reasons.Rejected` subclass per reason.
:class:`BlobCheck` checks a download chunk by chunk against the entry the
decision chose.

Rules, in the order they are checked (docs/protocol.md §7 explains each):

1. size: at most ``max_manifest_bytes`` (64 KiB by default), before parsing;
2. envelope: strict JSON, nested at most 64 deep: an object with ``payload``,
   ``payloadType`` and ``signatures`` (each an object with a string ``keyid``);
3. type: ``payloadType`` is the manifest type;
4. key: at least one signature by a trusted key id;
5. signature: every signature by a trusted key verifies over the DSSE PAE;
6. payload: a valid manifest (strict schema);
7. model, then 8. tier: the ones asked for;
9. rollback: ``sequence`` not lower than the highest already seen for the
   model (equal is a re-fetch of the same manifest and accepted);
10. expiry: ``now < expires``;
11. choice: candidate inside the cohort (not paused), else stable, else none;
12. runtime: a chosen candidate that needs a newer MNN than the app has falls
    back to stable when stable fits; an entry that does not fit is refused.

Rules 2–5 are :func:`~edgereg.protocol.envelope.verify_envelope`, the same
parser the registry uses. Blob rules 13 and 14 are :class:`BlobCheck`.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgereg.protocol.envelope import verify_envelope
from edgereg.protocol.fields import format_time
from edgereg.protocol.reasons import (
    BadBlob,
    BlobTooLarge,
    Expired,
    Malformed,
    Rollback,
    RuntimeTooOld,
    WrongModel,
    WrongTier,
)
from edgereg.protocol.rules import choose_entry
from edgereg.protocol.wire import PAYLOAD_TYPE_MANIFEST, Manifest, ManifestEntry, from_bytes

__all__ = [
    "MAX_MANIFEST_BYTES",
    "BlobCheck",
    "Decision",
    "compare_versions",
    "decide",
]

MAX_MANIFEST_BYTES = 64 * 1024
"""Default limit on a manifest's size; a real one is about 1 KiB."""


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
            for this model (whatever the tier), None on first use.
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
    payload = verify_envelope(data, trusted, payload_type=PAYLOAD_TYPE_MANIFEST)
    return from_bytes(Manifest, payload)


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
