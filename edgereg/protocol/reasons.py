"""Why a client refuses a manifest or a blob (one exception per reason code), and its other codes.

The reason codes are part of the protocol (docs/protocol.md §7, the
conformance vectors): a port reports the same code for the same bytes.
:data:`CLIENT_REASONS` adds the codes a client reports for what is not a
refused document (the network, the disk, a release refused here before), each
with what the app does about it (docs/protocol.md §10): a port reports the
same codes, and an app handles every one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from edgereg.protocol.errors import TrustError

__all__ = [
    "CLIENT_REASONS",
    "REASONS",
    "AppIncompatible",
    "BadBlob",
    "BadSignature",
    "BlobTooLarge",
    "ClientReason",
    "CpuUnsupported",
    "Expired",
    "Incompatible",
    "InsufficientMemory",
    "Malformed",
    "OsIncompatible",
    "ProbeFailed",
    "ProbeNotRun",
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


class InsufficientMemory(Incompatible):
    """The entry's measured peak memory is above the device's memory budget (rule 12d)."""

    reason = "insufficient-memory"


class CpuUnsupported(Incompatible):
    """The entry must not run on a CPU feature the device has, and no ``instead`` fits (12e).

    Also the decision's ``substitute`` when the device got the entry's ``instead``.
    """

    reason = "cpu-unsupported"


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


class ProbeNotRun(Rejected):
    """The self-test could not run the probe: the app's runner has no CPU backend here.

    Not a verdict on the model (docs/protocol.md §11, rule 19): the release is
    neither installed nor marked bad, and nothing is reported; the next fetch
    tries again. A client built without a runner never gets here: it refuses
    to be built with the self-test on.
    """

    reason = "probe-not-run"
    permanent: ClassVar[bool] = False


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
    InsufficientMemory,
    CpuUnsupported,
    BlobTooLarge,
    BadBlob,
    ProbeFailed,
)
"""Every reason, in the order docs/protocol.md numbers the rules."""


@dataclass(frozen=True)
class ClientReason:
    """A code a client reports beside the rules of :data:`REASONS`.

    Attributes:
        code: The stable code (``FetchResult.error_code``, ``last_error.code``).
        when: What happened.
        app_does: What the app does about it.
        retry: Whether a later fetch may succeed with nothing changed on the device.
    """

    code: str
    when: str
    app_does: str
    retry: bool


CLIENT_REASONS: tuple[ClientReason, ...] = (
    ClientReason(
        "transport",
        "The network failed, a request timed out or trickled, the server answered an "
        "error status or closed the connection early.",
        "Keep the installed model; fetch again later (a download resumes where it stopped).",
        retry=True,
    ),
    ClientReason(
        "not-found",
        "The registry answered 404 for the manifest: no such model (or bundle) and tier there.",
        "Keep the installed model; fix the model name, tier or registry URL (a bug, not a blip).",
        retry=False,
    ),
    ClientReason(
        "untrusted",
        "A key or signed document cannot be trusted for a reason no rule of §7 names.",
        "Keep the installed model; check the trusted keys the app ships.",
        retry=False,
    ),
    ClientReason(
        "bad-release",
        "The release chosen for this device was refused here for good before (a failed "
        "check, a revert); it is never downloaded again.",
        "Keep the installed model; the next release (or stable) installs when it comes.",
        retry=False,
    ),
    ClientReason(
        "no-space",
        "The free space cannot hold the download plus the reserve; nothing was downloaded.",
        "Keep the installed model; free storage (or ask the user to), then fetch again.",
        retry=True,
    ),
    ClientReason(
        "cache",
        "The cache directory cannot be read or written, or a state file that keeps rollback "
        "protection is corrupt (the client refuses rather than forget it).",
        "Keep the installed model; report it. If the disk was at fault, delete the file the "
        "message names.",
        retry=False,
    ),
    ClientReason(
        "probe-not-run",
        "The self-test could not run the golden probe: the app's model runner cannot "
        "create even its CPU backend here. Not a verdict on the model: nothing is marked "
        "bad and nothing is reported.",
        "Keep the installed model; fix the runner (a missing MNN library); the next fetch "
        "tries again.",
        retry=True,
    ),
    ClientReason(
        "cancelled",
        "The app cancelled the fetch (a cancel call, a cancelled task or future, an "
        "interrupted thread) before the switch; nothing was installed.",
        "Keep the installed model; a later fetch resumes the download from the part kept.",
        retry=True,
    ),
    ClientReason(
        "reverted",
        "The app reverted the installed release (`revert`, or too many unconfirmed "
        "starts); only in `last_error`.",
        "Run the model now installed (the previous set, or none); the reverted release is "
        "marked bad.",
        retry=False,
    ),
)
"""Every code a client reports that is not a rule of :data:`REASONS` (docs/protocol.md §10)."""
