"""The regression evaluator: absolute and square errors, against the reference and the labels."""

from __future__ import annotations

import numpy as np

from edgereg.config._budgets import MetricBudget
from edgereg.tasks.regression import RegressionTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, task_rows


def _mae(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean(np.abs(predicted - truth))) if truth.size else 0.0


def _rmse(predicted: np.ndarray, truth: np.ndarray) -> float:
    return float(np.sqrt(np.mean((predicted - truth) ** 2))) if truth.size else 0.0


def regression_scores(
    task: RegressionTask, reference: np.ndarray, variant: np.ndarray, labels: np.ndarray | None
) -> TaskScores:
    """MAE and RMSE of the variant's values against the reference's, and against the labels.

    Every value of the output counts alike. With labels, the fp32 reference's
    own errors are the baseline. A reference no better than the labels' mean
    everywhere is fed inputs it was not trained on: like a classifier at
    chance, its ``label_mae`` must be at most nine tenths of that trivial
    predictor's (``label_mae.max_baseline``, which models.toml may override).

    Raises:
        TaskDataError: labels that are not numbers, not finite, or not one per
            output value.
    """
    ref = task_rows(reference).reshape(len(reference), -1).astype(np.float64)
    var = task_rows(variant).reshape(len(variant), -1).astype(np.float64)
    info = {metric.name: metric for metric in task.METRICS}
    metrics = {"mae": _mae(var, ref), "rmse": _rmse(var, ref)}
    if labels is None:
        return TaskScores(metrics, metric_info=info)
    if labels.dtype == np.bool_ or not np.issubdtype(labels.dtype, np.number):
        raise TaskDataError(f"regression labels must be numbers; got {labels.dtype}")
    truth = labels.reshape(len(labels), -1).astype(np.float64)
    if truth.shape != ref.shape:
        raise TaskDataError(
            f"regression labels hold {truth.shape[1]} values per sample, the output "
            f"{ref.shape[1]} ({list(task_rows(reference).shape[1:])}); store one label per "
            "output value"
        )
    if not np.isfinite(truth).all():
        raise TaskDataError("regression labels hold NaN or infinity")
    metrics["label_mae"] = _mae(var, truth)
    metrics["label_rmse"] = _rmse(var, truth)
    baseline = {"label_mae": _mae(ref, truth), "label_rmse": _rmse(ref, truth)}
    # The trivial predictor: each value's mean over the set, for every sample.
    trivial = _mae(np.broadcast_to(truth.mean(axis=0), truth.shape), truth)
    gates = {"label_mae": MetricBudget(max_baseline=float(f"{0.9 * trivial:.6g}"))}
    return TaskScores(
        metrics,
        baseline=baseline,
        metric_info=info,
        own_gates=gates if trivial > 0 else {},
    )


def evaluate(task: RegressionTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`regression_scores`)."""
    return regression_scores(task, data.reference, data.variant, data.labels)
