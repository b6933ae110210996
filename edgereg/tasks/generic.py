"""Generic: output agreement, and the per-step reading of a class distribution."""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar, Literal

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import PrecisionClass, TaskConfig, TaskMetric, minimums


class GenericTask(TaskConfig):
    """Output agreement, and the decoded sequence of a per-step class distribution."""

    kind: Literal["generic"]
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "sequence_agreement",
            "reference",
            True,
            "share of samples whose best class per step, repeats merged, is the reference's "
            "(only on an output that holds a class distribution per step)",
        ),
    )
    # Measured only on a per-step distribution; the same bar as a CTC task's
    # line_match, since that is what such an output usually feeds.
    DEFAULT_LIMITS: ClassVar[Mapping[PrecisionClass, Mapping[str, MetricBudget]]] = minimums(
        "sequence_agreement", 0.98, 0.95, 0.9, 0.85
    )
    EVALUATOR: ClassVar[str] = "edgereg.tasks.generic_eval"
    PURPOSE: ClassVar[str] = "output agreement, and the per-step reading of a class distribution"
