"""Frame decisions: a yes/no per frame or chunk at a threshold."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class FrameDecisionTask(TaskConfig):
    """Binary decisions per frame or chunk (voice activity, wake word) at a threshold."""

    kind: Literal["frame_decision"]
    threshold: float = Field(default=0.5, description="A score above this is a positive frame.")
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "frame_agreement",
            "reference",
            True,
            "share of frames (score > `threshold`) decided as the reference decides them",
            label="frame agreement",
            percent=True,
        ),
        TaskMetric(
            "f1",
            "labels",
            True,
            "F1 of the positive frames against the labels",
            label="F1",
            percent=True,
        ),
    )
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "frame_agreement", 0.99, 0.98, 0.95, 0.95
    )
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ("f1",)
    HEADLINE: ClassVar[tuple[str, ...]] = ("f1", "frame_agreement")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.frame_decision_eval"
    PURPOSE: ClassVar[str] = "a yes/no per frame or chunk: voice activity, wake word"
    LABELS: ClassVar[tuple[str, str]] = (
        "0/1 per decision, shaped like one output row",
        "`(N,)` or `(N, 1)` for one score per chunk",
    )
