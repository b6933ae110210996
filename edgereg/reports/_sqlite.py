"""The embedded report store: one SQLite file in WAL mode (the default)."""

from __future__ import annotations

import contextlib
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from edgereg.reports.store import ReportStore, ReportStoreError

#: Milliseconds a writer waits for another process's lock (a prune, an analysis).
BUSY_TIMEOUT_MS = 5000
#: Prepared statements a connection keeps: every size of the multi-row upserts
#: (store.ROWS_PER_STATEMENT of each table) and the queries.
CACHED_STATEMENTS = 256
#: WAL pages written before a commit copies them back into the database file (a
#: checkpoint, which fsyncs): SQLite's default is 1000. Reports land at random
#: places of two B-trees (the primary key and the summary index), so a page is
#: often dirtied again before the next checkpoint, and each checkpoint writes it
#: once: measured, a 32-report upsert cost 1.3-1.5x less. The WAL grows to about
#: 40 MB between checkpoints (4 KB pages).
WAL_AUTOCHECKPOINT_PAGES = 10_000


class SQLiteStore(ReportStore):
    """Reports in one SQLite file, created on first use.

    One connection, shared by the threads of a server under a lock: SQLite
    takes one writer at a time anyway, and a commit in WAL mode with
    ``synchronous=NORMAL`` costs no fsync (a power cut may lose the last
    reports, never the file's consistency). Readers in other processes
    (``edgereg analyze``) do not block the writer.
    """

    placeholder = "?"

    def __init__(self, path: Path, *, url: str) -> None:
        self.path = path
        self.url = url
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None

    def _open(self) -> sqlite3.Connection:
        if not self.path.parent.is_dir():
            raise ReportStoreError(
                f"the folder {self.path.parent} of the report store does not exist",
                url=self.url,
                hint="Create it, or fix [reports] store in models.toml (or --reports).",
                retryable=False,
            )
        conn = sqlite3.connect(
            self.path,
            check_same_thread=False,
            isolation_level=None,
            timeout=BUSY_TIMEOUT_MS / 1000,
            cached_statements=CACHED_STATEMENTS,
        )
        try:
            conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise ReportStoreError(
                    f"{self.path} cannot use write-ahead logging (journal mode {mode})",
                    url=self.url,
                    hint="Put the store on a local file system.",
                    retryable=False,
                )
            conn.execute("PRAGMA synchronous = NORMAL")
            conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_AUTOCHECKPOINT_PAGES}")
        except BaseException:
            conn.close()
            raise
        return conn

    @contextlib.contextmanager
    def _connection(self) -> Iterator[Any]:
        with self._lock:
            if self._conn is None:
                self._conn = self._open()
            conn = self._conn
            conn.execute("BEGIN")
            try:
                yield _Transaction(conn)
            finally:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")

    def _write_batch(self, rounds: Sequence[Sequence[tuple[Any, ...]]]) -> None:
        statements = [statement for rows in rounds for statement in self._statements(rows)]
        if len(statements) == 1:
            # One statement is a transaction of its own (autocommit): a batch that fits
            # one upsert (a server's usual group commit) costs one step of SQLite, not three.
            with self._lock:
                if self._conn is None:
                    self._conn = self._open()
                self._conn.execute(*statements[0])
            return
        with self._connection() as conn:
            cursor = conn.cursor()
            for statement in statements:
                cursor.execute(*statement)
            conn.commit()

    def _lock_schema(self, cursor: Any) -> None:
        # Take the write lock before reading the version, so that two processes
        # never both create the tables (a deferred BEGIN would upgrade too late).
        cursor.execute("ROLLBACK")
        cursor.execute("BEGIN IMMEDIATE")

    def _translate(self, exc: Exception) -> ReportStoreError | None:
        if not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc)
        if "file is not a database" in text:
            return ReportStoreError(
                f"{self.path} is not an SQLite database",
                url=self.url,
                hint="Point [reports] store (or --reports) at a new file, or move this one away.",
                retryable=False,
            )
        if "unable to open database file" in text:
            return ReportStoreError(
                f"cannot open {self.path}: {text}",
                url=self.url,
                hint="Check that the path is a file this user may create and write.",
                retryable=False,
            )
        if "readonly" in text:
            return ReportStoreError(
                f"{self.path} is read-only: {text}",
                url=self.url,
                hint="Give the serving user write access to the file and its folder.",
                retryable=False,
            )
        return ReportStoreError(f"{self.path}: {text}", url=self.url)

    def close(self) -> None:
        """Close the connection (a later call opens it again)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


class _Transaction:
    """The DB-API surface the shared SQL uses, over a connection in autocommit mode."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def cursor(self) -> sqlite3.Cursor:
        return self._conn.cursor()

    def commit(self) -> None:
        self._conn.execute("COMMIT")

    def rollback(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")
