"""Classification: scores over classes."""

from __future__ import annotations

from typing import ClassVar, Literal

from edgereg.tasks._spec import TaskMetric, _Task


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
