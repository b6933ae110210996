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

A run starts one emulator per CPU class and artifact, with the sysroot's
python in isolated mode, running the same standalone probe script as the
minimum-runtime proof (:mod:`edgereg.toolchain._runtime_probe`), all samples
in one process.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
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
    # The probe is copied in: its path must exist on the host, which QEMU's -L
    # falls back to for every path the sysroot lacks.
    probe = scratch / "probe.py"
    shutil.copyfile(PROBE, probe)

    def error(failure: ProbeFailure) -> ArmError:
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
        reinstall = f"reinstall the sysroot: delete {sysroot} and run `{INSTALL_COMMAND}`"
        if failure.kind == "import":
            return ArmError(
                f"MNN does not start in the aarch64 sysroot: {failure.error}",
                reason="broken",
                cpu_class=cpu_class,
                stage=stage,
                exit_status=failure.exit_status,
                output_tail=failure.output_tail,
                hint=reinstall,
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
            hint=None if crashed else reinstall,
        )

    launcher = [qemu, "-cpu", cpu, "-L", str(sysroot), str(sysroot / PYTHON)]
    return run_probe(launcher, request, scratch=scratch, timeout=timeout, error=error, script=probe)


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

    Raises:
        ArmError: the emulator or sysroot is missing or broken, or MNN
            refuses, crashes on or fails the model on that CPU.
    """
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
        run = _probe(
            qemu,
            sysroot.path,
            cpu,
            {
                "op": "run",
                "model": str(path),
                "inputs": str(scratch / "inputs.npz"),
                "output": str(scratch / "outputs.npz"),
                "input_names": list(input_names),
                "output_names": list(output_names),
                "whole": whole_tensors,
                "precision": precision,
            },
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
        with np.load(scratch / "outputs.npz") as data:
            outputs = {name: np.array(data[name]) for name in result["output_names"]}
    return ArmRun(
        cpu_class=cpu_class,
        qemu_cpu=cpu,
        features=parse_features(output) or (),
        outputs=outputs,
        mnn_version=str(result.get("mnn_version", "")),
        seconds=run.seconds,
    )
