"""The field types of every wire format and of models.toml, each defined once.

Each type's error message states its rule. Integers are strict everywhere
(``9.0`` and ``"9"`` are not integers), and integers on the wire stay within
2^53 - 1 so that JavaScript ports read them exactly.
"""

from __future__ import annotations

import math
import re
import typing
from datetime import datetime, timezone
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    Strict,
    StringConstraints,
    ValidationInfo,
    field_validator,
)

from edgereg.protocol.errors import EdgeregError, ExitCode
from edgereg.protocol.layout import BLOBS_PREFIX
from edgereg.protocol.patterns import NAME_PATTERN, NAME_RULE, SHA256, SHA256_PATTERN

__all__ = [
    "BACKENDS_SCHEMA",
    "BUCKETS",
    "CPU_FEATURE_PATTERN",
    "MAX_MEMORY_MB",
    "MAX_PROBE_DATA_BYTES",
    "MAX_SAFE_INTEGER",
    "NAME_RULE",
    "PERCENT_RULE",
    "RANGE_MAX_LENGTH",
    "SCHEMA_VERSION_MISSING",
    "SEMVER_PATTERN",
    "TIME_PATTERN",
    "VERSION_MAX_LENGTH",
    "VERSION_PATTERN",
    "Backend",
    "BlobPath",
    "CpuFeature",
    "MinRuntime",
    "Name",
    "Percent",
    "PercentError",
    "Requirements",
    "RuntimeHints",
    "RuntimeVersion",
    "Salt",
    "SchemaVersion",
    "SemVer",
    "SequenceNumber",
    "Sha256",
    "Size",
    "StrictInt",
    "TierRules",
    "UtcTime",
    "VersionPin",
    "VersionRange",
    "basis_points",
    "check_backends",
    "check_percent",
    "compare_semver",
    "compare_versions",
    "format_time",
    "is_version",
    "parse_range",
    "satisfies",
    "version_key",
]

MAX_SAFE_INTEGER = 2**53 - 1
"""The largest integer every JSON reader (JavaScript's Number included) holds exactly."""

StrictInt = Annotated[int, Strict()]
"""A JSON integer: not a float (``9.0``), a string (``"9"``) or a boolean."""


SCHEMA_VERSION_MISSING = object()
"""What :func:`~edgereg.protocol.wire.from_bytes` puts where a document has no schema_version."""


def _exactly_the_integer(value: Any) -> Any:
    if value is SCHEMA_VERSION_MISSING:
        raise ValueError("missing: the wire always says schema_version 1")
    # Literal[1] alone admits 1.0 and true (both == 1 in Python): the wire says 1.
    if type(value) is not int:
        raise ValueError(f"schema_version must be the integer 1, got {value!r}")
    return value


SchemaVersion = Annotated[Literal[1], BeforeValidator(_exactly_the_integer)]
"""A document's format version: the JSON integer 1 (``1.0``, ``true``, ``"1"`` are not)."""

SequenceNumber = Annotated[int, Strict(), Field(ge=1, le=MAX_SAFE_INTEGER)]
"""A document sequence number, 1 to 2^53 - 1."""

Size = Annotated[int, Strict(), Field(ge=1, le=MAX_SAFE_INTEGER)]
"""A blob size in bytes, 1 to 2^53 - 1."""

Name = Annotated[str, StringConstraints(pattern=NAME_PATTERN)]
"""A model, tier or variant name."""

CPU_FEATURE_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,31}$"
CpuFeature = Annotated[str, StringConstraints(pattern=CPU_FEATURE_PATTERN)]
"""A CPU feature name such as ``i8mm``: a pattern, not a list, so a feature named
later never makes an older client refuse the manifest (docs/protocol.md §3)."""

MAX_PROBE_DATA_BYTES = 128 * 1024 * 1024
"""The largest probe data blob a client holds: a ``probe_data`` declared larger is refused
before download (the tensors of one sample of a 1x3x2048x2048 float model and its outputs).
Here rather than in :mod:`~edgereg.protocol.probe`, so that a pull without --self-test
never loads the probe parser."""

MAX_MEMORY_MB = 1_048_576
"""The largest memory figure any document carries, in MiB (1 TiB)."""

VersionPin = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9A-Za-z]+)*$")]
"""A tool or runtime version like 3.6.1."""

MinRuntime = Annotated[str, StringConstraints(pattern=r"^[0-9]+(\.[0-9A-Za-z]+)*$", max_length=64)]
"""An entry's ``min_mnn_runtime``: a :data:`VersionPin` of at most 64 characters (the
longest version a client compares, ``VERSION_MAX_LENGTH``); longer is a malformed manifest."""

Sha256 = Annotated[str, StringConstraints(pattern=SHA256_PATTERN)]
"""A sha256 digest: 64 lowercase hex characters."""

Salt = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{8,64}$")]
"""A cohort salt: 8 to 64 lowercase hex characters."""

BlobPath = Annotated[str, StringConstraints(pattern=rf"^{re.escape(BLOBS_PREFIX)}{SHA256}$")]
"""The registry path of a blob: ``blobs/sha256/`` and its sha256."""

Backend = Literal["cpu", "opencl", "vulkan", "metal", "opengl", "coreml", "nnapi"]


# --- semantic versions --------------------------------------------------------

SEMVER_PATTERN = (
    r"^(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)\.(0|[1-9][0-9]*)"
    r"(?:-((?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*)"
    r"(?:\.(?:0|[1-9][0-9]*|[0-9]*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)
r"""Semantic Versioning 2.0.0 (https://semver.org), the regex it publishes with ``[0-9]``
for ``\d``: in Python (and Rust, ICU) ``\d`` is any Unicode digit, in ECMA-262 ASCII only
(docs/protocol.md §3, "Patterns")."""
_SEMVER = re.compile(SEMVER_PATTERN)


def _check_semver(value: str) -> str:
    if not _SEMVER.fullmatch(value):
        raise ValueError(f"'{value}' is not a semantic version (MAJOR.MINOR.PATCH, e.g. 1.2.0)")
    return value


SemVer = Annotated[
    str, Field(json_schema_extra={"pattern": SEMVER_PATTERN}), AfterValidator(_check_semver)
]
"""A semantic version, MAJOR.MINOR.PATCH with optional pre-release and build."""


def _semver_key(version: str) -> tuple[Any, ...]:
    match = _SEMVER.fullmatch(version)
    if match is None:
        raise ValueError(f"'{version}' is not a semantic version")
    major, minor, patch, pre, _build = match.groups()
    # A release sorts after its pre-releases; numeric identifiers sort below text ones.
    pre_key: tuple[Any, ...] = (1,)
    if pre is not None:
        pre_key = (
            0,
            *((0, int(part), "") if part.isdigit() else (1, 0, part) for part in pre.split(".")),
        )
    return (int(major), int(minor), int(patch), pre_key)


def compare_semver(a: str, b: str) -> int:
    """Compare two semantic versions by SemVer 2.0 precedence: -1, 0 or 1 (build ignored).

    Raises:
        ValueError: a version is not a semantic version.
    """
    ka, kb = _semver_key(a), _semver_key(b)
    return (ka > kb) - (ka < kb)


# --- times ----------------------------------------------------------------------

TIME_PATTERN = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z$"
"""The only spelling of a time on the wire: RFC 3339, UTC, ``Z``, whole seconds."""
_TIME = re.compile(TIME_PATTERN)


def _parse_time(value: Any) -> Any:
    if isinstance(value, str):
        if not _TIME.fullmatch(value):
            raise ValueError(
                f"{value!r} is not a time like 2025-01-31T12:00:00Z (RFC 3339, UTC, 'Z', "
                "whole seconds)"
            )
        try:
            return datetime.fromisoformat(value[:-1] + "+00:00")
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a valid date and time") from exc
    if not isinstance(value, datetime):
        raise ValueError(f"{value!r} is not a time like 2025-01-31T12:00:00Z")
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
    # Whole seconds: a fraction is dropped, so an expiry only ever moves earlier.
    return value.replace(tzinfo=timezone.utc, microsecond=0)


def format_time(value: datetime) -> str:
    """RFC 3339 with ``Z`` and whole seconds: the wire spelling of a UTC time."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


UtcTime = Annotated[
    datetime,
    Field(json_schema_extra={"pattern": TIME_PATTERN}),
    BeforeValidator(_parse_time),
    AfterValidator(_check_utc),
    PlainSerializer(format_time, return_type=str, when_used="json"),
]
"""A timezone-aware UTC time; on the wire exactly ``YYYY-MM-DDTHH:MM:SSZ``."""


# --- percentages -----------------------------------------------------------------

BUCKETS = 10_000
"""Cohort buckets: one per 0.01 percent."""

PERCENT_RULE = "a percentage greater than 0 and at most 100, like 5%"


class PercentError(EdgeregError, ValueError):
    """A percentage outside (0, 100] or finer than 0.01.

    Also a ValueError, so pydantic validators can use :func:`check_percent`.
    """

    exit_code = ExitCode.USAGE


def basis_points(percent: float) -> int:
    """Return ``percent`` in hundredths of a percent, as an exact integer.

    Accepts 0 to 100 inclusive (0 admits no device, 100 every device).

    Raises:
        PercentError: not a finite number in [0, 100], or more than two decimals.
    """
    if isinstance(percent, bool) or not isinstance(percent, (int, float)):
        raise PercentError(f"percent must be a number, got {percent!r}")
    if not math.isfinite(percent) or not 0 <= percent <= 100:
        raise PercentError(f"percent must be between 0 and 100, got {percent!r}")
    scaled = percent * 100
    points = round(scaled)
    # percent * 100 is inexact in binary (0.29 * 100 = 28.999999999999996);
    # anything farther than this from an integer had a third decimal.
    if abs(scaled - points) > 1e-6:
        raise PercentError(
            f"percent {percent!r} has more than two decimals; rollouts move in steps of 0.01%"
        )
    return points


def check_percent(percent: float) -> float:
    """Validate a rollout percent: greater than 0, at most 100, at most two decimals.

    Raises:
        PercentError: (also a ValueError) when the rule is broken.
    """
    points = basis_points(percent)
    if points == 0:
        raise PercentError(f"percent must be greater than 0, got {percent!r}")
    return float(percent)


Percent = Annotated[
    float,
    # The bounds are checked by check_percent (one message); these are for the schema.
    # No multipleOf: 0.29 / 0.01 is 28.999999999999996 in floating point, and JSON
    # Schema validators would refuse a valid percent. "Two decimals" is in the text.
    Field(
        json_schema_extra={
            "exclusiveMinimum": 0,
            "maximum": 100,
            "$comment": "At most two decimals: round(percent * 100) is within 1e-6 of "
            "percent * 100 (docs/protocol.md section 6).",
        }
    ),
    AfterValidator(check_percent),
]
"""A rollout share: 0 < percent <= 100, at most two decimals."""


# --- models shared by models.toml and the wire -------------------------------------


def _cpu_last_schema() -> list[JsonValue]:
    """JSON Schema for "ends with cpu": one alternative per length (JSON Schema has no "last")."""
    names: list[JsonValue] = [b for b in typing.get_args(Backend) if b != "cpu"]
    others: JsonValue = {"enum": names}
    cpu: JsonValue = {"const": "cpu"}
    alternatives: list[JsonValue] = []
    for length in range(1, len(names) + 2):
        prefix: list[JsonValue] = [*([others] * (length - 1)), cpu]
        alternatives.append({"prefixItems": prefix, "minItems": length, "maxItems": length})
    return alternatives


class _Frozen(BaseModel):
    # defer_build: each schema is built on first use, so a command pays only for the
    # models it touches (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class RuntimeHints(_Frozen):
    """Settings that travel with the variant to the app."""

    threads: Annotated[int, Strict()] = Field(
        default=4, ge=1, le=16, description="Recommended inference threads, 1 to 16."
    )
    backends: list[Backend] = Field(
        default_factory=lambda: list[Backend](["cpu"]),
        min_length=1,
        description='Backends to try in order, each once, ending with "cpu".',
        json_schema_extra={"uniqueItems": True, "allOf": [{"anyOf": _cpu_last_schema()}]},
    )
    precision: Literal["low", "normal", "high"] = "normal"

    @field_validator("backends")
    @classmethod
    def _cpu_last(cls, value: list[str]) -> list[str]:
        return check_backends(value)


def check_backends(value: list[str]) -> list[str]:
    """A backend order: each backend once, ending with ``cpu`` (an entry's and a hint's)."""
    if value[-1] != "cpu":
        raise ValueError(
            'the backend list must end with "cpu" so the app falls back to it '
            "when a GPU driver fails"
        )
    if len(set(value)) != len(value):
        raise ValueError("each backend may appear once")
    return value


BACKENDS_SCHEMA: dict[str, JsonValue] = {
    "uniqueItems": True,
    "allOf": [{"anyOf": _cpu_last_schema()}],
}
"""The JSON Schema of a backend order (what :func:`check_backends` checks)."""


class TierRules(_Frozen):
    """Which devices belong to a tier. A tier with no rules is the catch-all."""

    description: str = ""
    min_ram_mb: Annotated[int, Strict()] | None = Field(default=None, ge=0, le=MAX_MEMORY_MB)
    min_cpu_cores: Annotated[int, Strict()] | None = Field(default=None, ge=1)
    soc_allow: list[str] | None = Field(
        default=None,
        description="SoC names (case-insensitive, '*' wildcards) a device must match.",
    )
    os: list[Literal["android", "ios"]] | None = None

    @property
    def is_catch_all(self) -> bool:
        """True when the tier accepts every device."""
        return (
            self.min_ram_mb is None
            and self.min_cpu_cores is None
            and self.soc_allow is None
            and self.os is None
        )


# --- dotted versions and ranges (MNN runtimes, app and OS versions) ------------------

VERSION_MAX_LENGTH = 64
"""The longest app, OS or runtime version a client reads (longer: not a version)."""
VERSION_RULE = (
    "an optional 'v', dot-separated parts starting with a number (2.4.0), an optional "
    "pre-release (-beta.1) and an optional build (+123 or ' (123)')"
)
VERSION_PATTERN = (
    r"[vV]?(?P<core>[0-9]+(?:\.[0-9A-Za-z]+)*)"
    r"(?:-(?P<pre>[0-9A-Za-z-]+(?:\.[0-9A-Za-z-]+)*))?"
    r"(?:\+[0-9A-Za-z.-]+| \([0-9A-Za-z.-]+\))?"
)
"""An app, OS or MNN runtime version (docs/protocol.md §7, "Versions"), unanchored."""
_VERSION = re.compile(VERSION_PATTERN)
RuntimeVersion = Annotated[
    str,
    StringConstraints(
        max_length=64,
        pattern=r"^[vV]?[0-9]+(\.[0-9A-Za-z]+)*(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?"
        r"(\+[0-9A-Za-z.-]+| \([0-9A-Za-z.-]+\))?$",
    ),
]
"""A version of §7's grammar as a wire field (an app's MNN runtime in a report), anchored."""
_PART = re.compile(r"^([0-9]*)(.*)$")

VersionKey = tuple[tuple[tuple[int, str], ...], tuple[Any, ...]]


def version_key(version: str) -> VersionKey:
    """The sort key of a version: its core parts, then its pre-release (build ignored).

    Raises:
        ValueError: not a version (:data:`VERSION_RULE`), or longer than 64 characters.
    """
    match = _VERSION.fullmatch(version) if len(version) <= VERSION_MAX_LENGTH else None
    if match is None:
        raise ValueError(f"{version!r} is not a version: {VERSION_RULE}")
    parts = []
    for part in match.group("core").split("."):
        found = _PART.fullmatch(part)
        assert found is not None
        digits, rest = found.groups()
        parts.append((int(digits) if digits else 0, rest))
    while parts and parts[-1] == (0, ""):
        parts.pop()  # 3.7 == 3.7.0
    pre = match.group("pre")
    # A release sorts after its pre-releases (2.4.0-beta.1 < 2.4.0); identifiers as in
    # SemVer 2.0: numeric ones by value and below text ones, text ones by ASCII.
    pre_key: tuple[Any, ...] = (1,)
    if pre is not None:
        pre_key = (
            0,
            *((0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split(".")),
        )
    return tuple(parts), pre_key


def _version_key(version: str) -> VersionKey:
    return version_key(version)


def is_version(version: object) -> bool:
    """True when ``version`` is a string a client reads as a version."""
    if not isinstance(version, str):
        return False
    try:
        version_key(version)
    except ValueError:
        return False
    return True


def compare_versions(a: str, b: str) -> int:
    """Compare two versions (MNN runtimes, app versions, OS versions): -1, 0 or 1.

    Core parts compare one by one by their leading number, then by the rest
    as text; missing parts count as 0 (``3.7`` equals ``3.7.0``); a leading
    ``v`` and the build (``+123``, `` (123)``) are ignored; a pre-release
    sorts before its release (``2.4.0-beta.1`` < ``2.4.0``).

    Raises:
        ValueError: a version is not a version (:data:`VERSION_RULE`).
    """
    ka, kb = version_key(a), version_key(b)
    return (ka > kb) - (ka < kb)


RANGE_MAX_LENGTH = 200
"""The longest version range; a longer one is not a range."""
RANGE_RULE = (
    "comparators joined by commas, each an operator (>=, >, <=, <, ==) and a version, "
    'like ">=2.3.0, <3"'
)
_COMPARATOR = re.compile(r" *(>=|<=|==|>|<) *(" + VERSION_PATTERN + r") *")
_OPERATORS = {
    ">=": lambda c: c >= 0,
    ">": lambda c: c > 0,
    "<=": lambda c: c <= 0,
    "<": lambda c: c < 0,
    "==": lambda c: c == 0,
}


def parse_range(text: str) -> list[tuple[str, str]]:
    """The comparators of a version range: ``">=2.3, <3"`` -> [(">=", "2.3"), ("<", "3")].

    Raises:
        ValueError: the range does not parse; the message states the rule.
    """
    if not isinstance(text, str) or len(text) > RANGE_MAX_LENGTH:
        raise ValueError(
            f"{text!r} is not a version range (at most {RANGE_MAX_LENGTH} characters): {RANGE_RULE}"
        )
    comparators = []
    for part in text.split(","):
        match = _COMPARATOR.fullmatch(part)
        if match is None or len(match.group(2)) > VERSION_MAX_LENGTH:
            raise ValueError(f"{text!r} is not a version range ({part.strip()!r}): {RANGE_RULE}")
        comparators.append((match.group(1), match.group(2)))
    return comparators


def satisfies(version: str, version_range: str) -> bool:
    """True when ``version`` meets every comparator of ``version_range``.

    Raises:
        ValueError: the version or the range does not parse.
    """
    comparators = parse_range(version_range)
    return all(_OPERATORS[op](compare_versions(version, bound)) for op, bound in comparators)


LENIENT_RANGES = "lenient_ranges"
"""Validation context key: ranges are read at the fit rule, not at parse time (a manifest)."""


def _check_range(value: str, info: ValidationInfo) -> str:
    # In a signed manifest a range that does not parse is not a schema error: the
    # entry does not fit (rule 12), so a range syntax added later only keeps the
    # entries that use it from older clients (docs/protocol.md §7, "Version ranges").
    if isinstance(info.context, dict) and info.context.get(LENIENT_RANGES):
        return value
    parse_range(value)
    return value


VersionRange = Annotated[str, AfterValidator(_check_range)]
"""A version range: comparators joined by commas, like ``>=2.3.0, <3``."""


class Requirements(_Frozen):
    """What a release needs of the app and the OS it runs in (unset: anything).

    A device that does not report the version a set requirement reads does
    not meet it: a model that needs a newer app must not reach apps too old
    to say their version.
    """

    app: VersionRange | None = Field(
        default=None,
        description="The app versions (versionName / CFBundleShortVersionString) the release "
        'needs, like ">=2.3.0, <3".',
    )
    android: VersionRange | None = Field(
        default=None, description='Android API levels the release needs, like ">=29".'
    )
    ios: VersionRange | None = Field(
        default=None, description='iOS versions the release needs, like ">=16.0".'
    )

    def unmet(
        self, *, app_version: str | None, os: str | None, os_version: str | None
    ) -> list[str]:
        """Each requirement the device misses, as a phrase; empty when it fits.

        A version the device did not say, a version that does not parse and a
        range that does not parse all miss the requirement (never an error).
        """
        unmet = []
        if self.app is not None:
            missed = _misses(self.app, app_version, "app", "the app")
            if missed:
                unmet.append(missed)
        for name, wanted in (("android", self.android), ("ios", self.ios)):
            if wanted is None or os != name:
                continue
            label = "Android API" if name == "android" else "iOS"
            missed = _misses(wanted, os_version, label, "the device")
            if missed:
                unmet.append(missed)
        return unmet


def _misses(wanted: str, version: str | None, label: str, who: str) -> str | None:
    """Why ``version`` misses the range ``wanted`` (phrase), or None when it is in it."""
    try:
        parse_range(wanted)
    except ValueError:
        return f"needs {label} {wanted!r}, which is not a version range this client reads"
    if version is None:
        return f"needs {label} {wanted}, {who} did not say its version"
    if not is_version(version):
        return f"needs {label} {wanted}, {who} says {version!r}, which is not a version"
    if not satisfies(version, wanted):
        return f"needs {label} {wanted}, {who} {'is' if who == 'the app' else 'has'} {version}"
    return None
