"""Child-process entry point: the only place that imports MNN and ``_tools``.

Run as a script, never imported by the library::

    python -P -X faulthandler _worker.py REQUEST.json

The parent (:mod:`edgereg.toolchain._process`) starts it in a fresh scratch
directory, because the MNN tools write scratch files into the current
directory, print from C++ to file descriptor 1, can abort or segfault, and are
not safe to call twice in one process. Requests and results travel as files
(JSON, ``.npz``), never through stdout, which belongs to MNN's chatter.

This file depends on nothing but the standard library, numpy and MNN, so it
starts fast and runs even where the ``edgereg`` package is not importable.
It deliberately never imports ``MNN.tools``: that package runs ``pip
install`` and sends telemetry when imported.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

# Exit status of a worker that caught an error and wrote it to the result file.
EXIT_REPORTED_ERROR = 3


def _line_buffer_c_stdout() -> None:
    """Make C stdio flush each line, so a crash loses no output we could show.

    With stdout on a pipe, glibc buffers 4 KiB: a segfault would swallow the
    converter's last messages, which are the ones that explain the crash.
    """
    try:
        libc = ctypes.CDLL(None)
        for symbol in ("stdout", "__stdoutp"):
            try:
                stream = ctypes.c_void_p.in_dll(libc, symbol)
            except ValueError:
                continue
            libc.setvbuf(stream, None, 1, 0)  # _IOLBF
            return
    except OSError:
        return


def _mnn() -> Any:
    import MNN

    return MNN


def _rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports KiB, macOS bytes.
    return float(peak) / (1024.0 * 1024.0 if sys.platform == "darwin" else 1024.0)


def _describe(path: str) -> dict[str, Any]:
    """Load a model as a module and return what it says about itself."""
    mnn = _mnn()
    try:
        module = mnn.nn.load_module_from_file(path, [], [])
    except Exception as exc:  # MNN raises SystemError for unreadable models.
        return {"loaded": False, "load_error": f"{type(exc).__name__}: {exc}"}
    if module is None:
        return {"loaded": False, "load_error": "load_module_from_file returned None"}
    info = module.get_info()
    # get_model_uuid segfaults on unreadable files: only ask after a load.
    return {
        "loaded": True,
        "version": str(info.get("version", "")),
        "biz_code": str(info.get("bizCode", "")),
        "uuid": str(mnn.get_model_uuid(path)),
        "input_names": [str(n) for n in info["inputNames"]],
        "output_names": [str(n) for n in info["outputNames"]],
        "input_shapes": [[int(d) for d in v.shape] for v in info["inputs"]],
    }


def _module(path: str, inputs: list[str], outputs: list[str], threads: int) -> Any:
    mnn = _mnn()
    # load_module_from_file(thread_num=...) is ignored in 3.6.1: a runtime
    # manager is the only way to set the thread count.
    runtime = mnn.nn.create_runtime_manager(
        ({"backend": "CPU", "numThread": threads, "precision": "normal"},)
    )
    module = mnn.nn.load_module_from_file(path, inputs, outputs, runtime_manager=runtime)
    if module is None:
        raise RuntimeError(f"MNN could not load {path}")
    return module


def _forward(module: Any, arrays: list[np.ndarray]) -> list[np.ndarray]:
    # numpy is imported where needed: a bare conversion should not pay for it.
    import numpy as np

    expr = _mnn().expr
    info = module.get_info()["inputs"]
    variables = []
    for array, spec in zip(arrays, info, strict=True):
        # MNN takes int64 graph inputs (token ids, a sample rate) as int32.
        if spec.dtype == expr.int:
            value = np.ascontiguousarray(np.asarray(array), dtype=np.int32)
            var = expr.const(value, list(value.shape), expr.NCHW, expr.int)
        elif spec.dtype == expr.uint8:
            value = np.ascontiguousarray(np.asarray(array), dtype=np.uint8)
            var = expr.const(value, list(value.shape), expr.NCHW, expr.uint8)
        else:
            value = np.ascontiguousarray(np.asarray(array), dtype=np.float32)
            var = expr.const(value, list(value.shape), expr.NCHW)
        if spec.data_format != expr.NCHW:
            var = expr.convert(var, spec.data_format)
        variables.append(var)
    outputs = module.forward(variables)
    result = []
    for out in outputs:
        if out.data_format == expr.NC4HW4:
            out = expr.convert(out, expr.NCHW)
        # Copy: the module may reuse the buffer on the next forward.
        result.append(np.array(out.read(), copy=True))
    return result


def _module_at(name: str, path: Path) -> Any:
    """The module in ``path``, loaded by path as ``name``.

    Importing it through the ``edgereg`` package would run the package's
    imports (onnx, pydantic) in every child.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def _streaming() -> Any:
    """The shared runner (``_streaming.py`` beside this file)."""
    return _module_at("_edgereg_streaming", Path(__file__).with_name("_streaming.py"))


def _memory(req: dict[str, Any]) -> dict[str, Any]:
    """Peak and steady memory, MNN's own accounting, first and steady latency."""
    module = _module_at("_edgereg_memory_worker", Path(__file__).with_name("_memory_worker.py"))
    result: dict[str, Any] = module.measure(req)
    return result


def _op_list(_: dict[str, Any]) -> dict[str, Any]:
    import _tools

    return {"ret": bool(_tools.mnnconvert(["mnnconvert", "-f", "ONNX", "--OP"]))}


def _convert(req: dict[str, Any]) -> dict[str, Any]:
    import _tools

    ret = bool(_tools.mnnconvert(list(req["argv"])))
    out = Path(req["output"])
    result: dict[str, Any] = {"ret": ret, "exists": out.is_file()}
    if out.is_file() and req.get("describe", True):
        result["model"] = _describe(str(out))
    return result


def _quantize(req: dict[str, Any]) -> dict[str, Any]:
    # numpy is imported where needed: a bare conversion should not pay for it.
    import _tools
    import numpy as np

    # _tools.mnnquant takes one list (argv); the packaged `mnnquant` command
    # passes three strings and aborts.
    ret = bool(_tools.mnnquant(["mnnquant", req["src"], req["dst"], req["config"]]))
    out = Path(req["dst"])
    result: dict[str, Any] = {"ret": ret, "exists": out.is_file()}
    if not out.is_file():
        return result
    result["model"] = _describe(str(out))
    if result["model"]["loaded"] and req.get("probe"):
        # The quantizer can write a model that loads but computes NaN (EMA on
        # a layer whose output is constant): run the probe samples through it.
        names = list(req["input_names"])
        module = _module(str(out), names, [], 1)
        bad = []
        with np.load(req["probe"]) as probe:
            arrays = [probe[n] for n in names]
        for index in range(arrays[0].shape[0]):
            outputs = _forward(module, [a[index] for a in arrays])
            if not all(bool(np.isfinite(o).all()) for o in outputs):
                bad.append(index)
        result["nonfinite_samples"] = bad
    return result


_BARE_NONFINITE = re.compile(r"([\[,:]\s*)(-?nan|-?inf)(?=\s*[,\]}])")


def _ops(req: dict[str, Any]) -> dict[str, Any]:
    import _tools

    # The converter reads an .mnn back (-f MNN) and writes it as JSON: the only
    # way to the op names and types that skip_quant_op_names matches.
    out = Path(req["output"])
    _tools.mnnconvert(
        ["mnnconvert", "-f", "MNN", "--modelFile", req["path"], "--JsonFile", str(out)]
    )
    if not out.is_file():
        raise RuntimeError(f"MNN wrote no JSON for {req['path']}")
    # MNN prints a non-finite float as a bare nan or inf (a quantized layer whose
    # scale came out NaN, which the gates then catch): JSON spells them otherwise.
    text = _BARE_NONFINITE.sub(
        lambda m: m.group(1) + ("NaN" if "nan" in m.group(2) else m.group(2)[:-3] + "Infinity"),
        out.read_text(encoding="utf-8"),
    )
    model = json.loads(text)
    return {
        "ops": [
            {"name": str(op.get("name", "")), "type": str(op.get("type", ""))}
            for op in model.get("oplists", [])
        ]
    }


def _load(req: dict[str, Any]) -> dict[str, Any]:
    return {"model": _describe(req["path"])}


def _infer(req: dict[str, Any]) -> dict[str, Any]:
    # numpy is imported where needed: a bare conversion should not pay for it.
    import numpy as np

    streaming = _streaming()
    feeds = [streaming.InputFeed.from_json(raw) for raw in req["feeds"]]
    names = [feed.name for feed in feeds]
    out_names = list(req["output_names"])
    module = _module(req["path"], names, out_names, int(req["threads"]))
    if not out_names:
        out_names = [str(n) for n in module.get_info()["outputNames"]]

    def forward(tensors: Any) -> dict[str, Any]:
        values = _forward(module, [tensors[name] for name in names])
        return dict(zip(out_names, values, strict=True))

    with np.load(req["inputs"]) as data:
        rows = {name: data[name] for name in data.files if name != "__sequences__"}
        sequences = data["__sequences__"] if "__sequences__" in data.files else None
    result = streaming.run_rows(
        forward,
        feeds,
        out_names,
        rows,
        state=[tuple(pair) for pair in req["state"]],
        sequences=sequences,
        batch_size=int(req["batch_size"]),
    )
    np.savez(req["output"], **result.outputs)
    return {"batch_size": result.batch_size, "output_names": out_names}


def _bench(req: dict[str, Any]) -> dict[str, Any]:
    # numpy is imported where needed: a bare conversion should not pay for it.
    import numpy as np

    began = time.perf_counter()
    names = list(req["input_names"])
    memory: dict[str, Any] | None = None
    if req.get("memory") is not None:
        # First, while nothing else is loaded: the process is as fresh as a
        # worker of its own would be, without paying for a second start.
        try:
            memory = _memory({**req, **req["memory"]})
        except Exception as exc:  # the shape MNN refuses: reported, not fatal here
            memory = {"error": f"{type(exc).__name__}: {exc}"}
    with np.load(req["inputs"]) as data:
        arrays = [data[n] for n in names]
    per_threads: dict[str, dict[str, float]] = {}
    load_ms = 0.0
    sweep = req.get("sweep")
    kept: dict[int, Any] = {}  # runtimes the sweep reuses, loaded and warm
    for threads in req["threads"]:
        start = time.perf_counter()
        module = _module(req["path"], names, list(req["output_names"]), int(threads))
        loaded = (time.perf_counter() - start) * 1000.0
        load_ms = loaded if not load_ms else min(load_ms, loaded)
        for _ in range(int(req["warmup"])):
            _forward(module, arrays)
        times = []
        for _ in range(int(req["iterations"])):
            t0 = time.perf_counter()
            _forward(module, arrays)  # reads every output, forcing compute
            times.append((time.perf_counter() - t0) * 1000.0)
        per_threads[str(threads)] = {
            "p50": float(np.percentile(times, 50)),
            "p90": float(np.percentile(times, 90)),
            "mean": float(np.mean(times)),
        }
        if sweep is not None and int(threads) in sweep["counts"]:
            kept[int(threads)] = module
        del module
    # The benchmark's peak, before the sweep holds a runtime per count.
    result: dict[str, Any] = {"load_ms": load_ms, "latency": per_threads, "peak_rss_mb": _rss_mb()}
    if sweep is not None:
        result["sweep"] = _sweep(req, sweep, arrays, kept, began)
    if memory is not None:
        result["memory"] = memory
    return result


def _sweep(
    req: dict[str, Any],
    sweep: dict[str, Any],
    arrays: list[np.ndarray],
    kept: dict[int, Any],
    began: float,
) -> dict[str, Any]:
    """The host thread sweep (``edgereg/build/threads.py``, loaded by path): interleaved rounds.

    Its budget is its share of the build so far: the parent's stages before
    this one (``prior_seconds``) and this child's own time until now.
    """
    threads = _module_at("_edgereg_threads", Path(__file__).parents[1] / "build" / "threads.py")
    policy = threads.SweepPolicy(**sweep["policy"])
    so_far = float(sweep["prior_seconds"]) + time.perf_counter() - began
    modules = dict(kept)

    def prepare(count: int) -> bool:
        if count in modules:  # the benchmark's own: loaded and warm
            return False
        modules[count] = _module(
            req["path"], list(req["input_names"]), list(req["output_names"]), count
        )
        return True

    run = threads.run_sweep(
        [int(n) for n in sweep["counts"]],
        lambda count: _forward(modules[count], arrays),
        clock=time.perf_counter,
        budget_seconds=policy.budget_seconds(so_far),
        policy=policy,
        prepare=prepare,
    )
    result: dict[str, Any] = run.to_json()
    return result


_OPS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    "op_list": _op_list,
    "convert": _convert,
    "quantize": _quantize,
    "load": _load,
    "ops": _ops,
    "infer": _infer,
    "bench": _bench,
    "memory": _memory,
}


def main(argv: list[str]) -> int:
    """Run the request in ``argv[1]`` and write its result file.

    Args:
        argv: ``sys.argv``.

    Returns:
        0 on success, :data:`EXIT_REPORTED_ERROR` when an exception was caught
        and written to the result file.
    """
    _line_buffer_c_stdout()
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    result_path = Path(request["result"])
    try:
        result = _OPS[request["op"]](request)
        result["ok"] = True
        status = 0
    except Exception as exc:
        result = {
            "ok": False,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
        status = EXIT_REPORTED_ERROR
    result["peak_rss_mb"] = result.get("peak_rss_mb", _rss_mb())
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, result_path)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
