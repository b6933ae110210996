"""Drive any client's device program (docs/reference/device-program.md) from a test.

:func:`spawn` starts the program of a client by name (``python``, ``jvm``,
``swift``); :class:`DeviceProgram` sends one request at a time with a
timeout and can be killed with SIGKILL (a crash mid-install). The
``device_client`` fixture is parametrized over the clients named in
``EDGEREG_CLIENTS`` (default ``python,jvm,swift``), and ``devices`` is a
factory that starts programs of that client and stops them after the test.
A client whose program is not built FAILS, naming ``make sdk``: a harness
that skips a client it cannot find would pass without testing it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
ALL_CLIENTS = ("python", "jvm", "swift")
HOSTRUNNER = ROOT / "tests" / "hostrunner.py"


class DeviceError(AssertionError):
    """The program broke the framing: no answer in time, a line that is not JSON, an exit."""


def selected_clients() -> list[str]:
    """The clients named in ``EDGEREG_CLIENTS`` (comma-separated; default all three)."""
    names = [n.strip() for n in os.environ.get("EDGEREG_CLIENTS", ",".join(ALL_CLIENTS)).split(",")]
    unknown = [n for n in names if n and n not in ALL_CLIENTS]
    if unknown:
        raise ValueError(
            f"EDGEREG_CLIENTS names {unknown}; the clients are {', '.join(ALL_CLIENTS)}"
        )
    return [n for n in names if n]


def sdk_root() -> Path:
    """Where ``clients/`` is built: this checkout, or ``EDGEREG_SDK_ROOT`` (built elsewhere)."""
    return Path(os.environ.get("EDGEREG_SDK_ROOT") or ROOT)


def command(client: str) -> list[str]:
    """The device program's command line for ``client`` (the doc's table).

    Fails the test, naming ``make sdk``, when the JVM jars or the Swift
    binary are not built.
    """
    if client == "python":
        return [sys.executable, "-m", "edgereg.client.device"]
    if client == "jvm":
        build = sdk_root() / "clients" / "android" / "build"
        jars = [
            jar
            for jar in sorted(build.glob("edgereg-android-*.jar"))
            if not jar.stem.endswith(("-sources", "-javadoc"))
        ]
        device_jar = build / "device.jar"
        if not jars or not device_jar.is_file():
            pytest.fail(
                f"the JVM device program is not built ({build}/edgereg-android-<v>.jar and "
                "device.jar): run `make sdk`"
            )
        classpath = os.pathsep.join([str(jars[-1]), str(device_jar)])
        return ["java", "-cp", classpath, "dev.edgereg.device.DeviceMain"]
    if client == "swift":
        binary = sdk_root() / "clients" / "swift" / ".build" / "release" / "edgereg-device"
        if not binary.is_file():
            pytest.fail(f"the Swift device program is not built ({binary}): run `make sdk`")
        return [str(binary)]
    raise ValueError(f"no client {client!r}; the clients are {', '.join(ALL_CLIENTS)}")


def hostrunner(
    *,
    faulty: Sequence[str] = (),
    unavailable: Sequence[str] = (),
    log: Path | None = None,
    api: str = "module",
) -> list[str]:
    """The host model runner's command line, for ``configure``'s ``runner.command``."""
    args = [sys.executable, str(HOSTRUNNER), "--api", api]
    if log is not None:
        args += ["--log", str(log)]
    for backend in faulty:
        args += ["--faulty", backend]
    for backend in unavailable:
        args += ["--unavailable", backend]
    return args


class DeviceProgram:
    """One running device program: requests in order, one answer each."""

    def __init__(self, client: str, log: Path, *, cwd: Path | None = None) -> None:
        self.client = client
        self.log = log
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with log.open("ab") as err:
            self.process = subprocess.Popen(
                command(client),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=err,
                cwd=cwd or log.parent,  # whatever a client writes stays in the test
                env=env,
            )
        self._lines: queue.Queue[bytes] = queue.Queue()
        assert self.process.stdout is not None
        threading.Thread(target=self._read, args=(self.process.stdout,), daemon=True).start()
        self._next_id = 0

    def _read(self, stream: IO[bytes]) -> None:
        for line in iter(stream.readline, b""):
            self._lines.put(line)
        self._lines.put(b"")

    def raw(self, line: bytes, timeout: float = 30.0) -> dict[str, Any]:
        """Send one raw line; return the parsed answer line."""
        assert self.process.stdin is not None
        try:
            self.process.stdin.write(line.rstrip(b"\n") + b"\n")
            self.process.stdin.flush()
        except OSError as exc:
            raise DeviceError(f"{self.client} device program is gone: {exc}{self.tail()}") from exc
        try:
            answer_line = self._lines.get(timeout=timeout)
        except queue.Empty:
            raise DeviceError(
                f"{self.client} device program gave no answer in {timeout:g} s to "
                f"{line[:200]!r}{self.tail()}"
            ) from None
        if not answer_line:
            raise DeviceError(
                f"{self.client} device program exited ({self.process.poll()}) on "
                f"{line[:200]!r}{self.tail()}"
            )
        try:
            answer = json.loads(answer_line)
        except ValueError as exc:
            raise DeviceError(
                f"{self.client} device program wrote a line that is not JSON: "
                f"{answer_line[:200]!r}{self.tail()}"
            ) from exc
        if not isinstance(answer, dict):
            raise DeviceError(f"{self.client} answered {answer_line[:200]!r}, not an object")
        return answer

    def call(self, op: str, *, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        """One request; the whole answer (``ok`` true or false), its id checked."""
        self._next_id += 1
        request = {"id": self._next_id, "op": op, **args}
        answer = self.raw(json.dumps(request).encode(), timeout)
        if answer.get("id") != self._next_id:
            raise DeviceError(f"{self.client} answered id {answer.get('id')!r} to {request!r}")
        return answer

    def request(self, op: str, *, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
        """One request that must succeed as a request (``ok: true``); returns its result."""
        answer = self.call(op, timeout=timeout, **args)
        if answer.get("ok") is not True or not isinstance(answer.get("result"), dict):
            raise DeviceError(f"{self.client} refused {op} {args!r}: {answer!r}{self.tail()}")
        result: dict[str, Any] = answer["result"]
        return result

    def send_only(self, op: str, **args: Any) -> None:
        """Send a request without waiting (then :meth:`kill` it mid-way)."""
        assert self.process.stdin is not None
        self._next_id += 1
        self.process.stdin.write(json.dumps({"id": self._next_id, "op": op, **args}).encode())
        self.process.stdin.write(b"\n")
        self.process.stdin.flush()

    def kill(self) -> None:
        """SIGKILL: the device dies wherever it is (no cleanup, no flush)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)
        self._close_pipes()

    def quit(self, timeout: float = 30.0) -> int:
        """Ask the program to exit; returns its exit status."""
        if self.process.poll() is None:
            try:
                self.request("quit", timeout=timeout)
            except DeviceError:
                self.kill()
                raise
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                raise DeviceError(f"{self.client} did not exit after quit") from None
        self._close_pipes()
        return self.process.returncode

    def _close_pipes(self) -> None:
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()

    def tail(self, lines: int = 15) -> str:
        """The end of the program's stderr, for failure messages."""
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()[-lines:]
        except OSError:
            return ""
        return "\n--- stderr ---\n" + "\n".join(text) if text else ""


def spawn(client: str, log: Path) -> DeviceProgram:
    """Start ``client``'s device program (stderr appended to ``log``) and check ``hello``."""
    program = DeviceProgram(client, log)
    hello = program.request("hello", timeout=60)
    if hello.get("client") != client:
        program.kill()
        raise DeviceError(f"the {client} program says it is {hello.get('client')!r}")
    return program


@pytest.fixture(params=selected_clients())
def device_client(request: pytest.FixtureRequest) -> str:
    """A client name from ``EDGEREG_CLIENTS``; each test runs once per client."""
    name: str = request.param
    return name


@pytest.fixture
def devices(device_client: str, tmp_path: Path) -> Iterator[Callable[[], DeviceProgram]]:
    """``devices()`` starts one more device program of the client; all stop after the test."""
    started: list[DeviceProgram] = []

    def start() -> DeviceProgram:
        program = spawn(device_client, tmp_path / f"{device_client}-{len(started)}.log")
        started.append(program)
        return program

    yield start
    for program in started:
        if program.process.poll() is None:
            with contextlib.suppress(DeviceError):
                program.quit(timeout=15)
