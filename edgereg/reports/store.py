"""The report store: one row per device install, aggregated in the database.

:func:`open_store` takes a URL: ``sqlite:///PATH`` (embedded, one file in WAL
mode, created on first use; a relative PATH is relative to ``base_dir``, the
folder of models.toml; ``sqlite:////abs/path`` is absolute) or
``postgresql://USER:PASSWORD@HOST:PORT/DB`` (psycopg 3). Both backends share
the schema and the SQL below; each only supplies a connection and its error
translation (the shared guard in :class:`ReportStore` turns every database
failure into one :class:`ReportStoreError`).

A row is keyed by ``(token, model)``: the latest report of an install replaces
the earlier one (an upsert, so a replayed or repeated report changes nothing
but that row), and the members of a bundle, which report under the install's
one token, keep a row each. :meth:`ReportStore.summaries` aggregates with
``GROUP BY`` in the database and returns :class:`ArmSummary` values; raw rows
never reach Python.
"""

from __future__ import annotations

import abc
import functools
import itertools
import logging
import re
import string
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple, cast

from edgereg.config import BUILTIN_GUARDRAILS
from edgereg.errors import ExitCode, StorageError
from edgereg.protocol.reports import Report
from edgereg.reports import _metrics
from edgereg.reports._metrics import (
    _SCHEMA_5_METRIC_INDEXES,
    METRIC_INDEXES,
    METRIC_SCHEMA,
)
from edgereg.reports._sql import (
    NETWORK,
    arm_filter,
    arm_groups,
    network_groups,
    period_filters,
)
from edgereg.reports.summary import (
    CONFIRMED,
    EVENTS,
    ArmSummary,
    Histogram,
    MetricTally,
    Statistic,
    Tally,
    latency_bucket,
)

__all__ = [
    "SCHEMA_VERSION",
    "ReportStore",
    "ReportStoreError",
    "StoreURLError",
    "open_store",
    "redact_url",
]

log = logging.getLogger(__name__)

#: The version of the tables below, kept in ``reports_meta``; a store written by a
#: newer edgereg is refused rather than misread.
SCHEMA_VERSION = 8

#: Columns of ``reports`` filled from a report, in insert order.
COLUMNS = (
    "token",
    "model",
    "unit",
    "unit_version",
    "version",
    "variant",
    "tier",
    "arm",
    "sequence",
    "probe",
    "backend",
    "backends_skipped",
    "load_ms",
    "load_bucket",
    "load_failed",
    "inference_count",
    "inference_p50_ms",
    "inference_p90_ms",
    "inference_p99_ms",
    "inference_p50_bucket",
    "confirmed",
    "reverted",
    "mnn_runtime",
    "os",
    "os_version",
    "device_class",
    "unconfirmed_starts",
    "cpu_class",
    "memory_peak_mb",
    "memory_peak_bucket",
    "memory_steady_mb",
    "first_inference_ms",
    "source",
    "first_received_at",
    "received_at",
    *_metrics.COLUMNS,
)

# One DDL for both databases: the types are ones SQLite maps to its affinities.
# Flags are 0/1 integers (SUM works the same in both); times are epoch milliseconds.
SCHEMA = (
    """CREATE TABLE reports (
    token TEXT NOT NULL,
    model TEXT NOT NULL,
    unit TEXT NOT NULL,
    unit_version TEXT NOT NULL,
    version TEXT NOT NULL,
    variant TEXT NOT NULL,
    tier TEXT NOT NULL,
    arm TEXT NOT NULL,
    sequence BIGINT NOT NULL,
    probe TEXT NOT NULL,
    backend TEXT,
    backends_skipped TEXT NOT NULL,
    load_ms DOUBLE PRECISION,
    load_bucket INTEGER,
    load_failed SMALLINT NOT NULL,
    inference_count BIGINT,
    inference_p50_ms DOUBLE PRECISION,
    inference_p90_ms DOUBLE PRECISION,
    inference_p99_ms DOUBLE PRECISION,
    inference_p50_bucket INTEGER,
    confirmed SMALLINT NOT NULL,
    reverted SMALLINT NOT NULL,
    mnn_runtime TEXT,
    os TEXT,
    os_version TEXT,
    device_class TEXT,
    unconfirmed_starts INTEGER,
    cpu_class TEXT,
    memory_peak_mb DOUBLE PRECISION,
    memory_peak_bucket INTEGER,
    memory_steady_mb DOUBLE PRECISION,
    first_inference_ms DOUBLE PRECISION,
    source TEXT,
    first_received_at BIGINT NOT NULL,
    received_at BIGINT NOT NULL,
    metrics TEXT,
    metric_events BIGINT,
    PRIMARY KEY (token, model)
)""",
)

#: The indexes of schemas 4 and 5 (a migration from them drops them). The counts group
#: an arm's installs by source network, so each covering index led with the arm and the
#: network; the period's filter and every column a count reads came after.
_SCHEMA_4_INDEXES = (
    "CREATE INDEX reports_devices ON reports (unit, tier, arm, unit_version, source, "
    "token, sequence, received_at, probe, load_failed, reverted, confirmed, "
    "unconfirmed_starts, first_received_at, model)",
    "CREATE INDEX reports_load ON reports (unit, tier, arm, unit_version, source, "
    "load_bucket, token, sequence, received_at, model)",
    "CREATE INDEX reports_inference ON reports (unit, tier, arm, unit_version, source, "
    "inference_p50_bucket, token, sequence, received_at, model)",
    "CREATE INDEX reports_memory ON reports (unit, tier, arm, unit_version, source, "
    "memory_peak_bucket, token, sequence, received_at, model)",
    "CREATE INDEX reports_received ON reports (received_at)",
    "CREATE INDEX reports_clock ON reports (unit, received_at)",
)

#: The summary index of schema 6 (a migration from it replaces it): led by the unit and
#: the model, then the tier, the arm and the version; a summary grouped by source network
#: sorted every row of the unit once per pass (a network is COALESCE(source, token)).
_SCHEMA_6_SUMMARY_INDEX = (
    "CREATE INDEX reports_summary ON reports (unit, model, tier, arm, unit_version, "
    "source, token, sequence, received_at, probe, load_failed, reverted, confirmed, "
    "unconfirmed_starts, backend, backends_skipped, first_received_at, load_bucket, "
    "inference_p50_bucket, memory_peak_bucket, cpu_class)"
)

#: The indexes of schema 7. One covering index serves every summary (the counts, the
#: three histograms, the CPU classes): it holds every column they filter on or read
#: (a built-in guardrail's ``when`` or ``column`` that reads another must add it here),
#: so no summary reads the table, and a report writes two B-trees at random places
#: (this one and the primary key) instead of five (a server's group commit writes each
#: dirty page of them to the WAL). It leads with the unit and the model: a bundle
#: member's summaries and the check whether a unit has members are seeks. Then the arm,
#: the version and the source network (:data:`NETWORK`, an index on an expression:
#: nothing more is written per report), then the tier: a summary reads an arm's rows
#: network by network, per tier or every tier together (pooled), so the database groups
#: them by network as it reads them instead of sorting every row for each pass.
#: ``reports_received`` serves the retention's prune, ``reports_clock`` the store's
#: clock and a ``--since`` period (both written in time order: at the end).
INDEXES = (
    "CREATE INDEX reports_summary ON reports (unit, model, arm, unit_version, "
    f"{NETWORK}, tier, token, source, sequence, received_at, probe, load_failed, reverted, "
    "confirmed, unconfirmed_starts, backend, backends_skipped, first_received_at, "
    "load_bucket, inference_p50_bucket, memory_peak_bucket, cpu_class)",
    "CREATE INDEX reports_received ON reports (received_at)",
    "CREATE INDEX reports_clock ON reports (unit, received_at)",
)
META_TABLE = "CREATE TABLE IF NOT EXISTS reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

#: A step of a migration that is not one statement: called with a cursor and the placeholder.
_Step = Callable[[Any, str], None]

#: From each schema to the next: schema 2 adds the source network of a report
#: (rows of schema 1 have none: their sources are unknown, never counted).
MIGRATIONS: dict[int, tuple[str | _Step, ...]] = {
    1: (
        "ALTER TABLE reports ADD COLUMN source TEXT",
        # The counts read the source and the install time too: keep them covered.
        "DROP INDEX IF EXISTS reports_devices",
        "CREATE INDEX reports_devices ON reports (unit, tier, arm, unit_version, probe, "
        "load_failed, reverted, confirmed, model, received_at, source, first_received_at)",
    ),
    # Schema 3 keeps the keys of report schema 2 (rows before it have none: null), and
    # the counts read the unconfirmed starts: keep them covered.
    2: (
        "ALTER TABLE reports ADD COLUMN unconfirmed_starts INTEGER",
        "ALTER TABLE reports ADD COLUMN cpu_class TEXT",
        "ALTER TABLE reports ADD COLUMN memory_peak_mb DOUBLE PRECISION",
        "ALTER TABLE reports ADD COLUMN memory_peak_bucket INTEGER",
        "ALTER TABLE reports ADD COLUMN memory_steady_mb DOUBLE PRECISION",
        "ALTER TABLE reports ADD COLUMN first_inference_ms DOUBLE PRECISION",
        "DROP INDEX IF EXISTS reports_devices",
        "CREATE INDEX reports_devices ON reports (unit, tier, arm, unit_version, probe, "
        "load_failed, reverted, confirmed, model, received_at, source, first_received_at, "
        "unconfirmed_starts)",
        "CREATE INDEX reports_memory ON reports (unit, tier, arm, unit_version, "
        "memory_peak_bucket, model, received_at)",
    ),
    # Schema 4 counts per source network and selects a period by sequence: the
    # covering indexes lead with the network and hold the sequence.
    3: (
        "DROP INDEX IF EXISTS reports_devices",
        "DROP INDEX IF EXISTS reports_load",
        "DROP INDEX IF EXISTS reports_inference",
        "DROP INDEX IF EXISTS reports_memory",
        "DROP INDEX IF EXISTS reports_received",
        *_SCHEMA_4_INDEXES,
    ),
    # Schema 5 keeps the app metrics of report schema 3, one row per install and metric.
    4: (*METRIC_SCHEMA, *_SCHEMA_5_METRIC_INDEXES),
    # Schema 6: one covering index for every summary instead of four (see INDEXES).
    5: (
        "DROP INDEX IF EXISTS reports_devices",
        "DROP INDEX IF EXISTS reports_load",
        "DROP INDEX IF EXISTS reports_inference",
        "DROP INDEX IF EXISTS reports_memory",
        _SCHEMA_6_SUMMARY_INDEX,
    ),
    # Schema 7: the summary indexes read an arm network by network (see INDEXES).
    6: (
        "DROP INDEX IF EXISTS reports_summary",
        INDEXES[0],
        "DROP INDEX IF EXISTS report_metrics_arms",
        METRIC_INDEXES[0],
    ),
    # Schema 8: an install's app metrics in its own row, one column (edgereg/reports/_metrics.py).
    7: (
        "ALTER TABLE reports ADD COLUMN metrics TEXT",
        "ALTER TABLE reports ADD COLUMN metric_events BIGINT",
        _metrics.migrate_to_columns,
    ),
}

#: Columns a merge takes from the newer report (the rest merge as :func:`upsert_sql` says).
_FROM_NEWER = (
    "unit",
    "unit_version",
    "version",
    "variant",
    "tier",
    "arm",
    "probe",
    "backend",
    "backends_skipped",
    "load_ms",
    "load_bucket",
    "mnn_runtime",
    "os",
    "os_version",
    "device_class",
    "cpu_class",
    "source",
)
#: Groups of columns taken together from the newer report that has them, else kept.
_KEPT_UNLESS_NEWER_HAS = (
    (
        "inference_count",
        "inference_p50_ms",
        "inference_p90_ms",
        "inference_p99_ms",
        "inference_p50_bucket",
    ),
    ("memory_peak_mb", "memory_peak_bucket"),
    ("memory_steady_mb",),
)


#: Rows a streamed read (:meth:`ReportStore._stream`) fetches at a time.
STREAM_ROWS = 2000

#: Rows per INSERT statement at most. A batch of up to this many rows is one
#: statement of exactly its size (a server's group commit is then one step of the
#: database, and one release of the GIL, per batch: each step's return waits for
#: the GIL behind the request threads); a larger one is statements of this size and
#: one of the rest. Each size is prepared once per connection and stays in the
#: driver's statement cache (SQLite: about 80 KB per prepared 32-row upsert).
ROWS_PER_STATEMENT = 32


def statement_sizes(rows: int) -> list[int]:
    """How many rows each statement of a batch takes: full statements, then the rest."""
    full, rest = divmod(rows, ROWS_PER_STATEMENT)
    return [ROWS_PER_STATEMENT] * full + ([rest] if rest else [])


@functools.lru_cache(maxsize=4 * ROWS_PER_STATEMENT)
def upsert_sql(
    placeholder: str, rows: int = 1, *, greatest: str = "MAX", least: str = "MIN"
) -> str:
    """The upsert of ``rows`` rows; ``placeholder`` is the driver's (``?`` or ``%s``).

    Many rows in one statement: one step of the database (and, in a server,
    one release of the GIL) instead of one per row.

    A report merges into its install's row whatever the order it arrives in
    (docs/protocol.md §12): the flags that only turn true stay true, the counts
    that only grow keep their highest, and the rest comes from the newer
    report (the higher manifest sequence; of two with the same, the one
    received last). So a retry overtaken by a newer report, a replay, or two
    servers whose clocks disagree lose no report's fact.

    Args:
        greatest: The database's two-argument maximum (SQLite ``MAX``,
            PostgreSQL ``GREATEST``); ``least`` likewise.
    """
    row = "(" + ", ".join([placeholder] * len(COLUMNS)) + ")"
    values = ", ".join([row] * rows)
    newer = (
        "(excluded.sequence > reports.sequence OR (excluded.sequence = reports.sequence "
        "AND excluded.received_at >= reports.received_at))"
    )
    sets = [f"{c} = CASE WHEN {newer} THEN excluded.{c} ELSE reports.{c} END" for c in _FROM_NEWER]
    for flag in ("sequence", "load_failed", "confirmed", "reverted", "received_at"):
        sets.append(f"{flag} = {greatest}(excluded.{flag}, reports.{flag})")
    sets.append(
        f"first_received_at = {least}(excluded.first_received_at, reports.first_received_at)"
    )
    sets.append(
        "unconfirmed_starts = CASE WHEN excluded.unconfirmed_starts IS NULL "
        "THEN reports.unconfirmed_starts WHEN reports.unconfirmed_starts IS NULL "
        "THEN excluded.unconfirmed_starts "
        f"ELSE {greatest}(excluded.unconfirmed_starts, reports.unconfirmed_starts) END"
    )
    # The install's first inference is said once and kept.
    sets.append(
        "first_inference_ms = COALESCE(reports.first_inference_ms, excluded.first_inference_ms)"
    )
    for group in _KEPT_UNLESS_NEWER_HAS:
        lead = group[0]
        take = f"(({newer} AND excluded.{lead} IS NOT NULL) OR reports.{lead} IS NULL)"
        sets.extend(f"{c} = CASE WHEN {take} THEN excluded.{c} ELSE reports.{c} END" for c in group)
    # The app metrics that count the most events (_metrics.MERGE).
    sets.extend(
        f"{c} = " + _metrics.MERGE.format(new="excluded", old="reports", column=c)
        for c in _metrics.COLUMNS
    )
    return (
        f"INSERT INTO reports ({', '.join(COLUMNS)}) VALUES {values} "
        f"ON CONFLICT (token, model) DO UPDATE SET {', '.join(sets)}"
    )


_Row = tuple[Any, ...]


def _filters(
    placeholder: str, *, since: bool, since_sequence: bool, model: bool, cpu_class: bool
) -> str:
    where = f"unit = {placeholder}"
    if model:
        # Before the rest: the summary index's second column.
        where += f" AND model = {placeholder}"
    return where + period_filters(
        placeholder, since_sequence=since_sequence, since=since, cpu_class=cpu_class
    )


class _Parameters:
    """Writes a statement's placeholders and remembers what each one binds, in order.

    The leading parameters (the aged cut, the stalled threshold) sit in the
    SELECT list, in a different order in each statement; naming them as they
    are written keeps the values in step with the text.
    """

    def __init__(self, placeholder: str) -> None:
        self.placeholder = placeholder
        self.names: list[str] = []

    def __call__(self, name: str) -> str:
        self.names.append(name)
        return self.placeholder


def _event_expressions(bind: _Parameters) -> dict[str, str]:
    """Each event of :data:`~edgereg.reports.summary.EVENTS` of one row, 0 or 1, in SQL.

    A rate guardrail's is its spec's :attr:`~edgereg.config.BuiltinGuardrail.when`,
    each ``{key}`` in it a parameter named ``key`` (bound in order of appearance).
    """
    events = {
        spec.event: _bound(spec.when, bind) for spec in BUILTIN_GUARDRAILS if spec.test == "rate"
    }
    events[CONFIRMED] = "confirmed"
    return events


def _bound(template: str, bind: _Parameters) -> str:
    """``template`` with each ``{key}`` replaced by a placeholder that binds ``key``."""
    parts = []
    for text, key, _format, _conversion in string.Formatter().parse(template):
        parts.append(text)
        if key is not None:
            parts.append(bind(key))
    return "".join(parts)


def _count_columns(events: Sequence[str]) -> dict[str, str]:
    """The columns of :func:`counts_sql` after (tier, arm, version), by name, in order.

    For every install (``all``) and for the aged ones (``aged``): installs,
    networks, each event's devices (``all.devices.<event>``) and each event's
    network shares summed (``all.networks.<event>``).
    """
    columns = {"all.devices": "SUM(n)", "all.networks": "COUNT(*)"}
    columns.update({f"all.devices.{name}": f"SUM(e_{name})" for name in events})
    columns.update({f"all.networks.{name}": f"SUM(1.0 * e_{name} / n)" for name in events})
    columns["aged.devices"] = "SUM(a)"
    columns["aged.networks"] = "SUM(CASE WHEN a > 0 THEN 1 ELSE 0 END)"
    columns.update({f"aged.devices.{name}": f"SUM(g_{name})" for name in events})
    columns.update(
        {
            f"aged.networks.{name}": f"SUM(CASE WHEN a > 0 THEN 1.0 * g_{name} / a ELSE 0 END)"
            for name in events
        }
    )
    return columns


#: The tier a pooled summary names: every tier's installs together.
POOLED_TIER = "*"


def counts_sql(
    placeholder: str,
    *,
    since: bool,
    since_sequence: bool = False,
    model: bool,
    bundle: bool,
    cpu_class: bool = False,
    pooled: bool = False,
    arms: int = 1,
) -> tuple[str, tuple[str, ...]]:
    """Per arm: installs, networks, and each event per device and network.

    Three steps, the first only for a bundle, whose members report under the
    install's one token: (1) one row per install (it failed a probe when any
    member did, confirmed when every member did); (2) one row per source
    network (a device without a known one is a network of its own) with its
    devices and events; (3) per arm, the devices and events summed, the
    networks counted, and each network's *share* of an event summed (its
    events over its devices), for every install and for the aged ones.

    With ``pooled`` every tier's installs count together (tier ``*``), each
    network once however many tiers its devices are in.

    A bundle's rows are one statement, a row per (tier, arm, version). Any other
    unit's are one branch per arm of ``arms`` that :func:`arms_sql` found, each
    reading its arm's rows off the summary index network by network and summing
    its networks at once (a GROUP BY of every network by arm sorted them all);
    each row starts with its branch's number (``g``) instead of the tier, arm
    and version, and each branch binds the leading parameters, the filters' and
    then its arm's (:func:`arm_filter`).

    Returns:
        The statement, and the names of the parameters that come before the
        filters' (``aged`` for the aged cut, ``stalled_starts``), in the order
        they bind (in each branch).
    """
    bind = _Parameters(placeholder)
    tier = f"'{POOLED_TIER}'" if pooled else "tier"
    by = arm_groups(pooled)
    where = _filters(
        placeholder, since=since, since_sequence=since_sequence, model=model, cpu_class=cpu_class
    )
    events = _event_expressions(bind)
    names = list(events)
    sums = "COUNT(*) AS n, SUM(ag) AS a, " + ", ".join(
        f"SUM({name}) AS e_{name}, SUM({name} * ag) AS g_{name}" for name in names
    )
    columns = ", ".join(_count_columns(names).values())
    if not bundle:
        aged = f"(CASE WHEN first_received_at <= {bind('aged')} THEN 1 ELSE 0 END)"
        devices = (
            f"SELECT {NETWORK} AS net, "
            + ", ".join(f"{expr} AS {name}" for name, expr in events.items())
            + f", {aged} AS ag FROM reports WHERE {where} AND {arm_filter(placeholder, pooled)}"
        )
        branch = (
            f"{columns} FROM (SELECT {sums} FROM ({devices}) AS devices GROUP BY net) AS networks"
        )
        sql = " UNION ALL ".join(f"SELECT {g} AS g, {branch}" for g in range(arms))
        return sql, tuple(bind.names)
    folded = {name: f"MAX({expr})" for name, expr in events.items()}
    folded[CONFIRMED] = "MIN(confirmed)"
    devices = (
        f"SELECT {tier} AS tier, arm, unit_version, COALESCE(MAX(source), token) AS net, "
        + ", ".join(f"{expr} AS {name}" for name, expr in folded.items())
        + f", (CASE WHEN MIN(first_received_at) <= {bind('aged')} THEN 1 ELSE 0 END) AS ag "
        f"FROM reports WHERE {where} GROUP BY {by}, token"
    )
    networks = (
        f"SELECT {tier} AS tier, arm, unit_version, {sums} "
        f"FROM ({devices}) AS devices GROUP BY tier, arm, unit_version, net"
    )
    sql = (
        f"SELECT tier, arm, unit_version, {columns} "
        f"FROM ({networks}) AS networks GROUP BY tier, arm, unit_version"
    )
    return sql, tuple(bind.names)


#: Arms summed per statement at most: each is a part of a compound SELECT (of the
#: histograms: three), whose parts SQLite bounds (500 by default).
ARMS_PER_STATEMENT = 32


def arms_sql(
    placeholder: str,
    *,
    since: bool,
    since_sequence: bool = False,
    model: bool,
    cpu_class: bool = False,
    pooled: bool = False,
) -> str:
    """The arms a summary reports on: (tier, arm, version), or (arm, version) pooled.

    One read of the summary index; each arm's counts and statistics are then
    summed over its own networks (:func:`counts_sql` with ``arms``).
    """
    where = _filters(
        placeholder, since=since, since_sequence=since_sequence, model=model, cpu_class=cpu_class
    )
    by = arm_groups(pooled)
    return f"SELECT DISTINCT {by} FROM reports WHERE {where}"


def metrics_sql(
    placeholder: str,
    *,
    since: bool,
    since_sequence: bool = False,
    model: bool,
    cpu_class: bool = False,
    bundle: bool = False,
) -> str:
    """The app metrics of a unit's installs: (tier, arm, version, network, metrics) rows.

    In the order :func:`edgereg.reports._metrics.tally` reads them, an arm's
    networks one after another: a model's rows off the summary index as it lies
    (no sort). A bundle's members each carry the install's metrics: its rows are
    sorted so that an install's come together (with their events and token), for
    :func:`best_of_members`. Parameters: the filters' (:func:`_filters`).
    """
    where = _filters(
        placeholder, since=since, since_sequence=since_sequence, model=model, cpu_class=cpu_class
    )
    order = f"ORDER BY arm, unit_version, {NETWORK}"
    if not bundle:
        return (
            f"SELECT tier, arm, unit_version, {NETWORK}, metrics FROM reports "
            f"WHERE {where} AND metrics IS NOT NULL {order}"
        )
    return (
        f"SELECT tier, arm, unit_version, {NETWORK}, metrics, metric_events, token FROM reports "
        f"WHERE {where} AND metrics IS NOT NULL {order}, tier, token"
    )


def best_of_members(rows: Iterable[Sequence[Any]]) -> Iterator[tuple[Any, ...]]:
    """A bundle's :func:`metrics_sql` rows, one per install: its member that counts the most.

    Each member of a bundle carries the install's metrics; a merge would keep the
    ones that count the most events (of two alike the greater text). An install's
    rows come one after another (the same arm, version, network and tier).
    """
    best: Sequence[Any] | None = None
    for row in rows:
        if best is not None and row[:4] == best[:4] and row[6] == best[6]:
            if (row[5], row[4]) > (best[5], best[4]):
                best = row
            continue
        if best is not None:
            yield tuple(best[:5])
        best = row
    if best is not None:
        yield tuple(best[:5])


def has_members_sql(placeholder: str) -> str:
    """Whether a unit has rows of models other than itself (it is a bundle).

    Two seeks of the summary index (a model named before the unit's, or after it), not
    ``model <> unit``, which reads every row of a model that is no bundle. Parameters:
    the unit four times.
    """
    p = placeholder
    return (
        f"SELECT EXISTS (SELECT 1 FROM reports WHERE unit = {p} AND model < {p}) "
        f"OR EXISTS (SELECT 1 FROM reports WHERE unit = {p} AND model > {p})"
    )


def members_sql(placeholder: str) -> str:
    """The models a unit's rows name, but the unit itself: one seek per model.

    A loose index scan (each step the least model above the last one found), not a
    DISTINCT over every row of the unit. Parameters: the unit three times.
    """
    p = placeholder
    return (
        "WITH RECURSIVE found(model) AS ("
        f"SELECT MIN(model) FROM reports WHERE unit = {p} "
        f"UNION ALL SELECT (SELECT MIN(model) FROM reports WHERE unit = {p} "
        "AND model > found.model) FROM found WHERE found.model IS NOT NULL) "
        f"SELECT model FROM found WHERE model IS NOT NULL AND model <> {p}"
    )


#: The bucket column of each histogram of :data:`~edgereg.reports.summary.HISTOGRAMS`.
HISTOGRAM_COLUMNS = {
    spec.histogram: spec.column for spec in BUILTIN_GUARDRAILS if spec.test == "shift"
}


def histogram_sql(
    placeholder: str,
    *,
    since: bool,
    since_sequence: bool = False,
    model: bool,
    cpu_class: bool = False,
    pooled: bool = False,
) -> tuple[str, int]:
    """Per (tier, arm, version, kind, view, bucket): devices or networks in the bucket.

    For each kind (:data:`HISTOGRAM_COLUMNS`) three views: ``d`` every
    device's value; ``l`` each source network at its lowest value; ``h`` at
    its highest (a device without a known network is one of its own).

    Returns:
        The statement and how many times the filters' parameters repeat in it.
    """
    where = _filters(
        placeholder, since=since, since_sequence=since_sequence, model=model, cpu_class=cpu_class
    )
    tier = f"'{POOLED_TIER}'" if pooled else "tier"
    by = arm_groups(pooled)
    # One pass over the networks for every kind's lowest and highest value (read off the
    # summary index network by network), kept for the views that count them.
    extremes = ", ".join(
        f"MIN({column}) AS l{i}, MAX({column}) AS h{i}"
        for i, column in enumerate(HISTOGRAM_COLUMNS.values())
    )
    networks = (
        f"WITH nets AS MATERIALIZED (SELECT {tier} AS tier, arm, unit_version, {extremes} "
        f"FROM (SELECT tier, arm, unit_version, {NETWORK} AS net, "
        f"{', '.join(HISTOGRAM_COLUMNS.values())} FROM reports WHERE {where}) AS devices "
        f"GROUP BY {network_groups(pooled)}) "
    )
    parts = []
    for i, (kind, column) in enumerate(HISTOGRAM_COLUMNS.items()):
        parts.append(
            f"SELECT '{kind}', 'd', {tier}, arm, unit_version, {column}, COUNT(*) "
            f"FROM reports WHERE {where} AND {column} IS NOT NULL GROUP BY {by}, {column}"
        )
        for view in ("l", "h"):
            parts.append(
                f"SELECT '{kind}', '{view}', tier, arm, unit_version, {view}{i}, COUNT(*) "
                f"FROM nets WHERE {view}{i} IS NOT NULL GROUP BY tier, arm, unit_version, {view}{i}"
            )
    return networks + " UNION ALL ".join(parts), 1 + len(HISTOGRAM_COLUMNS)


def arm_histogram_sql(
    placeholder: str,
    *,
    since: bool,
    since_sequence: bool = False,
    cpu_class: bool = False,
    pooled: bool = False,
    arms: int,
    networks: bool = True,
) -> tuple[str, list[int | None]]:
    """The histograms of a model's arms (:func:`histogram_sql`'s rows), with few sorts.

    A network of one device with a value is at that value at its lowest and at
    its highest: only the networks of two or more (``multi``: one pass over the
    summary index, in its order) are counted apart. Rows: ``d`` each device's
    value, per arm (one branch per arm of :func:`arms_sql`: a sort of one arm's
    values, by the value alone); for the networks of two or more devices with a
    value, ``L`` and ``H`` their lowest and highest and ``x`` their devices'
    values. A view of the networks is then ``d - x + L`` (``H``): :func:`_assemble`.

    ``networks``: False leaves out the networks of two or more (the arms of a
    statement after the first: they are counted once, for every arm).

    Returns:
        The statement and what each of its parts binds, in order: None the
        filters (unit, model, ...), a number g the filters and then arm g's
        (:func:`arm_filter`).
    """
    where = _filters(
        placeholder, since=since, since_sequence=since_sequence, model=True, cpu_class=cpu_class
    )
    tier = f"'{POOLED_TIER}'" if pooled else "tier"
    columns = list(HISTOGRAM_COLUMNS.values())
    extremes = ", ".join(
        f"COUNT({column}) AS n{i}, MIN({column}) AS l{i}, MAX({column}) AS h{i}"
        for i, column in enumerate(columns)
    )
    several = " OR ".join(f"COUNT({column}) > 1" for column in columns)
    sql = (
        f"WITH multi AS MATERIALIZED (SELECT {tier} AS tier, arm, unit_version, net, {extremes} "
        f"FROM (SELECT tier, arm, unit_version, {NETWORK} AS net, {', '.join(columns)} "
        f"FROM reports WHERE {where}) AS devices GROUP BY {network_groups(pooled)} "
        f"HAVING {several}) "
    )
    binds: list[int | None] = [None] if networks else []
    same = (
        "r.arm = m.arm AND r.unit_version = m.unit_version AND "
        + NETWORK.replace("source", "r.source").replace("token", "r.token")
        + " = m.net"
        + ("" if pooled else " AND r.tier = m.tier")
    )
    parts = []
    arm_tier = f"'{POOLED_TIER}'" if pooled else "MIN(tier)"
    for i, (kind, column) in enumerate(HISTOGRAM_COLUMNS.items()):
        for g in range(arms):
            parts.append(
                f"SELECT '{kind}', 'd', {arm_tier}, MIN(arm), MIN(unit_version), {column}, "
                f"COUNT(*) FROM reports WHERE {where} AND {arm_filter(placeholder, pooled)} "
                f"AND {column} IS NOT NULL GROUP BY {column}"
            )
            binds.append(g)
        if not networks:
            continue
        parts.append(
            f"SELECT '{kind}', 'x', m.tier, m.arm, m.unit_version, r.{column}, COUNT(*) "
            f"FROM multi AS m JOIN reports AS r ON {same} WHERE {where} AND m.n{i} > 1 "
            f"AND r.{column} IS NOT NULL GROUP BY m.tier, m.arm, m.unit_version, r.{column}"
        )
        binds.append(None)
        for view, pick in (("L", "l"), ("H", "h")):
            parts.append(
                f"SELECT '{kind}', '{view}', tier, arm, unit_version, {pick}{i}, COUNT(*) "
                f"FROM multi WHERE n{i} > 1 GROUP BY tier, arm, unit_version, {pick}{i}"
            )
    return (sql if networks else "") + " UNION ALL ".join(parts), binds


def epoch_ms(when: datetime) -> int:
    """Milliseconds since the epoch of an aware datetime.

    Raises:
        ValueError: ``when`` has no time zone (a naive time would be read as local).
    """
    if when.tzinfo is None:
        raise ValueError("a report time must carry its time zone (datetime.now(timezone.utc))")
    return int(when.timestamp() * 1000)


def report_row(report: Report, received_at: datetime, source: str | None = None) -> tuple[Any, ...]:
    """The ``reports`` row of one report, in :data:`COLUMNS` order.

    Args:
        source: The network the report came from (an IPv4 /24, an IPv6 /48),
            None when unknown (a proxy that is not trusted, a collector).
    """
    inference = report.inference
    received = epoch_ms(received_at)
    return (
        report.token,
        report.model,
        report.unit,
        report.unit_version,
        report.version,
        report.variant,
        report.tier,
        report.arm,
        report.sequence,
        report.probe,
        report.backend,
        ",".join(report.backends_skipped),
        report.load_ms,
        None if report.load_ms is None else latency_bucket(report.load_ms),
        int(report.load_failed),
        None if inference is None else inference.count,
        None if inference is None else inference.p50_ms,
        None if inference is None else inference.p90_ms,
        None if inference is None else inference.p99_ms,
        None if inference is None else latency_bucket(inference.p50_ms),
        int(report.confirmed),
        int(report.reverted),
        report.mnn_runtime,
        report.os,
        report.os_version,
        report.device_class,
        report.unconfirmed_starts,
        report.cpu_class,
        report.memory_peak_mb,
        None if report.memory_peak_mb is None else latency_bucket(report.memory_peak_mb),
        report.memory_steady_mb,
        report.first_inference_ms,
        source,
        received,
        received,
        *_metrics.encode(report),
    )


class Prepared(NamedTuple):
    """A report as the store writes it (:func:`prepare`): its key and its row."""

    key: tuple[str, str]
    row: tuple[Any, ...]


def prepare(report: Report, received_at: datetime, source: str | None = None) -> Prepared:
    """The rows of one report, made before the write.

    A server makes them in the request's thread, so the one thread that writes a
    batch (:class:`~edgereg.reports.batch.GroupCommit`) only hands them to the database.

    Raises:
        ValueError: ``received_at`` has no time zone.
    """
    return Prepared((report.token, report.model), report_row(report, received_at, source))


class ReportStoreError(StorageError):
    """The report store cannot be reached, read or written (usually retryable)."""


class StoreURLError(ReportStoreError):
    """A report store URL that names no store this edgereg can open."""

    exit_code = ExitCode.USAGE

    def __init__(self, message: str, *, url: str, hint: str | None = None) -> None:
        super().__init__(message, url=url, hint=hint, retryable=False)


_PASSWORD = re.compile(r"(?<=://)([^:/@]*):[^@/]*@")
_PASSWORD_PARAM = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***`` (for messages and logs)."""
    return _PASSWORD_PARAM.sub(r"\1***", _PASSWORD.sub(r"\1:***@", url))


class ReportStore(abc.ABC):
    """Where device reports are kept and aggregated.

    Public methods share one guard: whatever the database raises comes out as
    :class:`ReportStoreError` (the URL in it without a password). The schema is
    created (or checked) on first use. Safe to share between threads.

    Attributes:
        url: The store's URL, password redacted.
    """

    url: str

    # -- the backend's primitives -----------------------------------------------

    @abc.abstractmethod
    def _connection(self) -> AbstractContextManager[Any]:
        """A DB-API connection for one unit of work (committed by the caller)."""

    @abc.abstractmethod
    def _translate(self, exc: Exception) -> ReportStoreError | None:
        """The store error for a driver exception, or None when it is not the driver's."""

    placeholder: str = "?"
    #: The database's two-argument maximum and minimum (SQLite's MAX/MIN; GREATEST/LEAST).
    greatest: str = "MAX"
    least: str = "MIN"
    _schema_checked = False

    # -- the guard ----------------------------------------------------------------

    def _run(self, work: str, operation: Any) -> Any:
        try:
            if not self._schema_checked:
                self._ensure_schema()
            return operation()
        except ReportStoreError:
            raise
        except Exception as exc:
            error = self._translate(exc)
            if error is None:
                raise
            error.message = f"{work}: {error.message}"
            raise error from exc

    def _ensure_schema(self) -> None:
        with self._connection() as conn:
            cur = conn.cursor()
            self._lock_schema(cur)
            cur.execute(META_TABLE)
            cur.execute(
                f"SELECT value FROM reports_meta WHERE key = {self.placeholder}", ("schema",)
            )
            found = cur.fetchone()
            if found is None:
                for statement in (*SCHEMA, *INDEXES):
                    cur.execute(statement)
                cur.execute(
                    f"INSERT INTO reports_meta (key, value) VALUES ({self.placeholder}, "
                    f"{self.placeholder})",
                    ("schema", str(SCHEMA_VERSION)),
                )
                log.info("created the report store schema %d in %s", SCHEMA_VERSION, self.url)
            elif int(found[0]) < SCHEMA_VERSION:
                for version in range(int(found[0]), SCHEMA_VERSION):
                    for step in MIGRATIONS[version]:
                        if isinstance(step, str):
                            cur.execute(step)
                        else:
                            step(cur, self.placeholder)
                cur.execute(
                    f"UPDATE reports_meta SET value = {self.placeholder} "
                    f"WHERE key = {self.placeholder}",
                    (str(SCHEMA_VERSION), "schema"),
                )
                log.info(
                    "migrated the report store in %s from schema %s to %d",
                    self.url,
                    found[0],
                    SCHEMA_VERSION,
                )
            elif int(found[0]) > SCHEMA_VERSION:
                conn.rollback()
                raise ReportStoreError(
                    f"the store holds schema {found[0]}, written by a newer edgereg; this one "
                    f"reads schema {SCHEMA_VERSION}",
                    url=self.url,
                    hint="Upgrade edgereg, or point [reports] store at another database.",
                    retryable=False,
                )
            conn.commit()
        self._schema_checked = True

    def _statements(self, rows: Sequence[tuple[Any, ...]]) -> list[tuple[str, list[Any]]]:
        """The upserts of rows (distinct keys): a few multi-row statements."""
        statements = []
        start = 0
        for size in statement_sizes(len(rows)):
            chunk = rows[start : start + size]
            start += size
            statements.append(
                (
                    upsert_sql(self.placeholder, size, greatest=self.greatest, least=self.least),
                    list(itertools.chain.from_iterable(chunk)),
                )
            )
        return statements

    def _write_rows(self, cursor: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        """Upsert rows (distinct keys) in the open transaction."""
        for sql, params in self._statements(rows):
            cursor.execute(sql, params)

    def _write_batch(self, rounds: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        """Store rounds of rows in one transaction (the keys distinct per round)."""
        with self._connection() as conn:
            cursor = conn.cursor()
            for rows in rounds:
                self._write_rows(cursor, rows)
            conn.commit()

    def _stream(self, conn: Any, sql: str, params: Sequence[Any]) -> Iterable[tuple[Any, ...]]:
        """The rows of a query, fetched a part at a time (not all held at once)."""
        cursor = conn.cursor()
        cursor.execute(sql, params)
        while rows := cursor.fetchmany(STREAM_ROWS):
            yield from rows

    @abc.abstractmethod
    def _lock_schema(self, cursor: Any) -> None:
        """Serialize schema creation between processes (the backend's way)."""

    # -- the interface ------------------------------------------------------------

    def check(self) -> None:
        """Connect and create or check the schema now (rather than on first use)."""
        self._run("opening the report store", lambda: None)

    def ingest(self, report: Report, received_at: datetime, source: str | None = None) -> None:
        """Store one report (replacing the earlier one of its install and model).

        Args:
            source: The network it came from (see :func:`report_row`), or None.
        """
        self.ingest_many([(report, received_at, source)])

    def ingest_many(
        self, reports: Iterable[tuple[Report, datetime] | tuple[Report, datetime, str | None]]
    ) -> int:
        """Store reports (each with its time, and optionally its source) in one transaction.

        Returns:
            How many were given.
        """
        return self.ingest_prepared(
            prepare(item[0], item[1], item[2] if len(item) > 2 else None) for item in reports
        )

    def ingest_prepared(self, prepared: Iterable[Prepared]) -> int:
        """Store reports made into rows by :func:`prepare`, in one transaction.

        Returns:
            How many were given.
        """
        # One statement may not touch a row twice (PostgreSQL refuses): reports of the
        # same install in one batch go in successive statements, each merged by the upsert.
        rounds: list[dict[tuple[str, str], _Row]] = []
        given = 0
        for key, row in prepared:
            given += 1
            for batch in rounds:
                if key not in batch:
                    break
            else:
                batch = {}
                rounds.append(batch)
            batch[key] = row

        def write() -> int:
            self._write_batch([list(rows.values()) for rows in rounds])
            return given

        return cast(int, self._run("storing reports", write))

    def summaries(
        self,
        unit: str,
        since: datetime | None = None,
        *,
        since_sequence: int | None = None,
        model: str | None = None,
        aged_before: datetime | None = None,
        cpu_class: str | None = None,
        stalled_starts: int = 2,
        pooled: bool = False,
        statistics: Mapping[str, Statistic] | None = None,
        bundle: bool | None = None,
        with_pool: bool = False,
    ) -> list[ArmSummary]:
        """Per (tier, arm, version) of ``unit``: installs, events and histograms, per network.

        Args:
            unit: The model or bundle.
            since: Only installs whose latest report arrived at or after this time.
            since_sequence: Only installs whose latest report carries this
                manifest sequence or a later one: a rollout period (every device
                reports in each, docs/protocol.md §11).
            model: Only this member of a bundle (its own latency histograms).
            aged_before: Also count apart the installs that first reported at or
                before this time (``aged``): the installs that had time to crash-loop.
            cpu_class: Only the reports of this CPU class (report schema 2's
                ``cpu_class``; :meth:`cpu_classes` lists them).
            stalled_starts: Count as ``stalled`` the installs not confirmed after
                this many app starts (the unconfirmed guardrail's ``stalled_starts``).
            pooled: Every tier together, per (arm, version), tier ``*``: each
                network counted once, in however many tiers its devices are.
            statistics: What to tally of the app metrics, by a name the
                summaries' ``metrics`` then use (a guardrail's): only installs
                that counted the metric with the statistic's number of buckets
                (a release that declared it otherwise counted another metric).
                None with ``model`` (app metrics are the unit's).
            bundle: Whether ``unit`` is a bundle, as the registry says (its release
                record); None: the store looks whether its rows name other models.
            with_pool: Also the pooled summaries (tier ``*``, as ``pooled`` gives
                them) after the ones per tier, read in the same snapshot; a model's
                app metrics are read once for both (per tier and pooled at once).

        Returns:
            One summary per (tier, arm, version), sorted by tier, arm and version.

        Raises:
            ValueError: ``stalled_starts`` is not a whole number >= 1.
        """
        if isinstance(stalled_starts, bool) or not isinstance(stalled_starts, int):
            raise ValueError(f"stalled_starts must be a whole number, got {stalled_starts!r}")
        if stalled_starts < 1:
            raise ValueError(f"stalled_starts must be at least 1, got {stalled_starts}")
        # The filters' parameters after the unit and the model (in _filters' order).
        filters: list[Any] = []
        if since_sequence is not None:
            filters.append(since_sequence)
        if since is not None:
            filters.append(epoch_ms(since))
        if cpu_class is not None:
            filters.append(cpu_class)
        flags = {
            "since": since is not None,
            "since_sequence": since_sequence is not None,
            "cpu_class": cpu_class is not None,
        }
        if model is not None and statistics:
            raise ValueError("app metrics are the unit's: ask for their statistics without model")
        # Without a cut every install counts as aged (the same statement either way).
        cut = epoch_ms(aged_before) if aged_before is not None else 2**62
        leading = {"aged": cut, "stalled_starts": stalled_starts}

        _Sums = list[tuple[str, Sequence[Any]]]

        def scope(grouped: bool) -> tuple[list[Any], dict[str, bool]]:
            """The filters' parameters (the unit, the model, ...) and their shape."""
            # A model's rows all name it (admission refuses a model its release does
            # not hold): the summary index is then read from (unit, model) on, its
            # networks in order. A bundle's summaries read every member's rows.
            only = model if model is not None else None if grouped else unit
            params = [unit, *([only] if only is not None else []), *filters]
            return params, {**flags, "model": only is not None}

        def arms_of(cur: Any, pooled: bool) -> list[tuple[Any, ...]]:
            """A model's arms: (tier, arm, version), pooled with tier ``*``."""
            params, shape = scope(False)
            cur.execute(arms_sql(self.placeholder, **shape, pooled=pooled), params)
            return [(POOLED_TIER, *row) if pooled else tuple(row) for row in cur.fetchall()]

        def metric_sums(
            conn: Any, grouped: bool, per_tier: bool, pool: bool
        ) -> tuple[_Sums, _Sums]:
            """The app metrics' statistics per tier and pooled, in one read of the unit's rows."""
            if not statistics:
                return [], []
            params, shape = scope(grouped)
            sql = metrics_sql(self.placeholder, **shape, bundle=grouped)
            rows = self._stream(conn, sql, params)
            found = _metrics.tally(
                best_of_members(rows) if grouped else rows,
                statistics,
                per_tier=per_tier,
                pooled=pool,
                pooled_tier=POOLED_TIER,
            )
            return (
                [s for s in found if s[1][0] != POOLED_TIER],
                [s for s in found if s[1][0] == POOLED_TIER],
            )

        def tally(
            cur: Any, grouped: bool, pooled: bool, arms: list[tuple[Any, ...]], sums: _Sums
        ) -> list[ArmSummary]:
            """The summaries, per tier or ``pooled``: a bundle's, or a model's ``arms``.

            ``sums``: the app metrics' statistics (:func:`metric_sums`).
            """
            params, shape = scope(grouped)
            # Each arm's own filter binds (arm, version[, tier]).
            keys = [(arm, version) + (() if pooled else (tier,)) for tier, arm, version in arms]
            counts: list[Sequence[Any]] = []
            bins: list[Sequence[Any]] = []
            if grouped:
                # A bundle's installs are its members' rows folded, every arm at once.
                sql, names = counts_sql(self.placeholder, **shape, bundle=True, pooled=pooled)
                # The leading parameters sit in the per-row expressions, before the filters.
                cur.execute(sql, [leading[name] for name in names] + params)
                counts = cur.fetchall()
                sql, repeats = histogram_sql(self.placeholder, **shape, pooled=pooled)
                cur.execute(sql, params * repeats)
                bins = cur.fetchall()
            # A model's arms, a few per statement (a compound SELECT has a bounded
            # number of parts), each row's branch number made its arm again: each arm
            # is summed over its own networks, read in the index's order.
            for first in range(0, len(arms), ARMS_PER_STATEMENT):
                chunk = arms[first : first + ARMS_PER_STATEMENT]
                chunk_keys = keys[first : first + ARMS_PER_STATEMENT]
                sql, names = counts_sql(
                    self.placeholder, **shape, bundle=False, pooled=pooled, arms=len(chunk)
                )
                leads = [leading[name] for name in names]
                cur.execute(sql, [v for key in chunk_keys for v in (*leads, *params, *key)])
                counts += [(*chunk[row[0]], *row[1:]) for row in cur.fetchall()]
                sql, binds = arm_histogram_sql(
                    self.placeholder,
                    **flags,
                    pooled=pooled,
                    arms=len(chunk),
                    networks=first == 0,
                )
                bound = [(*params, *(() if g is None else chunk_keys[g])) for g in binds]
                cur.execute(sql, [v for values in bound for v in values])
                bins += cur.fetchall()
            return _assemble(unit, counts, bins, sums, aged=aged_before is not None)

        def read() -> list[ArmSummary]:
            with self._connection() as conn:
                cur = conn.cursor()
                grouped = False  # a bundle's members, one install per token
                if model is None and bundle is None:
                    cur.execute(has_members_sql(self.placeholder), (unit,) * 4)
                    grouped = bool(cur.fetchone()[0])
                elif model is None:
                    grouped = bool(bundle)
                both = with_pool and not pooled
                # The app metrics read once for the summaries per tier and the pooled ones.
                per_tier, pool = metric_sums(conn, grouped, not pooled, pooled or both)
                if grouped:
                    found = tally(cur, True, pooled, [], pool if pooled else per_tier)
                    found += tally(cur, True, True, [], pool) if both else []
                elif both:
                    found = tally(cur, False, False, arms_of(cur, False), per_tier)
                    found += tally(cur, False, True, arms_of(cur, True), pool)
                else:
                    sums = pool if pooled else per_tier
                    found = tally(cur, False, pooled, arms_of(cur, pooled), sums)
                conn.rollback()  # read only: end the snapshot
            return found

        return cast(list[ArmSummary], self._run("summarizing reports", read))

    def clock(self, unit: str) -> datetime | None:
        """The report servers' clock, as the store last heard it.

        The latest of the server's clock marks (:meth:`mark_clock`, written every
        minute by `edgereg serve`) and the arrival of ``unit``'s newest report.
        Install ages are counted against it, not against the clock of the host
        that runs the analysis: every time they compare was stamped by the
        report servers (docs/operations/canary-analysis.md, "One clock"). None
        when the store has neither.
        """

        def read() -> datetime | None:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute(
                    f"SELECT MAX(received_at) FROM reports WHERE unit = {self.placeholder}",
                    (unit,),
                )
                (newest,) = cur.fetchone()
                cur.execute(
                    f"SELECT value FROM reports_meta WHERE key = {self.placeholder}", ("clock",)
                )
                marked = cur.fetchone()
                conn.rollback()
            times = [int(t) for t in (newest, marked[0] if marked else None) if t is not None]
            if not times:
                return None
            return datetime.fromtimestamp(max(times) / 1000, tz=timezone.utc)

        return cast("datetime | None", self._run("reading the store's clock", read))

    def mark_clock(self, now: datetime) -> None:
        """Record the report server's clock (kept when later than the one recorded).

        With several servers the latest mark stands: a server whose clock runs
        ahead moves ages forward by its skew, which the analysis says.
        """
        stamp = str(epoch_ms(now))
        p = self.placeholder

        def write() -> None:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute(
                    f"INSERT INTO reports_meta (key, value) VALUES ({p}, {p}) "
                    "ON CONFLICT (key) DO UPDATE SET value = CASE WHEN "
                    "CAST(excluded.value AS BIGINT) > CAST(reports_meta.value AS BIGINT) "
                    "THEN excluded.value ELSE reports_meta.value END",
                    ("clock", stamp),
                )
                conn.commit()

        self._run("marking the store's clock", write)

    def cpu_classes(self, unit: str) -> list[str]:
        """The CPU classes the unit's reports name (report schema 2), sorted."""

        def read() -> list[str]:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute(
                    f"SELECT DISTINCT cpu_class FROM reports WHERE unit = {self.placeholder} "
                    "AND cpu_class IS NOT NULL",
                    (unit,),
                )
                found = sorted(str(row[0]) for row in cur.fetchall())
                conn.rollback()
            return found

        return cast(list[str], self._run("listing CPU classes", read))

    def members(self, unit: str) -> list[str]:
        """The member models of a bundle that reported (empty for a model), sorted."""

        def read() -> list[str]:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute(members_sql(self.placeholder), (unit,) * 3)
                found = sorted(str(row[0]) for row in cur.fetchall())
                conn.rollback()
            return found

        return cast(list[str], self._run("listing bundle members", read))

    def prune(self, older_than: datetime) -> int:
        """Delete installs whose latest report is older than ``older_than``.

        Returns:
            The rows deleted.
        """
        cutoff = epoch_ms(older_than)

        def delete() -> int:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute(
                    f"DELETE FROM reports WHERE received_at < {self.placeholder}", (cutoff,)
                )
                deleted = int(cur.rowcount)
                conn.commit()
            return deleted

        deleted = cast(int, self._run("pruning reports", delete))
        if deleted:
            log.info("pruned %d reports older than %s from %s", deleted, older_than, self.url)
        return deleted

    def count(self) -> int:
        """Rows in the store (installs × models)."""

        def read() -> int:
            with self._connection() as conn:
                cur = conn.cursor()
                cur.execute("SELECT COUNT(*) FROM reports")
                (n,) = cur.fetchone()
                conn.rollback()
            return int(n)

        return cast(int, self._run("counting reports", read))

    @abc.abstractmethod
    def close(self) -> None:
        """Release the connections."""

    def __enter__(self) -> ReportStore:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _assemble(
    unit: str,
    counts: Sequence[Sequence[Any]],
    bins: Sequence[Sequence[Any]],
    sums: Sequence[tuple[str, Sequence[Any]]] = (),
    *,
    aged: bool,
) -> list[ArmSummary]:
    views: dict[tuple[str, str, str], dict[str, dict[str, dict[int, int]]]] = {}
    for kind, view, tier, arm, version, bucket, number in bins:
        kinds = views.setdefault((tier, arm, version), {})
        found = kinds.setdefault(kind, {"d": {}, "l": {}, "h": {}, "x": {}, "L": {}, "H": {}})
        found[view][int(bucket)] = int(number)
    for kinds in views.values():
        for found in kinds.values():
            if not found["l"] and not found["h"]:
                # arm_histogram_sql's rows: each network of one device at its device's value.
                found["l"] = _networks(found["d"], found["x"], found["L"])
                found["h"] = _networks(found["d"], found["x"], found["H"])
    metrics: dict[tuple[str, str, str], dict[str, MetricTally]] = {}
    for name, (tier, arm, version, devices, networks, *sums_of) in sums:
        metrics.setdefault((tier, arm, version), {})[name] = MetricTally(
            int(devices or 0), int(networks or 0), *(float(v or 0.0) for v in sums_of)
        )
    names = ("tier", "arm", "version", *_count_columns(EVENTS))
    summaries = []
    for row in counts:
        values = dict(zip(names, row, strict=True))
        tier, arm, version = values["tier"], values["arm"], values["version"]
        histograms = {
            kind: Histogram(
                dict(sorted(found["d"].items())),
                dict(sorted(found["l"].items())),
                dict(sorted(found["h"].items())),
            )
            for kind, found in views.get((tier, arm, version), {}).items()
        }
        summaries.append(
            ArmSummary(
                unit=unit,
                tier=tier,
                arm=cast(Literal["candidate", "stable"], arm),
                version=version,
                all=_tally(values, "all"),
                aged=_tally(values, "aged") if aged else None,
                histograms=histograms,
                metrics=dict(sorted(metrics.get((tier, arm, version), {}).items())),
            )
        )
    return sorted(summaries, key=lambda s: (s.tier, s.arm, s.version))


def _networks(
    devices: Mapping[int, int], several: Mapping[int, int], picked: Mapping[int, int]
) -> dict[int, int]:
    """Networks per bucket, from the devices per bucket.

    Every device (``devices``) but those of networks of two or more (``several``),
    and each such network at its picked value (``picked``, its lowest or highest).
    """
    out = {b: n - several.get(b, 0) for b, n in devices.items()}
    for bucket, n in picked.items():
        out[bucket] = out.get(bucket, 0) + n
    return {b: n for b, n in out.items() if n}


def _tally(values: Mapping[str, Any], installs: str) -> Tally:
    """The tally of ``installs`` (``all`` or ``aged``) in a row named by :func:`_count_columns`."""
    return Tally(
        int(values[f"{installs}.devices"] or 0),
        int(values[f"{installs}.networks"] or 0),
        {name: int(values[f"{installs}.devices.{name}"] or 0) for name in EVENTS},
        {name: float(values[f"{installs}.networks.{name}"] or 0.0) for name in EVENTS},
    )


def open_store(url: str, *, base_dir: Path | None = None) -> ReportStore:
    """Open the report store a URL names (nothing is connected until first use).

    Args:
        url: ``sqlite:///PATH`` or ``postgresql://...`` (also ``postgres://``).
        base_dir: What a relative SQLite path is relative to (the folder of
            models.toml); the current directory when None.

    Raises:
        StoreURLError: not a URL of a supported store, or malformed.
    """
    scheme, sep, rest = url.partition("://")
    shown = redact_url(url)
    if not sep:
        raise StoreURLError(
            f"{shown!r} is not a store URL",
            url=shown,
            hint="Use sqlite:///PATH (relative to models.toml) or postgresql://USER@HOST/DB.",
        )
    if scheme == "sqlite":
        from edgereg.reports._sqlite import SQLiteStore

        if not rest.startswith("/") or rest == "/":
            raise StoreURLError(
                f"{shown!r} names no file: write sqlite:///relative/path.sqlite or "
                "sqlite:////absolute/path.sqlite (three slashes, then the path)",
                url=shown,
            )
        path = Path(rest[1:])
        if not path.is_absolute():
            path = (base_dir or Path.cwd()) / path
        return SQLiteStore(path, url=shown)
    if scheme in ("postgresql", "postgres"):
        from edgereg.reports._postgres import PostgresStore

        return PostgresStore(url)
    raise StoreURLError(
        f"unsupported report store scheme {scheme!r} in {shown!r}",
        url=shown,
        hint="Use sqlite:///PATH or postgresql://USER@HOST:PORT/DB.",
    )


def now_utc() -> datetime:
    """The current time, in UTC (the default ``received_at``)."""
    return datetime.now(timezone.utc)
