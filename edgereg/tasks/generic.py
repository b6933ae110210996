"""Generic: output agreement, and the per-step reading of a class distribution."""

from __future__ import annotations

from typing import ClassVar, Literal

from edgereg.tasks._spec import TaskMetric, _Task


class GenericTask(_Task):
    """Output agreement, and the decoded sequence of a per-step class distribution."""

    kind: Literal["generic"]
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "sequence_agreement",
            "reference",
            True,
            "share of samples whose best class per step, repeats merged, is the reference's "
            "(measured when the output holds a class distribution per step)",
        ),
    )
