"""Tasks: what a model computes and which metrics score it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, ClassVar, Literal, Union

from pydantic import BeforeValidator, Field, StringConstraints

from edgereg.config._base import _Strict
from edgereg.config._inputs import PinnedFile


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
        bounds: The values the metric can take, so a budget outside them (a
            gate that can never fail, or never pass) is a configuration error.
            None for a custom evaluator's metric, whose range edgereg does not know.
    """

    name: str
    against: Literal["reference", "labels"]
    higher_is_better: bool
    description: str
    bounds: tuple[float, float] | None = (0.0, 1.0)


class _Task(_Strict):
    output: str | None = Field(
        default=None,
        description="The output the metric reads; the first output that is not a state output "
        "when unset.",
    )

    #: What the task measures; a custom evaluator names its own.
    METRICS: ClassVar[tuple[TaskMetric, ...]] = ()
    #: Whether the model's ``classes`` names what the output scores (one per class).
    NAMED_CLASSES: ClassVar[bool] = False

    def metric(self, name: str) -> TaskMetric | None:
        """The metric called ``name``, or None when the task does not measure it."""
        return next((metric for metric in self.METRICS if metric.name == name), None)


class ClassificationTask(_Task):
    """Scores over classes: top-1 agreement, accuracy and per-class recall."""

    kind: Literal["classification"]
    NAMED_CLASSES: ClassVar[bool] = True
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
            (-1.0, 1.0),
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


class SegmentationTask(_Task):
    """A class per pixel (semantic segmentation): IoU per class, its mean and its worst."""

    kind: Literal["segmentation"]
    NAMED_CLASSES: ClassVar[bool] = True
    class_axis: Literal[0, -1] = Field(
        default=0,
        description="The axis of one sample's output (batch axis removed) that holds the "
        "class scores: 0 for (classes, H, W), -1 for (H, W, classes). A pixel's class is "
        "the one scored highest.",
    )
    ignore_index: int | None = Field(
        default=None,
        ge=0,
        description="A label value that marks pixels no metric counts (unlabelled, void), "
        "such as 255.",
    )
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "mean_iou",
            "reference",
            True,
            "mean over classes of the IoU of the variant's class map with the reference's",
        ),
        TaskMetric(
            "min_class_iou",
            "reference",
            True,
            "the worst class's IoU with the reference's class map: a tail class the mean hides",
        ),
        TaskMetric("label_mean_iou", "labels", True, "mean IoU per class with the label masks"),
        TaskMetric(
            "class_iou_drop",
            "labels",
            False,
            "the worst class's IoU loss on the labels against the baseline (gate it with max)",
            (-1.0, 1.0),
        ),
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
            (-1.0, 1.0),
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
    """Output agreement, and the decoded sequence of a per-step class distribution."""

    kind: Literal["generic"]
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "sequence_agreement",
            "reference",
            True,
            "share of samples whose best class per step, repeats merged, is the reference's "
            "(measured when the output holds a class distribution per step)",
        ),
    )


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
        return TaskMetric(name, "reference", True, "", None)


def _task_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


Task = Annotated[
    Union[  # noqa: UP007
        ClassificationTask,
        DenseMapTask,
        SegmentationTask,
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
    "segmentation",
    "ctc",
    "embedding",
    "frame_decision",
    "generic",
    "custom",
)
