"""What a fetch returns: the result the app reads, and the stable code of each failure.

Every code :func:`error_code` returns is in the protocol's table
(:data:`edgereg.protocol.reasons.CLIENT_REASONS` beside ``REASONS``), which
says what an app does about it (docs/protocol.md §10).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from edgereg.client._cache import NoSpace
from edgereg.client._control import Cancelled
from edgereg.client._fetcher import ManifestNotFound
from edgereg.client._installed import InstalledModel
from edgereg.protocol.contract import IOContract
from edgereg.protocol.errors import EdgeregError, TransportError, TrustError
from edgereg.protocol.fields import BUCKETS, RuntimeHints, basis_points
from edgereg.protocol.reasons import Rejected
from edgereg.protocol.rules import cohort_bucket
from edgereg.protocol.wire import Manifest

__all__ = ["BadRelease", "CohortPosition", "FetchResult", "cohort_position", "error_code"]


@dataclass(frozen=True)
class CohortPosition:
    """Where a device stands in a rollout (docs/protocol.md section 6).

    Attributes:
        bucket: The device's bucket in ``[0, 10000)`` for the rollout's salt.
        threshold: The rollout percentage in basis points: buckets below it
            get the candidate.
        percent: The rollout percentage.
        paused: The rollout is paused (everyone gets stable).
        inside: The device is in the candidate's cohort (and the rollout runs).
    """

    bucket: int
    threshold: int
    percent: float
    paused: bool
    inside: bool

    def describe(self) -> str:
        """One line, as `edgereg pull --explain` prints it."""
        where = "inside" if self.bucket < self.threshold else "outside"
        line = (
            f"cohort: bucket {self.bucket} of {BUCKETS}; the candidate is at {self.percent:g}% "
            f"(buckets below {self.threshold}): {where} the cohort"
        )
        return line + (" (the rollout is paused: stable for everyone)" if self.paused else "")


def cohort_position(manifest: Manifest, device_id: str) -> CohortPosition | None:
    """The device's position in the manifest's rollout, or None when there is no candidate."""
    if manifest.candidate is None or manifest.salt is None or manifest.percent is None:
        return None
    bucket = cohort_bucket(device_id, manifest.salt)
    threshold = basis_points(manifest.percent)
    return CohortPosition(
        bucket=bucket,
        threshold=threshold,
        percent=manifest.percent,
        paused=manifest.paused,
        inside=bucket < threshold and not manifest.paused,
    )


@dataclass(frozen=True)
class FetchResult:
    """What the app should run after a fetch, and what happened.

    On any failure the fields describe the last known good model or bundle
    (or nothing, if none was ever installed) and ``error`` says why nothing
    new was installed.

    Attributes:
        model: The model (or bundle) asked for.
        tier: The device's tier.
        path: The installed, verified artifact to load; None when nothing was
            ever installed, when the manifest offers this device nothing
            (a first release still a canary, device outside its cohort), and
            for a bundle (its models are in ``members``).
        version: Its release version (a bundle's own version for a bundle).
        variant: Its variant name (None for a bundle).
        sha256: Its digest (None for a bundle).
        runtime: The runtime settings to use (threads, backend order, precision):
            the entry's declared ``runtime``, or the threads and backends of the
            hint rule that chose this device (docs/protocol.md §11; ``runtime_rule``).
        min_mnn_runtime: The oldest MNN runtime that loads it.
        is_candidate: It is the candidate of a rollout (this device is in the cohort).
        updated: This fetch installed a different release than before.
        error: Why the fetch failed, or None.
        error_code: A stable code for ``error``: a :class:`Rejected` reason
            (``expired``, ``rollback``, ``bad-signature``, ``app-incompatible``
            ...), ``transport``, ``not-found``, ``untrusted``, ``cache``,
            ``no-space`` or ``bad-release`` (the table of
            :data:`~edgereg.protocol.reasons.CLIENT_REASONS` says what to do).
        not_modified: The server answered 304 (the cached manifest was re-verified).
        downloaded_bytes: Blob bytes transferred by this fetch.
        runtime_fallback: In the candidate's cohort, but the candidate does not
            fit this app or device, so stable was installed (``fallback`` says why).
        exception: The error itself, for callers that want its type.
        members: Every installed model by name, with its contract and labels
            (for a model: one, the model itself).
        bundle: The unit is a bundle.
        fallback: Why the candidate was passed over for stable
            (``runtime-too-old``, ``app-incompatible``, ``os-incompatible``,
            ``insufficient-memory``, ``cpu-unsupported``, ``bad-release``), else None.
        substitute: ``cpu-unsupported`` when this fetch chose an entry's
            ``instead`` (the variant named for devices with a CPU feature the
            entry avoids; ``variant`` is the one installed), else None.
        deferred: The download waits for the app's conditions (``metered``,
            ``not-charging``); nothing new was downloaded.
        bundled: What is installed is the release shipped inside the app.
        cohort: Where this device stands in the manifest's rollout (None
            without a candidate, or when no manifest was read).
        runtime_rule: The index in the entry's ``runtime_hints`` of the rule
            whose runtime ``runtime`` is; None when it is the declared one.
    """

    model: str
    tier: str
    path: Path | None
    version: str | None = None
    variant: str | None = None
    sha256: str | None = None
    runtime: RuntimeHints | None = None
    min_mnn_runtime: str | None = None
    is_candidate: bool = False
    updated: bool = False
    error: str | None = None
    error_code: str | None = None
    not_modified: bool = False
    downloaded_bytes: int = 0
    runtime_fallback: bool = False
    exception: EdgeregError | None = field(default=None, repr=False, compare=False)
    members: Mapping[str, InstalledModel] = field(default_factory=dict)
    bundle: bool = False
    fallback: str | None = None
    substitute: str | None = None
    deferred: str | None = None
    bundled: bool = False
    cohort: CohortPosition | None = None
    runtime_rule: int | None = None

    @property
    def ok(self) -> bool:
        """True when the fetch succeeded (whether or not anything changed)."""
        return self.error is None

    @property
    def installed(self) -> bool:
        """Something verified is installed (a model, or every member of a bundle)."""
        return bool(self.members)

    @property
    def contract(self) -> IOContract | None:
        """The installed model's I/O contract (a model, not a bundle: see ``members``)."""
        single = self._single()
        return single.contract if single else None

    @property
    def labels(self) -> list[str] | None:
        """The installed model's labels (a model, not a bundle: see ``members``)."""
        single = self._single()
        return single.labels if single else None

    @property
    def backend(self) -> str | None:
        """The backend the install check chose for the model, if one ran."""
        single = self._single()
        return single.backend if single else None

    def _single(self) -> InstalledModel | None:
        return None if self.bundle else self.members.get(self.model)


class BadRelease(Rejected):
    """The release chosen for this device was refused here for good before (a failed check)."""

    reason = "bad-release"


def error_code(exc: EdgeregError) -> str:
    """The stable code of a fetch failure (docs/protocol.md §10)."""
    if isinstance(exc, Rejected):
        return exc.reason
    if isinstance(exc, Cancelled):
        return "cancelled"
    if isinstance(exc, NoSpace):
        return "no-space"
    if isinstance(exc, TrustError):
        return "untrusted"
    if isinstance(exc, ManifestNotFound):
        return "not-found"
    if isinstance(exc, TransportError):
        return "transport"
    return "cache"
