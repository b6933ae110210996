"""The custom evaluator's result, checked and read."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import TaskMetric
from edgereg.tasks.scoring import TaskDataError, TaskScores


def custom_scores(result: Any, evaluator: str) -> tuple[TaskScores, dict[str, MetricBudget]]:
    """Check and read what a custom evaluator returned.

    The evaluator returns ``{"metrics": {name: number}, "gates": {name:
    {"min": x} | {"max": x}}}`` (``gates`` optional); every metric value must be
    a finite number.
    """
    if not isinstance(result, Mapping) or not isinstance(result.get("metrics"), Mapping):
        raise TaskDataError(
            f"evaluator {evaluator} returned {type(result).__name__}; it must return a dict "
            '{"metrics": {name: number, ...}, "gates": {name: {"min": x} or {"max": x}}}'
        )
    metrics: dict[str, float] = {}
    for name, value in result["metrics"].items():
        if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
            raise TaskDataError(
                f"evaluator {evaluator} returned metric {name!r} = {value!r}, not a number"
            )
        if not math.isfinite(float(value)):
            raise TaskDataError(f"evaluator {evaluator} returned metric {name!r} = {value}")
        metrics[str(name)] = float(value)
    gates: dict[str, MetricBudget] = {}
    raw_gates = result.get("gates", {})
    if not isinstance(raw_gates, Mapping):
        raise TaskDataError(f"evaluator {evaluator} returned gates that are not a dict")
    for name, limits in raw_gates.items():
        if name not in metrics:
            raise TaskDataError(
                f"evaluator {evaluator} gates {name!r}, which is not among its metrics"
            )
        try:
            gates[str(name)] = MetricBudget.model_validate(dict(limits))
        except Exception as exc:
            raise TaskDataError(
                f"evaluator {evaluator} returned gate {name!r} = {limits!r}: use "
                '{"min": number} or {"max": number}'
            ) from exc
    info = {name: TaskMetric(name, "reference", True, "") for name in metrics}
    return TaskScores(metrics, metric_info=info), gates
