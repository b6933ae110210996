"""[models.<name>.metrics.<metric>]: the app metrics a model (or bundle) declares.

An app metric is what the app measures about how well the model does its job
on users' real inputs: the user kept the recognised text, the request did not
go to the cloud model, the confidence of an answer. Counts only, never a value
(docs/protocol.md §3 "App metrics", docs/operations/reports.md "Privacy").
A guardrail can sit on any of them (``[rollout.guardrails.<name>] metric = ...``,
:class:`MetricGuardrail`).
"""

from __future__ import annotations

import itertools
import math
from typing import Annotated, Literal

from pydantic import Field, model_validator

from edgereg.config._base import _rule_error, _Strict
from edgereg.protocol.wire import (
    MAX_METRIC_EDGES,
    MAX_METRICS,
    DistributionMetric,
    RateMetric,
)

__all__ = ["MAX_METRICS", "AppMetric", "MetricGuardrail"]


class AppMetric(_Strict):
    """One app metric: a rate (events that succeed) or a distribution in fixed buckets."""

    kind: Literal["rate", "distribution"] = Field(
        description='"rate": the app records events and whether each succeeded '
        '(record(name, success)); "distribution": it observes values, counted in buckets '
        "(observe(name, value))."
    )
    buckets: list[Annotated[float, Field(allow_inf_nan=False)]] | None = Field(
        default=None,
        min_length=1,
        max_length=MAX_METRIC_EDGES,
        description="A distribution's bucket edges, strictly increasing (1 to 31): K edges "
        "make K + 1 buckets, (-inf, e1], (e1, e2], ..., (eK, +inf). Coarse on purpose: a "
        "count per bucket reveals no input.",
    )
    better: Literal["higher", "lower"] = Field(
        default="higher",
        description="Which way is better: a rate's share of successes (higher), or a "
        "distribution's values (a confidence: higher; a retry count: lower).",
    )
    unit: str = Field(default="", max_length=32, description="How a distribution's values read.")
    description: str = ""

    @model_validator(mode="after")
    def _buckets_fit_the_kind(self) -> AppMetric:
        if self.kind == "rate" and self.buckets is not None:
            raise _rule_error("buckets", "a rate has no buckets (it counts events and successes)")
        if self.kind == "distribution":
            if self.buckets is None:
                raise _rule_error(
                    "buckets", "a distribution needs its bucket edges, e.g. [0.5, 0.7, 0.9]"
                )
            if any(b <= a for a, b in zip(self.buckets, self.buckets[1:], strict=False)):
                raise _rule_error(
                    "buckets", f"bucket edges must increase strictly, got {self.buckets}"
                )
        return self

    def declaration(self) -> RateMetric | DistributionMetric:
        """What a release record and a manifest entry carry of it (docs/protocol.md §3)."""
        if self.kind == "rate":
            return RateMetric(kind="rate")
        assert self.buckets is not None
        return DistributionMetric(kind="distribution", buckets=list(self.buckets))

    def bucket_values(self) -> tuple[float, ...]:
        """Each bucket's value for a mean: an inner bucket's middle, an outer one's edge."""
        edges = self.buckets or []
        if not edges:
            return ()
        inner = [(a + b) / 2 for a, b in itertools.pairwise(edges)]
        return (edges[0], *inner, edges[-1])


class MetricGuardrail(_Strict):
    """A guardrail on an app metric: the candidate may not be worse than the stable by more."""

    metric: str = Field(
        description="The app metric it judges (declared in [models.<name>.metrics])."
    )
    max_worse: float = Field(
        ge=0,
        le=1e9,
        description="Largest allowed change in the worse direction (the metric's `better`): "
        "for a rate, or a share (stat share_below/share_above), a fraction of events (0.01 = "
        "one point); for a distribution's mean, in the metric's unit.",
    )
    stat: Literal["mean", "share_below", "share_above"] | None = Field(
        default=None,
        description="What a distribution is judged by, per device: its mean (the default), or "
        "the share of its values at or below (share_below) or above (share_above) `threshold`, "
        "one of its bucket edges. Not for a rate.",
    )
    threshold: float | None = Field(
        default=None,
        allow_inf_nan=False,
        description="The bucket edge a share_below or share_above counts from.",
    )
    critical: bool = Field(
        default=True, description="A failure pauses the rollout (and rolls back by policy)."
    )
    enabled: bool = Field(default=True, description="false: not analysed.")

    @model_validator(mode="after")
    def _threshold_with_a_share(self) -> MetricGuardrail:
        if (self.stat in ("share_below", "share_above")) != (self.threshold is not None):
            raise _rule_error(
                "threshold",
                "a threshold goes with stat share_below or share_above, and they need one",
            )
        return self

    def check_against(self, declared: AppMetric, where: str) -> None:
        """Raise the rule error when this guardrail cannot judge ``declared``."""
        if declared.kind == "rate" and self.stat is not None:
            raise _rule_error(
                f"{where}.stat", f"metric '{self.metric}' is a rate: it has no stat to choose"
            )
        if self.threshold is not None and self.threshold not in (declared.buckets or []):
            raise _rule_error(
                f"{where}.threshold",
                f"{self.threshold:g} is not a bucket edge of '{self.metric}' "
                f"({', '.join(f'{b:g}' for b in declared.buckets or [])})",
            )
        if self.kind_of(declared) == "mean" and not math.isfinite(self.max_worse):
            raise _rule_error(f"{where}.max_worse", "must be a finite number")

    def kind_of(self, declared: AppMetric) -> Literal["rate", "mean", "share"]:
        """How it judges: a rate of successes, a distribution's mean, or a share of values."""
        if declared.kind == "rate":
            return "rate"
        return "mean" if self.stat in (None, "mean") else "share"

    def weights(self, declared: AppMetric) -> tuple[float, ...] | None:
        """Per bucket, what a device's value weighs (None: a rate, successes over events).

        A mean weighs each bucket by its value; a share below ``threshold`` counts the
        buckets at or below it (1) and not the others (0); a share above the reverse.
        """
        if declared.kind == "rate":
            return None
        values = declared.bucket_values()
        if self.stat in (None, "mean"):
            return values
        edges = declared.buckets or []
        assert self.threshold is not None
        at = edges.index(self.threshold)
        below = tuple(1.0 if i <= at else 0.0 for i in range(len(edges) + 1))
        return below if self.stat == "share_below" else tuple(1.0 - w for w in below)

    def worse_when_higher(self, declared: AppMetric) -> bool:
        """Whether a higher per-device value is the worse way."""
        if declared.kind == "rate" or self.stat in (None, "mean"):
            return declared.better == "lower"
        # A share below a threshold of a higher-is-better metric is the bad tail.
        bad_below = declared.better == "higher"
        return bad_below if self.stat == "share_below" else not bad_below
