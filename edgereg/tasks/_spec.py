"""What every task kind declares: its models.toml table and, as class constants, its spec.

A task kind is one class (the table ``task = { kind = ..., ... }`` validates
into) whose constants say everything the rest of edgereg needs to know about
it: the metrics it measures and their direction, its default budgets, the
metric a table shows first, its evaluator, whether it needs labels, and what
the docs say it is for. The build, the report, ``edgereg add`` and the docs
read these constants through :mod:`edgereg.tasks`, never a table keyed by
kind.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Literal

from pydantic import Field

from edgereg.config._base import _Strict
from edgereg.config._budgets import MetricBudget

if TYPE_CHECKING:
    from edgereg.config._inputs import PinnedFile

#: Which defaults a variant gets: fp32 (no quantization), fp16, weight-only, int8.
PrecisionClass = Literal["fp32", "fp16", "weight", "int8"]
PRECISION_CLASSES: tuple[PrecisionClass, ...] = ("fp32", "fp16", "weight", "int8")


@dataclass(frozen=True)
class TaskMetric:
    """One metric a task's evaluator measures.

    Attributes:
        name: The key in metrics.json and in ``budgets.metrics``.
        against: ``reference`` (the variant compared with the fp32 ONNX
            Runtime outputs) or ``labels`` (the variant scored on the labels,
            next to the fp32 ONNX baseline on the same labels).
        higher_is_better: The direction of "worse" for ``max_drop``.
        description: One line for the docs.
        bounds: The values the metric can take, so a budget outside them (a
            gate that can never fail, or never pass) is a configuration error.
            None for a custom evaluator's metric, whose range edgereg does not know.
        label: How the build report's tables name it (its name when unset).
        percent: A share (of samples, lines, frames, pixels): the build report
            shows it in percent and its changes in percentage points.
    """

    name: str
    against: Literal["reference", "labels"]
    higher_is_better: bool
    description: str
    bounds: tuple[float, float] | None = (0.0, 1.0)
    label: str | None = None
    percent: bool = False


def minimums(metric: str, *values: float) -> dict[PrecisionClass, dict[str, MetricBudget]]:
    """``metric.min`` by precision class: one value each for fp32, fp16, weight and int8."""
    if len(values) != len(PRECISION_CLASSES):
        raise ValueError(f"{metric}: give one minimum per precision class {PRECISION_CLASSES}")
    return {
        p: {metric: MetricBudget(min=v)} for p, v in zip(PRECISION_CLASSES, values, strict=True)
    }


class TaskConfig(_Strict):
    """The base of every task kind's table, and of its spec (the class constants)."""

    output: str | None = Field(
        default=None,
        description="The output the metric reads; the first output that is not a state output "
        "when unset.",
    )

    #: What the task measures; a custom evaluator names its own.
    METRICS: ClassVar[tuple[TaskMetric, ...]] = ()
    #: Whether the model's ``classes`` names what the output scores (one per class).
    NAMED_CLASSES: ClassVar[bool] = False
    #: Whether the evaluator names its metrics when it runs (a custom evaluator):
    #: their direction and range are unknown, so no limit is refused for them.
    OWN_METRICS: ClassVar[bool] = False
    #: Default limits on the metrics, by precision class (every class, or none).
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = {}
    #: Label metrics that get ``max_drop`` = the default label drop at every precision.
    LABEL_DROPS: ClassVar[tuple[str, ...]] = ()
    #: The metric a table shows first: the first of these the variant measured
    #: (the label metric, else the agreement), else the first it measured.
    HEADLINE: ClassVar[tuple[str, ...]] = ()
    #: The module whose ``evaluate(task, data) -> TaskScores`` scores the task.
    EVALUATOR: ClassVar[str] = ""
    #: Whether the evaluation set must hold ``labels``.
    NEEDS_LABELS: ClassVar[bool] = False
    #: Whether the evaluator measures recall per class: the build declares the
    #: recall plot to DVC and the report draws it.
    CLASS_RECALL: ClassVar[bool] = False
    #: What the kind is for, one line for the docs.
    PURPOSE: ClassVar[str] = ""
    #: The docs' datasets table: what a row of ``labels`` is, and an example.
    LABELS: ClassVar[tuple[str, str]] = ("not read", "")

    def metric(self, name: str) -> TaskMetric | None:
        """The metric called ``name``, or None when the task does not measure it."""
        return next((metric for metric in self.METRICS if metric.name == name), None)

    def pinned_files(self) -> dict[str, PinnedFile]:
        """Files the task's settings name (key -> file): pinned, and DVC dependencies."""
        return {}

    def contract_labels(
        self, classes: Sequence[str] | None, charset: Sequence[str] | None
    ) -> list[str] | None:
        """What the I/O contract's ``labels`` lists for the app: the class names, if any."""
        return list(classes) if self.NAMED_CLASSES and classes is not None else None
