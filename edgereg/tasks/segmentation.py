"""Semantic segmentation: a class per pixel."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgereg.tasks._spec import TaskMetric, _Task


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
