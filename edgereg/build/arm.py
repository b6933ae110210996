"""ARM verification: a variant's artifact on MNN's ARM kernels, per CPU class, gated like x86.

The build verifies each variant on the host's x86 kernels; phones run MNN's
ARM kernels, which are other code (see :mod:`edgereg.toolchain.arm`). This
stage runs the finished artifact under emulation for each declared CPU class
on the golden probe's rows and a spread of ``[toolchain] arm_samples``
evaluation rows, and scores it against the fp32 ONNX Runtime reference with
the host's own functions (:func:`edgereg.build.quality.agreement`, the task's
evaluator and :func:`edgereg.build.quality.check_gates`).

What a subset can and cannot say: output agreement and the task's agreement
with the reference are gated; label metrics (accuracy, per-class recall) need
the whole evaluation set and stay host-only. Latency is never measured here:
an emulator's timing says nothing about a phone.

One artifact, one behaviour (:mod:`edgereg.build.arm_compare`): each class's
outputs are also held to the host's run of the same artifact on the same
rows, per output channel, within the tolerance of float re-association. A
class that differs (a kernel wrong on a few channels, within the precision's
loose budgets) is named with its channels; it is shipped around with
``avoid_cpu`` when the variant declares an ``instead`` and a CPU feature
tells the differing classes from the agreeing ones, and fails otherwise.

Runs are cached by artifact digest, class, the ``-cpu`` model the installed
emulator stands in with (another QEMU may pick another one: cortex-a710 or
``max`` for armv9), MNN version, precision and input digest under
``<out>/.cache/arm/``, so an unchanged variant is not run again.

A class whose emulated run crashes (the probe or the emulator killed by a
signal) or on which MNN refuses or fails the model is that class failing:
recorded in metrics.json with the reason, like a class whose numbers fail a
gate, and shipped around the same way. A missing or broken sysroot or
emulator, or a run that times out, says nothing about the class and stops the
build instead.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import toolchain
from edgereg._files import atomic_write
from edgereg.build.arm_compare import HOST, Comparison, OutputDiff, compare, run_on_host
from edgereg.build.datasets import Dataset
from edgereg.build.quality import (
    GateReport,
    OutputAgreement,
    agreement,
    check_gates,
)
from edgereg.config import Budgets, Config, arm_classes
from edgereg.errors import BuildError, GateError
from edgereg.protocol._json import canonical_json
from edgereg.tasks.scoring import TaskScores
from edgereg.toolchain.arm import (
    CPU_CLASSES,
    ArmError,
    ArmRun,
    ClassWorker,
    Sysroot,
    arm_dir,
    emulated_cpu,
    find_sysroot,
    qemu_cpus,
    qemu_path,
    run_on_class,
)

logger = logging.getLogger(__name__)

ARM_CACHE = Path(".cache") / "arm"
#: What a perfect match (infinite SNR) is written as in metrics.json.
SNR_CAP_DB = 999.0
#: Why an emulated run can fail that says the class fails (see the module docstring).
CLASS_FAILURES = frozenset({"crash", "load", "failed"})


class ArmRunner:
    """Runs an artifact on one class: the real emulator, or a test's wrapper around it.

    The ARM stage calls :meth:`start` with the classes it will run before its
    other work, and :meth:`close` when it ends, however it ends: a runner
    that keeps processes (:class:`EmulatedRunner`) starts them there and
    stops them there, so none outlives the stage. A wrapper around another
    runner passes both on.
    """

    _cpus: tuple[str, ...] | None = None

    def start(self, classes: Sequence[str]) -> None:
        """Get ready to run ``classes`` without waiting (the base runner has nothing to start)."""

    def close(self) -> None:
        """Stop whatever :meth:`start` or a run left running (nothing here)."""

    def available_cpus(self) -> tuple[str, ...]:
        """The emulator's ``-cpu`` models (the installed QEMU's, asked once)."""
        if self._cpus is None:
            self._cpus = qemu_cpus()
        return self._cpus

    def qemu_cpu(self, cpu_class: str) -> str:
        """The ``-cpu`` model that stands for ``cpu_class`` (part of the cache key)."""
        return emulated_cpu(CPU_CLASSES[cpu_class], self.available_cpus())

    def __call__(
        self,
        artifact: Path,
        cpu_class: str,
        inputs: Mapping[str, np.ndarray],
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        precision: str,
    ) -> ArmRun:
        """Run ``artifact`` on ``cpu_class`` (see :func:`edgereg.toolchain.arm.run_on_class`)."""
        raise NotImplementedError


class EmulatedRunner(ArmRunner):
    """QEMU user mode with the project's aarch64 sysroot.

    Starting an emulator (QEMU, Python, numpy and MNN under emulation) costs
    more than a small model's rows, so by default each class has one
    :class:`edgereg.toolchain.arm.ClassWorker`, started by :meth:`start` and
    sent every run of that class until :meth:`close`. Its outputs and errors
    are a one-shot run's.

    Args:
        sysroot: The installed sysroot.
        cpus: The emulator's ``-cpu`` models; default: asked of the installed QEMU.
        persistent: Keep one emulator per class (default); False starts a
            process for every run (what the build did before, for comparison).
    """

    def __init__(
        self, sysroot: Sysroot, cpus: Sequence[str] | None = None, *, persistent: bool = True
    ) -> None:
        self.sysroot = sysroot
        self._cpus = tuple(cpus) if cpus is not None else None
        self.persistent = persistent
        self._workers: dict[str, ClassWorker] = {}
        self._guard = threading.Lock()

    def start(self, classes: Sequence[str]) -> None:
        """Start each class's emulator, so MNN imports under it while the caller works on.

        Only a started class has a worker: a run of another class, or a run
        through a wrapper that does not pass :meth:`start` on, is a one-shot
        process, so nothing is left running that :meth:`close` would not stop.
        """
        if not self.persistent:
            return
        for cpu_class in classes:
            with self._guard:
                worker = self._workers.get(cpu_class)
                if worker is None:
                    worker = ClassWorker(
                        qemu_path(), self.sysroot.path, cpu_class, self.qemu_cpu(cpu_class)
                    )
                    self._workers[cpu_class] = worker
            worker.start()

    def close(self) -> None:
        """Kill every class's emulator and remove its files."""
        with self._guard:
            workers = list(self._workers.values())
            self._workers.clear()
        for worker in workers:
            worker.close()

    def __call__(
        self,
        artifact: Path,
        cpu_class: str,
        inputs: Mapping[str, np.ndarray],
        *,
        input_names: Sequence[str],
        output_names: Sequence[str],
        precision: str,
    ) -> ArmRun:
        """Run ``artifact`` on ``cpu_class`` under QEMU."""
        return run_on_class(
            artifact,
            cpu_class,
            inputs,
            input_names=input_names,
            output_names=output_names,
            sysroot=self.sysroot,
            precision=precision,
            available_cpus=self.available_cpus(),
            worker=self._workers.get(cpu_class),
        )


@dataclass(frozen=True)
class ClassResult:
    """One CPU class's verdict on a variant.

    Attributes:
        cpu_class: The class.
        qemu_cpu: The emulated CPU that stood for it.
        features: CPU features MNN reported there.
        agreement: Output agreement with the fp32 reference on the rows run.
        scores: The task's agreement metrics on those rows (None when the
            task cannot be scored on a subset).
        gates: The gates checked.
        avoided: The variant declares ``avoid_cpu`` with one of the class's
            features: devices of this class install its ``instead``, so its
            result is reported, never failed.
        seconds: Wall-clock time of the emulator (0 when cached).
        cached: Taken from the cache.
        error: Why the run gave no outputs (it crashed, or MNN refused or
            failed the model there); the class fails. None when it ran.
        differs: Where its outputs differ from the reference run of the same
            artifact (:mod:`edgereg.build.arm_compare`): output -> channels.
        reference: The run it was held to (``host``, or the classes' consensus).
    """

    cpu_class: str
    qemu_cpu: str
    features: tuple[str, ...]
    agreement: dict[str, OutputAgreement]
    scores: TaskScores | None
    gates: GateReport
    avoided: bool
    seconds: float = 0.0
    cached: bool = False
    error: str | None = None
    differs: dict[str, OutputDiff] = field(default_factory=dict)
    reference: str = HOST
    rest_from: str | None = None

    @property
    def passed(self) -> bool:
        """True when the run gave outputs, every gate passed and it computes as the reference."""
        return self.error is None and self.gates.passed and not self.differs

    def failure_reasons(self) -> list[str]:
        """The run's error, or each failed gate and each output that differs."""
        if self.error is not None:
            return [self.error]
        reasons = [result.describe() for result in self.gates.failures]
        witness = (
            "the host's run of the same artifact"
            if self.reference == HOST
            else f"{self.reference}'s run of the same artifact (the classes' consensus)"
        )
        reasons += [
            f"differs from {witness}: {diff.describe(name)}" for name, diff in self.differs.items()
        ]
        return reasons

    @property
    def status(self) -> str:
        """``passed``, ``failed`` or ``avoided`` (failed or not, devices never run it)."""
        if self.avoided:
            return "avoided"
        return "passed" if self.passed else "failed"

    def to_json(self) -> dict[str, Any]:
        """The class's record in metrics.json (no timings: the file must not vary)."""
        record = {
            "status": self.status,
            "gates_passed": self.passed,
            "cpu": self.qemu_cpu,
            "features": list(self.features),
            "agreement": {
                name: {
                    "cosine": a.cosine,
                    "snr_db": min(a.snr_db, SNR_CAP_DB),
                    "max_abs_error": a.max_abs_error,
                    "min_sample_cosine": a.min_sample_cosine,
                }
                for name, a in self.agreement.items()
            },
            "metrics": dict(self.scores.metrics) if self.scores else {},
            "differs": {name: diff.to_json() for name, diff in self.differs.items()},
            "failed": self.failure_reasons(),
        }
        if self.rest_from is not None:
            # Its first rows came out bit for bit as this run's, which stands for the rest.
            record["rows_emulated"] = CHECK_ROWS
            record["rest_from"] = self.rest_from
        if self.error is not None:
            record["error"] = self.error
        return record


@dataclass(frozen=True)
class ArmReport:
    """Every class's verdict on one variant.

    Attributes:
        results: One per class run, oldest class first.
        samples: Rows run per class (probe rows and evaluation rows).
        mnn_version: The MNN version of the aarch64 wheel.
        precision: The MNN precision mode run (the variant's runtime hint).
        avoid_cpu: The variant's avoided features.
    """

    results: tuple[ClassResult, ...]
    samples: int
    mnn_version: str
    precision: str
    avoid_cpu: tuple[str, ...] = field(default=())
    comparison: Comparison | None = None

    @property
    def passed(self) -> bool:
        """True when every class that is not avoided passed its gates."""
        return all(r.passed or r.avoided for r in self.results)

    @property
    def failures(self) -> list[ClassResult]:
        """Classes that failed and are not avoided."""
        return [r for r in self.results if not r.passed and not r.avoided]

    def describe_failures(self) -> list[str]:
        """One line per failed gate, naming the class, its CPU and features."""
        lines = []
        for r in self.failures:
            features = ", ".join(r.features) or "no dotprod/fp16/i8mm"
            for reason in r.failure_reasons():
                lines.append(f"arm {r.cpu_class} (-cpu {r.qemu_cpu}: {features}): {reason}")
        return lines

    def to_json(self) -> dict[str, Any]:
        """The ``arm`` record of metrics.json."""
        record = {
            "mnn": self.mnn_version,
            "samples": self.samples,
            "precision": self.precision,
            "avoid_cpu": list(self.avoid_cpu),
            "classes": {r.cpu_class: r.to_json() for r in self.results},
        }
        if self.comparison is not None:
            record["same_artifact"] = self.comparison.to_json()
        return record

    def seconds(self) -> dict[str, float]:
        """Emulator wall time per class (0 for a cached result)."""
        return {r.cpu_class: r.seconds for r in self.results}


def arm_rows(evaluation_size: int, probe_rows: np.ndarray, samples: int) -> np.ndarray:
    """The evaluation rows each class runs: the probe's, plus ``samples`` spread over the set.

    A stateful model's rows take the states the reference carried, so any row
    can run on its own.
    """
    count = min(samples, evaluation_size)
    spread = (
        np.unique(np.linspace(0, evaluation_size - 1, count).round().astype(np.int64))
        if count
        else np.zeros(0, dtype=np.int64)
    )
    return np.unique(np.concatenate([np.asarray(probe_rows, dtype=np.int64), spread]))


def _inputs_at(
    feeds: Sequence[toolchain.InputFeed],
    evaluation: Dataset,
    reference: toolchain.StreamResult,
    rows: np.ndarray,
) -> dict[str, np.ndarray]:
    """Each row's whole input tensors; a state input takes the reference's state there."""
    arrays: dict[str, np.ndarray] = {}
    for feed in feeds:
        if feed.name in reference.states:
            arrays[feed.name] = np.asarray(reference.states[feed.name])[rows]
        else:
            data = evaluation.inputs[feed.name]
            arrays[feed.name] = np.stack([feed.sample(data, int(i)) for i in rows])
    return arrays


def _inputs_digest(inputs: Mapping[str, Any]) -> str:
    hasher = hashlib.sha256()
    for name in sorted(inputs):
        array = np.ascontiguousarray(inputs[name])
        hasher.update(f"{name}:{array.dtype}:{array.shape}\n".encode())
        hasher.update(array.tobytes())
    return hasher.hexdigest()


def _cache_key(
    artifact_sha: str,
    cpu_class: str,
    qemu_cpu: str,
    mnn_version: str,
    precision: str,
    inputs: Mapping[str, Any],
) -> str:
    return hashlib.sha256(
        canonical_json(
            {
                "artifact": artifact_sha,
                "class": cpu_class,
                # The model that ran, not the class's candidates: a QEMU that
                # gains or drops one runs other kernels, so it runs again.
                "cpu": qemu_cpu,
                "mnn": mnn_version,
                "precision": precision,
                "inputs": _inputs_digest(inputs),
            }
        )
    ).hexdigest()


def _cached(path: Path, output_names: Sequence[str]) -> ArmRun | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            meta = json.loads(bytes(data["meta"]).decode("utf-8"))
            outputs = {n: np.array(data[f"out:{n}"]) for n in output_names}
    except (OSError, KeyError, ValueError) as exc:
        logger.info("ARM cache %s unreadable (%s); running it again", path, exc)
        return None
    return ArmRun(
        cpu_class=meta["class"],
        qemu_cpu=meta["cpu"],
        features=tuple(meta["features"]),
        outputs=outputs,
        mnn_version=meta["mnn"],
        seconds=0.0,
        rest_from=meta.get("rest_from"),
    )


def _store(path: Path, run: ArmRun) -> None:
    meta = {
        "class": run.cpu_class,
        "cpu": run.qemu_cpu,
        "features": list(run.features),
        "mnn": run.mnn_version,
        "rest_from": run.rest_from,
    }
    arrays = {f"out:{n}": a for n, a in run.outputs.items()}
    arrays["meta"] = np.frombuffer(json.dumps(meta).encode("utf-8"), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buffer.getvalue())


#: Rows every class emulates first when a class is checked against a full run.
CHECK_ROWS = 2
#: The class that emulates every row when it is verified (see :func:`_emulate`).
LEAD_CLASS = "armv8.2"


@contextlib.contextmanager
def _closed_on_error(runner: ArmRunner) -> Iterator[None]:
    """Close the runner when the block fails, before its thread pool waits for its threads.

    A run blocked on an emulator returns once the emulator is killed: on Ctrl-C
    the pool's shutdown would otherwise wait for every emulated row.
    """
    try:
        yield
    except BaseException:
        runner.close()
        raise


def _emulate(
    active: ArmRunner,
    missing: Sequence[tuple[str, Path]],
    *,
    artifact: Path,
    inputs: Mapping[str, np.ndarray],
    input_names: Sequence[str],
    output_names: Sequence[str],
    precision: str,
    mnn_version: str,
) -> dict[str, ArmRun | ArmError]:
    """Run the classes not cached, emulating only the rows that can tell them apart.

    One class runs every row: armv8.2 when it is among them (the class most
    phones have; it shares int8 kernels with armv8 and fp16 arithmetic with
    armv9), else the newest. Each other class first runs
    :data:`CHECK_ROWS` rows, side by side with it: when those come out bit for
    bit as that full run's, the class runs the same kernels there, and the
    full run's other rows stand for its own (``rest_from``); otherwise it runs
    the other rows too. On the examples every ARM class computes the same bits (int8;
    weight-only at normal precision), so one class emulates every row instead
    of three (benchmarks/arm_cost.py). The host is no witness: x86's int8
    kernels can match on a few rows and round otherwise on others, and the
    same-artifact rule needs each class's own bits. A runner with
    ``reuse_rows = False`` emulates every row of every class.
    """

    def emulate(cpu_class: str, arrays: Mapping[str, np.ndarray]) -> ArmRun | ArmError:
        try:
            run = active(
                artifact,
                cpu_class,
                arrays,
                input_names=input_names,
                output_names=output_names,
                precision=precision,
            )
        except ArmError as exc:
            if exc.reason not in CLASS_FAILURES:
                raise
            # Not cached: a crash may be the machine's, so it runs again next time.
            logger.info("arm %s: %s", cpu_class, exc.message)
            return exc
        if run.mnn_version != mnn_version:
            raise BuildError(
                f"the aarch64 sysroot runs MNN {run.mnn_version}, not the pinned {mnn_version}",
                stage="arm verify",
                hint="reinstall it: `edgereg toolchain arm install`",
            )
        return run

    paths = dict(missing)
    order = [cpu_class for cpu_class, _ in missing]
    total = len(next(iter(inputs.values()))) if inputs else 0
    reuse = getattr(active, "reuse_rows", True) and len(order) > 1 and total > CHECK_ROWS
    check = {name: np.asarray(array)[:CHECK_ROWS] for name, array in inputs.items()}
    lead_class = LEAD_CLASS if LEAD_CLASS in order else order[-1]
    others = [c for c in order if c != lead_class]
    jobs = [(lead_class, inputs), *((c, check if reuse else inputs) for c in others)]
    # Each emulator is one single-threaded process: the classes run side by side.
    workers = max(1, min(len(order), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool, _closed_on_error(active):
        results = list(pool.map(lambda job: emulate(*job), jobs))
        done = {cpu_class: run for (cpu_class, _), run in zip(jobs, results, strict=True)}
        lead = done[lead_class]
        witnesses: list[tuple[str, Mapping[str, np.ndarray]]] = []
        if isinstance(lead, ArmRun):
            witnesses.append((lead_class, lead.outputs))
        again = []
        for cpu_class in others if reuse else ():
            short = done[cpu_class]
            if isinstance(short, ArmError):
                continue
            for name, outputs in witnesses:
                head = {n: np.asarray(outputs[n]) for n in output_names}
                if all(
                    np.array_equal(short.outputs[n], head[n][:CHECK_ROWS]) for n in output_names
                ):
                    rest = {
                        n: np.concatenate([short.outputs[n], head[n][CHECK_ROWS:]])
                        for n in output_names
                    }
                    done[cpu_class] = dataclasses.replace(short, outputs=rest, rest_from=name)
                    break
            else:
                again.append(cpu_class)
        # The rows not emulated yet, appended to the ones that were.
        tail_rows = {name: np.asarray(array)[CHECK_ROWS:] for name, array in inputs.items()}
        for cpu_class, tail_run in zip(
            again, pool.map(lambda c: emulate(c, tail_rows), again), strict=True
        ):
            head_run = done[cpu_class]
            if isinstance(tail_run, ArmError) or isinstance(head_run, ArmError):
                done[cpu_class] = tail_run
                continue
            joined = {
                n: np.concatenate([head_run.outputs[n], tail_run.outputs[n]]) for n in output_names
            }
            done[cpu_class] = dataclasses.replace(
                tail_run, outputs=joined, seconds=head_run.seconds + tail_run.seconds
            )
    for cpu_class, run in done.items():
        if isinstance(run, ArmRun):
            _store(paths[cpu_class], run)
    return done


def arm_budgets(budgets: Budgets) -> Budgets:
    """The host's budgets without what emulation cannot measure (size is the host's; latency)."""
    return budgets.model_copy(update={"max_size_mb": None, "max_latency_p50_ms": None})


def verify_on_arm(
    *,
    artifact: Path,
    artifact_sha: str,
    classes: Sequence[str],
    avoid_cpu: Sequence[str],
    feeds: Sequence[toolchain.InputFeed],
    output_names: Sequence[str],
    gated_outputs: Sequence[str],
    evaluation: Dataset,
    reference: toolchain.StreamResult,
    rows: np.ndarray,
    precision: str,
    budgets: Budgets,
    score_task: Callable[[dict[str, np.ndarray], dict[str, np.ndarray]], TaskScores | None],
    cache_dir: Path,
    mnn_version: str,
    runner: ArmRunner | None = None,
    sysroot_root: Path | None = None,
) -> ArmReport:
    """Run and gate ``artifact`` on each CPU class (one emulator process per class).

    The runner is started for the classes not cached before the host's run
    and closed when this returns or raises: its emulators live for this
    stage only (``dvc repro`` runs each variant's build as its own process).

    Args:
        artifact: The finished ``.mnn``.
        artifact_sha: Its digest (the cache key's first part).
        classes: CPU classes to run, keys of :data:`edgereg.toolchain.arm.CPU_CLASSES`.
        avoid_cpu: The variant's avoided CPU features.
        feeds: Every model input.
        output_names: Every model output, in the model's order.
        gated_outputs: The outputs scored (not state outputs).
        evaluation: The evaluation set.
        reference: The fp32 ONNX Runtime outputs (and states) on it.
        rows: The evaluation rows to run (:func:`arm_rows`).
        precision: MNN precision mode: the variant's runtime hint.
        budgets: The variant's effective budgets (size and latency are dropped).
        score_task: The task's evaluator on the rows run: (reference, outputs) -> scores.
        cache_dir: Where runs are cached (``<out>/.cache/arm``).
        mnn_version: The pinned MNN version (its sysroot is used).
        runner: Runs one class; default: :class:`EmulatedRunner` on the sysroot.
        sysroot_root: The sysroot cache (default: :func:`edgereg.toolchain.arm.arm_dir`).

    Raises:
        ArmError: the sysroot or emulator is missing (naming the command that
            installs it) or broken, or a run timed out. A run that crashes, or
            on which MNN refuses or fails the model, fails its class instead.
    """
    inputs = _inputs_at(feeds, evaluation, reference, rows)
    expected = {name: np.asarray(reference.outputs[name])[rows] for name in gated_outputs}
    # Which -cpu model stands for a class is the installed emulator's choice,
    # known without the sysroot: a cached run needs only that.
    chooser = runner or ArmRunner()
    chosen = {cpu_class: chooser.qemu_cpu(cpu_class) for cpu_class in classes}
    runs: dict[str, ArmRun | ArmError] = {}
    missing: list[tuple[str, Path]] = []
    for cpu_class in classes:
        key = _cache_key(artifact_sha, cpu_class, chosen[cpu_class], mnn_version, precision, inputs)
        path = cache_dir / f"{key}.npz"
        found = _cached(path, output_names)
        if found is None:
            missing.append((cpu_class, path))
        else:
            runs[cpu_class] = found
    active = ArmRunner()  # nothing to emulate: its start and close do nothing
    if missing:
        active = runner or EmulatedRunner(
            find_sysroot(mnn_version, root=sysroot_root), cpus=chooser.available_cpus()
        )
    # One emulator per class for this stage: started now, so MNN imports under
    # them while the host runs; stopped when the stage ends, however it ends.
    with contextlib.closing(active):
        active.start([cpu_class for cpu_class, _ in missing])
        # The same artifact on the host, on the same rows: what each class is held to.
        host = run_on_host(
            artifact,
            inputs,
            input_names=[f.name for f in feeds],
            output_names=list(output_names),
            precision=precision,
            artifact_sha=artifact_sha,
            inputs_digest=_inputs_digest(inputs),
            mnn_version=mnn_version,
            cache_dir=cache_dir,
        )
        if missing:
            runs.update(
                _emulate(
                    active,
                    missing,
                    artifact=artifact,
                    inputs=inputs,
                    input_names=[f.name for f in feeds],
                    output_names=list(output_names),
                    precision=precision,
                    mnn_version=mnn_version,
                )
            )
    # In the classes' order (oldest first): a tie between classes goes to the oldest.
    ran = {c: r for c in classes if isinstance(r := runs[c], ArmRun)}
    comparison = compare(
        {HOST: host, **{c: r.outputs for c, r in ran.items()}},
        {
            HOST: "fp32",
            **{
                c: "fp16"
                if precision == "low" and "fp16" in (r.features or CPU_CLASSES[c].features)
                else "fp32"
                for c, r in ran.items()
            },
        },
        output_names,
    )
    results = []
    for cpu_class in classes:
        spec = CPU_CLASSES[cpu_class]
        run = runs[cpu_class]
        cached = cpu_class not in dict(missing)
        if isinstance(run, ArmError):
            results.append(
                ClassResult(
                    cpu_class=cpu_class,
                    qemu_cpu=chosen[cpu_class],
                    features=spec.features,
                    agreement={},
                    scores=None,
                    gates=GateReport(),
                    avoided=bool(set(spec.features) & set(avoid_cpu)),
                    error=run.message,
                )
            )
            continue
        produced = {name: run.outputs[name] for name in gated_outputs}
        agree = agreement(expected, produced)
        try:
            scores = score_task(expected, produced)
        except BuildError as exc:
            # A custom evaluator may need the labels or rows a subset lacks.
            logger.info("task metrics not computed on the ARM rows: %s", exc.message)
            scores = None
        gates = check_gates(
            arm_budgets(budgets),
            size_bytes=0,
            agreement=agree,
            scores=scores,
            latency_p50_ms=None,
            # Label metrics need the whole evaluation set: they lapse here.
            required_metrics=set(),
        )
        features = run.features or spec.features
        results.append(
            ClassResult(
                cpu_class=cpu_class,
                qemu_cpu=run.qemu_cpu,
                features=tuple(features),
                agreement=agree,
                scores=scores,
                gates=gates,
                avoided=bool(set(features) & set(avoid_cpu)),
                seconds=run.seconds,
                cached=cached,
                differs=comparison.differs.get(cpu_class, {}),
                reference=comparison.reference,
                rest_from=run.rest_from,
            )
        )
    return ArmReport(
        results=tuple(results),
        samples=len(rows),
        mnn_version=mnn_version,
        precision=precision,
        avoid_cpu=tuple(avoid_cpu),
        comparison=comparison,
    )


def arm_hint(report: ArmReport, *, lower_variant: str | None, quantization_mode: str) -> str:
    """Fix-it text for a variant that failed on some CPU classes, from what was measured.

    Features that every failing class has and no passing class has are the
    suspects: shipping around them (``avoid_cpu`` with ``instead``) is
    measured to help, since devices without them pass.
    """
    failing = report.failures
    passing = [r for r in report.results if r.passed]
    suspects = set.intersection(*(set(r.features) for r in failing)) if failing else set()
    for r in passing:
        suspects -= set(r.features)
    lines = []
    names = ", ".join(r.cpu_class + (" (the run failed)" if r.error else "") for r in failing)
    if suspects and passing:
        # The i8mm kernel is the known culprit of int8 channel tails; name it first.
        order = sorted(suspects, key=lambda f: (f != "i8mm", f != "fp16", f))
        feature = order[0]
        instead = f'instead = "{lower_variant}"' if lower_variant else 'instead = "<variant>"'
        lines.append(
            f"Measured: the variant is right on {', '.join(r.cpu_class for r in passing)} and "
            f"wrong on {names}, which alone have {', '.join(order)}. Ship around it: declare "
            f'avoid_cpu = ["{feature}"] and {instead} on this variant in models.toml, and '
            f"devices with {feature} install {lower_variant or 'that variant'}."
        )
        if feature == "i8mm" and quantization_mode == "int8":
            lines.append(
                "MNN's i8mm int8 kernel computes output channels past the last multiple of 8 "
                "wrong; an output with a multiple of 8 channels, or weight-only quantization "
                '(mode = "weight"), avoids that kernel.'
            )
    if report.precision == "low" and any("fp16" in r.features for r in failing):
        lines.append(
            'The runtime hint precision = "low" computes in fp16 on these cores: hint '
            'precision = "normal" for this variant, or accept the numbers by raising its budgets.'
        )
    if not lines:
        lines.append(
            f"The variant computes wrong on {names} only under MNN's ARM kernels; keep this "
            'tier on another quantization (mode = "weight"), or declare arm = [...] without '
            "that class only if no device of the tier has it."
        )
    return "\n".join(lines)


def ship_around_differing(
    report: ArmReport, instead: str | None
) -> tuple[ArmReport, dict[str, str]]:
    """Exclude the classes that compute otherwise than the reference, when an ``instead`` exists.

    A CPU feature that every differing class has and no class computing as the
    reference has (``i8mm`` first: MNN's i8mm int8 kernel gets channel tails
    wrong) is added to the variant's ``avoid_cpu``: devices with it install
    the ``instead``. Without an ``instead``, or without such a feature, the
    report is returned as it is (those classes fail).

    Returns:
        The report with the feature avoided, and feature -> why (empty when none was added).
    """
    differing = [r for r in report.results if r.differs and not r.avoided]
    if instead is None or not differing:
        return report, {}
    agreeing = [r for r in report.results if r.error is None and not r.differs]
    suspects = set.intersection(*(set(r.features) for r in differing))
    for r in agreeing:
        suspects -= set(r.features)
    if not suspects:
        return report, {}
    feature = sorted(suspects, key=lambda f: (f != "i8mm", f != "fp16", f))[0]
    avoid = (*report.avoid_cpu, feature)
    why = "; ".join(
        f"{r.cpu_class}: " + ", ".join(d.describe(n) for n, d in r.differs.items())
        for r in differing
    )
    results = tuple(
        dataclasses.replace(r, avoided=bool(set(r.features) & set(avoid))) for r in report.results
    )
    return dataclasses.replace(report, results=results, avoid_cpu=avoid), {feature: why}


def lower_variant(config: Config, model_name: str, variant_name: str) -> str | None:
    """The variant the next tier down gets (the natural ``instead``), if another one."""
    model = config.models[model_name]
    tiers = list(config.tiers)
    mapping = config.tier_variants(model_name)
    for tier in tiers[tiers.index(model.variants[variant_name].tier) + 1 :]:
        name = mapping[tier][0]
        if name != variant_name:
            return name
    return None


def arm_stage(
    *,
    config: Config,
    model_name: str,
    variant_name: str,
    artifact: Path,
    artifact_sha: str,
    feeds: Sequence[toolchain.InputFeed],
    output_names: Sequence[str],
    gated_outputs: Sequence[str],
    evaluation: Dataset,
    reference: toolchain.StreamResult,
    probe_rows: np.ndarray,
    budgets: Budgets,
    score_task: Callable[
        [Dataset, dict[str, np.ndarray], dict[str, np.ndarray]], TaskScores | None
    ],
    cache_dir: Path,
    metrics: dict[str, Any],
    write_failure: Callable[[], object],
    runner: ArmRunner | None = None,
) -> ArmReport | None:
    """The build's ARM stage: verify on the variant's classes, record, gate.

    Adds ``metrics["arm"]`` and an ``arm[CLASS]`` entry per class to
    ``metrics["gates"]``. A class that fails (and is not avoided) marks the
    metrics failed with the class, its features, the numbers and a hint,
    calls ``write_failure`` and raises :class:`GateError`.

    Returns:
        The report, or None when the variant is verified on no class.
    """
    classes = arm_classes(config, model_name, variant_name)
    variant = config.models[model_name].variants[variant_name]
    if not classes:
        if variant.avoid_cpu:
            # Nothing verified, but publish still ships the declared avoidance.
            metrics["arm"] = {
                "mnn": config.toolchain.mnn,
                "avoid_cpu": list(variant.avoid_cpu),
                "instead": variant.instead,
                "classes": {},
            }
        return None
    rows = arm_rows(len(evaluation), probe_rows, config.toolchain.arm_samples)
    # No labels: label metrics need the whole set and stay the host's.
    subset = Dataset(inputs={n: a[rows] for n, a in evaluation.inputs.items()}, labels=None)
    report = verify_on_arm(
        artifact=artifact,
        artifact_sha=artifact_sha,
        classes=classes,
        avoid_cpu=variant.avoid_cpu or (),
        feeds=feeds,
        output_names=output_names,
        gated_outputs=gated_outputs,
        evaluation=evaluation,
        reference=reference,
        rows=rows,
        precision=variant.runtime.precision,
        budgets=budgets,
        score_task=lambda ref, out: score_task(subset, ref, out),
        cache_dir=cache_dir,
        mnn_version=config.toolchain.mnn,
        runner=runner,
        sysroot_root=arm_dir(),
    )
    # One artifact, one behaviour: a class computing otherwise than the reference
    # is shipped around when the variant has an instead (else it fails below).
    report, added = ship_around_differing(report, variant.instead)
    for feature, why in added.items():
        logger.warning(
            "%s/%s: avoid_cpu += %s (devices with it install %s): %s",
            model_name,
            variant_name,
            feature,
            variant.instead,
            why,
        )
    metrics["arm"] = {**report.to_json(), "instead": variant.instead}
    if added:
        metrics["arm"]["avoid_cpu_added"] = added
    gates = metrics.setdefault("gates", {})
    for result in report.results:
        gates[f"arm[{result.cpu_class}]"] = result.passed or result.avoided
    if report.passed:
        return report
    hint = arm_hint(
        report,
        lower_variant=lower_variant(config, model_name, variant_name),
        quantization_mode=variant.quantization.mode,
    )
    metrics["status"] = "failed"
    metrics["failed"] = [*metrics.get("failed", []), *report.describe_failures()]
    metrics["hint"] = hint
    write_failure()
    lines = [f"{model_name}/{variant_name} failed its gates on MNN's ARM kernels:"]
    lines += [f"  {line}" for line in report.describe_failures()]
    raise GateError("\n".join(lines), stage="arm verify", hint=hint)


def summary_of(metrics: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Per class of a variant's metrics.json: its status and worst output cosine, for tables."""
    record = metrics.get("arm")
    classes = record.get("classes") if isinstance(record, Mapping) else None
    if not isinstance(classes, Mapping):
        return {}
    rows: dict[str, dict[str, Any]] = {}
    for name, result in classes.items():
        if not isinstance(result, Mapping):
            continue
        agreement = result.get("agreement") or {}
        cosines = [a.get("cosine") for a in agreement.values() if isinstance(a, Mapping)]
        rows[str(name)] = {
            "status": result.get("status"),
            "cpu": result.get("cpu"),
            "min_cosine": min((c for c in cosines if isinstance(c, float)), default=None),
        }
    return rows


def summary_cell(classes: Mapping[str, Mapping[str, Any]]) -> str:
    """One table cell: each class's worst cosine, marked when it failed or is avoided."""
    if not classes:
        return "-"
    marks = {"failed": " FAIL", "avoided": " avoided"}
    return " ".join(
        f"{name} "
        + ("-" if row.get("min_cosine") is None else f"{row['min_cosine']:.4f}")
        + marks.get(str(row.get("status")), "")
        for name, row in classes.items()
    )
