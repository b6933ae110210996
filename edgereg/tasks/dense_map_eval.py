"""The dense map evaluator: IoU of the binarized maps."""

from __future__ import annotations

import numpy as np

from edgereg.tasks.dense_map import DenseMapTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, task_rows


def _masks(rows: np.ndarray, threshold: float) -> np.ndarray:
    return rows > threshold


def _iou(a: np.ndarray, b: np.ndarray) -> float:
    """Mean per-sample IoU of boolean masks; two empty masks agree fully."""
    a2 = a.reshape(len(a), -1)
    b2 = b.reshape(len(b), -1)
    inter = np.sum(a2 & b2, axis=1)
    union = np.sum(a2 | b2, axis=1)
    return float(np.mean(np.where(union > 0, inter / np.maximum(union, 1), 1.0)))


def dense_map_scores(
    task: DenseMapTask, reference: np.ndarray, variant: np.ndarray, labels: np.ndarray | None
) -> TaskScores:
    """IoU of the binarized maps with the reference's, and with the label masks."""
    ref = _masks(task_rows(reference), task.threshold)
    var = _masks(task_rows(variant), task.threshold)
    info = {metric.name: metric for metric in task.METRICS}
    metrics = {"iou": _iou(ref, var)}
    vacuous = {}
    if ref.size and (not ref.any() or ref.all()):
        vacuous["iou"] = (
            f"the fp32 reference's map is {'never' if not ref.any() else 'always'} above the "
            f"threshold {task.threshold:g} on the evaluation set: IoU with it says nothing"
        )
    if labels is None:
        return TaskScores(metrics, metric_info=info, vacuous=vacuous)
    if (
        labels.shape[1:] != ref.shape[1:]
        and labels.reshape(len(labels), -1).shape != ref.reshape(len(ref), -1).shape
    ):
        raise TaskDataError(
            f"label masks have rows of shape {labels.shape[1:]}, the output map has "
            f"{ref.shape[1:]}; store one mask per sample shaped like one output (batch axis "
            "removed)"
        )
    truth = labels.reshape(ref.shape) > 0
    metrics["label_iou"] = _iou(var, truth)
    trivial = max(_iou(np.ones_like(truth), truth), _iou(np.zeros_like(truth), truth))
    return TaskScores(
        metrics,
        baseline={"label_iou": _iou(ref, truth)},
        metric_info=info,
        trivial={"label_iou": trivial},
        vacuous=vacuous,
    )


def evaluate(task: DenseMapTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`dense_map_scores`)."""
    return dense_map_scores(task, data.reference, data.variant, data.labels)
