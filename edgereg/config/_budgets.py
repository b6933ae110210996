"""Budgets: the limits a variant must stay within."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from edgereg.config._base import MAX_MB, MAX_MS, _Strict


class MetricBudget(_Strict):
    """Limits on one task metric (see the task's metric list in the docs)."""

    min: float | None = Field(
        default=None, description="The variant's value must be at least this."
    )
    max: float | None = Field(default=None, description="The variant's value must be at most this.")
    max_drop: float | None = Field(
        default=None,
        ge=0,
        description="Label metrics: at most this much worse than the fp32 ONNX baseline on the "
        "same labels (for lower-is-better metrics such as CER, a rise).",
    )
    min_baseline: float | None = Field(
        default=None,
        description="Label metrics: the fp32 ONNX baseline itself must reach this; a baseline "
        "below it points at broken preprocessing, not at the variant.",
    )
    max_baseline: float | None = Field(
        default=None, description="As min_baseline, for lower-is-better metrics."
    )

    def merged(self, override: MetricBudget | None) -> MetricBudget:
        """Return these limits with every field set in ``override`` replaced."""
        if override is None:
            return self
        return self.model_copy(update=override.model_dump(exclude_unset=True))


class Budgets(_Strict):
    """Limits a variant must stay within.

    Output agreement (cosine, SNR, max abs error) and the task's metrics have
    documented defaults per precision; a key set here replaces the default.
    """

    max_size_mb: float | None = Field(default=None, gt=0, le=MAX_MB)
    min_cosine: float | None = Field(
        default=None,
        ge=-1,
        le=1,
        description="Cosine similarity of each output with the fp32 ONNX Runtime reference, "
        "over the whole evaluation set.",
    )
    min_snr_db: float | None = Field(
        default=None,
        # float32 agreement tops out near 150 dB; a budget above 300 can never pass
        # and one below 0 accepts outputs noisier than the signal.
        ge=0,
        le=300,
        description="Signal-to-noise ratio of each output against the reference, in dB "
        "(10·log10 of reference energy over error energy; 20 dB = 10% relative L2 error).",
    )
    max_abs_error: float | None = Field(
        default=None,
        ge=0,
        description="Max absolute difference of any output value from the reference.",
    )
    max_latency_p50_ms: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MS,
        description="Host p50 latency at the variant's thread count: the median over five "
        "fresh loads of each one's steady p50, each call at min(wall, CPU) time.",
    )
    max_memory_mb: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MB,
        description="Peak memory (MiB) that loading the variant and running it at its "
        "declared input shape adds to a process, measured on the build host.",
    )
    max_first_inference_ms: float | None = Field(
        default=None,
        gt=0,
        le=MAX_MS,
        description="Host latency of the first inference after load, at the variant's "
        "thread count: the median over five fresh loads, each at min(wall, CPU) time.",
    )
    metrics: dict[str, MetricBudget] = Field(
        default_factory=dict,
        description="Limits on the task's metrics, by metric name (e.g. iou = { min = 0.9 }).",
    )

    def merged(self, override: Budgets | None) -> Budgets:
        """Return these budgets with every field set in ``override`` replaced.

        Metric limits merge per metric and per field, so a variant can change
        one limit of one metric and keep the rest.
        """
        if override is None:
            return self
        update: dict[str, Any] = override.model_dump(exclude_unset=True, exclude={"metrics"})
        if "metrics" in override.model_fields_set:
            metrics = dict(self.metrics)
            for name, limits in override.metrics.items():
                metrics[name] = metrics[name].merged(limits) if name in metrics else limits
            update["metrics"] = metrics
        return self.model_copy(update=update)
