"""A tiny, real edgereg project on disk, for build, DVC and registry tests.

:func:`write_project` writes into a directory what a team would commit: two
tiny ONNX models (from :mod:`tiny_models`), their calibration and evaluation
sets as ``.npz`` files made with numpy, and a ``models.toml`` whose sha256 pins
match those files and whose ``[toolchain]`` pins the installed versions::

    root/
      models.toml
      data/vision.onnx               image classifier, input "image" NCHW 1x3x8x8
      data/vision-calibration.npz    uint8 N×8×8×3 RGB pictures + labels
      data/vision-evaluation.npz
      data/sensor.onnx               two tensor inputs "a" (1x8) and "b" (1x4)
      data/sensor-calibration.npz    float32 a, b + labels
      data/sensor-evaluation.npz

Both models are classifiers. Their labels are ONNX Runtime's own predictions
on samples whose top-1 logit clearly beats the runner-up, so the fp32 baseline
is 100 % accurate and a variant loses accuracy only when it really computes
something different. Every class is present in every set.

Variants (three tiers, one variant per tier and model):

=========  ==========  ===========================
tier       vision      sensor
=========  ==========  ===========================
high       ``fp32``    ``fp16``
mid        ``int8``    ``int8`` (both KL)
low        ``w8``      ``w8`` (weight-only, 8 bits)
=========  ==========  ===========================

Everything is seeded: the same call writes the same bytes. Builds of these
models take about a second each; pass :data:`FAST_BENCH` to keep the host
benchmark short.
"""

from __future__ import annotations

import hashlib
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tiny_models

from edgereg import config as config_module
from edgereg.build.outputs import variant_dir
from edgereg.build.variant import BenchSettings, BuildResult, build_variant
from edgereg.toolchain import installed_versions

#: A benchmark short enough for tests: one warm-up and three timed runs.
FAST_BENCH = BenchSettings(iterations=3, warmup=1, threads=(1,))

IMAGE_MODEL = "vision"
TENSOR_MODEL = "sensor"
MODELS = (IMAGE_MODEL, TENSOR_MODEL)
VARIANTS = {IMAGE_MODEL: ("fp32", "int8", "w8"), TENSOR_MODEL: ("fp16", "int8", "w8")}

IMAGE_CLASSES = ("red", "green", "blue", "grey")
TENSOR_CLASSES = ("still", "walk", "run", "cycle", "drive", "stairs")
IMAGE_SIZE = tiny_models.CONV_SHAPE[1]
#: Samples per class in each set; the calibration set is sampled down to
#: :data:`CALIBRATION_SAMPLES` (class-balanced) by models.toml.
EVALUATION_PER_CLASS = 8
CALIBRATION_PER_CLASS = 6
CALIBRATION_SAMPLES = 16
#: A sample is kept only when its top-1 logit beats the runner-up by this much.
MIN_MARGIN = 0.05

_TOML = """\
# A tiny edgereg project written by tests/buildkit.py.

[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"
# x86 only: tests/test_build_arm.py verifies builds on the emulated ARM classes.
arm = []

[tiers.high]
min_ram_mb = 6144
min_cpu_cores = 8

[tiers.mid]
min_ram_mb = 3072

[tiers.low]
description = "Everything else"

[models.vision]
version = "1.0.0"
task = "classification"
source = {{ path = "data/vision.onnx", sha256 = "{vision_onnx}" }}
classes = {image_classes}
evaluation = {{ path = "data/vision-evaluation.npz", sha256 = "{vision_evaluation_npz}" }}

[models.vision.calibration]
path = "data/vision-calibration.npz"
sha256 = "{vision_calibration_npz}"
samples = {calibration_samples}

[[models.vision.inputs]]
name = "image"
shape = [1, 3, {size}, {size}]
kind = "image"
layout = "NCHW"
color = "RGB"
mean = [127.5, 127.5, 127.5]
std = [127.5, 127.5, 127.5]

[[models.vision.outputs]]
name = "logits"

[models.vision.budgets]
max_size_mb = 1.0
metrics.accuracy = {{ max_drop = 0.25 }}
metrics.class_recall_drop = {{ max = 0.5 }}

[models.vision.variants.fp32]
tier = "high"
runtime = {{ threads = 4, backends = ["opencl", "cpu"] }}

[models.vision.variants.int8]
tier = "mid"
quantization = {{ mode = "int8", method = "KL" }}
runtime = {{ threads = 2 }}

[models.vision.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
runtime = {{ threads = 1 }}

[models.sensor]
version = "1.0.0"
task = "classification"
source = {{ path = "data/sensor.onnx", sha256 = "{sensor_onnx}" }}
classes = {tensor_classes}
evaluation = {{ path = "data/sensor-evaluation.npz", sha256 = "{sensor_evaluation_npz}" }}

[models.sensor.calibration]
path = "data/sensor-calibration.npz"
sha256 = "{sensor_calibration_npz}"
samples = {calibration_samples}

[[models.sensor.inputs]]
name = "a"
shape = [1, 8]

[[models.sensor.inputs]]
name = "b"
shape = [1, 4]

[[models.sensor.outputs]]
name = "y"

[models.sensor.budgets]
max_size_mb = 1.0
metrics.accuracy = {{ max_drop = 0.25 }}
metrics.class_recall_drop = {{ max = 0.5 }}

[models.sensor.variants.fp16]
tier = "high"
precision = "fp16"
runtime = {{ threads = 4, backends = ["opencl", "cpu"] }}

[models.sensor.variants.int8]
tier = "mid"
quantization = {{ mode = "int8", method = "KL" }}
runtime = {{ threads = 2 }}

[models.sensor.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
runtime = {{ threads = 1 }}
"""


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


@dataclass(frozen=True)
class Project:
    """A tiny project directory; paths in models.toml are relative to ``root``."""

    root: Path

    @property
    def config_path(self) -> Path:
        """The project's models.toml."""
        return self.root / "models.toml"

    @property
    def out_root(self) -> Path:
        """Where builds write (``root/build``, as ``edgereg build`` and dvc.yaml do)."""
        return self.root / "build"

    def path(self, relative: str) -> Path:
        """A file of the project, by its path relative to ``root``."""
        return self.root / relative

    def load(self) -> config_module.Config:
        """Load and validate the current models.toml."""
        return config_module.load(self.config_path)

    def out_dir(self, model: str, variant: str) -> Path:
        """The output directory of one variant."""
        return variant_dir(self.out_root, model, variant)

    def toml(self) -> str:
        """The current text of models.toml."""
        return self.config_path.read_text(encoding="utf-8")

    def edit(self, old: str, new: str, *, count: int = 1) -> None:
        """Replace ``old`` by ``new`` in models.toml; ``old`` must occur ``count`` times.

        Raises:
            AssertionError: ``old`` occurs a different number of times, so the
                edit would not do what the test meant.
        """
        text = self.toml()
        found = text.count(old)
        assert found == count, f"{old!r} occurs {found} times in models.toml, expected {count}"
        self.config_path.write_text(text.replace(old, new), encoding="utf-8")

    def edit_table(self, header: str, old: str, new: str) -> None:
        """Replace ``old`` by ``new`` once, inside the TOML table ``[header]`` only."""
        text = self.toml()
        start = text.index(f"[{header}]\n")
        end = text.find("\n[", start + 1)
        end = len(text) if end < 0 else end
        table = text[start:end]
        assert table.count(old) == 1, f"{old!r} is not once in [{header}]:\n{table}"
        text = text[:start] + table.replace(old, new) + text[end:]
        self.config_path.write_text(text, encoding="utf-8")

    def pin(self, relative: str) -> None:
        """Update the sha256 pin of ``relative`` in models.toml to the file's digest."""
        text = self.toml()
        pattern = re.compile(rf'(path = "{re.escape(relative)}",?\s+sha256 = ")([0-9a-f]{{64}})')
        assert pattern.search(text), f"models.toml pins no {relative}"
        digest = sha256_file(self.path(relative))
        self.config_path.write_text(pattern.sub(rf"\g<1>{digest}", text), encoding="utf-8")

    def replace_file(self, relative: str, data: bytes, *, repin: bool = True) -> None:
        """Overwrite a project file; with ``repin`` the models.toml pin follows it."""
        self.path(relative).write_bytes(data)
        if repin:
            self.pin(relative)

    def build(self, model: str, variant: str, *, bench: BenchSettings = FAST_BENCH) -> BuildResult:
        """Build one variant with the library (the same call `edgereg build` makes)."""
        return build_variant(self.load(), model, variant, self.out_root, bench=bench)


def write_project(root: Path) -> Project:
    """Write the tiny two-model project into ``root`` (created if needed).

    Returns:
        The project; its models.toml validates and every variant builds and
        passes its gates.
    """
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    vision = tiny_models.conv_classifier(data / "vision.onnx")
    sensor = tiny_models.two_input_model(data / "sensor.onnx")

    rng = np.random.default_rng(20240601)
    pictures = _pictures(rng, 4000)
    images = {"image": image_tensor(pictures)}
    labels = _labels(vision, images, tiny_models.CONV_OUTPUT)
    pools = _split(labels, len(IMAGE_CLASSES))
    write_npz(data / "vision-evaluation.npz", {"image": pictures}, labels, pools[0])
    write_npz(data / "vision-calibration.npz", {"image": pictures}, labels, pools[1])

    tensors = {
        name: rng.normal(0, 1, (4000, width)).astype(np.float32)
        for name, width in zip(
            tiny_models.TWO_INPUT_NAMES, tiny_models.TWO_INPUT_WIDTHS, strict=True
        )
    }
    labels = _labels(sensor, tensors, tiny_models.TWO_INPUT_OUTPUT)
    pools = _split(labels, len(TENSOR_CLASSES))
    write_npz(data / "sensor-evaluation.npz", tensors, labels, pools[0])
    write_npz(data / "sensor-calibration.npz", tensors, labels, pools[1])

    pins = {
        f"{stem.replace('-', '_')}_{suffix}": sha256_file(data / f"{stem}.{suffix}")
        for stem, suffix in (
            ("vision", "onnx"),
            ("vision-calibration", "npz"),
            ("vision-evaluation", "npz"),
            ("sensor", "onnx"),
            ("sensor-calibration", "npz"),
            ("sensor-evaluation", "npz"),
        )
    }
    text = _TOML.format(
        **installed_versions(),
        **pins,
        image_classes=_toml_list(IMAGE_CLASSES),
        tensor_classes=_toml_list(TENSOR_CLASSES),
        calibration_samples=CALIBRATION_SAMPLES,
        size=IMAGE_SIZE,
    )
    (root / "models.toml").write_text(text, encoding="utf-8")
    return Project(root)


def write_built_project(root: Path, *, bench: BenchSettings = FAST_BENCH) -> Project:
    """Write the project into ``root`` and build every variant with the library.

    Meant for module-scoped fixtures, which run before the per-test isolation
    of conftest.py: ONNX Runtime keeps a device id under ``XDG_CACHE_HOME``, so
    that (and HOME) point into ``root/.home`` while this runs.
    """
    home = root / ".home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
        project = write_project(root)
        for model, variants in VARIANTS.items():
            for variant in variants:
                project.build(model, variant, bench=bench)
    shutil.rmtree(home, ignore_errors=True)
    return project


def image_tensor(pictures: np.ndarray) -> np.ndarray:
    """uint8 N×H×W×3 RGB pictures as the vision model's NCHW input (mean/std 127.5)."""
    scaled = (pictures.astype(np.float32) - 127.5) / 127.5
    return np.ascontiguousarray(scaled.transpose(0, 3, 1, 2))


def write_npz(
    path: Path,
    arrays: dict[str, np.ndarray],
    labels: np.ndarray | None = None,
    indices: Sequence[int] | np.ndarray | None = None,
) -> Path:
    """Write a dataset .npz: one array per input and, if given, int64 ``labels``.

    Args:
        path: The file to write.
        arrays: Input name to samples (first axis).
        labels: One class per sample, or None for an unlabelled set.
        indices: Keep only these samples, in this order.

    Returns:
        ``path``.
    """
    keep = slice(None) if indices is None else np.asarray(indices)
    content = {name: array[keep] for name, array in arrays.items()}
    if labels is not None:
        content["labels"] = np.asarray(labels, dtype=np.int64)[keep]
    # savez (not savez_compressed): its bytes do not depend on zlib's version.
    np.savez(path, **content)  # type: ignore[arg-type]
    return path


def _pictures(rng: np.random.Generator, count: int) -> np.ndarray:
    """Noisy single-colour pictures: random uniform noise would hit two classes only."""
    colours = rng.integers(0, 256, (count, 1, 1, 3))
    noise = rng.normal(0, 30, (count, IMAGE_SIZE, IMAGE_SIZE, 3))
    return np.clip(colours + noise, 0, 255).astype(np.uint8)


def _labels(model: Path, inputs: dict[str, np.ndarray], output: str) -> np.ndarray:
    """ONNX Runtime's top-1 class per sample, -1 where the decision is too close."""
    # Here, not at the top: conftest loads this module for every test, pure ones too.
    import onnxruntime as ort

    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    logits = np.asarray(session.run([output], inputs)[0])
    ordered = np.sort(logits, axis=1)
    labels: np.ndarray = np.argmax(logits, axis=1).astype(np.int64)
    labels[ordered[:, -1] - ordered[:, -2] < MIN_MARGIN] = -1
    return labels


def _split(labels: np.ndarray, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """Disjoint evaluation and calibration indices, the same count of every class."""
    evaluation: list[int] = []
    calibration: list[int] = []
    for label in range(classes):
        found = np.flatnonzero(labels == label)
        need = EVALUATION_PER_CLASS + CALIBRATION_PER_CLASS
        assert len(found) >= need, f"class {label}: {len(found)} samples, need {need}"
        evaluation += found[:EVALUATION_PER_CLASS].tolist()
        calibration += found[EVALUATION_PER_CLASS:need].tolist()
    return np.sort(evaluation), np.sort(calibration)


def _toml_list(values: Sequence[str]) -> str:
    return "[" + ", ".join(f'"{value}"' for value in values) + "]"
