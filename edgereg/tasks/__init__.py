"""Task kinds: what a model computes and which metrics score it, one module per kind."""

from __future__ import annotations

from typing import Annotated, Any, Union

from pydantic import BeforeValidator, Field

from edgereg.tasks._spec import TaskMetric
from edgereg.tasks.classification import ClassificationTask
from edgereg.tasks.ctc import CtcTask
from edgereg.tasks.custom import CustomTask
from edgereg.tasks.dense_map import DenseMapTask
from edgereg.tasks.embedding import EmbeddingTask
from edgereg.tasks.frame_decision import FrameDecisionTask
from edgereg.tasks.generic import GenericTask
from edgereg.tasks.segmentation import SegmentationTask


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

__all__ = [
    "TASK_KINDS",
    "ClassificationTask",
    "CtcTask",
    "CustomTask",
    "DenseMapTask",
    "EmbeddingTask",
    "FrameDecisionTask",
    "GenericTask",
    "SegmentationTask",
    "Task",
    "TaskMetric",
]
