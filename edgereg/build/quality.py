"""Pure numeric checks of a variant: output agreement, task metrics, default budgets, gates.

Everything here takes arrays and returns numbers; the build stages feed it the
outputs of ONNX Runtime (the fp32 reference) and of the variant, run the same
way an app runs the model (see :mod:`edgereg.toolchain._streaming`). Outputs
arrive per sample, ``(N, *tensor shape)``; a task reads its output with the
batch axis (first, of size 1) removed.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from edgereg.config import Budgets, MetricBudget
from edgereg.tasks import TASK_CLASSES, PrecisionClass, task_class
from edgereg.tasks.scoring import TaskDataError, TaskScores, row_cosines

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

#: Default limits on each task's metrics, by precision: a view of the task
#: specs (``DEFAULT_LIMITS`` in edgereg/tasks/<kind>.py), for the docs and tests.
DEFAULT_METRICS: dict[str, dict[PrecisionClass, dict[str, MetricBudget]]] = {
    kind: {p: dict(limits) for p, limits in cls.DEFAULT_LIMITS.items()}
    for kind, cls in TASK_CLASSES.items()
    if cls.DEFAULT_LIMITS
}

#: Label metrics lost against the fp32 baseline, by default, for every precision.
DEFAULT_LABEL_DROP = 0.05


def default_budgets(task: str, precision: PrecisionClass) -> Budgets:
    """The budgets a variant gets before models.toml overrides them.

    Output agreement by precision, then the task kind's own defaults (its
    spec's ``DEFAULT_LIMITS`` and ``LABEL_DROPS``).
    """
    cosine, snr = DEFAULT_AGREEMENT[precision]
    spec = task_class(task)
    metrics: dict[str, MetricBudget] = {}
    if spec is not None:
        metrics.update(spec.DEFAULT_LIMITS.get(precision, {}))
        for name in spec.LABEL_DROPS:
            metrics[name] = MetricBudget(max_drop=DEFAULT_LABEL_DROP)
    return Budgets(min_cosine=cosine, min_snr_db=snr, metrics=metrics)


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
                np.min(row_cosines(want.reshape(len(want), -1), got.reshape(len(got), -1)))
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
