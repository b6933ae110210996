"""Why a client refuses a manifest or a blob: one exception per reason code.

The reason codes are part of the protocol (docs/protocol.md §7, the
conformance vectors): a port reports the same code for the same bytes.
"""

from __future__ import annotations

from typing import ClassVar

from edgereg.protocol.errors import TrustError

__all__ = [
    "REASONS",
    "AppIncompatible",
    "BadBlob",
    "BadSignature",
    "BlobTooLarge",
    "Expired",
    "Incompatible",
    "Malformed",
    "OsIncompatible",
    "ProbeFailed",
    "Rejected",
    "Rollback",
    "RuntimeTooOld",
    "UnknownKey",
    "WrongModel",
    "WrongTier",
]


class Rejected(TrustError):
    """The client refuses a manifest or a blob; ``reason`` names the rule broken.

    Never retried with the same bytes: the last known good model stays.
    """

    reason: ClassVar[str] = "rejected"


class Malformed(Rejected):
    """Too large, too deep, not an envelope of the expected type, or a bad payload."""

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


class Incompatible(Rejected):
    """The entry for this device needs something of the app or OS it lacks."""

    reason = "incompatible"


class RuntimeTooOld(Incompatible):
    """The entry for this device needs a newer MNN runtime than the app has."""

    reason = "runtime-too-old"


class AppIncompatible(Incompatible):
    """The release needs other app versions (``requires.app``) than this app's."""

    reason = "app-incompatible"


class OsIncompatible(Incompatible):
    """The release needs other OS versions (``requires.android`` / ``requires.ios``)."""

    reason = "os-incompatible"


class BadBlob(Rejected):
    """A downloaded blob's size or sha256 differs from the manifest's entry."""

    reason = "bad-blob"


class BlobTooLarge(BadBlob):
    """The server sent more bytes than the entry's declared size."""

    reason = "blob-too-large"


class ProbeFailed(Rejected):
    """The model computed wrong outputs (or did not load) on every backend, CPU included.

    Found by the on-device self-test (docs/protocol.md §11) after the blob
    verified. ``permanent``: this version is marked bad on this device and
    never tried again; the last good model stays.
    """

    reason = "probe-failed"
    permanent: ClassVar[bool] = True


REASONS: tuple[type[Rejected], ...] = (
    Malformed,
    UnknownKey,
    BadSignature,
    WrongModel,
    WrongTier,
    Rollback,
    Expired,
    RuntimeTooOld,
    AppIncompatible,
    OsIncompatible,
    BlobTooLarge,
    BadBlob,
    ProbeFailed,
)
"""Every reason, in the order docs/protocol.md numbers the rules."""
