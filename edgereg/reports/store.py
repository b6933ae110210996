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
import logging
import re
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, cast

from edgereg.errors import ExitCode, StorageError
from edgereg.protocol.reports import Report
from edgereg.reports.summary import ArmSummary, latency_bucket

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
SCHEMA_VERSION = 3

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
    PRIMARY KEY (token, model)
)""",
    # Covering indexes in GROUP BY order: the summaries stream from them without
    # a sort or a table lookup (SQLite has no hash aggregate), with or without `since`.
    # No token in it: a random key would make every insert dirty a random page.
    "CREATE INDEX reports_devices ON reports (unit, tier, arm, unit_version, probe, "
    "load_failed, reverted, confirmed, model, received_at, source, first_received_at, "
    "unconfirmed_starts)",
    "CREATE INDEX reports_load ON reports (unit, tier, arm, unit_version, load_bucket, "
    "model, received_at)",
    "CREATE INDEX reports_inference ON reports (unit, tier, arm, unit_version, "
    "inference_p50_bucket, model, received_at)",
    "CREATE INDEX reports_received ON reports (received_at)",
    "CREATE INDEX reports_memory ON reports (unit, tier, arm, unit_version, "
    "memory_peak_bucket, model, received_at)",
)
META_TABLE = "CREATE TABLE IF NOT EXISTS reports_meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)"

#: From each schema to the next: schema 2 adds the source network of a report
#: (rows of schema 1 have none: their sources are unknown, never counted).
MIGRATIONS: dict[int, tuple[str, ...]] = {
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
}

_UPDATED = [c for c in COLUMNS if c not in ("token", "model", "first_received_at")]


#: Rows per INSERT statement at most (SQLite allows 32766 parameters, PostgreSQL
#: 65535); statements hold a power of two of rows, so that a handful of
#: distinct statements serve every batch size and stay prepared in the driver's cache.
ROWS_PER_STATEMENT = 256


def statement_sizes(rows: int) -> list[int]:
    """How many rows each statement of a batch takes: powers of two, largest first."""
    sizes = []
    while rows:
        size = min(ROWS_PER_STATEMENT, 1 << (rows.bit_length() - 1))
        sizes.append(size)
        rows -= size
    return sizes


@functools.lru_cache(maxsize=32)
def upsert_sql(placeholder: str, rows: int = 1) -> str:
    """The upsert of ``rows`` rows; ``placeholder`` is the driver's (``?`` or ``%s``).

    Many rows in one statement: one step of the database (and, in a server,
    one release of the GIL) instead of one per row.
    """
    row = "(" + ", ".join([placeholder] * len(COLUMNS)) + ")"
    values = ", ".join([row] * rows)
    updates = ", ".join(f"{c} = excluded.{c}" for c in _UPDATED)
    # A report that arrives after a later one of the same install (a replay, a
    # retry overtaken) does not rewind the row.
    return (
        f"INSERT INTO reports ({', '.join(COLUMNS)}) VALUES {values} "
        f"ON CONFLICT (token, model) DO UPDATE SET {updates} "
        "WHERE excluded.received_at >= reports.received_at"
    )


def _filters(placeholder: str, since: bool, model: bool, cpu_class: bool = False) -> str:
    where = f"unit = {placeholder}"
    if since:
        where += f" AND received_at >= {placeholder}"
    if model:
        where += f" AND model = {placeholder}"
    if cpu_class:
        where += f" AND cpu_class = {placeholder}"
    return where


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


def _stalled(bind: _Parameters) -> str:
    """1 for an install not confirmed after ``stalled_starts`` starts, as an SQL expression.

    Report schema 2's ``unconfirmed_starts`` is sent at each such start and kept
    in the install's later reports, a revert's too: a device that reverted was
    stalled first and stays counted. Reports without it (schema 1) never count.
    """
    return (
        "(CASE WHEN confirmed = 0 AND unconfirmed_starts >= "
        f"{bind('stalled_starts')} THEN 1 ELSE 0 END)"
    )


def counts_sql(
    placeholder: str, *, since: bool, model: bool, bundle: bool, cpu_class: bool = False
) -> tuple[str, tuple[str, ...]]:
    """Per (tier, arm, version): devices and the devices with each outcome.

    A model's install has one row, so the counts are one GROUP BY over the
    covering index. A bundle's members report under the install's one token:
    an inner GROUP BY folds them into one device (it failed a probe when any
    member did, confirmed when every member did), which costs a sort.

    Returns:
        The statement, and the names of the parameters that come before the
        filters' (``aged`` for the aged cut, ``stalled_starts`` for the
        unconfirmed guardrail's threshold), in the order they bind.
    """
    bind = _Parameters(placeholder)
    if not bundle:
        sql = (
            "SELECT tier, arm, unit_version, COUNT(*), "
            "SUM(CASE WHEN probe = 'failed' THEN 1 ELSE 0 END), "
            "SUM(load_failed), SUM(reverted), SUM(confirmed), "
            "COUNT(DISTINCT source), COUNT(source), "
            "COUNT(DISTINCT CASE WHEN probe = 'failed' THEN source END), "
            "COUNT(DISTINCT CASE WHEN load_failed = 1 THEN source END), "
            "COUNT(DISTINCT CASE WHEN reverted = 1 THEN source END), "
            f"SUM(CASE WHEN first_received_at <= {bind('aged')} THEN 1 ELSE 0 END), "
            f"SUM(CASE WHEN first_received_at <= {bind('aged')} THEN reverted ELSE 0 END), "
            f"COUNT(DISTINCT CASE WHEN first_received_at <= {bind('aged')} AND reverted = 1 "
            "THEN source END), "
            f"COUNT(DISTINCT CASE WHEN first_received_at <= {bind('aged')} THEN source END), "
            f"SUM({_stalled(bind)}), "
            f"COUNT(DISTINCT CASE WHEN {_stalled(bind)} = 1 THEN source END), "
            f"SUM(CASE WHEN first_received_at <= {bind('aged')} THEN {_stalled(bind)} "
            "ELSE 0 END), "
            f"COUNT(DISTINCT CASE WHEN first_received_at <= {bind('aged')} AND "
            f"{_stalled(bind)} = 1 THEN source END) "
            f"FROM reports WHERE {_filters(placeholder, since, model, cpu_class)} "
            "GROUP BY tier, arm, unit_version"
        )
        return sql, tuple(bind.names)
    sql = (
        "SELECT tier, arm, unit_version, COUNT(*), SUM(pf), SUM(lf), SUM(rv), SUM(cf), "
        "COUNT(DISTINCT src), COUNT(src), COUNT(DISTINCT CASE WHEN pf = 1 THEN src END), "
        "COUNT(DISTINCT CASE WHEN lf = 1 THEN src END), "
        "COUNT(DISTINCT CASE WHEN rv = 1 THEN src END), "
        f"SUM(CASE WHEN fr <= {bind('aged')} THEN 1 ELSE 0 END), "
        f"SUM(CASE WHEN fr <= {bind('aged')} THEN rv ELSE 0 END), "
        f"COUNT(DISTINCT CASE WHEN fr <= {bind('aged')} AND rv = 1 THEN src END), "
        f"COUNT(DISTINCT CASE WHEN fr <= {bind('aged')} THEN src END), "
        "SUM(st), COUNT(DISTINCT CASE WHEN st = 1 THEN src END), "
        f"SUM(CASE WHEN fr <= {bind('aged')} THEN st ELSE 0 END), "
        f"COUNT(DISTINCT CASE WHEN fr <= {bind('aged')} AND st = 1 THEN src END) FROM ("
        "SELECT tier, arm, unit_version, token, "
        "MAX(CASE WHEN probe = 'failed' THEN 1 ELSE 0 END) AS pf, "
        "MAX(load_failed) AS lf, MAX(reverted) AS rv, MIN(confirmed) AS cf, "
        f"MAX({_stalled(bind)}) AS st, "
        "MAX(source) AS src, "
        "MIN(first_received_at) AS fr "
        f"FROM reports WHERE {_filters(placeholder, since, model, cpu_class)} "
        "GROUP BY tier, arm, unit_version, token"
        ") AS devices GROUP BY tier, arm, unit_version"
    )
    return sql, tuple(bind.names)


def has_members_sql(placeholder: str) -> str:
    """Whether a unit has rows of models other than itself (it is a bundle)."""
    return (
        f"SELECT EXISTS (SELECT 1 FROM reports WHERE unit = {placeholder} "
        f"AND model <> {placeholder})"
    )


def histogram_sql(placeholder: str, *, since: bool, model: bool, cpu_class: bool = False) -> str:
    """Per (tier, arm, version): rows per load, inference-p50 and peak-memory bucket (kind 0-2)."""
    where = _filters(placeholder, since, model, cpu_class)
    return (
        "SELECT 0, tier, arm, unit_version, load_bucket, COUNT(*) FROM reports "
        f"WHERE {where} AND load_bucket IS NOT NULL "
        "GROUP BY tier, arm, unit_version, load_bucket "
        "UNION ALL "
        "SELECT 1, tier, arm, unit_version, inference_p50_bucket, COUNT(*) FROM reports "
        f"WHERE {where} AND inference_p50_bucket IS NOT NULL "
        "GROUP BY tier, arm, unit_version, inference_p50_bucket "
        "UNION ALL "
        "SELECT 2, tier, arm, unit_version, memory_peak_bucket, COUNT(*) FROM reports "
        f"WHERE {where} AND memory_peak_bucket IS NOT NULL "
        "GROUP BY tier, arm, unit_version, memory_peak_bucket"
    )


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
    )


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
                for statement in SCHEMA:
                    cur.execute(statement)
                cur.execute(
                    f"INSERT INTO reports_meta (key, value) VALUES ({self.placeholder}, "
                    f"{self.placeholder})",
                    ("schema", str(SCHEMA_VERSION)),
                )
                log.info("created the report store schema %d in %s", SCHEMA_VERSION, self.url)
            elif int(found[0]) < SCHEMA_VERSION:
                for version in range(int(found[0]), SCHEMA_VERSION):
                    for statement in MIGRATIONS[version]:
                        cur.execute(statement)
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

    def _write_rows(self, cursor: Any, rows: list[tuple[Any, ...]]) -> None:
        """Upsert rows (distinct keys) in the open transaction: a few multi-row statements."""
        start = 0
        for size in statement_sizes(len(rows)):
            chunk = rows[start : start + size]
            start += size
            cursor.execute(
                upsert_sql(self.placeholder, size), [value for row in chunk for value in row]
            )

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
        latest: dict[tuple[str, str], tuple[Any, ...]] = {}
        given = 0
        for item in reports:
            report, when = item[0], item[1]
            source = item[2] if len(item) > 2 else None
            given += 1
            row = report_row(report, when, source)
            key = (report.token, report.model)
            # One statement may not touch a row twice (PostgreSQL refuses):
            # the batch keeps each install's latest report, as the upsert would.
            if key not in latest or latest[key][-1] <= row[-1]:
                latest[key] = row
        rows = list(latest.values())

        def write() -> int:
            with self._connection() as conn:
                self._write_rows(conn.cursor(), rows)
                conn.commit()
            return given

        return cast(int, self._run("storing reports", write))

    def summaries(
        self,
        unit: str,
        since: datetime | None = None,
        *,
        model: str | None = None,
        aged_before: datetime | None = None,
        cpu_class: str | None = None,
        stalled_starts: int = 2,
    ) -> list[ArmSummary]:
        """Per (tier, arm, version) of ``unit``: devices, outcomes and latency histograms.

        Args:
            unit: The model or bundle.
            since: Only installs whose latest report arrived at or after this time.
            model: Only this member of a bundle (its own latency histograms).
            aged_before: Also count the installs that first reported at or before
                this time, and their reverts (``aged_devices``, ``aged_reverted``):
                the installs that had time to crash-loop.
            cpu_class: Only the reports of this CPU class (report schema 2's
                ``cpu_class``; :meth:`cpu_classes` lists them).
            stalled_starts: Count as ``stalled`` the installs not confirmed after
                this many app starts (the unconfirmed guardrail's ``stalled_starts``).

        Returns:
            One summary per (tier, arm, version), sorted by tier, arm and version.

        Raises:
            ValueError: ``stalled_starts`` is not a whole number >= 1.
        """
        if isinstance(stalled_starts, bool) or not isinstance(stalled_starts, int):
            raise ValueError(f"stalled_starts must be a whole number, got {stalled_starts!r}")
        if stalled_starts < 1:
            raise ValueError(f"stalled_starts must be at least 1, got {stalled_starts}")
        params: list[Any] = [unit]
        if since is not None:
            params.append(epoch_ms(since))
        if model is not None:
            params.append(model)
        if cpu_class is not None:
            params.append(cpu_class)
        flags = {
            "since": since is not None,
            "model": model is not None,
            "cpu_class": cpu_class is not None,
        }
        # Without a cut every install counts as aged (the same statement either way).
        cut = epoch_ms(aged_before) if aged_before is not None else 2**62
        leading = {"aged": cut, "stalled_starts": stalled_starts}

        def read() -> list[ArmSummary]:
            with self._connection() as conn:
                cur = conn.cursor()
                bundle = False
                if model is None:
                    cur.execute(has_members_sql(self.placeholder), (unit, unit))
                    bundle = bool(cur.fetchone()[0])
                sql, names = counts_sql(self.placeholder, **flags, bundle=bundle)
                cur.execute(sql, [leading[name] for name in names] + params)
                counts = cur.fetchall()
                cur.execute(histogram_sql(self.placeholder, **flags), params * 3)
                bins = cur.fetchall()
                conn.rollback()  # read only: end the snapshot
            return _assemble(unit, counts, bins, aged=aged_before is not None)

        return cast(list[ArmSummary], self._run("summarizing reports", read))

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
                cur.execute(
                    f"SELECT DISTINCT model FROM reports WHERE unit = {self.placeholder} "
                    f"AND model <> {self.placeholder}",
                    (unit, unit),
                )
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
    unit: str, counts: Sequence[Sequence[Any]], bins: Sequence[Sequence[Any]], *, aged: bool
) -> list[ArmSummary]:
    histograms: dict[tuple[str, str, str], tuple[dict[int, int], ...]] = {}
    for kind, tier, arm, version, bucket, devices in bins:
        kinds = histograms.setdefault((tier, arm, version), ({}, {}, {}))
        kinds[int(kind)][int(bucket)] = int(devices)
    summaries = []
    for row in counts:
        tier, arm, version, devices, probe_failed, load_failed, reverted, confirmed = row[:8]
        sources, sourced, probe_sources, load_sources, revert_sources = (
            int(n or 0) for n in row[8:13]
        )
        aged_devices, aged_reverted, aged_reverted_sources, aged_sources = (
            int(n or 0) for n in row[13:17]
        )
        stalled, stalled_sources, aged_stalled, aged_stalled_sources = (
            int(n or 0) for n in row[17:21]
        )
        load, inference, memory = histograms.get((tier, arm, version), ({}, {}, {}))
        summaries.append(
            ArmSummary(
                unit=unit,
                tier=tier,
                arm=cast(Literal["candidate", "stable"], arm),
                version=version,
                devices=int(devices),
                probe_failed=int(probe_failed),
                load_failed=int(load_failed),
                reverted=int(reverted),
                confirmed=int(confirmed),
                sources=sources,
                sourced_devices=sourced,
                probe_failed_sources=probe_sources,
                load_failed_sources=load_sources,
                reverted_sources=revert_sources,
                aged_devices=aged_devices if aged else None,
                aged_reverted=aged_reverted if aged else 0,
                aged_reverted_sources=aged_reverted_sources if aged else revert_sources,
                aged_sources=aged_sources if aged else sources,
                stalled=stalled,
                stalled_sources=stalled_sources,
                aged_stalled=aged_stalled if aged else 0,
                aged_stalled_sources=aged_stalled_sources if aged else stalled_sources,
                load_ms=dict(sorted(load.items())),
                inference_p50_ms=dict(sorted(inference.items())),
                memory_peak_mb=dict(sorted(memory.items())),
            )
        )
    return sorted(summaries, key=lambda s: (s.tier, s.arm, s.version))


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
