"""Scoring a variant the way its app runs it.

The fp32 reference, the task's evaluator (its kind's, from :mod:`edgereg.tasks`),
calibration inputs, the minimum-runtime proof and the benchmark's inputs.

Stages of :func:`edgereg.build.variant.build_variant` that read datasets and
run models; the numbers they produce are judged in :mod:`edgereg.build.quality`.
"""

from __future__ import annotations

import hashlib
import io
import logging
from pathlib import Path

import numpy as np

from edgereg import toolchain
from edgereg._files import atomic_write
from edgereg.build.datasets import Dataset
from edgereg.config import Config, MetricBudget, Model
from edgereg.errors import BuildError, ConfigError
from edgereg.protocol._json import canonical_json
from edgereg.tasks import evaluator
from edgereg.tasks.scoring import (
    TaskData,
    TaskDataError,
    TaskScores,
    TaskShapeError,
    beyond_trivial,
)
from edgereg.toolchain.runtimes import RuntimeProof, default_tolerance, prove_min_runtime

logger = logging.getLogger(__name__)


class TaskEvaluator:
    """The model's task, scored on one evaluation set by the task kind's evaluator."""

    def __init__(
        self, config: Config, model: Model, charset: list[str] | None, evaluation: Dataset
    ) -> None:
        self._config = config
        self._model = model
        self._charset = charset
        self._evaluation = evaluation
        self._output = model.task_output
        self._evaluate = evaluator(model.task)
        self._derived_gates: dict[str, MetricBudget] = {}

    def check_reference(self, reference: dict[str, np.ndarray]) -> None:
        """Fail early when the labels or task settings cannot fit the outputs."""
        self.scores(reference, reference)

    def scores(
        self, reference: dict[str, np.ndarray], produced: dict[str, np.ndarray]
    ) -> TaskScores:
        """Score the variant's outputs against the reference and the labels."""
        data = TaskData(
            reference=reference[self._output],
            variant=produced[self._output],
            labels=self._evaluation.labels,
            classes=self._model.classes,
            charset=self._charset,
            inputs=self._evaluation.inputs,
            reference_outputs=reference,
            variant_outputs=produced,
            root=self._config.root,
        )
        try:
            scores = self._evaluate(self._model.task, data)
        except TaskShapeError as exc:
            name = next(n for n, m in self._config.models.items() if m is self._model)
            raise ConfigError(
                f"evaluation set {self._model.evaluation.path}: {exc}",
                file=str(self._config.path),
                key_path=f"models.{name}.evaluation",
                hint=exc.hint,
            ) from exc
        except TaskDataError as exc:
            raise BuildError(
                f"evaluation set {self._model.evaluation.path}: {exc}",
                stage="evaluate",
                hint="Fix the labels or the task settings in models.toml so they fit the "
                "model's outputs.",
            ) from exc
        # The same rule as a classifier's chance level, for every task with
        # labels: a VAD whose reference never fires scores below "always
        # speech", and its variants' agreement with it would prove nothing.
        # Labels a trivial predictor already gets right set no gate.
        self._derived_gates = {
            name: MetricBudget(min_baseline=round(beyond_trivial(level), 4))
            for name, level in scores.trivial.items()
            if level < 0.999
        }
        self._derived_gates.update(scores.own_gates)
        return scores

    @property
    def derived_gates(self) -> dict[str, MetricBudget]:
        """Gates the evaluation itself sets; models.toml overrides them.

        A custom evaluator's own, a classifier's chance level
        (``accuracy.min_baseline``), and for every other task with labels the
        level a trivial predictor reaches (``f1.min_baseline`` and the like).
        """
        return self._derived_gates


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
