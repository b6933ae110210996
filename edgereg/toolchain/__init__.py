"""The toolchain: pinned-version checks and every call into MNN and ONNX tools.

Each MNN tool call runs in a child process in its own scratch directory, with
a timeout; crashes, timeouts and silent failures become
:class:`~edgereg.errors.BuildError` with the stage, tool, exit status and the
tail of the tool's output. Outputs are written atomically.
"""

from edgereg.toolchain._streaming import InputFeed, StreamResult, sequence_bounds
from edgereg.toolchain.memory import MemoryMeasurement, MemorySettings, measure_memory
from edgereg.toolchain.mnn import (
    BIZ_CODE,
    FEATURE_METHODS,
    FEATURE_METHODS_AUTO,
    WEIGHT_METHODS,
    BenchmarkResult,
    LatencyStats,
    LayerError,
    MnnModelInfo,
    MnnOp,
    QuantInput,
    ToolRun,
    benchmark,
    convert,
    make_deterministic,
    mnn_runtime_version,
    model_info,
    model_ops,
    parse_layer_errors,
    quantize,
    run_inference,
    write_calibration,
)
from edgereg.toolchain.onnx_check import (
    OnnxReport,
    TensorSpec,
    inspect_onnx,
    parse_op_listing,
    supported_onnx_ops,
    unsupported_ops,
)
from edgereg.toolchain.onnxrt import run_onnx
from edgereg.toolchain.versions import (
    TOOLCHAIN_PACKAGES,
    check_versions,
    installed_version,
    installed_versions,
)

__all__ = [
    "BIZ_CODE",
    "FEATURE_METHODS",
    "FEATURE_METHODS_AUTO",
    "TOOLCHAIN_PACKAGES",
    "WEIGHT_METHODS",
    "BenchmarkResult",
    "InputFeed",
    "LatencyStats",
    "LayerError",
    "MemoryMeasurement",
    "MemorySettings",
    "MnnModelInfo",
    "MnnOp",
    "OnnxReport",
    "QuantInput",
    "StreamResult",
    "TensorSpec",
    "ToolRun",
    "benchmark",
    "check_versions",
    "convert",
    "inspect_onnx",
    "installed_version",
    "installed_versions",
    "make_deterministic",
    "measure_memory",
    "mnn_runtime_version",
    "model_info",
    "model_ops",
    "parse_layer_errors",
    "parse_op_listing",
    "quantize",
    "run_inference",
    "run_onnx",
    "sequence_bounds",
    "supported_onnx_ops",
    "unsupported_ops",
    "write_calibration",
]
