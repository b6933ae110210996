"""Frame decisions: a yes/no per frame or chunk at a threshold."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from edgereg.tasks._spec import TaskMetric, _Task


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
