"""The segmentation evaluator: IoU per class, its mean and its worst."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, TaskShapeError, task_rows
from edgereg.tasks.segmentation import SegmentationTask


def _class_ious(
    predicted: np.ndarray, truth: np.ndarray, classes: int, counted: np.ndarray | None
) -> dict[int, float]:
    """IoU of each class over every pixel of the set; classes in neither map are left out."""
    if counted is not None:
        predicted, truth = predicted[counted], truth[counted]
    pairs = np.bincount(
        truth.reshape(-1).astype(np.int64) * classes + predicted.reshape(-1).astype(np.int64),
        minlength=classes * classes,
    ).reshape(classes, classes)
    inter = np.diag(pairs)
    union = pairs.sum(axis=0) + pairs.sum(axis=1) - inter
    return {c: float(inter[c] / union[c]) for c in range(classes) if union[c] > 0}


def segmentation_scores(
    task: SegmentationTask,
    reference: np.ndarray,
    variant: np.ndarray,
    labels: np.ndarray | None,
    class_names: Sequence[str] | None,
) -> TaskScores:
    """Per-class IoU of the class maps with the reference's, and with the label masks.

    A pixel's class is its highest score. Against the reference: ``mean_iou``
    over the classes either map holds, and ``min_class_iou``, the worst of
    them (a tail class flipped to its neighbour fails here while the mean
    barely moves). With labels: ``label_mean_iou`` and ``class_iou_drop``, the
    worst class's loss against the fp32 baseline. A reference that gives every
    pixel of the set one class makes agreement meaningless: ``mean_iou``
    is then vacuous (fails).

    Raises:
        TaskShapeError: label masks shaped unlike one output's class map.
        TaskDataError: class names that do not match the scores, labels that are
            not class indices.
    """
    ref = task_rows(reference)
    var = task_rows(variant).reshape(ref.shape)
    axis = 1 if task.class_axis == 0 else ref.ndim - 1
    if ref.ndim < 2:
        raise TaskDataError(
            f"a segmentation output holds class scores per pixel; one sample's output has "
            f"shape {list(ref.shape[1:])}"
        )
    classes = int(ref.shape[axis])
    if class_names is not None and len(class_names) != classes:
        raise TaskDataError(
            f"classes lists {len(class_names)} names, but the model's output scores {classes} "
            f"classes per pixel (axis {task.class_axis} of {list(ref.shape[1:])}); list one "
            "name per class, in index order"
        )
    names = [class_names[c] if class_names is not None else str(c) for c in range(classes)]
    ref_map = np.argmax(ref, axis=axis)
    var_map = np.argmax(var, axis=axis)
    info = {metric.name: metric for metric in task.METRICS}
    agree = _class_ious(var_map, ref_map, classes, None)
    worst = sorted(agree.items(), key=lambda item: (item[1], item[0]))
    shown = ", ".join(f"{names[c]} {v:.3f}" for c, v in worst[:3])
    metrics = {
        "mean_iou": float(np.mean(list(agree.values()))) if agree else 1.0,
        "min_class_iou": worst[0][1] if worst else 1.0,
    }
    details = {
        "min_class_iou": f"worst classes against the fp32 reference: {shown}",
        "mean_iou": f"{len(agree)} classes; worst {shown}",
    }
    per_class = {"iou": {names[c]: round(v, 6) for c, v in sorted(agree.items())}}
    vacuous = {}
    present = np.unique(ref_map)
    if ref_map.size and len(present) == 1:
        vacuous["mean_iou"] = (
            f"the fp32 reference gives every pixel of the evaluation set class "
            f"'{names[int(present[0])]}': agreement with it says nothing (check the "
            "preprocessing and the class axis)"
        )
    if labels is None:
        return TaskScores(
            metrics, metric_info=info, details=details, vacuous=vacuous, per_class=per_class
        )
    truth = (
        labels.reshape(len(labels), *labels.shape[2:])
        if (labels.ndim == ref_map.ndim + 1 and labels.shape[1] == 1)
        else labels
    )
    if truth.shape != ref_map.shape:
        raise TaskShapeError(
            f"label masks have shape {list(labels.shape[1:])} per sample, but the output's "
            f"class map is {list(ref_map.shape[1:])} (output {list(ref.shape[1:])}, class "
            f"axis {task.class_axis}); store one class index per pixel, shaped like the map",
            hint="Make the masks one class index per pixel of the output (or fix the task's "
            "class_axis), and pin the new file.",
        )
    if not np.issubdtype(truth.dtype, np.integer):
        raise TaskDataError(
            f"segmentation labels must be class indices (integers); got {truth.dtype}"
        )
    counted = None if task.ignore_index is None else truth != task.ignore_index
    kept = truth if counted is None else truth[counted]
    if kept.size and (int(kept.min()) < 0 or int(kept.max()) >= classes):
        raise TaskDataError(
            f"label masks hold class indices {int(kept.min())}..{int(kept.max())}, but the "
            f"output scores {classes} classes (0..{classes - 1}); set ignore_index for a "
            "void label"
        )
    base = _class_ious(ref_map, truth, classes, counted)
    got = _class_ious(var_map, truth, classes, counted)
    labelled = [int(c) for c in np.unique(kept)]
    drops = {c: base.get(c, 0.0) - got.get(c, 0.0) for c in labelled}
    losers = sorted(drops.items(), key=lambda item: (-item[1], item[0]))
    metrics["label_mean_iou"] = float(np.mean([got.get(c, 0.0) for c in labelled]))
    metrics["class_iou_drop"] = max(0.0, losers[0][1]) if losers else 0.0
    baseline = {
        "label_mean_iou": float(np.mean([base.get(c, 0.0) for c in labelled])),
        "class_iou_drop": 0.0,
    }
    details["class_iou_drop"] = "worst classes on the labels: " + ", ".join(
        f"{names[c]} {base.get(c, 0.0):.3f} -> {got.get(c, 0.0):.3f}" for c, _ in losers[:3]
    )
    per_class["label_iou"] = {names[c]: round(got.get(c, 0.0), 6) for c in labelled}
    per_class["label_iou_baseline"] = {names[c]: round(base.get(c, 0.0), 6) for c in labelled}
    # The trivial predictor: the commonest labelled class on every pixel.
    values, counts = np.unique(kept, return_counts=True)
    trivial = float(counts.max() / counts.sum()) / len(values) if counts.size else 1.0
    return TaskScores(
        metrics,
        baseline=baseline,
        metric_info=info,
        details=details,
        trivial={"label_mean_iou": trivial},
        vacuous=vacuous,
        per_class=per_class,
    )


def evaluate(task: SegmentationTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`segmentation_scores`)."""
    return segmentation_scores(task, data.reference, data.variant, data.labels, data.classes)
