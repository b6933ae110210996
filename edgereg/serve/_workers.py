"""Worker processes: ``edgereg serve --workers N``.

One Python process answers on one core (the GIL); a busy registry needs
more. The parent binds the port with ``SO_REUSEPORT`` (so ``--port 0``
picks one port for all), forks ``N`` workers that each bind it the same way
and run an ordinary server, and the kernel spreads new connections over
them. Each worker opens its own report store connection after the fork (a
database handle must not cross a fork); the store itself is shared as with
one process. The parent only supervises: SIGTERM or SIGINT to it drains
every worker (each finishes its answers in flight), a worker that dies is
started again, and so is a worker that hangs: each worker's accept loop
beats a heartbeat in memory shared with the parent, and a worker whose
heartbeat is older than ``hang_timeout`` (stopped, deadlocked, its accept
loop starved) is killed and replaced. A hung worker still holds its share
of the port: the kernel keeps handing it new connections that nobody
accepts.
"""

from __future__ import annotations

import contextlib
import logging
import mmap
import os
import signal
import socket
import struct
import threading
import time
import traceback
from collections.abc import Callable
from types import FrameType

log = logging.getLogger("edgereg.serve")

#: Seconds a worker that died waits before it is started again (a crash loop
#: must not spin).
_RESTART_DELAY = 1.0
#: Seconds without a heartbeat after which a worker counts as hung, by default.
DEFAULT_HANG_TIMEOUT = 10.0


class Heartbeats:
    """One monotonic timestamp per worker, in memory shared across ``fork``.

    A worker beats from its accept loop (:meth:`beat`); the parent reads how
    long ago each one did (:meth:`age`). CLOCK_MONOTONIC is one clock for
    every process of the machine, so the parent can compare.
    """

    _SLOT = struct.Struct("d")

    def __init__(self, count: int) -> None:
        self._memory = mmap.mmap(-1, self._SLOT.size * max(1, count))

    def beat(self, index: int) -> None:
        """Record that worker ``index`` is alive now."""
        self._SLOT.pack_into(self._memory, index * self._SLOT.size, time.monotonic())

    def age(self, index: int) -> float:
        """Seconds since worker ``index`` last beat."""
        (at,) = self._SLOT.unpack_from(self._memory, index * self._SLOT.size)
        return time.monotonic() - float(at)


def reserve_port(host: str, port: int) -> socket.socket:
    """Bind ``host:port`` with SO_REUSEPORT without listening: the port all workers share.

    Raises:
        OSError: the address cannot be bound.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    return sock


def wait_listening(host: str, port: int, timeout: float = 15.0) -> bool:
    """Whether something accepts on ``host:port`` within ``timeout`` seconds."""
    target = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((target, port), timeout=1):
            return True
        time.sleep(0.05)
    return False


def _die_with(parent: int) -> None:
    """Have the kernel stop this worker when the parent dies (killed, not only stopped)."""
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    if os.getppid() != parent:  # the parent died before prctl
        os._exit(0)


def run_workers(
    count: int,
    worker: Callable[[int, threading.Event, Callable[[], None]], None],
    *,
    shutdown_timeout: float,
    stop: threading.Event,
    started: Callable[[], None] = lambda: None,
    hang_timeout: float = DEFAULT_HANG_TIMEOUT,
) -> list[int]:
    """Fork ``count`` workers running ``worker(index, stop, beat)`` until ``stop`` is set.

    ``worker`` must return when its ``stop`` event is set (the worker's own
    SIGTERM handler sets it), and call ``beat`` at least every
    ``hang_timeout`` seconds while it serves (the server's accept loop
    does); a worker that stops beating is killed (SIGKILL: a stopped process
    takes no other signal) and started again. ``started`` runs in the parent
    once all are forked. Call it with no other thread running: a lock
    another thread holds at the fork (an import's) stays held in the worker
    for good. Returns the exit statuses of the last workers.
    """
    children: dict[int, int] = {}  # pid -> index
    parent = os.getpid()
    beats = Heartbeats(count)

    def start(index: int) -> None:
        beats.beat(index)  # a fresh worker has hang_timeout to start serving
        pid = os.fork()
        if pid == 0:  # the worker
            code = 0
            try:
                _die_with(parent)
                own_stop = threading.Event()

                def on_signal(signum: int, frame: FrameType | None) -> None:
                    own_stop.set()
                    signal.signal(signal.SIGTERM, signal.SIG_DFL)

                signal.signal(signal.SIGTERM, on_signal)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides
                worker(index, own_stop, lambda: beats.beat(index))
            except BaseException:
                traceback.print_exc()
                code = 1
            finally:
                os._exit(code)
        children[pid] = index

    for index in range(count):
        start(index)
    started()
    statuses: list[int] = []
    while not stop.wait(0.2):
        for pid, index in list(children.items()):
            age = beats.age(index)
            if age > hang_timeout:
                log.error(
                    "worker %d (pid %d) has not served for %.0f s (stopped or hung); "
                    "killing it to start it again",
                    index,
                    pid,
                    age,
                )
                beats.beat(index)  # killed once, not again every pass until it is reaped
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            while children:
                pid, status = os.waitpid(-1, os.WNOHANG)
                if pid == 0:
                    break
                index = children.pop(pid)
                log.error(
                    "worker %d (pid %d) ended with status %d; starting it again",
                    index,
                    pid,
                    os.waitstatus_to_exitcode(status),
                )
                time.sleep(_RESTART_DELAY)
                if not stop.is_set():
                    start(index)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + shutdown_timeout + 5
    for pid in list(children):
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                statuses.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                statuses.append(os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
                break
            time.sleep(0.05)
    return statuses
