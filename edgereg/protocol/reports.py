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

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints, ValidationError

from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.fields import Backend, Name, SchemaVersion, SemVer, VersionPin
from edgereg.protocol.reasons import Malformed
from edgereg.protocol.wire import WireModel, _describe

__all__ = [
    "MAX_REPORT_BYTES",
    "LatencySummary",
    "Report",
    "ReportError",
    "parse_report",
]

MAX_REPORT_BYTES = 4096
"""The largest report a receiver accepts (a real one is about 600 bytes)."""

Milliseconds = Annotated[float, Field(ge=0, le=3_600_000, allow_inf_nan=False)]
Token = Annotated[str, StringConstraints(pattern=r"^[0-9a-f]{32}$")]
ShortText = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9._ -]{1,32}$")]


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

    schema_version: SchemaVersion = 1
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
    mnn_runtime: VersionPin | None = None
    os: Literal["android", "ios"] | None = None
    os_version: ShortText | None = None
    device_class: ShortText | None = Field(
        default=None, description="Coarse: the app's own bucket, such as 'ram4-8c'."
    )


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
    try:
        return Report.model_validate(value, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]["loc"]
        field = ".".join(str(part) for part in first) or None
        raise ReportError(f"report is not valid: {_describe(exc)}", field=field) from exc
