"""The classification evaluator: top-1 agreement, accuracy, per-class recall."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from edgereg.config._budgets import MetricBudget
from edgereg.tasks.classification import ClassificationTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, beyond_trivial, task_rows


def classification_scores(
    task: ClassificationTask,
    reference: np.ndarray,
    variant: np.ndarray,
    labels: np.ndarray | None,
    class_names: Sequence[str] | None,
) -> TaskScores:
    """Top-1 agreement, and with labels accuracy and per-class recall."""
    ref = task_rows(reference).reshape(len(reference), -1)
    var = task_rows(variant).reshape(len(variant), -1)
    classes = ref.shape[1]
    if class_names is not None and len(class_names) != classes:
        raise TaskDataError(
            f"classes lists {len(class_names)} names, but the model's output has {classes} "
            "scores per sample; list one name per output score, in index order"
        )
    info = {metric.name: metric for metric in task.METRICS}
    ref_top1 = np.argmax(ref, axis=1)
    var_top1 = np.argmax(var, axis=1)
    metrics = {"top1_agreement": float(np.mean(ref_top1 == var_top1))}
    if labels is None:
        return TaskScores(metrics, metric_info=info)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise TaskDataError(
            f"classification labels must be class indices, a 1-D integer array; got "
            f"{labels.dtype} {labels.shape}"
        )
    if labels.size and (int(labels.min()) < 0 or int(labels.max()) >= classes):
        raise TaskDataError(
            f"labels hold class indices {int(labels.min())}..{int(labels.max())}, but the model "
            f"has {classes} classes (0..{classes - 1})"
        )
    base_acc = float(np.mean(ref_top1 == labels))
    var_acc = float(np.mean(var_top1 == labels))
    recall: dict[int, tuple[float, float]] = {}
    for label in range(classes):
        mask = labels == label
        if np.any(mask):
            recall[label] = (
                float(np.mean(ref_top1[mask] == label)),
                float(np.mean(var_top1[mask] == label)),
            )
    drops = {label: base - got for label, (base, got) in recall.items()}
    worst = sorted(drops.items(), key=lambda item: item[1], reverse=True)
    names = list(class_names or [])
    losers = [item for item in worst[:3] if item[1] > 0] or worst[:1]
    shown = ", ".join(f"{names[lbl] if lbl < len(names) else lbl}: -{d:.3f}" for lbl, d in losers)
    metrics["accuracy"] = var_acc
    metrics["class_recall_drop"] = max(0.0, worst[0][1]) if worst else 0.0
    return TaskScores(
        metrics,
        baseline={"accuracy": base_acc, "class_recall_drop": 0.0},
        metric_info=info,
        class_recall=recall,
        details={
            "class_recall_drop": f"worst classes {shown}",
            "accuracy": f"accuracy {base_acc:.4f} (ONNX) -> {var_acc:.4f}",
        },
    )


def chance_level(classes: int) -> float:
    """Accuracy at or below which a classifier's baseline is treated as guessing."""
    return beyond_trivial(1.0 / classes)


def evaluate(task: ClassificationTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`classification_scores`), gated on beating chance."""
    scores = classification_scores(task, data.reference, data.variant, data.labels, data.classes)
    if "accuracy" not in scores.baseline:
        return scores
    # A baseline at chance means the inputs are not what the model was
    # trained on (mean/std, color order, layout), whatever the variant does.
    classes = int(task_rows(data.reference).reshape(len(data.reference), -1).shape[1])
    chance = MetricBudget(min_baseline=round(chance_level(classes), 4))
    return replace(scores, own_gates={"accuracy": chance})
