"""The SQL a summary spells alike in its reads of ``reports``.

The counts, the histograms and the app metrics read a unit's rows with the
same filters in the same order (the parameters a summary binds follow it) and
group them by the same source network, which the summary index holds as an
expression: each is spelled here once, so the statements and the index cannot
drift apart (schemas 5 to 7 also read a table ``report_metrics`` this way).
"""

from __future__ import annotations

__all__ = ["NETWORK", "arm_filter", "arm_groups", "network_groups", "period_filters"]

#: A report's source network, as every summary groups it: its source, or for a report
#: whose source is unknown its token (a network of its own). The summary indexes hold
#: this expression (spelled the same, so that the database matches it).
NETWORK = "COALESCE(source, token)"


def period_filters(placeholder: str, *, since_sequence: bool, since: bool, cpu_class: bool) -> str:
    """The filters after the unit (and the model or metric): `` AND ...``, or ``""``.

    They bind, in this order: the first sequence, the first arrival (ms), the CPU class.
    """
    where = ""
    if since_sequence:
        where += f" AND sequence >= {placeholder}"
    if since:
        where += f" AND received_at >= {placeholder}"
    if cpu_class:
        where += f" AND cpu_class = {placeholder}"
    return where


def arm_filter(placeholder: str, pooled: bool) -> str:
    """One arm's rows: its arm and version (and tier, unless pooled), bound in that order."""
    p = placeholder
    return f"arm = {p} AND unit_version = {p}" + ("" if pooled else f" AND tier = {p}")


def arm_groups(pooled: bool) -> str:
    """The GROUP BY of one row per arm: (tier, arm, version), or pooled (arm, version)."""
    return "arm, unit_version" if pooled else "tier, arm, unit_version"


def network_groups(pooled: bool) -> str:
    """The GROUP BY of one row per source network, in the summary indexes' order.

    ``net`` (:data:`NETWORK`) of the arm and version, per tier or (``pooled``) in
    every tier at once: a prefix of either index after its unit and model (or metric).
    """
    return "arm, unit_version, net" if pooled else "arm, unit_version, net, tier"
