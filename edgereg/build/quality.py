"""Pure numeric checks of a variant: agreement with ONNX Runtime, accuracy, gates."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from edgereg.config import Budgets


@dataclass(frozen=True)
class Agreement:
    """How closely the variant reproduces the ONNX Runtime outputs."""

    max_abs_error: float
    min_cosine: float
    mean_cosine: float
    top1_agreement: float | None


@dataclass(frozen=True)
class Classification:
    """Accuracy and per-class recall of one set of predictions."""

    accuracy: float
    class_recall: dict[int, float]


@dataclass(frozen=True)
class GateResult:
    """One budget checked against one measured number."""

    name: str
    budget: float
    measured: float
    passed: bool
    detail: str = ""


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


def agreement(
    reference: dict[str, np.ndarray], candidate: dict[str, np.ndarray], *, classification: bool
) -> Agreement:
    """Compare the variant's outputs with ONNX Runtime's, output by output."""
    max_error = 0.0
    cosines: list[np.ndarray] = []
    for name, expected in reference.items():
        actual = candidate[name].reshape(expected.shape).astype(np.float64)
        expected64 = expected.astype(np.float64)
        max_error = max(max_error, float(np.max(np.abs(actual - expected64))))
        flat_expected = expected64.reshape(len(expected64), -1)
        flat_actual = actual.reshape(len(actual), -1)
        norms = np.linalg.norm(flat_expected, axis=1) * np.linalg.norm(flat_actual, axis=1)
        dots = np.sum(flat_expected * flat_actual, axis=1)
        cosines.append(np.where(norms > 0, dots / np.maximum(norms, 1e-30), 1.0))
    all_cosines = np.concatenate(cosines)
    top1 = None
    if classification:
        first = next(iter(reference))
        expected_top1 = np.argmax(reference[first].reshape(len(reference[first]), -1), axis=1)
        actual_top1 = np.argmax(candidate[first].reshape(len(candidate[first]), -1), axis=1)
        top1 = float(np.mean(expected_top1 == actual_top1))
    return Agreement(
        max_abs_error=max_error,
        min_cosine=float(np.min(all_cosines)),
        mean_cosine=float(np.mean(all_cosines)),
        top1_agreement=top1,
    )


def classify(logits: np.ndarray, labels: np.ndarray, num_classes: int) -> Classification:
    """Accuracy and recall of every class present in ``labels``."""
    predicted = np.argmax(logits.reshape(len(logits), -1), axis=1)
    recall = {}
    for label in range(num_classes):
        mask = labels == label
        if np.any(mask):
            recall[label] = float(np.mean(predicted[mask] == label))
    return Classification(accuracy=float(np.mean(predicted == labels)), class_recall=recall)


def recall_drops(baseline: Classification, variant: Classification) -> dict[int, float]:
    """Per-class recall lost by the variant (positive means worse)."""
    return {
        label: baseline.class_recall[label] - variant.class_recall.get(label, 0.0)
        for label in baseline.class_recall
    }


def check_gates(
    budgets: Budgets,
    *,
    size_bytes: int,
    agreement: Agreement,
    gate_abs_error: bool,
    baseline: Classification | None,
    variant: Classification | None,
    latency_p50_ms: float | None,
    class_names: list[str] | None = None,
) -> GateReport:
    """Check every budget that is set; a budget that is unset is not gated."""
    results = []
    if budgets.max_size_mb is not None:
        size_mb = size_bytes / 1e6
        results.append(
            GateResult("max_size_mb", budgets.max_size_mb, size_mb, size_mb <= budgets.max_size_mb)
        )
    if budgets.max_abs_error is not None and gate_abs_error:
        error = agreement.max_abs_error
        results.append(
            GateResult(
                "max_abs_error", budgets.max_abs_error, error, error <= budgets.max_abs_error
            )
        )
    if baseline is not None and variant is not None:
        if budgets.max_accuracy_drop is not None:
            drop = baseline.accuracy - variant.accuracy
            results.append(
                GateResult(
                    "max_accuracy_drop",
                    budgets.max_accuracy_drop,
                    drop,
                    drop <= budgets.max_accuracy_drop + 1e-12,
                    f"accuracy {baseline.accuracy:.4f} (ONNX) -> {variant.accuracy:.4f}",
                )
            )
        if budgets.max_class_recall_drop is not None:
            drops = recall_drops(baseline, variant)
            worst = sorted(drops.items(), key=lambda item: item[1], reverse=True)
            _label, drop = worst[0]
            names = class_names or []
            # Only classes that lost recall are worth naming; at least the worst one.
            losers = [item for item in worst[:3] if item[1] > 0] or worst[:1]
            shown = ", ".join(
                f"{names[lbl] if lbl < len(names) else lbl}: -{d:.3f}" for lbl, d in losers
            )
            results.append(
                GateResult(
                    "max_class_recall_drop",
                    budgets.max_class_recall_drop,
                    drop,
                    drop <= budgets.max_class_recall_drop + 1e-12,
                    f"worst classes {shown}",
                )
            )
    if budgets.max_latency_p50_ms is not None and latency_p50_ms is not None:
        results.append(
            GateResult(
                "max_latency_p50_ms",
                budgets.max_latency_p50_ms,
                latency_p50_ms,
                latency_p50_ms <= budgets.max_latency_p50_ms,
            )
        )
    return GateReport(results)
