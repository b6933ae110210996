"""Converting, quantizing, fingerprinting, running and timing MNN models.

Every call that needs MNN runs it in a child process in its own scratch
directory (see :mod:`edgereg.toolchain._process`); this module only prepares
inputs, checks what came back and moves finished files into place. A file is
written to its destination only once it exists, loads, and (for the
quantizer) computes finite numbers; before that the destination is removed, so
a failure never leaves an old or half-written model behind.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from edgereg._files import atomic_write
from edgereg.errors import BuildError
from edgereg.toolchain import _mnnfile
from edgereg.toolchain._process import (
    WorkerRun,
    remove_stale,
    run_worker,
    scratch_dir,
    tail,
)
from edgereg.toolchain._streaming import InputFeed, default_feeds
from edgereg.toolchain.memory import MemoryMeasurement, MemorySettings, parse_memory
from edgereg.toolchain.versions import installed_version

#: Written into every model's ``bizCode`` field.
BIZ_CODE = "edgereg"

FeatureMethod = Literal["KL", "ADMM", "EMA"]
WeightMethod = Literal["MAX_ABS", "ADMM"]
FEATURE_METHODS: tuple[str, ...] = ("KL", "ADMM", "EMA")
#: The order ``method = "auto"`` tries them in (EMA before ADMM: cheaper, and it
#: survives graphs where KL divides by zero).
FEATURE_METHODS_AUTO: tuple[str, ...] = ("KL", "EMA", "ADMM")
#: How many calibration samples are run through a quantized model to check
#: that it computes finite numbers.
PROBE_SAMPLES = 32
WEIGHT_METHODS: tuple[str, ...] = ("MAX_ABS", "ADMM")

_NOT_SUPPORTED = re.compile(r"These Op Not Support:\s*(.*)")
_LAYER_LINE = re.compile(
    r"^(?P<tensor>.+?):\s+cos distance:\s*(?P<cos>\S+),\s*overflow ratio:\s*(?P<overflow>\S+)\s*$"
)
# The quantizer switches to EMA by itself when a BatchNorm is left in the graph.
_FORCED_EMA = "use EMA quantize method instead"
_TENSOR_SUFFIX = re.compile(r"\s+(?:input|output)_tensor_\d+$")


@dataclass(frozen=True)
class MnnModelInfo:
    """What a loaded ``.mnn`` file says about itself.

    Attributes:
        version: MNN version of the converter that wrote it (``"<2.0.0"`` for
            models too old to record one). A runtime at least this new loads it.
        biz_code: The ``bizCode`` field.
        uuid: The ``mnn_uuid`` field; empty when the model has none.
        input_names: Input names, in the order the module takes them.
        output_names: Output names.
        input_shapes: Default input shapes; dynamic dimensions show as 1.
    """

    version: str
    biz_code: str
    uuid: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    input_shapes: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class LayerError:
    """Quantization error of one tensor, from the quantizer's debug report.

    Attributes:
        tensor: The quantizer's label, ``"<op name> output_tensor_0"``.
        op: The op name, the value to put in ``skip_quant_op_names``.
        cosine: Mean cosine similarity between float and fake-quantized
            values (MNN calls it "cos distance"; 1.0 is perfect). NaN when MNN
            could not compute it (an all-zero tensor, for example).
        overflow_ratio: Mean share of values clipped by the int8 range.
    """

    tensor: str
    op: str
    cosine: float
    overflow_ratio: float


@dataclass(frozen=True)
class ToolRun:
    """One successful tool call.

    Attributes:
        argv: The tool's argument list as run, except that the output path is
            the final destination rather than the scratch file written first.
        duration: Wall-clock seconds of the child process.
        output: Everything the tool printed.
        model: What the written model says about itself (None when the
            caller skipped the load check).
        uuid: The model's id after the run (derived from the seed when one
            was given; None when the model carries none).
        layer_errors: Per-tensor quantization error, worst (lowest cosine)
            first; empty unless the quantizer ran in debug mode with KL/ADMM.
        config: The quantizer configuration used (empty for conversion);
            ``feature_quantize_method_used`` is added when MNN replaced the
            requested method with EMA (a BatchNorm left in the graph).
    """

    argv: tuple[str, ...]
    duration: float
    output: str
    model: MnnModelInfo | None
    uuid: str | None = None
    layer_errors: tuple[LayerError, ...] = ()
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QuantInput:
    """One model input as the quantizer is to feed it.

    Attributes:
        name: Input name.
        shape: Shape of one calibration sample including the batch dimension
            (normally 1), such as ``(1, 3, 224, 224)``; a list is accepted and
            stored as a tuple.
    """

    name: str
    shape: tuple[int, ...]

    def __init__(self, name: str, shape: Sequence[int]) -> None:
        object.__setattr__(self, "name", name)
        object.__setattr__(self, "shape", tuple(int(d) for d in shape))


@dataclass(frozen=True)
class LatencyStats:
    """Latency of one forward pass at one thread count, in milliseconds.

    A pass includes copying the input in and reading every output.

    Attributes:
        p50: Median.
        p90: 90th percentile.
        mean: Mean.
    """

    p50: float
    p90: float
    mean: float


@dataclass(frozen=True)
class BenchmarkResult:
    """Host benchmark of one model.

    Attributes:
        load_ms: Fastest model load (one load per thread count), milliseconds.
        latency_ms: Thread count to latency statistics (milliseconds).
        peak_rss_mb: Peak resident memory of the benchmark process, MiB.
        warmup: Untimed runs before timing, per thread count.
        iterations: Timed runs per thread count.
    """

    load_ms: float
    latency_ms: dict[int, LatencyStats]
    peak_rss_mb: float
    warmup: int
    iterations: int
    #: The memory measurement made first in the same process, when asked for.
    memory: MemoryMeasurement | None = None
    #: Why MNN could not run it (the shape it refused), when it failed.
    memory_error: str | None = None
    #: The thread sweep's rounds, when asked for (``edgereg.build.threads.SweepRun.to_json``).
    sweep: dict[str, Any] | None = None


def _savez(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    # numpy's stubs type **kwds as if they could be savez's own keyword args.
    np.savez(path, **arrays)  # type: ignore[arg-type]


def _info(raw: Mapping[str, Any]) -> MnnModelInfo:
    return MnnModelInfo(
        version=str(raw["version"]),
        biz_code=str(raw["biz_code"]),
        uuid=str(raw["uuid"]),
        input_names=tuple(raw["input_names"]),
        output_names=tuple(raw["output_names"]),
        input_shapes=tuple(tuple(int(d) for d in s) for s in raw["input_shapes"]),
    )


def _loaded_info(run: WorkerRun, *, stage: str, tool: str, what: str) -> MnnModelInfo:
    model = run.result.get("model") or {}
    if not model.get("loaded"):
        raise BuildError(
            f"{what} was written but MNN cannot load it: {model.get('load_error', 'unknown')}",
            stage=stage,
            tool=tool,
            exit_status=run.exit_status,
            output_tail=tail(run.output),
        )
    return _info(model)


def _converter_flags(
    *,
    fp16: bool,
    weight_quant_bits: int | None,
    weight_quant_block: int | None,
    weight_quant_asymmetric: bool,
    transformer_fuse: bool,
    optimize_prefer: int | None,
    target_version: str | None,
) -> list[str]:
    flags: list[str] = []
    if fp16:
        flags.append("--fp16")
    if weight_quant_bits is not None:
        if not 2 <= weight_quant_bits <= 8:
            raise ValueError(f"weight_quant_bits is {weight_quant_bits}; expected 2 to 8")
        # mnnconvert 3.6.1 reads `--weightQuantAsymmetric`, `=true` and
        # `=false` all as false; only `=1` / `=0` say what they mean.
        flags += [
            "--weightQuantBits",
            str(weight_quant_bits),
            f"--weightQuantAsymmetric={int(weight_quant_asymmetric)}",
        ]
    if weight_quant_block is not None:
        if weight_quant_bits is None:
            raise ValueError("weight_quant_block needs weight_quant_bits")
        if weight_quant_block <= 0:
            raise ValueError(
                f"weight_quant_block is {weight_quant_block}; expected a positive size"
            )
        flags += ["--weightQuantBlock", str(weight_quant_block)]
    if transformer_fuse:
        flags.append("--transformerFuse")
    if optimize_prefer is not None:
        if optimize_prefer not in (0, 1, 2):
            raise ValueError(f"optimize_prefer is {optimize_prefer}; expected 0, 1 or 2")
        flags += ["--optimizePrefer", str(optimize_prefer)]
    if target_version is not None:
        flags += ["--targetVersion", target_version]
    return flags


def convert(
    onnx_path: Path | str,
    out_path: Path | str,
    *,
    fp16: bool = False,
    weight_quant_bits: int | None = None,
    weight_quant_block: int | None = None,
    weight_quant_asymmetric: bool = True,
    transformer_fuse: bool = False,
    optimize_prefer: int | None = None,
    target_version: str | None = None,
    uuid_seed: bytes | None = None,
    check_load: bool = True,
    timeout: float = 600.0,
) -> ToolRun:
    """Convert an ONNX model to MNN with ``mnnconvert``.

    Args:
        onnx_path: Source model.
        out_path: Destination ``.mnn``; replaced atomically, removed first.
        fp16: Store weights as float16 (``--fp16``).
        weight_quant_bits: Weight-only quantization to 2-8 bits.
        weight_quant_block: Block size for block-wise weight quantization.
        weight_quant_asymmetric: Asymmetric weight quantization (MNN's default).
        transformer_fuse: Fuse attention and other transformer blocks.
        optimize_prefer: Graph optimization preference: 0 normal, 1 smallest,
            2 fastest.
        target_version: Oldest MNN runtime to stay compatible with, ``"3.0"``.
        uuid_seed: Replace the random ``mnn_uuid`` with one derived from these
            bytes (see :func:`make_deterministic`), so the same inputs give
            the same file.
        check_load: Load the result in a second child to prove it loads. A
            build that loads the model in a later stage anyway (inference)
            skips it: the load costs more than a small model's conversion.
        timeout: Seconds before the converter is killed.

    Returns:
        The run, with the converted model's info.

    Raises:
        ValueError: An option is out of range.
        BuildError: (stage ``convert``) The converter crashed, timed out,
            reported an unsupported operator or failure, or wrote a model that
            does not load. No file is left at ``out_path``.
    """
    source = Path(onnx_path).resolve()
    dest = Path(out_path).resolve()
    flags = _converter_flags(
        fp16=fp16,
        weight_quant_bits=weight_quant_bits,
        weight_quant_block=weight_quant_block,
        weight_quant_asymmetric=weight_quant_asymmetric,
        transformer_fuse=transformer_fuse,
        optimize_prefer=optimize_prefer,
        target_version=target_version,
    )
    remove_stale(dest)
    if not source.is_file():
        raise BuildError(f"{source} does not exist", stage="convert", tool="mnnconvert")
    dest.parent.mkdir(parents=True, exist_ok=True)
    head = ["mnnconvert", "-f", "ONNX", "--modelFile", str(source), "--MNNModel"]
    tail_args = ["--bizCode", BIZ_CODE, *flags]
    with scratch_dir(near=dest.parent) as scratch:
        written = scratch / dest.name
        run = run_worker(
            "convert",
            {
                "argv": [*head, str(written), *tail_args],
                "output": str(written),
                "describe": check_load and uuid_seed is None,
            },
            scratch=scratch,
            stage="convert",
            tool="mnnconvert",
            timeout=timeout,
        )
        missing = _NOT_SUPPORTED.search(run.output)
        if missing:
            ops = sorted({op.split("::")[-1] for op in missing.group(1).split()})
            raise BuildError(
                f"{source.name} uses operators the MNN converter does not support: "
                f"{', '.join(ops)}",
                stage="convert",
                tool="mnnconvert",
                exit_status=run.exit_status,
                output_tail=tail(run.output),
                hint="export the model without these operators (replace them with supported "
                "ones) or use an MNN version that supports them",
            )
        if "Converted Success!" not in run.output or not run.result.get("exists"):
            raise BuildError(
                f"mnnconvert did not convert {source.name} "
                f"({'no output file' if not run.result.get('exists') else 'no success message'})",
                stage="convert",
                tool="mnnconvert",
                exit_status=run.exit_status,
                output_tail=tail(run.output),
            )
        uuid = None
        if uuid_seed is not None:
            uuid = _patch_uuid(written, uuid_seed, stage="convert")
        info = None
        if check_load and uuid_seed is None:
            info = _loaded_info(run, stage="convert", tool="mnnconvert", what="the converted model")
            uuid = info.uuid
        elif check_load:
            load = run_worker(
                "load",
                {"path": str(written)},
                scratch=scratch,
                stage="convert",
                tool="MNN",
                timeout=timeout,
            )
            info = _loaded_info(load, stage="convert", tool="MNN", what="the converted model")
        written.replace(dest)
    return ToolRun(
        argv=(*head, str(dest), *tail_args),
        duration=run.duration,
        output=run.output,
        model=info,
        uuid=uuid,
    )


def _patch_uuid(path: Path, seed: bytes, *, stage: str) -> str | None:
    """Overwrite the model's id in place with one derived from ``seed``."""
    new_uuid = _mnnfile.derive_uuid(seed)
    try:
        patched, old = _mnnfile.replace_uuid(path.read_bytes(), new_uuid)
    except (OSError, _mnnfile.MnnFormatError) as exc:
        raise BuildError(
            f"cannot set a deterministic id in {path.name}: {exc}", stage=stage, tool="edgereg"
        ) from exc
    if old is None:
        return None
    # 36 bytes in place, not the whole file again: the file is the converter's
    # fresh output in the scratch directory, not yet anyone's artifact.
    with path.open("r+b") as file:
        file.seek(old.offset)
        file.write(patched[old.offset : old.offset + _mnnfile.UUID_LENGTH])
    return new_uuid


def parse_layer_errors(output: str) -> tuple[LayerError, ...]:
    """Parse the quantizer's debug report (``"<tensor>:  cos distance: …"``).

    Args:
        output: Everything ``mnnquant`` printed with ``"debug": true``.

    Returns:
        One entry per tensor, lowest cosine first, NaN last.
    """
    text = output.replace("\r", "\n")
    marker = text.rfind("Debug info:")
    errors = []
    for line in text[marker if marker >= 0 else 0 :].splitlines():
        match = _LAYER_LINE.fullmatch(line.strip())
        if not match:
            continue
        tensor = match.group("tensor")
        try:
            cosine = float(match.group("cos"))
            overflow = float(match.group("overflow"))
        except ValueError:
            continue
        errors.append(
            LayerError(
                tensor=tensor,
                op=_TENSOR_SUFFIX.sub("", tensor),
                cosine=cosine,
                overflow_ratio=overflow,
            )
        )
    errors.sort(key=lambda e: (math.isnan(e.cosine), e.cosine, e.tensor))
    return tuple(errors)


def _safe_relative(name: str) -> Path:
    # The quantizer opens "<sample dir>/<input name>.txt" verbatim.
    rel = Path(f"{name}.txt")
    if rel.is_absolute() or ".." in rel.parts:
        raise ValueError(f"input name {name!r} cannot be used as a calibration file name")
    return rel


def write_calibration(
    root: Path,
    inputs: Sequence[QuantInput],
    samples: Sequence[Mapping[str, np.ndarray]],
) -> None:
    """Write samples in MNN's ``"input_type": "sequence"`` calibration layout.

    One folder per sample (``000000``, ``000001``, … so the quantizer's sorted
    order is the given order), each with ``input.json``
    (``{"inputs": [{"name": …, "shape": […]}, …]}``) and one ``<name>.txt``
    of whitespace-separated floats per input.

    Args:
        root: Directory to fill (created).
        inputs: Every model input, with the shape one sample is fed with.
        samples: Input name to array; each array is reshaped to its input's
            shape, so ``(3, 8, 8)`` and ``(1, 3, 8, 8)`` both work.

    Raises:
        ValueError: No samples, a missing input, a size mismatch, or a value
            that is not finite.
    """
    if not samples:
        raise ValueError("quantization needs at least one calibration sample")
    if not inputs:
        raise ValueError("quantization needs the model's inputs")
    described = json.dumps(
        {"inputs": [{"name": i.name, "shape": [int(d) for d in i.shape]} for i in inputs]}
    )
    files = {i.name: _safe_relative(i.name) for i in inputs}
    for index, sample in enumerate(samples):
        folder = root / f"{index:06d}"
        folder.mkdir(parents=True)
        (folder / "input.json").write_text(described, encoding="utf-8")
        for spec in inputs:
            if spec.name not in sample:
                raise ValueError(f"calibration sample {index} has no input {spec.name!r}")
            array = np.asarray(sample[spec.name], dtype=np.float32)
            size = int(np.prod(spec.shape))
            if array.size != size:
                raise ValueError(
                    f"calibration sample {index} input {spec.name!r} has {array.size} values; "
                    f"shape {list(spec.shape)} needs {size}"
                )
            if not np.isfinite(array).all():
                raise ValueError(
                    f"calibration sample {index} input {spec.name!r} holds NaN or infinity"
                )
            target = folder / files[spec.name]
            target.parent.mkdir(parents=True, exist_ok=True)
            # %.9g round-trips float32 exactly.
            np.savetxt(target, array.reshape(-1), fmt="%.9g")


def quantize(
    src_mnn: Path | str,
    dst_mnn: Path | str,
    *,
    inputs: Sequence[QuantInput],
    samples: Sequence[Mapping[str, np.ndarray]],
    method: str = "KL",
    weight_method: str = "MAX_ABS",
    skip_ops: Sequence[str] = (),
    debug: bool = True,
    timeout: float = 600.0,
) -> ToolRun:
    """Fully quantize (int8 weights and activations) with ``mnnquant``.

    Calibration data is written in the sequence layout (see
    :func:`write_calibration`), so models with several or non-image inputs
    calibrate too.

    Args:
        src_mnn: Float model from :func:`convert`.
        dst_mnn: Destination; replaced atomically, removed first.
        inputs: Every model input with the shape of one sample.
        samples: Calibration samples, input name to array.
        method: Feature quantization method: ``KL``, ``ADMM`` or ``EMA``.
            MNN switches to EMA by itself when a BatchNorm is left in the graph.
        weight_method: ``MAX_ABS`` or ``ADMM``.
        skip_ops: Op names to keep in float (``skip_quant_op_names``).
        debug: Ask for the per-tensor error report (KL and ADMM only; it
            costs one more pass over the samples).
        timeout: Seconds before the quantizer is killed.

    Returns:
        The run, with ``layer_errors`` when debug output was produced.

    Raises:
        ValueError: Unknown method, or calibration data that does not fit.
        BuildError: (stage ``quantize``) The quantizer crashed, timed out,
            wrote nothing, or wrote a model that does not load or computes
            non-finite values on one of the first :data:`PROBE_SAMPLES`
            calibration samples. No file is left at ``dst_mnn``.
    """
    if method not in FEATURE_METHODS:
        raise ValueError(
            f"quantization method {method!r} is not one of {', '.join(FEATURE_METHODS)}"
        )
    if weight_method not in WEIGHT_METHODS:
        raise ValueError(
            f"weight quantization method {weight_method!r} is not one of "
            f"{', '.join(WEIGHT_METHODS)}"
        )
    source = Path(src_mnn).resolve()
    dest = Path(dst_mnn).resolve()
    remove_stale(dest)
    if not source.is_file():
        raise BuildError(f"{source} does not exist", stage="quantize", tool="mnnquant")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with scratch_dir(near=dest.parent) as scratch:
        calibration = scratch / "calibration"
        write_calibration(calibration, inputs, samples)
        # The first samples, stacked per input, each at its calibration shape.
        probe = samples[:PROBE_SAMPLES]
        _savez(
            scratch / "probe.npz",
            {
                i.name: np.stack(
                    [np.asarray(s[i.name], np.float32).reshape(i.shape) for s in probe]
                )
                for i in inputs
            },
        )
        config: dict[str, Any] = {
            "path": str(calibration),
            "used_sample_num": len(samples),
            "feature_quantize_method": method,
            "weight_quantize_method": weight_method,
            "feature_clamp_value": 127,
            "weight_clamp_value": 127,
            "quant_bits": 8,
            # EMA would otherwise batch by the model's batch size and, with
            # sequence input, feed only the last sample of each batch.
            "batch_size": 1,
            "skip_quant_op_names": list(skip_ops),
            "input_type": "sequence",
            "debug": bool(debug),
        }
        config_path = scratch / "quant.json"
        config_path.write_text(json.dumps(config, indent=1), encoding="utf-8")
        written = scratch / dest.name
        run = run_worker(
            "quantize",
            {
                "src": str(source),
                "dst": str(written),
                "config": str(config_path),
                "probe": str(scratch / "probe.npz"),
                "input_names": [i.name for i in inputs],
            },
            scratch=scratch,
            stage="quantize",
            tool="mnnquant",
            timeout=timeout,
        )
        if not run.result.get("exists"):
            raise BuildError(
                f"mnnquant wrote no model for {source.name}",
                stage="quantize",
                tool="mnnquant",
                exit_status=run.exit_status,
                output_tail=tail(run.output),
            )
        info = _loaded_info(run, stage="quantize", tool="mnnquant", what="the quantized model")
        layer_errors = parse_layer_errors(run.output)
        bad = list(run.result.get("nonfinite_samples", []))
        if bad:
            raise BuildError(
                f"the {method}-quantized model computes NaN or infinity on {len(bad)} of "
                f"{len(probe)} calibration samples tried (first: sample {bad[0]})",
                stage="quantize",
                tool="mnnquant",
                exit_status=run.exit_status,
                output_tail=tail(run.output),
                hint="try another method (KL or ADMM instead of EMA, or the reverse), or keep "
                "the failing layers in float with skip_ops in the variant's quantization table",
            )
        written.replace(dest)
    config["path"] = "<calibration>"
    if method != "EMA" and _FORCED_EMA in run.output:
        config["feature_quantize_method_used"] = "EMA"
    return ToolRun(
        argv=("mnnquant", str(source), str(dest), "<config>"),
        duration=run.duration,
        output=run.output,
        model=info,
        layer_errors=layer_errors,
        config=config,
    )


@dataclass(frozen=True)
class MnnOp:
    """One op of a converted model: the name ``skip_quant_op_names`` matches, and its type."""

    name: str
    type: str


def model_ops(mnn_path: Path | str, *, timeout: float = 120.0) -> list[MnnOp]:
    """The ops of an ``.mnn`` file in graph order (read back by the converter as JSON).

    MNN names each op after its output tensor, which is not always an ONNX
    node name (``…__matmul_converted``); the quantizer's skip list needs these.

    Raises:
        BuildError: (stage ``quantize``) the converter cannot read the model.
    """
    path = Path(mnn_path).resolve()
    with scratch_dir() as scratch:
        run = run_worker(
            "ops",
            {"path": str(path), "output": str(scratch / "model.json")},
            scratch=scratch,
            stage="quantize",
            tool="mnnconvert",
            timeout=timeout,
        )
    return [MnnOp(op["name"], op["type"]) for op in run.result["ops"]]


def model_info(mnn_path: Path | str, *, timeout: float = 120.0) -> MnnModelInfo:
    """Load a model in a child process and return what it records.

    Args:
        mnn_path: The ``.mnn`` file.
        timeout: Seconds before the child is killed.

    Returns:
        Its converter version, bizCode, UUID and input/output signature.

    Raises:
        BuildError: (stage ``inspect``) The file is missing or does not load.
    """
    path = Path(mnn_path).resolve()
    if not path.is_file():
        raise BuildError(f"{path} does not exist", stage="inspect", tool="MNN")
    with scratch_dir() as scratch:
        run = run_worker(
            "load",
            {"path": str(path)},
            scratch=scratch,
            stage="inspect",
            tool="MNN",
            timeout=timeout,
        )
    return _loaded_info(run, stage="inspect", tool="MNN", what=path.name)


def mnn_runtime_version(mnn_path: Path | str) -> str:
    """Return the oldest MNN runtime version promised to load this model.

    That is the converter version recorded in the model; a newer runtime
    loads older models, the reverse is not promised.

    Args:
        mnn_path: The ``.mnn`` file.

    Returns:
        A version such as ``"3.6.1"``; the installed MNN version when the
        model records none.
    """
    version = model_info(mnn_path).version
    if not version or version.startswith("<"):
        return installed_version("mnn") or version
    return version


def make_deterministic(mnn_path: Path | str, seed: bytes, *, timeout: float = 120.0) -> str | None:
    """Replace the model's random ``mnn_uuid`` with one derived from ``seed``.

    The converter writes a fresh UUID4 into every model; it is the only
    difference between two conversions of the same input. The field is found
    through the FlatBuffer tables, replaced in place (same length), the result
    checked to load and to report the new UUID, then moved over the original.

    Args:
        mnn_path: The ``.mnn`` file, patched in place.
        seed: Bytes that identify the build inputs (a digest of the source,
            options and toolchain, say).
        timeout: Seconds before the child that checks the result is killed.

    Returns:
        The new UUID, or None when the model has no UUID (the quantizer's EMA
        path writes none; its output is already deterministic).

    Raises:
        BuildError: (stage ``deterministic id``) The file cannot be read as
            an MNN model, the old UUID occurs more than once, or the patched
            file does not load. The original file is left unchanged.
    """
    stage = "deterministic id"
    path = Path(mnn_path).resolve()
    new_uuid = _mnnfile.derive_uuid(seed)
    try:
        data = path.read_bytes()
        patched, old = _mnnfile.replace_uuid(data, new_uuid)
    except (OSError, _mnnfile.MnnFormatError) as exc:
        raise BuildError(
            f"cannot set a deterministic id in {path}: {exc}", stage=stage, tool="edgereg"
        ) from exc
    if old is None:
        return None
    if patched == data:
        return new_uuid
    with scratch_dir(near=path.parent) as scratch:
        candidate = scratch / path.name
        candidate.write_bytes(patched)
        run = run_worker(
            "load",
            {"path": str(candidate)},
            scratch=scratch,
            stage=stage,
            tool="MNN",
            timeout=timeout,
        )
        info = _loaded_info(run, stage=stage, tool="MNN", what="the model with a deterministic id")
        if info.uuid != new_uuid:
            raise BuildError(
                f"MNN reads the patched id as {info.uuid!r}, not {new_uuid!r}",
                stage=stage,
                tool="MNN",
            )
    atomic_write(path, patched)
    return new_uuid


def _dataset(
    inputs: Mapping[str, np.ndarray], names: Sequence[str], stage: str
) -> dict[str, np.ndarray]:
    arrays = {}
    for name in names:
        if name not in inputs:
            raise ValueError(f"no data for input {name!r}; got {', '.join(inputs) or 'none'}")
        arrays[name] = np.ascontiguousarray(inputs[name])
    sizes = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            f"inputs must share a non-zero first (sample) dimension; got sizes {sorted(sizes)}"
        )
    return arrays


def run_inference(
    mnn_path: Path | str,
    rows: Mapping[str, np.ndarray],
    *,
    feeds: Sequence[InputFeed] | None = None,
    output_names: Sequence[str] | None = None,
    state: Sequence[tuple[str, str]] = (),
    sequences: np.ndarray | None = None,
    batch_size: int = 1,
    threads: int = 1,
    timeout: float = 600.0,
) -> dict[str, np.ndarray]:
    """Run a whole dataset through an MNN model in a child process, as an app would.

    Stateless models run in batches of ``batch_size`` when every input has a
    batch axis (one sample at a time otherwise, or when the graph fixes its
    batch); stateful models run each sequence step by step, feeding back
    their own state (see :func:`edgereg.toolchain._streaming.run_rows`).

    Args:
        mnn_path: The model.
        rows: Input name to ``(N, *row shape)`` (state inputs are not given).
        feeds: Every model input in the model's order, with dtype and batch
            axis; by default each array of ``rows`` is a batch-first input.
        output_names: Outputs to return (state outputs included); every
            model output by default.
        state: ``(input, output)`` state pairs.
        sequences: ``(N,)`` sequence ids of a stateful model's rows.
        batch_size: Samples per forward pass.
        threads: CPU threads.
        timeout: Seconds before the child is killed.

    Returns:
        Output name to ``(N, *tensor shape)``.

    Raises:
        ValueError: Inputs missing or of different lengths.
        BuildError: (stage ``inference``) MNN failed or crashed.
    """
    stage = "inference"
    path = Path(mnn_path).resolve()
    if not path.is_file():
        raise BuildError(f"{path} does not exist", stage=stage, tool="MNN")
    feeds = list(feeds) if feeds is not None else default_feeds(rows)
    state_inputs = {pair[0] for pair in state}
    arrays = _dataset(rows, [f.name for f in feeds if f.name not in state_inputs], stage)
    if sequences is not None:
        arrays["__sequences__"] = np.asarray(sequences, dtype=np.int64)
    with scratch_dir() as scratch:
        _savez(scratch / "inputs.npz", arrays)
        run = run_worker(
            "infer",
            {
                "path": str(path),
                "inputs": str(scratch / "inputs.npz"),
                "output": str(scratch / "outputs.npz"),
                "feeds": [feed.to_json() for feed in feeds],
                "output_names": list(output_names or []),
                "state": [list(pair) for pair in state],
                "batch_size": int(batch_size),
                "threads": int(threads),
            },
            scratch=scratch,
            stage=stage,
            tool="MNN",
            timeout=timeout,
        )
        with np.load(scratch / "outputs.npz") as data:
            return {name: np.array(data[name]) for name in run.result["output_names"]}


def benchmark(
    mnn_path: Path | str,
    sample: Mapping[str, np.ndarray],
    *,
    input_names: Sequence[str] | None = None,
    output_names: Sequence[str] | None = None,
    threads: tuple[int, ...] = (1, 2, 4),
    warmup: int = 5,
    iterations: int = 30,
    timeout: float = 600.0,
    memory: MemorySettings | None = None,
    sweep: Mapping[str, Any] | None = None,
) -> BenchmarkResult:
    """Time model load and forward passes on this host, in a child process.

    Args:
        mnn_path: The model.
        sample: One input batch, input name to array (batch dimension included).
        input_names: Inputs in the model's order; defaults to ``sample``'s order.
        output_names: Outputs to compute; defaults to every model output.
        threads: Thread counts to time, each with its own runtime.
        warmup: Untimed forward passes before timing, per thread count.
        iterations: Timed forward passes per thread count.
        timeout: Seconds before the child is killed.
        memory: Measure memory first, in the same fresh child
            (:func:`edgereg.toolchain.memory.measure_memory` without a process of its own).
        sweep: Then run the host thread sweep in the same child: ``counts``,
            ``prior_seconds`` (the build's seconds before this call, its
            budget's base) and ``policy`` (``edgereg.build.threads.SweepPolicy``).
            It ends by half of ``timeout``, and a sweep that fails is reported
            in its record (``stopped``: ``error``), not raised.

    Returns:
        Load time, per-thread-count latency, the child's peak RSS (before the
        sweep) and the sweep's rounds.

    Raises:
        ValueError: Bad counts or missing inputs.
        BuildError: (stage ``benchmark``) MNN failed or crashed.
    """
    if iterations < 1 or warmup < 0 or not threads or min(threads) < 1:
        raise ValueError("benchmark needs iterations >= 1, warmup >= 0 and thread counts >= 1")
    path = Path(mnn_path).resolve()
    if not path.is_file():
        raise BuildError(f"{path} does not exist", stage="benchmark", tool="MNN")
    names = list(input_names) if input_names is not None else list(sample)
    missing = [name for name in names if name not in sample]
    if missing:
        raise ValueError(f"no data for input(s) {', '.join(missing)}")
    # One forward's tensors as the model takes them (a scalar, a state).
    arrays = {name: np.ascontiguousarray(sample[name]) for name in names}
    with scratch_dir() as scratch:
        _savez(scratch / "inputs.npz", arrays)
        run = run_worker(
            "bench",
            {
                "path": str(path),
                "inputs": str(scratch / "inputs.npz"),
                "input_names": names,
                "output_names": list(output_names or []),
                "threads": [int(t) for t in threads],
                "warmup": int(warmup),
                "iterations": int(iterations),
                "memory": None if memory is None else memory.request(),
                # The sweep ends by half the child's timeout, whatever its budget.
                "sweep": None if sweep is None else {**sweep, "deadline_seconds": timeout / 2},
            },
            scratch=scratch,
            stage="benchmark",
            tool="MNN",
            timeout=timeout,
        )
    latency = {
        int(t): LatencyStats(p50=s["p50"], p90=s["p90"], mean=s["mean"])
        for t, s in run.result["latency"].items()
    }
    measured, error = None, None
    raw_memory = run.result.get("memory")
    if memory is not None and isinstance(raw_memory, dict):
        if "error" in raw_memory:
            error = str(raw_memory["error"])
        else:
            measured = parse_memory(raw_memory, memory.threads)
    return BenchmarkResult(
        load_ms=float(run.result["load_ms"]),
        latency_ms=latency,
        peak_rss_mb=float(run.result["peak_rss_mb"]),
        warmup=warmup,
        iterations=iterations,
        memory=measured,
        memory_error=error,
        sweep=run.result.get("sweep"),
    )
