"""Peak memory of a variant: measured, recorded, gated and explained.

The measurement (:func:`edgereg.toolchain.memory.measure_memory`) runs the
artifact in a fresh MNN session process at the variant's declared input
shapes, batch axis 1: the one shape the contract promises the app, and the
shape of every evaluation sample (the build checks the set against it), so it
is also the largest the evaluation set holds. Two kinds of number come back:

- MNN's own accounting of the session (``getSessionInfo``) and the shapes of
  the tensors the ops produce: the same on every run, so they go to
  ``metrics.json`` (a DVC output that a rebuild reproduces byte for byte);
- the process's peak and steady resident memory above its baseline, and the
  first and steady latency: host figures that differ per run, so they go to
  ``host-benchmark.json`` next to the latency curve. The ``max_memory_mb``
  gate judges the peak, the number that gets an app killed.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from edgereg import toolchain
from edgereg.build.quality import GateReport, GateResult
from edgereg.errors import BuildError
from edgereg.toolchain.memory import MemoryMeasurement, measure_memory

logger = logging.getLogger(__name__)

#: Contributors a gate failure names.
NAMED_CONTRIBUTORS = 3


@dataclass(frozen=True)
class MemoryOutcome:
    """The memory of one variant, or why it could not be measured."""

    measurement: MemoryMeasurement | None
    inputs: dict[str, list[int]]
    problem: str | None = None


def measure_variant(
    artifact: Path,
    sample: Mapping[str, np.ndarray],
    feeds: Sequence[toolchain.InputFeed],
    *,
    threads: int,
    warmup: int,
    iterations: int,
    required_by: Sequence[str] = (),
) -> MemoryOutcome:
    """Measure ``artifact`` at the shapes of ``sample`` (one app call).

    Args:
        required_by: The budgets that need the number (``max_memory_mb``, a
            tier's ceiling): when any is set, a failed measurement is a build
            error, never a silent pass.

    Raises:
        BuildError: (stage ``memory``) the measurement failed and a budget needs it.
    """
    inputs = {feed.name: [int(d) for d in np.shape(sample[feed.name])] for feed in feeds}
    try:
        measured = measure_memory(
            artifact,
            sample,
            input_names=[feed.name for feed in feeds],
            threads=threads,
            warmup=warmup,
            iterations=iterations,
        )
    except BuildError as exc:
        return _unmeasured(inputs, exc.message, required_by, exc)
    return MemoryOutcome(measured, inputs)


def outcome_of(
    timing: toolchain.BenchmarkResult,
    sample: Mapping[str, np.ndarray],
    feeds: Sequence[toolchain.InputFeed],
    *,
    required_by: Sequence[str] = (),
) -> MemoryOutcome:
    """The memory the benchmark's child measured first (see :func:`measure_variant`).

    Raises:
        BuildError: (stage ``memory``) the measurement failed and a budget needs it.
    """
    inputs = {feed.name: [int(d) for d in np.shape(sample[feed.name])] for feed in feeds}
    if timing.memory is not None:
        return MemoryOutcome(timing.memory, inputs)
    return _unmeasured(inputs, timing.memory_error or "not measured", required_by, None)


def _unmeasured(
    inputs: dict[str, list[int]],
    message: str,
    required_by: Sequence[str],
    cause: BuildError | None,
) -> MemoryOutcome:
    shapes = ", ".join(f"{name} {shape}" for name, shape in inputs.items())
    reason = f"MNN could not run the artifact at {shapes}: {message}"
    if required_by:
        raise BuildError(
            f"{' and '.join(required_by)} is set, but the variant's memory cannot be "
            f"measured: {reason}",
            stage="memory",
            tool=None if cause is None else cause.tool,
            exit_status=None if cause is None else cause.exit_status,
            output_tail=None if cause is None else cause.output_tail,
            hint="Declare input shapes MNN's session API can run (the app calls the model "
            "the same way), or remove the memory budget.",
        ) from cause
    logger.warning("memory not measured: %s", reason)
    return MemoryOutcome(None, inputs, reason)


def metrics_record(outcome: MemoryOutcome) -> dict[str, Any]:
    """The ``memory`` entry of metrics.json: what a rebuild reproduces exactly."""
    measured = outcome.measurement
    if measured is None:
        return {"measured": False, "inputs": _shapes(outcome.inputs), "problem": outcome.problem}
    return {
        "measured": True,
        "inputs": _shapes(outcome.inputs),
        "threads": measured.threads,
        # MNN's plan at a fixed shape and thread count: the same number every run.
        "runtime_mb": round(measured.runtime_mb, 3),
        "largest_tensors": [
            {
                "op": tensor.op,
                "type": tensor.op_type,
                "dtype": tensor.dtype,
                "shape": list(tensor.shape),
                "mb": round(tensor.mb, 3),
            }
            for tensor in measured.largest_tensors
        ],
    }


def _shapes(inputs: dict[str, list[int]]) -> dict[str, str]:
    # "1x3x512x512": `dvc metrics show` leaves lists out, and strings in.
    return {name: "x".join(str(d) for d in shape) or "scalar" for name, shape in inputs.items()}


def host_record(measured: MemoryMeasurement | None, warmup: int) -> dict[str, Any]:
    """The memory and first/steady latency figures of host-benchmark.json (host figures)."""
    if measured is None:
        return {}
    return {
        "memory_peak_mb": round(measured.peak_mb, 2),
        "memory_steady_mb": round(measured.steady_mb, 2),
        "memory_runtime_mb": round(measured.runtime_mb, 3),
        "memory_threads": measured.threads,
        "session_load_ms": round(measured.load_ms, 3),
        "first_inference_ms": round(measured.first_ms, 3),
        "steady_p50_ms": round(measured.steady_percentile(50), 3),
        "steady_p90_ms": round(measured.steady_percentile(90), 3),
        "steady_warmup": warmup,
        "memory_seconds": round(measured.seconds, 3),
    }


def describe_contributors(measured: MemoryMeasurement, count: int = NAMED_CONTRIBUTORS) -> str:
    """The largest tensors the runtime produced, for a message."""
    parts = [
        f"{tensor.op} ({tensor.op_type}, {tensor.dtype}) {list(tensor.shape)} {tensor.mb:.1f} MB"
        for tensor in measured.largest_tensors[:count]
    ]
    return "largest tensors: " + "; ".join(parts) if parts else "no tensors reported"


@dataclass(frozen=True)
class LatencyLoads:
    """The first and steady latency of several fresh loads: what latency budgets judge.

    One load's first call says as much about the machine as about the model:
    on the loaded 2-core build machine one artifact's first call took 1 to 105
    ms of wall time while its process spent 1.1 to 2.6 ms of CPU time. Each
    load counts its calls at min(wall, CPU) (the time not spent waiting for a
    core, :attr:`MemoryMeasurement.first_busy_ms`), and the budgets judge the
    median over the loads; the spread is recorded with them.
    """

    loads: tuple[MemoryMeasurement, ...]

    @property
    def first_ms(self) -> float:
        """The judged first call: the median over loads of each one's min(wall, CPU)."""
        return float(np.median([load.first_busy_ms for load in self.loads]))

    @property
    def steady_p50_ms(self) -> float:
        """The judged steady call: the median over loads of each one's busy p50."""
        return float(np.median([load.steady_busy_p50_ms for load in self.loads]))

    def describe_first(self) -> str:
        """The first-call gate's detail: how it was judged, and the spread."""
        busy = [load.first_busy_ms for load in self.loads]
        wall = [load.first_ms for load in self.loads]
        return (
            f"median of {len(self.loads)} fresh loads, each the first call's wall time less "
            f"the time it waited for a core (min of wall and CPU time): {min(busy):.2f} to "
            f"{max(busy):.2f} ms; wall {min(wall):.2f} to {max(wall):.2f} ms"
        )

    def describe_steady(self) -> str:
        """The steady gate's detail."""
        busy = [load.steady_busy_p50_ms for load in self.loads]
        return (
            f"median of {len(self.loads)} fresh loads' steady p50 at min(wall, CPU) per call: "
            f"{min(busy):.3f} to {max(busy):.3f} ms"
        )

    def host_record(self) -> dict[str, float]:
        """The judged figures and their spread, for host-benchmark.json."""
        busy = [load.first_busy_ms for load in self.loads]
        wall = [load.first_ms for load in self.loads]
        steady = [load.steady_busy_p50_ms for load in self.loads]
        return {
            "latency_loads": len(self.loads),
            "first_inference_judged_ms": round(self.first_ms, 3),
            "first_inference_busy_min_ms": round(min(busy), 3),
            "first_inference_busy_max_ms": round(max(busy), 3),
            "first_inference_wall_min_ms": round(min(wall), 3),
            "first_inference_wall_max_ms": round(max(wall), 3),
            "steady_judged_p50_ms": round(self.steady_p50_ms, 3),
            "steady_busy_min_ms": round(min(steady), 3),
            "steady_busy_max_ms": round(max(steady), 3),
        }


def fresh_loads(
    artifact: Path,
    sample: Mapping[str, np.ndarray],
    feeds: Sequence[toolchain.InputFeed],
    first: MemoryMeasurement,
    *,
    count: int,
    warmup: int,
    iterations: int,
) -> LatencyLoads:
    """``first`` and ``count - 1`` more loads of ``artifact``, each in a fresh process.

    Raises:
        BuildError: (stage ``memory``) MNN failed in one of them.
    """
    loads = [first]
    for _ in range(max(count, 1) - 1):
        loads.append(
            measure_memory(
                artifact,
                sample,
                input_names=[feed.name for feed in feeds],
                threads=first.threads,
                warmup=warmup,
                iterations=iterations,
            )
        )
    return LatencyLoads(tuple(loads))


def add_gates(
    gates: GateReport,
    *,
    max_memory_mb: float | None,
    max_first_inference_ms: float | None,
    outcome: MemoryOutcome,
    loads: LatencyLoads | None = None,
) -> GateReport:
    """``gates`` with the memory and first-inference budgets checked.

    The first call is judged on ``loads`` when given (:class:`LatencyLoads`),
    else on the one load of ``outcome``.
    """
    measured = outcome.measurement
    results = list(gates.results)
    if measured is not None and max_memory_mb is not None:
        shapes = ", ".join(f"{name} {shape}" for name, shape in outcome.inputs.items())
        results.append(
            GateResult(
                "max_memory_mb",
                max_memory_mb,
                round(measured.peak_mb, 1),
                measured.peak_mb <= max_memory_mb,
                detail=f"host peak resident memory at {shapes}; MNN accounts "
                f"{measured.runtime_mb:.1f} MB; {describe_contributors(measured)}",
            )
        )
    if measured is not None and max_first_inference_ms is not None:
        first = measured.first_ms if loads is None else loads.first_ms
        how = "first call after load" if loads is None else loads.describe_first()
        results.append(
            GateResult(
                "max_first_inference_ms",
                max_first_inference_ms,
                round(first, 2),
                first <= max_first_inference_ms,
                detail=f"host, {measured.threads} thread(s), {how}",
            )
        )
    return GateReport(results)


def gate_hint(outcome: MemoryOutcome, size_bytes: int, precision: str = "fp32") -> str:
    """What to change when the memory gate fails: by what the memory is made of.

    Each precision's effect as measured (docs/build.md#memory): fp16 weights
    and weight-only quantization leave activations at float width; full int8
    computes the layers it quantizes at 1 byte a value, but keeps some in float
    and adds conversions, so its peak can be lower or higher than float's.
    """
    measured = outcome.measurement
    if measured is None:
        return ""
    weights_mb = size_bytes / (1024.0 * 1024.0)
    tensors_mb = sum(tensor.mb for tensor in measured.largest_tensors[:2])
    if tensors_mb >= weights_mb:
        top = measured.largest_tensors[0]
        text = (
            f"Activations, not weights, dominate ({top.op} alone produces {top.mb:.1f} MB of "
            f"{top.dtype}, the artifact is {weights_mb:.2f} MB): declare a smaller input shape "
            "for this tier (a variant's own inputs, with a source exported at that size), or "
            "give the tier a smaller model (variant source)."
        )
        if top.dtype in ("int8", "uint8"):
            return text + " Its largest tensors already hold 1 byte a value (int8)."
        if precision == "int8":
            return text + (
                f" {top.op} is {top.dtype} even in this int8 variant: a layer the quantizer "
                "left in float (the first layer reads the float input; skip_ops keep layers "
                "in float), with conversions to and from int8 around it."
            )
        width = 2 if top.dtype == "float16" else 4
        return text + (
            " fp16 weights and weight-only quantization leave activations at float width, so "
            'they barely change this. Full int8 (mode = "int8") computes the layers it '
            f"quantizes at 1 byte a value ({top.op}: about {top.mb / width:.1f} MB), but the "
            "layers it leaves in float and the conversions around them count at full width "
            "(measured: 13 % below the float peak on the example segmenter, whose skip "
            "concatenations and upsampling stay float; 21 % above it on a 3-layer net): "
            "compare an int8 variant's measured peak before relying on it."
        )
    if precision == "weight":
        return (
            f"The weights ({weights_mb:.2f} MB) dominate: fewer bits (bits = 4), or a smaller "
            "model for this tier."
        )
    if precision == "int8":
        return f"The weights ({weights_mb:.2f} MB) dominate: a smaller model for this tier."
    return (
        f"The weights ({weights_mb:.2f} MB) dominate: weight-only quantization "
        '(mode = "weight") or int8 shrinks them; or a smaller model for this tier.'
    )
