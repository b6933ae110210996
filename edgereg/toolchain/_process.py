"""Running the MNN worker in a child process, and writing outputs atomically.

Everything that can go wrong in a child (a crash, a signal, a timeout, an
exception, a missing result) comes back as one :class:`BuildError` naming the
stage, the tool, the exit status and the tail of what the child printed.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from edgereg.errors import BuildError

WORKER = Path(__file__).with_name("_worker.py")
#: The standalone script an isolated MNN (an old runtime, the aarch64 sysroot) runs.
PROBE = Path(__file__).with_name("_runtime_probe.py")
TAIL_LINES = 20


@dataclass(frozen=True)
class WorkerRun:
    """What one worker call produced.

    Attributes:
        result: The JSON result the worker wrote.
        output: Everything the child printed (stdout and stderr, merged).
        duration: Wall-clock seconds of the child, start to exit.
        exit_status: The child's return code.
    """

    result: dict[str, Any]
    output: str
    duration: float
    exit_status: int


def tail(text: str, lines: int = TAIL_LINES) -> str:
    """Return the last ``lines`` non-empty lines of ``text``.

    Progress bars redraw with carriage returns; each redraw counts as a line
    so the tail shows where they stopped, not thousands of percentages.
    """
    kept = [line.rstrip() for line in text.replace("\r", "\n").split("\n") if line.strip()]
    return "\n".join(kept[-lines:])


def describe_status(status: int) -> str:
    """Render a return code, naming the signal when the child was killed."""
    if status < 0:
        try:
            return f"killed by signal {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


@contextlib.contextmanager
def scratch_dir(near: Path | None = None) -> Iterator[Path]:
    """Yield a fresh directory, removed with its contents afterwards.

    Args:
        near: Create it inside this directory (so a file moved from it to
            ``near`` is a same-filesystem, atomic rename); else in the system
            temp directory.
    """
    path = Path(tempfile.mkdtemp(prefix=".edgereg-", dir=near))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale(path: Path) -> None:
    """Delete ``path`` if it exists, so a failed step cannot leave an old file."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


def run_worker(
    op: str,
    request: dict[str, Any],
    *,
    scratch: Path,
    stage: str,
    tool: str,
    timeout: float,
) -> WorkerRun:
    """Run one worker operation in a child process with ``scratch`` as cwd.

    Args:
        op: Worker operation name.
        request: Operation arguments (JSON-serialisable; paths absolute).
        scratch: Existing empty directory owned by this call.
        stage: Build stage named in errors.
        tool: Tool named in errors (``mnnconvert``, ``mnnquant``, ``MNN``).
        timeout: Seconds before the child is killed.

    Returns:
        The run, when the child exited 0 and wrote a result.

    Raises:
        BuildError: The child timed out, crashed, exited non-zero, reported an
            exception, or wrote no result.
    """
    result_path = scratch / "result.json"
    request_path = scratch / "request.json"
    request_path.write_text(
        json.dumps({**request, "op": op, "result": str(result_path)}), encoding="utf-8"
    )
    # -P (3.11+): keep this package's directory off the child's sys.path, so
    # its module names never shadow anything; -X faulthandler: a segfault
    # prints the Python stack into the captured output.
    safe_path = ["-P"] if sys.version_info >= (3, 11) else []
    argv: Sequence[str] = [
        sys.executable,
        *safe_path,
        "-X",
        "faulthandler",
        str(WORKER),
        str(request_path),
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1"}
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            argv,
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        partial = exc.output.decode("utf-8", "replace") if isinstance(exc.output, bytes) else ""
        raise BuildError(
            f"{tool} did not finish within {timeout:g} s and was killed",
            stage=stage,
            tool=tool,
            output_tail=tail(partial),
            hint="raise the timeout, or check the model is not unexpectedly large",
        ) from exc
    duration = time.perf_counter() - started
    output = proc.stdout.decode("utf-8", "replace")
    result: dict[str, Any] | None = None
    if result_path.is_file():
        result = json.loads(result_path.read_text(encoding="utf-8"))
    if proc.returncode != 0 or result is None or not result.get("ok"):
        if result is not None and not result.get("ok"):
            message = f"{tool} failed: {result.get('error', 'unknown error')}"
            output = output + "\n" + str(result.get("traceback", ""))
        elif proc.returncode < 0:
            message = f"{tool} crashed ({describe_status(proc.returncode)})"
        else:
            message = f"{tool} stopped ({describe_status(proc.returncode)}) without a result"
        raise BuildError(
            message,
            stage=stage,
            tool=tool,
            exit_status=proc.returncode,
            output_tail=tail(output),
        )
    return WorkerRun(result=result, output=output, duration=duration, exit_status=proc.returncode)


ProbeFault = Literal["start", "timeout", "crash", "stopped", "import"]


@dataclass(frozen=True)
class ProbeFailure:
    """Why a probe run gave no usable result; the caller words it as its own error.

    Attributes:
        kind: ``start`` (the interpreter or emulator could not start),
            ``timeout`` (killed after the timeout), ``crash`` (killed by a
            signal without a result), ``stopped`` (exited without a result)
            or ``import`` (the probe reported that MNN does not import).
        output_tail: The tail of what the child printed (with the probe's
            traceback for ``import``); empty for ``start``.
        exit_status: The child's return code (None for ``start`` and ``timeout``).
        error: The OS error for ``start``, the probe's error text for ``import``.
    """

    kind: ProbeFault
    output_tail: str = ""
    exit_status: int | None = None
    error: str = ""

    @classmethod
    def ended(cls, status: int, output: str) -> ProbeFailure:
        """A child that exited with ``status`` before giving its result: crashed or stopped."""
        return cls(
            "crash" if status < 0 else "stopped", output_tail=tail(output), exit_status=status
        )

    @classmethod
    def not_imported(cls, result: dict[str, Any], output: str, status: int) -> ProbeFailure | None:
        """The failure a probe's ``result`` reports when MNN did not import, else None."""
        if result.get("ok") or result.get("phase") != "import":
            return None
        return cls(
            "import",
            output_tail=tail(output + "\n" + str(result.get("traceback", ""))),
            exit_status=status,
            error=str(result.get("error")),
        )


@dataclass(frozen=True)
class ProbeRun:
    """A probe run that wrote a result (which may still say the model failed).

    Attributes:
        result: The probe's JSON result.
        output: Everything the child printed (stdout and stderr, merged).
        exit_status: The child's return code.
        seconds: Wall-clock time of the child, start to exit.
    """

    result: dict[str, Any]
    output: str
    exit_status: int
    seconds: float


def probe_command(launcher: Sequence[str], script: Path, *args: str) -> list[str]:
    """``LAUNCHER... -I -u -X faulthandler SCRIPT ARGS...``: the probe under an isolated MNN.

    ``-I`` keeps PYTHONPATH, the user site and the script directory out, so
    the build's own MNN cannot be imported in its place; ``-u`` loses nothing
    the child printed in a buffer when it dies; ``-X faulthandler``
    prints the Python stack of a segfault into the output.
    """
    return [*launcher, "-I", "-u", "-X", "faulthandler", str(script), *args]


def run_probe(
    launcher: Sequence[str],
    request: dict[str, Any],
    *,
    scratch: Path,
    timeout: float,
    error: Callable[[ProbeFailure], BuildError],
    script: Path = PROBE,
) -> ProbeRun:
    """Run the probe script in a child process with ``scratch`` as cwd.

    The one way an isolated MNN is started, whether an old runtime's python
    or the aarch64 sysroot's under QEMU (:func:`probe_command`; a kept ARM
    emulator, :class:`edgereg.toolchain.arm.ClassWorker`, starts the same).

    Args:
        launcher: The interpreter, with whatever runs it (``qemu -cpu X -L
            ROOT ROOT/usr/bin/python3.11``).
        request: The probe's request (JSON-serialisable; paths absolute).
        scratch: Existing empty directory owned by this call.
        timeout: Seconds before the child is killed.
        error: Turns a failure into the caller's own error, with its wording and hint.
        script: The probe script (a copy, when the launcher needs it elsewhere).

    Returns:
        The run, when the probe wrote a result past importing MNN.

    Raises:
        BuildError: What ``error`` makes of a child that could not start, timed
            out, crashed or stopped without a result, or whose MNN does not import.
    """
    result_path = scratch / "result.json"
    request_path = scratch / "request.json"
    request_path.write_text(json.dumps({**request, "result": str(result_path)}), encoding="utf-8")
    argv = probe_command(launcher, script, str(request_path))
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            argv,
            cwd=scratch,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise error(ProbeFailure("start", error=str(exc))) from exc
    except subprocess.TimeoutExpired as exc:
        partial = exc.output.decode("utf-8", "replace") if isinstance(exc.output, bytes) else ""
        raise error(ProbeFailure("timeout", output_tail=tail(partial))) from exc
    seconds = time.perf_counter() - started
    output = proc.stdout.decode("utf-8", "replace")
    if not result_path.is_file():
        raise error(ProbeFailure.ended(proc.returncode, output))
    result: dict[str, Any] = json.loads(result_path.read_text(encoding="utf-8"))
    failure = ProbeFailure.not_imported(result, output, proc.returncode)
    if failure is not None:
        raise error(failure)
    return ProbeRun(result, output, proc.returncode, seconds)
