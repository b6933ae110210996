"""Reference outputs from ONNX Runtime, in process.

ONNX Runtime is well behaved in process (no stdout chatter, no crashes on
reuse), so unlike MNN it needs no child. Sessions run single-threaded and
sequentially so that the reference is the same on every run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from edgereg.errors import BuildError
from edgereg.toolchain._streaming import InputFeed, StreamResult, default_feeds, run_rows

if TYPE_CHECKING:  # imported where a session starts: `edgereg validate` never needs it
    import onnxruntime as ort

#: Stage named in errors raised here.
STAGE = "reference"


def _session(path: Path) -> ort.InferenceSession:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


def run_onnx(
    onnx_path: Path | str,
    rows: Mapping[str, np.ndarray],
    *,
    feeds: Sequence[InputFeed] | None = None,
    output_names: Sequence[str] | None = None,
    state: Sequence[tuple[str, str]] = (),
    sequences: np.ndarray | None = None,
    batch_size: int = 1,
) -> StreamResult:
    """Run a whole dataset through an ONNX model with ONNX Runtime, as an app would.

    The same runner as the MNN side (:func:`edgereg.toolchain._streaming.run_rows`):
    batches for stateless models, step-by-step streams that feed back the
    model's own state for stateful ones.

    Args:
        onnx_path: The model.
        rows: Input name to ``(N, *row shape)`` (state inputs are not given).
        feeds: Every graph input, with dtype and batch axis; by default each
            array of ``rows`` is a batch-first input.
        output_names: Outputs to return (state outputs included); every graph
            output by default.
        state: ``(input, output)`` state pairs.
        sequences: ``(N,)`` sequence ids of a stateful model's rows.
        batch_size: Samples per run when every input has a dynamic batch axis.

    Returns:
        Per-sample outputs ``(N, *tensor shape)`` and the states fed.

    Raises:
        BuildError: (stage ``reference``) ONNX Runtime cannot load or run it.
    """
    path = Path(onnx_path)
    try:
        session = _session(path)
    except Exception as exc:
        raise BuildError(
            f"ONNX Runtime cannot load {path}: {exc}", stage=STAGE, tool="onnxruntime"
        ) from exc
    feeds = list(feeds) if feeds is not None else default_feeds(rows)
    graph_inputs = {spec.name: spec for spec in session.get_inputs()}
    dynamic = all(
        not isinstance(graph_inputs[f.name].shape[f.batch_axis], int)
        for f in feeds
        if f.batch_axis is not None
        and f.name in graph_inputs
        and len(graph_inputs[f.name].shape) > f.batch_axis
    )
    names = (
        list(output_names) if output_names is not None else [o.name for o in session.get_outputs()]
    )
    calls = 0

    def forward(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        nonlocal calls
        calls += 1
        try:
            values = session.run(names, dict(tensors))
        except Exception as exc:
            raise BuildError(
                f"ONNX Runtime failed on {path.name} (call {calls}): {exc}",
                stage=STAGE,
                tool="onnxruntime",
            ) from exc
        return dict(zip(names, (np.asarray(v) for v in values), strict=True))

    return run_rows(
        forward,
        feeds,
        names,
        rows,
        state=state,
        sequences=sequences,
        batch_size=batch_size if dynamic else 1,
    )
