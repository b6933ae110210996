"""Calibration and evaluation sets: load, check against the inputs, preprocess, sample.

A dataset is an ``.npz`` with one array per model input (samples first) and,
for classification, an int ``labels`` array. ``kind = "tensor"`` inputs hold
the model tensor of each sample as is; ``kind = "image"`` inputs hold uint8
``N×H×W×C`` pictures in RGB (or grey) that are converted to the declared
color order, normalised with ``mean``/``std`` and laid out as declared.
"""

from __future__ import annotations

import hashlib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from edgereg.config import InputSpec
from edgereg.errors import BuildError

LABELS = "labels"


@dataclass(frozen=True)
class Dataset:
    """Model-ready inputs (float32, samples first) and optional labels."""

    inputs: dict[str, np.ndarray]
    labels: np.ndarray | None

    def __len__(self) -> int:
        return len(next(iter(self.inputs.values())))

    def take(self, indices: np.ndarray) -> Dataset:
        """Return the samples at ``indices``, in that order."""
        return Dataset(
            inputs={name: array[indices] for name, array in self.inputs.items()},
            labels=None if self.labels is None else self.labels[indices],
        )

    def digest(self) -> str:
        """sha256 over the exact tensors (and labels), in input order."""
        hasher = hashlib.sha256()
        for name in sorted(self.inputs):
            array = np.ascontiguousarray(self.inputs[name])
            hasher.update(f"{name}:{array.dtype}:{array.shape}\n".encode())
            hasher.update(array.tobytes())
        if self.labels is not None:
            hasher.update(np.ascontiguousarray(self.labels, dtype=np.int64).tobytes())
        return hasher.hexdigest()


def load_dataset(path: Path, specs: list[InputSpec], *, stage: str, need_labels: bool) -> Dataset:
    """Read an .npz dataset and turn it into model inputs.

    Raises:
        BuildError: the file is missing or unreadable, an input is absent, a
            shape does not match the declared input, or labels are missing.
    """
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {key: archive[key] for key in archive.files}
    except FileNotFoundError:
        raise BuildError(f"dataset {path} not found", stage=stage) from None
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise BuildError(
            f"dataset {path} is not a readable .npz file: {exc}",
            stage=stage,
            hint="Write datasets with numpy.savez_compressed, one array per input.",
        ) from None
    inputs = {spec.name: _prepare(arrays, spec, path, stage) for spec in specs}
    counts = {name: len(array) for name, array in inputs.items()}
    labels = arrays.get(LABELS)
    if labels is not None:
        if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
            raise BuildError(
                f"dataset {path}: '{LABELS}' must be a 1-D integer array, "
                f"got {labels.dtype} {labels.shape}",
                stage=stage,
            )
        counts[LABELS] = len(labels)
        labels = labels.astype(np.int64)
    elif need_labels:
        raise BuildError(
            f"dataset {path} has no '{LABELS}' array; a classification model's "
            "evaluation set needs one integer label per sample",
            stage=stage,
        )
    if len(set(counts.values())) != 1:
        raise BuildError(f"dataset {path}: arrays differ in sample count: {counts}", stage=stage)
    if next(iter(counts.values())) == 0:
        raise BuildError(f"dataset {path} has no samples", stage=stage)
    return Dataset(inputs=inputs, labels=labels)


def _prepare(arrays: dict[str, np.ndarray], spec: InputSpec, path: Path, stage: str) -> np.ndarray:
    if spec.name not in arrays:
        raise BuildError(
            f"dataset {path} has no array '{spec.name}' for model input '{spec.name}' "
            f"(arrays: {', '.join(sorted(arrays)) or 'none'})",
            stage=stage,
        )
    raw = arrays[spec.name]
    sample_shape = tuple(spec.shape[1:])
    if spec.kind == "tensor":
        if raw.shape[1:] != sample_shape:
            raise BuildError(
                f"dataset {path}: array '{spec.name}' has samples of shape {raw.shape[1:]}, "
                f"the input is declared as {tuple(spec.shape)} (one sample: {sample_shape})",
                stage=stage,
                hint="Regenerate the dataset for this input shape or fix inputs.shape.",
            )
        return raw.astype(np.float32)
    return _image_tensor(raw, spec, path, stage)


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
    images: np.ndarray = raw.astype(np.float32)
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

    With labels and ``balanced``, classes take turns so every class is
    represented as evenly as the set allows; otherwise the first ``count``.
    """
    total = len(dataset)
    if count is None or count >= total:
        return dataset
    if not balanced or dataset.labels is None:
        return dataset.take(np.arange(count))
    per_class = [np.flatnonzero(dataset.labels == label) for label in np.unique(dataset.labels)]
    chosen: list[int] = []
    depth = 0
    while len(chosen) < count:
        for indices in per_class:
            if depth < len(indices) and len(chosen) < count:
                chosen.append(int(indices[depth]))
        depth += 1
    return dataset.take(np.asarray(sorted(chosen)))
