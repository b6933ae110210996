"""The custom evaluator's result, checked and read."""

from __future__ import annotations

import importlib
import math
import sys
from collections.abc import Callable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np

from edgereg.config._budgets import MetricBudget
from edgereg.errors import BuildError
from edgereg.tasks._spec import TaskMetric
from edgereg.tasks.custom import CustomTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores


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


def evaluate(task: CustomTask, data: TaskData) -> TaskScores:
    """Call the team's evaluator on the whole evaluation set and read what it returns."""
    function = load_evaluator(data.root, task.evaluator)
    try:
        result = function(
            inputs=data.inputs,
            reference=data.reference_outputs,
            outputs=data.variant_outputs,
            labels=data.labels,
        )
    except Exception as exc:
        raise BuildError(
            f"evaluator {task.evaluator} raised {type(exc).__name__}: {exc}",
            stage="evaluate",
            hint="Fix the evaluator; it is called as f(inputs=, reference=, outputs=, "
            "labels=) with dicts of numpy arrays (N samples first).",
        ) from exc
    scores, gates = custom_scores(result, task.evaluator)
    return replace(scores, own_gates=gates)


def load_evaluator(root: Path, spec: str) -> Callable[..., Any]:
    """Import ``module:function`` with the project directory first on sys.path."""
    module_name, _, function_name = spec.partition(":")
    root_text = str(root.resolve())
    if root_text not in sys.path:
        sys.path.insert(0, root_text)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise BuildError(
            f"cannot import evaluator module '{module_name}': {type(exc).__name__}: {exc}",
            stage="evaluate",
            hint=f"The module is looked up from {root_text} (the directory of models.toml).",
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise BuildError(
            f"evaluator module '{module_name}' has no function '{function_name}'",
            stage="evaluate",
        )
    return cast(Callable[..., Any], function)
