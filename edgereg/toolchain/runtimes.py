"""Proving that an artifact runs on an older MNN runtime than the one that built it.

A release promises apps a minimum MNN runtime (``[toolchain] min_mnn_runtime``).
The converter's own version is always true but needlessly strict: an app on MNN
3.0 would refuse a model it runs perfectly well. Any lower minimum is proven,
not assumed: the artifact is loaded and run under exactly that MNN version, on
the same samples as the build's runtime, and the outputs must match.

Each old runtime is an isolated virtual environment holding only ``mnn==X``
and numpy, cached per version in the per-user cache shared by every repository
(``~/.cache/edgereg/runtimes/mnn-X/``, :mod:`edgereg.toolchain.usercache`; or
``$EDGEREG_RUNTIMES_DIR``). It is installed only by an explicit command
(``edgereg toolchain runtimes install``, run by ``make venv``), never during a
build or a test: a proof that needs a missing runtime fails with a
:class:`RuntimeProofError` naming that command.

The artifact runs in a child process started with the runtime's own python
in isolated mode (``-I``: no ``PYTHONPATH``, no user site, no script
directory), running :mod:`edgereg.toolchain._runtime_probe`, a standalone
script that imports only MNN and numpy, so nothing of the build's MNN can leak
in. Integration in a build::

    expected = toolchain.run_inference(artifact, inputs, batch_size=1, ...)
    proof = prove_min_runtime(
        artifact, config.toolchain.minimum_runtime, inputs, expected,
        input_names=names, output_names=outputs,
        tolerance=default_tolerance(variant.quantization.mode),
    )
    provenance["min_mnn_runtime"] = proof.version
    provenance["runtime_proof"] = proof.as_dict()
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgereg._files import atomic_write, sha256_file
from edgereg.errors import BuildError
from edgereg.toolchain._process import (
    ProbeFailure,
    ProbeRun,
    describe_status,
    run_probe,
    scratch_dir,
    tail,
)
from edgereg.toolchain.usercache import user_cache_dir
from edgereg.toolchain.versions import installed_version

#: Environment variable that moves the runtime cache (CI caches, shared machines).
RUNTIMES_DIR_ENV = "EDGEREG_RUNTIMES_DIR"
#: Where runtimes live by default, inside the per-user cache.
DEFAULT_RUNTIMES_DIR = "runtimes"
#: Written last into a runtime directory: a directory without it is not installed.
MARKER = "edgereg-runtime.json"
#: The command that installs missing runtimes, named in errors.
INSTALL_COMMAND = "edgereg toolchain runtimes install"
#: Build stage named in errors raised here.
STAGE = "runtime proof"
#: Stage named in errors of :func:`install_runtime`.
INSTALL_STAGE = "runtime install"

_VERSION_CHARS = frozenset("0123456789.")
# mnnconvert 3.6.1 gates graph fusions on --targetVersion at 1.1, 1.2, 1.3,
# 2.0 and 2.8 (tools/converter/source/optimizer/merge/*.cpp): for a newer
# runtime the flag changes nothing.
_LAST_GATED_TARGET = (2, 8)

ProofFailure = Literal["missing", "broken", "load", "crash", "timeout", "failed", "mismatch"]


class RuntimeProofError(BuildError):
    """The artifact could not be proven to run on the minimum MNN runtime.

    Attributes:
        reason: What went wrong: ``missing`` (runtime not installed), ``broken``
            (it does not import or reports another version), ``load`` (it
            refuses the model), ``crash``, ``timeout``, ``failed`` (an error
            while running), ``mismatch`` (outputs differ beyond the tolerance).
        version: The MNN runtime version that was to prove it.
        comparison: The output comparison, for ``mismatch``.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: ProofFailure,
        version: str,
        hint: str | None = None,
        exit_status: int | None = None,
        output_tail: str | None = None,
        comparison: Comparison | None = None,
        stage: str = STAGE,
    ) -> None:
        super().__init__(
            message,
            stage=stage,
            tool=f"MNN {version}",
            hint=hint,
            exit_status=exit_status,
            output_tail=output_tail,
        )
        self.reason = reason
        self.version = version
        self.comparison = comparison


@dataclass(frozen=True)
class Runtime:
    """An installed, isolated MNN runtime.

    Attributes:
        version: The ``mnn`` version it holds.
        path: Its directory (a virtual environment).
        python: Its interpreter.
        numpy_version: The numpy version installed beside MNN.
    """

    version: str
    path: Path
    python: Path
    numpy_version: str


@dataclass(frozen=True)
class InstallResult:
    """What :func:`install_runtime` did.

    Attributes:
        runtime: The installed runtime.
        installed: False when it was already there (nothing was downloaded).
        seconds: Wall-clock time of the call.
    """

    runtime: Runtime
    installed: bool
    seconds: float


@dataclass(frozen=True)
class Tolerance:
    """How far an old runtime's outputs may be from the build runtime's.

    An element passes when ``|actual - expected| <= atol + rtol * |expected|
    + range_fraction * max|expected|`` (the maximum over the whole output);
    NaN must meet NaN and shapes must be equal. ``Tolerance(0.0, 0.0, 0.0)``
    demands identical values.

    MNN versions order their kernels' arithmetic differently, so outputs are
    close, not bit-identical. Measured between 3.0.0 and 3.6.1 on the example
    models' whole evaluation sets (logits of magnitude 8 to 14):

    - float kernels (fp32, fp16 and weight-only variants): at most 5e-6
      (digits) and 2.2e-3 (sensor, a transformer: 1.8e-4 of the output's
      largest magnitude, many elements near zero). :data:`FLOAT_TOLERANCE`
      allows 1e-3 of each value plus 1e-3 of the output's range (the sensor's
      worst element uses a fifth of that), while an operator computed
      differently is off by a sizeable part of the range;
    - int8 kernels: whole steps of the output's quantization scale, up to 2
      steps (0.22, 1.6% of the range, digits) and 5 steps (0.23, 2.8%,
      sensor), with the top-1 label differing on 1 of 360 and 1 of 600
      samples. :data:`INT8_TOLERANCE` allows 5% of the range.

    Attributes:
        atol: Absolute tolerance.
        rtol: Tolerance relative to each expected element.
        range_fraction: Tolerance relative to the largest expected magnitude
            of the output (for int8, whose error is a step of the output scale).
    """

    atol: float = 1e-5
    rtol: float = 1e-3
    range_fraction: float = 1e-3

    def as_dict(self) -> dict[str, float]:
        """The tolerance as a JSON-ready record."""
        return {"atol": self.atol, "rtol": self.rtol, "range_fraction": self.range_fraction}


#: For artifacts that compute in float (fp32, fp16, weight-only quantization).
FLOAT_TOLERANCE = Tolerance()
#: For fully quantized (int8) artifacts.
INT8_TOLERANCE = Tolerance(atol=1e-5, rtol=1e-3, range_fraction=0.05)


def default_tolerance(quantization_mode: str) -> Tolerance:
    """The tolerance for a variant: :data:`INT8_TOLERANCE` for ``"int8"``, else float's.

    Args:
        quantization_mode: The variant's ``quantization.mode`` (``none``,
            ``weight`` or ``int8``).
    """
    return INT8_TOLERANCE if quantization_mode == "int8" else FLOAT_TOLERANCE


@dataclass(frozen=True)
class OutputComparison:
    """One output of the old runtime against the build runtime's.

    Attributes:
        name: Output name.
        expected_shape: Shape from the build runtime.
        actual_shape: Shape from the old runtime (None when it gave no such output).
        max_abs_diff: Largest absolute difference (inf when shapes differ or
            NaN appears on one side only; 0.0 when identical).
        identical: Same shape and bit-for-bit the same values.
        within: Same shape and every element within the tolerance.
        argmax_agreement: Share of samples whose argmax over the last axis is
            the same (for a classifier, the same label); None for outputs with
            fewer than two values per sample. Recorded, not gated.
    """

    name: str
    expected_shape: tuple[int, ...]
    actual_shape: tuple[int, ...] | None
    max_abs_diff: float
    identical: bool
    within: bool
    argmax_agreement: float | None = None


@dataclass(frozen=True)
class Comparison:
    """Every output of one proof run, compared (see :func:`compare_outputs`).

    Attributes:
        outputs: One entry per expected output, in the expected order.
        tolerance: The tolerance applied.
    """

    outputs: tuple[OutputComparison, ...]
    tolerance: Tolerance

    @property
    def identical(self) -> bool:
        """True when every output is bit-for-bit the build runtime's."""
        return all(o.identical for o in self.outputs)

    @property
    def within(self) -> bool:
        """True when every output is within the tolerance."""
        return all(o.within for o in self.outputs)

    @property
    def max_abs_diff(self) -> float:
        """The largest absolute difference over all outputs."""
        return max((o.max_abs_diff for o in self.outputs), default=0.0)

    def describe(self) -> str:
        """One line per output that is not within the tolerance."""
        lines = []
        for o in self.outputs:
            if o.within:
                continue
            if o.actual_shape is None:
                lines.append(f"output {o.name!r}: missing")
            elif o.actual_shape != o.expected_shape:
                lines.append(
                    f"output {o.name!r}: shape {list(o.actual_shape)}, "
                    f"expected {list(o.expected_shape)}"
                )
            else:
                lines.append(f"output {o.name!r}: max abs difference {o.max_abs_diff:.3g}")
        return "; ".join(lines)


@dataclass(frozen=True)
class RuntimeRun:
    """Outputs of one artifact under an old runtime.

    Attributes:
        outputs: Output name to ``(N, ...)`` array, one row per sample.
        mnn_version: The MNN version the runtime reported.
        seconds: Wall-clock time of the child process, start to exit.
    """

    outputs: dict[str, np.ndarray]
    mnn_version: str
    seconds: float


@dataclass(frozen=True)
class RuntimeProof:
    """Evidence that an artifact runs on an MNN runtime, for provenance.

    Attributes:
        version: The proven minimum MNN runtime.
        proven_by: ``"runtime"`` (run under that version in its own
            environment) or ``"build"`` (the version is the build's own MNN,
            whose verify stage is the proof).
        artifact_sha256: Digest of the artifact that was run.
        samples: Samples run, one forward pass each.
        identical: Every output was bit-for-bit the build runtime's.
        max_abs_diff: Largest absolute difference over every output.
        tolerance: The tolerance the outputs were held to.
        outputs: Per-output comparison (empty for ``proven_by="build"``).
        seconds: Wall-clock time of the old runtime's child process.
    """

    version: str
    proven_by: Literal["runtime", "build"]
    artifact_sha256: str
    samples: int
    identical: bool
    max_abs_diff: float
    tolerance: Tolerance
    outputs: tuple[OutputComparison, ...] = field(default=())
    seconds: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record for provenance.json (no timings: builds stay reproducible)."""
        return {
            "version": self.version,
            "proven_by": self.proven_by,
            "artifact_sha256": self.artifact_sha256,
            "samples": self.samples,
            "identical": self.identical,
            "max_abs_diff": self.max_abs_diff,
            "tolerance": self.tolerance.as_dict(),
            "outputs": {
                o.name: {"max_abs_diff": o.max_abs_diff, "argmax_agreement": o.argmax_agreement}
                for o in self.outputs
            },
        }


def runtimes_dir() -> Path:
    """Return the directory that holds the cached runtimes, shared by every repository.

    Returns:
        ``$EDGEREG_RUNTIMES_DIR`` when set, else ``runtimes/`` in the per-user
        cache (:func:`edgereg.toolchain.usercache.user_cache_dir`).
    """
    override = os.environ.get(RUNTIMES_DIR_ENV)
    if override:
        return Path(override)
    return user_cache_dir() / DEFAULT_RUNTIMES_DIR


def _check_version(version: str) -> None:
    if not version or not set(version) <= _VERSION_CHARS or ".." in version:
        raise ValueError(f"{version!r} is not an MNN version like 3.0.0")


def runtime_dir(version: str, root: Path | str | None = None) -> Path:
    """Return where the runtime of ``version`` lives (installed or not)."""
    _check_version(version)
    # Absolute: the runtime's python is started with a scratch directory as cwd.
    return ((Path(root) if root is not None else runtimes_dir()) / f"mnn-{version}").absolute()


def _python_of(venv: Path) -> Path:
    return venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def _missing(version: str, where: Path, why: str) -> RuntimeProofError:
    return RuntimeProofError(
        f"the MNN {version} runtime is not installed ({where}: {why})",
        reason="missing",
        version=version,
        hint=f"install it once with `{INSTALL_COMMAND}` (it installs every min_mnn_runtime "
        f"models.toml declares; add --version {version} for another one); builds and tests "
        "never download it themselves",
    )


def find_runtime(version: str, *, root: Path | str | None = None) -> Runtime:
    """Return the installed runtime of ``version``, without starting it.

    Args:
        version: MNN version, such as ``"3.0.0"``.
        root: The runtime cache (default: :func:`runtimes_dir`).

    Raises:
        RuntimeProofError: (reason ``missing``) It is not installed, or its
            installation never finished.
        ValueError: ``version`` is not a version.
    """
    path = runtime_dir(version, root)
    marker = path / MARKER
    try:
        record = json.loads(marker.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        why = "no such directory" if not path.exists() else f"no {MARKER}: never finished"
        raise _missing(version, path, why) from exc
    except (OSError, ValueError) as exc:
        raise _missing(version, path, f"unreadable {MARKER}: {exc}") from exc
    python = _python_of(path)
    if not isinstance(record, dict) or record.get("mnn") != version:
        raise _missing(version, path, f"{MARKER} describes another runtime: {record!r}")
    if not os.access(python, os.X_OK):
        raise _missing(version, path, f"{python} is missing")
    return Runtime(
        version=version, path=path, python=python, numpy_version=str(record.get("numpy", ""))
    )


def _run_tool(argv: Sequence[str], *, what: str, version: str, timeout: float) -> str:
    try:
        proc = subprocess.run(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=timeout,
            check=False,
        )
    except OSError as exc:
        raise RuntimeProofError(
            f"{what} could not start: {exc}", reason="failed", version=version, stage=INSTALL_STAGE
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeProofError(
            f"{what} did not finish within {timeout:g} s",
            reason="timeout",
            version=version,
            stage=INSTALL_STAGE,
            hint="check the connection to the package index, then run the command again",
        ) from exc
    output = proc.stdout.decode("utf-8", "replace")
    if proc.returncode != 0:
        raise RuntimeProofError(
            f"{what} failed ({describe_status(proc.returncode)})",
            reason="failed",
            version=version,
            stage=INSTALL_STAGE,
            exit_status=proc.returncode,
            output_tail=tail(output),
            hint=f"is mnn=={version} published for this Python and platform? A pip "
            "constraint (PIP_CONSTRAINT, pip.conf) that pins mnn also blocks it",
        )
    return output


def install_runtime(
    version: str,
    *,
    root: Path | str | None = None,
    numpy_version: str | None = None,
    timeout: float = 900.0,
) -> InstallResult:
    """Install the isolated runtime of ``version`` unless it is already there.

    The environment is built in a temporary directory beside its destination
    (a fresh ``venv`` with this interpreter, then ``pip install mnn==X
    numpy==Y``), started once to check it imports that MNN, and only then
    moved into place, so an interrupted install leaves nothing that looks
    installed. pip uses its ordinary configuration (index, constraints).

    Args:
        version: MNN version, such as ``"3.0.0"``.
        root: The runtime cache (default: :func:`runtimes_dir`).
        numpy_version: numpy to install beside it; default: the build's own.
        timeout: Seconds allowed for each of venv, pip and the check.

    Returns:
        The runtime, and whether anything was installed.

    Raises:
        RuntimeProofError: venv or pip failed or timed out, or the new
            environment does not import MNN ``version``.
    """
    started = time.perf_counter()
    dest = runtime_dir(version, root)
    try:
        return InstallResult(find_runtime(version, root=root), False, time.perf_counter() - started)
    except RuntimeProofError:
        pass
    numpy_pin = numpy_version or installed_version("numpy")
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".mnn-{version}.", dir=dest.parent))
    staging.chmod(0o755)  # mkdtemp makes it private; the runtime is shared like .venv
    try:
        _run_tool(
            [sys.executable, "-m", "venv", str(staging)],
            what=f"creating the MNN {version} environment",
            version=version,
            timeout=timeout,
        )
        python = _python_of(staging)
        packages = [f"mnn=={version}", f"numpy=={numpy_pin}" if numpy_pin else "numpy"]
        _run_tool(
            [
                str(python),
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-input",
                "--disable-pip-version-check",
                *packages,
            ],
            what=f"pip install {' '.join(packages)}",
            version=version,
            timeout=timeout,
        )
        staged = Runtime(version, staging, python, numpy_pin or "")
        with scratch_dir() as scratch:
            reported = _probe(
                staged, {"op": "version"}, timeout=timeout, what="check", scratch=scratch
            ).result
        if reported.get("mnn_version") != version:
            raise RuntimeProofError(
                f"the new environment imports MNN {reported.get('mnn_version')}, not {version}",
                reason="broken",
                version=version,
                stage=INSTALL_STAGE,
            )
        record = {
            "mnn": version,
            "numpy": str(reported.get("numpy_version", "")),
            "python": ".".join(map(str, sys.version_info[:3])),
        }
        atomic_write(staging / MARKER, (json.dumps(record, indent=1) + "\n").encode())
        if dest.exists():
            try:
                runtime = find_runtime(version, root=root)
            except RuntimeProofError:
                shutil.rmtree(dest)  # an install that never finished
            else:  # another install finished first
                return InstallResult(runtime, False, time.perf_counter() - started)
        os.replace(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return InstallResult(find_runtime(version, root=root), True, time.perf_counter() - started)


def _probe(
    runtime: Runtime,
    request: dict[str, Any],
    *,
    timeout: float,
    what: str,
    scratch: Path,
) -> ProbeRun:
    """Run the probe script under ``runtime`` in ``scratch``; raise unless it reported.

    A result the probe wrote comes back even when it says the model failed;
    no result, a crash, a timeout or a runtime that does not start raise.
    """
    reinstall = f"reinstall it: delete {runtime.path} and run `{INSTALL_COMMAND}`"

    def error(failure: ProbeFailure) -> RuntimeProofError:
        version = runtime.version
        if failure.kind == "start":
            return RuntimeProofError(
                f"cannot start the MNN {version} runtime ({runtime.python}): {failure.error}",
                reason="broken",
                version=version,
                hint=reinstall,
            )
        if failure.kind == "timeout":
            return RuntimeProofError(
                f"MNN {version} did not finish the {what} within {timeout:g} s and was killed",
                reason="timeout",
                version=version,
                output_tail=failure.output_tail,
                hint="raise the timeout, or prove on fewer samples",
            )
        if failure.kind == "import":
            return RuntimeProofError(
                f"the MNN {version} runtime does not start: {failure.error}",
                reason="broken",
                version=version,
                exit_status=failure.exit_status,
                output_tail=failure.output_tail,
                hint=reinstall,
            )
        status = describe_status(failure.exit_status if failure.exit_status is not None else 0)
        if failure.kind == "crash":
            return RuntimeProofError(
                f"MNN {version} crashed ({status}) during the {what}",
                reason="crash",
                version=version,
                exit_status=failure.exit_status,
                output_tail=failure.output_tail,
                hint="the artifact may use what this runtime lacks: raise [toolchain] "
                "min_mnn_runtime, or set mnn_target_version to its MAJOR.MINOR",
            )
        return RuntimeProofError(
            f"MNN {version} stopped ({status}) during the {what} without a result",
            reason="broken",
            version=version,
            exit_status=failure.exit_status,
            output_tail=failure.output_tail,
            hint=reinstall,
        )

    return run_probe([str(runtime.python)], request, scratch=scratch, timeout=timeout, error=error)


def _feedable(inputs: Mapping[str, np.ndarray], names: Sequence[str]) -> dict[str, np.ndarray]:
    """Check and cast inputs to what MNN takes: float32, or int32 for integer inputs."""
    if not names:
        raise ValueError("the model's input names are needed to feed it")
    arrays: dict[str, np.ndarray] = {}
    for name in names:
        if name not in inputs:
            raise ValueError(f"no data for input {name!r}; got {', '.join(inputs) or 'none'}")
        array = np.asarray(inputs[name])
        if array.ndim == 0 or array.shape[0] == 0:
            raise ValueError(f"input {name!r} needs samples on axis 0; got shape {array.shape}")
        if array.dtype.kind in "iub":
            info = np.iinfo(np.int32)
            if array.size and (array.min() < info.min or array.max() > info.max):
                raise ValueError(
                    f"input {name!r} holds integers outside int32, which MNN cannot take "
                    "(it feeds int64 model inputs as int32)"
                )
            arrays[name] = np.ascontiguousarray(array, dtype=np.int32)
        elif array.dtype.kind == "f":
            arrays[name] = np.ascontiguousarray(array, dtype=np.float32)
        else:
            raise ValueError(
                f"input {name!r} has dtype {array.dtype}; MNN takes float32 or int32 inputs"
            )
    counts = {a.shape[0] for a in arrays.values()}
    if len(counts) != 1:
        raise ValueError(f"inputs must hold the same number of samples; got {sorted(counts)}")
    return arrays


def run_under_runtime(
    artifact: Path | str,
    version: str,
    inputs: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str] = (),
    root: Path | str | None = None,
    timeout: float = 300.0,
    whole_tensors: bool = False,
) -> RuntimeRun:
    """Run an artifact under the isolated MNN ``version``, one forward pass per sample.

    Sample ``i`` is fed as ``inputs[name][i:i+1]`` (a batch of one), or with
    ``whole_tensors`` as ``inputs[name][i]``, the whole tensor of one forward
    (a scalar, a recurrent state). Each output is stacked as returned,
    ``(N, *tensor shape)``, as :func:`edgereg.toolchain.run_inference` does.

    Args:
        artifact: The ``.mnn`` file.
        version: MNN runtime version, such as ``"3.0.0"``; must be installed.
        inputs: Input name to ``(N, ...)`` array; floats are fed as float32,
            integers as int32 (MNN takes int64 model inputs as int32).
        input_names: The model's inputs, in its order.
        output_names: Outputs to return; default: every model output.
        root: The runtime cache (default: :func:`runtimes_dir`).
        timeout: Seconds before the child is killed.

    Returns:
        The outputs, with the MNN version the runtime reported.

    Raises:
        ValueError: Inputs missing, of different lengths or of another dtype.
        RuntimeProofError: The runtime is missing or broken (``missing``,
            ``broken``), refuses the model (``load``), crashes, times out or
            fails while running it.
    """
    path = Path(artifact).resolve()
    runtime = find_runtime(version, root=root)
    arrays = _feedable(inputs, list(input_names))
    if not path.is_file():
        raise RuntimeProofError(f"{path} does not exist", reason="failed", version=version)
    with scratch_dir() as scratch:
        np.savez(scratch / "inputs.npz", **arrays)  # type: ignore[arg-type]
        run = _probe(
            runtime,
            {
                "op": "run",
                "model": str(path),
                "inputs": str(scratch / "inputs.npz"),
                "output": str(scratch / "outputs.npz"),
                "input_names": list(input_names),
                "output_names": list(output_names),
                "whole": whole_tensors,
            },
            timeout=timeout,
            what=f"run of {path.name}",
            scratch=scratch,
        )
        result = run.result
        reported = str(result.get("mnn_version", ""))
        if reported != version:
            raise RuntimeProofError(
                f"the runtime in {runtime.path} imports MNN {reported}, not {version}",
                reason="broken",
                version=version,
                hint=f"reinstall it: delete {runtime.path} and run `{INSTALL_COMMAND}`",
            )
        if not result.get("ok"):
            error = str(result.get("error", "unknown error"))
            output = tail(run.output + "\n" + str(result.get("traceback", "")))
            if result.get("phase") == "load":
                raise RuntimeProofError(
                    f"MNN {version} cannot load {path.name}: {error}",
                    reason="load",
                    version=version,
                    exit_status=run.exit_status,
                    # MNN's own words say why; the probe's stack says nothing more.
                    output_tail=tail(run.output),
                    hint=_too_new_hint(version),
                )
            sample = result.get("sample")
            where = f" on sample {sample}" if sample is not None else ""
            raise RuntimeProofError(
                f"MNN {version} loads {path.name} but fails to run it{where}: {error}",
                reason="failed",
                version=version,
                exit_status=run.exit_status,
                output_tail=output,
                hint=_too_new_hint(version),
            )
        with np.load(scratch / "outputs.npz") as data:
            outputs = {name: np.array(data[name]) for name in result["output_names"]}
    return RuntimeRun(outputs=outputs, mnn_version=reported, seconds=run.seconds)


def _too_new_hint(version: str) -> str:
    fix = (
        f"the artifact needs a newer MNN runtime than {version}: raise [toolchain] "
        "min_mnn_runtime in models.toml (the converter's own version always works)"
    )
    parts = [int(p) for p in version.split(".") if p.isdigit()][:2]
    if tuple(parts) >= _LAST_GATED_TARGET:
        return (
            fix + "; mnn_target_version cannot help here: mnnconvert 3.6.1 leaves out "
            "version-gated fusions only for runtimes before 2.8"
        )
    major_minor = ".".join(str(p) for p in parts)
    return (
        f'set [toolchain] mnn_target_version = "{major_minor}" so the converter leaves out '
        f"the fusions MNN {major_minor} lacks, or {fix}"
    )


def compare_outputs(
    expected: Mapping[str, np.ndarray],
    actual: Mapping[str, np.ndarray],
    *,
    tolerance: Tolerance = FLOAT_TOLERANCE,
) -> Comparison:
    """Compare an old runtime's outputs with the build runtime's. Pure.

    Args:
        expected: Output name to ``(N, ...)`` array from the build's runtime.
        actual: The same from the old runtime; extra outputs are ignored.
        tolerance: How far values may differ.

    Returns:
        One :class:`OutputComparison` per expected output.
    """
    return Comparison(
        outputs=tuple(
            _compare_one(name, np.asarray(want), actual.get(name), tolerance)
            for name, want in expected.items()
        ),
        tolerance=tolerance,
    )


def _compare_one(
    name: str, want: np.ndarray, got_raw: np.ndarray | None, tolerance: Tolerance
) -> OutputComparison:
    inf = float("inf")
    if got_raw is None:
        return OutputComparison(name, tuple(want.shape), None, inf, False, False)
    got = np.asarray(got_raw)
    if got.shape != want.shape:
        return OutputComparison(name, tuple(want.shape), tuple(got.shape), inf, False, False)
    identical = got.dtype == want.dtype and bool(np.array_equal(got, want, equal_nan=True))
    g, w = got.astype(np.float64), want.astype(np.float64)
    agreement = None
    if w.ndim >= 2 and w.shape[-1] > 1 and w.size:
        agreement = float(np.mean(np.argmax(g, axis=-1) == np.argmax(w, axis=-1)))
    if (np.isnan(g) != np.isnan(w)).any():
        return OutputComparison(
            name, tuple(want.shape), tuple(got.shape), inf, False, False, agreement
        )
    both = ~np.isnan(w)
    g, w = g[both], w[both]
    with np.errstate(invalid="ignore"):
        # Equal infinities differ by nothing (inf - inf would be NaN).
        deltas = np.where(g == w, 0.0, np.abs(g - w))
    diff = float(deltas.max()) if deltas.size else 0.0
    finite = w[np.isfinite(w)]
    scale = float(np.abs(finite).max()) if finite.size else 0.0
    allowed = tolerance.atol + tolerance.rtol * np.abs(w) + tolerance.range_fraction * scale
    within = identical or bool((deltas <= allowed).all())
    return OutputComparison(
        name, tuple(want.shape), tuple(got.shape), diff, identical, within, agreement
    )


def prove_min_runtime(
    artifact: Path | str,
    version: str,
    inputs: Mapping[str, np.ndarray],
    expected: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str],
    output_names: Sequence[str],
    tolerance: Tolerance = FLOAT_TOLERANCE,
    root: Path | str | None = None,
    timeout: float = 300.0,
    whole_tensors: bool = False,
) -> RuntimeProof:
    """Prove that ``artifact`` loads and computes the same outputs under MNN ``version``.

    When ``version`` is the build's own MNN, nothing runs: the build's verify
    stage, which produced ``expected``, is the proof (``proven_by="build"``).
    Otherwise the artifact runs under the isolated runtime of ``version``
    (:func:`run_under_runtime`) on ``inputs`` and its outputs are compared
    with ``expected`` (:func:`compare_outputs`).

    Args:
        artifact: The built ``.mnn`` file.
        version: The minimum runtime to prove (``Toolchain.minimum_runtime``).
        inputs: Input name to ``(N, ...)`` array, one forward pass per sample.
        expected: Output name to ``(N, ...)`` array from the build's runtime
            on the same samples (``run_inference(..., batch_size=1)``).
        input_names: The model's inputs, in its order.
        output_names: The outputs to compare (each must be in ``expected``).
        tolerance: How far the old runtime's values may be from ``expected``.
        root: The runtime cache (default: :func:`runtimes_dir`).
        timeout: Seconds before the old runtime's child is killed.
        whole_tensors: Each row of ``inputs`` is one forward's whole tensor
            (see :func:`run_under_runtime`).

    Returns:
        The proof, for provenance (:meth:`RuntimeProof.as_dict`).

    Raises:
        ValueError: Inputs or expected outputs that do not fit each other.
        RuntimeProofError: The runtime is missing or broken, refuses the
            model, crashes, times out, fails, or computes outputs beyond the
            tolerance (``reason`` says which); the message names the version
            and the hint what to change.
    """
    path = Path(artifact)
    names = list(output_names)
    missing = [name for name in names if name not in expected]
    if not names or missing:
        raise ValueError(
            f"expected outputs must cover every output to prove; missing {missing or 'all'}"
        )
    wanted = {name: np.asarray(expected[name]) for name in names}
    samples = _feedable(inputs, list(input_names))[input_names[0]].shape[0]
    for name, array in wanted.items():
        if array.ndim == 0 or array.shape[0] != samples:
            raise ValueError(
                f"expected output {name!r} has shape {array.shape}; it needs one row per "
                f"sample ({samples})"
            )
    if version == installed_version("mnn"):
        if not path.is_file():
            raise RuntimeProofError(f"{path} does not exist", reason="failed", version=version)
        return RuntimeProof(
            version=version,
            proven_by="build",
            artifact_sha256=sha256_file(path),
            samples=samples,
            identical=True,
            max_abs_diff=0.0,
            tolerance=tolerance,
        )
    run = run_under_runtime(
        path,
        version,
        inputs,
        input_names=input_names,
        output_names=names,
        root=root,
        timeout=timeout,
        whole_tensors=whole_tensors,
    )
    comparison = compare_outputs(wanted, run.outputs, tolerance=tolerance)
    if not comparison.within:
        raise RuntimeProofError(
            f"MNN {version} runs {path.name} but computes different outputs than the build's "
            f"runtime on {samples} samples: {comparison.describe()} (tolerance atol "
            f"{tolerance.atol:g}, rtol {tolerance.rtol:g}, range_fraction "
            f"{tolerance.range_fraction:g})",
            reason="mismatch",
            version=version,
            comparison=comparison,
            hint=_too_new_hint(version),
        )
    return RuntimeProof(
        version=version,
        proven_by="runtime",
        artifact_sha256=sha256_file(path),
        samples=samples,
        identical=comparison.identical,
        max_abs_diff=comparison.max_abs_diff,
        tolerance=tolerance,
        outputs=comparison.outputs,
        seconds=run.seconds,
    )
