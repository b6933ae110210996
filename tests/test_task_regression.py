"""The regression task kind: values read as they are, scored by MAE and RMSE.

Added as one spec (edgereg/tasks/regression.py), its evaluator
(edgereg/tasks/regression_eval.py) and these tests: the proof that a task kind
costs its own files and a line of the registry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tiny_models
from test_build_tasks import TaskProject, save, sha

from edgereg import toolchain
from edgereg.build.outputs import headline
from edgereg.build.quality import check_gates, default_budgets
from edgereg.config import Budgets, ConfigError, MetricBudget
from edgereg.errors import GateError
from edgereg.tasks import SHORTHAND_KINDS, task_class
from edgereg.tasks.regression import RegressionTask
from edgereg.tasks.regression_eval import regression_scores
from edgereg.tasks.scoring import TaskDataError

TASK = RegressionTask(kind="regression")


def test_errors_against_the_reference_and_the_labels() -> None:
    reference = np.array([[[1.0, 2.0]], [[3.0, 4.0]]], np.float32)  # (N, 1, 2): a batch axis
    variant = reference + np.array([[[0.5, -0.5]], [[0.0, 1.0]]], np.float32)
    labels = np.array([[1.0, 3.0], [3.0, 2.0]], np.float32)
    scores = regression_scores(TASK, reference, variant, labels)
    assert scores.metrics["mae"] == pytest.approx(0.5)
    assert scores.metrics["rmse"] == pytest.approx(np.sqrt(1.5 / 4))
    # Variant values 1.5, 1.5, 3, 5 against labels 1, 3, 3, 2.
    assert scores.metrics["label_mae"] == pytest.approx((0.5 + 1.5 + 0 + 3) / 4)
    assert scores.metrics["label_rmse"] == pytest.approx(np.sqrt((0.25 + 2.25 + 9) / 4))
    assert scores.baseline == pytest.approx({"label_mae": 0.75, "label_rmse": np.sqrt(5 / 4)})
    # The labels' mean per value (2, 2.5) everywhere scores (1 + .5 + 1 + .5) / 4.
    assert scores.own_gates["label_mae"].max_baseline == pytest.approx(0.9 * 0.75)
    assert set(scores.metric_info) == {"mae", "rmse", "label_mae", "label_rmse"}
    assert not scores.trivial, "the trivial level of a lower-is-better metric is a max_baseline"


def test_an_identical_variant_has_no_error_and_the_set_without_labels_no_label_metric() -> None:
    reference = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    scores = regression_scores(TASK, reference, reference.copy(), None)
    assert scores.metrics == {"mae": 0.0, "rmse": 0.0}
    assert scores.baseline == {}
    assert scores.own_gates == {}


@pytest.mark.parametrize(
    ("labels", "message"),
    [
        (np.zeros((3, 5), np.float32), "hold 5 values per sample, the output 4"),
        (np.array(["a", "b", "c"]), "regression labels must be numbers"),
        (np.ones((3, 4), np.bool_), "regression labels must be numbers"),
        (np.full((3, 4), np.nan, np.float32), "NaN or infinity"),
    ],
)
def test_labels_that_cannot_be_the_outputs_values_are_named(
    labels: np.ndarray, message: str
) -> None:
    reference = np.zeros((3, 4), np.float32)
    with pytest.raises(TaskDataError, match=message):
        regression_scores(TASK, reference, reference, labels)


def test_the_spec_is_read_through_the_registry() -> None:
    assert task_class("regression") is RegressionTask
    assert "regression" in SHORTHAND_KINDS  # task = "regression" needs no settings
    budgets = default_budgets("regression", "int8")
    assert budgets.metrics == {}, "errors are in the output's units: no default limit"
    assert budgets.min_cosine == default_budgets("generic", "int8").min_cosine
    found = headline({"task": "regression", "metrics": {"mae": 0.1, "label_mae": 0.3}})
    assert found is not None
    assert found.name == "label_mae"


def test_a_gate_on_an_error_reads_at_most() -> None:
    reference = np.zeros((4, 2), np.float32)
    scores = regression_scores(TASK, reference, reference + 0.2, None)
    budgets = Budgets(metrics={"mae": MetricBudget(max=0.1)})
    report = check_gates(
        budgets,
        size_bytes=0,
        agreement={},
        scores=scores,
        latency_p50_ms=None,
    )
    assert [r.describe() for r in report.failures] == ["mae.max 0.2 > 0.1"]


def _project(root: Path, labels: np.ndarray | None = None) -> TaskProject:
    # The tiny probability-map model read as a regression of its map (a depth map, say).
    source = tiny_models.dense_map_model(root / "depth.onnx")
    rng = np.random.default_rng(21)
    size = tiny_models.MAP_SIZE
    images = rng.normal(0, 1, (48, 1, size, size)).astype(np.float32)
    reference = toolchain.run_onnx(source, {"image": images}).outputs["prob"]
    if labels is None:
        labels = (reference[:, 0] + rng.normal(0, 0.01, reference[:, 0].shape)).astype(np.float32)
    evaluation = save(root / "evaluation.npz", {"image": images, "labels": labels})
    calibration = save(root / "calibration.npz", {"image": images[:24]})
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = "regression"
source = {{ path = "depth.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}

[models.m.budgets]
metrics.mae = {{ max = 0.05 }}
metrics.label_mae = {{ max_drop = 0.05 }}

[[models.m.inputs]]
name = "image"
shape = [1, 1, {size}, {size}]

[[models.m.outputs]]
name = "prob"
""",
    )


def test_a_regression_model_builds_gated_on_its_errors(tmp_path: Path) -> None:
    project = _project(tmp_path)
    fp32 = project.build("fp32").metrics
    assert fp32["status"] == "passed", fp32["failed"]
    assert fp32["task"] == "regression"
    assert fp32["metrics"]["mae"] < 1e-5
    assert 0.005 < fp32["baseline"]["label_mae"] < 0.012  # the labels' noise
    int8 = project.build("int8").metrics
    assert int8["status"] == "passed", int8["failed"]
    assert 0 < int8["metrics"]["mae"] < 0.05
    # A limit the int8 variant cannot keep fails it with its numbers kept.
    project.edit("metrics.mae = { max = 0.05 }", "metrics.mae = { max = 1e-7 }")
    with pytest.raises(GateError) as caught:
        project.build("int8")
    assert "mae.max" in caught.value.message
    assert project.metrics("int8")["metrics"]["mae"] == pytest.approx(int8["metrics"]["mae"])


def test_a_reference_no_better_than_the_labels_mean_fails_its_build(tmp_path: Path) -> None:
    labels = np.random.default_rng(3).uniform(0, 1, (48, 1, 8, 8)).astype(np.float32)
    project = _project(tmp_path, labels)
    with pytest.raises(GateError) as caught:
        project.build("fp32")
    assert "label_mae.max_baseline" in caught.value.message


def test_models_toml_refuses_a_baseline_limit_on_an_agreement_error(tmp_path: Path) -> None:
    project = _project(tmp_path)
    project.edit("metrics.mae = { max = 0.05 }", "metrics.mae = { max_drop = 0.05 }")
    with pytest.raises(ConfigError, match="compares the variant with the reference itself"):
        project.load()
