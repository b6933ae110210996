"""Semantic segmentation: a class per pixel."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric


def _limits(mean: float, worst: float) -> dict[str, MetricBudget]:
    # The mean like dense_map's IoU; every class, the tail too, like a classifier's
    # per-class recall; and on labels no class may lose more than a tenth of its IoU.
    return {
        "mean_iou": MetricBudget(min=mean),
        "min_class_iou": MetricBudget(min=worst),
        "class_iou_drop": MetricBudget(max=0.1),
    }


class SegmentationTask(TaskConfig):
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
            "mean over classes of the IoU of the variant's class map (highest score per pixel) "
            "with the reference's",
            percent=True,
        ),
        TaskMetric(
            "min_class_iou",
            "reference",
            True,
            "the worst class's IoU with the reference's class map: a tail class the mean hides",
        ),
        TaskMetric(
            "label_mean_iou",
            "labels",
            True,
            "mean over the labelled classes of the IoU with the label masks",
            percent=True,
        ),
        TaskMetric(
            "class_iou_drop",
            "labels",
            False,
            "the worst class's IoU loss on the labels against the baseline (gate it with max)",
            (-1.0, 1.0),
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = {
        "fp32": _limits(0.98, 0.95),
        "fp16": _limits(0.95, 0.9),
        "weight": _limits(0.9, 0.8),
        "int8": _limits(0.85, 0.7),
    }
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ("label_mean_iou",)
    HEADLINE: ClassVar[tuple[str, ...]] = ("label_mean_iou", "mean_iou")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.segmentation_eval"
    PURPOSE: ClassVar[str] = "a class per pixel (semantic segmentation)"
    LABELS: ClassVar[tuple[str, str]] = (
        "a class index per pixel, shaped like the output's class map",
        "`(N, 512, 512)` uint8 for an output `[1, 4, 512, 512]`",
    )
