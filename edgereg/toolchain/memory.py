"""Memory of one artifact at one input shape, measured in a fresh MNN process.

A fresh child per measurement: the peak resident size of a process that has
already loaded other models (or run a thread sweep) says nothing about this
one. See ``_memory_worker.py`` for what the child does.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg.errors import BuildError
from edgereg.toolchain._process import run_worker, scratch_dir


@dataclass(frozen=True)
class TensorSize:
    """One tensor an op produced while the runtime ran the model."""

    op: str
    op_type: str
    shape: tuple[int, ...]
    mb: float
    #: The element type the op computes in (int8 tensors count 1 byte a value).
    dtype: str = "float32"


@dataclass(frozen=True)
class MemoryMeasurement:
    """What loading and running one artifact cost a process (host figures).

    Attributes:
        runtime_mb: MNN's own accounting of the session (``getSessionInfo``,
            MiB): weights and the tensors it planned, at this shape and thread count.
        peak_mb: Peak resident memory over load, first and steady inference,
            above the process before loading (MiB).
        steady_mb: Resident memory after the steady runs, above that baseline.
        load_peak_mb: Peak after the load, before the first inference.
        first_peak_mb: Peak after the first inference.
        baseline_mb: Resident size of the process before loading (numpy, MNN,
            the inputs).
        peak_reset: Whether the kernel let the peak be reset at the baseline;
            otherwise the peak also counts what happened before it (imports).
        load_ms: Interpreter, session and resize, milliseconds.
        first_ms: The first inference (feed, run, read the outputs).
        steady_ms: Each timed inference after the warm-up.
        largest_tensors: The largest tensors the ops produced, largest first.
        threads: Threads the session ran with.
    """

    runtime_mb: float
    peak_mb: float
    steady_mb: float
    load_peak_mb: float
    first_peak_mb: float
    baseline_mb: float
    peak_reset: bool
    load_ms: float
    first_ms: float
    steady_ms: tuple[float, ...]
    largest_tensors: tuple[TensorSize, ...]
    threads: int
    #: What the measurement cost, seconds (in its process, start excluded).
    seconds: float = 0.0
    #: CPU time of the process (every thread) during the first inference, milliseconds.
    first_cpu_ms: float | None = None
    #: CPU time during each timed steady inference.
    steady_cpu_ms: tuple[float, ...] = ()

    def steady_percentile(self, q: float) -> float:
        """A percentile of the steady latency, milliseconds."""
        return float(np.percentile(self.steady_ms, q))

    @property
    def first_busy_ms(self) -> float:
        """The first call's time without the time it waited for a core: min(wall, CPU).

        Wall time above the process's CPU time is time it was runnable but not
        running (another process had the core): the machine's load, not the
        model's cost. CPU time above the wall time is work done in parallel,
        which the wall time already measures.
        """
        if self.first_cpu_ms is None:
            return self.first_ms
        return min(self.first_ms, self.first_cpu_ms)

    @property
    def steady_busy_p50_ms(self) -> float:
        """The median steady call, each at min(wall, CPU) (see :attr:`first_busy_ms`)."""
        if len(self.steady_cpu_ms) != len(self.steady_ms):
            return self.steady_percentile(50)
        busy = [min(w, c) for w, c in zip(self.steady_ms, self.steady_cpu_ms, strict=True)]
        return float(np.percentile(busy, 50))


@dataclass(frozen=True)
class MemorySettings:
    """How a memory measurement runs: session threads, warm-up and steady runs."""

    threads: int = 1
    warmup: int = 2
    iterations: int = 5

    def request(self) -> dict[str, int]:
        """The worker request's keys."""
        return {
            "threads": int(self.threads),
            "warmup": int(self.warmup),
            "iterations": int(self.iterations),
        }


def measure_memory(
    mnn_path: Path | str,
    sample: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str] | None = None,
    threads: int = 1,
    warmup: int = 2,
    iterations: int = 5,
    timeout: float = 600.0,
) -> MemoryMeasurement:
    """Load ``mnn_path`` in a fresh child process at the shapes of ``sample`` and measure it.

    Args:
        mnn_path: The model.
        sample: One input per name, at the shape to measure (batch included).
        input_names: Inputs to feed; defaults to ``sample``'s order.
        threads: Session threads.
        warmup: Runs after the first, before the timed ones.
        iterations: Timed steady runs.
        timeout: Seconds before the child is killed.

    Raises:
        ValueError: Bad counts or missing inputs.
        BuildError: (stage ``memory``) MNN refused the shape, failed or crashed.
    """
    if iterations < 1 or warmup < 0 or threads < 1:
        raise ValueError("measure_memory needs iterations >= 1, warmup >= 0 and threads >= 1")
    path = Path(mnn_path).resolve()
    if not path.is_file():
        raise BuildError(f"{path} does not exist", stage="memory", tool="MNN")
    names = list(input_names) if input_names is not None else list(sample)
    missing = [name for name in names if name not in sample]
    if missing:
        raise ValueError(f"no data for input(s) {', '.join(missing)}")
    with scratch_dir() as scratch:
        arrays = {name: np.ascontiguousarray(sample[name]) for name in names}
        np.savez(scratch / "inputs.npz", **arrays)  # type: ignore[arg-type]
        run = run_worker(
            "memory",
            {
                "path": str(path),
                "inputs": str(scratch / "inputs.npz"),
                "input_names": names,
                "threads": int(threads),
                "warmup": int(warmup),
                "iterations": int(iterations),
            },
            scratch=scratch,
            stage="memory",
            tool="MNN",
            timeout=timeout,
        )
    return parse_memory(run.result, threads)


def parse_memory(raw: Mapping[str, Any], threads: int) -> MemoryMeasurement:
    """Read the worker's memory result.

    Raises:
        BuildError: (stage ``memory``) the result is not one the worker writes.
    """
    try:
        return MemoryMeasurement(
            runtime_mb=float(raw["runtime_mb"]),
            peak_mb=float(raw["peak_mb"]),
            steady_mb=float(raw["steady_mb"]),
            load_peak_mb=float(raw["load_peak_mb"]),
            first_peak_mb=float(raw["first_peak_mb"]),
            baseline_mb=float(raw["baseline_mb"]),
            peak_reset=bool(raw["peak_reset"]),
            load_ms=float(raw["load_ms"]),
            first_ms=float(raw["first_ms"]),
            steady_ms=tuple(float(t) for t in raw["steady_ms"]),
            largest_tensors=tuple(
                TensorSize(
                    str(row["op"]),
                    str(row["type"]),
                    tuple(int(d) for d in row["shape"]),
                    float(row["mb"]),
                    str(row.get("dtype", "float32")),
                )
                for row in raw["largest_tensors"]
            ),
            threads=threads,
            seconds=float(raw.get("seconds", 0.0)),
            first_cpu_ms=None if raw.get("first_cpu_ms") is None else float(raw["first_cpu_ms"]),
            steady_cpu_ms=tuple(float(t) for t in raw.get("steady_cpu_ms", ())),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BuildError(
            f"the memory measurement returned an unreadable result: {exc}",
            stage="memory",
            tool="MNN",
        ) from exc
