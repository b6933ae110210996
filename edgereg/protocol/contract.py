"""How an app calls a model: its I/O contract, carried in every manifest entry.

An app reads the contract of the model it installed instead of hard-coding
names, shapes, dtypes and preprocessing per version, so a low tier with a
smaller input, or a new version with a new class, reaches it as data.

Pure data, like the rest of the protocol: the build fills it in from
models.toml and the ONNX graph (:mod:`edgereg.build.contract`), publish
copies it into the release record, and the registry into every manifest
entry of that variant.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

from edgereg.protocol._json import strict_json_loads
from edgereg.protocol.fields import BlobPath, Sha256, Size, StrictInt
from edgereg.protocol.layout import blob_path
from edgereg.protocol.reasons import Malformed

__all__ = [
    "INLINE_LABELS_MAX_BYTES",
    "MAX_LABELS_BYTES",
    "MNN_APIS",
    "BlobRef",
    "IOContract",
    "InputTensor",
    "MnnApi",
    "StateLink",
    "TaskInfo",
    "TensorDtype",
    "TensorSpec",
    "parse_labels",
]

INLINE_LABELS_MAX_BYTES = 2048
"""Labels whose JSON is larger than this travel as a blob (``labels_blob``), not inline."""

MAX_LABELS_BYTES = 4 * 1024 * 1024
"""A labels blob declared larger than this is refused before download (a real one: a few KiB)."""


def parse_labels(data: bytes) -> list[str]:
    """A verified labels blob (``contract.labels_blob``) as its list of labels.

    Strict JSON (UTF-8, no BOM, no duplicate key, no NaN, nested at most 64
    deep) holding an array of strings, in index order; anything else refuses
    the release.

    Raises:
        Malformed: not such an array.
    """
    try:
        value = strict_json_loads(data)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise Malformed(f"the labels blob is not JSON: {exc}") from exc
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise Malformed("the labels blob is not a JSON array of strings")
    return value


TensorDtype = Literal["float32", "float16", "int8", "uint8", "int32", "int64", "bool"]

MnnApi = Literal["session", "module"]
"""MNN's two ways to run a model: ``session`` (``Interpreter::createSession`` and
``runSession``: MNN's Android Java API, most iOS code) and ``module``
(``Express::Module::load``, pymnn's ``nn.load_module_from_file``)."""

MNN_APIS: tuple[MnnApi, ...] = ("session", "module")

TensorName = Annotated[str, StringConstraints(min_length=1, max_length=256)]
DimName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")]
"""A named dynamic axis (``batch``, ``time``): its size is the app's to choose."""
Dim = Annotated[int, Field(ge=0, strict=True)] | DimName


class _Contract(BaseModel):
    # defer_build: each schema is built on first use, so a command pays only for the
    # models it touches (start-up time: benchmarks/analyze.py).
    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)


class BlobRef(_Contract):
    """A blob in the registry, by digest (``path`` is always ``blobs/sha256/<sha256>``)."""

    path: BlobPath
    sha256: Sha256
    size: Size

    @model_validator(mode="after")
    def _path_is_digest(self) -> BlobRef:
        if self.path != blob_path(self.sha256):
            raise ValueError(f"path is {self.path!r}, expected {blob_path(self.sha256)!r}")
        return self

    @classmethod
    def of(cls, sha256: str, size: int) -> BlobRef:
        """The reference to the blob with this digest and size."""
        return cls(path=blob_path(sha256), sha256=sha256, size=size)


class TensorSpec(_Contract):
    """One tensor: name, element type, and shape (ints, or names for dynamic axes)."""

    name: TensorName
    dtype: TensorDtype
    shape: list[Dim] = Field(
        description="Sizes per axis; a name marks a dynamic axis; [] a scalar."
    )


class InputTensor(TensorSpec):
    """One input, with what the app must do to its data first."""

    batch_axis: StrictInt | None = Field(
        default=None, description="The batch axis (size 1), or null when the input has none."
    )
    kind: Literal["tensor", "image"] = "tensor"
    layout: Literal["NCHW", "NHWC"] | None = None
    color: Literal["RGB", "BGR", "GRAY"] | None = None
    mean: list[float] | None = Field(
        default=None, description="Per channel: the model takes (pixel - mean) / std."
    )
    std: list[float] | None = None


class StateLink(_Contract):
    """A recurrent state: feed ``output`` of one step to ``input`` of the next (zeros first)."""

    input: TensorName
    output: TensorName


class TaskInfo(_Contract):
    """What the model computes, and what the app needs to read its output."""

    kind: Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,62}$")] = Field(
        description="classification, dense_map, segmentation, ctc, embedding, frame_decision, "
        "generic or custom."
    )
    output: TensorName | None = Field(default=None, description="The output the task reads.")
    threshold: float | None = Field(
        default=None, description="dense_map and frame_decision: a value above is positive."
    )
    blank: StrictInt | None = Field(default=None, description="ctc: the blank class index.")


class IOContract(_Contract):
    """Everything an app needs to call the model and read what it returns."""

    inputs: list[InputTensor] = Field(min_length=1)
    outputs: list[TensorSpec] = Field(min_length=1)
    state: list[StateLink] = Field(default_factory=list)
    task: TaskInfo
    labels: list[str] | None = Field(
        default=None,
        description="Class names (classification, segmentation) or characters (ctc, blank "
        "excluded), in "
        "index order, when their JSON is at most 2048 bytes.",
    )
    labels_blob: BlobRef | None = Field(
        default=None,
        description="Larger label lists: a blob holding a JSON array of strings.",
    )
    mnn_api: MnnApi | None = Field(
        default=None,
        description="module: the artifact has control-flow subgraphs (While, If, Loop: an "
        "LSTM, a GRU) that only MNN's Module API runs, not its session API. Absent: both run it.",
        exclude_if=lambda value: value is None,
    )

    @model_validator(mode="after")
    def _consistent(self) -> IOContract:
        if self.labels is not None and self.labels_blob is not None:
            raise ValueError("labels and labels_blob are exclusive")
        inputs = {spec.name for spec in self.inputs}
        outputs = {spec.name for spec in self.outputs}
        for link in self.state:
            if link.input not in inputs or link.output not in outputs:
                raise ValueError(
                    f"state {link.input} <- {link.output} names a tensor the contract lacks"
                )
        if self.task.output is not None and self.task.output not in outputs:
            raise ValueError(f"task.output {self.task.output!r} is not an output")
        return self

    def input(self, name: str) -> InputTensor:
        """The input called ``name``.

        Raises:
            KeyError: no such input.
        """
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)
