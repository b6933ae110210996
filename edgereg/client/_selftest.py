"""On-device self-test: run the golden probe on each hinted backend before a model is installed.

A GPU driver that miscomputes (MNN OpenCL on some Mali GPUs, NNAPI on some
phones) is caught on the device it landed on. For each backend of the
entry's ``runtime.backends`` in order, the model is loaded and every probe
case is run (state fed back, zeros first); :func:`check_probe` judges the
outputs. The first backend that passes is chosen. A backend that misses the
tolerance is skipped and remembered for that model version on this device
(``selftest.json`` in the cache directory), so it is not tried again. A
backend MNN cannot create here (no GPU) is unavailable: skipped, not
remembered. When ``cpu`` (always last) fails too, the model is rejected with
:class:`~edgereg.protocol.reasons.ProbeFailed` and that version is marked
bad on this device.

The backend runner is injectable (:class:`BackendRunner`): the default runs
real MNN in this process; a fleet simulation passes a runner that perturbs a
backend's outputs to play a faulty GPU. The probe check is always the real one.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

from edgereg.client._cache import CacheError, read_state_file, write_state_file
from edgereg.protocol.contract import BlobRef, IOContract
from edgereg.protocol.fields import Backend, RuntimeHints
from edgereg.protocol.probe import (
    GoldenProbe,
    ProbeOutput,
    ProbeResult,
    ProbeTensor,
    check_probe,
)
from edgereg.protocol.reasons import BadBlob, Malformed, ProbeFailed, ProbeNotRun
from edgereg.protocol.wire import ManifestEntry, WireError, from_bytes

if TYPE_CHECKING:
    # Imported where used: an app's client that runs no self-test never loads numpy.
    import numpy as np

__all__ = [
    "MNN_BACKEND_NAMES",
    "BackendRunner",
    "BackendTrial",
    "BackendUnavailableError",
    "MemberFilesLike",
    "MnnRunner",
    "ModelSession",
    "SelfTest",
    "SelfTestResult",
    "Verdict",
    "judge_trials",
    "parse_probe",
    "run_probe_cases",
    "try_backend",
    "zero_state",
]

_log = logging.getLogger(__name__)

MNN_BACKEND_NAMES: Mapping[Backend, str] = {
    "cpu": "CPU",
    "opencl": "OPENCL",
    "vulkan": "VULKAN",
    "metal": "METAL",
    "opengl": "OPENGL",
    # Core ML and NNAPI are both MNN's MNN_FORWARD_NN ("NN"): the platform decides.
    "coreml": "NN",
    "nnapi": "NN",
}
"""Manifest backend hints -> pymnn runtime manager names (upper case; "cpu" raises there)."""

_NUMPY_DTYPES: Mapping[str, str] = {
    "float32": "<f4",
    "float16": "<f2",
    "int8": "i1",
    "uint8": "u1",
    "int32": "<i4",
    "int64": "<i8",
    "bool": "?",
}

_MEMORY_FILE = "selftest.json"
_MEMORY_VERSIONS_KEPT = 16
"""Per model, how many versions' verdicts are kept (older ones cannot come back as new)."""


class MemberFilesLike(Protocol):
    """One member of a release about to be installed (the client's ``MemberFiles``)."""

    @property
    def entry(self) -> ManifestEntry: ...

    @property
    def artifact(self) -> Path: ...

    @property
    def probe(self) -> Path | None: ...


# --- the runner: what is device-specific ------------------------------------------


class BackendUnavailableError(Exception):
    """The runtime cannot create this backend on this device (no such GPU or driver)."""


class ModelSession(Protocol):
    """One model loaded on one backend."""

    def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
        """Input name -> the shape the model declares (state inputs are fed zeros of it)."""
        ...

    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        """One forward pass: input name -> array in, output name -> array out."""
        ...


class BackendRunner(Protocol):
    """Loads a model on a backend; the default is real MNN (:class:`MnnRunner`).

    A separate load (rather than one ``run(artifact, backend, feeds)``) so the
    load time is measured on its own and a stateful probe feeds each step's
    state output to the next step without loading the model again.
    """

    def load(
        self,
        artifact: Path,
        backend: Backend,
        runtime: RuntimeHints,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> ModelSession:
        """Load ``artifact`` on ``backend`` with the entry's runtime hints.

        Raises:
            BackendUnavailableError: the backend does not exist on this device.
            Exception: any other failure to load (counted as the backend failing).
        """
        ...


_STDOUT_LOCK = threading.Lock()


@contextlib.contextmanager
def _stdout_captured() -> Iterator[list[str]]:
    """Send file descriptor 1 to a temporary file; the list gets what was written.

    MNN prints from C++ straight to fd 1 (``import MNN`` announces the CPU's
    features; a backend it lacks is reported only by a printed line): keep
    that out of the app's and the CLI's stdout, and read it.
    """
    captured: list[str] = []
    with _STDOUT_LOCK, tempfile.TemporaryFile() as sink:
        sys.stdout.flush()  # what Python printed before belongs on the real stdout
        saved = os.dup(1)
        try:
            os.dup2(sink.fileno(), 1)
            yield captured
        finally:
            os.dup2(saved, 1)
            os.close(saved)
            sink.seek(0)
            captured.append(sink.read().decode("utf-8", "replace"))


def _mnn() -> Any:
    with _stdout_captured():
        import MNN

    return MNN


class MnnRunner:
    """Real MNN in this process (``MNN.nn`` module API; never ``MNN.tools``)."""

    def load(
        self,
        artifact: Path,
        backend: Backend,
        runtime: RuntimeHints,
        inputs: Sequence[str],
        outputs: Sequence[str],
    ) -> ModelSession:
        """Create the backend's runtime and load the model on it.

        Raises:
            BackendUnavailableError: MNN has no such backend here (it says so
                on stdout and silently uses the CPU instead: refused here, so
                a CPU run is never mistaken for a GPU pass).
            RuntimeError: MNN could not load the model.
        """
        try:
            mnn = _mnn()
        except ImportError as exc:
            # No MNN in this process: no backend exists here. Never a verdict on the model.
            raise BackendUnavailableError(f"MNN cannot be imported here: {exc}") from exc
        config = {
            "backend": MNN_BACKEND_NAMES[backend],
            "numThread": runtime.threads,
            "precision": runtime.precision,
        }
        with _stdout_captured() as said:
            manager = mnn.nn.create_runtime_manager((config,))
        if "Can't Find type=" in said[0]:
            raise BackendUnavailableError(f"MNN has no {MNN_BACKEND_NAMES[backend]} backend here")
        cause: Exception | None = None
        with _stdout_captured() as said:
            try:
                module = mnn.nn.load_module_from_file(
                    str(artifact), list(inputs), list(outputs), runtime_manager=manager
                )
            except Exception as exc:  # pymnn raises SystemError for unreadable models
                module, cause = None, exc
        if module is None:
            printed = said[0].strip().splitlines()[-1:] or ["no message"]
            raise RuntimeError(f"MNN could not load the model ({printed[0]})") from cause
        return _MnnSession(mnn, module)


class _MnnSession:
    def __init__(self, mnn: Any, module: Any) -> None:
        self._expr = mnn.expr
        self._module = module
        info = module.get_info()
        self._names = [str(n) for n in info["inputNames"]]
        self._outputs = [str(n) for n in info["outputNames"]]
        self._specs = list(info["inputs"])

    def input_shapes(self) -> Mapping[str, tuple[int, ...]]:
        return {
            name: tuple(int(d) for d in spec.shape)
            for name, spec in zip(self._names, self._specs, strict=False)
        }

    def run(self, feeds: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        import numpy as np

        expr = self._expr
        variables = []
        for index, name in enumerate(self._names):
            if name not in feeds:
                raise KeyError(f"no value for input {name!r}")
            array = feeds[name]
            spec = self._specs[index] if index < len(self._specs) else None
            # MNN takes int64 graph inputs (token ids, a sample rate) as int32.
            if array.dtype.kind in "iub" and array.dtype != np.uint8:
                value = np.ascontiguousarray(array, dtype=np.int32)
                var = expr.const(value, list(value.shape), expr.NCHW, expr.int)
            elif array.dtype == np.uint8:
                value = np.ascontiguousarray(array)
                var = expr.const(value, list(value.shape), expr.NCHW, expr.uint8)
            else:
                value = np.ascontiguousarray(array, dtype=np.float32)
                var = expr.const(value, list(value.shape), expr.NCHW)
            if spec is not None and spec.data_format != expr.NCHW:
                var = expr.convert(var, spec.data_format)
            variables.append(var)
        results: dict[str, np.ndarray] = {}
        for name, out in zip(self._outputs, self._module.forward(variables), strict=True):
            if out.data_format == expr.NC4HW4:
                out = expr.convert(out, expr.NCHW)
            # Copy: the module may reuse the buffer on the next forward.
            results[name] = np.array(out.read(), copy=True)
        return results


# --- the probe ---------------------------------------------------------------------


def parse_probe(data: bytes, ref: BlobRef, entry: ManifestEntry) -> GoldenProbe:
    """Check a downloaded probe blob against its signed reference and parse it.

    Raises:
        BadBlob: size or sha256 differs from ``ref`` (the manifest's ``probe``).
        Malformed: not a valid probe, or a probe of another artifact.
    """
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != ref.size or digest != ref.sha256:
        raise BadBlob(
            f"probe blob is {len(data)} bytes with sha256 {digest}, the manifest says "
            f"{ref.size} bytes with sha256 {ref.sha256}"
        )
    try:
        probe = from_bytes(GoldenProbe, data)
    except WireError as exc:
        raise Malformed(f"probe {ref.sha256[:12]}: {exc.message}") from exc
    if probe.artifact_sha256 != entry.sha256:
        raise Malformed(
            f"probe {ref.sha256[:12]} is for artifact {probe.artifact_sha256[:12]}, "
            f"the entry's artifact is {entry.sha256[:12]}"
        )
    return probe


def _array(tensor: ProbeTensor) -> np.ndarray:
    import numpy as np

    raw = base64.b64decode(tensor.data)
    return np.frombuffer(raw, dtype=np.dtype(_NUMPY_DTYPES[tensor.dtype])).reshape(tensor.shape)


# --- results -------------------------------------------------------------------------

Outcome = Literal["passed", "failed", "unavailable", "remembered", "loaded"]


@dataclass(frozen=True)
class BackendTrial:
    """What happened on one backend.

    Attributes:
        backend: The manifest's name for it.
        outcome: ``passed`` the probe; ``failed`` it (or failed to load or
            run); ``unavailable`` here; ``remembered`` as failed by an earlier
            self-test of this version, not tried again; ``loaded`` without a
            probe to check.
        detail: Why it failed or was unavailable.
        load_ms: Milliseconds to create the runtime and load the model.
        probe_ms: Milliseconds to run and check every probe case.
        verdict: The probe check, when the probe ran to the end.
    """

    backend: Backend
    outcome: Outcome
    detail: str | None = None
    load_ms: float | None = None
    probe_ms: float | None = None
    verdict: ProbeResult | None = None


@dataclass(frozen=True)
class SelfTestResult:
    """The backend a model will run on, and what was learned on the way.

    Attributes:
        backend: The chosen backend (the first that passed).
        skipped: Backends whose outputs missed the probe (now, or remembered).
        unavailable: Backends this device does not have.
        load_ms: Load time on the chosen backend.
        probe_ms: Probe time on the chosen backend (0 without a probe).
        probe: ``passed``, or ``none`` when the entry has no probe.
        trials: Every backend in the entry's order, with its outcome.
    """

    backend: Backend
    skipped: tuple[Backend, ...]
    unavailable: tuple[Backend, ...]
    load_ms: float
    probe_ms: float
    probe: Literal["passed", "none"]
    trials: tuple[BackendTrial, ...] = field(default=())


TrialKind = Literal["passed", "loaded", "failed", "load-failed", "unavailable", "remembered"]


@dataclass(frozen=True)
class Verdict:
    """What a self-test's trials decide (docs/protocol.md §11, rules 15 to 19).

    Attributes:
        verdict: ``install`` (a backend passed), ``reject`` (CPU failed too:
            ``probe-failed``, the version marked bad) or ``not-run`` (the
            runner could not create the CPU backend: no verdict on the model,
            nothing marked bad, nothing reported).
        backend: The backend chosen, or None.
        mark_bad: The version is marked bad on this device.
        report: The self-test's part of the report (``probe``, ``backend``,
            ``backends_skipped``, ``load_failed``), or None when none is sent.
    """

    verdict: Literal["install", "reject", "not-run"]
    backend: str | None
    mark_bad: bool
    report: dict[str, Any] | None


def judge_trials(trials: Sequence[tuple[str, TrialKind]], *, probe: bool) -> Verdict:
    """The verdict of a self-test's trials, in the entry's backend order.

    ``trials`` runs up to the first backend that passed (``passed``, or
    ``loaded`` without a probe). ``remembered`` is a backend that failed this
    artifact before and was not tried again; ``load-failed`` one whose load
    failed. A probe that did not run is never a probe failure: when the CPU
    (always the last resort) was unavailable, nothing is decided about the
    model.
    """
    skipped = [
        backend for backend, kind in trials if kind in ("failed", "load-failed", "remembered")
    ]
    report: dict[str, Any]
    for backend, kind in trials:
        if kind in ("passed", "loaded"):
            report = {
                "probe": "passed" if probe else "none",
                "backend": backend,
                "backends_skipped": skipped,
                "load_failed": False,
            }
            return Verdict("install", backend, False, report)
    cpu = [kind for backend, kind in trials if backend == "cpu"]
    if not cpu or cpu[-1] == "unavailable":
        return Verdict("not-run", None, False, None)
    tried = [kind for _, kind in trials if kind in ("failed", "load-failed")]
    report = {
        "probe": "failed",
        "backend": None,
        "backends_skipped": skipped,
        "load_failed": bool(tried) and all(kind == "load-failed" for kind in tried),
    }
    return Verdict("reject", None, True, report)


def trial_kind(trial: BackendTrial) -> TrialKind:
    """A trial's outcome as :func:`judge_trials` reads it."""
    if trial.outcome == "failed" and (trial.detail or "").startswith("does not load"):
        return "load-failed"
    return trial.outcome


# --- memory: per model version, the backends that failed and whether it was rejected --


class _Memory:
    """``selftest.json``: {model: {version: {"sha256", "failed": {backend: why}, "rejected"}}}."""

    def __init__(self, cache_dir: Path) -> None:
        self.path = cache_dir / _MEMORY_FILE

    def read(self) -> dict[str, dict[str, dict[str, Any]]]:
        try:
            data = read_state_file(self.path, "selftest")
        except CacheError as exc:
            _log.warning("self-test memory %s unreadable (%s): starting afresh", self.path, exc)
            return {}
        if data is None:
            return {}
        models = data.get("models")
        if not isinstance(models, dict):
            _log.warning("self-test memory %s has no models table: starting afresh", self.path)
            return {}
        return models

    def version(self, model: str, version: str, sha256: str) -> dict[str, Any]:
        record = self.read().get(model, {}).get(version)
        # Same version, other bytes (a republished test registry): nothing learned applies.
        if not isinstance(record, dict) or record.get("sha256") != sha256:
            return {"sha256": sha256, "failed": {}, "rejected": None}
        return record

    def write(self, model: str, version: str, record: Mapping[str, Any]) -> None:
        models = self.read()
        versions = models.setdefault(model, {})
        versions.pop(version, None)
        versions[version] = dict(record)
        for old in list(versions)[:-_MEMORY_VERSIONS_KEPT]:
            del versions[old]
        try:
            write_state_file(self.path, {"schema_version": 1, "models": models})
        except CacheError as exc:
            # The verdict of this run still holds; only the next run repeats the work.
            _log.warning(
                "cannot record the self-test of %s %s in %s: %s", model, version, self.path, exc
            )


# --- the self-test --------------------------------------------------------------------


class SelfTest:
    """Runs a model's golden probe on each hinted backend and picks the first that passes.

    Args:
        cache_dir: The client's cache directory (``selftest.json`` goes there).
        runner: Loads models on backends; real MNN when None.
        clock: Seconds, monotonic (for load and probe times).
    """

    def __init__(
        self,
        cache_dir: Path | str,
        *,
        runner: BackendRunner | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if runner is None and importlib.util.find_spec("MNN") is None:
            # A client that cannot run the probe must not start: every probe would
            # "fail", marking good releases bad on this device (docs/protocol.md §11).
            raise ValueError(
                "the self-test needs a model runner: MNN is not installed in this Python "
                "(pip install MNN), and no runner= was given; or turn the self-test off"
            )
        self.runner: BackendRunner = runner if runner is not None else MnnRunner()
        self.clock = clock
        self._memory = _Memory(Path(cache_dir))
        # What the last install check found, per member: for the reports.
        self.results: dict[str, SelfTestResult] = {}
        self.failed: dict[str, tuple[BackendTrial, ...]] = {}
        self.last_trials: tuple[BackendTrial, ...] = ()

    def __call__(
        self, unit: str, version: str, files: Mapping[str, MemberFilesLike]
    ) -> dict[str, str]:
        """The client's install check: self-test every member; the backend chosen for each.

        ``files`` maps each member (the model itself, for a model) to its
        verified entry, artifact and probe blob. The results stay in
        :attr:`results` for the reports.

        Raises:
            ProbeFailed: a member failed on every backend (the whole release
                is refused: a device never holds a mix).
            BadBlob, Malformed: a probe blob that does not match its entry.
        """
        self.results.clear()
        self.failed.clear()
        chosen: dict[str, str] = {}
        for name in sorted(files):
            member = files[name]
            ref = member.entry.probe
            probe = None
            if ref is not None and member.probe is not None:
                try:
                    data = Path(member.probe).read_bytes()
                except OSError as exc:
                    raise BadBlob(
                        f"probe of {name} {member.entry.version} unreadable: {exc}"
                    ) from exc
                probe = parse_probe(data, ref, member.entry)
            try:
                result = self.run(name, member.artifact, member.entry, probe)
            except ProbeFailed:
                self.failed[name] = self.last_trials
                raise
            self.results[name] = result
            chosen[name] = result.backend
        return chosen

    def rejected(self, model: str, version: str, sha256: str) -> str | None:
        """Why this version was rejected on this device earlier, or None."""
        reason = self._memory.version(model, version, sha256).get("rejected")
        return str(reason) if reason else None

    def run(
        self, model: str, artifact: Path | str, entry: ManifestEntry, probe: GoldenProbe | None
    ) -> SelfTestResult:
        """Choose the backend for ``artifact`` (the verified blob of ``entry``).

        Args:
            model: The model's name (the memory is per model version).
            artifact: The downloaded, digest-checked ``.mnn`` file.
            entry: Its manifest entry: the version and the runtime hints.
            probe: The verified probe (:func:`parse_probe`); None when the
                entry has none: the first backend that loads is chosen.

        Raises:
            ProbeFailed: every backend failed, CPU included, or this version
                was rejected on this device before; the version is marked bad.
        """
        path = Path(artifact)
        self.last_trials = ()
        record = self._memory.version(model, entry.version, entry.sha256)
        if record.get("rejected"):
            raise self._failure(
                model, entry, f"rejected before on this device: {record['rejected']}"
            )
        failed: dict[str, str] = dict(record.get("failed") or {})
        trials: list[BackendTrial] = []
        chosen: BackendTrial | None = None
        for backend in entry.runtime.backends:
            if backend in failed:
                trials.append(BackendTrial(backend, "remembered", failed[backend]))
                continue
            trial = self._try(path, backend, entry.runtime, probe, entry.contract)
            trials.append(trial)
            if trial.outcome == "failed":
                failed[backend] = trial.detail or "failed"
                _log.warning(
                    "%s %s: backend %s skipped: %s", model, entry.version, backend, trial.detail
                )
            if trial.outcome in ("passed", "loaded"):
                chosen = trial
                break
        self.last_trials = tuple(trials)
        verdict = judge_trials(
            [(t.backend, trial_kind(t)) for t in trials], probe=probe is not None
        )
        if verdict.verdict == "not-run":
            # The runner cannot create the CPU here (no MNN library, a broken runner): no
            # verdict on the model. Nothing is marked bad or reported; the next fetch retries.
            if failed != (record.get("failed") or {}):
                self._memory.write(model, entry.version, {**record, "failed": failed})
            why = "; ".join(f"{t.backend}: {t.detail}" for t in trials)
            raise ProbeNotRun(
                f"{model} {entry.version}: the self-test could not run the probe on this "
                f"device ({why})",
                hint="The app's model runner cannot create its CPU backend (is the MNN "
                "library there?); nothing was marked bad, the next fetch tries again.",
            )
        if chosen is None:
            why = "; ".join(f"{t.backend}: {t.detail}" for t in trials)
            self._memory.write(model, entry.version, {**record, "failed": failed, "rejected": why})
            raise self._failure(model, entry, why)
        if failed != (record.get("failed") or {}):
            self._memory.write(model, entry.version, {**record, "failed": failed})
        return SelfTestResult(
            backend=chosen.backend,
            skipped=tuple(t.backend for t in trials if t.outcome in ("failed", "remembered")),
            unavailable=tuple(t.backend for t in trials if t.outcome == "unavailable"),
            load_ms=chosen.load_ms or 0.0,
            probe_ms=chosen.probe_ms or 0.0,
            probe="passed" if probe is not None else "none",
            trials=tuple(trials),
        )

    def _failure(self, model: str, entry: ManifestEntry, why: str) -> ProbeFailed:
        return ProbeFailed(
            f"{model} {entry.version} (variant {entry.variant}) failed its self-test on every "
            f"backend: {why}",
            hint="The last good model stays; this version is marked bad on this device and "
            "not tried again. A release manager should check it (edgereg analyze) and roll "
            "it back if other devices see the same.",
        )

    def _try(
        self,
        artifact: Path,
        backend: Backend,
        runtime: RuntimeHints,
        probe: GoldenProbe | None,
        contract: IOContract | None = None,
    ) -> BackendTrial:
        return try_backend(
            self.runner, artifact, backend, runtime, probe, contract, clock=self.clock
        )


def try_backend(
    runner: BackendRunner,
    artifact: Path,
    backend: Backend,
    runtime: RuntimeHints,
    probe: GoldenProbe | None,
    contract: IOContract | None = None,
    *,
    clock: Callable[[], float] = time.perf_counter,
) -> BackendTrial:
    """Load ``artifact`` on one backend and run the probe on it: one trial.

    The one implementation of a probe run: the reference client's self-test
    and the build's probe stage (:func:`edgereg.build.probe.check_on_host`)
    both call it, so the build cannot pass a probe a device then refuses.

    Args:
        runner: Loads the model (:class:`MnnRunner` for real MNN).
        artifact: The ``.mnn`` file.
        backend: The backend to try.
        runtime: The entry's runtime hints.
        probe: The golden probe, or None (a trial that only loads).
        contract: The entry's contract: state inputs start as zeros of its
            dtype and shape (docs/protocol.md section 11); None falls back to
            the model's declared shape.
        clock: Seconds, monotonic.
    """
    inputs: list[str] = []
    outputs: list[str] = []
    if probe is not None:
        first = probe.cases[0].steps[0]
        inputs = [t.name for t in first.inputs] + [pair[0] for pair in probe.state]
        outputs = [t.name for t in first.expected] + [
            pair[1] for pair in probe.state if pair[1] not in {t.name for t in first.expected}
        ]
    started = clock()
    try:
        session = runner.load(artifact, backend, runtime, inputs, outputs)
    except BackendUnavailableError as exc:
        return BackendTrial(backend, "unavailable", str(exc))
    except Exception as exc:  # a driver that cannot load the model is a failing backend
        return BackendTrial(backend, "failed", f"does not load: {exc}")
    load_ms = (clock() - started) * 1000.0
    if probe is None:
        return BackendTrial(backend, "loaded", None, load_ms, 0.0)
    started = clock()
    try:
        computed = run_probe_cases(session, probe, contract)
    except Exception as exc:  # a forward that raises is a miscomputing backend too
        return BackendTrial(backend, "failed", f"does not run: {exc}", load_ms)
    verdict = check_probe(probe, computed)
    probe_ms = (clock() - started) * 1000.0
    if not verdict.passed:
        return BackendTrial(backend, "failed", verdict.failure, load_ms, probe_ms, verdict)
    return BackendTrial(backend, "passed", None, load_ms, probe_ms, verdict)


def zero_state(
    name: str, contract: IOContract | None, declared: Mapping[str, tuple[int, ...]]
) -> np.ndarray:
    """A state input at a case's first step (docs/protocol.md section 11).

    Zeros of the contract input's dtype and shape, each named (dynamic) axis
    1; without a contract input of that name, the model's declared shape with
    each dynamic axis (declared as -1 or 0) 1, as float32.

    Raises:
        KeyError: neither the contract nor the model has that input.
    """
    import numpy as np

    if contract is not None:
        for spec in contract.inputs:
            if spec.name == name:
                shape = tuple(d if isinstance(d, int) else 1 for d in spec.shape)
                return np.zeros(shape, dtype=np.dtype(_NUMPY_DTYPES[spec.dtype]))
    if name not in declared:
        raise KeyError(f"the model has no state input {name!r}")
    return np.zeros(tuple(d if d > 0 else 1 for d in declared[name]), dtype=np.float32)


def run_probe_cases(
    session: ModelSession, probe: GoldenProbe, contract: IOContract | None = None
) -> list[list[dict[str, ProbeOutput]]]:
    """Every case's steps through the session, state fed back from zeros (:func:`zero_state`)."""
    import numpy as np

    shapes = session.input_shapes()
    computed: list[list[dict[str, ProbeOutput]]] = []
    for case in probe.cases:
        state = {name: zero_state(name, contract, shapes) for name, _ in probe.state}
        steps: list[dict[str, ProbeOutput]] = []
        for step in case.steps:
            feeds = {tensor.name: _array(tensor) for tensor in step.inputs}
            feeds.update(state)
            outputs = session.run(feeds)
            for state_input, state_output in probe.state:
                if state_output not in outputs:
                    raise KeyError(f"the model returned no state output {state_output!r}")
                state[state_input] = outputs[state_output]
            steps.append(
                {
                    tensor.name: ProbeOutput(
                        tuple(np.shape(outputs[tensor.name])),
                        np.asarray(outputs[tensor.name], dtype=np.float64).ravel().tolist(),
                    )
                    for tensor in step.expected
                    if tensor.name in outputs
                }
            )
        computed.append(steps)
    return computed
