"""The golden probe of a variant: a few evaluation inputs and what the variant computes on them.

The device runs the probe before it installs a model (see
:mod:`edgereg.protocol.probe`); the build writes it. Expected outputs are the
variant's own, computed on the build host with MNN's CPU backend one sample at
a time (through the toolchain's child-process worker, as every MNN call in the
build), so a correct device backend reproduces them up to float rounding.

The tolerance rule (docs/build.md, "The golden probe"):

- ``min_cosine`` is the variant's cosine gate, capped at
  :data:`COSINE_CEILING`, and never tighter than twice the host's own
  deviation (the probe samples as the build's evaluation run computed them,
  batched, against the probe's single-sample run);
- ``max_abs_error`` is the largest of: :data:`ABS_SCALE_FRACTION` of the
  largest expected magnitude, the variant's measured max abs error against
  the fp32 ONNX reference, and twice the host's own deviation; rounded up to
  two significant digits.

A device within that distance of the host's variant is about as close to the
fp32 model as the gates require; a miscomputing kernel (a flipped channel,
garbage, NaN) is far outside it.

A model whose one sample of inputs is larger than
:data:`~edgereg.build.outputs.PROBE_INLINE_INPUT_BYTES` gets its probe's
tensors in a data blob beside it (:func:`split_probe`, docs/protocol.md
section 11): a 1x3x1024x1024 float input alone is 16.8 MB in base64, over the
16 MiB every client parses. What no client can hold is refused here
(:func:`check_client_limits`), naming the size, the limit and what to change.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import math
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgereg import toolchain
from edgereg.build.datasets import Dataset
from edgereg.errors import BuildError
from edgereg.protocol.contract import IOContract
from edgereg.protocol.probe import (
    MAX_PROBE_BYTES,
    MAX_PROBE_DATA_BYTES,
    GoldenProbe,
    ProbeCase,
    ProbeResult,
    ProbeStep,
    ProbeTensor,
    ProbeTolerance,
)
from edgereg.protocol.wire import to_bytes
from edgereg.toolchain import InputFeed, sequence_bounds
from edgereg.toolchain._process import describe_status, scratch_dir, tail

__all__ = [
    "ABS_SCALE_FRACTION",
    "COSINE_CEILING",
    "MAX_CASES",
    "MAX_MODEL_BYTES",
    "MAX_STREAM_CASES",
    "PROBE_MAX_BYTES",
    "STAGE",
    "STREAM_STEPS",
    "ProbeSelection",
    "check_client_limits",
    "check_on_host",
    "golden_probe",
    "probe_bytes",
    "probe_outputs_on_host",
    "probe_tolerance",
    "select_probe_rows",
    "split_probe",
]

logger = logging.getLogger(__name__)

#: Stage named in errors raised here.
STAGE = "probe"
#: A probe blob stays under this (its tensors, base64 included); large inputs get fewer cases.
PROBE_MAX_BYTES = 1_000_000
#: Cases of a stateless model: one evaluation sample each.
MAX_CASES = 4
#: Cases of a stateful model: one stream each, of at most :data:`STREAM_STEPS` steps.
MAX_STREAM_CASES = 2
STREAM_STEPS = 4
#: The tightest ``min_cosine`` a probe asks for: a GPU running fp32 kernels in
#: fp16 stays well above it, a miscomputing one falls well below.
COSINE_CEILING = 0.9999
#: ``max_abs_error`` is at least this share of the largest expected magnitude.
ABS_SCALE_FRACTION = 0.01
#: Seconds the host self-test may take (it loads the model once and runs a few steps).
_SELF_TEST_TIMEOUT = 600.0
#: Bytes per case that are not tensor data (names, shapes, JSON punctuation).
_CASE_OVERHEAD = 256
#: The largest model file any client loads: MNN's format is a flatbuffer (32-bit
#: offsets), and a JVM array holds at most 2^31 - 1 bytes.
MAX_MODEL_BYTES = 2**31 - 1

_WIRE_DTYPES = {
    "float32": "float32",
    "float64": "float32",
    "float16": "float16",
    "int8": "int8",
    "uint8": "uint8",
    "int16": "int32",
    "int32": "int32",
    "int64": "int64",
    "bool": "bool",
}


@dataclass(frozen=True)
class ProbeSelection:
    """The evaluation rows a probe feeds, case after case, each case's steps in order.

    Attributes:
        rows: Indices into the evaluation set.
        case_ids: The case of each selected row (a stream id for stateful models).
    """

    rows: np.ndarray
    case_ids: np.ndarray

    def cases(self) -> list[list[int]]:
        """Positions in :attr:`rows` of each case's steps."""
        return [list(range(start, stop)) for start, stop in sequence_bounds(self.case_ids)]


def _step_bytes(
    feeds: Sequence[InputFeed], outputs: Mapping[str, np.ndarray], state_inputs: set[str]
) -> int:
    """Estimated probe bytes of one step: its tensors in base64."""
    raw = sum(
        math.prod(feed.shape) * np.dtype(feed.dtype).itemsize
        for feed in feeds
        if feed.name not in state_inputs
    )
    raw += sum(int(array[0].nbytes) if len(array) else 0 for array in outputs.values())
    return math.ceil(raw * 4 / 3) + _CASE_OVERHEAD


def _spread(count: int, wanted: int) -> list[int]:
    """``wanted`` indices spread evenly over ``range(count)``, first and last included."""
    if count <= 0:
        return []
    return sorted({round(float(i)) for i in np.linspace(0, count - 1, min(wanted, count))})


def select_probe_rows(
    evaluation: Dataset,
    feeds: Sequence[InputFeed],
    state: Sequence[tuple[str, str]],
    reference: Mapping[str, np.ndarray],
    *,
    max_bytes: int = PROBE_MAX_BYTES,
) -> ProbeSelection:
    """Choose the probe's samples: spread over the evaluation set, within the size budget.

    Args:
        evaluation: The variant's evaluation set.
        feeds: Every model input.
        state: ``(input, output)`` state pairs.
        reference: The app-facing outputs of the evaluation set (for their size).
        max_bytes: The probe's size budget.

    Raises:
        BuildError: the model has no input that is not a state (nothing to feed).
    """
    state_inputs = {pair[0] for pair in state}
    if not evaluation.inputs:
        raise BuildError(
            "cannot make a golden probe: every input of the model is a state input",
            stage=STAGE,
            hint="Give the model at least one data input (the chunk or frame it reads).",
        )
    per_step = _step_bytes(feeds, reference, state_inputs)
    if not state:
        count = max(1, min(MAX_CASES, max_bytes // per_step))
        rows = _spread(len(evaluation), count)
        return ProbeSelection(np.asarray(rows, np.int64), np.arange(len(rows), dtype=np.int64))
    bounds = (
        sequence_bounds(evaluation.sequences)
        if evaluation.sequences is not None
        else [(i, i + 1) for i in range(len(evaluation))]
    )
    steps = max(1, min(STREAM_STEPS, max_bytes // per_step))
    count = max(1, min(MAX_STREAM_CASES, max_bytes // (per_step * steps)))
    selected: list[int] = []
    case_ids: list[int] = []
    for case, index in enumerate(_spread(len(bounds), count)):
        start, stop = bounds[index]
        # The first steps of a stream: the state starts at zeros, as on the device.
        for row in range(start, min(stop, start + steps)):
            selected.append(row)
            case_ids.append(case)
    return ProbeSelection(np.asarray(selected, np.int64), np.asarray(case_ids, np.int64))


def _tensor(name: str, array: np.ndarray) -> ProbeTensor:
    value = np.asarray(array)
    dtype = _WIRE_DTYPES.get(value.dtype.name)
    if dtype is None:
        raise BuildError(
            f"cannot put tensor '{name}' of dtype {value.dtype} into the golden probe",
            stage=STAGE,
        )
    data = np.ascontiguousarray(value, dtype=np.dtype(dtype).newbyteorder("<"))
    return ProbeTensor(
        name=name,
        dtype=dtype,
        shape=[int(d) for d in data.shape],
        data=base64.b64encode(data.tobytes()).decode("ascii"),
    )


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    x, y = a.astype(np.float64).reshape(-1), b.astype(np.float64).reshape(-1)
    norms = float(np.sqrt(np.sum(x * x)) * np.sqrt(np.sum(y * y)))
    if norms == 0:
        return 1.0 if not np.any(x) and not np.any(y) else 0.0
    return float(np.sum(x * y) / norms)


def _round_up(value: float, digits: int = 2) -> float:
    """``value`` rounded up to ``digits`` significant digits (stable bytes, never tighter)."""
    if value <= 0:
        return 0.0
    step = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    rounded = float(f"{math.ceil(value / step - 1e-9) * step:.{digits}g}")
    return rounded if rounded >= value else float(f"{rounded + step:.{digits}g}")


def probe_tolerance(
    expected: Mapping[str, np.ndarray],
    rerun: Mapping[str, np.ndarray],
    *,
    budget_min_cosine: float,
    variant_max_abs_error: float,
) -> ProbeTolerance:
    """The tolerance rule (module docstring) applied to measured numbers.

    Args:
        expected: Output name -> ``(steps, *tensor shape)``, the probe's expected outputs.
        rerun: The same steps as the build's evaluation run computed them.
        budget_min_cosine: The variant's cosine gate.
        variant_max_abs_error: The variant's largest abs error against the fp32 reference.
    """
    host_cosine, host_error, scale = 1.0, 0.0, 0.0
    for name, want in expected.items():
        got = np.asarray(rerun[name]).reshape(want.shape)
        for step_want, step_got in zip(want, got, strict=True):
            host_cosine = min(host_cosine, _cosine(step_want, step_got))
        difference = np.abs(got.astype(np.float64) - want.astype(np.float64))
        host_error = max(host_error, float(np.max(difference)) if difference.size else 0.0)
        scale = max(scale, float(np.max(np.abs(want))) if want.size else 0.0)
    min_cosine = min(budget_min_cosine, COSINE_CEILING, 1 - 2 * (1 - host_cosine))
    # Floor to 6 decimals: stable bytes from run to run, and never tighter than measured.
    min_cosine = max(-1.0, math.floor(min_cosine * 1e6) / 1e6)
    max_abs_error = max(ABS_SCALE_FRACTION * scale, variant_max_abs_error, 2 * host_error)
    return ProbeTolerance(min_cosine=min_cosine, max_abs_error=_round_up(max_abs_error) or 1e-6)


def golden_probe(
    *,
    model_name: str,
    variant_name: str,
    artifact: Path,
    artifact_sha256: str,
    evaluation: Dataset,
    selection: ProbeSelection,
    feeds: Sequence[InputFeed],
    output_names: Sequence[str],
    state: Sequence[tuple[str, str]],
    rerun: Mapping[str, np.ndarray],
    budget_min_cosine: float,
    variant_max_abs_error: float,
) -> GoldenProbe:
    """Run the selected samples through the variant on the host (MNN CPU) and write the probe.

    Args:
        model_name: The model.
        variant_name: The variant.
        artifact: The variant's model.mnn.
        artifact_sha256: Its digest, recorded in the probe.
        evaluation: The evaluation set the selection indexes.
        selection: From :func:`select_probe_rows`.
        feeds: Every model input.
        output_names: Every model output (state outputs included).
        state: ``(input, output)`` state pairs.
        rerun: App-facing output name -> the selected rows as the build's
            evaluation run computed them (``(len(selection.rows), ...)``).
        budget_min_cosine: The variant's cosine gate.
        variant_max_abs_error: Its largest abs error against the fp32 reference.

    Raises:
        BuildError: MNN failed on the probe's samples.
    """
    state_inputs = {pair[0] for pair in state}
    state_outputs = {pair[1] for pair in state}
    app_outputs = [name for name in output_names if name not in state_outputs]
    data_feeds = [feed for feed in feeds if feed.name not in state_inputs]
    rows = {feed.name: evaluation.inputs[feed.name][selection.rows] for feed in data_feeds}
    # One sample per call, as a device runs it; the stream's state fed back from zeros.
    computed = toolchain.run_inference(
        artifact,
        rows,
        feeds=feeds,
        output_names=list(output_names),
        state=state,
        sequences=selection.case_ids if state else None,
        batch_size=1,
    )
    expected = {name: computed[name] for name in app_outputs}
    tolerance = probe_tolerance(
        expected,
        rerun,
        budget_min_cosine=budget_min_cosine,
        variant_max_abs_error=variant_max_abs_error,
    )
    cases = [
        ProbeCase(
            steps=[
                ProbeStep(
                    inputs=[_tensor(f.name, f.sample(rows[f.name], i)) for f in data_feeds],
                    expected=[_tensor(name, expected[name][i]) for name in app_outputs],
                )
                for i in positions
            ]
        )
        for positions in selection.cases()
    ]
    return GoldenProbe(
        model=model_name,
        variant=variant_name,
        artifact_sha256=artifact_sha256,
        state=[tuple(pair) for pair in state],
        cases=cases,
        tolerance=tolerance,
    )


def split_probe(probe: GoldenProbe) -> tuple[GoldenProbe, bytes]:
    """Move every tensor's bytes into one data blob: the probe that names it, and the blob.

    The bytes follow one another in document order (case, step, inputs then
    expected), each tensor naming its ``offset``; the probe names the blob's
    sha256 (``data_sha256``), which the release entry carries as ``probe_data``.
    """
    blob = bytearray()

    def moved(tensor: ProbeTensor) -> ProbeTensor:
        raw = base64.b64decode(tensor.data or "")
        offset = len(blob)
        blob.extend(raw)
        return ProbeTensor(name=tensor.name, dtype=tensor.dtype, shape=tensor.shape, offset=offset)

    cases = [
        ProbeCase(
            steps=[
                ProbeStep(
                    inputs=[moved(t) for t in step.inputs],
                    expected=[moved(t) for t in step.expected],
                )
                for step in case.steps
            ]
        )
        for case in probe.cases
    ]
    data = bytes(blob)
    split = GoldenProbe(
        model=probe.model,
        variant=probe.variant,
        artifact_sha256=probe.artifact_sha256,
        state=probe.state,
        cases=cases,
        tolerance=probe.tolerance,
        data_sha256=hashlib.sha256(data).hexdigest(),
    )
    return split, data


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def check_client_limits(
    *,
    model_bytes: int,
    probe_bytes: int,
    probe_data_bytes: int | None,
    input_bytes: int,
) -> None:
    """Refuse what no client can hold (docs/protocol.md section 11): the model, the probe.

    Args:
        model_bytes: The artifact's size.
        probe_bytes: The probe document's size.
        probe_data_bytes: The probe data blob's size, or None when it is inline.
        input_bytes: One sample's inputs (the probe feeds one sample at least).

    Raises:
        BuildError: (stage ``probe``) naming the size, the limit and what to change.
    """
    if model_bytes > MAX_MODEL_BYTES:
        raise BuildError(
            f"model.mnn is {model_bytes} bytes ({_mib(model_bytes)}), more than the "
            f"{MAX_MODEL_BYTES} bytes (2 GiB) any client loads: MNN's file format and a JVM "
            "array stop there",
            stage=STAGE,
            hint='Quantize the variant (quantization = { mode = "weight", bits = 8 } or '
            '"int8"), or ship a smaller model for this tier (a variant source).',
        )
    if probe_bytes > MAX_PROBE_BYTES:
        raise BuildError(
            f"the golden probe is {probe_bytes} bytes ({_mib(probe_bytes)}), more than the "
            f"{MAX_PROBE_BYTES} bytes (16 MiB) a client parses; its inputs "
            f"({input_bytes} bytes a sample) stay inline, so the outputs make it that large",
            stage=STAGE,
            hint="Declare fewer or smaller outputs for this model (the app-facing ones only), "
            "or a smaller input shape for this variant.",
        )
    if probe_data_bytes is not None and probe_data_bytes > MAX_PROBE_DATA_BYTES:
        raise BuildError(
            f"the golden probe's data is {probe_data_bytes} bytes "
            f"({_mib(probe_data_bytes)}) for one sample, more than the {MAX_PROBE_DATA_BYTES} "
            f"bytes ({_mib(MAX_PROBE_DATA_BYTES)}) a client holds",
            stage=STAGE,
            hint="Declare a smaller input shape for this variant (its tier's devices run it "
            "at that size; `shape` under [[models.<name>.variants.<variant>.inputs]]), or "
            "fewer or smaller outputs.",
        )


def probe_bytes(probe: GoldenProbe) -> bytes:
    """The probe blob: canonical JSON, the bytes its digest names."""
    return to_bytes(probe)


def _row(tensor: np.ndarray, feed: InputFeed) -> np.ndarray:
    """The dataset row of a model tensor: the tensor without its batch axis."""
    return tensor if feed.batch_axis is None else np.take(tensor, 0, axis=feed.batch_axis)


def probe_outputs_on_host(
    artifact: Path, probe: GoldenProbe, contract: IOContract, *, threads: int = 1
) -> list[list[dict[str, list[float]]]]:
    """What the host's MNN CPU backend computes for the probe's inputs, in check_probe's form.

    Args:
        artifact: The model.mnn to run (the probe's own, or another to compare).
        probe: The probe.
        contract: The variant's I/O contract (for the state inputs' shapes).
        threads: CPU threads.
    """
    feeds = [
        InputFeed(spec.name, spec.dtype, tuple(int(d) for d in spec.shape), spec.batch_axis)
        for spec in contract.inputs
    ]
    by_name = {feed.name: feed for feed in feeds}
    steps = [step for case in probe.cases for step in case.steps]
    names = [tensor.name for tensor in steps[0].inputs]
    rows = {
        name: np.stack(
            [
                _row(
                    np.asarray(tensor.values(), dtype=by_name[name].dtype).reshape(tensor.shape),
                    by_name[name],
                )
                for step in steps
                for tensor in step.inputs
                if tensor.name == name
            ]
        )
        for name in names
    }
    case_ids = np.concatenate(
        [np.full(len(case.steps), index, np.int64) for index, case in enumerate(probe.cases)]
    )
    state = [(a, b) for a, b in probe.state]
    output_names = [tensor.name for tensor in steps[0].expected] + [b for _, b in state]
    computed = toolchain.run_inference(
        artifact,
        rows,
        feeds=feeds,
        output_names=output_names,
        state=state,
        sequences=case_ids if state else None,
        batch_size=1,
        threads=threads,
    )
    result: list[list[dict[str, list[float]]]] = []
    position = 0
    for case in probe.cases:
        case_out = []
        for step in case.steps:
            case_out.append(
                {
                    t.name: np.asarray(computed[t.name][position], np.float64).reshape(-1).tolist()
                    for t in step.expected
                }
            )
            position += 1
        result.append(case_out)
    return result


def check_on_host(
    artifact: Path,
    probe: GoldenProbe,
    contract: IOContract,
    *,
    threads: int = 1,
    data: bytes | None = None,
    api: str = "module",
) -> ProbeResult:
    """Run the reference client's self-test on the host's CPU backend, as a device does.

    The same code a device runs (:func:`edgereg.client._selftest.try_backend`:
    state inputs start as zeros of the contract's dtype and shape), in a child
    process so a crash in MNN fails the stage, not the build. ``data`` is the
    probe's data blob (:func:`split_probe`), read back as a client reads it.
    ``api`` is the MNN API the runner calls: ``module``
    (:class:`~edgereg.client.MnnRunner`) or ``session``
    (:class:`~edgereg.client.SessionRunner`), as the entry tells the app.

    Raises:
        BuildError: (stage ``probe``) the child crashed or wrote no result.
    """
    with scratch_dir() as scratch:
        (scratch / "probe.json").write_bytes(probe_bytes(probe))
        if data is not None:
            (scratch / "probe-data.bin").write_bytes(data)
        request = {
            "artifact": str(Path(artifact).resolve()),
            "probe": str(scratch / "probe.json"),
            "probe_data": None if data is None else str(scratch / "probe-data.bin"),
            "api": api,
            "contract": contract.model_dump(mode="json"),
            "threads": threads,
            "result": str(scratch / "result.json"),
        }
        (scratch / "request.json").write_text(json.dumps(request), encoding="utf-8")
        package_root = str(Path(__file__).resolve().parents[2])
        path = os.environ.get("PYTHONPATH")
        env = {
            **os.environ,
            "PYTHONPATH": package_root if not path else os.pathsep.join([package_root, path]),
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        proc = subprocess.run(
            [
                sys.executable,
                "-X",
                "faulthandler",
                "-m",
                "edgereg.build._probe_child",
                str(scratch / "request.json"),
            ],
            cwd=scratch,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            timeout=_SELF_TEST_TIMEOUT,
            check=False,
        )
        result_file = scratch / "result.json"
        if proc.returncode != 0 or not result_file.is_file():
            raise BuildError(
                "the client's self-test on the host CPU stopped "
                f"({describe_status(proc.returncode)})",
                stage=STAGE,
                tool="MNN",
                exit_status=proc.returncode,
                output_tail=tail(proc.stdout.decode("utf-8", "replace")),
            )
        result = json.loads(result_file.read_text(encoding="utf-8"))
    verdict = result.get("verdict")
    if verdict is not None:
        return ProbeResult(**verdict)
    # The model did not load or a forward raised: no numbers, the reason is the failure.
    return ProbeResult(
        passed=False,
        worst_cosine=-1.0,
        worst_abs_error=math.inf,
        failure=str(result.get("detail") or result.get("outcome")),
    )
