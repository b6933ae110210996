"""Canary analysis: is the candidate arm of a rollout worse than the concurrent stable arm?

Pure statistics over what the report store aggregates (:class:`ArmSummary`
per tier and arm): no I/O, no clock. Per tier, each guardrail of
``[rollout.guardrails]`` gets a verdict with its numbers. The built-in ones are the
entries of :data:`edgereg.config.BUILTIN_GUARDRAILS` (their tests below); those on
app metrics are judged as rates of "worse" (:class:`MetricView`):

- failure rates (the ``rate`` guardrails): always-valid evidence
  (a mixture sequential probability ratio test, exact at any number of
  devices) of "the candidate's rate is higher by more than max_increase" and
  of the opposite, with the confidence sequence of the difference; and each
  arm's rate against the absolute ``max_rate`` (the stable's raises an alarm);
- latencies and other values per device (the ``shift`` guardrails): time-uniform confidence
  bands of each arm's distribution (valid at any look), with the
  Hodges-Lehmann shift as the estimate, in percent of the stable median.

A guardrail fails when the evidence says the candidate is worse by more than
its limit, passes when it says the candidate is within the limit and each arm
has ``min_devices``, and is inconclusive otherwise. docs/operations/canary-analysis.md
explains the rules and how to read the numbers.
"""

from edgereg.analysis._canary import (
    LATENCY_GUARDRAILS,
    POOL,
    RATE_GUARDRAILS,
    SPECS,
    Analysis,
    GuardrailResult,
    GuardrailSpec,
    MetricView,
    TierAnalysis,
    Verdict,
    analysis_periods,
    analysis_sequences,
    analyze,
    analyze_tier,
    combine,
    metric_specs,
)
from edgereg.analysis._ranks import ShiftComparison, compare_latency, mann_whitney
from edgereg.analysis._rates import RateComparison, RateLimitCheck, check_rate_limit, compare_rates

__all__ = [
    "LATENCY_GUARDRAILS",
    "POOL",
    "RATE_GUARDRAILS",
    "SPECS",
    "Analysis",
    "GuardrailResult",
    "GuardrailSpec",
    "MetricView",
    "RateComparison",
    "RateLimitCheck",
    "ShiftComparison",
    "TierAnalysis",
    "Verdict",
    "analysis_periods",
    "analysis_sequences",
    "analyze",
    "analyze_tier",
    "check_rate_limit",
    "combine",
    "compare_latency",
    "compare_rates",
    "mann_whitney",
    "metric_specs",
]
