"""What every task's evaluator shares: its result, its errors, reading one output.

Pure: arrays in, numbers out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgereg.config._budgets import MetricBudget
from edgereg.tasks._spec import TaskMetric


class TaskDataError(ValueError):
    """Labels or task settings that do not fit the model's outputs (a user error)."""


@dataclass(frozen=True)
class TaskScores:
    """What a task's evaluator measured.

    Attributes:
        metrics: The variant's value of each metric (against the reference or
            the labels).
        baseline: The fp32 ONNX reference's value of each label metric.
        metric_info: How each metric is read (direction, against what).
        class_recall: Classification only: class index -> (baseline recall,
            variant recall), for the plots and the report.
        details: Short texts that explain a number (the worst classes).
    """

    metrics: dict[str, float]
    baseline: dict[str, float] = field(default_factory=dict)
    metric_info: dict[str, TaskMetric] = field(default_factory=dict)
    class_recall: dict[int, tuple[float, float]] = field(default_factory=dict)
    details: dict[str, str] = field(default_factory=dict)
    #: Label metric -> what a trivial predictor (always positive, the commonest
    #: line, a random neighbour) scores on these labels: the reference must beat it.
    trivial: dict[str, float] = field(default_factory=dict)
    #: Agreement metric -> why it says nothing on this evaluation set (the
    #: reference never crosses the threshold): it fails instead of passing.
    vacuous: dict[str, str] = field(default_factory=dict)
    #: Per-class values behind a metric (segmentation: IoU per class name), for
    #: metrics.json's ``per_class``.
    per_class: dict[str, dict[str, float]] = field(default_factory=dict)
    #: Gates the evaluation itself sets (a classifier's chance level, a custom
    #: evaluator's own); models.toml overrides them.
    own_gates: dict[str, MetricBudget] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskData:
    """What an evaluator scores: one evaluation set, run by the reference and the variant.

    Attributes:
        reference: The task's output from the fp32 ONNX Runtime model, ``(N, *shape)``.
        variant: The same output from the variant.
        labels: The evaluation set's ``labels``, or None.
        classes: The model's ``classes`` (class names in index order), or None.
        charset: A CTC task's characters (blank excluded), or None.
        inputs: Every input, model-ready (state inputs excluded), for a custom evaluator.
        reference_outputs: Every output of the reference.
        variant_outputs: Every output of the variant.
        root: The directory of models.toml (a custom evaluator is imported from it).
    """

    reference: np.ndarray
    variant: np.ndarray
    labels: np.ndarray | None
    classes: Sequence[str] | None
    charset: Sequence[str] | None
    inputs: Mapping[str, np.ndarray]
    reference_outputs: Mapping[str, np.ndarray]
    variant_outputs: Mapping[str, np.ndarray]
    root: Path


class TaskShapeError(TaskDataError):
    """Labels whose shape cannot be the output's: a configuration error naming both shapes."""

    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        #: How to fix the evaluation set, for the configuration error.
        self.hint = hint


def task_rows(outputs: np.ndarray) -> np.ndarray:
    """Per-sample tensors without their batch axis: ``(N, 1, ...)`` -> ``(N, ...)``."""
    if outputs.ndim >= 2 and outputs.shape[1] == 1:
        return outputs[:, 0]
    return outputs


def beyond_trivial(level: float) -> float:
    """The least a reference must score on its labels, given a trivial predictor's ``level``.

    A tenth of the way from the trivial score to perfect: a reference at or
    below it is fed inputs it was not trained on (preprocessing, a chunk
    without its context), or the labels are not what it predicts.
    """
    return level + 0.1 * (1.0 - level)


def row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b`` (two zero rows agree)."""
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.sum(a * b, axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    return np.where(norms > 0, dots / np.maximum(norms, 1e-300), np.where(both_zero, 1.0, 0.0))
