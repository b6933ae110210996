"""Pinned files and the tensors a model takes and returns."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from edgereg.config._base import _rule_error, _Strict
from edgereg.protocol.fields import Sha256


class PinnedFile(_Strict):
    """A file (path relative to models.toml, or a file:// URI) pinned by sha256."""

    path: str = Field(min_length=1)
    sha256: Sha256

    @field_validator("path")
    @classmethod
    def _local_only(cls, value: str) -> str:
        if "://" in value and not value.startswith("file://"):
            scheme = value.split("://", 1)[0]
            raise ValueError(
                f"'{scheme}://' sources are not supported; use a path relative to "
                "models.toml or a file:// URI (fetch remote files into the repository "
                "with `dvc import-url` first)"
            )
        return value


class CalibrationSet(PinnedFile):
    """The calibration set for int8 quantization (an .npz, see docs)."""

    samples: int | None = Field(
        default=None, ge=1, description="How many samples to use; all when unset."
    )
    balanced: bool = Field(
        default=True,
        description="Sample the same number of each class when the set has labels.",
    )


InputDtype = Literal["float32", "int32", "int64", "uint8"]
#: numpy dtype names of what a dataset may hold for each input dtype.
NO_BATCH_AXIS = "none"


class InputSpec(_Strict):
    """One model input and how dataset values become that tensor."""

    name: str = Field(min_length=1)
    shape: list[Annotated[int, Field(ge=1)]] = Field(
        description="The tensor one sample is fed as, batch axis (of size 1) included; "
        "[] for a scalar.",
    )
    dtype: InputDtype = Field(
        default="float32",
        description="Element type the model takes (int64 token ids and scalars as the ONNX "
        "graph declares them).",
    )
    batch_axis: int | Literal["none"] = Field(
        default=0,
        description='Which axis of shape is the batch (size 1), or "none" for inputs that '
        "have none (a recurrent state such as [2, 1, 128], a scalar).",
    )
    kind: Literal["tensor", "image"] = "tensor"
    layout: Literal["NCHW", "NHWC"] | None = None
    color: Literal["RGB", "BGR", "GRAY"] | None = None
    mean: list[float] | None = None
    std: list[Annotated[float, Field(gt=0)]] | None = None

    @property
    def batch(self) -> int | None:
        """The batch axis, or None when the input has none."""
        return None if self.batch_axis == NO_BATCH_AXIS else int(self.batch_axis)

    @property
    def row_shape(self) -> tuple[int, ...]:
        """The shape of one sample in a dataset: ``shape`` without its batch axis."""
        axis = self.batch
        shape = list(self.shape)
        if axis is not None:
            del shape[axis]
        return tuple(shape)

    @model_validator(mode="after")
    def _batch_axis(self) -> InputSpec:
        axis = self.batch
        if axis is None:
            return self
        if not self.shape:
            raise _rule_error(
                "batch_axis",
                f"input '{self.name}' is a scalar (shape []): it has no batch axis; "
                'set batch_axis = "none"',
            )
        if not 0 <= axis < len(self.shape):
            raise _rule_error(
                "batch_axis",
                f"batch_axis {axis} is outside shape {self.shape} (axes 0..{len(self.shape) - 1})",
            )
        if self.shape[axis] != 1:
            hint = (
                f"declare the axis of size 1 that is the batch (batch_axis = {self.shape.index(1)})"
                if 1 in self.shape
                else ""
            )
            raise _rule_error(
                "batch_axis" if "batch_axis" in self.model_fields_set else "shape",
                f"axis {axis} of shape {self.shape} is {self.shape[axis]}, not a batch of 1: "
                + (hint + ", or " if hint else "")
                + 'set batch_axis = "none" when the input has no batch axis (a recurrent '
                "state, a fixed-size tensor)",
            )
        return self

    @model_validator(mode="after")
    def _image_fields(self) -> InputSpec:
        image_only = {"layout": self.layout, "color": self.color}
        if self.kind == "tensor":
            given = [key for key, value in image_only.items() if value is not None]
            if given:
                raise _rule_error(
                    given[0], f'{", ".join(given)} only apply to kind = "image" inputs'
                )
            return self
        if self.dtype != "float32":
            raise _rule_error("dtype", 'kind = "image" inputs are float32 tensors')
        if self.layout is None:
            raise _rule_error(
                "layout", 'kind = "image" inputs need layout ("NCHW" or "NHWC") and color'
            )
        if self.color is None:
            raise _rule_error(
                "color", 'kind = "image" inputs need color ("RGB", "BGR" or "GRAY") and layout'
            )
        if len(self.shape) != 4 or self.shape[0] != 1 or self.batch != 0:
            raise _rule_error("shape", "image inputs have shape [1, C, H, W] or [1, H, W, C]")
        channels = self.shape[1] if self.layout == "NCHW" else self.shape[3]
        expected = 1 if self.color == "GRAY" else 3
        if channels != expected:
            raise _rule_error(
                "shape", f"color {self.color} needs {expected} channel(s), shape has {channels}"
            )
        for key in ("mean", "std"):
            values = getattr(self, key)
            if values is not None and len(values) != channels:
                raise _rule_error(
                    key, f"{key} needs one value per channel ({channels}), got {len(values)}"
                )
        return self


class StatePair(_Strict):
    """A recurrent state: what ``output`` returns at one step is fed to ``input`` at the next."""

    input: str = Field(min_length=1, description="The state input (zeros at a sequence start).")
    output: str = Field(min_length=1, description="The output that carries the next state.")


class OutputSpec(_Strict):
    """One model output."""

    name: str = Field(min_length=1)
