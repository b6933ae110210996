"""The report store on PostgreSQL (psycopg 3), for fleets and several servers."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from edgereg.reports.store import (
    STREAM_ROWS,
    ReportStore,
    ReportStoreError,
    StoreURLError,
    redact_url,
    upsert_sql,
)

#: Connections a server keeps open; more concurrent requests wait for one.
POOL_SIZE = 8
#: Seconds to wait for a free pooled connection before answering "unavailable".
POOL_WAIT = 5.0
#: Seconds to wait for a connection to the database (unless the URL sets one).
CONNECT_TIMEOUT = 5
#: Any constant: the advisory lock that serializes schema creation between servers.
_SCHEMA_LOCK = 0x6564676572
#: Seconds a pooled connection may sit idle before it is checked before use.
_PING_AFTER = 1.0


class PostgresStore(ReportStore):
    """Reports in a PostgreSQL database, through a small pool of connections.

    Sessions run with ``synchronous_commit = off``: a commit returns before
    its WAL reaches the disk, so a database crash may lose the last fraction
    of a second of reports (never consistency); reports are telemetry, and
    a device sends its report again when something changes. A connection
    that breaks (the database restarted) is dropped, and a pooled one is
    retried once with a fresh connection.
    """

    placeholder = "%s"
    greatest = "GREATEST"
    least = "LEAST"

    def __init__(self, url: str) -> None:
        try:
            import psycopg
            from psycopg.conninfo import conninfo_to_dict
        except ImportError as exc:  # pragma: no cover - psycopg is a dependency
            raise StoreURLError(
                "the PostgreSQL driver is not installed",
                url=redact_url(url),
                hint="pip install 'psycopg[binary]>=3.2,<4'",
            ) from exc
        self.url = redact_url(url)
        self._psycopg = psycopg
        try:
            params = conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise StoreURLError(
                f"{self.url!r} is not a PostgreSQL URL: {exc}",
                url=self.url,
                hint="Use postgresql://USER:PASSWORD@HOST:PORT/DATABASE.",
            ) from exc
        port = str(params.get("port", "5432"))
        if not all(part.isdigit() for part in port.split(",")):
            raise StoreURLError(
                f"{self.url!r} is not a PostgreSQL URL: port {port!r} is not a number",
                url=self.url,
                hint="Use postgresql://USER:PASSWORD@HOST:PORT/DATABASE.",
            )
        self._conninfo = url
        self._options: dict[str, Any] = {"application_name": "edgereg-reports"}
        if "connect_timeout" not in params:
            self._options["connect_timeout"] = CONNECT_TIMEOUT
        self._idle: queue.LifoQueue[Any] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(POOL_SIZE)
        self._closed = False

    def _connect(self) -> Any:
        conn = self._psycopg.connect(self._conninfo, **self._options)
        conn.execute("SET synchronous_commit TO off")
        conn.commit()
        return conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        if not self._slots.acquire(timeout=POOL_WAIT):
            raise ReportStoreError(
                f"all {POOL_SIZE} connections to the report store stayed busy for {POOL_WAIT:g}s",
                url=self.url,
            )
        try:
            conn = self._checkout()
            try:
                yield conn
            finally:
                self._checkin(conn)
        finally:
            self._slots.release()

    def _checkout(self) -> Any:
        try:
            conn, last_used = self._idle.get_nowait()
        except queue.Empty:
            return self._connect()
        if time.monotonic() - last_used > _PING_AFTER:
            # An idle connection may have died with a database restart.
            try:
                conn.execute("SELECT 1")
                conn.rollback()
            except self._psycopg.Error:
                conn.close()
                return self._connect()
        return conn

    def _checkin(self, conn: Any) -> None:
        if conn.broken or conn.closed or self._closed:
            conn.close()
            return
        try:
            conn.rollback()  # nothing stays open between uses
        except self._psycopg.Error:
            conn.close()
            return
        self._idle.put((conn, time.monotonic()))

    def _write_rows(self, cursor: Any, rows: Sequence[tuple[Any, ...]]) -> None:
        # psycopg rewrites the placeholders of a long statement on every call
        # (measured: most of the time of a 32-row upsert); its executemany sends
        # the short one-row statement for every row in one pipeline instead
        # (as fast as one unnest() of column arrays, measured, and plainer).
        cursor.executemany(
            upsert_sql(self.placeholder, greatest=self.greatest, least=self.least), rows
        )

    def _stream(self, conn: Any, sql: str, params: Sequence[Any]) -> Iterable[tuple[Any, ...]]:
        # A server-side cursor: psycopg's plain one holds every row of the result.
        with conn.cursor(name="edgereg_stream") as cursor:
            cursor.itersize = STREAM_ROWS
            cursor.execute(sql, params)
            yield from cursor

    def _lock_schema(self, cursor: Any) -> None:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", (_SCHEMA_LOCK,))

    def _translate(self, exc: Exception) -> ReportStoreError | None:
        psycopg = self._psycopg
        if not isinstance(exc, psycopg.Error):
            return None
        text = " ".join(str(exc).split())
        if isinstance(exc, psycopg.OperationalError):
            return ReportStoreError(
                f"the PostgreSQL database does not answer: {text}",
                url=self.url,
                hint="Check that the server runs and the URL (host, port, user, database) is "
                "right; reports are refused (503) until it answers.",
            )
        return ReportStoreError(f"PostgreSQL: {text}", url=self.url)

    def close(self) -> None:
        """Close every pooled connection."""
        self._closed = True
        while True:
            try:
                conn, _ = self._idle.get_nowait()
            except queue.Empty:
                return
            with contextlib.suppress(Exception):
                conn.close()
