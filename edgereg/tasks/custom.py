"""Custom: the team's own evaluator, module:function in their repository."""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal

from pydantic import Field, StringConstraints

from edgereg.tasks._spec import TaskConfig, TaskMetric


class CustomTask(TaskConfig):
    """Metrics from the team's own evaluator, ``module:function`` in their repository."""

    kind: Literal["custom"]
    evaluator: Annotated[
        str,
        StringConstraints(
            pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:"
            r"[A-Za-z_][A-Za-z0-9_]*$"
        ),
    ] = Field(description="module:function, imported with the models.toml directory on sys.path.")
    OWN_METRICS: ClassVar[bool] = True
    EVALUATOR: ClassVar[str] = "edgereg.tasks.custom_eval"
    PURPOSE: ClassVar[str] = "your own metrics ([below](#custom-evaluators))"
    LABELS: ClassVar[tuple[str, str]] = (
        "anything your evaluator reads",
        "",
    )

    def metric(self, name: str) -> TaskMetric | None:
        """Any name: the evaluator says what it measures when it runs.

        Its metrics have no fp32 baseline, so only ``min`` and ``max`` apply.
        """
        return TaskMetric(name, "reference", True, "", None)
