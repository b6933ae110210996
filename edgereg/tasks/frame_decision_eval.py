"""The frame decision evaluator: agreement per frame, F1 on labels."""

from __future__ import annotations

import numpy as np

from edgereg.tasks.frame_decision import FrameDecisionTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, task_rows


def _f1(predicted: np.ndarray, truth: np.ndarray) -> float:
    tp = int(np.sum(predicted & truth))
    fp = int(np.sum(predicted & ~truth))
    fn = int(np.sum(~predicted & truth))
    return 1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)


def frame_decision_scores(
    task: FrameDecisionTask, reference: np.ndarray, variant: np.ndarray, labels: np.ndarray | None
) -> TaskScores:
    """Per-frame decisions at a threshold: agreement with the reference, F1 on labels."""
    ref = task_rows(reference).reshape(len(reference), -1) > task.threshold
    var = task_rows(variant).reshape(len(variant), -1) > task.threshold
    info = {metric.name: metric for metric in task.METRICS}
    metrics = {"frame_agreement": float(np.mean(ref == var))}
    vacuous = {}
    if ref.size and (not ref.any() or ref.all()):
        vacuous["frame_agreement"] = (
            f"the fp32 reference {'never' if not ref.any() else 'always'} crosses the "
            f"threshold {task.threshold:g} on the evaluation set: agreement with it says nothing"
        )
    if labels is None:
        return TaskScores(metrics, metric_info=info, vacuous=vacuous)
    if labels.reshape(len(labels), -1).shape != ref.shape:
        raise TaskDataError(
            f"frame labels have rows of shape {labels.shape[1:]}, the output has "
            f"{task_rows(reference).shape[1:]} decisions per sample; store one 0/1 per decision"
        )
    truth = labels.reshape(ref.shape) > 0
    metrics["f1"] = _f1(var, truth)
    # The trivial detector: always positive (always negative scores 0 unless no label is).
    always = max(_f1(np.ones_like(truth), truth), _f1(np.zeros_like(truth), truth))
    rates = (
        f"the fp32 ONNX model itself: positive on {float(np.mean(ref)):.1%} of frames, "
        f"the labels on {float(np.mean(truth)):.1%}; always positive scores {always:.4f}"
    )
    return TaskScores(
        metrics,
        baseline={"f1": _f1(ref, truth)},
        metric_info=info,
        details={"f1.baseline": rates},
        trivial={"f1": always},
        vacuous=vacuous,
    )


def evaluate(task: FrameDecisionTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`frame_decision_scores`)."""
    return frame_decision_scores(task, data.reference, data.variant, data.labels)
