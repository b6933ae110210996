"""Wire formats: the signed documents in the registry, and their one serialization.

Three kinds, each the payload of a signed envelope (:mod:`edgereg.signing`):

- :class:`Manifest` — ``manifests/<model>/<tier>.json``, what an app fetches;
- :class:`RolloutState` — ``models/<model>/state.json``;
- :class:`ReleaseRecord` — ``models/<model>/releases/<semver>.json``.

:func:`to_bytes` is the only way these become bytes (canonical JSON) and
:func:`from_bytes` the only way back; every failure to read is a
:class:`WireError`. Parsing is strict: unknown keys, wrong JSON types
(``"5"`` for a number, ``1`` for a boolean), duplicate keys and NaN are all
refused.

Times are ``datetime`` values that must be timezone-aware UTC; on the wire
they are RFC 3339 strings with a ``Z`` and whole seconds
(``2025-01-31T12:00:00Z``). Fractions of a second are dropped on the way in,
so an expiry only ever moves earlier.
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Annotated, Any, ClassVar, Literal, TypeVar

import semver
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    StringConstraints,
    ValidationError,
    model_validator,
)

from edgereg.config import NAME_RULE, Name, RuntimeHints, SemVer, Sha256, VersionPin
from edgereg.errors import TrustError
from edgereg.rollout import check_percent
from edgereg.signing import (
    Signer,
    canonical_json,
    sign_envelope,
    strict_json_loads,
    verify_envelope,
)

__all__ = [
    "PAYLOAD_TYPE_MANIFEST",
    "PAYLOAD_TYPE_RELEASE",
    "PAYLOAD_TYPE_STATE",
    "SCHEMA_VERSION",
    "HistoryEvent",
    "Manifest",
    "ManifestEntry",
    "ReleaseRecord",
    "ReleaseVariant",
    "RolloutSnapshot",
    "RolloutState",
    "SemVer",
    "UtcTime",
    "WireError",
    "WireModel",
    "blob_path",
    "format_time",
    "from_bytes",
    "sign_document",
    "to_bytes",
    "verify_document",
]

SCHEMA_VERSION = 1

PAYLOAD_TYPE_MANIFEST = "application/vnd.edgereg.manifest+json"
PAYLOAD_TYPE_STATE = "application/vnd.edgereg.state+json"
PAYLOAD_TYPE_RELEASE = "application/vnd.edgereg.release+json"


class WireError(TrustError):
    """Bytes that should hold a signed document's payload do not parse or validate."""


# --- field types --------------------------------------------------------------


_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def _parse_time(value: Any) -> Any:
    if isinstance(value, str):
        if not _RFC3339.match(value):
            raise ValueError(f"{value!r} is not an RFC 3339 UTC time like 2025-01-31T12:00:00Z")
        # Whole seconds on the wire: drop any fraction here (Python 3.10's
        # fromisoformat accepts only 3 or 6 digits of it), and spell Z as +00:00.
        text = re.sub(r"\.\d+", "", value.upper())
        text = text[:-1] + "+00:00" if text.endswith("Z") else text
        try:
            return datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"{value!r} is not a valid date and time") from None
    if not isinstance(value, datetime):
        raise ValueError(f"{value!r} is not an RFC 3339 UTC time like 2025-01-31T12:00:00Z")
    return value


def _check_utc(value: datetime) -> datetime:
    offset = value.utcoffset()
    if offset is None:
        raise ValueError(
            "time has no timezone; expected UTC, e.g. datetime.now(timezone.utc) "
            "or 2025-01-31T12:00:00Z"
        )
    if offset:
        raise ValueError(f"time is at UTC offset {offset}; expected UTC (offset zero)")
    return value.replace(tzinfo=timezone.utc, microsecond=0)


def format_time(value: datetime) -> str:
    """RFC 3339 with ``Z`` and whole seconds: the wire spelling of a UTC time."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


UtcTime = Annotated[
    datetime,
    BeforeValidator(_parse_time),
    AfterValidator(_check_utc),
    PlainSerializer(format_time, return_type=str, when_used="json"),
]
"""A timezone-aware UTC time; RFC 3339 with ``Z`` on the wire."""

_SALT_PATTERN = r"^[0-9a-f]{8,64}$"
_BLOB_PATH_PATTERN = r"^blobs/sha256/[0-9a-f]{64}$"
Salt = Annotated[str, StringConstraints(pattern=_SALT_PATTERN)]
BlobPath = Annotated[str, StringConstraints(pattern=_BLOB_PATH_PATTERN)]
Percent = Annotated[float, AfterValidator(check_percent)]
Actor = Annotated[str, StringConstraints(min_length=1, max_length=200)]


def blob_path(sha256: str) -> str:
    """The registry path (and URL path) of a blob: ``blobs/sha256/<hex>``."""
    return f"blobs/sha256/{sha256}"


class WireModel(BaseModel):
    """Base of every wire format: unknown keys refused, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    payload_type: ClassVar[str] = ""
    """The envelope payload type of a signed document of this kind."""
    kind: ClassVar[str] = "document"
    """What error messages call it."""


def _check_rollout(
    candidate: object | None, percent: float | None, salt: str | None, paused: bool
) -> None:
    """A candidate needs a percent and a salt; without one, neither may be set."""
    if candidate is not None:
        missing = [name for name, value in (("percent", percent), ("salt", salt)) if value is None]
        if missing:
            raise ValueError(f"a candidate needs {' and '.join(missing)}")
    else:
        pairs = (("percent", percent), ("salt", salt))
        given = [name for name, value in pairs if value is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} may only be set with a candidate")
        if paused:
            raise ValueError("paused may only be true during a rollout (with a candidate)")


def _version_above(candidate: str | None, stable: str | None) -> None:
    if (
        candidate is not None
        and stable is not None
        and semver.Version.parse(candidate) <= semver.Version.parse(stable)
    ):
        raise ValueError(f"candidate {candidate} must be a higher version than stable {stable}")


# --- manifest -----------------------------------------------------------------


class ManifestEntry(WireModel):
    """One release as an app of one tier sees it."""

    version: SemVer
    variant: Name
    path: BlobPath = Field(description="URL path of the blob, relative to the registry root.")
    sha256: Sha256
    size: int = Field(ge=1, description="Blob size in bytes; a client reads no further.")
    min_mnn_runtime: VersionPin = Field(
        description="Oldest MNN runtime that loads the artifact (the converter's version)."
    )
    runtime: RuntimeHints

    @model_validator(mode="after")
    def _path_is_digest(self) -> ManifestEntry:
        if self.path != blob_path(self.sha256):
            raise ValueError(f"path is {self.path!r}, expected {blob_path(self.sha256)!r}")
        return self


class Manifest(WireModel):
    """What an app of one tier fetches: stable, and during a rollout the candidate."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_MANIFEST
    kind: ClassVar[str] = "manifest"

    schema_version: Literal[1] = 1
    model: Name
    tier: Name
    sequence: int = Field(ge=1, description="Grows with every change; a client refuses lower.")
    expires: UtcTime
    stable: ManifestEntry | None = None
    candidate: ManifestEntry | None = None
    percent: Percent | None = Field(
        default=None, description="Set iff candidate; 0 < percent <= 100, two decimals at most."
    )
    salt: Salt | None = Field(default=None, description="Cohort salt, hex; set iff candidate.")
    paused: bool = False

    @model_validator(mode="after")
    def _rollout_fields(self) -> Manifest:
        _check_rollout(self.candidate, self.percent, self.salt, self.paused)
        _version_above(
            self.candidate.version if self.candidate else None,
            self.stable.version if self.stable else None,
        )
        return self


# --- rollout state ------------------------------------------------------------


class RolloutSnapshot(WireModel):
    """The rollout-relevant part of the state, before or after an event."""

    stable: SemVer | None = None
    candidate: SemVer | None = None
    percent: Percent | None = None
    paused: bool = False


Action = Literal["publish", "rollout", "promote", "rollback", "pause", "resume", "resign"]


class HistoryEvent(WireModel):
    """One change to the rollout state: who, what, when."""

    sequence: int = Field(ge=1, description="The state sequence this event produced.")
    at: UtcTime
    actor: Actor
    action: Action
    before: RolloutSnapshot
    after: RolloutSnapshot
    forced: bool = Field(default=False, description="A rule (soak time) was overridden.")
    note: str | None = None


class RolloutState(WireModel):
    """The signed rollout state of one model; manifests are derived from it."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_STATE
    kind: ClassVar[str] = "rollout state"

    schema_version: Literal[1] = 1
    model: Name
    sequence: int = Field(ge=1)
    expires: UtcTime
    stable: SemVer | None = None
    candidate: SemVer | None = None
    percent: Percent | None = None
    salt: Salt | None = None
    paused: bool = False
    full: bool = Field(default=False, description="The candidate was published with --full.")
    history: list[HistoryEvent] = Field(default_factory=list)

    @model_validator(mode="after")
    def _consistent(self) -> RolloutState:
        _check_rollout(self.candidate, self.percent, self.salt, self.paused)
        _version_above(self.candidate, self.stable)
        previous = 0
        for event in self.history:
            if event.sequence <= previous:
                raise ValueError(
                    f"history sequence {event.sequence} follows {previous}; "
                    "expected strictly increasing"
                )
            previous = event.sequence
        if previous > self.sequence:
            raise ValueError(
                f"history reaches sequence {previous}, beyond the state's {self.sequence}"
            )
        return self

    def snapshot(self) -> RolloutSnapshot:
        """The current stable, candidate, percent and paused flag."""
        return RolloutSnapshot(
            stable=self.stable, candidate=self.candidate, percent=self.percent, paused=self.paused
        )

    def last_change_at(self) -> datetime | None:
        """When the percent last changed (publish or rollout): where soak time counts from."""
        for event in reversed(self.history):
            if event.action in ("publish", "rollout"):
                return event.at
        return None


# --- release record -----------------------------------------------------------


class ReleaseVariant(WireModel):
    """One built variant inside a release."""

    tier: Name
    sha256: Sha256
    size: int = Field(ge=1)
    metrics: dict[str, JsonValue] = Field(default_factory=dict)
    provenance: dict[str, JsonValue] = Field(default_factory=dict)
    min_mnn_runtime: VersionPin
    runtime: RuntimeHints

    @property
    def path(self) -> str:
        """The blob's registry path."""
        return blob_path(self.sha256)


class ReleaseRecord(WireModel):
    """A published version of a model: immutable once written."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_RELEASE
    kind: ClassVar[str] = "release record"

    schema_version: Literal[1] = 1
    model: Name
    version: SemVer
    created: UtcTime
    variants: dict[Name, ReleaseVariant] = Field(min_length=1)
    tiers: dict[Name, Name] = Field(
        min_length=1, description="Every tier -> the variant its devices get (with fallbacks)."
    )
    tier_order: list[Name] | None = Field(
        default=None,
        description="The tiers best first, as models.toml lists them (canonical JSON sorts "
        "the keys of `tiers`); absent in records written before it existed.",
    )

    def ordered_tiers(self) -> list[str]:
        """The tiers best first (sorted by name for records without an order)."""
        return list(self.tier_order) if self.tier_order is not None else sorted(self.tiers)

    @model_validator(mode="after")
    def _tiers_name_variants(self) -> ReleaseRecord:
        if self.tier_order is not None and sorted(self.tier_order) != sorted(self.tiers):
            raise ValueError(
                f"tier_order {self.tier_order} must list exactly the tiers "
                f"({', '.join(sorted(self.tiers))})"
            )
        for tier, variant_name in self.tiers.items():
            if variant_name not in self.variants:
                raise ValueError(
                    f"tiers.{tier} names variant '{variant_name}', which is not in variants "
                    f"({', '.join(self.variants)})"
                )
        for name, variant in self.variants.items():
            if self.tiers.get(variant.tier) != name:
                raise ValueError(
                    f"variant '{name}' is built for tier '{variant.tier}', but tiers."
                    f"{variant.tier} is {self.tiers.get(variant.tier)!r}"
                )
        return self


# --- serialization: the one place -----------------------------------------------

W = TypeVar("W", bound=WireModel)


def to_bytes(obj: WireModel) -> bytes:
    """Return the canonical JSON bytes of a wire object (what gets signed).

    Raises:
        WireError: the object holds a value JSON cannot carry (NaN in metrics).
    """
    try:
        return canonical_json(obj.model_dump(mode="json"))
    except ValueError as exc:
        raise WireError(f"cannot serialize the {obj.kind}: {exc}") from None


def from_bytes(cls: type[W], data: bytes) -> W:
    """Parse and validate bytes produced by :func:`to_bytes`.

    Raises:
        WireError: not UTF-8 JSON, duplicate keys, NaN, or the document breaks
            the schema; the message names each field and what is wrong.
    """
    kind = cls.kind
    try:
        value = strict_json_loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"{kind} is not JSON: {exc}") from None
    try:
        # Strict: JSON types must match exactly ("5" is not a number). Times
        # arrive as datetime objects from _parse_time, which strict mode needs.
        return cls.model_validate(value, strict=True)
    except ValidationError as exc:
        raise WireError(f"{kind} is not valid: {_describe(exc)}") from None


def sign_document(obj: WireModel, signers: Sequence[Signer]) -> bytes:
    """Serialize a document and sign it with every signer: the envelope bytes to store."""
    return sign_envelope(to_bytes(obj), obj.payload_type, signers)


def verify_document(
    cls: type[W],
    envelope_bytes: bytes,
    trusted: Mapping[str, Ed25519PublicKey],
    *,
    threshold: int = 1,
) -> W:
    """Verify an envelope of the kind ``cls`` and parse its payload.

    Raises:
        TrustError: the envelope does not verify (see :func:`~edgereg.signing.verify_envelope`).
        WireError: it verifies but its payload is not a valid document of this kind.
    """
    payload = verify_envelope(
        envelope_bytes, trusted, payload_type=cls.payload_type, threshold=threshold
    )
    return from_bytes(cls, payload)


def _pattern(annotated: Any) -> str:
    """The regex of a constrained string type (config's are reused, not copied)."""
    for meta in typing.get_args(annotated)[1:]:
        if isinstance(meta, StringConstraints) and isinstance(meta.pattern, str):
            return meta.pattern
    raise TypeError(f"{annotated} has no pattern")  # pragma: no cover


# Plain words for pattern mismatches, instead of pydantic quoting the regex.
_PATTERN_RULES = {
    _pattern(Name): f"is not a valid name: {NAME_RULE}",
    _pattern(Sha256): "is not a sha256: expected 64 lowercase hex characters",
    _pattern(Salt): "is not a salt: expected 8 to 64 lowercase hex characters",
    _pattern(BlobPath): "is not a blob path: expected blobs/sha256/<64 lowercase hex>",
    _pattern(VersionPin): "is not a version like 3.6.1",
}


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(str(item) for item in error["loc"]) or "(top level)"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "string_pattern_mismatch":
            pattern = str(error.get("ctx", {}).get("pattern", ""))
            rule = _PATTERN_RULES.get(pattern, f"must match {pattern}")
            message = f"{error['input']!r} {rule}"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
