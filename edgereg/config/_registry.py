"""[registry] and [reports]: where releases and device reports are kept."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from edgereg.config._base import DEFAULT_TRUSTED_KEYS, _Strict


class Registry(_Strict):
    """Where releases are published, and how long signed documents stay valid."""

    url: str = Field(
        default="file://registry",
        description="file://PATH (relative to models.toml) or s3://BUCKET/PREFIX.",
    )
    endpoint_url: str | None = Field(
        default=None, description="S3 endpoint for S3-compatible stores (MinIO, R2, ...)."
    )
    expires_days: int = Field(
        default=30,
        ge=1,
        le=366,
        description="Signed state and manifests expire after this; `edgereg resign` renews.",
    )
    trusted_keys: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=lambda: [DEFAULT_TRUSTED_KEYS],
        description="The publisher's public keys every registry command verifies against "
        "(never the registry's own keys/): PEM files, or directories of *.pem files, "
        "relative to models.toml. `edgereg keys generate` pins its key in the first "
        "directory listed.",
    )


class Reports(_Strict):
    """Where devices report how releases run, and where the reports are kept."""

    url: str | None = Field(
        default=None,
        description="What manifests tell devices to POST reports to: an http(s) URL of a "
        "collector, or a path relative to the registry root (v1/reports with `edgereg "
        "serve`). Unset: devices do not report.",
    )
    store: str = Field(
        default="sqlite:///reports.sqlite",
        description="sqlite:///PATH (relative to models.toml) or postgresql://... ; what "
        "`edgereg serve` writes and the canary analysis reads.",
    )
    retention_days: int = Field(
        default=90, ge=1, le=3650, description="Raw reports older than this are deleted."
    )
