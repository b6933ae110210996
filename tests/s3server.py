"""A real S3-protocol server on loopback for tests and benchmarks: moto in server mode.

The server runs in a child process (``python -m moto.server``) and boto3 talks
to it over HTTP, exactly as it talks to AWS: nothing is patched in-process.

Tests use the fixtures (import them into the test module, or list this module
in ``pytest_plugins`` of the top-level conftest):

* ``moto_endpoint`` (session): starts the server once, yields its URL;
* ``s3_env``: fake credentials for boto3 and no AWS config files from HOME;
* ``s3_bucket``: a fresh, empty bucket per test;
* ``s3_client``: a plain boto3 client on the server, to arrange and inspect;
* ``closed_port``: a loopback port nothing listens on.

Benchmarks use :class:`MotoServer` directly.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

FAKE_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_SESSION_TOKEN": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    # Never read the developer's real profile, and never wait for EC2 metadata.
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
}
# Variables that would point boto3 somewhere else than the fixture's server.
UNSET = (
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "EDGEREG_S3_ENDPOINT_URL",
    "AWS_CA_BUNDLE",
)


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    """``python -m moto.server`` on a free loopback port, in a child process."""

    def __init__(self, *, startup_timeout: float = 30.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._timeout = startup_timeout
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115 - closed in stop()
            prefix="moto-server-", suffix=".log", delete=False
        )
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> str:
        """Start the server and wait until it answers; return its endpoint URL."""
        env = {**os.environ, **FAKE_CREDENTIALS}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
            stdin=subprocess.DEVNULL,
            # The server logs every request; a file never fills up like a pipe.
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        deadline = time.monotonic() + self._timeout
        while True:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"moto server exited with status {self._proc.returncode}:\n{self.log_tail()}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1):
                    return self.url
            except (urllib.error.URLError, OSError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"moto server did not answer on {self.url} within "
                        f"{self._timeout:g}s:\n{self.log_tail()}"
                    ) from None
                time.sleep(0.1)

    def log_tail(self, lines: int = 30) -> str:
        """Return the last lines the server printed."""
        self._log.flush()
        text = Path(self._log.name).read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """Terminate the server (kill it if it does not stop) and remove its log."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __enter__(self) -> str:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def make_client(endpoint: str):  # type: ignore[no-untyped-def]
    """A plain boto3 S3 client for ``endpoint`` (for arranging and checking tests)."""
    import boto3  # type: ignore[import-untyped]
    from botocore.config import Config  # type: ignore[import-untyped]

    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        config=Config(s3={"addressing_style": "path"}, retries={"max_attempts": 1}),
    )


@pytest.fixture(scope="session")
def moto_endpoint() -> Iterator[str]:
    """Start one moto server for the whole session; yield its endpoint URL."""
    server = MotoServer()
    with server as url:
        yield url


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Give boto3 fake credentials and hide the user's AWS configuration."""
    for name in UNSET:
        monkeypatch.delenv(name, raising=False)
    for name, value in FAKE_CREDENTIALS.items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def s3_client(moto_endpoint: str) -> Any:
    """A plain boto3 S3 client on the moto server."""
    return make_client(moto_endpoint)


@pytest.fixture
def closed_port() -> int:
    """A loopback TCP port that nothing listens on."""
    return free_port()


@pytest.fixture
def s3_bucket(moto_endpoint: str, s3_env: None) -> Iterator[str]:
    """Create a fresh, empty bucket on the moto server; yield its name; drop it after."""
    name = f"test-{uuid.uuid4().hex[:16]}"
    client = make_client(moto_endpoint)
    client.create_bucket(Bucket=name)
    yield name
    # The server keeps objects in memory for the whole session: free them.
    with contextlib.suppress(Exception):  # cleanup only; the test result stands
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            for item in page.get("Contents", ()):
                client.delete_object(Bucket=name, Key=item["Key"])
        client.delete_bucket(Bucket=name)
