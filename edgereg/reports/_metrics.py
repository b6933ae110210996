"""App metrics in the report store: one encoded column of the install's row, tallied as read.

A report of schema 3 carries its install's totals since the install
(docs/protocol.md §11): a rate's events and successes, a distribution's
count per bucket. The store keeps them in the install's own ``reports`` row
(schema 8), in two columns: ``metrics``, every metric's bucket counts in one
text (:func:`encode`: ``name:c0,c1,...`` per metric, by name, joined with
``;``; a rate is two buckets, ``c0`` the events that failed and ``c1`` those
that succeeded, a distribution its K + 1), and ``metric_events``, the sum of
every count. Totals only grow, so of two reports of an install the one whose
totals count more events is the later one: a merge keeps the metrics with the
most events (:data:`MERGE`), whatever the order reports arrive in. A report
without metrics keeps the ones stored. One row per report written, no table
or index of their own (schema 5 to 7 wrote a row per install and metric,
five B-trees more per report of five metrics: docs/operations/reports.md).

A summary reads the column once per unit, an arm's rows network by network as
the summary index holds them, and tallies in Python what a guardrail judges of
a metric per device (its success rate, its mean, its share below an edge:
:class:`~edgereg.reports.summary.Statistic`), summed per arm over devices and
over source networks (each network's devices averaged), with the squares of
the networks' means for their spread. Only each network's sums are held: the
memory does not grow with the reports.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from operator import mul
from typing import Any

from edgereg.protocol.reports import DistributionCounts, RateCounts, Report
from edgereg.reports.summary import Statistic

__all__ = [
    "BUCKET_COLUMNS",
    "MERGE",
    "METRIC_COLUMNS",
    "METRIC_INDEXES",
    "METRIC_SCHEMA",
    "decode",
    "encode",
    "tally",
]

_loads = json.loads

#: The two columns of ``reports`` that hold an install's app metrics (schema 8).
COLUMNS = ("metrics", "metric_events")

#: How a report's metrics merge into its install's row: the ones that count the most
#: events (totals since the install only grow), of two alike the greater text (any order
#: gives the same row); a report without metrics keeps the row's. ``{new}`` is the report
#: (``excluded``), ``{old}`` the row.
MERGE = (
    "CASE WHEN {new}.metrics IS NOT NULL AND ({old}.metrics IS NULL "
    "OR {new}.metric_events > {old}.metric_events OR ({new}.metric_events = "
    "{old}.metric_events AND {new}.metrics > {old}.metrics)) THEN {new}.{column} "
    "ELSE {old}.{column} END"
)


def encode(report: Report) -> tuple[str | None, int | None]:
    """The ``metrics`` and ``metric_events`` of one report (None, None before schema 3)."""
    if not report.metrics:
        return None, None
    parts = []
    events = 0
    for name in sorted(report.metrics):
        counts = report.metrics[name]
        if isinstance(counts, RateCounts):
            buckets = [counts.events - counts.successes, counts.successes]
        else:
            assert isinstance(counts, DistributionCounts)
            buckets = list(counts.counts)
        events += sum(buckets)
        parts.append(f"{name}:{','.join(map(str, buckets))}")
    return ";".join(parts), events


def decode(text: str) -> dict[str, list[int]]:
    """The bucket counts of each metric in a ``metrics`` column (:func:`encode`).

    Read as the JSON object it spells once its separators are JSON's (a name holds
    neither ``:`` nor ``;``, nor a quote): the C parser, several times faster than
    splitting the text in Python, which the analysis does for every install.
    """
    found: dict[str, list[int]] = _loads('{"' + text.replace(";", '],"').replace(":", '":[') + "]}")
    return found


def tally(
    rows: Iterable[tuple[Any, Any, Any, Any, str]],
    statistics: Mapping[str, Statistic],
    *,
    per_tier: bool,
    pooled: bool,
    pooled_tier: str,
) -> list[tuple[str, tuple[Any, ...]]]:
    """Each arm's sums of each statistic, from rows (tier, arm, version, network, metrics).

    The rows of one (arm, version, network) come one after another (the order
    of the summary index), so only one network's sums are held at a time. Each
    device's statistic is its bucket counts weighted and divided by its total
    (a device that counted nothing of the metric, or counted it with another
    number of buckets, is left out); an arm's sums are over its devices, over
    its networks (each network's devices averaged) and of the squares of the
    networks' means, per tier (``per_tier``) and every tier together
    (``pooled``, tier ``pooled_tier``: a network once, whatever its tiers).

    Returns:
        (statistic name, (tier, arm, version, devices, networks, sum over devices,
        sum of the networks' means, sum of their squares)) for each arm with a
        device that counted the statistic's metric.
    """
    asked = sorted(statistics.items())
    width = len(asked)
    # The statistics of each (metric, buckets), read off one total.
    read: dict[tuple[str, int], list[tuple[int, tuple[float, ...]]]] = {}
    for k, (_, statistic) in enumerate(asked):
        read.setdefault((statistic.metric, statistic.buckets), []).append((k, statistic.weights))
    reads = [(metric, buckets, stats) for (metric, buckets), stats in read.items()]
    arms: dict[tuple[Any, Any, Any], list[list[Any]]] = {}
    # The network being read: per tier, each statistic's devices and their values summed.
    network: dict[Any, list[list[Any]]] = {}
    current: tuple[Any, Any, Any] | None = None

    def add(group: Any, arm: Any, version: Any, sums: list[list[Any]]) -> None:
        of_arm = arms.get((group, arm, version))
        if of_arm is None:
            of_arm = arms[group, arm, version] = [[0, 0, 0.0, 0.0, 0.0] for _ in range(width)]
        for into, (n, v) in zip(of_arm, sums, strict=True):
            if n:
                mean = v / n
                into[0] += n
                into[1] += 1
                into[2] += v
                into[3] += mean
                into[4] += mean * mean

    def flush() -> None:
        assert current is not None
        arm, version, _ = current
        if per_tier:
            for tier, sums in network.items():
                add(tier, arm, version, sums)
        if pooled and len(network) == 1:
            add(pooled_tier, arm, version, next(iter(network.values())))
        elif pooled:
            together = [[0, 0.0] for _ in range(width)]
            for sums in network.values():
                for into, (n, v) in zip(together, sums, strict=True):
                    into[0] += n
                    into[1] += v
            add(pooled_tier, arm, version, together)
        network.clear()

    for tier, arm, version, net, text in rows:
        if current is None or net != current[2] or arm != current[0] or version != current[1]:
            if current is not None:
                flush()
            current = (arm, version, net)
        counts = decode(text)
        sums = network.get(tier)
        for metric, buckets, stats in reads:
            found = counts.get(metric)
            if found is None or len(found) != buckets:
                continue
            total = sum(found)
            if not total:
                continue
            if sums is None:
                sums = network[tier] = [[0, 0.0] for _ in range(width)]
            for k, weights in stats:
                into = sums[k]
                into[0] += 1
                into[1] += sum(map(mul, weights, found)) / total
    if current is not None:
        flush()
    found_sums = []
    for (group, arm, version), of_arm in arms.items():
        for (name, _), sums in zip(asked, of_arm, strict=True):
            if sums[1]:
                found_sums.append((name, (group, arm, version, *sums)))
    return found_sums


# -- schema 5 to 7: one row per install and metric (a migration to 8 reads them) ----------

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

#: The metric indexes of schema 7.
METRIC_INDEXES = (
    "CREATE INDEX report_metrics_arms ON report_metrics (unit, name, buckets, arm, "
    "unit_version, COALESCE(source, token), tier, token, source, sequence, received_at)",
    _SCHEMA_5_METRIC_INDEXES[1],
)

#: Installs whose metric rows a migration to schema 8 reads at a time.
MIGRATION_CHUNK = 2000


def migrate_to_columns(cursor: Any, placeholder: str) -> None:
    """Schema 7 to 8: each install's metric rows into its rows' ``metrics`` column.

    Reads ``report_metrics`` a chunk of installs at a time (by token: bounded
    memory on either database), writes each install's metrics (every member of a
    bundle alike), then drops the table.
    """
    p = placeholder
    after = ""
    while True:
        cursor.execute(
            "SELECT token, name, buckets, " + ", ".join(BUCKET_COLUMNS) + " FROM report_metrics "
            f"WHERE token IN (SELECT DISTINCT token FROM report_metrics WHERE token > {p} "
            f"ORDER BY token LIMIT {MIGRATION_CHUNK}) ORDER BY token",
            (after,),
        )
        rows = cursor.fetchall()
        if not rows:
            break
        installs: dict[str, dict[str, list[int]]] = {}
        for token, name, buckets, *counts in rows:
            installs.setdefault(token, {})[name] = [int(c) for c in counts[: int(buckets)]]
        for token, metrics in installs.items():
            text = ";".join(f"{n}:{','.join(map(str, metrics[n]))}" for n in sorted(metrics))
            cursor.execute(
                f"UPDATE reports SET metrics = {p}, metric_events = {p} WHERE token = {p}",
                (text, sum(sum(c) for c in metrics.values()), token),
            )
        after = rows[-1][0]
    cursor.execute("DROP TABLE report_metrics")
