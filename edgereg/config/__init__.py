"""The models.toml schema: what a team declares, validated before anything runs.

Every table forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Errors name the file, the dotted key path and what is allowed
(see :func:`load`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
import sys
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    StringConstraints,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from edgereg.errors import ConfigError
from edgereg.protocol.fields import (
    NAME_RULE,
    Backend,
    Name,
    Requirements,
    RuntimeHints,
    SemVer,
    Sha256,
    TierRules,
    VersionPin,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

DEFAULT_CONFIG_FILE = "models.toml"
#: Where the publisher's public keys are pinned, beside models.toml (committed).
DEFAULT_TRUSTED_KEYS = "publisher-keys"
#: What `edgereg validate` says about a models.toml that declares no model yet.
NO_MODELS_NOTE = (
    "no models yet: run `edgereg add path/to/model.onnx --evaluation path/to/evaluation.npz`"
)

# One definition of each wire-visible type, in the protocol; re-exported here.
__all__ = [
    "NAME_RULE",
    "Backend",
    "Config",
    "Name",
    "Requirements",
    "RuntimeHints",
    "SemVer",
    "Sha256",
    "TierRules",
    "VersionPin",
    "json_schema",
    "load",
    "parse",
]


class _Strict(BaseModel):
    # strict: "0.5" is not a number and 4.0 is not a thread count; a budget of
    # inf is no budget at all.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# A cross-field rule broken: pydantic reports such errors at the table that was
# validated, so the error carries the key (relative to that table) it is about.
_RULE_ERROR = "edgereg_rule"


def _rule_error(key: str, message: str) -> PydanticCustomError:
    return PydanticCustomError(_RULE_ERROR, "{message}", {"key": key, "message": message})


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


class MetricBudget(_Strict):
    """Limits on one task metric (see the task's metric list in the docs)."""

    min: float | None = Field(
        default=None, description="The variant's value must be at least this."
    )
    max: float | None = Field(default=None, description="The variant's value must be at most this.")
    max_drop: float | None = Field(
        default=None,
        ge=0,
        description="Label metrics: at most this much worse than the fp32 ONNX baseline on the "
        "same labels (for lower-is-better metrics such as CER, a rise).",
    )
    min_baseline: float | None = Field(
        default=None,
        description="Label metrics: the fp32 ONNX baseline itself must reach this; a baseline "
        "below it points at broken preprocessing, not at the variant.",
    )
    max_baseline: float | None = Field(
        default=None, description="As min_baseline, for lower-is-better metrics."
    )

    def merged(self, override: MetricBudget | None) -> MetricBudget:
        """Return these limits with every field set in ``override`` replaced."""
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_unset=True))


class Budgets(_Strict):
    """Limits a variant must stay within.

    Output agreement (cosine, SNR, max abs error) and the task's metrics have
    documented defaults per precision; a key set here replaces the default.
    """

    max_size_mb: float | None = Field(default=None, gt=0)
    min_cosine: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Cosine similarity of each output with the fp32 ONNX Runtime reference, "
        "over the whole evaluation set.",
    )
    min_snr_db: float | None = Field(
        default=None,
        description="Signal-to-noise ratio of each output against the reference, in dB "
        "(10·log10 of reference energy over error energy; 20 dB = 10% relative L2 error).",
    )
    max_abs_error: float | None = Field(
        default=None,
        ge=0,
        description="Max absolute difference of any output value from the reference.",
    )
    max_latency_p50_ms: float | None = Field(
        default=None, gt=0, description="Host p50 latency at the variant's thread count."
    )
    metrics: dict[str, MetricBudget] = Field(
        default_factory=dict,
        description="Limits on the task's metrics, by metric name (e.g. iou = { min = 0.9 }).",
    )

    def merged(self, override: Budgets | None) -> Budgets:
        """Return these budgets with every field set in ``override`` replaced.

        Metric limits merge per metric and per field, so a variant can change
        one limit of one metric and keep the rest.
        """
        if override is None:
            return self
        update: dict[str, Any] = override.model_dump(exclude_unset=True, exclude={"metrics"})
        if "metrics" in override.model_fields_set:
            metrics = dict(self.metrics)
            for name, limits in override.metrics.items():
                metrics[name] = metrics[name].merged(limits) if name in metrics else limits
            update["metrics"] = metrics
        return self.model_copy(update=update)


@dataclass(frozen=True)
class TaskMetric:
    """One metric a task's evaluator measures.

    Attributes:
        name: The key in metrics.json and in ``budgets.metrics``.
        against: ``reference`` (the variant compared with the fp32 ONNX
            Runtime outputs) or ``labels`` (the variant scored on the labels,
            next to the fp32 ONNX baseline on the same labels).
        higher_is_better: The direction of "worse" for ``max_drop``.
        description: One line for the docs.
    """

    name: str
    against: Literal["reference", "labels"]
    higher_is_better: bool
    description: str


class _Task(_Strict):
    output: str | None = Field(
        default=None,
        description="The output the metric reads; the first output that is not a state output "
        "when unset.",
    )

    #: What the task measures; a custom evaluator names its own.
    METRICS: ClassVar[tuple[TaskMetric, ...]] = ()

    def metric(self, name: str) -> TaskMetric | None:
        """The metric called ``name``, or None when the task does not measure it."""
        return next((metric for metric in self.METRICS if metric.name == name), None)


class ClassificationTask(_Task):
    """Scores over classes: top-1 agreement, accuracy and per-class recall."""

    kind: Literal["classification"]
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "top1_agreement",
            "reference",
            True,
            "share of samples whose top-1 class matches the reference's",
        ),
        TaskMetric("accuracy", "labels", True, "top-1 accuracy"),
        TaskMetric(
            "class_recall_drop",
            "labels",
            False,
            "the worst class's recall loss against the baseline (gate it with max)",
        ),
    )


class DenseMapTask(_Task):
    """Probability maps (text or object detection, segmentation), binarized at a threshold."""

    kind: Literal["dense_map"]
    threshold: float = Field(
        default=0.5, description="A value above this is foreground (a probability, or a logit)."
    )
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "iou", "reference", True, "mean IoU of the variant's mask with the reference's mask"
        ),
        TaskMetric("label_iou", "labels", True, "mean IoU of the mask with the label masks"),
    )


class CtcTask(_Task):
    """Sequence recognition with CTC: greedy decoding over a character list."""

    kind: Literal["ctc"]
    charset: PinnedFile = Field(
        description="UTF-8 text file, one character per line, in class order (the blank "
        "class is not listed)."
    )
    blank: int = Field(default=0, ge=0, description="Index of the CTC blank class.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "line_match",
            "reference",
            True,
            "share of lines decoded exactly as the reference decodes them",
        ),
        TaskMetric(
            "cer", "reference", False, "character error rate against the reference's decoding"
        ),
        TaskMetric(
            "label_line_accuracy", "labels", True, "share of lines decoded exactly as labelled"
        ),
        TaskMetric("label_cer", "labels", False, "character error rate against the labels"),
    )


class EmbeddingTask(_Task):
    """Embeddings compared by cosine: agreement and nearest neighbours over the set."""

    kind: Literal["embedding"]
    k: int = Field(default=5, ge=1, description="Neighbours considered by neighbour_recall.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "embedding_cosine",
            "reference",
            True,
            "worst cosine similarity of an embedding with the reference's",
        ),
        TaskMetric(
            "neighbour_agreement",
            "reference",
            True,
            "share of samples whose nearest "
            "neighbour in the set is the reference's nearest neighbour",
        ),
        TaskMetric(
            "neighbour_recall",
            "reference",
            True,
            "share of samples whose reference nearest neighbour is among the variant's k nearest",
        ),
        TaskMetric(
            "label_neighbour_accuracy",
            "labels",
            True,
            "share of samples whose nearest neighbour has the same label",
        ),
    )


class FrameDecisionTask(_Task):
    """Binary decisions per frame or chunk (voice activity, wake word) at a threshold."""

    kind: Literal["frame_decision"]
    threshold: float = Field(default=0.5, description="A score above this is a positive frame.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "frame_agreement",
            "reference",
            True,
            "share of frames decided as the reference decides them",
        ),
        TaskMetric("f1", "labels", True, "F1 of the positive frames against the labels"),
    )


class GenericTask(_Task):
    """No task metric: output agreement only."""

    kind: Literal["generic"]


class CustomTask(_Task):
    """Metrics from the team's own evaluator, ``module:function`` in their repository."""

    kind: Literal["custom"]
    evaluator: Annotated[
        str,
        StringConstraints(
            pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:"
            r"[A-Za-z_][A-Za-z0-9_]*$"
        ),
    ] = Field(description="module:function, imported with the models.toml directory on sys.path.")

    def metric(self, name: str) -> TaskMetric | None:
        """Any name: the evaluator says what it measures when it runs.

        Its metrics have no fp32 baseline, so only ``min`` and ``max`` apply.
        """
        return TaskMetric(name, "reference", True, "")


def _task_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


Task = Annotated[
    Union[  # noqa: UP007
        ClassificationTask,
        DenseMapTask,
        CtcTask,
        EmbeddingTask,
        FrameDecisionTask,
        GenericTask,
        CustomTask,
    ],
    BeforeValidator(_task_shorthand),
    Field(discriminator="kind"),
]
TASK_KINDS = (
    "classification",
    "dense_map",
    "ctc",
    "embedding",
    "frame_decision",
    "generic",
    "custom",
)


class NoQuantization(_Strict):
    """Keep weights and activations in float."""

    mode: Literal["none"] = "none"


class WeightOnlyQuantization(_Strict):
    """Weight-only quantization through the converter; activations stay float."""

    mode: Literal["weight"]
    bits: int = Field(default=8, ge=2, le=8)
    block: int | None = Field(default=None, ge=0, description="Block size; per channel when unset.")
    asymmetric: bool = True


class Int8Quantization(_Strict):
    """Full int8 post-training quantization calibrated on the calibration set."""

    mode: Literal["int8"]
    method: Literal["KL", "ADMM", "EMA", "auto"] = Field(
        default="KL",
        description='Feature method; "auto" tries KL, EMA and ADMM, keeps the best that passes '
        "the gates and, when none does, keeps the worst layers in float until one does "
        "(recorded in provenance).",
    )
    max_skip_ops: int = Field(
        default=4,
        ge=0,
        le=32,
        description='"auto" only: at most this many layers kept in float by the search.',
    )
    weight_method: Literal["MAX_ABS", "ADMM"] = "MAX_ABS"
    skip_ops: list[str] = Field(
        default_factory=list, description="Layer names kept in float (skip_quant_op_names)."
    )
    samples: int | None = Field(
        default=None, ge=1, description="Calibration samples; overrides the set's own count."
    )


Quantization = Annotated[
    Union[NoQuantization, WeightOnlyQuantization, Int8Quantization],  # noqa: UP007
    Field(discriminator="mode"),
]


class ConverterOptions(_Strict):
    """MNN converter settings beyond precision and quantization."""

    transformer_fuse: bool = False
    optimize_prefer: Literal[0, 1, 2] | None = None


class Variant(_Strict):
    """One build of a model for one device tier."""

    tier: Name
    precision: Literal["fp32", "fp16"] = "fp32"
    quantization: Quantization = Field(default_factory=NoQuantization)
    converter: ConverterOptions = Field(default_factory=ConverterOptions)
    runtime: RuntimeHints = Field(default_factory=RuntimeHints)
    budgets: Budgets | None = None
    source: PinnedFile | None = Field(
        default=None, description="A different ONNX for this tier (pruned, distilled)."
    )
    inputs: list[InputSpec] | None = Field(
        default=None, description="Input shapes of this variant's own source."
    )
    calibration: CalibrationSet | None = None
    evaluation: PinnedFile | None = None
    min_mnn_runtime: (
        Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] | None
    ) = Field(
        default=None,
        description="This variant's own minimum MNN runtime, when the proof of "
        "[toolchain] min_mnn_runtime fails for it (an int8 kernel that an older runtime "
        "computes differently); between that and `mnn`.",
    )

    @model_validator(mode="after")
    def _precision_and_quantization(self) -> Variant:
        if self.precision == "fp16" and self.quantization.mode != "none":
            raise _rule_error(
                "precision",
                'precision = "fp16" cannot be combined with quantization; '
                'use precision = "fp32" with a quantization mode',
            )
        if self.inputs is not None and self.source is None:
            raise _rule_error("inputs", "inputs may only be overridden together with source")
        return self


class Model(_Strict):
    """One model: its source, data, budgets and variants."""

    version: SemVer
    task: Task = Field(
        default_factory=lambda: ClassificationTask(kind="classification"),
        description='What the model computes and how it is scored: "classification", '
        '"dense_map", "ctc", "embedding", "frame_decision", "generic", or a table '
        "{ kind = ..., ... } with the task's settings.",
    )
    description: str = ""
    source: PinnedFile
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    state: list[StatePair] = Field(
        default_factory=list,
        description="Recurrent state pairs: the model is verified and evaluated as a stream, "
        "each sequence feeding back the variant's own state.",
    )
    classes: list[str] | None = Field(default=None, description="Class names, index order.")
    calibration: CalibrationSet | None = None
    evaluation: PinnedFile
    budgets: Budgets = Field(default_factory=Budgets)
    rollout: RolloutPolicy | None = Field(
        default=None, description="This model's rollout policy; the global one when unset."
    )
    requires: Requirements | None = Field(
        default=None,
        description="App and OS versions every release of this model needs; devices outside "
        "them keep what they have (or stable).",
    )
    variants: dict[Name, Variant] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> Model:
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            names = [spec.name for spec in specs]
            if len(set(names)) != len(names):
                raise _rule_error(f"{kind}s", f"{kind} names must be unique, got {names}")
        input_names = [spec.name for spec in self.inputs]
        output_names = [spec.name for spec in self.outputs]
        for index, pair in enumerate(self.state):
            if pair.input not in input_names:
                raise _rule_error(
                    f"state.{index}.input",
                    f"'{pair.input}' is not a declared input (inputs: {', '.join(input_names)})",
                )
            if pair.output not in output_names:
                raise _rule_error(
                    f"state.{index}.output",
                    f"'{pair.output}' is not a declared output "
                    f"(outputs: {', '.join(output_names)})",
                )
        fed = [pair.input for pair in self.state]
        if len(set(fed)) != len(fed) or len({p.output for p in self.state}) != len(fed):
            raise _rule_error("state", "each state input and output may appear in one pair")
        task_output = self.task.output
        if task_output is not None and task_output not in output_names:
            raise _rule_error(
                "task.output",
                f"'{task_output}' is not a declared output (outputs: {', '.join(output_names)})",
            )
        if task_output is not None and task_output in {p.output for p in self.state}:
            raise _rule_error("task.output", f"'{task_output}' is a state output")
        if self.classes is not None and self.task.kind != "classification":
            raise _rule_error("classes", 'classes apply to task = "classification" only')
        self._check_budgets(self.budgets, "budgets")
        for name, variant in self.variants.items():
            if variant.budgets is not None:
                self._check_budgets(variant.budgets, f"variants.{name}.budgets")
        return self

    def _check_budgets(self, budgets: Budgets, where: str) -> None:
        for metric_name, limits in budgets.metrics.items():
            metric = self.task.metric(metric_name)
            if metric is None:
                known = ", ".join(m.name for m in self.task.METRICS) or "none"
                raise _rule_error(
                    f"{where}.metrics.{metric_name}",
                    f"task '{self.task.kind}' does not measure '{metric_name}'; "
                    f"its metrics: {known}",
                )
            label_only = ("max_drop", "min_baseline", "max_baseline")
            used = [key for key in label_only if getattr(limits, key) is not None]
            if metric.against == "reference" and used:
                raise _rule_error(
                    f"{where}.metrics.{metric_name}.{used[0]}",
                    f"'{metric_name}' compares the variant with the reference itself, so it has "
                    f"no baseline; use min or max",
                )
            wrong_way = "min_baseline" if not metric.higher_is_better else "max_baseline"
            if getattr(limits, wrong_way) is not None and self.task.kind != "custom":
                right = "max_baseline" if wrong_way == "min_baseline" else "min_baseline"
                raise _rule_error(
                    f"{where}.metrics.{metric_name}.{wrong_way}",
                    f"'{metric_name}' is {'higher' if metric.higher_is_better else 'lower'}"
                    f" is better; use {right}",
                )

    @property
    def task_output(self) -> str:
        """The output the task's metric reads."""
        return self.task.output or next(
            spec.name for spec in self.outputs if spec.name not in {p.output for p in self.state}
        )


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


class RateGuardrail(_Strict):
    """A failure rate the candidate arm may not raise above the stable arm's."""

    max_increase: float = Field(
        default=0.01,
        ge=0,
        le=1,
        description="Largest allowed candidate rate minus stable rate (0.01 = one point).",
    )
    critical: bool = Field(
        default=True, description="A failure pauses the rollout (and rolls back by policy)."
    )


class LatencyGuardrail(_Strict):
    """A latency the candidate arm may not shift above the stable arm's."""

    max_increase_pct: float = Field(
        default=10.0,
        ge=0,
        description="Largest allowed Hodges-Lehmann shift, in percent of the stable median.",
    )
    critical: bool = Field(default=False, description="A failure pauses the rollout.")


class Guardrails(_Strict):
    """What the canary analysis checks and automatic rollouts act on, per tier."""

    # Above 0.5 a one-sided test could call identical arms different.
    alpha: float = Field(
        default=0.05,
        gt=0,
        le=0.5,
        description="Significance level of each one-sided test (the intervals shown are "
        "two-sided at 1 - 2 alpha: 90% by default).",
    )
    min_devices: int = Field(
        default=50,
        ge=1,
        description="Reports needed in each arm of a tier before a guardrail can pass "
        "(a clear failure needs no minimum).",
    )
    probe_failure: RateGuardrail = Field(
        default_factory=RateGuardrail,
        description="Devices whose self-test failed on every backend (the model was rejected).",
    )
    load_failure: RateGuardrail = Field(
        default_factory=RateGuardrail, description="Devices where loading the model failed."
    )
    revert: RateGuardrail = Field(
        default_factory=RateGuardrail,
        description="Devices that reverted the model (not confirmed after the declared app "
        "starts: a crash loop).",
    )
    load_ms: LatencyGuardrail = Field(
        default_factory=LatencyGuardrail, description="Model load time, one value per device."
    )
    inference_ms: LatencyGuardrail = Field(
        default_factory=LatencyGuardrail,
        description="Each device's median inference time over the app's real calls.",
    )
    rollback_on_critical: bool = Field(
        default=True,
        description="When a critical guardrail fails, an automatic rollout rolls back (else "
        "it only pauses).",
    )


class RolloutPolicy(_Strict):
    """How a candidate moves from canary to everyone."""

    steps: list[Annotated[float, Field(gt=0, le=100)]] = Field(
        default_factory=lambda: [5.0, 25.0, 50.0, 100.0],
        min_length=1,
        description="Percentages `edgereg rollout --next` moves through, ending at 100.",
    )
    min_soak_hours: float = Field(
        default=24.0, ge=0, description="Minimum time at one step before the next."
    )
    guardrails: Guardrails = Field(
        default_factory=Guardrails,
        description="Canary analysis limits: what automatic rollouts act on.",
    )

    @field_validator("steps")
    @classmethod
    def _increasing(cls, value: list[float]) -> list[float]:
        if any(b <= a for a, b in itertools.pairwise(value)):
            raise ValueError(f"steps must increase strictly, got {value}")
        if value[-1] != 100:
            raise ValueError(f"steps must end at 100, got {value}")
        return value


class Bundle(_Strict):
    """Models that ship together: one version, one rollout, installed as one set."""

    version: SemVer
    models: list[Name] = Field(
        min_length=1, description="The member models, each declared under [models]."
    )
    description: str = ""
    requires: Requirements | None = Field(
        default=None, description="App and OS versions the bundle needs, beyond its members'."
    )
    rollout: RolloutPolicy | None = Field(
        default=None, description="This bundle's rollout policy; the global one when unset."
    )

    @field_validator("models")
    @classmethod
    def _unique_members(cls, value: list[str]) -> list[str]:
        repeated = sorted({name for name in value if value.count(name) > 1})
        if repeated:
            raise ValueError(f"each model may appear once; repeated: {', '.join(repeated)}")
        return value


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


class Config(_Strict):
    """The whole models.toml."""

    toolchain: Toolchain
    registry: Registry = Field(default_factory=Registry)
    rollout: RolloutPolicy = Field(
        default_factory=RolloutPolicy, description="Default rollout policy of every model."
    )
    tiers: dict[Name, TierRules] = Field(
        min_length=1, description="Device tiers, best first; the last one is the catch-all."
    )
    models: dict[Name, Model] = Field(
        default_factory=dict,
        description="The models to build; none yet right after `edgereg init`.",
    )
    bundles: dict[Name, Bundle] = Field(
        default_factory=dict,
        description="Models that ship together as one unit (one version, one rollout).",
    )
    reports: Reports = Field(default_factory=Reports)

    _path: Path = PrivateAttr(default=Path(DEFAULT_CONFIG_FILE))

    @model_validator(mode="after")
    def _tiers_and_variants(self) -> Config:
        tier_names = list(self.tiers)
        *upper, last = tier_names
        if not self.tiers[last].is_catch_all:
            raise _rule_error(
                f"tiers.{last}",
                f"the last tier ('{last}') must be a catch-all with no rules, so every "
                "device gets a tier; add an empty [tiers.<name>] table at the end",
            )
        for name in upper:
            if self.tiers[name].is_catch_all:
                raise _rule_error(
                    f"tiers.{name}",
                    f"tier '{name}' has no rules, so it catches every device and the "
                    "tiers after it can never match; give it rules or move it last",
                )
        for model_name, model in self.models.items():
            by_tier: dict[str, str] = {}
            for variant_name, variant in model.variants.items():
                where = f"models.{model_name}.variants.{variant_name}"
                if variant.tier not in self.tiers:
                    raise _rule_error(
                        f"{where}.tier",
                        f"unknown tier '{variant.tier}'; declared tiers: {', '.join(tier_names)}",
                    )
                if variant.tier in by_tier:
                    raise _rule_error(
                        f"{where}.tier",
                        f"tier '{variant.tier}' already has variant "
                        f"'{by_tier[variant.tier]}'; each tier takes exactly one variant "
                        "of a model",
                    )
                by_tier[variant.tier] = variant_name
                own = variant.min_mnn_runtime
                release = Toolchain._release
                if own is not None and not (
                    release(self.toolchain.minimum_runtime)
                    <= release(own)
                    <= release(self.toolchain.mnn)
                ):
                    raise _rule_error(
                        f"{where}.min_mnn_runtime",
                        f"{own} is outside {self.toolchain.minimum_runtime} (the toolchain's "
                        f"min_mnn_runtime) .. {self.toolchain.mnn} (the converter)",
                    )
                needs_calibration = variant.quantization.mode == "int8"
                if needs_calibration and variant.calibration is None and model.calibration is None:
                    raise _rule_error(
                        f"{where}.quantization",
                        "int8 quantization needs a calibration set; "
                        f"add [models.{model_name}.calibration] with path and sha256",
                    )
            if last not in by_tier:
                raise _rule_error(
                    f"models.{model_name}.variants",
                    f"no variant for the catch-all tier '{last}', so "
                    "devices there would get no model; add a variant with "
                    f'tier = "{last}" (lower tiers have no tier below to fall back to)',
                )
        self._check_bundles()
        return self

    def _check_bundles(self) -> None:
        member_of: dict[str, str] = {}
        for bundle_name, bundle in self.bundles.items():
            if bundle_name in self.models:
                raise _rule_error(
                    f"bundles.{bundle_name}",
                    f"'{bundle_name}' is also a model; bundles and models share one namespace "
                    "in the registry, so give the bundle another name",
                )
            for index, member in enumerate(bundle.models):
                if member not in self.models:
                    known = ", ".join(self.models) or "none"
                    raise _rule_error(
                        f"bundles.{bundle_name}.models.{index}",
                        f"unknown model '{member}'; models: {known}",
                    )
                if member in member_of:
                    raise _rule_error(
                        f"bundles.{bundle_name}.models.{index}",
                        f"model '{member}' is already in bundle '{member_of[member]}'; a model "
                        "ships in at most one bundle (one rollout decides what devices run)",
                    )
                member_of[member] = bundle_name

    def bundle_of(self, model_name: str) -> str | None:
        """The bundle a model ships in, or None when it ships on its own."""
        for bundle_name, bundle in self.bundles.items():
            if model_name in bundle.models:
                return bundle_name
        return None

    @property
    def path(self) -> Path:
        """The models.toml this configuration was loaded from."""
        return self._path

    @property
    def root(self) -> Path:
        """The directory relative paths in the file are resolved against."""
        return self._path.parent

    def rollout_policy(self, model_name: str) -> RolloutPolicy:
        """The rollout policy of a model: its own, else the global one.

        A model published from elsewhere (not in this file) gets the global one.
        """
        unit = self.models.get(model_name) or self.bundles.get(model_name)
        return (unit.rollout if unit is not None else None) or self.rollout

    def trusted_key_paths(self) -> list[Path]:
        """The files and directories ``[registry] trusted_keys`` names, resolved."""
        paths = []
        for entry in self.registry.trusted_keys:
            path = Path(entry.removeprefix("file://"))
            paths.append(path if path.is_absolute() else self.root / path)
        return paths

    def resolve_path(self, ref: PinnedFile) -> Path:
        """Return the local path a pinned file refers to."""
        raw = ref.path.removeprefix("file://")
        path = Path(raw)
        return path if path.is_absolute() else self.root / path

    def tier_variants(self, model_name: str) -> dict[str, tuple[str, bool]]:
        """Map every tier to the variant its devices get.

        Returns:
            tier name -> (variant name, True when the tier falls back to the
            variant of a lower tier because it has none of its own).
        """
        model = self.models[model_name]
        own = {variant.tier: name for name, variant in model.variants.items()}
        result: dict[str, tuple[str, bool]] = {}
        fallback: str | None = None
        for tier in reversed(list(self.tiers)):
            if tier in own:
                fallback = own[tier]
                result[tier] = (fallback, False)
            else:
                assert fallback is not None  # the catch-all always has a variant
                result[tier] = (fallback, True)
        return {tier: result[tier] for tier in self.tiers}

    def notes(self) -> list[str]:
        """Things worth knowing that are not errors (no models yet, tier fallbacks)."""
        if not self.models:
            return [NO_MODELS_NOTE]
        notes = []
        for model_name, model in self.models.items():
            specs = [("", model.inputs)] + [
                (f"variants.{name}.", variant.inputs)
                for name, variant in model.variants.items()
                if variant.inputs is not None
            ]
            for prefix, inputs in specs:
                for index, spec in enumerate(inputs):
                    if spec.kind == "image" and (spec.mean is None or spec.std is None):
                        missing = " and ".join(
                            k for k in ("mean", "std") if getattr(spec, k) is None
                        )
                        notes.append(
                            f"warning: models.{model_name}.{prefix}inputs.{index} "
                            f"('{spec.name}'): image input without {missing}: pixels reach "
                            "the model as 0..255; if it was trained on normalised images, "
                            "declare the mean and std it was trained with"
                        )
            for tier, (variant, fell_back) in self.tier_variants(model_name).items():
                if fell_back:
                    notes.append(
                        f"models.{model_name}: tier '{tier}' has no variant of its own and "
                        f"falls back to '{variant}' (the variant of the next lower tier)"
                    )
        return notes

    def minimum_runtime(self, model_name: str, variant_name: str) -> str:
        """The MNN runtime a variant must be proven on: its own, else the toolchain's."""
        own = self.models[model_name].variants[variant_name].min_mnn_runtime
        return own or self.toolchain.minimum_runtime

    def recipe(self, model_name: str, variant_name: str) -> dict[str, Any]:
        """Everything that determines a variant's bytes and gates, resolved.

        Model-level settings are merged with the variant's overrides, so two
        variants with the same recipe build the same artifact.
        """
        model = self.models[model_name]
        variant = model.variants[variant_name]
        # Only int8 reads the calibration set; keeping it out of the other recipes
        # keeps their bytes (the id derives from this digest) in step with dvc.yaml,
        # which does not rerun them when the set changes.
        calibration = (
            variant.calibration or model.calibration
            if variant.quantization.mode == "int8"
            else None
        )
        return {
            "model": model_name,
            "variant": variant_name,
            "task": model.task.model_dump(),
            "state": [pair.model_dump() for pair in model.state],
            "source": (variant.source or model.source).model_dump(),
            "inputs": [spec.model_dump() for spec in (variant.inputs or model.inputs)],
            "outputs": [spec.model_dump() for spec in model.outputs],
            "calibration": calibration.model_dump() if calibration else None,
            "evaluation": (variant.evaluation or model.evaluation).model_dump(),
            "precision": variant.precision,
            "quantization": variant.quantization.model_dump(),
            "converter": variant.converter.model_dump(),
            "runtime": variant.runtime.model_dump(),
            "budgets": model.budgets.merged(variant.budgets).model_dump(),
            "toolchain": self.toolchain.model_dump(),
        }

    def recipe_digest(self, model_name: str, variant_name: str) -> str:
        """sha256 of the canonical JSON of :meth:`recipe`."""
        canonical = json.dumps(
            self.recipe(model_name, variant_name), sort_keys=True, separators=(",", ":")
        )
        return hashlib.sha256(canonical.encode()).hexdigest()


def load(path: str | Path = DEFAULT_CONFIG_FILE) -> Config:
    """Read and validate a models.toml.

    Raises:
        ConfigError: the file is missing, is not TOML, or breaks the schema;
            the message names the file, the key path and what is allowed.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(
            "file not found",
            file=str(path),
            hint="Run edgereg inside the project (it looks for models.toml here and in the "
            "parent folders up to the repository root), pass --config PATH, or create one "
            "with `edgereg init`.",
        ) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read: {exc}", file=str(path)) from exc
    return parse(text, file=str(path))


def parse(text: str, *, file: str = DEFAULT_CONFIG_FILE) -> Config:
    """Validate the text of a models.toml; ``file`` is used in errors and paths."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(
            f"not valid TOML: {exc}",
            file=file,
            hint="Fix the syntax at the line and column shown.",
        ) from exc
    try:
        config = Config.model_validate(data)
    except ValidationError as exc:
        raise _config_error(exc, data, file) from exc
    config._path = Path(file)
    return config


def json_schema() -> dict[str, Any]:
    """The JSON Schema of models.toml, for editors and the reference docs."""
    schema = Config.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "edgereg models.toml"
    _forbid_unnamed_keys(schema)
    # `task = "dense_map"` is shorthand for `task = { kind = "dense_map" }` (the
    # loader's BeforeValidator); the schema says so too, for the kinds that need
    # no settings.
    task = schema["$defs"]["Model"]["properties"]["task"]
    described = {key: task.pop(key) for key in ("description", "title") if key in task}
    shorthand = [kind for kind in TASK_KINDS if kind not in ("ctc", "custom")]
    schema["$defs"]["Model"]["properties"]["task"] = {
        **described,
        "anyOf": [{"type": "string", "enum": shorthand}, task],
    }
    return schema


def _forbid_unnamed_keys(node: Any) -> None:
    """Make tables keyed by names (tiers, models, variants) reject keys that are not names.

    pydantic describes them with ``patternProperties`` only, which lets any
    other key through; the loader rejects those, so the schema should too.
    """
    if isinstance(node, dict):
        if "patternProperties" in node:
            node.setdefault("additionalProperties", False)
        for value in node.values():
            _forbid_unnamed_keys(value)
    elif isinstance(node, list):
        for value in node:
            _forbid_unnamed_keys(value)


def _config_error(exc: ValidationError, data: Mapping[str, Any], file: str) -> ConfigError:
    problems = []
    for error in exc.errors():
        key_path = _key_path(error["loc"], data)
        if error["type"] == _RULE_ERROR:
            key_path = ".".join(part for part in (key_path, error["ctx"]["key"]) if part)
        elif error["type"] in ("union_tag_invalid", "union_tag_not_found"):
            tag_key = error["ctx"]["discriminator"].strip("'")
            key_path = ".".join(part for part in (key_path, tag_key) if part)
        problems.append((key_path, _describe(error, key_path, data)))
    if len(problems) == 1:
        key_path, message = problems[0]
        return ConfigError(message, file=file, key_path=key_path or None)
    body = "\n".join(f"  {key or '(top level)'}: {message}" for key, message in problems)
    return ConfigError(f"{len(problems)} problems\n{body}", file=file)


def _key_path(loc: tuple[int | str, ...], data: Any) -> str:
    """Turn a pydantic error location into the dotted path a user wrote.

    Union tags and validator names that pydantic puts into locations are not
    keys of the document; walking the document alongside drops them.
    """
    parts: list[str] = []
    node = data
    for item in loc:
        if item == "[key]":
            # pydantic's marker for a dict key that failed validation: the key
            # itself, already in the path, is what is wrong.
            continue
        if isinstance(node, Mapping) and isinstance(item, str) and item in node:
            node = node[item]
            parts.append(item)
        elif isinstance(node, list) and isinstance(item, int) and 0 <= item < len(node):
            node = node[item]
            parts.append(str(item))
        elif (
            isinstance(node, Mapping)
            and isinstance(item, str)
            and parts[-1:] != [item]
            and item == loc[-1]
        ):
            # A missing or unknown key: the last element names it.
            parts.append(item)
    return ".".join(parts)


#: Keys of earlier releases and where their setting lives now.
MOVED_KEYS = {
    "max_accuracy_drop": "write metrics.accuracy = { max_drop = N } in the budgets table",
    "max_class_recall_drop": "write metrics.class_recall_drop = { max = N } in the budgets table",
}


def _describe(error: Any, key_path: str, data: Mapping[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden" and key_path.rsplit(".", 1)[-1] in MOVED_KEYS:
        return f"this key moved: {MOVED_KEYS[key_path.rsplit('.', 1)[-1]]}"
    if kind == "extra_forbidden":
        allowed = _allowed_keys(key_path.split(".")[:-1], data)
        listed = ", ".join(allowed) if allowed else "none"
        return f"unknown key; allowed keys here: {listed}"
    if kind == "missing":
        return "required key is missing"
    if kind == "union_tag_invalid":
        ctx = error["ctx"]
        key = ctx["discriminator"].strip("'")
        return f"unknown {key} '{ctx['tag']}'; allowed: {ctx['expected_tags']}"
    if kind == "union_tag_not_found":
        tags = ", ".join(repr(tag) for tag in _union_tags(key_path.split(".")[:-1], data))
        return f"required key is missing; allowed: {tags}"
    if kind == "string_pattern_mismatch":
        pattern = error.get("ctx", {}).get("pattern", "")
        if "0-9a-f]{64}" in pattern:
            return "must be a sha256: 64 lowercase hex characters (run `sha256sum FILE`)"
        if "a-z0-9_-" in pattern:
            return f"'{error['input']}' is not a valid name: {NAME_RULE}"
        if key_path.endswith(".evaluator"):
            return (
                f"'{error['input']}' is not module:function (a dotted module path, a colon, "
                "a function name, e.g. 'evals.ocr:score')"
            )
        return f"'{error['input']}' is not a version like 3.6.1"
    message = str(error["msg"])
    return message.removeprefix("Value error, ")


def _allowed_keys(parts: list[str], data: Mapping[str, Any]) -> list[str]:
    """Keys the schema allows at a dotted path (for 'unknown key' errors)."""
    node = _annotation_at(parts, data)
    if node is None:
        return []
    node = _unwrap(node)
    if typing.get_origin(node) in (Union, types.UnionType):
        # A tagged union whose tag is missing or unknown: any member's keys.
        members = typing.get_args(node)
        return list(dict.fromkeys(key for member in members for key in member.model_fields))
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _union_tags(parts: list[str], data: Mapping[str, Any]) -> list[str]:
    """The values of the tag key a tagged union at a dotted path accepts."""
    node = _unwrap(_annotation_at(parts, data))
    tags: list[str] = []
    if typing.get_origin(node) in (Union, types.UnionType):
        for member in typing.get_args(node):
            field = member.model_fields.get("mode")
            if field is not None:
                tags.extend(typing.get_args(field.annotation))
    return tags


def _annotation_at(parts: list[str], data: Any) -> Any:
    """The schema annotation at a dotted path, or None when the schema has no such key.

    The document is walked alongside, so a tagged union resolves to the member
    its tag (``mode``) selects.
    """
    node: Any = Config
    for part in parts:
        if isinstance(data, Mapping):
            data = data.get(part)
        elif isinstance(data, list) and part.isdigit() and int(part) < len(data):
            data = data[int(part)]
        else:
            data = None
        node = _step(node, part)
        if node is None:
            return None
        node = _select_member(node, data)
    return node


def _select_member(annotation: Any, value: Any) -> Any:
    """For a tagged union, the member whose ``mode`` literal matches ``value``."""
    node = _unwrap(annotation)
    if typing.get_origin(node) not in (Union, types.UnionType) or not isinstance(value, Mapping):
        return annotation
    for member in typing.get_args(node):
        field = getattr(member, "model_fields", {}).get("mode")
        if field is not None and value.get("mode") in typing.get_args(field.annotation):
            return member
    return annotation


def _unwrap(annotation: Any) -> Any:
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    origin = typing.get_origin(annotation)
    if origin in (Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return _unwrap(args[0])
    return annotation


def _step(node: Any, part: str) -> Any:
    node = _unwrap(node)
    origin = typing.get_origin(node)
    if origin is dict:
        return typing.get_args(node)[1]
    if origin is list:
        return typing.get_args(node)[0] if part.isdigit() else None
    if origin in (Union, types.UnionType):
        # A tagged union (quantization): the tag picks the member.
        for member in typing.get_args(node):
            field = getattr(member, "model_fields", {}).get(part)
            if field is not None:
                return field.annotation
        return None
    if isinstance(node, type) and issubclass(node, BaseModel):
        field = node.model_fields.get(part)
        return field.annotation if field else None
    return None
