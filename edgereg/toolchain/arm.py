"""MNN's ARM kernels on this x86 build machine: an aarch64 sysroot run under QEMU user mode.

Phones run MNN's ARM kernels (NEON, ``sdot``, ``i8mm``, fp16 arithmetic),
which are other code than the x86 kernels the build verifies on. MNN's own
aarch64 wheel of the pinned version runs here under ``qemu-aarch64-static``
without binfmt or a chroot, and MNN reads its CPU features from the emulated
CPU's hwcaps, so ``-cpu`` decides which kernels run (docs/operations/
arm-verification.md).

The sysroot is set up once by ``edgereg toolchain arm install`` (run by
``make venv``) in the per-user cache shared by every repository
(``~/.cache/edgereg/arm/mnn-X/``, :mod:`edgereg.toolchain.usercache`; or
``$EDGEREG_ARM_DIR``):
Debian's arm64 ``python3.11`` packages, fetched with ``debootstrap
--download-only`` and unpacked with ``dpkg-deb -x`` (no second stage, no
chroot), plus the pinned ``mnn`` and ``numpy`` aarch64 wheels installed by the
host's pip (``--platform manylinux2014_aarch64 --only-binary=:all:
--target``). A build never downloads it; one that needs it and lacks it
fails naming the command.

A run is one emulator per CPU class, with the sysroot's python in isolated
mode, running the same standalone probe script as the minimum-runtime proof
(:mod:`edgereg.toolchain._runtime_probe`), all samples in one process: either
a process for that run alone, or a :class:`ClassWorker` that a build stage
keeps running for the class and sends each of its runs (starting the
emulator costs more than a small model's rows).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgereg._files import atomic_write
from edgereg.errors import BuildError
from edgereg.toolchain._process import (
    PROBE,
    ProbeFailure,
    ProbeRun,
    describe_status,
    probe_command,
    run_probe,
    scratch_dir,
    tail,
)
from edgereg.toolchain.usercache import user_cache_dir
from edgereg.toolchain.versions import installed_version

#: Environment variable that moves the sysroot cache.
ARM_DIR_ENV = "EDGEREG_ARM_DIR"
#: Where sysroots live by default, inside the per-user cache.
DEFAULT_ARM_DIR = "arm"
#: Written last into a sysroot: a directory without it is not installed.
MARKER = "edgereg-arm.json"
#: The command that installs the sysroot, named in errors.
INSTALL_COMMAND = "edgereg toolchain arm install"
#: The command that installs the emulator and debootstrap (Debian packages).
SYSTEM_COMMAND = "make arm-deps (apt-get install qemu-user-static debootstrap)"
#: The emulator (Debian's qemu-user-static); ``$EDGEREG_QEMU_AARCH64`` overrides it.
QEMU = "qemu-aarch64-static"
QEMU_ENV = "EDGEREG_QEMU_AARCH64"
#: Debian release whose arm64 python3.11 matches the host's cp311 wheels.
DEBIAN_SUITE = "bookworm"
DEBIAN_MIRROR = "http://deb.debian.org/debian"
#: Debian packages of the sysroot beyond debootstrap's minbase: the interpreter
#: and the C++ runtime MNN's wheel links against.
DEBIAN_PACKAGES = ("python3.11-minimal", "libpython3.11-stdlib", "libstdc++6", "libgomp1")
PYTHON = Path("usr/bin/python3.11")
#: Where the wheels go: a directory Debian's python puts on sys.path even in
#: isolated mode (-I), so no PYTHONPATH is needed.
SITE = Path("usr/lib/python3/dist-packages")
STAGE = "arm verify"
INSTALL_STAGE = "arm install"

ClassName = Literal["armv8", "armv8.2", "armv9"]


@dataclass(frozen=True)
class CpuClass:
    """A class of phone CPUs, the emulated CPU that stands for it, and what MNN sees there.

    Attributes:
        name: The class, as models.toml and device reports name it.
        cpus: QEMU ``-cpu`` models that stand for it, best first (the first
            one the installed emulator has is used).
        features: The CPU features MNN 3.6.1 reports on that emulated CPU,
            in the protocol's vocabulary (``dotprod``, ``fp16``, ``i8mm``, ``sve2``).
        phones: Examples of the cores in the class.
    """

    name: ClassName
    cpus: tuple[str, ...]
    features: tuple[str, ...]
    phones: str


#: The classes, oldest first. Measured with MNN 3.6.1 under QEMU 7.2
#: (``The device supports: i8sdot:…, fp16:…, i8mm:…, sve2:…`` at import).
CPU_CLASSES: dict[str, CpuClass] = {
    "armv8": CpuClass("armv8", ("cortex-a53",), (), "Cortex-A53/A57/A72/A73 (ARMv8.0)"),
    "armv8.2": CpuClass(
        "armv8.2",
        ("cortex-a76", "neoverse-n1"),
        ("dotprod", "fp16"),
        "Cortex-A55/A75/A76/A78 (ARMv8.2)",
    ),
    # QEMU 8.1+ has cortex-a710; Debian 12's 7.2 has only `max` with i8mm.
    "armv9": CpuClass(
        "armv9",
        ("cortex-a710", "max"),
        ("dotprod", "fp16", "i8mm", "sve2"),
        "Cortex-A710/X2 and later (flagships since 2022)",
    ),
}
CLASS_NAMES: tuple[str, ...] = tuple(CPU_CLASSES)

# MNN's words at import, mapped to the protocol's feature names.
_FEATURE_LINE = re.compile(r"The device supports:(.*)")
_MNN_FEATURES = {"i8sdot": "dotprod", "fp16": "fp16", "i8mm": "i8mm", "sve2": "sve2", "sme2": "sme"}

ArmFailure = Literal["missing", "broken", "crash", "timeout", "failed", "load"]


class ArmError(BuildError):
    """The emulated ARM run could not be set up or did not produce outputs.

    Attributes:
        reason: ``missing`` (emulator or sysroot not installed), ``broken``,
            ``load``, ``crash``, ``timeout`` or ``failed``.
        cpu_class: The class being run, when one was.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: ArmFailure,
        cpu_class: str | None = None,
        stage: str = STAGE,
        hint: str | None = None,
        exit_status: int | None = None,
        output_tail: str | None = None,
    ) -> None:
        super().__init__(
            message,
            stage=stage,
            tool=f"{QEMU} (MNN aarch64)",
            hint=hint,
            exit_status=exit_status,
            output_tail=output_tail,
        )
        self.reason = reason
        self.cpu_class = cpu_class


@dataclass(frozen=True)
class Sysroot:
    """An installed aarch64 sysroot with MNN.

    Attributes:
        path: The sysroot directory (QEMU's ``-L``).
        mnn_version: The MNN wheel it holds.
        numpy_version: The numpy wheel beside it.
        size_bytes: Its size on disk when installed.
    """

    path: Path
    mnn_version: str
    numpy_version: str
    size_bytes: int

    @property
    def python(self) -> Path:
        """The sysroot's interpreter (an aarch64 binary)."""
        return self.path / PYTHON


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install_sysroot` did: the sysroot, whether it downloaded, and how long."""

    sysroot: Sysroot
    installed: bool
    seconds: float


@dataclass(frozen=True)
class ArmRun:
    """Outputs of one artifact on one emulated CPU class.

    Attributes:
        cpu_class: The class.
        qemu_cpu: The ``-cpu`` model that ran.
        features: CPU features MNN reported (protocol names).
        outputs: Output name to ``(N, ...)`` array, one row per forward.
        mnn_version: The MNN version that ran.
        seconds: Wall-clock time of the emulator process.
        rest_from: When only the first rows were emulated: the run (``host`` or
            a class) they matched bit for bit, whose outputs stand for the others.
    """

    cpu_class: str
    qemu_cpu: str
    features: tuple[str, ...]
    outputs: dict[str, np.ndarray]
    mnn_version: str
    seconds: float
    rest_from: str | None = None


def arm_dir() -> Path:
    """The sysroot cache: ``$EDGEREG_ARM_DIR``, else ``arm/`` in the per-user cache."""
    override = os.environ.get(ARM_DIR_ENV)
    if override:
        return Path(override)
    return user_cache_dir() / DEFAULT_ARM_DIR


def sysroot_dir(mnn_version: str, root: Path | str | None = None) -> Path:
    """Where the sysroot of ``mnn_version`` lives (installed or not), absolute."""
    if not re.fullmatch(r"[0-9]+(\.[0-9]+)*", mnn_version):
        raise ValueError(f"{mnn_version!r} is not an MNN version like 3.6.1")
    return ((Path(root) if root is not None else arm_dir()) / f"mnn-{mnn_version}").absolute()


def qemu_path() -> str:
    """The emulator to run, or raise naming the command that installs it."""
    name = os.environ.get(QEMU_ENV) or QEMU
    found = shutil.which(name)
    if found is None:
        raise ArmError(
            f"{name} is not installed, so the ARM kernels cannot be verified",
            reason="missing",
            hint=f"install it once: {SYSTEM_COMMAND}",
        )
    return found


def qemu_cpus(qemu: str | None = None) -> tuple[str, ...]:
    """The ``-cpu`` models the installed emulator knows."""
    proc = subprocess.run(
        [qemu or qemu_path(), "-cpu", "help"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    names = []
    for line in proc.stdout.splitlines()[1:]:
        names += line.split()
    return tuple(names)


def emulated_cpu(cpu_class: CpuClass, available: Sequence[str]) -> str:
    """The first ``-cpu`` model of the class that the emulator has."""
    for cpu in cpu_class.cpus:
        if cpu in available:
            return cpu
    raise ArmError(
        f"the emulator has none of {', '.join(cpu_class.cpus)} for class {cpu_class.name}",
        reason="missing",
        cpu_class=cpu_class.name,
        hint=f"install a QEMU that has one ({SYSTEM_COMMAND})",
    )


def parse_features(output: str) -> tuple[str, ...] | None:
    """The CPU features in MNN's import line (``The device supports: i8sdot:1, …``)."""
    match = _FEATURE_LINE.search(output)
    if match is None:
        return None
    found = []
    for item in match.group(1).split(","):
        key, _, value = item.partition(":")
        name = _MNN_FEATURES.get(key.strip())
        if name is not None and value.strip() == "1":
            found.append(name)
    return tuple(found)


def _missing(path: Path, why: str) -> ArmError:
    return ArmError(
        f"the aarch64 sysroot for ARM verification is not installed ({path}: {why})",
        reason="missing",
        hint=f"install it once with `{INSTALL_COMMAND}` (`make venv` runs it; it needs "
        f"{QEMU} and debootstrap: {SYSTEM_COMMAND}); builds never download it",
    )


def find_sysroot(mnn_version: str, *, root: Path | str | None = None) -> Sysroot:
    """The installed sysroot for ``mnn_version``, without starting it.

    Raises:
        ArmError: (reason ``missing``) not installed or never finished.
    """
    path = sysroot_dir(mnn_version, root)
    try:
        record = json.loads((path / MARKER).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        why = "no such directory" if not path.exists() else f"no {MARKER}: never finished"
        raise _missing(path, why) from exc
    except (OSError, ValueError) as exc:
        raise _missing(path, f"unreadable {MARKER}: {exc}") from exc
    if not isinstance(record, dict) or record.get("mnn") != mnn_version:
        raise _missing(path, f"{MARKER} describes another sysroot: {record!r}")
    if not (path / PYTHON).is_file():
        raise _missing(path, f"{PYTHON} is missing")
    return Sysroot(
        path=path,
        mnn_version=mnn_version,
        numpy_version=str(record.get("numpy", "")),
        size_bytes=int(record.get("size_bytes", 0)),
    )


def _tool(argv: Sequence[str], *, what: str, timeout: float, cwd: Path | None = None) -> str:
    try:
        proc = subprocess.run(
            list(argv),
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise ArmError(
            f"{what} could not start: {exc}",
            reason="missing",
            stage=INSTALL_STAGE,
            hint=f"install the tools once: {SYSTEM_COMMAND}",
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise ArmError(
            f"{what} did not finish within {timeout:g} s",
            reason="timeout",
            stage=INSTALL_STAGE,
            hint="check the connection to the Debian mirror and the package index, then "
            "run the command again",
        ) from exc
    output = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise ArmError(
            f"{what} failed ({describe_status(proc.returncode)})",
            reason="failed",
            stage=INSTALL_STAGE,
            exit_status=proc.returncode,
            output_tail=tail(output),
        )
    return output


def _size(path: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue
    return total


def install_sysroot(
    mnn_version: str,
    *,
    root: Path | str | None = None,
    numpy_version: str | None = None,
    mirror: str = DEBIAN_MIRROR,
    timeout: float = 900.0,
) -> InstallResult:
    """Build the aarch64 sysroot for ``mnn_version`` unless it is already there.

    Staged in a temporary directory beside its destination, checked by
    importing MNN under the emulator, and only then moved into place, so an
    interrupted install leaves nothing that looks installed.

    Raises:
        ArmError: a tool is missing, a download failed, or the result does
            not import that MNN under the emulator.
    """
    started = time.perf_counter()
    dest = sysroot_dir(mnn_version, root)
    try:
        return InstallResult(find_sysroot(mnn_version, root=root), False, 0.0)
    except ArmError:
        pass
    qemu = qemu_path()
    if shutil.which("debootstrap") is None or shutil.which("dpkg-deb") is None:
        raise ArmError(
            "debootstrap (and dpkg-deb) are needed to fetch Debian's arm64 python",
            reason="missing",
            stage=INSTALL_STAGE,
            hint=f"install them once: {SYSTEM_COMMAND}",
        )
    numpy_pin = numpy_version or installed_version("numpy")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".mnn-{mnn_version}.", dir=dest.parent))
    staging.chmod(0o755)
    try:
        debs = staging / "debs"
        _tool(
            [
                "debootstrap",
                "--download-only",
                "--variant=minbase",
                "--arch=arm64",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                DEBIAN_SUITE,
                str(debs),
                mirror,
            ],
            what=f"debootstrap --download-only --arch=arm64 {DEBIAN_SUITE}",
            timeout=timeout,
        )
        sysroot = staging / "root"
        sysroot.mkdir()
        archives = sorted((debs / "var/cache/apt/archives").glob("*.deb"))
        if not archives:
            raise ArmError(
                "debootstrap downloaded no packages", reason="failed", stage=INSTALL_STAGE
            )
        for deb in archives:
            _tool(
                ["dpkg-deb", "-x", str(deb), str(sysroot)],
                what=f"dpkg-deb -x {deb.name}",
                timeout=timeout,
            )
        shutil.rmtree(debs)
        packages = [f"mnn=={mnn_version}", f"numpy=={numpy_pin}" if numpy_pin else "numpy"]
        _tool(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-input",
                "--disable-pip-version-check",
                "--only-binary=:all:",
                "--platform",
                "manylinux2014_aarch64",
                "--platform",
                "manylinux_2_28_aarch64",
                "--python-version",
                "3.11",
                "--implementation",
                "cp",
                "--abi",
                "cp311",
                "--target",
                str(sysroot / SITE),
                *packages,
            ],
            what=f"pip install (aarch64) {' '.join(packages)}",
            timeout=timeout,
        )
        check = _check(qemu, sysroot, timeout=timeout)
        if check.get("mnn_version") != mnn_version:
            raise ArmError(
                f"the new sysroot imports MNN {check.get('mnn_version')}, not {mnn_version}",
                reason="broken",
                stage=INSTALL_STAGE,
            )
        record = {
            "mnn": mnn_version,
            "numpy": str(check.get("numpy_version", "")),
            "debian": DEBIAN_SUITE,
            "packages": [deb.name for deb in archives],
            "size_bytes": _size(sysroot),
        }
        atomic_write(sysroot / MARKER, (json.dumps(record, indent=1) + "\n").encode())
        if dest.exists():
            try:
                found = find_sysroot(mnn_version, root=root)
            except ArmError:
                shutil.rmtree(dest)
            else:
                return InstallResult(found, False, time.perf_counter() - started)
        os.replace(sysroot, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return InstallResult(find_sysroot(mnn_version, root=root), True, time.perf_counter() - started)


def _check(qemu: str, sysroot: Path, *, timeout: float) -> dict[str, Any]:
    """Import MNN under the emulator (the oldest class) and return the probe's versions."""
    with scratch_dir() as scratch:
        run = _probe(
            qemu,
            sysroot,
            CPU_CLASSES["armv8"].cpus[0],
            {"op": "version"},
            scratch=scratch,
            timeout=timeout,
            cpu_class="armv8",
            stage=INSTALL_STAGE,
        )
    return run.result


def _reinstall(sysroot: Path) -> str:
    return f"reinstall the sysroot: delete {sysroot} and run `{INSTALL_COMMAND}`"


def _probe_error(
    failure: ProbeFailure,
    *,
    qemu: str,
    sysroot: Path,
    cpu: str,
    cpu_class: str,
    timeout: float,
    stage: str = STAGE,
) -> ArmError:
    """The error of an emulated run that gave no usable result, one-shot or worker alike."""
    if failure.kind == "start":
        return ArmError(
            f"cannot start {qemu}: {failure.error}",
            reason="missing",
            cpu_class=cpu_class,
            stage=stage,
            hint=f"install it once: {SYSTEM_COMMAND}",
        )
    if failure.kind == "timeout":
        return ArmError(
            f"the emulated {cpu_class} run ({cpu}) did not finish within {timeout:g} s",
            reason="timeout",
            cpu_class=cpu_class,
            stage=stage,
            output_tail=failure.output_tail,
            hint="emulation costs 30-500x native time: lower arm_samples, or raise the timeout",
        )
    if failure.kind == "import":
        return ArmError(
            f"MNN does not start in the aarch64 sysroot: {failure.error}",
            reason="broken",
            cpu_class=cpu_class,
            stage=stage,
            exit_status=failure.exit_status,
            output_tail=failure.output_tail,
            hint=_reinstall(sysroot),
        )
    crashed = failure.kind == "crash"
    status = failure.exit_status if failure.exit_status is not None else 0
    return ArmError(
        f"the emulated {cpu_class} run ({cpu}) "
        + ("crashed" if crashed else "stopped")
        + f" ({describe_status(status)}) without a result",
        reason="crash" if crashed else "broken",
        cpu_class=cpu_class,
        stage=stage,
        exit_status=failure.exit_status,
        output_tail=failure.output_tail,
        hint=None if crashed else _reinstall(sysroot),
    )


def _launcher(qemu: str, sysroot: Path, cpu: str) -> list[str]:
    """The sysroot's python under the emulator as ``cpu``."""
    return [qemu, "-cpu", cpu, "-L", str(sysroot), str(sysroot / PYTHON)]


def _copy_probe(scratch: Path) -> Path:
    """The probe script, copied into ``scratch``.

    Its path must exist on the host, which QEMU's ``-L`` falls back to for
    every path the sysroot lacks.
    """
    probe = scratch / "probe.py"
    shutil.copyfile(PROBE, probe)
    return probe


def _probe(
    qemu: str,
    sysroot: Path,
    cpu: str,
    request: dict[str, Any],
    *,
    scratch: Path,
    timeout: float,
    cpu_class: str,
    stage: str = STAGE,
) -> ProbeRun:
    """Run the probe script under QEMU; raise :class:`ArmError` unless it reported."""

    def error(failure: ProbeFailure) -> ArmError:
        return _probe_error(
            failure,
            qemu=qemu,
            sysroot=sysroot,
            cpu=cpu,
            cpu_class=cpu_class,
            timeout=timeout,
            stage=stage,
        )

    return run_probe(
        _launcher(qemu, sysroot, cpu),
        request,
        scratch=scratch,
        timeout=timeout,
        error=error,
        script=_copy_probe(scratch),
    )


#: Exit status of a one-shot probe that reported an error (``_runtime_probe``):
#: what a worker's reported error is given too, so both paths fail alike.
_REPORTED_ERROR = 3
#: How much of an answer that is not a result an error quotes.
_QUOTED = 200
#: Worker processes not yet stopped: killed at interpreter exit if a caller forgot.
_LIVE: weakref.WeakSet[ClassWorker] = weakref.WeakSet()


class ClassWorker:
    """One CPU class's emulator kept running: QEMU, the sysroot's python and MNN started once.

    Emulation makes starting costly (QEMU, Python, numpy and MNN imported
    under it: seconds per class, more than a small model's rows), so a build
    stage starts one worker per class and sends it every run of that class:
    the probe script's ``--serve`` mode reads a request per line on stdin
    and answers on a pipe of its own (stdout belongs to MNN's chatter, kept
    in a log for error tails), with the one-shot run's own code, so its
    outputs are the same bits. :meth:`start` returns at once: MNN imports
    while the caller does other work.

    A worker that crashes, stops or times out is gone, and its failure is the
    one-shot run's (:func:`run_on_class`); the next run starts a new one. A
    run MNN reported failed, an answer that is not a result and an
    interrupted run also end the worker. :meth:`close` kills it (nothing it
    holds is worth waiting for) and removes its files; a worker whose parent
    dies exits within a second, even mid-run (the probe watches its parent),
    and the live ones are killed at interpreter exit.

    Args:
        qemu: The emulator.
        sysroot: The sysroot directory.
        cpu_class: The class (named in errors).
        cpu: The ``-cpu`` model that stands for it.
    """

    def __init__(self, qemu: str, sysroot: Path, cpu_class: str, cpu: str) -> None:
        self.qemu = qemu
        self.sysroot = sysroot
        self.cpu_class = cpu_class
        self.cpu = cpu
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._reply: int | None = None
        self._scratch: Path | None = None
        self._buffer = b""
        # What the emulator printed while MNN imported (its CPU features), once ready.
        self._import_output: str | None = None

    @property
    def pid(self) -> int | None:
        """The emulator's process id while it runs."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def _error(self, failure: ProbeFailure, timeout: float = 0.0) -> ArmError:
        return _probe_error(
            failure,
            qemu=self.qemu,
            sysroot=self.sysroot,
            cpu=self.cpu,
            cpu_class=self.cpu_class,
            timeout=timeout,
        )

    def start(self) -> None:
        """Start the emulator unless it runs; return without waiting for MNN to import.

        Raises:
            ArmError: (reason ``missing``) the emulator cannot be started.
        """
        with self._lock:
            self._start()

    def _start(self) -> None:
        if self._proc is not None:
            return
        scratch = Path(tempfile.mkdtemp(prefix=".edgereg-arm-"))
        probe = _copy_probe(scratch)
        read_end, write_end = os.pipe()
        launcher = _launcher(self.qemu, self.sysroot, self.cpu)
        try:
            with (scratch / "output.log").open("wb") as log:
                proc = subprocess.Popen(
                    probe_command(launcher, probe, "--serve", str(write_end), str(os.getpid())),
                    cwd=scratch,
                    stdin=subprocess.PIPE,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    pass_fds=(write_end,),
                )
        except OSError as exc:
            os.close(read_end)
            shutil.rmtree(scratch, ignore_errors=True)
            raise self._error(ProbeFailure("start", error=str(exc))) from exc
        finally:
            os.close(write_end)
        self._proc, self._reply, self._scratch = proc, read_end, scratch
        self._buffer, self._import_output = b"", None
        _LIVE.add(self)

    def _output(self, offset: int = 0) -> str:
        """What the emulator printed since ``offset``, after what it printed importing MNN."""
        if self._scratch is None:
            return ""
        try:
            with (self._scratch / "output.log").open("rb") as log:
                log.seek(offset)
                printed = log.read().decode("utf-8", "replace")
        except OSError:
            printed = ""
        return (self._import_output or "") + printed

    def _log_size(self) -> int:
        try:
            return (self._scratch / "output.log").stat().st_size if self._scratch else 0
        except OSError:
            return 0

    def _receive(self, deadline: float, timeout: float, offset: int) -> dict[str, Any]:
        """The worker's next answer; raise what a one-shot run raises when there is none."""
        assert self._proc is not None
        assert self._reply is not None
        while b"\n" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                failure = ProbeFailure("timeout", output_tail=tail(self._output(offset)))
                raise self._error(failure, timeout)
            ready, _, _ = select.select([self._reply], [], [], remaining)
            if not ready:
                continue
            chunk = os.read(self._reply, 1 << 16)
            if not chunk:
                # The reply pipe closed: the emulator exited (or was killed by close()).
                try:
                    status = self._proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    status = self._proc.wait()
                raise self._error(ProbeFailure.ended(status, self._output(offset)), timeout)
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        try:
            answer = json.loads(line)
        except ValueError:  # not JSON, or not UTF-8
            answer = None
        if not isinstance(answer, dict):
            raise ArmError(
                f"the emulated {self.cpu_class} run ({self.cpu}) answered with no result: "
                f"{line[:_QUOTED]!r}",
                reason="broken",
                cpu_class=self.cpu_class,
                output_tail=tail(self._output(offset)),
                hint=_reinstall(self.sysroot),
            )
        return answer

    def run(self, request: dict[str, Any], *, timeout: float = 900.0) -> ProbeRun:
        """Send one probe request (no ``result`` path) and return its result.

        Returns:
            The run, as :func:`edgereg.toolchain._process.run_probe` returns a
            one-shot one: its output is what the emulator printed importing
            MNN and running this request.

        Raises:
            ArmError: What a one-shot run of the request raises when the
                emulator cannot start, times out (the timeout counts from this
                call), crashes or stops without a result, or MNN does not
                import; or (reason ``broken``) the worker answered with
                something other than a result.
        """
        with self._lock:
            started = time.perf_counter()
            deadline = time.monotonic() + timeout
            try:
                self._start()
                if self._import_output is None:
                    ready = self._receive(deadline, timeout, 0)
                    # Its first answer is the import's, whatever phase it names.
                    failure = ProbeFailure.not_imported(
                        {**ready, "phase": "import"}, self._output(), _REPORTED_ERROR
                    )
                    if failure is not None:
                        raise self._error(failure, timeout)
                    self._import_output = self._output()
                offset = self._log_size()
                assert self._proc is not None
                assert self._proc.stdin is not None
                try:
                    self._proc.stdin.write(json.dumps(request).encode("utf-8") + b"\n")
                    self._proc.stdin.flush()
                except OSError:
                    pass  # it exited: _receive reads the end of its reply pipe and says how
                result = self._receive(deadline, timeout, offset)
                output = self._output(offset)
                if not result.get("ok"):
                    # A one-shot run would have ended here: so does the worker.
                    self._discard()
            except BaseException:
                # Failed or interrupted (Ctrl-C): nothing of this worker is left running.
                self._discard()
                raise
        status = 0 if result.get("ok") else _REPORTED_ERROR
        return ProbeRun(result, output, status, time.perf_counter() - started)

    def _discard(self) -> None:
        """Kill the emulator and remove its files (the caller holds the lock)."""
        proc, self._proc = self._proc, None
        reply, self._reply = self._reply, None
        scratch, self._scratch = self._scratch, None
        self._buffer, self._import_output = b"", None
        _LIVE.discard(self)
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
        if reply is not None:
            os.close(reply)
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)

    def close(self) -> None:
        """Stop the emulator, even mid-run (that run fails as a crash), and remove its files."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            # Unblocks a run in another thread, which then discards the worker itself.
            proc.kill()
        with self._lock:
            self._discard()


@atexit.register
def _kill_live_workers() -> None:
    # Not close(): a run in another thread may hold its lock. Killed, then its files.
    for worker in list(_LIVE):
        proc, scratch = worker._proc, worker._scratch
        if proc is not None and proc.poll() is None:
            proc.kill()
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def run_on_class(
    artifact: Path | str,
    cpu_class: str,
    inputs: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    sysroot: Sysroot,
    precision: str = "normal",
    whole_tensors: bool = True,
    timeout: float = 900.0,
    available_cpus: Sequence[str] | None = None,
    qemu: str | None = None,
    worker: ClassWorker | None = None,
) -> ArmRun:
    """Run an artifact on one emulated CPU class: every sample in one emulator process.

    Args:
        artifact: The ``.mnn`` file.
        cpu_class: A key of :data:`CPU_CLASSES`.
        inputs: Input name to ``(N, ...)`` array (float32 or int32).
        input_names: The model's inputs, in its order.
        output_names: Outputs to return.
        sysroot: The installed sysroot (:func:`find_sysroot`).
        precision: MNN's CPU precision mode, the variant's runtime hint
            (``low`` computes in fp16 on cores that have it).
        whole_tensors: Each row is one forward's whole tensor.
        timeout: Seconds before the emulator is killed.
        available_cpus: The emulator's ``-cpu`` models (looked up when None).
        qemu: The emulator to run (default: :func:`qemu_path`).
        worker: The class's running emulator (:class:`ClassWorker`, its
            ``-cpu`` model stands for the class); default: a new emulator
            process for this run alone. Both give the same outputs and errors.

    Raises:
        ArmError: the emulator or sysroot is missing or broken, or MNN
            refuses, crashes on or fails the model on that CPU.
    """
    if worker is not None:
        cpu = worker.cpu
    else:
        spec = CPU_CLASSES[cpu_class]
        qemu = qemu or qemu_path()
        cpu = emulated_cpu(spec, available_cpus if available_cpus is not None else qemu_cpus(qemu))
    path = Path(artifact).resolve()
    arrays: dict[str, np.ndarray] = {}
    for name in input_names:
        array = np.asarray(inputs[name])
        dtype = np.int32 if array.dtype.kind in "iub" else np.float32
        arrays[name] = np.ascontiguousarray(array, dtype=dtype)
    with scratch_dir() as scratch:
        np.savez(scratch / "inputs.npz", **arrays)  # type: ignore[arg-type]
        request = {
            "op": "run",
            "model": str(path),
            "inputs": str(scratch / "inputs.npz"),
            "output": str(scratch / "outputs.npz"),
            "input_names": list(input_names),
            "output_names": list(output_names),
            "whole": whole_tensors,
            "precision": precision,
        }
        if worker is not None:
            run = worker.run(request, timeout=timeout)
        else:
            assert qemu is not None
            run = _probe(
                qemu,
                sysroot.path,
                cpu,
                request,
                scratch=scratch,
                timeout=timeout,
                cpu_class=cpu_class,
            )
        result, output = run.result, run.output
        if not result.get("ok"):
            phase = result.get("phase")
            raise ArmError(
                f"MNN {result.get('mnn_version')} on {cpu_class} ({cpu}) "
                + ("cannot load" if phase == "load" else "fails to run")
                + f" {path.name}: {result.get('error')}",
                reason="load" if phase == "load" else "failed",
                cpu_class=cpu_class,
                exit_status=run.exit_status,
                output_tail=tail(output + "\n" + str(result.get("traceback", ""))),
            )
        names = result.get("output_names")
        try:
            if not isinstance(names, list):
                raise TypeError(f"output_names is {names!r}")
            with np.load(scratch / "outputs.npz") as data:
                outputs = {str(name): np.array(data[name]) for name in names}
        except (OSError, KeyError, TypeError, ValueError) as exc:
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise ArmError(
                f"the emulated {cpu_class} run ({cpu}) reported outputs it did not give: {why}",
                reason="broken",
                cpu_class=cpu_class,
                exit_status=run.exit_status,
                output_tail=tail(output),
                hint=_reinstall(sysroot.path),
            ) from exc
    return ArmRun(
        cpu_class=cpu_class,
        qemu_cpu=cpu,
        features=parse_features(output) or (),
        outputs=outputs,
        mnn_version=str(result.get("mnn_version", "")),
        seconds=run.seconds,
    )
