"""The generic evaluator: the per-step reading of a class distribution."""

from __future__ import annotations

import numpy as np

from edgereg.tasks.generic import GenericTask
from edgereg.tasks.scoring import TaskData, TaskScores, task_rows

#: A per-step output is a distribution over classes when every step's values lie
#: in [0, 1] and sum to 1 within this: a softmax, as a CTC recogniser or a
#: tagger ends. Logits or features per step (a hidden state) are not read.
STEP_SUM_TOLERANCE = 1e-3


def step_distributions(rows: np.ndarray) -> bool:
    """Whether ``rows`` (samples, steps, classes) hold a class distribution per step."""
    if rows.ndim != 3 or rows.shape[1] < 2 or rows.shape[2] < 2 or not rows.size:
        return False
    values = rows.astype(np.float64)
    if not np.all(np.isfinite(values)) or values.min() < 0 or values.max() > 1:
        return False
    return bool(np.all(np.abs(values.sum(axis=2) - 1.0) <= STEP_SUM_TOLERANCE))


def _step_paths(rows: np.ndarray) -> list[tuple[int, ...]]:
    """The best class per step, repeats merged, per sample.

    What a greedy CTC decoder reads before it drops the blank (whose index a
    generic task does not know).
    """
    paths = []
    for best in np.argmax(rows, axis=-1):
        keep = np.r_[True, best[1:] != best[:-1]]
        paths.append(tuple(int(c) for c in best[keep]))
    return paths


def generic_scores(task: GenericTask, reference: np.ndarray, variant: np.ndarray) -> TaskScores:
    """A generic task's one metric, on an output that holds a distribution per step.

    Output cosine hides a recogniser whose int8 reads other text (0.981 over
    the set with 54 of 64 lines decoded as ONNX Runtime decodes them): when
    the reference's rows are per-step class distributions, ``sequence_agreement``
    is the share of samples whose best class per step, repeats merged, is the
    reference's. Any other output measures nothing here (agreement only).
    """
    info = {metric.name: metric for metric in task.METRICS}
    ref_rows = task_rows(reference)
    if not step_distributions(ref_rows):
        return TaskScores({}, metric_info=info)
    var_rows = task_rows(variant).reshape(ref_rows.shape)
    same = [a == b for a, b in zip(_step_paths(ref_rows), _step_paths(var_rows), strict=True)]
    differ = len(same) - sum(same)
    return TaskScores(
        {"sequence_agreement": float(np.mean(same))},
        metric_info=info,
        details={
            "sequence_agreement": f"{differ} of {len(same)} samples read differently (best "
            f"class per step of {ref_rows.shape[1]}, repeats merged)"
        },
    )


def evaluate(task: GenericTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`generic_scores`)."""
    return generic_scores(task, data.reference, data.variant)
