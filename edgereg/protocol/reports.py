"""What a device reports about a release it installed (``POST`` to the manifest's ``report_url``).

One small JSON document per installed candidate or stable, sent again when
something changes (confirmed, reverted). Nothing personal and no device id:
``token`` is random per install and per rollout (a new candidate, a new
token), so reports can be deduplicated (the latest per token counts) but not
joined across rollouts or with anything else. Apps can turn reporting off.

The receiver (``edgereg serve``, or a team's own collector) parses with
:func:`parse_report`, the one parser: strict types, unknown keys refused,
at most :data:`MAX_REPORT_BYTES`.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal, Union, get_args

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    model_validator,
)

from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.fields import MAX_MEMORY_MB, Backend, Name, RuntimeVersion, SemVer
from edgereg.protocol.reasons import Malformed
from edgereg.protocol.wire import MAX_METRIC_EDGES, MAX_METRICS, WireModel, _added, _describe

__all__ = [
    "CPU_CLASSES",
    "MAX_COUNT",
    "MAX_REPORT_BYTES",
    "REPORT_V2_KEYS",
    "REPORT_V3_KEYS",
    "DistributionCounts",
    "LatencySummary",
    "MetricCounts",
    "RateCounts",
    "Report",
    "ReportError",
    "parse_report",
]

MAX_REPORT_BYTES = 16384
"""The largest report a receiver accepts (a real one is about 550 bytes; 750 to 950 with five
app metrics).

About twice the largest report a client can build (docs/protocol.md §12, "Size"): 16 app
metrics of 32 counts of 10^9 under 63-character names are 6,908 bytes with their key,
every other key at its bound 1,310 (versions of 64 characters), 8,218 in all; 8192 would
refuse it. The rest is room for long versions (they have no bound of their own).
"""

Milliseconds = Annotated[float, Field(ge=0, le=3_600_000, allow_inf_nan=False)]
Token = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
ShortText = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._ -]{1,32}$")]
_VERSION_BODY = get_args(RuntimeVersion)[1].pattern.removeprefix("^").removesuffix("$")
#: The OS's version: the short text earlier clients sent, or any version of §7's grammar
#: (at most 64 characters): one grammar for the device's versions (issue 30 item 21).
OsVersion = Annotated[
    str,
    StringConstraints(max_length=64, pattern=rf"^(?:[A-Za-z0-9._ -]{{1,32}}|{_VERSION_BODY})$"),
]


def _exactly_1_to_3(value: Any) -> Any:
    # Literal[1, 2, 3] alone admits 1.0 and true (both == 1 in Python): the wire says an int.
    if type(value) is not int:
        raise ValueError(f"schema_version must be the integer 1, 2 or 3, got {value!r}")
    return value


ReportSchemaVersion = Annotated[Literal[1, 2, 3], BeforeValidator(_exactly_1_to_3)]
"""1; 2 for a report that sets a key of :data:`REPORT_V2_KEYS`; 3 for one with ``metrics``
(absent on the wire: 1)."""

Starts = Annotated[int, Field(ge=0, le=1000, strict=True)]
MemoryFigure = Annotated[float, Field(ge=0, le=MAX_MEMORY_MB, allow_inf_nan=False)]
CpuClass = Annotated[str, StringConstraints(pattern=r"^[a-z0-9][a-z0-9._-]{0,31}$")]

CPU_CLASSES = ("armv8", "armv8.2", "armv9", "x86_64", "other")
"""The classes clients send as ``cpu_class`` (docs/protocol.md §11); the server stores any
name of the pattern, so a class added later is kept."""

MAX_COUNT = 10**9
"""The largest count a report's app metric carries."""

Count = Annotated[int, Field(ge=0, le=MAX_COUNT, strict=True)]


class RateCounts(WireModel):
    """A ``rate`` metric's totals since the install: events, and those that succeeded."""

    events: Count
    successes: Count

    @model_validator(mode="after")
    def _successes_are_events(self) -> RateCounts:
        if self.successes > self.events:
            raise ValueError(f"successes {self.successes} above events {self.events}")
        return self


class DistributionCounts(WireModel):
    """A ``distribution`` metric's totals since the install: values per bucket."""

    counts: list[Count] = Field(
        min_length=2,
        max_length=MAX_METRIC_EDGES + 1,
        description="Values per bucket, in the declared order: K edges make K + 1 counts.",
    )


def _counts_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "distribution" if "counts" in value else "rate"
    return "distribution" if isinstance(value, DistributionCounts) else "rate"


MetricCounts = Annotated[
    Union[Annotated[RateCounts, Tag("rate")], Annotated[DistributionCounts, Tag("distribution")]],  # noqa: UP007
    Discriminator(_counts_kind),
]
"""One app metric's totals in a report: a rate's events and successes, or a distribution's
counts per bucket."""

REPORT_V2_KEYS = (
    "unconfirmed_starts",
    "cpu_class",
    "memory_peak_mb",
    "memory_steady_mb",
    "first_inference_ms",
)
"""The keys schema version 2 adds; a version 1 report that carries one (even ``null``) is
refused: version 1 did not know it."""
REPORT_V3_KEYS = ("metrics",)
"""The key schema version 3 adds (app metrics); refused in a report of version 1 or 2."""


class ReportError(Malformed):
    """A report that does not parse or breaks the schema.

    Attributes:
        code: ``too-large``, ``not-json`` or ``invalid`` (docs/protocol.md §12).
        field: For ``invalid``: the dotted path of the first key at fault
            (``token``, ``inference.count``), or None for the document itself.
    """

    def __init__(self, message: str, *, code: str = "invalid", field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.field = field


class LatencySummary(WireModel):
    """Inference latency the app measured over its real calls since the last report."""

    count: int = Field(ge=1, le=10**9, strict=True)
    p50_ms: Milliseconds
    p90_ms: Milliseconds
    p99_ms: Milliseconds


class Report(WireModel):
    """How one release runs on one device."""

    kind: ClassVar[str] = "report"

    schema_version: ReportSchemaVersion = Field(
        default=1, description="2 when any key added in version 2 is set, else 1."
    )
    token: Token = Field(description="Random per install and rollout: 32 lowercase hex.")
    unit: Name = Field(description="The model or bundle the manifest was for.")
    model: Name = Field(description="The model (a bundle member, or the unit itself).")
    version: SemVer = Field(description="The model's version.")
    unit_version: SemVer = Field(description="The unit's version (a bundle's; else = version).")
    variant: Name
    tier: Name
    arm: Literal["candidate", "stable"]
    sequence: int = Field(ge=1, le=2**53 - 1, strict=True, description="The manifest's sequence.")
    probe: Literal["passed", "failed", "none"] = Field(
        description="The self-test: passed on some backend, failed on all (rejected), or no probe."
    )
    backend: Backend | None = Field(
        default=None, description="The backend the model runs on (None when rejected)."
    )
    backends_skipped: list[Backend] = Field(
        default_factory=list, max_length=8, description="Backends whose outputs missed the probe."
    )
    load_ms: Milliseconds | None = None
    load_failed: bool = False
    inference: LatencySummary | None = None
    confirmed: bool = False
    reverted: bool = False
    mnn_runtime: RuntimeVersion | None = None
    os: Literal["android", "ios"] | None = None
    os_version: OsVersion | None = None
    device_class: ShortText | None = Field(
        default=None, description="Coarse: the app's own bucket, such as 'ram4-8c'."
    )
    # Version 2: left off the wire while unset, so a version 1 report stays byte for byte.
    unconfirmed_starts: Starts | None = _added(
        "Version 2. Starts of the app that ran this version and ended without confirming "
        "it (0 to 1000; docs/protocol.md section 11)."
    )
    cpu_class: CpuClass | None = _added(
        "Version 2. The coarse CPU class: armv8, armv8.2, armv9, x86_64 or other "
        "(never the feature list)."
    )
    memory_peak_mb: MemoryFigure | None = _added(
        "Version 2. The app's measured peak memory for the model, MiB."
    )
    memory_steady_mb: MemoryFigure | None = _added(
        "Version 2. The app's measured steady memory for the model, MiB."
    )
    first_inference_ms: Milliseconds | None = _added(
        "Version 2. The first real inference after load, in milliseconds."
    )
    metrics: (
        Annotated[dict[Name, MetricCounts], Field(min_length=1, max_length=MAX_METRICS)] | None
    ) = _added(
        "Version 3. The install's app metrics so far: name -> a rate's events and "
        "successes, or a distribution's counts per bucket (docs/protocol.md §3, §11)."
    )

    @model_validator(mode="after")
    def _version_says_the_keys(self) -> Report:
        newer = {1: (*REPORT_V2_KEYS, *REPORT_V3_KEYS), 2: REPORT_V3_KEYS, 3: ()}
        used = [key for key in newer[self.schema_version] if getattr(self, key) is not None]
        if used:
            raise ValueError(
                f"{', '.join(used)}: schema_version {self.schema_version} does not have it"
            )
        return self

    @classmethod
    def versioned(cls, **fields: Any) -> Report:
        """A report whose ``schema_version`` is the lowest that holds ``fields``."""
        if any(fields.get(key) is not None for key in REPORT_V3_KEYS):
            version = 3
        elif any(fields.get(key) is not None for key in REPORT_V2_KEYS):
            version = 2
        else:
            version = 1
        return cls(**{**fields, "schema_version": version})


def parse_report(data: bytes) -> Report:
    """Parse a report as received.

    Raises:
        ReportError: too large, not JSON, or not a valid report; the message says where.
    """
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(
            f"report is {len(data)} bytes, more than the limit of {MAX_REPORT_BYTES}",
            code="too-large",
        )
    try:
        value = strict_json_loads(data)
    except (UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"report is not JSON: {exc}", code="not-json") from exc
    if isinstance(value, dict) and type(value.get("schema_version", 1)) is int:  # not 1.0
        # A key a version did not have is an unknown key there, null or not.
        version = value.get("schema_version", 1)
        later = {1: (*REPORT_V2_KEYS, *REPORT_V3_KEYS), 2: REPORT_V3_KEYS}.get(version, ())
        for key in later:
            if key in value:
                needed = 3 if key in REPORT_V3_KEYS else 2
                raise ReportError(
                    f"report is not valid: {key}: unknown key in a schema_version {version} "
                    f"report (send schema_version {needed})",
                    field=key,
                )
    try:
        return Report.model_validate(value, strict=True)
    except ValidationError as exc:
        first = list(exc.errors()[0]["loc"])
        if first[:1] == ["metrics"] and len(first) > 2 and first[2] in ("rate", "distribution"):
            del first[2]  # the union's tag, not a key of the report
        field = ".".join(str(part) for part in first) or None
        raise ReportError(f"report is not valid: {_describe(exc)}", field=field) from exc
