"""Wire formats: the signed documents in the registry, and their one serialization.

Three kinds, each the payload of a signed envelope (:mod:`edgereg.protocol.envelope`):

- :class:`Manifest` — ``manifests/<model>/<tier>.json``, what an app fetches;
- :class:`RolloutState` — ``models/<model>/state.json``;
- :class:`ReleaseRecord` — ``models/<model>/releases/<semver>.json``.

:func:`to_bytes` is the only way these become bytes (canonical JSON) and
:func:`from_bytes` the only way back; every failure to read is a
:class:`WireError`. Parsing is strict: unknown keys, wrong JSON types
(``"5"`` for a number, ``9.0`` for an integer, ``1`` for a boolean), integers
beyond 2^53 - 1, duplicate keys, NaN and nesting deeper than
:data:`~edgereg.protocol._json.MAX_JSON_DEPTH` are all refused.

Times are ``datetime`` values that must be timezone-aware UTC; on the wire
they are exactly ``YYYY-MM-DDTHH:MM:SSZ`` (:data:`~edgereg.protocol.fields.TIME_PATTERN`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Literal, TypeVar

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    ValidationError,
    model_validator,
)

from edgereg.protocol._json import canonical_json, strict_json_loads
from edgereg.protocol.envelope import Signer, sign_envelope, verify_envelope
from edgereg.protocol.fields import (
    NAME_RULE,
    BlobPath,
    Name,
    Percent,
    RuntimeHints,
    Salt,
    SemVer,
    SequenceNumber,
    Sha256,
    Size,
    UtcTime,
    VersionPin,
    compare_semver,
    format_time,
)
from edgereg.protocol.layout import blob_path
from edgereg.protocol.reasons import Malformed

__all__ = [
    "MAX_DOCUMENT_BYTES",
    "PAYLOAD_TYPE_MANIFEST",
    "PAYLOAD_TYPE_RELEASE",
    "PAYLOAD_TYPE_STATE",
    "SCHEMA_VERSION",
    "Action",
    "HistoryEvent",
    "Manifest",
    "ManifestEntry",
    "ReleaseRecord",
    "ReleaseVariant",
    "RolloutSnapshot",
    "RolloutState",
    "UtcTime",
    "W",
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

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""The largest payload any signed document may have (a state with its history: ~100 KB)."""

Actor = typing.Annotated[str, StringConstraints(min_length=1, max_length=200)]


class WireError(Malformed):
    """Bytes that should hold a signed document's payload do not parse or validate."""


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
    if candidate is not None and stable is not None and compare_semver(candidate, stable) <= 0:
        raise ValueError(f"candidate {candidate} must be a higher version than stable {stable}")


# --- manifest -----------------------------------------------------------------


class ManifestEntry(WireModel):
    """One release as an app of one tier sees it."""

    version: SemVer
    variant: Name
    path: BlobPath = Field(
        description="URL path of the blob, relative to the registry root: always "
        "blobs/sha256/ followed by sha256."
    )
    sha256: Sha256
    size: Size = Field(description="Blob size in bytes, 1 to 2^53 - 1; a client reads no further.")
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
    sequence: SequenceNumber = Field(
        description="Grows with every change of the model's rollout state; all tiers share "
        "it; a client refuses a lower one. 1 to 2^53 - 1."
    )
    expires: UtcTime = Field(
        description="RFC 3339 UTC time with Z and whole seconds; a client refuses the "
        "manifest when now >= expires."
    )
    stable: ManifestEntry | None = None
    candidate: ManifestEntry | None = None
    percent: Percent | None = Field(
        default=None,
        description="Set iff candidate: the share of devices in the cohort, "
        "0 < percent <= 100, at most two decimals.",
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

    sequence: SequenceNumber = Field(description="The state sequence this event produced.")
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
    sequence: SequenceNumber
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
    size: Size
    metrics: dict[str, JsonValue] = Field(
        default_factory=dict, description="The build's metrics, opaque to the protocol."
    )
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
        raise WireError(f"cannot serialize the {obj.kind}: {exc}") from exc


def from_bytes(cls: type[W], data: bytes) -> W:
    """Parse and validate bytes produced by :func:`to_bytes`.

    Raises:
        WireError: not UTF-8 JSON, duplicate keys, NaN, or the document breaks
            the schema; the message names each field and what is wrong.
    """
    kind = cls.kind
    if len(data) > MAX_DOCUMENT_BYTES:
        raise WireError(f"{kind} is {len(data)} bytes, more than the limit of {MAX_DOCUMENT_BYTES}")
    try:
        value = strict_json_loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise WireError(f"{kind} is not JSON: {exc}") from exc
    try:
        # Strict: JSON types must match exactly ("5" is not a number). Times
        # arrive as datetime objects from _parse_time, which strict mode needs.
        return cls.model_validate(value, strict=True)
    except ValidationError as exc:
        raise WireError(f"{kind} is not valid: {_describe(exc)}") from exc


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
        TrustError: the envelope does not verify (see :func:`~edgereg.protocol.envelope.
            verify_envelope`).
        WireError: it verifies but its payload is not a valid document of this kind
            (also a :class:`~edgereg.protocol.reasons.Malformed`).
    """
    if len(envelope_bytes) > MAX_DOCUMENT_BYTES * 2:
        raise Malformed(
            f"{cls.kind} envelope is {len(envelope_bytes)} bytes, more than the limit of "
            f"{MAX_DOCUMENT_BYTES * 2}"
        )
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
