"""Run one model under an isolated MNN runtime: a script for that runtime's own python.

Run as a script, never imported by the library::

    RUNTIME/bin/python -P -X faulthandler _runtime_probe.py REQUEST.json
    RUNTIME/bin/python -P -X faulthandler _runtime_probe.py --serve FD PARENT

The second form is a persistent worker (the ARM classes' emulators, see
:class:`edgereg.toolchain.arm.ClassWorker`): it imports MNN once, says so on
file descriptor ``FD``, then answers each request read from stdin (one JSON
line, without ``result``) with one JSON line on ``FD``, the same result a
one-shot run writes, until stdin closes or its parent (process ``PARENT``) dies.

The runtime is a virtual environment holding only ``mnn==X`` and numpy (see
:mod:`edgereg.toolchain.runtimes`), so this file imports nothing but the
standard library, numpy and MNN, and uses only MNN Python API that MNN 3.0
already had. Requests and results travel as files (JSON, ``.npz``), never
through stdout, which belongs to MNN's chatter.

Operations (``"op"`` in the request):

- ``version``: report the MNN and numpy versions the runtime imports.
- ``run``: load the model, feed each sample (a batch of one) through it in
  order and write the stacked outputs.

A result always says which phase failed (``import``, ``load``, ``forward``),
so the parent can tell a model the runtime refuses from one that crashes it.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

# Exit status of a probe that caught an error and wrote it to the result file.
EXIT_REPORTED_ERROR = 3
# Exit status of a serving probe whose parent died.
EXIT_PARENT_GONE = 4


def _versions() -> dict[str, str]:
    import MNN
    import numpy as np

    version = MNN.version() if hasattr(MNN, "version") else "unknown"
    return {"mnn_version": str(version), "numpy_version": str(np.__version__)}


def _load(path: str, inputs: list[str], outputs: list[str], precision: str = "normal") -> Any:
    import MNN

    # One thread and normal precision by default: the same arithmetic as the
    # build's inference child, so a difference in the outputs is the runtime's
    # own. ARM verification passes the variant's hint ("low" is fp16 on ARMv8.2+).
    runtime = MNN.nn.create_runtime_manager(
        ({"backend": "CPU", "numThread": 1, "precision": precision},)
    )
    module = MNN.nn.load_module_from_file(path, inputs, outputs, runtime_manager=runtime)
    if module is None:
        raise RuntimeError("load_module_from_file returned None")
    return module


def _forward(module: Any, arrays: list[Any]) -> list[Any]:
    import MNN
    import numpy as np

    expr = MNN.expr
    specs = module.get_info()["inputs"]
    variables = []
    for array, spec in zip(arrays, specs, strict=True):
        if spec.dtype == expr.int:
            var = expr.const(
                np.ascontiguousarray(array, dtype=np.int32), list(array.shape), expr.NCHW, expr.int
            )
        else:
            var = expr.const(
                np.ascontiguousarray(array, dtype=np.float32), list(array.shape), expr.NCHW
            )
        if spec.data_format != expr.NCHW:
            var = expr.convert(var, spec.data_format)
        variables.append(var)
    results = []
    for out in module.forward(variables):
        if out.data_format == expr.NC4HW4:
            out = expr.convert(out, expr.NCHW)
        # Copy: the module may reuse the buffer on the next forward.
        results.append(np.array(out.read(), copy=True))
    return results


def _run(req: dict[str, Any], result: dict[str, Any]) -> None:
    import numpy as np

    names = [str(n) for n in req["input_names"]]
    wanted = [str(n) for n in req["output_names"]]
    result["phase"] = "load"
    module = _load(req["model"], names, wanted, str(req.get("precision", "normal")))
    info = module.get_info()
    out_names = wanted or [str(n) for n in info["outputNames"]]
    result["model_version"] = str(info.get("version", ""))
    with np.load(req["inputs"]) as data:
        arrays = [data[n] for n in names]
    total = int(arrays[0].shape[0])
    result["phase"] = "forward"
    chunks: list[list[Any]] = [[] for _ in out_names]
    # "whole": each row is the full tensor of one forward (scalars, states);
    # otherwise a row is one sample of a batch-first input, fed as a batch of one.
    whole = bool(req.get("whole"))
    for index in range(total):
        result["sample"] = index
        outputs = _forward(module, [a[index] if whole else a[index : index + 1] for a in arrays])
        if len(outputs) != len(out_names):
            raise RuntimeError(
                f"the model returned {len(outputs)} outputs, expected {len(out_names)}"
            )
        for chunk, out in zip(chunks, outputs, strict=True):
            # Each sample's tensor as returned, stacked: the convention of
            # edgereg.toolchain.run_inference.
            chunk.append(out[np.newaxis])
    stacked = {name: np.concatenate(c, axis=0) for name, c in zip(out_names, chunks, strict=True)}
    np.savez(req["output"], **stacked)  # type: ignore[arg-type]
    result["output_names"] = out_names
    result["samples"] = total
    del result["sample"]


def _failure(exc: BaseException) -> dict[str, Any]:
    # MNN's loader raises "SystemError: ... returned a result with an
    # exception set"; the exception it chains says what failed.
    cause = exc.__cause__ or exc
    return {
        "ok": False,
        "error": f"{type(cause).__name__}: {cause}",
        "traceback": traceback.format_exc(),
    }


def _flush_c_stdio() -> None:
    """Flush what MNN's C++ printed (C stdio buffers it in a file), so it precedes the reply."""
    sys.stdout.flush()
    try:
        import ctypes

        ctypes.CDLL(None).fflush(None)
    except (ImportError, OSError, AttributeError):  # a runtime without ctypes
        pass


def _exit_with_parent(parent: int) -> None:
    """Exit within a second of the death of ``parent``, even in the middle of a request.

    Stdin closes when the parent dies, but it is read only between requests,
    and an emulated request can take minutes. The parent's id comes from the
    parent itself: one that died before this started has been replaced already.
    """

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(EXIT_PARENT_GONE)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def serve(reply_fd: int, parent: int) -> int:
    """Answer requests from stdin on ``reply_fd`` until stdin closes (see the module docstring).

    Returns:
        0 when stdin closed, :data:`EXIT_REPORTED_ERROR` when MNN does not import.
    """
    _exit_with_parent(parent)
    reply = os.fdopen(reply_fd, "w", encoding="utf-8")

    def send(result: dict[str, Any]) -> None:
        _flush_c_stdio()
        reply.write(json.dumps(result) + "\n")
        reply.flush()

    ready: dict[str, Any] = {"phase": "import"}
    try:
        ready.update(_versions(), ok=True)
    except Exception as exc:  # the parent words it as a broken runtime
        ready.update(_failure(exc))
        send(ready)
        return EXIT_REPORTED_ERROR
    send(ready)
    versions = {k: ready[k] for k in ("mnn_version", "numpy_version")}
    for line in sys.stdin:
        request = json.loads(line)
        result: dict[str, Any] = {"phase": "import", **versions}
        try:
            if request["op"] == "run":
                _run(request, result)
            result["ok"] = True
        except Exception as exc:  # every failure goes back to the parent as data
            result.update(_failure(exc))
        send(result)
    return 0


def main(argv: list[str]) -> int:
    """Run the request in ``argv[1]`` and write its result file.

    Returns:
        0 on success, :data:`EXIT_REPORTED_ERROR` when an exception was caught
        and written to the result file.
    """
    if argv[1] == "--serve":
        return serve(int(argv[2]), int(argv[3]))
    request = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    result_path = Path(request["result"])
    result: dict[str, Any] = {"phase": "import"}
    status = 0
    try:
        result.update(_versions())
        if request["op"] == "run":
            _run(request, result)
        result["ok"] = True
    except Exception as exc:  # every failure goes back to the parent as data
        result.update(_failure(exc))
        status = EXIT_REPORTED_ERROR
    tmp = result_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result), encoding="utf-8")
    os.replace(tmp, result_path)
    sys.stdout.flush()
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv))
