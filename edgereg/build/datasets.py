"""Calibration and evaluation sets: load, check against the inputs, preprocess, sample.

A dataset is an ``.npz`` with one array per model input, one row per sample:
the input tensor without its batch axis (the whole tensor for an input that
has none, such as a scalar). ``kind = "image"`` inputs hold uint8 ``N×H×W×C``
pictures in RGB (or grey) that are converted to the declared color order,
normalised with ``mean``/``std`` and laid out as declared. Integer inputs
(token ids, masks) hold integers. ``labels`` is optional and task-specific
(class ids, masks, strings, frame decisions); a stateful model's rows come in
sequences, named by the int array ``sequences`` (contiguous runs, in time
order). State inputs are not stored: each sequence starts from zeros.
"""

from __future__ import annotations

import hashlib
import zipfile
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgereg.config import InputSpec
from edgereg.errors import BuildError

LABELS = "labels"
SEQUENCES = "sequences"
#: MNN runs integer inputs as int32; a token id beyond it would silently wrap.
_INT32 = np.iinfo(np.int32)


@dataclass(frozen=True)
class Dataset:
    """Model-ready rows (samples first, in the input's dtype), labels and sequence ids."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None
    sequences: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def take(self, indices: np.ndarray) -> Dataset:
        """Return the samples at ``indices``, in that order."""
        return Dataset(
            inputs={name: array[indices] for name, array in self.inputs.items()},
            labels=None if self.labels is None else self.labels[indices],
            sequences=None if self.sequences is None else self.sequences[indices],
        )

    def digest(self) -> str:
        """sha256 over the exact tensors, labels and sequence ids, in input order."""
        hasher = hashlib.sha256()
        for name in sorted(self.inputs):
            array = np.ascontiguousarray(self.inputs[name])
            hasher.update(f"{name}:{array.dtype}:{array.shape}\n".encode())
            hasher.update(array.tobytes())
        for name, extra in ((LABELS, self.labels), (SEQUENCES, self.sequences)):
            if extra is not None:
                array = np.ascontiguousarray(extra)
                hasher.update(f"{name}:{array.dtype}:{array.shape}\n".encode())
                hasher.update(array.tobytes())
        return hasher.hexdigest()


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """Every array of an .npz file, by name.

    numpy hands back the raw bytes of a member that is not a ``.npy`` array (an
    empty or damaged member) instead of raising: that is refused here, before
    any code takes it for an array.

    Raises:
        OSError, ValueError, EOFError, zipfile.BadZipFile: not a readable .npz
            (what :func:`numpy.load` raises, and ValueError for such a member).
    """
    with np.load(path, allow_pickle=False) as archive:
        arrays = {key: archive[key] for key in archive.files}
    for key, value in arrays.items():
        if not isinstance(value, np.ndarray):
            size = len(value) if isinstance(value, bytes) else "?"
            raise ValueError(
                f"its member '{key}' is not a .npy array ({size} bytes of something else)"
            )
    return arrays


def load_dataset(
    path: Path,
    specs: list[InputSpec],
    *,
    stage: str,
    need_labels: bool,
    state_inputs: Collection[str] = (),
    task: str = "classification",
) -> Dataset:
    """Read an .npz dataset and turn it into model-ready rows.

    Args:
        path: The .npz file.
        specs: The model's inputs.
        stage: Named in errors.
        need_labels: The task's evaluator needs labels.
        state_inputs: Inputs fed from the model's own state; a dataset of a
            stateful model must name its sequences.

    Raises:
        BuildError: the file is missing or unreadable, an input is absent or
            of the wrong shape or type, a value is not finite, the sequence
            ids are not contiguous runs, or labels are missing.
    """
    try:
        if path.stat().st_size == 0:
            raise BuildError(
                f"dataset {path} is empty (0 bytes), not an .npz file",
                stage=stage,
                hint="Write it again with numpy.savez_compressed, one array per input, "
                "and pin its new sha256.",
            )
        arrays = read_npz(path)
    except FileNotFoundError as exc:
        raise BuildError(f"dataset {path} not found", stage=stage) from exc
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as exc:
        raise BuildError(
            f"dataset {path} is not a readable .npz file: {exc}",
            stage=stage,
            hint="Write datasets with numpy.savez_compressed, one array per input.",
        ) from exc
    inputs = {
        spec.name: _prepare(arrays, spec, path, stage)
        for spec in specs
        if spec.name not in state_inputs
    }
    counts = {name: len(array) for name, array in inputs.items()}
    labels = arrays.get(LABELS)
    if labels is not None:
        if labels.ndim == 0:
            raise BuildError(
                f"dataset {path}: '{LABELS}' must have one row per sample, got a scalar",
                stage=stage,
            )
        counts[LABELS] = len(labels)
    elif need_labels:
        raise BuildError(
            f"dataset {path} has no '{LABELS}' array; a {task} model's evaluation set needs "
            "labels (one row per sample)",
            stage=stage,
        )
    sequences = arrays.get(SEQUENCES)
    if state_inputs:
        if sequences is None:
            raise BuildError(
                f"dataset {path} has no '{SEQUENCES}' array; a stateful model is evaluated as "
                "streams, so its dataset needs the sequence id of every row",
                stage=stage,
                hint=f"Add '{SEQUENCES}': an int array (N,), the rows of one sequence "
                "contiguous and in time order.",
            )
        sequences = _sequences(sequences, path, stage)
        counts[SEQUENCES] = len(sequences)
    if len(set(counts.values())) != 1:
        raise BuildError(f"dataset {path}: arrays differ in sample count: {counts}", stage=stage)
    if next(iter(counts.values()), 0) == 0:
        raise BuildError(f"dataset {path} has no samples", stage=stage)
    return Dataset(inputs=inputs, labels=labels, sequences=sequences if state_inputs else None)


def _sequences(raw: np.ndarray, path: Path, stage: str) -> np.ndarray:
    if raw.ndim != 1 or not np.issubdtype(raw.dtype, np.integer):
        raise BuildError(
            f"dataset {path}: '{SEQUENCES}' must be a 1-D integer array, got {raw.dtype} "
            f"{raw.shape}",
            stage=stage,
        )
    ids = raw.astype(np.int64)
    starts = ids[np.r_[True, ids[1:] != ids[:-1]]] if len(ids) else ids
    if len(np.unique(starts)) != len(starts):
        raise BuildError(
            f"dataset {path}: the rows of a sequence in '{SEQUENCES}' are not contiguous "
            "(an id appears in two runs)",
            stage=stage,
            hint="Store each sequence's rows together, in time order.",
        )
    return ids


def _prepare(arrays: dict[str, np.ndarray], spec: InputSpec, path: Path, stage: str) -> np.ndarray:
    if spec.name not in arrays:
        raise BuildError(
            f"dataset {path} has no array '{spec.name}' for model input '{spec.name}' "
            f"(arrays: {', '.join(sorted(arrays)) or 'none'})",
            stage=stage,
        )
    raw = arrays[spec.name]
    if spec.kind == "image":
        return _image_tensor(raw, spec, path, stage)
    sample_shape = spec.row_shape
    if raw.ndim == 0 or raw.shape[1:] != sample_shape:
        where = "" if spec.batch is None else f", without its batch axis {spec.batch}"
        raise BuildError(
            f"dataset {path}: array '{spec.name}' has rows of shape "
            f"{raw.shape[1:] if raw.ndim else '(a scalar)'}, the input is declared as "
            f"{tuple(spec.shape)} (one row: {sample_shape}{where})",
            stage=stage,
            hint="Regenerate the dataset for this input shape, or fix inputs.shape and "
            "inputs.batch_axis.",
        )
    if spec.dtype == "float32":
        if not (np.issubdtype(raw.dtype, np.floating) or np.issubdtype(raw.dtype, np.integer)):
            raise BuildError(
                f"dataset {path}: array '{spec.name}' holds {raw.dtype}, input is float32",
                stage=stage,
            )
        values = raw.astype(np.float32)
        if not np.isfinite(values).all():
            bad = int(np.count_nonzero(~np.isfinite(values)))
            raise BuildError(
                f"dataset {path}: array '{spec.name}' holds {bad} NaN or infinite value(s)"
                + (" (all of them)" if bad == values.size else ""),
                stage=stage,
                hint="Drop or repair those samples; calibration and evaluation need finite inputs.",
            )
        return values
    if not np.issubdtype(raw.dtype, np.integer) and raw.dtype != np.bool_:
        raise BuildError(
            f"dataset {path}: array '{spec.name}' holds {raw.dtype}, but input '{spec.name}' "
            f"is {spec.dtype} (token ids, masks, counts)",
            stage=stage,
            hint=f"Store it as integers (numpy {spec.dtype}), exactly as the app feeds it.",
        )
    limits = np.iinfo(np.uint8) if spec.dtype == "uint8" else _INT32
    if raw.size and (int(raw.min()) < limits.min or int(raw.max()) > limits.max):
        raise BuildError(
            f"dataset {path}: array '{spec.name}' holds values {int(raw.min())}..{int(raw.max())}"
            f", outside {limits.min}..{limits.max}"
            + (" (MNN runs integer inputs as int32)" if spec.dtype != "uint8" else ""),
            stage=stage,
        )
    return raw.astype(spec.dtype)


def _image_tensor(raw: np.ndarray, spec: InputSpec, path: Path, stage: str) -> np.ndarray:
    assert spec.layout is not None
    assert spec.color is not None
    if spec.layout == "NCHW":
        _, channels, height, width = spec.shape
    else:
        _, height, width, channels = spec.shape
    expected = (height, width, channels)
    if raw.ndim == 3 and channels == 1:
        raw = raw[..., None]
    if raw.shape[1:] != expected:
        raise BuildError(
            f"dataset {path}: images in '{spec.name}' are {raw.shape[1:]} (H, W, C), "
            f"the input needs {expected}",
            stage=stage,
            hint="Image datasets hold uint8 N×H×W×C pictures in RGB at the input's size.",
        )
    if not (np.issubdtype(raw.dtype, np.integer) or np.issubdtype(raw.dtype, np.floating)):
        raise BuildError(
            f"dataset {path}: images in '{spec.name}' hold {raw.dtype}, not numbers",
            stage=stage,
            hint="Image datasets hold uint8 N×H×W×C pictures in RGB at the input's size.",
        )
    images: np.ndarray = raw.astype(np.float32)
    if not np.isfinite(images).all():
        bad = int(np.count_nonzero(~np.isfinite(images)))
        raise BuildError(
            f"dataset {path}: images in '{spec.name}' hold {bad} NaN or infinite value(s)"
            + (" (all of them)" if bad == images.size else ""),
            stage=stage,
            hint="Drop or repair those samples; calibration and evaluation need finite inputs "
            "(images are best stored as uint8).",
        )
    if spec.color == "BGR":
        images = images[..., ::-1]
    if spec.mean is not None:
        images = np.subtract(images, np.asarray(spec.mean, dtype=np.float32))
    if spec.std is not None:
        images = np.divide(images, np.asarray(spec.std, dtype=np.float32))
    if spec.layout == "NCHW":
        images = images.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(images, dtype=np.float32)


def select_calibration(dataset: Dataset, count: int | None, *, balanced: bool) -> Dataset:
    """Pick the calibration samples, deterministically.

    With class-id labels and ``balanced``, classes take turns so every class
    is represented as evenly as the set allows; otherwise the first
    ``count``. A stateful model's set is cut at whole sequences (the first
    ones that together hold at least ``count`` rows), since a step means
    nothing without the steps before it.
    """
    total = len(dataset)
    if count is None or count >= total:
        return dataset
    if dataset.sequences is not None:
        ids = dataset.sequences
        # The first row past ``count`` that starts another sequence.
        later = np.flatnonzero((np.arange(total) >= count) & (ids != ids[count - 1]))
        cut = int(later[0]) if len(later) else total
        return dataset.take(np.arange(cut))
    labels = dataset.labels
    class_ids = labels is not None and labels.ndim == 1 and np.issubdtype(labels.dtype, np.integer)
    if not balanced or not class_ids:
        return dataset.take(np.arange(count))
    assert labels is not None
    per_class = [np.flatnonzero(labels == label) for label in np.unique(labels)]
    chosen: list[int] = []
    depth = 0
    while len(chosen) < count:
        for indices in per_class:
            if depth < len(indices) and len(chosen) < count:
                chosen.append(int(indices[depth]))
        depth += 1
    return dataset.take(np.asarray(sorted(chosen)))
