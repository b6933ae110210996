"""Dense maps: probability maps binarized at a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class DenseMapTask(TaskConfig):
    """Probability maps (text or object detection, segmentation), binarized at a threshold."""

    kind: Literal["dense_map"]
    threshold: float = Field(
        default=0.5, description="A value above this is foreground (a probability, or a logit)."
    )
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "iou",
            "reference",
            True,
            "mean IoU of the variant's mask (map > `threshold`) with the reference's mask",
            label="IoU",
            percent=True,
        ),
        TaskMetric(
            "label_iou",
            "labels",
            True,
            "mean IoU of the variant's mask with the label masks",
            label="IoU (labels)",
            percent=True,
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "iou", 0.98, 0.95, 0.9, 0.85
    )
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ("label_iou",)
    HEADLINE: ClassVar[tuple[str, ...]] = ("label_iou", "iou")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.dense_map_eval"
    PURPOSE: ClassVar[str] = "text or object detection probability maps, binary masks"
    LABELS: ClassVar[tuple[str, str]] = (
        "a mask shaped like one output row, 0/1 (anything > 0 is foreground)",
        "`(N, 1, 64, 64)` uint8 for an output `[1, 1, 64, 64]`",
    )
