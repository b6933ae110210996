"""[toolchain]: the exact tool versions a build runs with."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, StringConstraints, field_validator, model_validator

from edgereg.config._arm import ARM_DESCRIPTION, ArmClasses
from edgereg.config._base import _rule_error, _Strict
from edgereg.protocol.fields import VersionPin


class Toolchain(_Strict):
    """Exact versions of the tools a build must run with, and the oldest MNN runtime to support."""

    mnn: VersionPin
    onnx: VersionPin
    onnxruntime: VersionPin
    min_mnn_runtime: (
        Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] | None
    ) = Field(
        default=None,
        description="Oldest MNN runtime (MAJOR.MINOR.PATCH) the artifacts must load and run "
        "on; releases and manifests carry it, and apps on an older MNN refuse the model. "
        "Every build proves it by running each artifact under that MNN version (an isolated "
        "runtime installed by `edgereg toolchain runtimes install`) and comparing the outputs "
        "with the converter's runtime. Default: the `mnn` pin. Cannot be newer than `mnn`.",
    )
    mnn_target_version: str | None = Field(
        default=None,
        description="Converter `--targetVersion` (MAJOR.MINOR, such as 2.7): the converter "
        "leaves out graph fusions that MNN runtimes before this version lack. Needed only "
        "when `min_mnn_runtime` is older than 2.8 (mnnconvert 3.6.1 gates its fusions at "
        "1.1, 1.2, 1.3, 2.0 and 2.8). Cannot be newer than `min_mnn_runtime`.",
    )

    arm: ArmClasses | None = Field(default=None, description=ARM_DESCRIPTION)
    arm_samples: int = Field(
        default=16,
        ge=0,
        le=4096,
        description="Evaluation samples each CPU class runs under emulation, besides the "
        "golden probe's (emulation costs 30-500x native time).",
    )

    @field_validator("mnn_target_version")
    @classmethod
    def _target_version_is_major_minor(cls, value: str | None) -> str | None:
        if value is not None and not re.fullmatch(r"[0-9]+\.[0-9]", value):
            raise ValueError(
                f"'{value}' is not MAJOR.MINOR with a one-digit minor, such as 2.7 "
                "(mnnconvert reads --targetVersion as a decimal number: 3.10 would mean 3.1)"
            )
        return value

    @staticmethod
    def _release(version: str) -> tuple[int, ...]:
        # The numeric prefix of each part: 3.6.1 -> (3, 6, 1), 3.7rc1 -> (3, 7).
        numbers = []
        for part in version.split("."):
            digits = part[: len(part) - len(part.lstrip("0123456789"))]
            numbers.append(int(digits) if digits else 0)
        while numbers and numbers[-1] == 0:
            numbers.pop()  # 3.6 == 3.6.0
        return tuple(numbers)

    @model_validator(mode="after")
    def _minimum_not_above_converter(self) -> Toolchain:
        release = self._release
        if self.min_mnn_runtime is not None and release(self.min_mnn_runtime) > release(self.mnn):
            raise _rule_error(
                "min_mnn_runtime",
                f"min_mnn_runtime {self.min_mnn_runtime} is newer than the converter "
                f"(mnn = {self.mnn}); a runtime can only be proven to run what an older or "
                f"equal converter wrote: lower it to {self.mnn} or less, or remove it",
            )
        if self.mnn_target_version is not None and release(self.mnn_target_version) > release(
            self.minimum_runtime
        ):
            raise _rule_error(
                "mnn_target_version",
                f"mnn_target_version {self.mnn_target_version} is newer than the minimum "
                f"runtime {self.minimum_runtime}, so the converter could write operators that "
                "runtime lacks; set it to that runtime's MAJOR.MINOR or lower, or remove it",
            )
        return self

    @property
    def minimum_runtime(self) -> str:
        """The oldest MNN runtime the artifacts must run on: ``min_mnn_runtime``, else ``mnn``."""
        return self.min_mnn_runtime or self.mnn

    @property
    def needs_runtime_proof(self) -> bool:
        """True when the minimum runtime differs from the converter's, so a build must prove it."""
        return self._release(self.minimum_runtime) != self._release(self.mnn)

    def as_dict(self) -> dict[str, str]:
        """Return the pins keyed by Python distribution name."""
        return {"mnn": self.mnn, "onnx": self.onnx, "onnxruntime": self.onnxruntime}
