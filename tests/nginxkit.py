"""Debian's nginx on a loopback port, as the current user, for tests and benchmarks.

:func:`run_nginx` writes a complete config into a temporary directory
(``daemon off; master_process off;``, pid and logs in that directory, so it
needs no root and leaves nothing behind), starts nginx in the foreground,
waits until it accepts connections and stops it after the block.

:func:`documented_server_block` is the ``server { ... }`` block of
docs/operations/s3-cdn.md with its ``listen`` and ``root`` replaced, so the
tests run exactly the configuration the documentation tells operators to use.

``make system-deps`` installs nginx (``apt-get install nginx-light``). Where
it is missing the test FAILS with the command that installs it, as the
browser tests do: a static-hosting test that silently skips tests nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "operations" / "s3-cdn.md"

MISSING = (
    "nginx is not installed; the static-hosting tests need it. Install Debian's package: "
    "make system-deps (or: sudo apt-get update && sudo apt-get install -y nginx-light)"
)

CONFIG = """\
daemon off;
master_process off;
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log warn;
events {{ worker_connections 1024; }}
http {{
    access_log off;
    sendfile on;
    tcp_nodelay on;
    keepalive_requests 1000000;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
{server}
}}
"""


def find_nginx() -> str | None:
    """The nginx executable, or None."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if os.access(p, os.X_OK)), None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def documented_server_block(root: Path, port: int) -> str:
    """The nginx ``server`` block of docs/operations/s3-cdn.md, on ``port`` over ``root``."""
    text = DOC.read_text(encoding="utf-8")
    found = re.search(r"```nginx\n(.*?)```", text, re.DOTALL)
    if found is None:
        raise AssertionError(f"{DOC} has no ```nginx block")
    block = found.group(1)
    block, listens = re.subn(r"listen \d+;", f"listen 127.0.0.1:{port};", block)
    block, roots = re.subn(r"root /srv/registry;", f"root {root.resolve()};", block)
    if (listens, roots) != (1, 1):
        raise AssertionError(f"the nginx block of {DOC} must have one 'listen' and one 'root'")
    return block


def default_server_block(root: Path, port: int) -> str:
    """What an operator gets from nginx without the documented rules."""
    return f"server {{ listen 127.0.0.1:{port}; root {root.resolve()}; }}"


@contextlib.contextmanager
def run_nginx(
    root: Path,
    workdir: Path,
    server_block: Callable[[Path, int], str] = documented_server_block,
) -> Iterator[str]:
    """Serve ``root`` with nginx for a ``with`` block; yields the base URL."""
    nginx = find_nginx()
    if nginx is None:
        pytest.fail(MISSING, pytrace=False)
    port = free_port()
    tmp = workdir / f"nginx-{port}"
    tmp.mkdir(parents=True)
    conf = tmp / "nginx.conf"
    conf.write_text(CONFIG.format(tmp=tmp, server=server_block(root, port)))
    check = subprocess.run(
        [nginx, "-t", "-q", "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
        capture_output=True,
        text=True,
    )
    if check.returncode != 0:
        raise RuntimeError(f"nginx refused the config:\n{check.stderr}\n{conf.read_text()}")
    proc = subprocess.Popen(
        [nginx, "-p", str(tmp), "-c", str(conf), "-e", str(tmp / "error.log")],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 15
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log = (tmp / "error.log").read_text(errors="replace")
                    raise RuntimeError(f"nginx did not start:\n{log}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGQUIT)  # graceful stop
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
