"""Task kinds: what a model computes and how a variant is scored, one spec each.

Each kind is one module, ``edgereg/tasks/<kind>.py``: the table models.toml's
``task`` validates into, whose class constants are the kind's spec (metrics,
default budgets, headline metric, evaluator, labels; see
:class:`~edgereg.tasks._spec.TaskConfig`), and one evaluator module,
``<kind>_eval.py``, whose ``evaluate(task, data)`` scores a variant (numpy,
loaded only by a build). :data:`Task` below is the one list of the kinds;
everything else (the build, the report, ``edgereg add``, the schema and the
docs) reads the specs through :func:`task_class`.

This package loads no numpy: models.toml's schema imports it.
"""

from __future__ import annotations

import importlib
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, Union, cast

from pydantic import BeforeValidator, Field

from edgereg.tasks._spec import PRECISION_CLASSES, PrecisionClass, TaskConfig, TaskMetric
from edgereg.tasks.classification import ClassificationTask
from edgereg.tasks.ctc import CtcTask
from edgereg.tasks.custom import CustomTask
from edgereg.tasks.dense_map import DenseMapTask
from edgereg.tasks.embedding import EmbeddingTask
from edgereg.tasks.frame_decision import FrameDecisionTask
from edgereg.tasks.generic import GenericTask
from edgereg.tasks.regression import RegressionTask
from edgereg.tasks.segmentation import SegmentationTask

if TYPE_CHECKING:
    from edgereg.tasks.scoring import TaskData, TaskScores


def _task_shorthand(value: Any) -> Any:
    return {"kind": value} if isinstance(value, str) else value


# The one list of task kinds, in the order the docs and the schema show them.
Task = Annotated[
    Union[  # noqa: UP007
        ClassificationTask,
        DenseMapTask,
        SegmentationTask,
        CtcTask,
        EmbeddingTask,
        FrameDecisionTask,
        GenericTask,
        RegressionTask,
        CustomTask,
    ],
    BeforeValidator(_task_shorthand),
    Field(discriminator="kind"),
]


def _kind(task_class: type[TaskConfig]) -> str:
    (kind,) = typing.get_args(task_class.model_fields["kind"].annotation)
    return str(kind)


#: Every task kind's class (its table and its spec), by kind.
TASK_CLASSES: dict[str, type[TaskConfig]] = {
    _kind(cls): cls for cls in typing.get_args(typing.get_args(Task)[0])
}
TASK_KINDS = tuple(TASK_CLASSES)


def _needs_no_settings(task_class: type[TaskConfig]) -> bool:
    return not any(
        field.is_required() for name, field in task_class.model_fields.items() if name != "kind"
    )


#: The kinds a bare string may name (``task = "embedding"``): no setting required.
SHORTHAND_KINDS = tuple(kind for kind, cls in TASK_CLASSES.items() if _needs_no_settings(cls))
#: The kinds whose model may list ``classes`` (what the output scores).
NAMED_CLASS_KINDS = tuple(kind for kind, cls in TASK_CLASSES.items() if cls.NAMED_CLASSES)


def task_class(kind: str) -> type[TaskConfig] | None:
    """The class of task kind ``kind`` (a metrics.json's ``task``), or None for an unknown one."""
    return TASK_CLASSES.get(kind)


def task_metrics(kind: str) -> tuple[TaskMetric, ...]:
    """The metrics task kind ``kind`` measures (none for an unknown or custom kind)."""
    found = TASK_CLASSES.get(kind)
    return found.METRICS if found is not None else ()


Evaluator = Callable[[Any, "TaskData"], "TaskScores"]


def evaluator(task: TaskConfig) -> Evaluator:
    """The task's ``evaluate(task, data)``, from its evaluator module (which loads numpy)."""
    module = importlib.import_module(type(task).EVALUATOR)
    return cast(Evaluator, module.evaluate)


__all__ = [
    "NAMED_CLASS_KINDS",
    "PRECISION_CLASSES",
    "SHORTHAND_KINDS",
    "TASK_CLASSES",
    "TASK_KINDS",
    "ClassificationTask",
    "CtcTask",
    "CustomTask",
    "DenseMapTask",
    "EmbeddingTask",
    "Evaluator",
    "FrameDecisionTask",
    "GenericTask",
    "PrecisionClass",
    "SegmentationTask",
    "Task",
    "TaskConfig",
    "TaskMetric",
    "evaluator",
    "task_class",
    "task_metrics",
]
