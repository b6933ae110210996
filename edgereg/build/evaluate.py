"""Scoring a variant the way its app runs it.

The fp32 reference, the task's evaluator, calibration inputs, the
minimum-runtime proof and the benchmark's inputs.

Stages of :func:`edgereg.build.variant.build_variant` that read datasets and
run models; the numbers they produce are judged in :mod:`edgereg.build.quality`.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import numpy as np

from edgereg import toolchain
from edgereg._files import atomic_write
from edgereg.build.datasets import Dataset
from edgereg.config import (
    ClassificationTask,
    Config,
    CtcTask,
    CustomTask,
    DenseMapTask,
    EmbeddingTask,
    FrameDecisionTask,
    GenericTask,
    MetricBudget,
    Model,
    SegmentationTask,
)
from edgereg.errors import BuildError, ConfigError
from edgereg.protocol._json import canonical_json
from edgereg.tasks.classification_eval import chance_level, classification_scores
from edgereg.tasks.ctc_eval import ctc_scores
from edgereg.tasks.custom_eval import custom_scores
from edgereg.tasks.dense_map_eval import dense_map_scores
from edgereg.tasks.embedding_eval import embedding_scores
from edgereg.tasks.frame_decision_eval import frame_decision_scores
from edgereg.tasks.generic_eval import generic_scores
from edgereg.tasks.scoring import (
    TaskDataError,
    TaskScores,
    TaskShapeError,
    beyond_trivial,
    task_rows,
)
from edgereg.tasks.segmentation_eval import segmentation_scores
from edgereg.toolchain.runtimes import RuntimeProof, default_tolerance, prove_min_runtime

logger = logging.getLogger(__name__)


class TaskEvaluator:
    """The model's task, scored on one evaluation set (built-in or the team's own)."""

    def __init__(
        self, config: Config, model: Model, charset: list[str] | None, evaluation: Dataset
    ) -> None:
        self._config = config
        self._model = model
        self._charset = charset
        self._evaluation = evaluation
        self._output = model.task_output
        self._derived_gates: dict[str, MetricBudget] = {}

    def check_reference(self, reference: dict[str, np.ndarray]) -> None:
        """Fail early when the labels or task settings cannot fit the outputs."""
        self.scores(reference, reference)

    def scores(
        self, reference: dict[str, np.ndarray], produced: dict[str, np.ndarray]
    ) -> TaskScores | None:
        """Score the variant's outputs against the reference and the labels."""
        task = self._model.task
        labels = self._evaluation.labels
        ref = reference[self._output]
        var = produced[self._output]
        try:
            if isinstance(task, ClassificationTask):
                scores = classification_scores(task, ref, var, labels, self._model.classes)
                if "accuracy" in scores.baseline:
                    # A baseline at chance means the inputs are not what the model was
                    # trained on (mean/std, color order, layout), whatever the variant does.
                    classes = int(task_rows(ref).reshape(len(ref), -1).shape[1])
                    self._derived_gates = {
                        "accuracy": MetricBudget(min_baseline=round(chance_level(classes), 4))
                    }
                return scores
            if isinstance(task, DenseMapTask):
                return self._beyond_trivial(dense_map_scores(task, ref, var, labels))
            if isinstance(task, SegmentationTask):
                scored = segmentation_scores(task, ref, var, labels, self._model.classes)
                return self._beyond_trivial(scored)
            if isinstance(task, CtcTask):
                assert self._charset is not None
                return self._beyond_trivial(ctc_scores(task, self._charset, ref, var, labels))
            if isinstance(task, EmbeddingTask):
                return self._beyond_trivial(embedding_scores(task, ref, var, labels))
            if isinstance(task, FrameDecisionTask):
                return self._beyond_trivial(frame_decision_scores(task, ref, var, labels))
            if isinstance(task, GenericTask):
                return generic_scores(task, ref, var)
            if isinstance(task, CustomTask):
                return self._custom(task, reference, produced)
        except TaskShapeError as exc:
            name = next(n for n, m in self._config.models.items() if m is self._model)
            raise ConfigError(
                f"evaluation set {self._model.evaluation.path}: {exc}",
                file=str(self._config.path),
                key_path=f"models.{name}.evaluation",
                hint="Make the masks one class index per pixel of the output (or fix the task's "
                "class_axis), and pin the new file.",
            ) from exc
        except TaskDataError as exc:
            raise BuildError(
                f"evaluation set {self._model.evaluation.path}: {exc}",
                stage="evaluate",
                hint="Fix the labels or the task settings in models.toml so they fit the "
                "model's outputs.",
            ) from exc
        return None

    def _beyond_trivial(self, scores: TaskScores) -> TaskScores:
        """Gate the reference's label metrics on beating a trivial predictor.

        The same rule as a classifier's chance level, for every task with
        labels: a VAD whose reference never fires scores below "always
        speech", and its variants' agreement with it would prove nothing.
        Labels a trivial predictor already gets right set no gate.
        """
        self._derived_gates = {
            name: MetricBudget(min_baseline=round(beyond_trivial(level), 4))
            for name, level in scores.trivial.items()
            if level < 0.999
        }
        return scores

    @property
    def derived_gates(self) -> dict[str, MetricBudget]:
        """Gates the evaluation itself sets; models.toml overrides them.

        A custom evaluator's own, a classifier's chance level
        (``accuracy.min_baseline``), and for every other task with labels the
        level a trivial predictor reaches (``f1.min_baseline`` and the like).
        """
        return self._derived_gates

    def _custom(
        self, task: CustomTask, reference: dict[str, np.ndarray], produced: dict[str, np.ndarray]
    ) -> TaskScores:
        function = load_evaluator(self._config.root, task.evaluator)
        try:
            result = function(
                inputs=self._evaluation.inputs,
                reference=reference,
                outputs=produced,
                labels=self._evaluation.labels,
            )
        except Exception as exc:
            raise BuildError(
                f"evaluator {task.evaluator} raised {type(exc).__name__}: {exc}",
                stage="evaluate",
                hint="Fix the evaluator; it is called as f(inputs=, reference=, outputs=, "
                "labels=) with dicts of numpy arrays (N samples first).",
            ) from exc
        scores, gates = custom_scores(result, task.evaluator)
        self._derived_gates = gates
        return scores


def load_evaluator(root: Path, spec: str) -> Callable[..., Any]:
    """Import ``module:function`` with the project directory first on sys.path."""
    module_name, _, function_name = spec.partition(":")
    root_text = str(root.resolve())
    if root_text not in sys.path:
        sys.path.insert(0, root_text)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise BuildError(
            f"cannot import evaluator module '{module_name}': {type(exc).__name__}: {exc}",
            stage="evaluate",
            hint=f"The module is looked up from {root_text} (the directory of models.toml).",
        ) from exc
    function = getattr(module, function_name, None)
    if not callable(function):
        raise BuildError(
            f"evaluator module '{module_name}' has no function '{function_name}'",
            stage="evaluate",
        )
    return cast(Callable[..., Any], function)


def reference_outputs(
    out_root: Path,
    source: Path,
    source_sha256: str,
    dataset: Dataset,
    dataset_sha256: str,
    feeds: list[toolchain.InputFeed],
    output_names: list[str],
    state: list[tuple[str, str]],
    batch_size: int,
) -> toolchain.StreamResult:
    """The fp32 ONNX Runtime outputs on a dataset, computed once per model and set.

    Cached by digest under ``<out>/.cache/reference/``: every variant of a
    model (and every candidate of an ``auto`` quantization) compares against
    the same reference, so it is computed once.
    """
    key = hashlib.sha256(
        canonical_json(
            {
                "source": source_sha256,
                "dataset": dataset_sha256,
                "rows": dataset.digest(),
                "feeds": [f.to_json() for f in feeds],
                "outputs": output_names,
                "state": state,
                "onnxruntime": toolchain.installed_version("onnxruntime"),
            }
        )
    ).hexdigest()
    cache = out_root / REFERENCE_CACHE / f"{key}.npz"
    if cache.is_file():
        try:
            with np.load(cache, allow_pickle=False) as data:
                outputs = {n: np.array(data[f"out:{n}"]) for n in output_names}
                states = {n: np.array(data[f"state:{n}"]) for n, _ in state}
            return toolchain.StreamResult(outputs, states, batch_size)
        except (OSError, KeyError, ValueError):
            logger.info("reference cache %s unreadable; computing it again", cache)
    result = toolchain.run_onnx(
        source,
        dataset.inputs,
        feeds=feeds,
        output_names=output_names,
        state=state,
        sequences=dataset.sequences,
        batch_size=batch_size,
    )
    for name, array in result.outputs.items():
        if not np.isfinite(array).all():
            raise BuildError(
                f"ONNX Runtime computes NaN or infinity in output '{name}' of {source.name} on "
                "the evaluation set",
                stage="reference",
                hint="Check the evaluation inputs and their preprocessing (mean/std, dtype).",
            )
    cache.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    arrays = {f"out:{n}": a for n, a in result.outputs.items()}
    arrays.update({f"state:{n}": a for n, a in result.states.items()})
    np.savez(buffer, **arrays)  # type: ignore[arg-type]
    atomic_write(cache, buffer.getvalue())
    return result


REFERENCE_CACHE = Path(".cache") / "reference"


def calibration_samples(
    source: Path,
    selected: Dataset,
    feeds: list[toolchain.InputFeed],
    output_names: list[str],
    state: list[tuple[str, str]],
) -> list[dict[str, np.ndarray]]:
    """Calibration samples as the quantizer feeds them, every input from real data.

    State inputs take the states the fp32 model itself carries through each
    calibration sequence (run with ONNX Runtime), never zeros or noise.
    """
    states: dict[str, np.ndarray] = {}
    if state:
        streamed = toolchain.run_onnx(
            source,
            selected.inputs,
            feeds=feeds,
            output_names=output_names,
            state=state,
            sequences=selected.sequences,
        )
        states = streamed.states
    samples = []
    for index in range(len(selected)):
        sample = {}
        for feed in feeds:
            if feed.name in states:
                sample[feed.name] = states[feed.name][index]
            else:
                sample[feed.name] = feed.sample(selected.inputs[feed.name], index)
        samples.append(sample)
    return samples


#: Samples the minimum-runtime proof runs (each one forward in the old runtime).
PROOF_SAMPLES = 64


def prove_runtime(
    artifact: Path,
    version: str,
    feeds: list[toolchain.InputFeed],
    output_names: list[str],
    evaluation: Dataset,
    reference: toolchain.StreamResult,
    state: list[tuple[str, str]],
    *,
    mode: str,
    root: Path,
) -> RuntimeProof:
    """Load and run the artifact with the declared minimum MNN runtime.

    The first :data:`PROOF_SAMPLES` forwards are fed as whole tensors to both
    runtimes (a stateful model's steps take the states the reference carried),
    so the old runtime and the build's compute the same thing.
    """
    count = min(PROOF_SAMPLES, len(evaluation))
    states = dict(reference.states)
    rows: dict[str, np.ndarray] = {}
    for feed in feeds:
        if feed.name in states:
            rows[feed.name] = states[feed.name][:count]
        else:
            data = evaluation.inputs[feed.name]
            rows[feed.name] = np.stack([feed.sample(data, i) for i in range(count)])
    whole = [toolchain.InputFeed(f.name, f.dtype, f.shape, None) for f in feeds]
    expected = toolchain.run_inference(artifact, rows, feeds=whole, output_names=output_names)
    return prove_min_runtime(
        artifact,
        version,
        rows,
        expected,
        input_names=[f.name for f in feeds],
        output_names=output_names,
        tolerance=default_tolerance(mode),
        root=root,
        whole_tensors=True,
    )


def benchmark_sample(
    feeds: list[toolchain.InputFeed], evaluation: Dataset, state: list[tuple[str, str]]
) -> dict[str, np.ndarray]:
    """One forward's inputs: the first evaluation sample, zero state."""
    state_inputs = {pair[0] for pair in state}
    sample = {}
    for feed in feeds:
        if feed.name in state_inputs:
            sample[feed.name] = np.zeros(feed.shape, dtype=feed.dtype)
        else:
            sample[feed.name] = feed.sample(evaluation.inputs[feed.name], 0)
    return sample
