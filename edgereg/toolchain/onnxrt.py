"""Reference outputs from ONNX Runtime, in process.

ONNX Runtime is well behaved in process (no stdout chatter, no crashes on
reuse), so unlike MNN it needs no child. Sessions run single-threaded and
sequentially so that the reference is the same on every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from edgereg.errors import BuildError

#: Stage named in errors raised here.
STAGE = "reference"


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run_onnx(
    onnx_path: Path | str,
    inputs: Mapping[str, np.ndarray],
    *,
    batch_size: int = 1,
    output_names: Sequence[str] | None = None,
) -> dict[str, np.ndarray]:
    """Run a whole dataset through an ONNX model with ONNX Runtime.

    Args:
        onnx_path: The model.
        inputs: Input name to array with the samples on axis 0, ``(N, ...)``.
        batch_size: Samples per run when every input has a dynamic first
            dimension; a model with a fixed batch runs one sample at a time.
        output_names: Outputs to return; defaults to every graph output.

    Returns:
        Output name to array of ``N`` stacked results.

    Raises:
        ValueError: Inputs missing or of different lengths.
        BuildError: (stage ``reference``) ONNX Runtime cannot load or run it.
    """
    path = Path(onnx_path)
    try:
        session = _session(path)
    except Exception as exc:
        raise BuildError(
            f"ONNX Runtime cannot load {path}: {exc}", stage=STAGE, tool="onnxruntime"
        ) from exc
    specs = session.get_inputs()
    arrays: dict[str, np.ndarray] = {}
    for spec in specs:
        if spec.name not in inputs:
            raise ValueError(f"no data for input {spec.name!r}; got {', '.join(inputs) or 'none'}")
        arrays[spec.name] = np.asarray(inputs[spec.name])
    sizes = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(
            f"inputs must share a non-zero first (sample) dimension; got {sorted(sizes)}"
        )
    total = sizes.pop()
    dynamic = all(spec.shape and not isinstance(spec.shape[0], int) for spec in specs)
    batch = max(1, min(batch_size, total)) if dynamic else 1
    names = (
        list(output_names) if output_names is not None else [o.name for o in session.get_outputs()]
    )
    chunks: dict[str, list[np.ndarray]] = {name: [] for name in names}
    for start in range(0, total, batch):
        feed = {name: a[start : start + batch] for name, a in arrays.items()}
        try:
            results = session.run(names, feed)
        except Exception as exc:
            raise BuildError(
                f"ONNX Runtime failed on samples {start}-{start + batch - 1} of {path.name}: {exc}",
                stage=STAGE,
                tool="onnxruntime",
            ) from exc
        for name, value in zip(names, results, strict=True):
            array = np.asarray(value)
            if batch == 1 and array.shape[:1] != (1,):
                array = array[np.newaxis]  # an output without a batch axis
            chunks[name].append(array)
    return {name: np.concatenate(parts, axis=0) for name, parts in chunks.items()}
