"""Regression: values the app reads as they are (a depth, an age, a box's coordinates)."""

from __future__ import annotations

import math
from typing import ClassVar, Literal

from edgereg.tasks._spec import TaskConfig, TaskMetric

#: Errors are in the output's own units: at least 0, no upper end.
_ERROR = (0.0, math.inf)


class RegressionTask(TaskConfig):
    """Values read as they are, errors in their units; labels: one number per output value."""

    kind: Literal["regression"]
    METRICS: ClassVar[tuple[TaskMetric, ...]] = (
        TaskMetric(
            "mae",
            "reference",
            False,
            "mean absolute difference of the variant's values from the reference's",
            _ERROR,
            label="MAE",
        ),
        TaskMetric(
            "rmse",
            "reference",
            False,
            "root mean square difference of the variant's values from the reference's",
            _ERROR,
            label="RMSE",
        ),
        TaskMetric(
            "label_mae",
            "labels",
            False,
            "mean absolute error against the labels",
            _ERROR,
            label="MAE (labels)",
        ),
        TaskMetric(
            "label_rmse",
            "labels",
            False,
            "root mean square error against the labels",
            _ERROR,
            label="RMSE (labels)",
        ),
    )
    # No default limits: an error is in the output's units, which only the team knows.
    HEADLINE: ClassVar[tuple[str, ...]] = ("label_mae", "mae")
    EVALUATOR: ClassVar[str] = "edgereg.tasks.regression_eval"
    PURPOSE: ClassVar[str] = (
        "values read as they are (a depth map, an age, coordinates); set limits in their units"
    )
    LABELS: ClassVar[tuple[str, str]] = (
        "one number per output value, shaped like one output row",
        "`(N, 1, 64, 64)` float32 for an output `[1, 1, 64, 64]`",
    )
