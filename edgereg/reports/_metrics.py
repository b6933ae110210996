"""App metrics in the report store: one row per install and metric, summed per arm in SQL.

A report of schema 3 carries its install's totals since the install
(docs/protocol.md §11): a rate's events and successes, a distribution's
count per bucket. The store keeps one row per (token, metric), merged like
the install's row (counts only grow: the highest of each is kept; where the
install is now, its tier, arm and period, comes from the newer report), with
the columns the analysis filters and groups on beside the counts, so a
summary reads one table.

Every metric is stored as bucket counts: a rate as two buckets, ``c0`` the
events that failed and ``c1`` those that succeeded; a distribution as its
K + 1 buckets. A summary reads one statistic of a metric per device, what a
guardrail judges (its success rate, its mean, its share below an edge: a
weighted sum of the device's share of its events in each bucket,
:class:`~edgereg.reports.summary.Statistic`), and sums it per arm, over
devices and over source networks (each network's devices averaged), with the
squares of the networks' means for their spread. A heavy user weighs what any
device does.
"""

from __future__ import annotations

import functools
from typing import Any

from edgereg.protocol.reports import DistributionCounts, RateCounts, Report
from edgereg.reports._sql import NETWORK, arm_filter, network_groups, period_filters

__all__ = [
    "BUCKET_COLUMNS",
    "METRIC_COLUMNS",
    "METRIC_INDEXES",
    "METRIC_SCHEMA",
    "metric_rows",
    "metric_upsert_sql",
    "statistic_sql",
    "tiers_statistic_sql",
]

#: At most 32 buckets (a distribution's 31 edges): ``c0`` .. ``c31``.
BUCKET_COLUMNS = tuple(f"c{i}" for i in range(32))

METRIC_COLUMNS = (
    "token",
    "name",
    "unit",
    "tier",
    "arm",
    "unit_version",
    "sequence",
    "cpu_class",
    "source",
    "received_at",
    "buckets",
    *BUCKET_COLUMNS,
)

# Unused buckets hold 0 (0 costs SQLite no bytes, and keeps the merge's maximum simple).
METRIC_SCHEMA = (
    """CREATE TABLE report_metrics (
    token TEXT NOT NULL,
    name TEXT NOT NULL,
    unit TEXT NOT NULL,
    tier TEXT NOT NULL,
    arm TEXT NOT NULL,
    unit_version TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    cpu_class TEXT,
    source TEXT,
    received_at BIGINT NOT NULL,
    buckets SMALLINT NOT NULL,
    """
    + ",\n    ".join(f"{c} BIGINT NOT NULL DEFAULT 0" for c in BUCKET_COLUMNS)
    + """,
    PRIMARY KEY (token, name)
)""",
)

#: The metric indexes of schema 5 and 6 (a migration replaces the first).
_SCHEMA_5_METRIC_INDEXES = (
    "CREATE INDEX report_metrics_arms ON report_metrics (unit, name, buckets, tier, arm, "
    "unit_version, source, token, sequence, received_at)",
    "CREATE INDEX report_metrics_received ON report_metrics (received_at)",
)

#: A summary reads one unit's metric by name and bucket count, an arm's network by network
#: (the source network, ``COALESCE(source, token)``, as the reports' summary index holds it),
#: per tier or every tier together: grouped as read, not sorted.
METRIC_INDEXES = (
    "CREATE INDEX report_metrics_arms ON report_metrics (unit, name, buckets, arm, "
    f"unit_version, {NETWORK}, tier, token, source, sequence, received_at)",
    _SCHEMA_5_METRIC_INDEXES[1],
)

_FROM_NEWER = ("unit", "tier", "arm", "unit_version", "cpu_class", "source", "buckets")


def metric_rows(report: Report, received: int, source: str | None) -> list[tuple[Any, ...]]:
    """The ``report_metrics`` rows of one report (none before schema 3), in column order.

    Args:
        received: When it arrived, epoch milliseconds.
    """
    rows = []
    for name, counts in (report.metrics or {}).items():
        if isinstance(counts, RateCounts):
            buckets = [counts.events - counts.successes, counts.successes]
        else:
            assert isinstance(counts, DistributionCounts)
            buckets = list(counts.counts)
        padded = buckets + [0] * (len(BUCKET_COLUMNS) - len(buckets))
        rows.append(
            (
                report.token,
                name,
                report.unit,
                report.tier,
                report.arm,
                report.unit_version,
                report.sequence,
                report.cpu_class,
                source,
                received,
                len(buckets),
                *padded,
            )
        )
    return rows


@functools.lru_cache(maxsize=128)
def metric_upsert_sql(placeholder: str, rows: int = 1, *, greatest: str = "MAX") -> str:
    """The upsert of ``rows`` metric rows, merged whatever the order reports arrive in.

    Totals since the install only grow, so each count keeps its highest; where the
    install is (tier, arm, version, period) comes from the newer report, as for
    the install's own row (:func:`edgereg.reports.store.upsert_sql`).
    """
    row = "(" + ", ".join([placeholder] * len(METRIC_COLUMNS)) + ")"
    newer = (
        "(excluded.sequence > report_metrics.sequence OR (excluded.sequence = "
        "report_metrics.sequence AND excluded.received_at >= report_metrics.received_at))"
    )
    sets = [
        f"{c} = CASE WHEN {newer} THEN excluded.{c} ELSE report_metrics.{c} END"
        for c in _FROM_NEWER
    ]
    sets += [
        f"{c} = {greatest}(excluded.{c}, report_metrics.{c})"
        for c in ("sequence", "received_at", *BUCKET_COLUMNS)
    ]
    return (
        f"INSERT INTO report_metrics ({', '.join(METRIC_COLUMNS)}) VALUES "
        f"{', '.join([row] * rows)} ON CONFLICT (token, name) DO UPDATE SET {', '.join(sets)}"
    )


def statistic_sql(
    placeholder: str,
    buckets: int,
    *,
    since: bool,
    since_sequence: bool,
    cpu_class: bool,
    pooled: bool,
    arms: int = 0,
    statistics: int = 1,
) -> str:
    """Per (tier, arm, version): statistics of one metric, per device and per network.

    Each device's statistic is its bucket counts weighted and divided by its
    total (a device that counted nothing is left out); the sums are over
    devices, over networks (each network's devices averaged) and of the
    squares of the networks' means. ``statistics`` statistics of the same
    metric (their own weights each: a mean and a share below an edge) are
    summed in one read of its rows: a row holds the devices, the networks,
    then each statistic's three sums. Parameters bind in this order: each
    statistic's weights, the unit, the name, the bucket count, then the filters
    (sequence, time, CPU class).

    With ``arms``: one branch per arm (as :func:`edgereg.reports.store.counts_sql`
    takes them), each summing its own networks as the index yields them, without
    a sort; a row starts with its branch's number instead of the tier, arm and
    version (an arm without a device that counted the metric has no networks), and
    each branch binds the parameters above and then its arm's (arm, version, tier;
    pooled: arm, version).
    """
    where = _metric_filters(
        placeholder, since=since, since_sequence=since_sequence, cpu_class=cpu_class
    )
    weighted, total = _device_values(placeholder, buckets, statistics)
    shares = ", ".join(_network_values(statistics))
    sums = ", ".join(_arm_sums(statistics))
    if arms:
        devices = (
            f"SELECT {NETWORK} AS net, {weighted}, {total} AS t FROM report_metrics "
            f"WHERE {where} AND {arm_filter(placeholder, pooled)}"
        )
        branch = (
            f"{sums} FROM (SELECT COUNT(*) AS n, {shares} FROM ({devices}) "
            "AS devices WHERE t > 0 GROUP BY net) AS networks"
        )
        return " UNION ALL ".join(f"SELECT {g} AS g, {branch}" for g in range(arms))
    devices = (
        f"SELECT tier, arm, unit_version, {NETWORK} AS net, "
        f"{weighted}, {total} AS t FROM report_metrics WHERE {where}"
    )
    # In the order of report_metrics_arms (METRIC_INDEXES): grouped as read, not sorted.
    tier = "'*'" if pooled else "tier"
    networks = (
        f"SELECT {tier} AS tier, arm, unit_version, COUNT(*) AS n, {shares} "
        f"FROM ({devices}) AS devices WHERE t > 0 GROUP BY {network_groups(pooled)}"
    )
    return (
        f"SELECT tier, arm, unit_version, {sums} FROM ({networks}) AS networks "
        "GROUP BY tier, arm, unit_version"
    )


def tiers_statistic_sql(
    placeholder: str,
    buckets: int,
    *,
    since: bool,
    since_sequence: bool,
    cpu_class: bool,
    arms: int,
    tiers: int,
    statistics: int = 1,
) -> str:
    """:func:`statistic_sql` of each (arm, version) pooled and per tier, in one read of its rows.

    One branch per (arm, version) reads its rows network by network (the
    index's order) once: each network's devices summed over every tier (the
    pooled arm) and, apart, over each of ``tiers`` tiers (a device's tier a
    number by the parameters it binds); the arm's sums then add up the networks
    as :func:`statistic_sql` does, for every tier together and for each tier (a
    network without a device of the tier is none of it). The same additions as
    the two reads they replace, each in the same order. A row: the branch, then
    the pooled part (devices, networks, each statistic's three sums), then each
    tier's part alike. Each branch binds each statistic's weights, its tiers
    (``tiers`` of them: None for a tier it has not), then the unit, the name,
    the bucket count, the filters, and its arm and version.
    """
    p = placeholder
    where = _metric_filters(p, since=since, since_sequence=since_sequence, cpu_class=cpu_class)
    where += f" AND {arm_filter(p, pooled=True)}"
    stats = range(statistics)
    weighted, total = _device_values(p, buckets, statistics)
    which = "CASE tier " + " ".join(f"WHEN {p} THEN {i}" for i in range(tiers)) + " ELSE -1 END"
    devices = (
        f"SELECT {NETWORK} AS net, {weighted}, {which} AS ti, {total} AS t "
        f"FROM report_metrics WHERE {where}"
    )
    per_network = ["COUNT(*) AS n", *_network_values(statistics)]
    sums = _arm_sums(statistics)
    for i in range(tiers):
        per_network.append(f"SUM(CASE WHEN ti = {i} THEN 1 ELSE 0 END) AS n_{i}")
        per_network += [
            f"SUM(CASE WHEN ti = {i} THEN 1.0 * w{k} / t ELSE 0 END) AS v{k}_{i}" for k in stats
        ]
        some = f"n_{i} > 0"
        sums += [f"SUM(n_{i})", f"SUM(CASE WHEN {some} THEN 1 ELSE 0 END)"]
        sums += [
            f"SUM(v{k}_{i}), SUM(CASE WHEN {some} THEN v{k}_{i} / n_{i} ELSE 0 END), "
            f"SUM(CASE WHEN {some} THEN (v{k}_{i} / n_{i}) * (v{k}_{i} / n_{i}) ELSE 0 END)"
            for k in stats
        ]
    branch = (
        f"{', '.join(sums)} FROM (SELECT {', '.join(per_network)} FROM ({devices}) AS devices "
        "WHERE t > 0 GROUP BY net) AS networks"
    )
    return " UNION ALL ".join(f"SELECT {g} AS g, {branch}" for g in range(arms))


def _metric_filters(placeholder: str, *, since: bool, since_sequence: bool, cpu_class: bool) -> str:
    """One metric's rows of a unit: binds the unit, the name, the bucket count, the filters."""
    p = placeholder
    return f"unit = {p} AND name = {p} AND buckets = {p}" + period_filters(
        p, since_sequence=since_sequence, since=since, cpu_class=cpu_class
    )


def _device_values(placeholder: str, buckets: int, statistics: int) -> tuple[str, str]:
    """Each device's weighted counts (``w0``.. one per statistic, bound weights) and its total."""
    used = BUCKET_COLUMNS[:buckets]
    weighted = ", ".join(
        " + ".join(f"{placeholder} * {c}" for c in used) + f" AS w{k}" for k in range(statistics)
    )
    return weighted, " + ".join(used)


def _network_values(statistics: int) -> list[str]:
    """A network's devices' statistics summed (``v0``..), each device's weighted over its total."""
    return [f"SUM(1.0 * w{k} / t) AS v{k}" for k in range(statistics)]


def _arm_sums(statistics: int) -> list[str]:
    """An arm's row: devices, networks, then each statistic's three sums.

    Over devices, over networks (each network's mean), and of the networks' means squared.
    """
    return ["SUM(n)", "COUNT(*)"] + [
        f"SUM(v{k}), SUM(v{k} / n), SUM((v{k} / n) * (v{k} / n))" for k in range(statistics)
    ]
