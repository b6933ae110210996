"""What every task kind has: its metrics, and the base of its models.toml table."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from pydantic import Field

from edgereg.config._base import _Strict


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
    """

    name: str
    against: Literal["reference", "labels"]
    higher_is_better: bool
    description: str
    bounds: tuple[float, float] | None = (0.0, 1.0)


class _Task(_Strict):
    output: str | None = Field(
        default=None,
        description="The output the metric reads; the first output that is not a state output "
        "when unset.",
    )

    #: What the task measures; a custom evaluator names its own.
    METRICS: ClassVar[tuple[TaskMetric, ...]] = ()
    #: Whether the model's ``classes`` names what the output scores (one per class).
    NAMED_CLASSES: ClassVar[bool] = False

    def metric(self, name: str) -> TaskMetric | None:
        """The metric called ``name``, or None when the task does not measure it."""
        return next((metric for metric in self.METRICS if metric.name == name), None)
