"""[registry] and [reports]: where releases and device reports are kept.

Also :func:`load_registry`: [registry] alone, for the commands that only read
the registry (``status``, ``history``, ``verify``): they neither build nor
check the rest of the schema (start-up time: benchmarks/startup.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from edgereg.config._base import DEFAULT_CONFIG_FILE, DEFAULT_TRUSTED_KEYS, _Strict
from edgereg.config._toml import read_toml


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


def trusted_key_paths(registry: Registry, root: Path) -> list[Path]:
    """The files and directories ``[registry] trusted_keys`` names, resolved against ``root``."""
    paths = []
    for entry in registry.trusted_keys:
        path = Path(entry.removeprefix("file://"))
        paths.append(path if path.is_absolute() else root / path)
    return paths


class _RegistryTable(BaseModel):
    """A models.toml seen through its [registry] table; the other tables are not read."""

    model_config = ConfigDict(extra="ignore", frozen=True, strict=True, defer_build=True)

    registry: Registry = Field(default_factory=Registry)


@dataclass(frozen=True)
class RegistrySettings:
    """[registry] of a models.toml, and where the file is (what :class:`Config` has of it).

    Attributes:
        registry: The validated [registry] table.
        path: The models.toml it was read from.
    """

    registry: Registry
    path: Path

    @property
    def root(self) -> Path:
        """The directory of models.toml (relative paths in it start here)."""
        return self.path.parent

    def trusted_key_paths(self) -> list[Path]:
        """The files and directories ``[registry] trusted_keys`` names, resolved."""
        return trusted_key_paths(self.registry, self.root)


def load_registry(path: str | Path = DEFAULT_CONFIG_FILE) -> RegistrySettings:
    """Read and validate only the [registry] table of a models.toml.

    The other tables are neither validated nor reported on (``edgereg
    validate`` checks the whole file).

    Raises:
        ConfigError: the file is missing or not TOML, or [registry] breaks its
            schema (the same message as :func:`~edgereg.config.load` gives).
    """
    path = Path(path)
    data = read_toml(path)
    try:
        table = _RegistryTable.model_validate(data)
    except ValidationError as exc:
        from edgereg.config._errors import _config_error  # the whole schema, errors only

        raise _config_error(exc, data, str(path)) from exc
    return RegistrySettings(table.registry, path)
