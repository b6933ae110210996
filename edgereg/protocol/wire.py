"""Wire formats: the signed documents in the registry, and their one serialization.

Three kinds, each the payload of a signed envelope (:mod:`edgereg.protocol.envelope`):

- :class:`Manifest` — ``manifests/<model>/<tier>.json``, what an app fetches;
- :class:`RolloutState` — ``models/<model>/state.json``;
- :class:`ReleaseRecord` — ``models/<model>/releases/<semver>.json``;
  :class:`BundleRecord` at the same path for a bundle (models that ship
  together under one version and one rollout).

A bundle is a rollout unit like a model: one state, one sequence, one cohort
salt. Its manifest entries are :class:`BundleEntry` values (a version and one
:class:`ManifestEntry` per member) where a model's are :class:`ManifestEntry`.

Compatibility: the manifest is the one document apps read, so it may grow.
A newer publisher may add keys to a manifest or its entries within schema
version 1; :func:`from_bytes` drops keys :class:`Manifest` does not know
(after the signature verified) and checks the rest strictly, as TUF
clients ignore unrecognised fields. A change an old client must not ignore
raises ``schema_version``. Every other document is read strictly: a
publisher tool older than the registry refuses what it cannot rewrite
faithfully.

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

import types
import typing
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal, TypeVar, Union

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    JsonValue,
    StringConstraints,
    Tag,
    ValidationError,
    model_validator,
)

from edgereg.protocol._json import canonical_json, strict_json_loads
from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.envelope import (
    Signer,
    envelope_payload_type,
    sign_envelope,
    verify_envelope,
)
from edgereg.protocol.fields import (
    LENIENT_RANGES,
    MAX_MEMORY_MB,
    NAME_RULE,
    SCHEMA_VERSION_MISSING,
    BlobPath,
    CpuFeature,
    MinRuntime,
    Name,
    Percent,
    Requirements,
    RuntimeHints,
    Salt,
    SchemaVersion,
    SemVer,
    SequenceNumber,
    Sha256,
    Size,
    UtcTime,
    VersionPin,
    compare_semver,
    format_time,
)
from edgereg.protocol.hints import MAX_HINT_RULES, HintRule, RuntimeTrials
from edgereg.protocol.layout import blob_path
from edgereg.protocol.reasons import Malformed

__all__ = [
    "MAX_ACTOR_LENGTH",
    "MAX_DOCUMENT_BYTES",
    "PAYLOAD_TYPE_BUNDLE_RELEASE",
    "PAYLOAD_TYPE_MANIFEST",
    "PAYLOAD_TYPE_RELEASE",
    "PAYLOAD_TYPE_STATE",
    "SCHEMA_VERSION",
    "Action",
    "AnyRelease",
    "BundleEntry",
    "BundleMember",
    "BundleRecord",
    "Entry",
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
    "verify_release",
]

SCHEMA_VERSION = 1

PAYLOAD_TYPE_MANIFEST = "application/vnd.edgereg.manifest+json"
PAYLOAD_TYPE_STATE = "application/vnd.edgereg.state+json"
PAYLOAD_TYPE_RELEASE = "application/vnd.edgereg.release+json"
PAYLOAD_TYPE_BUNDLE_RELEASE = "application/vnd.edgereg.bundle-release+json"

MAX_DOCUMENT_BYTES = 16 * 1024 * 1024
"""The largest payload any signed document may have (a state with its history: ~100 KB)."""

#: The longest ``actor`` of a history event, in characters.
MAX_ACTOR_LENGTH = 200
Actor = typing.Annotated[str, StringConstraints(min_length=1, max_length=MAX_ACTOR_LENGTH)]
ReportUrl = typing.Annotated[
    str,
    # [!-~]: printable ASCII but the space. Not [^\s], whose meaning differs between regex
    # engines (ECMA-262 counts U+FEFF as a space and not U+0085, Python and Rust the
    # reverse): a URL on the wire is ASCII (RFC 3986; an IRI is percent-encoded first).
    StringConstraints(pattern=r"^(https?://[!-~]+|[A-Za-z0-9][A-Za-z0-9._/-]*)$", max_length=2048),
]


RuntimeHintRules = Annotated[list[HintRule], Field(min_length=1, max_length=MAX_HINT_RULES)]

MemoryMb = Annotated[
    float, Field(gt=0, le=MAX_MEMORY_MB, allow_inf_nan=False, description="MiB (2^20 bytes).")
]
AvoidCpu = Annotated[
    list[CpuFeature], Field(min_length=1, max_length=8, json_schema_extra={"uniqueItems": True})
]


def _is_none(value: object) -> bool:
    return value is None


def _is_false(value: object) -> bool:
    return value is False


def _added(description: str, default: Any = None) -> Any:
    """A field added after the first release: left off the wire while unset.

    Documents that use nothing new stay byte for byte what older releases
    wrote and parsed, so clients that refuse unknown keys keep reading them.
    """
    return Field(
        default=default,
        description=description,
        exclude_if=_is_false if default is False else _is_none,
    )


class WireError(Malformed):
    """Bytes that should hold a signed document's payload do not parse or validate."""


class WireModel(BaseModel):
    """Base of every wire format: unknown keys refused, values frozen."""

    # defer_build: each schema is built on first use, so a command pays only for the
    # models it touches (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    payload_type: ClassVar[str] = ""
    """The envelope payload type of a signed document of this kind."""
    kind: ClassVar[str] = "document"
    """What error messages call it."""
    ignores_unknown_keys: ClassVar[bool] = False
    """:func:`from_bytes` drops keys this document does not know (forward compatibility)."""
    reads_ranges_at_fit: ClassVar[bool] = False
    """A ``requires`` range that does not parse is a misfit at rule 12, not a schema error."""


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


MAX_METRICS = 16
"""App metrics a release may declare (and a report carry)."""
MAX_METRIC_EDGES = 31
"""Bucket edges of a distribution metric at most (so at most 32 buckets)."""


class RateMetric(WireModel):
    """An app metric counted as events and successes (``record(name, success)``)."""

    # On the wire "kind" (a WireModel's ``kind`` names the document type).
    metric: Literal["rate"] = Field(alias="kind")


class DistributionMetric(WireModel):
    """An app metric counted in fixed buckets (``observe(name, value)``)."""

    metric: Literal["distribution"] = Field(alias="kind")
    buckets: list[Annotated[float, Field(allow_inf_nan=False)]] = Field(
        min_length=1,
        max_length=MAX_METRIC_EDGES,
        description="Upper edges of the buckets, strictly increasing: K edges make K + 1 "
        "buckets, (-inf, e1], (e1, e2], ..., (eK, +inf).",
    )

    @model_validator(mode="after")
    def _increasing(self) -> DistributionMetric:
        if any(b <= a for a, b in zip(self.buckets, self.buckets[1:], strict=False)):
            raise ValueError(f"buckets must increase strictly, got {self.buckets}")
        return self


MetricDeclaration = Annotated[
    Union[RateMetric, DistributionMetric],  # noqa: UP007
    Field(discriminator="metric"),
]
"""What a client knows of one declared app metric: its kind (and a distribution's buckets)."""
Metrics = Annotated[dict[Name, MetricDeclaration], Field(min_length=1, max_length=MAX_METRICS)]


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
    min_mnn_runtime: MinRuntime = Field(
        description="Oldest MNN runtime that loads the artifact (the converter's version)."
    )
    runtime: RuntimeHints
    contract: IOContract | None = _added(
        "How to call the model: inputs, outputs, state, task, labels. Absent in entries "
        "published before it existed."
    )
    requires: Requirements | None = _added("App and OS versions the release needs; absent: any.")
    probe: BlobRef | None = _added(
        "The golden probe: inputs, expected outputs and tolerances the device checks the "
        "model against before installing it."
    )
    probe_data: BlobRef | None = _added(
        "The golden probe's tensor bytes when they are too large to inline (docs/protocol.md "
        "section 11): fetched and verified like the model; only with probe."
    )
    peak_memory_mb: MemoryMb | None = _added(
        "Measured peak memory of loading the variant and running one inference at its "
        "largest declared input, in MiB (build host): the fit rule (d) compares it with "
        "the device's memory budget."
    )
    avoid_cpu: AvoidCpu | None = _added(
        "CPU features on which this variant must not run (a kernel bug): 1 to 8 distinct "
        "feature names; a device with any of them gets `instead`, or no fit (rule (e))."
    )
    instead: ManifestEntry | None = _added(
        "What a device with an avoided CPU feature installs in its place: the same "
        "version, another variant; itself without `instead`."
    )
    metrics: Metrics | None = _added(
        "The app metrics the release declares: name -> kind (and a distribution's "
        "buckets). Only on the unit's own entry: never on a bundle member or an instead."
    )
    runtime_trials: RuntimeTrials | None = _added(
        "The settings a device may time the golden probe under after an install "
        "(docs/protocol.md section 11): 1 to 8 {threads, backend}, the bounds of one "
        "install's trial, and the set's id."
    )
    runtime_hints: RuntimeHintRules | None = _added(
        "Ordered rules giving a class of devices another runtime than `runtime`: the first "
        "rule whose every match key equals the device's decides, for its percent of them "
        "(cohort by its own salt); the others keep `runtime`."
    )

    @model_validator(mode="after")
    def _path_is_digest(self) -> ManifestEntry:
        if self.path != blob_path(self.sha256):
            raise ValueError(f"path is {self.path!r}, expected {blob_path(self.sha256)!r}")
        if self.instead is not None:
            if self.instead.instead is not None:
                raise ValueError("instead may not have an instead of its own (one level only)")
            if self.instead.metrics is not None:
                raise ValueError("instead may not declare metrics (the outer entry's apply)")
            if self.instead.version != self.version:
                raise ValueError(
                    f"instead is version {self.instead.version}, the entry {self.version}: "
                    "a substitute is another variant of the same release"
                )
        if self.avoid_cpu is not None and len(set(self.avoid_cpu)) != len(self.avoid_cpu):
            raise ValueError("avoid_cpu names a feature twice")
        if self.probe_data is not None and self.probe is None:
            raise ValueError("probe_data needs probe")
        return self

    def blob_refs(self) -> list[BlobRef]:
        """Every blob a device downloads for this entry: artifact, probe, probe data, labels."""
        refs = [BlobRef.of(self.sha256, self.size)]
        refs += [ref for ref in (self.probe, self.probe_data) if ref is not None]
        if self.contract is not None and self.contract.labels_blob is not None:
            refs.append(self.contract.labels_blob)
        return refs


class BundleEntry(WireModel):
    """One release of a bundle as an app of one tier sees it: every member, one version."""

    version: SemVer = Field(description="The bundle's version.")
    members: dict[Name, ManifestEntry] = Field(
        min_length=1,
        description="Each member model's entry for this tier; its version is the model's own.",
    )
    requires: Requirements | None = _added("App and OS versions the bundle needs; absent: any.")
    metrics: Metrics | None = _added(
        "The app metrics the bundle declares (its members' entries declare none)."
    )

    def blobs(self) -> list[ManifestEntry]:
        """The members' entries, by member name."""
        return [self.members[name] for name in sorted(self.members)]

    @model_validator(mode="after")
    def _members_declare_no_metrics(self) -> BundleEntry:
        declaring = sorted(name for name, m in self.members.items() if m.metrics is not None)
        if declaring:
            raise ValueError(
                f"member {', '.join(declaring)} declares metrics: a bundle's are its own entry's"
            )
        return self


def _entry_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "bundle" if "members" in value else "model"
    return "bundle" if isinstance(value, BundleEntry) else "model"


Entry = Annotated[
    Union[Annotated[ManifestEntry, Tag("model")], Annotated[BundleEntry, Tag("bundle")]],  # noqa: UP007
    Discriminator(_entry_kind),
]
"""A manifest's stable or candidate: a model's entry, or a bundle's (it has ``members``)."""


class Manifest(WireModel):
    """What an app of one tier fetches: stable, and during a rollout the candidate."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_MANIFEST
    kind: ClassVar[str] = "manifest"
    ignores_unknown_keys: ClassVar[bool] = True
    reads_ranges_at_fit: ClassVar[bool] = True

    schema_version: SchemaVersion = 1
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
    stable: Entry | None = None
    candidate: Entry | None = None
    percent: Percent | None = Field(
        default=None,
        description="Set iff candidate: the share of devices in the cohort, "
        "0 < percent <= 100, at most two decimals.",
    )
    salt: Salt | None = Field(default=None, description="Cohort salt, hex; set iff candidate.")
    paused: bool = False
    report_url: ReportUrl | None = _added(
        "Where devices send reports (POST): an http(s) URL, or a path relative to the "
        "registry root such as v1/reports. Absent: do not report."
    )

    @property
    def is_bundle(self) -> bool:
        """True when this is a bundle's manifest (its entries have members)."""
        return isinstance(self.stable or self.candidate, BundleEntry)

    @model_validator(mode="after")
    def _rollout_fields(self) -> Manifest:
        _check_rollout(self.candidate, self.percent, self.salt, self.paused)
        if (
            self.stable is not None
            and self.candidate is not None
            and isinstance(self.stable, BundleEntry) != isinstance(self.candidate, BundleEntry)
        ):
            raise ValueError("stable and candidate must both be bundle entries, or neither")
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


Action = Literal[
    "publish", "rollout", "promote", "rollback", "pause", "resume", "resign", "rebuild", "reset"
]


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
    automatic: bool = _added("Decided by `edgereg rollout --auto`, not a person.", False)
    evidence: dict[str, JsonValue] | None = _added(
        "What an automatic decision was based on (the canary analysis)."
    )


class RolloutState(WireModel):
    """The signed rollout state of one model; manifests are derived from it."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_STATE
    kind: ClassVar[str] = "rollout state"

    schema_version: SchemaVersion = 1
    model: Name
    sequence: SequenceNumber
    expires: UtcTime
    stable: SemVer | None = None
    candidate: SemVer | None = None
    percent: Percent | None = None
    salt: Salt | None = None
    paused: bool = False
    full: bool = Field(default=False, description="The candidate was published with --full.")
    report_url: ReportUrl | None = _added(
        "Where the manifests tell devices to report ([reports] url when the state was "
        "written); kept here so every manifest derives from the signed state alone."
    )
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
    min_mnn_runtime: MinRuntime
    runtime: RuntimeHints
    contract: IOContract | None = _added("How to call the model (see ManifestEntry).")
    probe: BlobRef | None = _added("The golden probe (see ManifestEntry).")
    probe_data: BlobRef | None = _added("The golden probe's tensor bytes (see ManifestEntry).")
    avoid_cpu: AvoidCpu | None = _added(
        "CPU features this variant must not run on, as its ARM verification ran it "
        "(see ManifestEntry); absent: none, or a record written before the field existed."
    )
    instead: Name | None = _added(
        "The variant of the same release a device with an avoided feature installs; "
        "only with avoid_cpu."
    )
    runtime_trials: RuntimeTrials | None = _added(
        "The try-set of models.toml's runtime.try (see ManifestEntry); absent: none."
    )

    @model_validator(mode="after")
    def _instead_needs_avoid_cpu(self) -> ReleaseVariant:
        if self.avoid_cpu is not None and len(set(self.avoid_cpu)) != len(self.avoid_cpu):
            raise ValueError("avoid_cpu names a feature twice")
        if self.instead is not None and self.avoid_cpu is None:
            raise ValueError(f"instead ({self.instead!r}) needs avoid_cpu")
        if self.probe_data is not None and self.probe is None:
            raise ValueError("probe_data needs probe")
        return self

    @property
    def path(self) -> str:
        """The blob's registry path."""
        return blob_path(self.sha256)

    def blob_refs(self) -> list[BlobRef]:
        """Every blob this variant ships: the artifact, its probe (and data) and its labels."""
        refs = [BlobRef.of(self.sha256, self.size)]
        refs += [ref for ref in (self.probe, self.probe_data) if ref is not None]
        if self.contract is not None and self.contract.labels_blob is not None:
            refs.append(self.contract.labels_blob)
        return refs


def _check_tiers_name_variants(
    tiers: Mapping[str, str], variants: Mapping[str, ReleaseVariant]
) -> None:
    """Every tier names a variant of the release, and each variant serves the tier it was built for.

    A variant's ``instead`` names another variant of the same release, one
    level only (as the manifest entry's ``instead`` must be). One rule for a
    model's release and for each member of a bundle's.
    """
    for tier, variant_name in tiers.items():
        if variant_name not in variants:
            raise ValueError(
                f"tiers.{tier} names variant '{variant_name}', which is not in variants "
                f"({', '.join(variants)})"
            )
    for name, variant in variants.items():
        if tiers.get(variant.tier) != name:
            raise ValueError(
                f"variant '{name}' is built for tier '{variant.tier}', but tiers."
                f"{variant.tier} is {tiers.get(variant.tier)!r}"
            )
        instead = variant.instead
        if instead is not None and (instead == name or instead not in variants):
            raise ValueError(
                f"variant '{name}' names instead '{instead}', which is not another variant "
                f"({', '.join(variants)})"
            )
        if instead is not None and variants[instead].instead is not None:
            raise ValueError(
                f"variant '{name}' names instead '{instead}', which has an instead of its own "
                "(one level only)"
            )


class ReleaseRecord(WireModel):
    """A published version of a model: immutable once written."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_RELEASE
    kind: ClassVar[str] = "release record"

    schema_version: SchemaVersion = 1
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
    requires: Requirements | None = _added("App and OS versions the release needs.")
    metrics: Metrics | None = _added(
        "The app metrics the release declares (models.toml), as its manifest entries carry them."
    )

    @property
    def name(self) -> str:
        """The rollout unit this record belongs to (the model)."""
        return self.model

    def blob_refs(self) -> list[tuple[str, BlobRef]]:
        """(where, blob) for every blob the release ships."""
        return [
            (f"variant {name}", ref)
            for name, variant in self.variants.items()
            for ref in variant.blob_refs()
        ]

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
        _check_tiers_name_variants(self.tiers, self.variants)
        return self


class BundleMember(WireModel):
    """One model inside a bundle release: its own version, variants and tiers."""

    version: SemVer = Field(description="The model's own version (models.toml).")
    variants: dict[Name, ReleaseVariant] = Field(min_length=1)
    tiers: dict[Name, Name] = Field(min_length=1)
    requires: Requirements | None = None

    @model_validator(mode="after")
    def _tiers_name_variants(self) -> BundleMember:
        _check_tiers_name_variants(self.tiers, self.variants)
        return self


class BundleRecord(WireModel):
    """A published version of a bundle: every member built, evaluated and shipped together."""

    payload_type: ClassVar[str] = PAYLOAD_TYPE_BUNDLE_RELEASE
    kind: ClassVar[str] = "bundle release record"

    schema_version: SchemaVersion = 1
    bundle: Name
    version: SemVer
    created: UtcTime
    members: dict[Name, BundleMember] = Field(min_length=1)
    tier_order: list[Name] = Field(min_length=1, description="Every tier, best first.")
    requires: Requirements | None = None
    metrics: Metrics | None = _added(
        "The app metrics the bundle declares (models.toml), as its manifest entries carry them."
    )

    @property
    def name(self) -> str:
        """The rollout unit this record belongs to (the bundle)."""
        return self.bundle

    def ordered_tiers(self) -> list[str]:
        """The tiers best first."""
        return list(self.tier_order)

    def blob_refs(self) -> list[tuple[str, BlobRef]]:
        """(where, blob) for every blob the release ships."""
        return [
            (f"member {member} variant {name}", ref)
            for member, release in self.members.items()
            for name, variant in release.variants.items()
            for ref in variant.blob_refs()
        ]

    @model_validator(mode="after")
    def _every_member_serves_every_tier(self) -> BundleRecord:
        for member, release in self.members.items():
            if sorted(release.tiers) != sorted(self.tier_order):
                missing = sorted(set(self.tier_order) - set(release.tiers))
                raise ValueError(
                    f"member {member} serves tiers {sorted(release.tiers)}, the bundle "
                    f"{self.tier_order}" + (f" (missing {', '.join(missing)})" if missing else "")
                )
        return self


AnyRelease = ReleaseRecord | BundleRecord
"""What a ``releases/<semver>.json`` holds: a model's release or a bundle's."""


# --- serialization: the one place -----------------------------------------------

W = TypeVar("W", bound=WireModel)


def to_bytes(obj: WireModel) -> bytes:
    """Return the canonical JSON bytes of a wire object (what gets signed).

    Raises:
        WireError: the object holds a value JSON cannot carry (NaN in metrics).
    """
    try:
        return canonical_json(obj.model_dump(mode="json", by_alias=True))
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
    if (
        "schema_version" in cls.model_fields
        and isinstance(value, dict)
        and "schema_version" not in value
    ):
        # Python callers may leave it out (it defaults to 1); the wire always says it.
        # Refused by validation, so the message lists every other fault too.
        value = {**value, "schema_version": SCHEMA_VERSION_MISSING}
    if cls.ignores_unknown_keys:
        value = _known_keys_only(value, cls)
    try:
        # Strict: JSON types must match exactly ("5" is not a number). Times
        # arrive as datetime objects from _parse_time, which strict mode needs.
        return cls.model_validate(
            value, strict=True, context={LENIENT_RANGES: cls.reads_ranges_at_fit}
        )
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


def verify_release(envelope_bytes: bytes, trusted: Mapping[str, Ed25519PublicKey]) -> AnyRelease:
    """Verify a release record of a model or of a bundle (told apart by the payload type).

    Raises:
        TrustError, WireError: as :func:`verify_document`.
    """
    try:
        claimed = envelope_payload_type(envelope_bytes)
    except Malformed:
        claimed = PAYLOAD_TYPE_RELEASE  # verify_document reports what is wrong
    cls: type[AnyRelease] = (
        BundleRecord if claimed == PAYLOAD_TYPE_BUNDLE_RELEASE else ReleaseRecord
    )
    return verify_document(cls, envelope_bytes, trusted)


def _known_keys_only(value: Any, annotation: Any) -> Any:
    """``value`` without the object keys ``annotation``'s models do not declare.

    Only keys are dropped; values keep their types, so a known key with a
    wrong type is still refused by the strict validation that follows.
    """
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        args = typing.get_args(annotation)
        inner = args[0]
        for meta in args[1:]:
            if isinstance(meta, Discriminator) and callable(meta.discriminator):
                tag = meta.discriminator(value)
                for member in typing.get_args(inner):
                    member_args = typing.get_args(member)
                    if any(isinstance(m, Tag) and m.tag == tag for m in member_args[1:]):
                        return _known_keys_only(value, member_args[0])
        return _known_keys_only(value, inner)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        if not isinstance(value, dict):
            return value
        # Keyed as on the wire: a field's alias where it has one.
        fields = {(f.alias or name): f for name, f in annotation.model_fields.items()}
        # A model that keeps what it does not know (a hint rule's match) keeps every key.
        keeps = annotation.model_config.get("extra") == "allow"
        return {
            key: _known_keys_only(item, fields[key].annotation) if key in fields else item
            for key, item in value.items()
            if key in fields or keeps
        }
    args = typing.get_args(annotation)
    if origin in (list, Sequence) and isinstance(value, list) and args:
        return [_known_keys_only(item, args[0]) for item in value]
    if origin in (dict, Mapping) and isinstance(value, dict) and len(args) == 2:
        return {key: _known_keys_only(item, args[1]) for key, item in value.items()}
    if origin in (Union, types.UnionType):
        models = [a for a in args if a is not type(None)]
        if len(models) == 1:
            # An optional value (a list of hint rules too, not only an object).
            return _known_keys_only(value, models[0])
        # A union told apart by a literal key (an app metric's "kind"): the member it names.
        named = [m for m in models if isinstance(value, dict) and _names(m, value)]
        if len(named) == 1:
            return _known_keys_only(value, named[0])
    return value


def _names(model: Any, value: dict[str, Any]) -> bool:
    """Whether ``value`` carries the literal a member model of a tagged union is told by."""
    if not (isinstance(model, type) and issubclass(model, BaseModel)):
        return False
    for name, info in model.model_fields.items():
        if typing.get_origin(info.annotation) is Literal:
            key = info.alias or name
            return key in value and value[key] in typing.get_args(info.annotation)
    return False


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
    _pattern(ReportUrl): "is not a report URL: an http(s):// URL of printable ASCII without "
    "spaces, or a path relative to the registry root like v1/reports",
    _pattern(CpuFeature): "is not a CPU feature name: a lowercase letter or digit, then up "
    "to 31 lowercase letters, digits, '_' or '-'",
}


def _readable_loc(loc: tuple[int | str, ...]) -> list[str]:
    """The key path of an error, without the union tags pydantic inserts after an entry."""
    parts: list[str] = []
    for item in loc:
        if item in ("model", "bundle") and parts and parts[-1] in ("stable", "candidate"):
            continue
        parts.append(str(item))
    return parts


def _describe(exc: ValidationError) -> str:
    parts = []
    for error in exc.errors():
        where = ".".join(_readable_loc(error["loc"])) or "(top level)"
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown key"
        elif error["type"] == "string_pattern_mismatch":
            pattern = str(error.get("ctx", {}).get("pattern", ""))
            rule = _PATTERN_RULES.get(pattern, f"must match {pattern}")
            message = f"{error['input']!r} {rule}"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)
