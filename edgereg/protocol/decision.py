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
12. fit: a chosen candidate that does not fit the app falls back to stable
    when stable fits; an entry that does not fit is refused. An entry fits
    when the app's MNN runtime is at least its ``min_mnn_runtime``
    (``runtime-too-old``), the app version is in ``requires.app``
    (``app-incompatible``) and the OS version in ``requires.android`` or
    ``requires.ios`` (``os-incompatible``), the entry's ``peak_memory_mb``
    within the app's memory budget (``insufficient-memory``) and none of its
    ``avoid_cpu`` features on the device (``cpu-unsupported``; an entry with
    an ``instead`` that fits is installed as that ``instead``, and the
    decision's ``substitute`` says so), and what that chose needs no MNN API
    the app's runner lacks (``api-unsupported``), checked in that order; a bundle entry
    fits when its own ``requires`` and every member fit, and then the chosen
    members' peak memory summed is within the budget.

Rules 2–5 are :func:`~edgereg.protocol.envelope.verify_envelope`, the same
parser the registry uses. Blob rules 13 and 14 are :class:`BlobCheck`.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgereg.protocol.contract import BlobRef
from edgereg.protocol.envelope import verify_envelope
from edgereg.protocol.fields import (
    Requirements,
    compare_versions,
    format_time,
    is_version,
    version_key,
)
from edgereg.protocol.reasons import (
    ApiUnsupported,
    AppIncompatible,
    BadBlob,
    BlobTooLarge,
    CpuUnsupported,
    Expired,
    Incompatible,
    InsufficientMemory,
    Malformed,
    OsIncompatible,
    Rollback,
    RuntimeTooOld,
    WrongModel,
    WrongTier,
)
from edgereg.protocol.rules import choose_entry
from edgereg.protocol.wire import (
    PAYLOAD_TYPE_MANIFEST,
    BundleEntry,
    Manifest,
    ManifestEntry,
    from_bytes,
)

__all__ = [
    "MAX_MANIFEST_BYTES",
    "AppFacts",
    "BlobCheck",
    "Decision",
    "compare_versions",
    "decide",
    "fit",
    "unfit",
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
        fallback: The device is in the candidate's cohort but the candidate
            does not fit the app, so it got stable: the reason code
            (``runtime-too-old``, ``app-incompatible``, ``os-incompatible``,
            ``insufficient-memory``, ``cpu-unsupported``, ``api-unsupported``), else None.
        substitute: ``cpu-unsupported`` when ``entry`` is (or, for a bundle,
            holds a member that is) the manifest entry's ``instead``, installed
            because the device has a CPU feature the entry avoids; else None.
            ``entry`` is then what the device installs: the ``instead`` in place
            of the entry (a bundle: a copy with those members replaced).
    """

    manifest: Manifest
    entry: ManifestEntry | BundleEntry | None
    is_candidate: bool
    sequence: int
    fallback: str | None = None
    substitute: str | None = None

    @property
    def runtime_fallback(self) -> bool:
        """The candidate did not fit the app (any fit rule), so the device got stable."""
        return self.fallback is not None


@dataclass(frozen=True)
class AppFacts:
    """What the app says about itself for the fit rule (None: not said).

    Attributes:
        mnn_runtime: The MNN runtime in the app, like ``3.6.1`` (None skips that rule;
            one that does not parse fits no entry).
        app_version: The app's own version, like ``2.4.0``.
        os: ``android`` or ``ios``.
        os_version: The Android API level (``34``) or the iOS version (``17.2``).
        cpu_features: The CPU features the device has (``i8mm``, ``dotprod``...);
            None skips rule (e), an empty set has none.
        memory_budget_mb: How much memory one model (or one bundle, its members
            together) may take on this device, MiB; None skips rule (d).
        mnn_apis: The MNN APIs the app's model runner calls (``session``,
            ``module``); None skips rule (f).
    """

    mnn_runtime: str | None = None
    app_version: str | None = None
    os: str | None = None
    os_version: str | None = None
    cpu_features: frozenset[str] | None = None
    memory_budget_mb: float | None = None
    mnn_apis: frozenset[str] | None = None

    def check(self) -> None:
        """Raise ValueError for a version that does not parse.

        :func:`decide` does not call it: there a version that does not parse
        never meets a requirement (docs/protocol.md §7, rule 12). An SDK calls
        it to tell its caller early.
        """
        for name in ("mnn_runtime", "app_version", "os_version"):
            value = getattr(self, name)
            if value is not None:
                try:
                    version_key(value)
                except ValueError as exc:
                    raise ValueError(f"{name}: {exc}") from exc


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
    app: AppFacts | None = None,
    bundle: bool = False,
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
        app: The app's version and OS for ``requires``, its memory budget and
            CPU features (its ``mnn_runtime`` is ignored: ``app_mnn_runtime``
            says it).
        bundle: The client asked for a bundle: the entries must be bundle
            entries (and model entries when False).

    Raises:
        Malformed, UnknownKey, BadSignature, WrongModel, WrongTier, Rollback,
        Expired, RuntimeTooOld, AppIncompatible, OsIncompatible,
        InsufficientMemory, CpuUnsupported: the rule broken (all
        :class:`Rejected`, a :class:`~edgereg.errors.TrustError`).
        ValueError: ``now`` has no timezone.
    """
    if now.tzinfo is None:
        raise ValueError("decide needs a timezone-aware time")
    facts = dataclasses.replace(app or AppFacts(), mnn_runtime=app_mnn_runtime)

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
    has_entries = manifest.stable is not None or manifest.candidate is not None
    if has_entries and manifest.is_bundle != bundle:
        asked, got = ("bundle", "model") if bundle else ("model", "bundle")
        raise Malformed(
            f"the manifest of '{manifest.model}' is a {got}'s, the client asked for a {asked}",
            hint="Open the client with bundle=... for a bundle and model=... for a model.",
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
    fitted = fit(entry, facts)
    if isinstance(fitted, Fit):
        return Decision(
            manifest, fitted.entry, is_candidate, sequence, substitute=fitted.substitute
        )
    misfit = fitted
    stable = manifest.stable
    stable_fit = fit(stable, facts) if is_candidate and stable is not None else None
    if isinstance(stable_fit, Fit):
        return Decision(
            manifest,
            stable_fit.entry,
            False,
            sequence,
            fallback=misfit.reason,
            substitute=stable_fit.substitute,
        )
    role = "candidate" if is_candidate else "stable"
    message = f"{role} {entry.version} {misfit.message}"
    if stable_fit is not None and stable is not None:
        message += f"; stable {stable.version} {stable_fit.message}"
    raise misfit(message, hint=misfit.hint)


@dataclass(frozen=True)
class Fit:
    """An entry that fits the app, and what the device installs for it.

    Attributes:
        entry: The manifest entry itself, or its ``instead`` (a bundle: a copy
            whose substituted members are their ``instead``).
        substitute: ``cpu-unsupported`` when an ``instead`` was taken, else None.
    """

    entry: ManifestEntry | BundleEntry
    substitute: str | None = None


def unfit(entry: ManifestEntry | BundleEntry, facts: AppFacts) -> _Misfit | None:
    """Why ``entry`` does not fit the app (the first rule broken), or None when it fits.

    An entry that fits only as its ``instead`` fits (see :func:`fit` for what to install).
    """
    found = fit(entry, facts)
    return None if isinstance(found, Fit) else found


def fit(entry: ManifestEntry | BundleEntry, facts: AppFacts) -> Fit | _Misfit:
    """What the device installs for ``entry`` (rule 12, a to f), or why it does not fit."""
    if isinstance(entry, BundleEntry):
        return _fit_bundle(entry, facts)
    found = _unfit_model(entry, facts, memory=True)
    if found is not None:
        return found
    chosen = _fit_cpu(entry, facts, memory=True)
    if isinstance(chosen, Fit):
        assert isinstance(chosen.entry, ManifestEntry)
        return _unfit_api(chosen.entry, facts) or chosen
    return chosen


def _fit_bundle(entry: BundleEntry, facts: AppFacts) -> Fit | _Misfit:
    found = _unmet_requirements(entry.requires, facts)
    if found is not None:
        return found
    chosen: dict[str, ManifestEntry] = {}
    for name in sorted(entry.members):
        member = entry.members[name]
        # Members load together, so (d) is the bundle's sum, checked after every member.
        misfit = _unfit_model(member, facts, memory=False)
        fitted = _fit_cpu(member, facts, memory=False) if misfit is None else misfit
        if isinstance(fitted, Fit):
            assert isinstance(fitted.entry, ManifestEntry)
            fitted = _unfit_api(fitted.entry, facts) or fitted
        if not isinstance(fitted, Fit):
            return _Misfit(fitted.kind, f"(member {name}) {fitted.message}", fitted.hint)
        assert isinstance(fitted.entry, ManifestEntry)
        chosen[name] = fitted.entry
    budget = facts.memory_budget_mb
    if budget is not None:
        total = sum(m.peak_memory_mb or 0.0 for m in chosen.values())
        if total > budget:
            parts = ", ".join(
                f"{name} {_mb(m.peak_memory_mb)}"
                for name, m in chosen.items()
                if m.peak_memory_mb is not None
            )
            return _Misfit(
                InsufficientMemory,
                f"needs {_mb(total)} MiB for its members together ({parts}), the device's "
                f"budget is {_mb(budget)} MiB",
                _MEMORY_HINT,
            )
    substituted = any(chosen[name] is not entry.members[name] for name in chosen)
    if not substituted:
        return Fit(entry)
    return Fit(entry.model_copy(update={"members": chosen}), CpuUnsupported.reason)


_MEMORY_HINT = (
    "The device cannot hold this release; publish a smaller variant for this tier, or "
    "raise the app's memory budget if it is too low."
)


def _mb(value: float | None) -> str:
    return f"{value:g}"


def _unfit_model(entry: ManifestEntry, facts: AppFacts, *, memory: bool) -> _Misfit | None:
    """Rules (a) to (c), and (d) when ``memory`` (a bundle checks its sum instead)."""
    if facts.mnn_runtime is not None and (
        not is_version(facts.mnn_runtime)
        or compare_versions(entry.min_mnn_runtime, facts.mnn_runtime) > 0
    ):
        # An MNN version that does not parse cannot be shown to be new enough.
        said = facts.mnn_runtime
        if not is_version(said):
            said = f"{said!r}, which is not a version"
        return _Misfit(
            RuntimeTooOld,
            f"({entry.variant}) needs MNN {entry.min_mnn_runtime}, the app has {said}",
            "Update the app's MNN runtime, or publish a variant converted for it.",
        )
    found = _unmet_requirements(entry.requires, facts)
    if found is not None or not memory:
        return found
    budget = facts.memory_budget_mb
    if budget is not None and entry.peak_memory_mb is not None and entry.peak_memory_mb > budget:
        return _Misfit(
            InsufficientMemory,
            f"({entry.variant}) needs {_mb(entry.peak_memory_mb)} MiB at its peak, the "
            f"device's budget is {_mb(budget)} MiB",
            _MEMORY_HINT,
        )
    return None


def _avoided(entry: ManifestEntry, facts: AppFacts) -> list[str]:
    if entry.avoid_cpu is None or facts.cpu_features is None:
        return []
    return sorted(set(entry.avoid_cpu) & facts.cpu_features)


def _fit_cpu(entry: ManifestEntry, facts: AppFacts, *, memory: bool) -> Fit | _Misfit:
    """Rule (e) on an entry that passed (a) to (d): the entry, its ``instead``, or a misfit."""
    avoided = _avoided(entry, facts)
    if not avoided:
        return Fit(entry)
    message = f"({entry.variant}) must not run on a CPU with {', '.join(avoided)}"
    hint = (
        "A known fault of the runtime on this CPU; the release names no variant for it. "
        "Publish one (instead), or the device keeps what it has."
    )
    instead = entry.instead
    if instead is None:
        return _Misfit(CpuUnsupported, message, hint)
    # The substitute fits by every rule on its own (memory alone only outside a bundle).
    misfit = _unfit_model(instead, facts, memory=memory)
    if misfit is None and _avoided(instead, facts):
        misfit = _Misfit(
            CpuUnsupported,
            f"({instead.variant}) must not run on a CPU with {', '.join(_avoided(instead, facts))}",
            hint,
        )
    if misfit is not None:
        return _Misfit(CpuUnsupported, f"{message}, and its instead {misfit.message}", misfit.hint)
    return Fit(instead, CpuUnsupported.reason)


def _unfit_api(entry: ManifestEntry, facts: AppFacts) -> _Misfit | None:
    """Rule (f) on what (e) chose: an entry needing the Module API, a runner without it."""
    needs = entry.contract.mnn_api if entry.contract is not None else None
    if needs != "module" or facts.mnn_apis is None or "module" in facts.mnn_apis:
        return None
    calls = ", ".join(sorted(facts.mnn_apis)) or "no MNN API"
    return _Misfit(
        ApiUnsupported,
        f"({entry.variant}) needs MNN's Module API (its graph has control-flow subgraphs); "
        f"the app's model runner calls {calls}",
        "Run models through MNN's Module API (Express::Module::load; see the guides), or "
        "publish a variant without control-flow subgraphs for this app.",
    )


@dataclass(frozen=True)
class _Misfit:
    kind: type[Incompatible]
    message: str
    hint: str

    @property
    def reason(self) -> str:
        return self.kind.reason

    def __call__(self, message: str, *, hint: str) -> Incompatible:
        return self.kind(message, hint=hint)


def _unmet_requirements(requires: Requirements | None, facts: AppFacts) -> _Misfit | None:
    if requires is None:
        return None
    # model_construct: a range that does not parse is read (and missed) here, not refused.
    app_unmet = Requirements.model_construct(app=requires.app).unmet(
        app_version=facts.app_version, os=facts.os, os_version=facts.os_version
    )
    if app_unmet:
        return _Misfit(
            AppIncompatible,
            app_unmet[0],
            "Update the app; devices keep the model they have until then.",
        )
    os_unmet = requires.model_copy(update={"app": None}).unmet(
        app_version=facts.app_version, os=facts.os, os_version=facts.os_version
    )
    if os_unmet:
        return _Misfit(
            OsIncompatible, os_unmet[0], "The release needs a newer OS than this device runs."
        )
    return None


def _verify(data: bytes, trusted: Mapping[str, Ed25519PublicKey], max_bytes: int) -> Manifest:
    if len(data) > max_bytes:
        raise Malformed(f"manifest is {len(data)} bytes, more than the limit of {max_bytes}")
    payload = verify_envelope(data, trusted, payload_type=PAYLOAD_TYPE_MANIFEST)
    return from_bytes(Manifest, payload)


# --- runtime versions ---------------------------------------------------------


# --- blobs --------------------------------------------------------------------


class BlobCheck:
    """Check a blob chunk by chunk against its manifest entry (pure, incremental).

    Feed every byte in order with :meth:`update` (a resumed download feeds the
    bytes already on disk first), then call :meth:`finish`.
    """

    def __init__(self, entry: ManifestEntry | BlobRef) -> None:
        # Any blob by digest and size: an artifact, a golden probe, a labels blob.
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
        """Refuse up front a body announced (Content-Length) longer or shorter than what remains.

        A complete answer of another length is another file: asking again
        brings the same bytes, so it is a rule broken, not a blip. (A body
        that then ends before ``length`` is a cut connection: the caller's
        transport failure, resumed later.)

        Raises:
            BlobTooLarge: ``length`` is more than :attr:`remaining`.
            BadBlob: ``length`` is less than :attr:`remaining`.
        """
        if length is not None and length > self.remaining:
            raise BlobTooLarge(
                f"the server announces {self.received + length} bytes for blob "
                f"{_short(self.entry.sha256)}, the manifest declares {self.entry.size}",
                hint="The server holds a different file under this digest.",
            )
        if length is not None and length < self.remaining:
            raise BadBlob(
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
