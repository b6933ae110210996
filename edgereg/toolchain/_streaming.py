"""Running a dataset through a model the way an app does: batches, single samples, or streams.

One definition for both runtimes: ONNX Runtime in process and MNN in the
child worker call :func:`run_rows` with their own ``forward``. It depends on
nothing but numpy and the standard library, because the worker loads it by
path where the ``edgereg`` package may not be importable.

A dataset holds one row per sample: the input tensor without its batch axis
(or the whole tensor when the input has none). A stateful model's rows come
in sequences; each sequence starts from zero state and feeds the model's own
state output back at the next step, as an app streaming audio does.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

#: ``forward(tensors by input name) -> tensors by output name``.
Forward = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class InputFeed:
    """How one input is fed: its dtype, full shape and batch axis (None: it has none)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    batch_axis: int | None

    def tensor(self, rows: np.ndarray) -> np.ndarray:
        """The model tensor for ``rows`` (one or more samples) of this input."""
        array = np.asarray(rows, dtype=self.dtype)
        if self.batch_axis is None:
            return np.ascontiguousarray(array.reshape(self.shape))
        return np.ascontiguousarray(np.moveaxis(array, 0, self.batch_axis))

    def sample(self, rows: np.ndarray, index: int) -> np.ndarray:
        """The model tensor of sample ``index`` of this input's rows (a batch of one)."""
        return self.tensor(rows[index] if self.batch_axis is None else rows[index : index + 1])

    @classmethod
    def batched(cls, name: str, rows: np.ndarray) -> InputFeed:
        """A batch-first input of the rows' own dtype: ``(N, ...)`` rows, ``(1, ...)`` tensors."""
        array = np.asarray(rows)
        return cls(name, str(array.dtype), (1, *array.shape[1:]), 0)

    def to_json(self) -> dict[str, Any]:
        """The plain form the worker request carries."""
        return {
            "name": self.name,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "batch_axis": self.batch_axis,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> InputFeed:
        """Read :meth:`to_json`'s form."""
        axis = raw["batch_axis"]
        return cls(
            str(raw["name"]),
            str(raw["dtype"]),
            tuple(int(d) for d in raw["shape"]),
            None if axis is None else int(axis),
        )


@dataclass(frozen=True)
class StreamResult:
    """Per-sample outputs, and the state values each step was fed (stateful models).

    Attributes:
        outputs: Output name to an array ``(N, *tensor shape)``: the tensor
            the model returned for each sample.
        states: State input name to ``(N, *shape)``, the state fed at each
            step (what calibration of a stateful model must see); empty for
            stateless models.
        batch_size: Samples per forward pass actually used.
    """

    outputs: dict[str, np.ndarray]
    states: dict[str, np.ndarray]
    batch_size: int


def default_feeds(rows: Mapping[str, np.ndarray]) -> list[InputFeed]:
    """Batch-first feeds for plain ``(N, ...)`` arrays, in the mapping's order."""
    return [InputFeed.batched(name, array) for name, array in rows.items()]


def sequence_bounds(sequences: np.ndarray) -> list[tuple[int, int]]:
    """``[start, stop)`` of each run of equal ids, in file order."""
    ids = np.asarray(sequences).reshape(-1)
    if ids.size == 0:
        return []
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    starts = [0, *cuts.tolist()]
    stops = [*cuts.tolist(), int(ids.size)]
    return list(zip(starts, stops, strict=True))


def run_rows(
    forward: Forward,
    feeds: Sequence[InputFeed],
    output_names: Sequence[str],
    rows: Mapping[str, np.ndarray],
    *,
    state: Sequence[tuple[str, str]] = (),
    sequences: np.ndarray | None = None,
    batch_size: int = 1,
) -> StreamResult:
    """Run every row through ``forward`` and stack the per-sample outputs.

    Args:
        forward: One model call.
        feeds: Every model input; state inputs are fed from ``state``, the
            rest from ``rows``.
        output_names: Outputs to collect (state outputs included).
        rows: Input name to ``(N, *row shape)``.
        state: ``(input, output)`` pairs of a stateful model.
        sequences: ``(N,)`` sequence ids (contiguous runs); stateful models
            only. Without it a stateful model runs every row as a sequence of one.
        batch_size: Samples per call for stateless models whose every input
            has a batch axis; the run falls back to one sample per call when
            the model returns no batch of that size (a graph fixed at 1).

    Returns:
        The outputs of every sample, the states fed, and the batch size used.
    """
    state_inputs = {pair[0]: pair[1] for pair in state}
    data_feeds = [feed for feed in feeds if feed.name not in state_inputs]
    # A model whose every input is a state has no rows: its sequences say how long it runs.
    if rows:
        total = len(next(iter(rows.values())))
    else:
        total = len(sequences) if sequences is not None else 0
    if state:
        bounds = (
            sequence_bounds(sequences)
            if sequences is not None
            else [(i, i + 1) for i in range(total)]
        )
        return _stream(forward, feeds, output_names, rows, state_inputs, bounds)
    batchable = all(feed.batch_axis is not None for feed in data_feeds)
    batch = max(1, min(int(batch_size), total)) if batchable else 1
    if batch > 1:
        try:
            return StreamResult(
                _batched(forward, data_feeds, output_names, rows, total, batch), {}, batch
            )
        except _NotABatch:
            pass
    outputs: dict[str, list[np.ndarray]] = {name: [] for name in output_names}
    for index in range(total):
        result = forward({f.name: f.sample(rows[f.name], index) for f in data_feeds})
        for name in output_names:
            outputs[name].append(np.array(result[name], copy=True))
    return StreamResult(_stack(outputs), {}, 1)


class _NotABatch(Exception):
    """The model's outputs do not carry a batch of the size fed."""


def _batched(
    forward: Forward,
    feeds: Sequence[InputFeed],
    output_names: Sequence[str],
    rows: Mapping[str, np.ndarray],
    total: int,
    batch: int,
) -> dict[str, np.ndarray]:
    outputs: dict[str, list[np.ndarray]] = {name: [] for name in output_names}
    for start in range(0, total, batch):
        stop = min(start + batch, total)
        try:
            result = forward({f.name: f.tensor(rows[f.name][start:stop]) for f in feeds})
        except Exception as exc:  # a graph with a fixed batch of 1 refuses more
            raise _NotABatch from exc
        for name in output_names:
            value = np.asarray(result[name])
            if value.ndim == 0 or value.shape[0] != stop - start:
                raise _NotABatch
            # One sample's tensor keeps its batch axis of 1, as a single call returns it.
            outputs[name].extend(np.array(value[i : i + 1], copy=True) for i in range(stop - start))
    return _stack(outputs)


def _stream(
    forward: Forward,
    feeds: Sequence[InputFeed],
    output_names: Sequence[str],
    rows: Mapping[str, np.ndarray],
    state_inputs: Mapping[str, str],
    bounds: Sequence[tuple[int, int]],
) -> StreamResult:
    outputs: dict[str, list[np.ndarray]] = {name: [] for name in output_names}
    fed: dict[str, list[np.ndarray]] = {name: [] for name in state_inputs}
    by_name = {feed.name: feed for feed in feeds}
    for start, stop in bounds:
        current = {
            name: np.zeros(by_name[name].shape, dtype=by_name[name].dtype) for name in state_inputs
        }
        for index in range(start, stop):
            tensors = {}
            for feed in feeds:
                if feed.name in state_inputs:
                    tensors[feed.name] = current[feed.name]
                else:
                    tensors[feed.name] = feed.sample(rows[feed.name], index)
            for name in state_inputs:
                fed[name].append(current[name])
            result = forward(tensors)
            for name in output_names:
                outputs[name].append(np.array(result[name], copy=True))
            for name, output in state_inputs.items():
                feed = by_name[name]
                current[name] = np.ascontiguousarray(
                    np.asarray(result[output], dtype=feed.dtype).reshape(feed.shape)
                )
    return StreamResult(_stack(outputs), _stack(fed), 1)


def _stack(parts: Mapping[str, list[np.ndarray]]) -> dict[str, np.ndarray]:
    stacked = {}
    for name, arrays in parts.items():
        shapes = {array.shape for array in arrays}
        if len(shapes) > 1:
            raise ValueError(
                f"output {name!r} changes shape between samples ({sorted(shapes)[:3]}); "
                "every sample must give the same shape"
            )
        stacked[name] = np.stack(arrays) if arrays else np.zeros((0,))
    return stacked
