"""A real PostgreSQL server on loopback for tests and benchmarks, from Debian's package.

``initdb`` and ``pg_ctl`` (``/usr/lib/postgresql/<version>/bin``) make a
throwaway cluster in a temporary directory, listening on 127.0.0.1 on a free
port with its unix sockets in the same directory, and stop it at the end.
PostgreSQL refuses to run as root: as root, every server command runs as
``nobody`` (``runuser``), which owns the temporary directory.

Tests use the fixtures (import them into the test module):

* ``postgres_server`` (session): one server for the whole session;
* ``postgres_url``: a fresh, empty database on it per test (dropped after).

Tests that stop the server (an outage) start their own :class:`PostgresServer`.
Benchmarks use the class directly. ``make system-deps`` installs the package.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import pytest

#: The unprivileged user the server runs as when the tests run as root.
SERVER_USER = "nobody"
SUPERUSER = "edgereg"


def postgres_bin() -> Path | None:
    """The newest installed PostgreSQL server's bin directory, or None."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name.split(".")[0]),
    )
    return Path(found[-1]).parent if found else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PostgresServer:
    """A throwaway PostgreSQL cluster; ``url`` is its ``postgres`` database."""

    def __init__(self, *, fsync: bool = False, startup_timeout: float = 60.0) -> None:
        bin_dir = postgres_bin()
        if bin_dir is None:
            raise RuntimeError(
                "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb): "
                "run `make system-deps` (apt-get install postgresql)"
            )
        self.bin = bin_dir
        self.port = free_port()
        self.fsync = fsync
        self._timeout = startup_timeout
        self.dir = Path(tempfile.mkdtemp(prefix="edgereg-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"
        self._as_root = os.geteuid() == 0
        if self._as_root:
            user = pwd.getpwnam(SERVER_USER)
            os.chown(self.dir, user.pw_uid, user.pw_gid)
        self._initialised = False

    @property
    def url(self) -> str:
        """The connection URL of the ``postgres`` database (password-less, trust auth)."""
        return self.database_url("postgres")

    def database_url(self, name: str) -> str:
        """The connection URL of one database of this server."""
        return f"postgresql://{SUPERUSER}@127.0.0.1:{self.port}/{name}"

    def _run(self, *args: str) -> subprocess.CompletedProcess[str]:
        command = [str(self.bin / args[0]), *args[1:]]
        if self._as_root:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        return subprocess.run(
            command, capture_output=True, text=True, check=False, cwd=self.dir, timeout=120
        )

    def _check(self, result: subprocess.CompletedProcess[str], what: str) -> None:
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed (exit {result.returncode}):\n{result.stdout}\n{result.stderr}\n"
                f"{self.log_tail()}"
            )

    def start(self) -> str:
        """Create the cluster (first time) and start the server; return :attr:`url`."""
        if not self._initialised:
            self._check(
                self._run(
                    "initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth=trust",
                    "-E", "UTF8", "--no-sync", "--locale=C",
                ),
                "initdb",
            )  # fmt: skip
            self._initialised = True
        options = (
            f"-c listen_addresses=127.0.0.1 -p {self.port} -k {self.dir} "
            f"-c fsync={'on' if self.fsync else 'off'} -c max_connections=100"
        )
        self._check(
            self._run(
                "pg_ctl", "-D", str(self.data), "-l", str(self.log), "-o", options,
                "-w", "-t", str(int(self._timeout)), "start",
            ),
            "pg_ctl start",
        )  # fmt: skip
        return self.url

    def stop(self) -> None:
        """Stop the server at once (fast shutdown); the cluster stays for :meth:`start`."""
        if self._initialised and (self.data / "postmaster.pid").exists():
            self._check(
                self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "-w", "stop"),
                "pg_ctl stop",
            )

    def remove(self) -> None:
        """Stop the server and delete the cluster."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_tail(self, lines: int = 20) -> str:
        """The last lines of the server log."""
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def create_database(self) -> str:
        """Create a fresh, empty database; return its URL."""
        import psycopg

        name = f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.database_url(name)

    def drop_database(self, url: str) -> None:
        """Drop a database made by :meth:`create_database` (its connections are ended)."""
        import psycopg

        name = url.rsplit("/", 1)[1]
        with psycopg.connect(self.url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    def __enter__(self) -> PostgresServer:
        try:
            self.start()
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.remove()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One PostgreSQL server for the whole session."""
    with PostgresServer() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> Iterator[str]:
    """A fresh, empty database per test; its URL."""
    url = postgres_server.create_database()
    yield url
    with contextlib.suppress(Exception):  # cleanup only; the test result stands
        postgres_server.drop_database(url)


def wait_until_down(server: PostgresServer, timeout: float = 10.0) -> None:
    """Wait until nothing accepts connections on the server's port."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.2):
                pass
        except OSError:
            return
        time.sleep(0.05)
    raise RuntimeError(f"PostgreSQL on port {server.port} still accepts connections")
