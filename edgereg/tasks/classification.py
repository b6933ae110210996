"""Classification: scores over classes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class ClassificationTask(TaskConfig):
    """Scores over classes: top-1 agreement, accuracy and per-class recall."""

    kind: Literal["classification"]
    NAMED_CLASSES: ClassVar[bool] = True
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "top1_agreement",
            "reference",
            True,
            "share of samples whose top-1 class is the reference's",
            label="top-1 agreement",
            percent=True,
        ),
        TaskMetric("accuracy", "labels", True, "top-1 accuracy", label="accuracy", percent=True),
        TaskMetric(
            "class_recall_drop",
            "labels",
            False,
            "the worst class's recall loss against the baseline (gate it with max)",
            (-1.0, 1.0),
            label="worst class recall drop",
            percent=True,
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "top1_agreement", 0.99, 0.98, 0.95, 0.95
    )
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ("accuracy",)
    HEADLINE: ClassVar[tuple[str, ...]] = ("accuracy", "top1_agreement")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.classification_eval"
    NEEDS_LABELS: ClassVar[bool] = True
    CLASS_RECALL: ClassVar[bool] = True
    PURPOSE: ClassVar[str] = "scores over classes; labels required"
    LABELS: ClassVar[tuple[str, str]] = (
        "class id per sample, integers",
        "`(N,)` int64",
    )
