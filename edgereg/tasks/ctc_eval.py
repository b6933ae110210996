"""The CTC evaluator: greedy decoding, exact lines and character error rate."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from edgereg.tasks.ctc import CtcTask
from edgereg.tasks.scoring import TaskData, TaskDataError, TaskScores, task_rows


def read_charset(text: str) -> list[str]:
    """The characters of a charset file, one per line, in class order."""
    chars = [line for line in text.split("\n")]
    while chars and chars[-1] == "":
        chars.pop()
    return chars


def ctc_greedy(rows: np.ndarray, charset: Sequence[str], blank: int) -> list[str]:
    """Greedy CTC decoding: best class per step, repeats merged, blanks dropped."""
    best = np.argmax(rows, axis=-1)
    lines = []
    for sequence in best:
        chars = []
        previous = -1
        for cls in sequence.tolist():
            if cls != previous and cls != blank:
                chars.append(charset[cls if cls < blank else cls - 1])
            previous = cls
        lines.append("".join(chars))
    return lines


def edit_distance(a: str, b: str) -> int:
    """Levenshtein distance between two strings."""
    previous = list(range(len(b) + 1))
    for i, char_a in enumerate(a, 1):
        current = [i]
        for j, char_b in enumerate(b, 1):
            current.append(
                min(previous[j] + 1, current[j - 1] + 1, previous[j - 1] + (char_a != char_b))
            )
        previous = current
    return previous[-1]


def _cer(predicted: Sequence[str], truth: Sequence[str]) -> float:
    errors = sum(edit_distance(p, t) for p, t in zip(predicted, truth, strict=True))
    length = sum(len(t) for t in truth)
    return errors / length if length else float(errors > 0)


def ctc_scores(
    task: CtcTask,
    charset: Sequence[str],
    reference: np.ndarray,
    variant: np.ndarray,
    labels: np.ndarray | None,
) -> TaskScores:
    """Exact-line match and CER of greedy decodings, against the reference and the labels."""
    ref_rows = task_rows(reference)
    var_rows = task_rows(variant)
    if ref_rows.ndim != 3:
        raise TaskDataError(
            f"a CTC output must be (batch, time, classes) per sample; got rows of shape "
            f"{ref_rows.shape[1:]}"
        )
    width = ref_rows.shape[-1]
    if width != len(charset) + 1:
        raise TaskDataError(
            f"the charset lists {len(charset)} characters, so the output needs "
            f"{len(charset) + 1} classes (with the blank), but it has {width}"
        )
    if task.blank >= width:
        raise TaskDataError(f"blank index {task.blank} is outside the {width} output classes")
    ref_lines = ctc_greedy(ref_rows, charset, task.blank)
    var_lines = ctc_greedy(var_rows, charset, task.blank)
    info = {metric.name: metric for metric in task.METRICS}
    metrics = {
        "line_match": float(np.mean([a == b for a, b in zip(ref_lines, var_lines, strict=True)])),
        "cer": _cer(var_lines, ref_lines),
    }
    if labels is None:
        return TaskScores(metrics, metric_info=info)
    if labels.ndim != 1 or labels.dtype.kind != "U":
        raise TaskDataError(
            f"CTC labels must be the text of each line, a 1-D unicode string array; got "
            f"{labels.dtype} {labels.shape}"
        )
    truth = [str(text) for text in labels]
    metrics["label_line_accuracy"] = float(
        np.mean([a == b for a, b in zip(var_lines, truth, strict=True)])
    )
    metrics["label_cer"] = _cer(var_lines, truth)
    baseline = {
        "label_line_accuracy": float(
            np.mean([a == b for a, b in zip(ref_lines, truth, strict=True)])
        ),
        "label_cer": _cer(ref_lines, truth),
    }
    commonest = max(truth.count(line) for line in set(truth)) / len(truth) if truth else 0.0
    return TaskScores(
        metrics, baseline=baseline, metric_info=info, trivial={"label_line_accuracy": commonest}
    )


def evaluate(task: CtcTask, data: TaskData) -> TaskScores:
    """The task's scores (see :func:`ctc_scores`), on the charset the build read."""
    if data.charset is None:
        raise TaskDataError("a CTC task is scored with its charset, and none was read")
    return ctc_scores(task, data.charset, data.reference, data.variant, data.labels)
