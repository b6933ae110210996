"""Child-side memory and first-inference measurement (loaded by ``_worker.py`` by path).

Like ``_worker.py`` it depends on nothing but the standard library, numpy and
MNN. It uses MNN's session API (``MNN.Interpreter``), the one apps reach
through MNN's Android Java and iOS APIs, because only a session reports MNN's
own memory accounting (``getSessionInfo(session, 0)``, MiB) and the tensors
each op produces.

Resident memory is read from ``/proc/self/status``: the peak (``VmHWM``) is
reset through ``/proc/self/clear_refs`` once numpy, MNN and the inputs are in
memory, so what is measured is what loading the model and running it add to
a process that already holds its runtime and its data: what an app pays.
"""

from __future__ import annotations

import gc
import resource
import sys
import time
from typing import Any

#: How many of the largest tensors the runtime produced are reported.
LARGEST = 8
#: Bytes per value of the element type an op's type names (``Convolution [ DT_INT8 ] ``).
_WIDTHS = {"INT8": 1, "UINT8": 1, "HALF": 2, "BFLOAT16": 2, "INT16": 2, "FLOAT": 4, "INT32": 4}
_NAMES = {"INT8": "int8", "UINT8": "uint8", "HALF": "float16", "BFLOAT16": "bfloat16"}
_NAMES.update({"INT16": "int16", "FLOAT": "float32", "INT32": "int32"})


def op_output(op_type: str, reported: str, width: int) -> tuple[str, str, int]:
    """The op's type, its output's element type and bytes per value.

    MNN's session callback reports an int8 tensor with the float dtype (4
    bytes a value), but the op's type carries the element type it computes in
    (``"Convolution [ DT_INT8 ] "``): that one is the tensor's real width.
    """
    name, _, tag = op_type.partition("[")
    kind = tag.strip(" ]").removeprefix("DT_")
    if kind in _WIDTHS:
        return name.strip(), _NAMES[kind], _WIDTHS[kind]
    return name.strip(), reported, width


def _status_mb(key: str) -> float | None:
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024.0  # kB
    except OSError:
        return None
    return None


def _reset_peak() -> bool:
    """Reset VmHWM to the current resident size (Linux 4.0+); False where it cannot."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as clear:
            clear.write("5")
    except OSError:
        return False
    return True


def _peak_mb() -> float:
    hwm = _status_mb("VmHWM")
    if hwm is not None:
        return hwm
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return float(peak) / (1024.0 * 1024.0 if sys.platform == "darwin" else 1024.0)


def _rss_mb() -> float:
    rss = _status_mb("VmRSS")
    return _peak_mb() if rss is None else rss


def measure(req: dict[str, Any]) -> dict[str, Any]:
    """Load the model once, run it ``1 + warmup + iterations`` times, and say what it took.

    Request keys: ``path``, ``inputs`` (an ``.npz`` with one array per input,
    at the declared shape), ``input_names``, ``threads``, ``warmup``,
    ``iterations``.
    """
    began = time.perf_counter()
    import MNN
    import numpy as np

    names = list(req["input_names"])
    with np.load(req["inputs"]) as data:
        arrays = {name: np.ascontiguousarray(data[name]) for name in names}
    types = {
        id(MNN.Halide_Type_Int): (np.int32, 4),
        id(MNN.Halide_Type_Uint8): (np.uint8, 1),
        id(MNN.Halide_Type_Float): (np.float32, 4),
    }
    dtype_names = {np.int32: "int32", np.uint8: "uint8", np.float32: "float32"}
    gc.collect()
    exact = _reset_peak()
    baseline = _rss_mb()

    start = time.perf_counter()
    interpreter = MNN.Interpreter(req["path"])
    session = interpreter.createSession({"numThread": int(req["threads"])})
    inputs = interpreter.getSessionInputAll(session)
    missing = [name for name in names if name not in inputs]
    if missing:
        raise RuntimeError(f"the model has no input(s) {', '.join(missing)}")
    for name in names:
        interpreter.resizeTensor(inputs[name], tuple(int(d) for d in arrays[name].shape))
    interpreter.resizeSession(session)
    load_ms = (time.perf_counter() - start) * 1000.0
    runtime_mb = float(interpreter.getSessionInfo(session, 0))
    after_load = _peak_mb()

    def feed() -> None:
        for name in names:
            tensor = inputs[name]
            kind = tensor.getDataType()
            dtype = types.get(id(kind), (np.float32, 4))[0]
            value = np.ascontiguousarray(arrays[name], dtype=dtype)
            host = MNN.Tensor(tuple(value.shape), kind, value, MNN.Tensor_DimensionType_Caffe)
            tensor.copyFrom(host)

    outputs = interpreter.getSessionOutputAll(session)

    def read() -> None:
        # The app reads its outputs: a lazy backend computes on the copy.
        for tensor in outputs.values():
            host = MNN.Tensor(tensor, MNN.Tensor_DimensionType_Caffe)
            tensor.copyToHostTensor(host)

    cpu_ms: list[float] = []

    def run() -> float:
        # Wall time, and the CPU time every thread of the process spent: on a loaded
        # machine the wall time also counts the time the process waited for a core.
        t0, c0 = time.perf_counter(), time.process_time()
        feed()
        status = interpreter.runSession(session)
        read()
        if status != 0:
            raise RuntimeError(f"MNN runSession returned error code {status}")
        cpu_ms.append((time.process_time() - c0) * 1000.0)
        return (time.perf_counter() - t0) * 1000.0

    first_ms = run()
    after_first = _peak_mb()
    for _ in range(int(req["warmup"])):
        run()
    times = [run() for _ in range(int(req["iterations"]))]
    steady_rss = _rss_mb()
    peak = _peak_mb()

    produced: list[dict[str, Any]] = []

    def before(_tensors: Any, _op: Any) -> bool:
        return True

    def after(tensors: Any, op: Any) -> bool:
        for tensor in tensors:
            shape = [int(d) for d in tensor.getShape()]
            dtype, size = types.get(id(tensor.getDataType()), (np.float32, 4))
            op_type, element, size = op_output(str(op.getType()), dtype_names[dtype], size)
            count = 1
            for dim in shape:
                count *= max(dim, 0)
            produced.append(
                {
                    "op": str(op.getName()),
                    "type": op_type,
                    "dtype": element,
                    "shape": shape,
                    "mb": count * size / (1024.0 * 1024.0),
                }
            )
        return True

    # After the measured runs: the callbacks hold Python objects of their own.
    feed()
    interpreter.runSessionWithCallBackInfo(session, before, after)
    produced.sort(key=lambda row: (-row["mb"], row["op"]))
    return {
        "baseline_mb": baseline,
        "peak_reset": exact,
        "runtime_mb": runtime_mb,
        "load_peak_mb": max(after_load - baseline, 0.0),
        "first_peak_mb": max(after_first - baseline, 0.0),
        "peak_mb": max(peak - baseline, 0.0),
        "steady_mb": max(steady_rss - baseline, 0.0),
        "load_ms": load_ms,
        "first_ms": first_ms,
        "steady_ms": times,
        "first_cpu_ms": cpu_ms[0],
        "steady_cpu_ms": cpu_ms[len(cpu_ms) - len(times) :],
        "largest_tensors": produced[:LARGEST],
        "seconds": time.perf_counter() - began,
    }
