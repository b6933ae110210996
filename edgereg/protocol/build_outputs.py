"""What ``publish`` reads from a variant's build: typed, so a missing field is a clear error.

A build leaves ``provenance.json`` and ``metrics.json`` beside ``model.mnn``.
The publisher needs only a few of their fields, modelled here; the rest
(the full recipe, the toolchain, every metric) travels into the release
record untouched. Metrics stay an opaque JSON object apart from ``gates`` and
the ship-around of ``arm`` (``avoid_cpu``, ``instead``), because their shape
belongs to the build.
"""

from __future__ import annotations

from typing import Annotated, Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, JsonValue, Strict, ValidationError

from edgereg.protocol.fields import CpuFeature, Name, RuntimeHints, Sha256, Size, VersionPin

__all__ = ["ArmRecord", "ArtifactRecord", "BuildMetrics", "BuildOutputError", "Provenance"]


class BuildOutputError(ValueError):
    """provenance.json or metrics.json lacks what publish needs; the message says what."""


class _Open(BaseModel):
    # The build may record more than publish reads: other keys pass through.
    # defer_build: each schema is built on first use, so a command pays only for the
    # models it touches (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(extra="allow", frozen=True, defer_build=True)


class ArtifactRecord(_Open):
    """The artifact as the build recorded it."""

    path: str = Field(min_length=1)
    sha256: Sha256
    size: Size


class Provenance(_Open):
    """The fields of provenance.json that publish reads."""

    model: Name
    variant: Name
    tier: Name
    artifact: ArtifactRecord
    runtime: RuntimeHints
    min_mnn_runtime: VersionPin = Field(description="The oldest MNN runtime that loads it.")
    recipe_sha256: Sha256 = Field(description="Digest of the resolved models.toml recipe.")
    contract: ArtifactRecord | None = Field(
        default=None, description="contract.json; absent in builds made before it existed."
    )
    probe: ArtifactRecord | None = Field(
        default=None, description="probe.json, the golden probe blob; absent in older builds."
    )
    probe_data: ArtifactRecord | None = Field(
        default=None,
        description="probe-data.bin, the probe's tensors too large to inline; absent otherwise.",
    )

    @classmethod
    def parse(cls, data: Any) -> Provenance:
        """Validate provenance.json's content.

        Raises:
            BuildOutputError: a field is missing or of the wrong type.
        """
        return _validate(cls, data, "provenance.json")


class ArmRecord(_Open):
    """metrics.json's ``arm``: what the ARM verification ran; publish ships its avoidance."""

    avoid_cpu: list[CpuFeature] = Field(
        default_factory=list, description="The CPU features the variant was verified to avoid."
    )
    instead: Name | None = Field(
        default=None, description="The variant devices with an avoided feature install."
    )


class BuildMetrics(_Open):
    """metrics.json: opaque to the protocol apart from which gates passed and what ARM avoids."""

    gates: dict[str, Annotated[bool, Strict()]] = Field(default_factory=dict)
    arm: ArmRecord | None = Field(
        default=None, description="Absent when the variant was verified on no ARM class."
    )

    @classmethod
    def parse(cls, data: Any) -> BuildMetrics:
        """Validate metrics.json's content.

        Raises:
            BuildOutputError: it is not an object, or ``gates`` is not names -> booleans.
        """
        return _validate(cls, data, "metrics.json")

    def failed_gates(self) -> list[str]:
        """The gates that did not pass."""
        return [name for name, passed in self.gates.items() if not passed]

    def as_json(self) -> dict[str, JsonValue]:
        """Everything in metrics.json, as it was (no defaults added for what it lacks)."""
        return self.model_dump(mode="json", exclude_unset=True)


_M = TypeVar("_M", bound=BaseModel)


def _validate(cls: type[_M], data: Any, what: str) -> _M:
    try:
        return cls.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in error['loc']) or '(top level)'}: "
            f"{str(error['msg']).removeprefix('Value error, ')}"
            for error in exc.errors()
        )
        raise BuildOutputError(f"{what}: {problems}") from exc
