"""Pure numeric checks of a variant: output agreement, task metrics, default budgets, gates.

Everything here takes arrays and returns numbers; the build stages feed it the
outputs of ONNX Runtime (the fp32 reference) and of the variant, run the same
way an app runs the model (see :mod:`edgereg.toolchain._streaming`). Outputs
arrive per sample, ``(N, *tensor shape)``; a task reads its output with the
batch axis (first, of size 1) removed.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import numpy as np

from edgereg.config import (
    Budgets,
    ClassificationTask,
    CtcTask,
    DenseMapTask,
    EmbeddingTask,
    FrameDecisionTask,
    GenericTask,
    MetricBudget,
    SegmentationTask,
    TaskMetric,
)

PrecisionClass = Literal["fp32", "fp16", "weight", "int8"]

#: Output agreement every variant must reach unless its budgets say otherwise,
#: by precision: (min_cosine, min_snr_db). Chosen on the example models (see
#: docs/build.md): loose enough for every healthy variant, strict enough that
#: a broken one (a detector at cosine 0.09, a recogniser reading nothing) fails.
DEFAULT_AGREEMENT: dict[PrecisionClass, tuple[float, float]] = {
    "fp32": (0.9999, 40.0),
    "fp16": (0.999, 30.0),
    "weight": (0.99, 18.0),
    "int8": (0.98, 13.0),
}

#: Default limits on the task metrics compared with the reference, by precision.
DEFAULT_METRICS: dict[str, dict[PrecisionClass, dict[str, MetricBudget]]] = {
    "classification": {
        cast(PrecisionClass, p): {"top1_agreement": MetricBudget(min=v)}
        for p, v in (("fp32", 0.99), ("fp16", 0.98), ("weight", 0.95), ("int8", 0.95))
    },
    "dense_map": {
        cast(PrecisionClass, p): {"iou": MetricBudget(min=v)}
        for p, v in (("fp32", 0.98), ("fp16", 0.95), ("weight", 0.9), ("int8", 0.85))
    },
    # The mean like dense_map's IoU; every class, the tail too, like a classifier's
    # per-class recall; and on labels no class may lose more than a tenth of its IoU.
    "segmentation": {
        cast(PrecisionClass, p): {
            "mean_iou": MetricBudget(min=mean),
            "min_class_iou": MetricBudget(min=worst),
            "class_iou_drop": MetricBudget(max=0.1),
        }
        for p, mean, worst in (
            ("fp32", 0.98, 0.95),
            ("fp16", 0.95, 0.9),
            ("weight", 0.9, 0.8),
            ("int8", 0.85, 0.7),
        )
    },
    "ctc": {
        cast(PrecisionClass, p): {"line_match": MetricBudget(min=v)}
        for p, v in (("fp32", 0.98), ("fp16", 0.95), ("weight", 0.9), ("int8", 0.85))
    },
    "embedding": {
        cast(PrecisionClass, p): {"neighbour_agreement": MetricBudget(min=v)}
        for p, v in (("fp32", 0.98), ("fp16", 0.97), ("weight", 0.95), ("int8", 0.95))
    },
    "frame_decision": {
        cast(PrecisionClass, p): {"frame_agreement": MetricBudget(min=v)}
        for p, v in (("fp32", 0.99), ("fp16", 0.98), ("weight", 0.95), ("int8", 0.95))
    },
    # Measured only on a per-step distribution (below); the same bar as a CTC
    # task's line_match, since that is what such an output usually feeds.
    "generic": {
        cast(PrecisionClass, p): {"sequence_agreement": MetricBudget(min=v)}
        for p, v in (("fp32", 0.98), ("fp16", 0.95), ("weight", 0.9), ("int8", 0.85))
    },
}

#: Label metrics lost against the fp32 baseline, by default, for every precision.
DEFAULT_LABEL_DROP = 0.05


def default_budgets(task: str, precision: PrecisionClass) -> Budgets:
    """The budgets a variant gets before models.toml overrides them."""
    cosine, snr = DEFAULT_AGREEMENT[precision]
    metrics = dict(DEFAULT_METRICS.get(task, {}).get(precision, {}))
    for name in _LABEL_DROP_DEFAULTS.get(task, ()):
        metrics[name] = MetricBudget(max_drop=DEFAULT_LABEL_DROP)
    return Budgets(min_cosine=cosine, min_snr_db=snr, metrics=metrics)


_LABEL_DROP_DEFAULTS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy",),
    "dense_map": ("label_iou",),
    "segmentation": ("label_mean_iou",),
    "ctc": ("label_line_accuracy",),
    "frame_decision": ("f1",),
}


def effective_budgets(
    task: str,
    precision: PrecisionClass,
    declared: Budgets,
    evaluator_gates: Mapping[str, MetricBudget] | None = None,
) -> Budgets:
    """The budgets a variant is gated on.

    Defaults for the task and precision, then a custom evaluator's own gates,
    then what models.toml declares on top (only keys it sets replace others).
    """
    defaults = default_budgets(task, precision)
    if evaluator_gates:
        defaults = defaults.merged(Budgets(metrics=dict(evaluator_gates)))
    return defaults.merged(declared)


@dataclass(frozen=True)
class OutputAgreement:
    """How closely one output of the variant reproduces ONNX Runtime's.

    Attributes:
        cosine: Cosine similarity over the whole evaluation set.
        snr_db: 10·log10(reference energy / error energy); inf when identical.
        max_abs_error: Largest absolute difference of any value.
        min_sample_cosine: The worst sample's cosine similarity.
    """

    cosine: float
    snr_db: float
    max_abs_error: float
    min_sample_cosine: float


def agreement(
    reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]
) -> dict[str, OutputAgreement]:
    """Compare the variant's outputs with ONNX Runtime's, output by output."""
    result = {}
    for name, expected in reference.items():
        want = expected.astype(np.float64)
        got = np.asarray(candidate[name]).reshape(expected.shape).astype(np.float64)
        error = got - want
        signal = float(np.sum(want * want))
        noise = float(np.sum(error * error))
        snr = math.inf if noise == 0 else (10 * math.log10(signal / noise) if signal else -math.inf)
        result[name] = OutputAgreement(
            cosine=_cosine(want.reshape(-1), got.reshape(-1)),
            snr_db=snr,
            max_abs_error=float(np.max(np.abs(error))) if error.size else 0.0,
            min_sample_cosine=float(
                np.min(_row_cosines(want.reshape(len(want), -1), got.reshape(len(got), -1)))
            )
            if len(want)
            else 1.0,
        )
    return result


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    # Elementwise sums, not np.dot/np.linalg.norm: BLAS threads stall for tens of
    # milliseconds on a loaded 2-core build machine (benchmarks/verify.py).
    norms = float(np.sqrt(np.sum(a * a)) * np.sqrt(np.sum(b * b)))
    if norms == 0:
        return 1.0 if not np.any(a) and not np.any(b) else 0.0
    return float(np.sum(a * b) / norms)


def _row_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)
    dots = np.sum(a * b, axis=1)
    both_zero = (np.linalg.norm(a, axis=1) == 0) & (np.linalg.norm(b, axis=1) == 0)
    return np.where(norms > 0, dots / np.maximum(norms, 1e-300), np.where(both_zero, 1.0, 0.0))


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


class TaskShapeError(TaskDataError):
    """Labels whose shape cannot be the output's: a configuration error naming both shapes."""


def task_rows(outputs: np.ndarray) -> np.ndarray:
    """Per-sample tensors without their batch axis: ``(N, 1, ...)`` -> ``(N, ...)``."""
    if outputs.ndim >= 2 and outputs.shape[1] == 1:
        return outputs[:, 0]
    return outputs


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


def beyond_trivial(level: float) -> float:
    """The least a reference must score on its labels, given a trivial predictor's ``level``.

    A tenth of the way from the trivial score to perfect: a reference at or
    below it is fed inputs it was not trained on (preprocessing, a chunk
    without its context), or the labels are not what it predicts.
    """
    return level + 0.1 * (1.0 - level)


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
            f"axis {task.class_axis}); store one class index per pixel, shaped like the map"
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
    metrics = {"embedding_cosine": float(np.min(_row_cosines(ref, var)))}
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


@dataclass(frozen=True)
class GateResult:
    """One budget checked against one measured number."""

    name: str
    budget: float
    measured: float
    passed: bool
    detail: str = ""
    #: "at least" or "at most", for messages: "IoU 0.20 < 0.90".
    bound: Literal["min", "max"] = "max"

    def describe(self) -> str:
        """One line: the measured number against the budget."""
        sign = "<" if self.bound == "min" else ">"
        ok_sign = ">=" if self.bound == "min" else "<="
        relation = ok_sign if self.passed else sign
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.name} {self.measured:.4g} {relation} {self.budget:.4g}{detail}"


@dataclass(frozen=True)
class GateReport:
    """Every gate of a variant."""

    results: list[GateResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        """True when no gate failed."""
        return all(result.passed for result in self.results)

    @property
    def failures(self) -> list[GateResult]:
        """The gates that failed."""
        return [result for result in self.results if not result.passed]


def check_gates(
    budgets: Budgets,
    *,
    size_bytes: int,
    agreement: Mapping[str, OutputAgreement],
    scores: TaskScores | None,
    latency_p50_ms: float | None,
    required_metrics: Collection[str] | None = None,
    latency_detail: str | None = None,
) -> GateReport:
    """Check every budget that is set; an unset budget is not gated.

    Args:
        latency_detail: How ``latency_p50_ms`` was judged, for the gate's line.
        required_metrics: Metric budgets that must be measured (the ones
            models.toml sets); the others (defaults) lapse when their metric was
            not measured, such as a label metric on a set without labels.
            None: every metric budget is required.

    Raises:
        TaskDataError: a required metric budget names a metric that was not
            measured (a label metric on an evaluation set without labels).
    """
    results: list[GateResult] = []
    tolerance = 1e-12
    if budgets.max_size_mb is not None:
        size_mb = size_bytes / 1e6
        results.append(
            GateResult("max_size_mb", budgets.max_size_mb, size_mb, size_mb <= budgets.max_size_mb)
        )
    for name, agree in agreement.items():
        if budgets.min_cosine is not None:
            results.append(
                GateResult(
                    f"min_cosine[{name}]",
                    budgets.min_cosine,
                    agree.cosine,
                    agree.cosine >= budgets.min_cosine - tolerance,
                    bound="min",
                )
            )
        if budgets.min_snr_db is not None:
            results.append(
                GateResult(
                    f"min_snr_db[{name}]",
                    budgets.min_snr_db,
                    agree.snr_db,
                    agree.snr_db >= budgets.min_snr_db,
                    bound="min",
                )
            )
        if budgets.max_abs_error is not None:
            results.append(
                GateResult(
                    f"max_abs_error[{name}]",
                    budgets.max_abs_error,
                    agree.max_abs_error,
                    agree.max_abs_error <= budgets.max_abs_error,
                )
            )
    if scores is not None:
        limits = {
            name: value
            for name, value in budgets.metrics.items()
            if name in scores.metrics or required_metrics is None or name in required_metrics
        }
        results += _metric_gates(limits, scores, tolerance)
        for name, why in scores.vacuous.items():
            # Passing on agreement that cannot disagree would hide a useless reference.
            results.append(GateResult(f"{name}.informative", 1.0, 0.0, False, why, "min"))
    if budgets.max_latency_p50_ms is not None and latency_p50_ms is not None:
        results.append(
            GateResult(
                "max_latency_p50_ms",
                budgets.max_latency_p50_ms,
                latency_p50_ms,
                latency_p50_ms <= budgets.max_latency_p50_ms,
                latency_detail or "",
            )
        )
    return GateReport(results)


def _metric_gates(
    limits_by_metric: Mapping[str, MetricBudget], scores: TaskScores, tolerance: float
) -> list[GateResult]:
    results = []
    for name, limits in limits_by_metric.items():
        if name not in scores.metrics:
            info = scores.metric_info.get(name)
            if info is not None and info.against == "labels":
                raise TaskDataError(
                    f"budgets.metrics.{name} is set, but '{name}' is scored on labels and the "
                    "evaluation set has none; add labels to the evaluation set or remove the "
                    "budget"
                )
            raise TaskDataError(f"budgets.metrics.{name} names a metric that was not measured")
        value = scores.metrics[name]
        detail = scores.details.get(name, "")
        higher = scores.metric_info[name].higher_is_better if name in scores.metric_info else True
        if limits.min is not None:
            results.append(
                GateResult(
                    f"{name}.min", limits.min, value, value >= limits.min - tolerance, detail, "min"
                )
            )
        if limits.max is not None:
            results.append(
                GateResult(
                    f"{name}.max", limits.max, value, value <= limits.max + tolerance, detail, "max"
                )
            )
        baseline = scores.baseline.get(name)
        if baseline is None:
            continue
        if limits.max_drop is not None:
            drop = baseline - value if higher else value - baseline
            results.append(
                GateResult(
                    f"{name}.max_drop",
                    limits.max_drop,
                    drop,
                    drop <= limits.max_drop + tolerance,
                    detail or f"{name} {baseline:.4f} (ONNX) -> {value:.4f}",
                )
            )
        if limits.min_baseline is not None:
            results.append(
                GateResult(
                    f"{name}.min_baseline",
                    limits.min_baseline,
                    baseline,
                    baseline >= limits.min_baseline - tolerance,
                    scores.details.get(f"{name}.baseline", "the fp32 ONNX model itself"),
                    "min",
                )
            )
        if limits.max_baseline is not None:
            results.append(
                GateResult(
                    f"{name}.max_baseline",
                    limits.max_baseline,
                    baseline,
                    baseline <= limits.max_baseline + tolerance,
                    "the fp32 ONNX model itself",
                    "max",
                )
            )
    return results


@dataclass(frozen=True)
class Scored:
    """A candidate artifact's agreement, task scores and gates (latency not yet in)."""

    agreement: dict[str, OutputAgreement]
    scores: TaskScores | None
    gates: GateReport
    size_bytes: int
