"""Dense maps: probability maps binarized at a threshold."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgereg.tasks._spec import TaskMetric, _Task


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
