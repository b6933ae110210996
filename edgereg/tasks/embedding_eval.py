"""The embedding evaluator: cosine to the reference and nearest neighbours."""

from __future__ import annotations

import numpy as np

from edgereg.tasks.embedding import EmbeddingTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, row_cosines, task_rows


def _neighbours(rows: np.ndarray) -> np.ndarray:
    """Indices of every sample's neighbours by cosine, nearest first, itself excluded."""
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    unit = rows / np.maximum(norms, 1e-30)
    similarity = unit @ unit.T
    np.fill_diagonal(similarity, -np.inf)
    # A stable sort keeps ties in index order on every run.
    return np.argsort(-similarity, axis=1, kind="stable")


def embedding_scores(
    task: EmbeddingTask, reference: np.ndarray, variant: np.ndarray, labels: np.ndarray | None
) -> TaskScores:
    """Cosine to the reference embedding and nearest-neighbour agreement over the set."""
    ref = task_rows(reference).reshape(len(reference), -1).astype(np.float64)
    var = task_rows(variant).reshape(len(variant), -1).astype(np.float64)
    info = {metric.name: metric for metric in task.METRICS}
    metrics = {"embedding_cosine": float(np.min(row_cosines(ref, var)))}
    if len(ref) < 2:
        raise TaskDataError("an embedding evaluation set needs at least 2 samples")
    ref_nn = _neighbours(ref)
    var_nn = _neighbours(var)
    k = min(task.k, len(ref) - 1)
    metrics["neighbour_agreement"] = float(np.mean(ref_nn[:, 0] == var_nn[:, 0]))
    metrics["neighbour_recall"] = float(
        np.mean([ref_nn[i, 0] in var_nn[i, :k] for i in range(len(ref))])
    )
    if labels is None:
        return TaskScores(metrics, metric_info=info)
    if labels.ndim != 1:
        raise TaskDataError(
            f"embedding labels are one group id per sample (1-D); got shape {labels.shape}"
        )
    metrics["label_neighbour_accuracy"] = float(np.mean(labels[var_nn[:, 0]] == labels))
    baseline = {"label_neighbour_accuracy": float(np.mean(labels[ref_nn[:, 0]] == labels))}
    # A random neighbour shares the sample's group this often.
    _, counts = np.unique(labels, return_counts=True)
    pairs = len(labels) * (len(labels) - 1)
    random = float(np.sum(counts * (counts - 1)) / pairs) if pairs else 0.0
    return TaskScores(
        metrics,
        baseline=baseline,
        metric_info=info,
        trivial={"label_neighbour_accuracy": random},
    )


def evaluate(task: EmbeddingTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`embedding_scores`)."""
    return embedding_scores(task, data.reference, data.variant, data.labels)
