"""`edgereg build`: one variant of models.toml becomes a verified, gated, reproducible model.mnn.

Real MNN (through edgereg.toolchain) and ONNX Runtime on the tiny project of
tests/buildkit.py. Every variant is built once per module; tests that change
something work on a copy, so every failing build starts with the good outputs
of an earlier build in place and has to remove them.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import re
import shutil
import zipfile
from pathlib import Path
from typing import Any

import buildkit
import numpy as np
import pytest
import tiny_models
from buildkit import FAST_BENCH, IMAGE_MODEL, TENSOR_MODEL, Project
from click.testing import CliRunner, Result

from edgereg import toolchain
from edgereg.build.contract import io_contract
from edgereg.build.datasets import Dataset, load_dataset, select_calibration
from edgereg.build.outputs import (
    ARTIFACT,
    CLASS_RECALL_PLOT,
    CONTRACT,
    HOST_BENCHMARK,
    LABELS,
    METRICS,
    OUTPUT_FILES,
    PROBE,
    PROBE_DATA,
    PROVENANCE,
)
from edgereg.build.probe import (
    check_on_host,
    probe_bytes,
    probe_outputs_on_host,
    probe_tolerance,
    select_probe_rows,
)
from edgereg.build.quality import OutputAgreement, check_gates, default_budgets
from edgereg.build.variant import build_variant
from edgereg.cli import main
from edgereg.config import Budgets, ClassificationTask, MetricBudget
from edgereg.errors import BuildError, ConfigError, EdgeregError, GateError, ToolchainError
from edgereg.protocol.contract import INLINE_LABELS_MAX_BYTES, BlobRef, IOContract
from edgereg.protocol.probe import GoldenProbe, check_probe
from edgereg.protocol.wire import from_bytes
from edgereg.tasks.classification_eval import classification_scores
from edgereg.toolchain import _mnnfile, _process
from edgereg.toolchain.runtimes import RuntimeProofError

ALL_VARIANTS = [
    (model, variant) for model, variants in buildkit.VARIANTS.items() for variant in variants
]
CLASSES = {IMAGE_MODEL: buildkit.IMAGE_CLASSES, TENSOR_MODEL: buildkit.TENSOR_CLASSES}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The tiny project with every variant built once (read-only: copy before changing)."""
    return buildkit.write_built_project(tmp_path_factory.mktemp("built"))


@pytest.fixture
def project(built: Project, tmp_path: Path) -> Project:
    """A private copy of the built project, good outputs of every variant included."""
    root = tmp_path / "project"
    shutil.copytree(built.root, root)
    return Project(root)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def cli(*args: str) -> Result:
    return CliRunner().invoke(main, list(args))


def cli_build(project: Project, model: str, variant: str) -> Result:
    return cli(
        "build",
        model,
        variant,
        "--config",
        str(project.config_path),
        "--out",
        str(project.out_root),
        "--iterations",
        "3",
    )


# --- what a build writes ---------------------------------------------------------


@pytest.mark.parametrize(("model", "variant"), ALL_VARIANTS)
def test_every_variant_builds_with_metrics_and_provenance(
    built: Project, model: str, variant: str
) -> None:
    out = built.out_dir(model, variant)
    # Small inputs: the probe's tensors are inline, no probe-data.bin.
    assert sorted(path.name for path in out.iterdir()) == sorted(set(OUTPUT_FILES) - {PROBE_DATA})
    config = built.load()
    declared = config.models[model].variants[variant]
    artifact = out / ARTIFACT

    metrics = read_json(out / METRICS)
    assert {"status", "task", "precision", "size_mb", "agreement", "metrics", "baseline"} <= set(
        metrics
    )
    assert metrics["status"] == "passed"
    assert metrics["failed"] == []
    assert metrics["task"] == "classification"
    assert metrics["size_mb"] == pytest.approx(artifact.stat().st_size / 1e6)
    output = config.models[model].outputs[0].name
    agree = metrics["agreement"][output]
    assert {"cosine", "snr_db", "max_abs_error", "min_sample_cosine"} <= set(agree)
    assert agree["cosine"] > 0.99
    assert metrics["metrics"]["top1_agreement"] == 1.0
    # The labels are ONNX Runtime's own predictions on the raw uint8 pictures, so a
    # perfect baseline also proves the build preprocessed them as declared.
    assert metrics["baseline"]["accuracy"] == 1.0
    assert metrics["metrics"]["accuracy"] == 1.0
    assert metrics["metrics"]["class_recall_drop"] == 0.0
    threads = declared.runtime.threads
    # Host timings live apart from the reproducible metrics (a DVC stage output).
    assert "benchmark" not in metrics
    host = read_json(out / HOST_BENCHMARK)
    assert host["figures"] == "host"
    # The variant's own count is timed (what the gates judge and what ships); the host
    # sweep beside it is labelled as the build host's figure.
    latency = host[f"threads_{threads}"]
    assert 0 < latency["p50_ms"] <= latency["p90_ms"]
    assert host["host_threads"]["figures"] == "host"
    assert host["host_threads"]["declared_threads"] == threads
    assert host["load_ms"] > 0
    assert host["peak_rss_mb"] > 0
    gates = metrics["gates"]
    assert {
        "max_size_mb",
        f"min_cosine[{output}]",
        f"min_snr_db[{output}]",
        "top1_agreement.min",
        "accuracy.max_drop",
        "accuracy.min_baseline",
        "class_recall_drop.max",
    } <= set(gates)
    assert all(gates.values())

    recall = read_json(out / CLASS_RECALL_PLOT)
    assert [row["class"] for row in recall] == list(CLASSES[model])
    assert all(row["change"] == row["variant"] - row["onnx"] for row in recall)
    assert [row["threads"] for row in host["latency"]] == [threads]

    provenance = read_json(out / PROVENANCE)
    ref = declared.source or config.models[model].source
    assert (
        provenance["source"]["sha256"] == ref.sha256 == buildkit.sha256_file(built.path(ref.path))
    )
    assert provenance["source"]["path"] == ref.path
    assert provenance["evaluation"]["sha256"] == config.models[model].evaluation.sha256
    assert provenance["evaluation"]["samples"] == buildkit.EVALUATION_PER_CLASS * len(
        CLASSES[model]
    )
    assert provenance["toolchain"] == toolchain.installed_versions()
    assert provenance["toolchain"] == config.toolchain.as_dict()
    digest = config.recipe_digest(model, variant)
    assert provenance["recipe_sha256"] == digest
    assert provenance["recipe"] == config.recipe(model, variant)
    assert provenance["mnn_uuid"] == _mnnfile.derive_uuid(digest.encode())
    assert provenance["artifact"] == {
        "path": ARTIFACT,
        "sha256": buildkit.sha256_file(artifact),
        "size": artifact.stat().st_size,
    }
    assert provenance["min_mnn_runtime"] == toolchain.installed_version("mnn")
    # The record proves what apps are told: the contract and the probe, by digest.
    for key, name in (("contract", CONTRACT), ("probe", PROBE)):
        assert provenance[key] == {
            "path": name,
            "sha256": buildkit.sha256_file(out / name),
            "size": (out / name).stat().st_size,
        }
    assert (provenance["model"], provenance["variant"]) == (model, variant)
    assert provenance["tier"] == declared.tier
    assert provenance["runtime"] == declared.runtime.model_dump()
    if declared.quantization.mode == "int8":
        calibration = provenance["calibration"]
        declared_set = config.models[model].calibration
        assert declared_set is not None
        assert calibration["sha256"] == declared_set.sha256
        assert calibration["samples"] == buildkit.CALIBRATION_SAMPLES
        assert calibration["balanced"] is True
        assert re.fullmatch(r"[0-9a-f]{64}", calibration["selected_sha256"])
    else:
        assert provenance["calibration"] is None


def test_variants_are_converted_as_declared(built: Project) -> None:
    def argv(model: str, variant: str) -> list[str]:
        return list(read_json(built.out_dir(model, variant) / PROVENANCE)["converter_argv"])

    def size(model: str, variant: str) -> int:
        return built.out_dir(model, variant).joinpath(ARTIFACT).stat().st_size

    assert "--fp16" in argv(TENSOR_MODEL, "fp16")
    assert "--fp16" not in argv(IMAGE_MODEL, "fp32")
    for model in buildkit.MODELS:
        flags = argv(model, "w8")
        assert flags[flags.index("--weightQuantBits") + 1] == "8"
        assert "--weightQuantBits" not in argv(model, "int8")
    # Weight-only and int8 shrink the float model; the conv weights dominate its size.
    fp32 = size(IMAGE_MODEL, "fp32")
    assert size(IMAGE_MODEL, "w8") < 0.6 * fp32
    assert size(IMAGE_MODEL, "int8") < 0.6 * fp32
    int8 = toolchain.model_info(built.out_dir(IMAGE_MODEL, "int8") / ARTIFACT)
    assert int8.input_names == ("image",)


def test_calibration_subset_is_class_balanced_and_recorded(built: Project) -> None:
    config = built.load()
    for model in buildkit.MODELS:
        spec = config.models[model]
        assert spec.calibration is not None
        full = load_dataset(
            config.resolve_path(spec.calibration), spec.inputs, stage="quantize", need_labels=False
        )
        selected = select_calibration(full, buildkit.CALIBRATION_SAMPLES, balanced=True)
        assert selected.labels is not None
        counts = np.bincount(selected.labels, minlength=len(CLASSES[model]))
        assert counts.sum() == buildkit.CALIBRATION_SAMPLES
        assert counts.max() - counts.min() <= 1
        recorded = read_json(built.out_dir(model, "int8") / PROVENANCE)["calibration"]
        assert recorded["selected_sha256"] == selected.digest()
        assert recorded["selected_sha256"] != full.digest()


@pytest.mark.parametrize(
    ("model", "variant"), [(IMAGE_MODEL, "fp32"), (IMAGE_MODEL, "int8"), (TENSOR_MODEL, "int8")]
)
def test_same_inputs_build_identical_bytes(
    built: Project, project: Project, model: str, variant: str
) -> None:
    project.build(model, variant)
    again = project.out_dir(model, variant)
    first = built.out_dir(model, variant)
    assert (again / ARTIFACT).read_bytes() == (first / ARTIFACT).read_bytes()
    assert read_json(again / PROVENANCE) == read_json(first / PROVENANCE)
    assert read_json(again / CLASS_RECALL_PLOT) == read_json(first / CLASS_RECALL_PLOT)
    # The golden probe and the contract are the same bytes too (dvc.lock stays put).
    for name in (PROBE, CONTRACT, LABELS):
        assert (again / name).read_bytes() == (first / name).read_bytes()


# --- the I/O contract and the golden probe -------------------------------------------


def read_contract(out: Path) -> IOContract:
    return IOContract.model_validate(read_json(out / CONTRACT))


def read_probe(out: Path) -> GoldenProbe:
    return from_bytes(GoldenProbe, (out / PROBE).read_bytes())


def test_the_contract_of_a_two_input_model(built: Project) -> None:
    contract = read_contract(built.out_dir(TENSOR_MODEL, "int8"))
    assert [(t.name, t.dtype, t.shape, t.batch_axis, t.kind) for t in contract.inputs] == [
        ("a", "float32", [1, 8], 0, "tensor"),
        ("b", "float32", [1, 4], 0, "tensor"),
    ]
    assert all(t.layout is t.color is t.mean is t.std is None for t in contract.inputs)
    # The output's shape is the ONNX graph's: its dynamic batch axis keeps its name.
    (output,) = contract.outputs
    assert (output.name, output.dtype) == ("y", "float32")
    assert output.shape == ["N", len(buildkit.TENSOR_CLASSES)]  # tiny_models names it N
    assert contract.state == []
    assert (contract.task.kind, contract.task.output) == ("classification", "y")
    assert contract.task.threshold is contract.task.blank is None
    assert contract.labels == list(buildkit.TENSOR_CLASSES)
    assert contract.labels_blob is None
    assert json.loads((built.out_dir(TENSOR_MODEL, "int8") / LABELS).read_bytes()) == list(
        buildkit.TENSOR_CLASSES
    )


def test_the_contract_of_an_image_model_says_how_to_preprocess(built: Project) -> None:
    (image,) = read_contract(built.out_dir(IMAGE_MODEL, "fp32")).inputs
    assert (image.kind, image.layout, image.color) == ("image", "NCHW", "RGB")
    assert image.shape == [1, 3, buildkit.IMAGE_SIZE, buildkit.IMAGE_SIZE]
    assert image.mean == image.std == [127.5, 127.5, 127.5]


def test_a_large_class_list_becomes_a_labels_blob(built: Project) -> None:
    config = built.load()
    model = config.models[IMAGE_MODEL]
    names = [f"class {index}: " + "x" * 40 for index in range(64)]
    many = model.model_copy(update={"classes": names})
    graph = toolchain.inspect_onnx(built.path(model.source.path))
    built_contract = io_contract(IMAGE_MODEL, many, config.resolve(IMAGE_MODEL, "fp32"), graph)
    contract = built_contract.contract
    blob = json.dumps(names, ensure_ascii=False, separators=(",", ":")).encode()
    assert len(blob) > INLINE_LABELS_MAX_BYTES
    assert contract.labels is None
    assert contract.labels_blob == BlobRef.of(hashlib.sha256(blob).hexdigest(), len(blob))
    assert built_contract.labels == names
    # Small lists stay inline.
    few = io_contract(IMAGE_MODEL, model, config.resolve(IMAGE_MODEL, "fp32"), graph).contract
    assert few.labels == list(buildkit.IMAGE_CLASSES)


def test_a_contract_naming_an_output_the_graph_lacks_is_a_build_error(built: Project) -> None:
    config = built.load()
    model = config.models[IMAGE_MODEL]
    renamed = model.model_copy(
        update={"outputs": [model.outputs[0].model_copy(update={"name": "scores"})]}
    )
    graph = toolchain.inspect_onnx(built.path(model.source.path))
    with pytest.raises(BuildError) as caught:
        io_contract(IMAGE_MODEL, renamed, config.resolve(IMAGE_MODEL, "fp32"), graph)
    assert caught.value.stage == "contract"
    assert "has no output 'scores'" in caught.value.message
    assert tiny_models.CONV_OUTPUT in caught.value.message


def test_a_contract_the_wire_format_cannot_carry_is_named_field_by_field(built: Project) -> None:
    config = built.load()
    model = config.models[IMAGE_MODEL]
    long_name = "y" * 300
    renamed = model.model_copy(
        update={"outputs": [model.outputs[0].model_copy(update={"name": long_name})]}
    )
    graph = toolchain.inspect_onnx(built.path(model.source.path))
    output = dataclasses.replace(graph.outputs[0], name=long_name)
    with pytest.raises(BuildError) as caught:
        io_contract(
            IMAGE_MODEL,
            renamed,
            config.resolve(IMAGE_MODEL, "fp32"),
            dataclasses.replace(graph, outputs=(output,)),
        )
    message = caught.value.message
    assert caught.value.stage == "contract"
    assert "the I/O contract cannot describe this model: name: String should have at most 256" in (
        message
    )
    assert "validation error" not in message  # pydantic's own report, not a user's text
    assert caught.value.hint is not None


@pytest.mark.parametrize(("model", "variant"), ALL_VARIANTS)
def test_the_probe_passes_the_variant_rerun_on_the_host(
    built: Project, model: str, variant: str
) -> None:
    out = built.out_dir(model, variant)
    probe = read_probe(out)
    assert (probe.model, probe.variant) == (model, variant)
    assert probe.artifact_sha256 == buildkit.sha256_file(out / ARTIFACT)
    assert 2 <= len(probe.cases) <= 4
    assert all(len(case.steps) == 1 for case in probe.cases)
    assert (out / PROBE).stat().st_size < 1_000_000
    # Two threads split the kernels differently from the build's one: still a pass.
    for threads in (1, 2):
        result = check_on_host(out / ARTIFACT, probe, read_contract(out), threads=threads)
        assert result.passed, result.failure
    assert probe.tolerance.max_abs_error > 0
    assert probe.tolerance.min_cosine <= 0.9999


def _perturbed(
    computed: list[list[dict[str, list[float]]]], change: Any
) -> list[list[dict[str, list[float]]]]:
    return [
        [
            {name: change(np.asarray(values)).tolist() for name, values in step.items()}
            for step in case
        ]
        for case in computed
    ]


def _flip_largest_channel(values: np.ndarray) -> np.ndarray:
    flipped = values.copy()
    index = int(np.argmax(np.abs(values)))
    flipped[index] = -flipped[index]
    return flipped


@pytest.mark.parametrize(("model", "variant"), ALL_VARIANTS)
def test_the_probe_fails_a_backend_that_flips_one_channel(
    built: Project, model: str, variant: str
) -> None:
    out = built.out_dir(model, variant)
    probe = read_probe(out)
    computed = probe_outputs_on_host(out / ARTIFACT, probe, read_contract(out))
    result = check_probe(probe, _perturbed(computed, _flip_largest_channel))
    assert not result.passed
    assert result.failure is not None
    assert "case 1 step 1 output" in result.failure


@pytest.mark.parametrize(("model", "variant"), [(IMAGE_MODEL, "fp32"), (TENSOR_MODEL, "fp16")])
def test_the_probe_fails_five_percent_noise_on_a_float_variant(
    built: Project, model: str, variant: str
) -> None:
    out = built.out_dir(model, variant)
    probe = read_probe(out)
    computed = probe_outputs_on_host(out / ARTIFACT, probe, read_contract(out))
    rng = np.random.default_rng(5)

    def noisy(values: np.ndarray) -> np.ndarray:
        rms = float(np.sqrt(np.mean(values**2)))
        return values + 0.05 * rms * rng.standard_normal(values.shape)

    result = check_probe(probe, _perturbed(computed, noisy))
    assert not result.passed
    assert result.worst_cosine < probe.tolerance.min_cosine


def test_the_probe_tolerance_follows_the_documented_rule() -> None:
    expected = {"y": np.array([[[3.0, -1.0, 0.5]], [[2.0, 0.0, -4.0]]], np.float32)}
    # The host reproduces itself exactly: the gate (capped at 0.9999) and 1% of the scale.
    same = probe_tolerance(expected, expected, budget_min_cosine=0.98, variant_max_abs_error=0.0)
    assert (same.min_cosine, same.max_abs_error) == (0.98, 0.04)
    tight = probe_tolerance(expected, expected, budget_min_cosine=1.0, variant_max_abs_error=0.0)
    assert tight.min_cosine == 0.9999
    # The variant's own error against the fp32 model, rounded up to two digits.
    loose = probe_tolerance(
        expected, expected, budget_min_cosine=0.98, variant_max_abs_error=0.1234
    )
    assert loose.max_abs_error == 0.13
    # A host that differs from itself loosens both, to twice its own deviation.
    moved = {"y": expected["y"] + np.array([0.0, 0.0, 0.25], np.float32)}
    wide = probe_tolerance(expected, moved, budget_min_cosine=1.0, variant_max_abs_error=0.0)
    assert wide.max_abs_error == 0.5
    assert wide.min_cosine < 0.999
    # ... and the host's other run passes the probe it loosened, through its bytes.
    check = from_bytes(GoldenProbe, probe_bytes(_one_step_probe(expected["y"][0], wide)))
    assert check_probe(check, [[{"y": moved["y"][0].reshape(-1).tolist()}]]).passed


def _one_step_probe(values: np.ndarray, tolerance: Any) -> GoldenProbe:
    tensor = {
        "name": "y",
        "dtype": "float32",
        "shape": list(values.shape),
        "data": base64.b64encode(values.astype("<f4").tobytes()).decode(),
    }
    return GoldenProbe.model_validate(
        {
            "model": "m",
            "variant": "v",
            "artifact_sha256": "0" * 64,
            "cases": [{"steps": [{"inputs": [tensor], "expected": [tensor]}]}],
            "tolerance": tolerance.model_dump(),
        }
    )


def test_large_inputs_get_fewer_probe_cases() -> None:
    def dataset(width: int, count: int = 10) -> tuple[Dataset, list[toolchain.InputFeed]]:
        rows = np.zeros((count, width), np.float32)
        return Dataset({"x": rows}, None), [toolchain.InputFeed("x", "float32", (1, width), 0)]

    small, feeds = dataset(8)
    chosen = select_probe_rows(small, feeds, [], {"y": np.zeros((10, 1, 2), np.float32)})
    assert chosen.rows.tolist() == [0, 3, 6, 9]  # spread, first and last included
    # 100,000 floats a sample: about 533 KB of base64, so one case keeps it under 1 MB.
    large, feeds = dataset(100_000)
    chosen = select_probe_rows(large, feeds, [], {"y": np.zeros((10, 1, 2), np.float32)})
    assert chosen.rows.tolist() == [0]
    # 70,000 floats, about 373 KB of base64 each: two cases fit.
    medium, feeds = dataset(70_000)
    chosen = select_probe_rows(medium, feeds, [], {"y": np.zeros((10, 1, 2), np.float32)})
    assert chosen.rows.tolist() == [0, 9]
    assert [len(case) for case in chosen.cases()] == [1, 1]


def test_a_changed_variant_gets_a_new_recipe_and_id(built: Project, project: Project) -> None:
    project.edit_table(f"models.{IMAGE_MODEL}.variants.int8", '"KL"', '"ADMM"')
    result = project.build(IMAGE_MODEL, "int8")
    before = read_json(built.out_dir(IMAGE_MODEL, "int8") / PROVENANCE)
    after = result.provenance
    assert after["recipe"]["quantization"]["method"] == "ADMM"
    assert after["recipe_sha256"] != before["recipe_sha256"]
    assert after["recipe_sha256"] == project.load().recipe_digest(IMAGE_MODEL, "int8")
    assert after["artifact"]["sha256"] != before["artifact"]["sha256"]
    assert after["mnn_uuid"] == _mnnfile.derive_uuid(after["recipe_sha256"].encode())
    assert after["mnn_uuid"] != before["mnn_uuid"]
    # Another variant's recipe does not move.
    assert project.load().recipe_digest(IMAGE_MODEL, "fp32") == built.load().recipe_digest(
        IMAGE_MODEL, "fp32"
    )


def test_cli_build_reports_stages_and_writes_the_outputs(project: Project) -> None:
    shutil.rmtree(project.out_dir(TENSOR_MODEL, "w8"))
    result = cli_build(project, TENSOR_MODEL, "w8")
    assert result.exit_code == 0, result.output
    assert f"{TENSOR_MODEL}/w8: convert" in result.stderr
    assert f"{TENSOR_MODEL}/w8: built" in result.stdout
    out = project.out_dir(TENSOR_MODEL, "w8")
    # Small inputs: the probe's tensors are inline, no probe-data.bin.
    assert sorted(path.name for path in out.iterdir()) == sorted(set(OUTPUT_FILES) - {PROBE_DATA})
    metrics = read_json(out / METRICS)
    assert all(metrics["gates"].values())


# --- class-balanced calibration ----------------------------------------------


def _labelled(labels: list[int]) -> Dataset:
    count = len(labels)
    return Dataset(
        inputs={"x": np.arange(count, dtype=np.float32).reshape(count, 1)},
        labels=np.asarray(labels, dtype=np.int64),
    )


def test_select_calibration_takes_classes_in_turn() -> None:
    # Class 0 dominates; class 1 has only two samples; labels are interleaved.
    labels = [0, 0, 2, 0, 1, 0, 2, 0, 0, 2, 0, 1, 0, 2, 0, 0]
    data = _labelled(labels)
    for count, expected in [(3, [1, 1, 1]), (6, [2, 2, 2]), (7, [3, 2, 2]), (9, [4, 2, 3])]:
        chosen = select_calibration(data, count, balanced=True)
        assert chosen.labels is not None
        assert np.bincount(chosen.labels, minlength=3).tolist() == expected, count
        # The earliest samples of each class, kept in file order.
        indices = chosen.inputs["x"][:, 0].astype(int).tolist()
        assert indices == sorted(indices)
        for label in range(3):
            of_class = [i for i, value in enumerate(labels) if value == label]
            picked = [i for i in indices if labels[i] == label]
            assert picked == of_class[: len(picked)]
    again = select_calibration(data, 9, balanced=True)
    assert again.digest() == select_calibration(data, 9, balanced=True).digest()


def test_select_calibration_without_labels_or_balance_takes_the_first() -> None:
    data = _labelled([0, 0, 0, 1, 1, 2])
    first = select_calibration(data, 3, balanced=False)
    assert first.inputs["x"][:, 0].tolist() == [0, 1, 2]
    unlabelled = Dataset(inputs=data.inputs, labels=None)
    assert select_calibration(unlabelled, 2, balanced=True).inputs["x"][:, 0].tolist() == [0, 1]
    assert select_calibration(data, None, balanced=True) is data
    assert select_calibration(data, 100, balanced=True) is data


# --- gates (pure) -------------------------------------------------------------


PERFECT = {
    "logits": OutputAgreement(cosine=1.0, snr_db=99.0, max_abs_error=0.0, min_sample_cosine=1.0)
}
CLASSIFY = ClassificationTask(kind="classification")


def test_per_class_gate_catches_a_class_that_overall_accuracy_hides() -> None:
    names = [f"class{label}" for label in range(10)]
    labels = np.repeat(np.arange(10), 10)
    reference = np.eye(10, dtype=np.float32)[labels][:, None]
    quantized = reference.copy()
    # Three of the ten "class7" samples now come out as class 1: 3 % of everything,
    # 30 % of class 7.
    quantized[np.flatnonzero(labels == 7)[:3]] = np.eye(10, dtype=np.float32)[1]
    scores = classification_scores(CLASSIFY, reference, quantized, labels, names)
    assert scores.metrics["accuracy"] == pytest.approx(0.97)

    report = check_gates(
        Budgets(
            metrics={
                "accuracy": MetricBudget(max_drop=0.05),
                "class_recall_drop": MetricBudget(max=0.1),
            }
        ),
        size_bytes=1000,
        agreement=PERFECT,
        scores=scores,
        latency_p50_ms=None,
    )
    gates = {result.name: result for result in report.results}
    assert gates["accuracy.max_drop"].passed
    assert gates["accuracy.max_drop"].measured == pytest.approx(0.03)
    assert not gates["class_recall_drop.max"].passed
    assert gates["class_recall_drop.max"].measured == pytest.approx(0.3)
    assert gates["class_recall_drop.max"].budget == 0.1
    assert "class7: -0.300" in gates["class_recall_drop.max"].detail
    # Classes that lost nothing are not listed as "worst".
    assert "class0" not in gates["class_recall_drop.max"].detail
    assert not report.passed
    assert [failure.name for failure in report.failures] == ["class_recall_drop.max"]
    assert report.failures[0].describe().startswith("class_recall_drop.max 0.3 > 0.1")


def test_gates_pass_at_the_budget_and_skip_unset_budgets() -> None:
    labels = np.repeat(np.arange(4), 5)
    reference = np.eye(4, dtype=np.float32)[labels][:, None]
    quantized = reference.copy()
    quantized[0] = np.eye(4, dtype=np.float32)[3]  # class 0 loses one of five
    scores = classification_scores(CLASSIFY, reference, quantized, labels, None)
    common: dict[str, Any] = {
        "size_bytes": 500_000,
        "agreement": {"logits": OutputAgreement(0.99, 20.0, 0.002, 0.9)},
        "scores": scores,
        "latency_p50_ms": 3.0,
    }
    assert check_gates(Budgets(), **common).results == []
    exact = Budgets(
        max_size_mb=0.5,
        min_cosine=0.99,
        min_snr_db=20.0,
        max_abs_error=0.002,
        max_latency_p50_ms=3.0,
        metrics={
            "accuracy": MetricBudget(max_drop=0.05),
            "class_recall_drop": MetricBudget(max=0.2),
            "top1_agreement": MetricBudget(min=0.95),
        },
    )
    report = check_gates(exact, **common)
    assert report.passed, [f.describe() for f in report.failures]
    assert {result.name for result in report.results} == {
        "max_size_mb",
        "min_cosine[logits]",
        "min_snr_db[logits]",
        "max_abs_error[logits]",
        "accuracy.max_drop",
        "class_recall_drop.max",
        "top1_agreement.min",
        "max_latency_p50_ms",
    }
    tight = check_gates(exact.model_copy(update={"max_abs_error": 0.001}), **common)
    assert [failure.name for failure in tight.failures] == ["max_abs_error[logits]"]


@pytest.mark.parametrize("precision", ["fp32", "fp16", "weight", "int8"])
def test_default_agreement_budgets_loosen_with_precision(precision: str) -> None:
    order = ["fp32", "fp16", "weight", "int8"]
    budgets = default_budgets("classification", precision)  # type: ignore[arg-type]
    assert budgets.min_cosine is not None
    assert budgets.min_snr_db is not None
    for looser in order[order.index(precision) + 1 :]:
        other = default_budgets("classification", looser)  # type: ignore[arg-type]
        assert other.min_cosine is not None
        assert other.min_snr_db is not None
        assert other.min_cosine <= budgets.min_cosine
        assert other.min_snr_db <= budgets.min_snr_db


# --- bad input: a clear error, and nothing left that looks current ------------


def assert_fails(
    project: Project,
    model: str,
    variant: str,
    error_type: type[EdgeregError],
    stage: str,
    *fragments: str,
) -> BuildError:
    """Build with the library and the CLI; both must fail the same way and leave nothing.

    Before each attempt the variant's outputs from the earlier good build are in
    place, so a failure that left them would look like a current artifact.
    """
    out = project.out_dir(model, variant)
    stale = {path.name: path.read_bytes() for path in out.iterdir()}
    assert ARTIFACT in stale, "the project copy starts with a good build"

    with pytest.raises(error_type) as caught:
        build_variant(project.load(), model, variant, project.out_root, bench=FAST_BENCH)
    error = caught.value
    assert type(error) is error_type, f"{type(error).__name__}: {error.diagnostics()}"
    assert isinstance(error, BuildError)
    assert error.stage == stage
    for fragment in fragments:
        assert fragment in error.diagnostics(), f"{fragment!r} not in:\n{error.diagnostics()}"
    assert_no_outputs(project, model, variant, stage, measured=error_type is GateError)

    for name, data in stale.items():
        (out / name).write_bytes(data)
    result = cli_build(project, model, variant)
    assert result.exit_code == error.exit_code != 0, result.output
    assert "Traceback" not in result.stderr
    message = result.stderr[result.stderr.index("error: ") :].strip()
    assert "\n\n" not in message, f"not one paragraph:\n{message}"
    assert f"build stage '{stage}' failed" in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in:\n{message}"
    assert_no_outputs(project, model, variant, stage, measured=error_type is GateError)
    return error


def assert_no_outputs(
    project: Project, model: str, variant: str, stage: str, *, measured: bool = False
) -> None:
    """No artifact; only the failure record (metrics.json), with what was measured.

    A gate failure also leaves the host benchmark of the rejected candidate.
    The record names the stages that ran and the failing one.
    """
    out = project.out_dir(model, variant)
    left = sorted(path.name for path in out.iterdir()) if out.exists() else []
    expected = sorted([HOST_BENCHMARK, METRICS]) if measured else [METRICS]
    assert left == expected, f"{out} still holds {left}"
    metrics = read_json(out / METRICS)
    assert metrics["status"] == "failed"
    assert metrics["failed"]
    assert metrics["error"]["stage"] == stage
    assert metrics["error"]["message"]
    assert metrics["stages"][0] == "toolchain"
    assert metrics["recipe_sha256"] == project.load().recipe_digest(model, variant)
    # Nor a work directory next to it.
    assert [path.name for path in out.parent.iterdir() if path.name.startswith(".")] == []


def test_missing_source(project: Project) -> None:
    project.path("data/vision.onnx").unlink()
    assert_fails(
        project, IMAGE_MODEL, "fp32", BuildError, "source", "source", "data/vision.onnx not found"
    )


def test_source_sha256_mismatch(project: Project) -> None:
    tiny_models.conv_classifier(project.path("data/vision.onnx"), seed=7)
    actual = buildkit.sha256_file(project.path("data/vision.onnx"))
    pinned = project.load().models[IMAGE_MODEL].source.sha256
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "w8",
        BuildError,
        "source",
        "data/vision.onnx",
        f"has sha256 {actual}",
        f"pins {pinned}",
    )
    assert error.hint is not None
    assert "update the sha256 pin" in error.hint


def test_corrupt_onnx(project: Project) -> None:
    tiny_models.corrupt_file(project.path("data/vision.onnx"))
    project.pin("data/vision.onnx")
    assert_fails(
        project,
        IMAGE_MODEL,
        "fp32",
        BuildError,
        "check",
        "data/vision.onnx is not a valid ONNX model",
    )


def test_unsupported_operator_is_named_before_conversion(project: Project) -> None:
    tiny_models.unsupported_op_model(project.path("data/sensor.onnx"))
    project.pin("data/sensor.onnx")
    error = assert_fails(
        project,
        TENSOR_MODEL,
        "fp16",
        BuildError,
        "check",
        "data/sensor.onnx uses operators the MNN converter cannot convert",
        tiny_models.UNSUPPORTED_OP,
    )
    assert error.tool is None  # found by the pre-check, not by running the converter


def test_calibration_data_missing(project: Project) -> None:
    project.path("data/vision-calibration.npz").unlink()
    assert_fails(
        project,
        IMAGE_MODEL,
        "int8",
        BuildError,
        "source",
        "calibration set",
        "data/vision-calibration.npz not found",
    )


@pytest.mark.parametrize(
    ("model", "arrays", "fragments"),
    [
        pytest.param(
            IMAGE_MODEL,
            {"image": np.zeros((4, 4, 4, 3), np.uint8)},
            ("images in 'image' are (4, 4, 3) (H, W, C)", "the input needs (8, 8, 3)"),
            id="image",
        ),
        pytest.param(
            TENSOR_MODEL,
            {"a": np.zeros((4, 7), np.float32), "b": np.zeros((4, 4), np.float32)},
            ("array 'a' has rows of shape (7,)", "declared as (1, 8)"),
            id="tensor",
        ),
    ],
)
def test_calibration_data_of_the_wrong_shape(
    project: Project, model: str, arrays: dict[str, np.ndarray], fragments: tuple[str, ...]
) -> None:
    relative = f"data/{model}-calibration.npz"
    buildkit.write_npz(project.path(relative), arrays, np.arange(4) % 2)
    project.pin(relative)
    assert_fails(project, model, "int8", BuildError, "quantize", relative, *fragments)


def _nan(shape: tuple[int, ...]) -> np.ndarray:
    return np.full(shape, np.nan, np.float32)


# Issue #22: a broken calibration set is a build error naming the file, as the
# evaluation set's are, never a ValueError or EOFError traceback.
@pytest.mark.parametrize(
    ("model", "arrays", "fragments"),
    [
        pytest.param(
            IMAGE_MODEL,
            {"image": _nan((4, 8, 8, 3))},
            ("images in 'image' hold 768 NaN or infinite value(s) (all of them)",),
            id="all-nan-images",
        ),
        pytest.param(
            TENSOR_MODEL,
            {"a": _nan((4, 8)), "b": np.zeros((4, 4), np.float32)},
            ("array 'a' holds 32 NaN or infinite value(s) (all of them)",),
            id="all-nan-tensor",
        ),
        pytest.param(IMAGE_MODEL, None, ("is empty (0 bytes)", "savez_compressed"), id="empty"),
        # Issue #30: numpy hands back a 0-byte member as b"" instead of an array (exit 70).
        pytest.param(
            IMAGE_MODEL,
            "zero-byte-member",
            ("member 'image' is not a .npy array (0 bytes", "savez_compressed"),
            id="zero-byte-member",
        ),
    ],
)
def test_calibration_data_broken(
    project: Project,
    model: str,
    arrays: dict[str, np.ndarray] | str | None,
    fragments: tuple[str, ...],
) -> None:
    relative = f"data/{model}-calibration.npz"
    if arrays is None:
        project.path(relative).write_bytes(b"")
    elif arrays == "zero-byte-member":
        with zipfile.ZipFile(project.path(relative), "w") as archive:
            archive.writestr("image.npy", b"")
            archive.writestr("labels.npy", b"")
    else:
        assert isinstance(arrays, dict)
        buildkit.write_npz(project.path(relative), arrays, np.arange(4) % 2)
    project.pin(relative)
    assert_fails(project, model, "int8", BuildError, "quantize", relative, *fragments)


def test_evaluation_set_without_labels(project: Project) -> None:
    relative = f"data/{TENSOR_MODEL}-evaluation.npz"
    with np.load(project.path(relative)) as archive:
        inputs = {name: archive[name] for name in archive.files if name != "labels"}
    buildkit.write_npz(project.path(relative), inputs)
    project.pin(relative)
    assert_fails(
        project,
        TENSOR_MODEL,
        "w8",
        BuildError,
        "evaluate",
        f"{relative} has no 'labels' array",
        "classification",
    )


def test_declared_input_not_in_the_graph(project: Project) -> None:
    project.edit('name = "b"', 'name = "bearing"')
    assert_fails(
        project,
        TENSOR_MODEL,
        "int8",
        BuildError,
        "check",
        "data/sensor.onnx has no input 'bearing' (inputs: a, b)",
    )


def test_toolchain_version_mismatch(project: Project) -> None:
    installed = toolchain.installed_version("mnn")
    project.edit(f'mnn = "{installed}"', 'mnn = "0.0.1"')
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "fp32",
        ToolchainError,
        "pin check",
        f"mnn 0.0.1 is pinned in models.toml [toolchain] but {installed} is installed",
    )
    assert error.exit_code == 3


def test_a_crashing_converter(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    toolchain.supported_onnx_ops()  # cached: only the converter itself meets the crash
    crashing = tmp_path / "crashing_worker.py"
    crashing.write_text(
        "import ctypes\n"
        "import sys\n"
        "print('converter starting on', sys.argv[1], flush=True)\n"
        "ctypes.string_at(0)\n",
        encoding="utf-8",
    )
    monkeypatch.setattr(_process, "WORKER", crashing)
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "w8",
        BuildError,
        "convert",
        "mnnconvert crashed (killed by signal SIGSEGV)",
        "converter starting on",
    )
    assert error.tool == "mnnconvert"
    assert error.exit_status == -11
    assert error.output_tail is not None
    assert "converter starting on" in error.output_tail


def test_a_size_gate_failure_names_budget_and_measurement(project: Project) -> None:
    size_mb = read_json(project.out_dir(IMAGE_MODEL, "fp32") / METRICS)["size_mb"]
    project.edit_table(
        f"models.{IMAGE_MODEL}.variants.fp32",
        'tier = "high"',
        'tier = "high"\nbudgets = { max_size_mb = 0.001 }',
    )
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "fp32",
        GateError,
        "gate",
        f"{IMAGE_MODEL}/fp32 failed its gates",
        f"max_size_mb {size_mb:.4g} > 0.001",
    )
    assert error.exit_code == 4
    assert "accuracy" not in error.message  # only the failed gate is listed
    assert error.hint is not None
    assert "weight-only quantization" in error.hint


def test_an_int8_recall_drop_names_worst_classes_and_a_measured_hint(project: Project) -> None:
    # One all-black picture is a poor calibration set: the activation ranges it
    # gives clip the real pictures, and int8 loses predictions.
    relative = f"data/{IMAGE_MODEL}-calibration.npz"
    buildkit.write_npz(
        project.path(relative), {"image": np.zeros((1, 8, 8, 3), np.uint8)}, np.zeros(1)
    )
    project.pin(relative)
    project.edit_table(
        f"models.{IMAGE_MODEL}.variants.int8",
        'tier = "mid"',
        'tier = "mid"\nbudgets = { metrics.accuracy = { max_drop = 0.0 }, '
        "metrics.class_recall_drop = { max = 0.0 } }",
    )
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "int8",
        GateError,
        "gate",
        "class_recall_drop.max",
        "> 0 (worst classes ",
    )
    detail = re.search(r"worst classes (.*)\)", error.message)
    assert detail is not None
    worst = [item.split(":")[0] for item in detail.group(1).split(", ")]
    assert worst
    assert set(worst) <= set(buildkit.IMAGE_CLASSES)
    # The other methods were run to measure the hint before it is given.
    assert error.hint is not None
    assert "Measured:" in error.hint or "(measured)" in error.hint
    metrics = read_json(project.out_dir(IMAGE_MODEL, "int8") / METRICS)
    assert metrics["quantization"]["quantizer_runs"] == 3
    assert metrics["metrics"]["class_recall_drop"] > 0


def test_auto_quantization_keeps_the_best_passing_method_and_records_it(
    project: Project,
) -> None:
    project.edit_table(
        f"models.{IMAGE_MODEL}.variants.int8",
        'quantization = { mode = "int8", method = "KL" }',
        'quantization = { mode = "int8", method = "auto" }',
    )
    first = project.build(IMAGE_MODEL, "int8")
    record = first.provenance["quantization"]
    assert record["method_requested"] == "auto"
    assert record["method"] in ("KL", "EMA", "ADMM")
    assert [a["method"] for a in record["attempts"]][:1] == ["KL"]
    assert record["quantizer_runs"] == len(record["attempts"]) >= 3
    assert first.metrics["quantization"]["method"] == record["method"]
    digest = buildkit.sha256_file(first.out_dir / ARTIFACT)
    # Same inputs, same search, same recipe, same bytes.
    again = project.build(IMAGE_MODEL, "int8")
    assert again.provenance["quantization"] == record
    assert buildkit.sha256_file(again.out_dir / ARTIFACT) == digest


def test_auto_quantization_that_finds_nothing_says_what_it_tried(project: Project) -> None:
    project.edit_table(
        f"models.{IMAGE_MODEL}.variants.int8",
        'quantization = { mode = "int8", method = "KL" }',
        'quantization = { mode = "int8", method = "auto", max_skip_ops = 2 }\n'
        "budgets = { min_snr_db = 300.0 }",
    )
    error = assert_fails(
        project, IMAGE_MODEL, "int8", GateError, "gate", "min_snr_db[logits]", "< 300"
    )
    assert error.hint is not None
    assert "No int8 recipe passed after" in error.hint
    metrics = read_json(project.out_dir(IMAGE_MODEL, "int8") / METRICS)
    runs = metrics["quantization"]["quantizer_runs"]
    assert 3 <= runs <= 5  # three methods, then at most max_skip_ops layers in float


def test_unknown_model_or_variant_is_a_config_error(project: Project) -> None:
    config = project.load()
    with pytest.raises(ConfigError) as caught:
        build_variant(config, IMAGE_MODEL, "fp8", project.out_root, bench=FAST_BENCH)
    assert "has no variant 'fp8'" in caught.value.message
    assert "fp32, int8, w8" in caught.value.message
    with pytest.raises(ConfigError):
        build_variant(config, "nope", "fp32", project.out_root, bench=FAST_BENCH)
    assert not (project.out_root / IMAGE_MODEL / "fp8").exists()
    assert not (project.out_root / "nope").exists()
    result = cli_build(project, IMAGE_MODEL, "fp8")
    assert result.exit_code == 2
    assert "has no variant 'fp8'" in result.stderr


# --- edgereg summary ------------------------------------------------------------


def summary(project: Project, *extra: str) -> Result:
    return cli(
        "summary",
        "--config",
        str(project.config_path),
        "--build-dir",
        str(project.out_root),
        *extra,
    )


def test_summary_table_lists_every_variant(project: Project) -> None:
    result = summary(project)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    config = project.load()
    for model, variant in ALL_VARIANTS:
        tier = config.models[model].variants[variant].tier
        rows = [
            line for line in lines if re.search(rf"\b{model}\b.*\b{variant}\b.*\b{tier}\b", line)
        ]
        assert len(rows) == 1, f"{model}/{variant}:\n{result.stdout}"
        assert "built" in rows[0]
        assert "+0.00 pp" in rows[0]


def test_summary_json_gives_numbers_and_marks_stale_and_missing(project: Project) -> None:
    rows = json.loads(summary(project, "--json").stdout)
    assert [(row["model"], row["variant"]) for row in rows] == ALL_VARIANTS
    for row in rows:
        assert row["status"] == "built"
        metrics = read_json(project.out_dir(row["model"], row["variant"]) / METRICS)
        assert row["size_mb"] == metrics["size_mb"]
        assert row["metric"] == "accuracy"
        assert row["value"] == metrics["metrics"]["accuracy"] == 1.0
        assert row["change"] == 0.0
        assert row["min_cosine"] == metrics["agreement"][next(iter(metrics["agreement"]))]["cosine"]
        host = read_json(project.out_dir(row["model"], row["variant"]) / HOST_BENCHMARK)
        p50 = host[f"threads_{row['threads']}"]["p50_ms"]
        assert row["p50_ms"] == p50
        assert isinstance(row["p50_ms"], float)

    # The recipe of one variant changes after its build; another was never built.
    project.edit_table(f"models.{TENSOR_MODEL}.variants.w8", "threads = 1", "threads = 2")
    shutil.rmtree(project.out_dir(IMAGE_MODEL, "w8"))
    status = {
        (row["model"], row["variant"]): row["status"]
        for row in json.loads(summary(project, "--json").stdout)
    }
    assert status.pop((TENSOR_MODEL, "w8")) == "stale"
    assert status.pop((IMAGE_MODEL, "w8")) == "not built"
    assert set(status.values()) == {"built"}
    table = summary(project)
    assert table.exit_code == 0
    assert re.search(rf"{TENSOR_MODEL}\s.*\bw8\b.*stale", table.stdout)


def test_a_low_tier_variant_can_run_its_own_lower_resolution_model(project: Project) -> None:
    # The same network at half the resolution (global pooling makes it size-agnostic),
    # with its own ONNX, input shape and evaluation set: what a low tier often runs.
    import onnx

    graph = onnx.load(project.path("data/vision.onnx"))
    dims = graph.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = 4
    onnx.save(graph, project.path("data/vision-4px.onnx"))
    with np.load(project.path("data/vision-evaluation.npz")) as full:
        small = full["image"][:, ::2, ::2, :]
        labels = full["labels"]
    buildkit.write_npz(project.path("data/vision-4px-evaluation.npz"), {"image": small}, labels)
    source = buildkit.sha256_file(project.path("data/vision-4px.onnx"))
    evaluation = buildkit.sha256_file(project.path("data/vision-4px-evaluation.npz"))
    project.edit_table(
        f"models.{IMAGE_MODEL}.variants.w8",
        'tier = "low"',
        'tier = "low"\n'
        f'source = {{ path = "data/vision-4px.onnx", sha256 = "{source}" }}\n'
        f'evaluation = {{ path = "data/vision-4px-evaluation.npz", sha256 = "{evaluation}" }}\n'
        'inputs = [{ name = "image", shape = [1, 3, 4, 4], kind = "image", layout = "NCHW", '
        'color = "RGB", mean = [127.5, 127.5, 127.5], std = [127.5, 127.5, 127.5] }]',
    )
    config = project.load()
    result = project.build(IMAGE_MODEL, "w8")

    provenance = result.provenance
    assert provenance["source"]["path"] == "data/vision-4px.onnx"
    assert provenance["evaluation"]["path"] == "data/vision-4px-evaluation.npz"
    assert provenance["recipe"]["inputs"][0]["shape"] == [1, 3, 4, 4]
    # Verified and evaluated against its own ONNX, not the high tier's.
    assert result.metrics["metrics"]["top1_agreement"] > 0.9
    assert "accuracy" in result.metrics["metrics"]
    info = toolchain.model_info(project.out_dir(IMAGE_MODEL, "w8") / ARTIFACT)
    assert list(info.input_names) == ["image"]
    # Apps of the low tier are told the smaller input, and its probe feeds it.
    out = project.out_dir(IMAGE_MODEL, "w8")
    assert read_contract(out).inputs[0].shape == [1, 3, 4, 4]
    probe = read_probe(out)
    assert probe.cases[0].steps[0].inputs[0].shape == [1, 3, 4, 4]
    assert check_on_host(out / ARTIFACT, probe, read_contract(out)).passed
    # DVC reruns the variant when its own files change.
    from edgereg.build.dvc import render_dvc_yaml, stage_name

    rendered = render_dvc_yaml(config)
    stage = rendered[rendered.index(stage_name(IMAGE_MODEL, "w8")) :]
    stage = stage[: stage.index("    outs:")]
    assert '"data/vision-4px.onnx"' in stage
    assert '"data/vision-4px-evaluation.npz"' in stage
    assert '"data/vision.onnx"' not in stage


def test_a_late_failure_keeps_every_number_measured_before_it(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A runtime cache whose MNN 3.0.0 is installed but whose interpreter dies (a
    # broken disk copy): the proof fails after verify, evaluate, size, benchmark,
    # gate and the ARM stage ran.
    runtime = tmp_path / "runtimes" / "mnn-3.0.0"
    (runtime / "bin").mkdir(parents=True)
    python = runtime / "bin" / "python"
    python.write_text("#!/bin/sh\necho 'the runtime is broken' >&2\nkill -SEGV $$\n")
    python.chmod(0o755)
    (runtime / "edgereg-runtime.json").write_text('{"mnn": "3.0.0", "numpy": "1.26.4"}')
    monkeypatch.setenv("EDGEREG_RUNTIMES_DIR", str(tmp_path / "runtimes"))
    project.edit("arm = []", 'arm = []\nmin_mnn_runtime = "3.0.0"')
    out = project.out_dir(IMAGE_MODEL, "w8")

    with pytest.raises(BuildError) as caught:
        build_variant(project.load(), IMAGE_MODEL, "w8", project.out_root, bench=FAST_BENCH)
    assert caught.value.stage == "runtime proof"
    assert sorted(path.name for path in out.iterdir()) == [HOST_BENCHMARK, METRICS]
    metrics = read_json(out / METRICS)
    assert metrics["status"] == "failed"
    assert metrics["error"]["stage"] == "runtime proof"
    assert metrics["error"]["message"] == caught.value.message
    assert metrics["stages"][-3:] == ["gate", "arm", "runtime"]
    assert {"verify", "evaluate", "size", "benchmark"} <= set(metrics["stages"])
    # Everything measured before the failure is there.
    assert metrics["metrics"]["accuracy"] == 1.0
    assert metrics["agreement"]["logits"]["cosine"] > 0.99
    assert metrics["memory"]["measured"] is True
    assert metrics["size"]["artifact_bytes"] > 0
    assert all(metrics["gates"].values())
    assert metrics["failed"] == [f"stage runtime proof: {caught.value.message.splitlines()[0]}"]

    rows = json.loads(summary(project, "--json").stdout)
    row = next(r for r in rows if (r["model"], r["variant"]) == (IMAGE_MODEL, "w8"))
    assert row["status"] == "failed"
    assert row["error"]["stage"] == "runtime proof"
    assert row["value"] == 1.0
    assert row["memory_peak_mb"] is not None
    table = summary(project)
    assert f"{IMAGE_MODEL}/w8 failed: stage runtime proof: " in table.stdout
    page = tmp_path / "report.html"
    result = cli(
        "report",
        "--config",
        str(project.config_path),
        "--build-dir",
        str(project.out_root),
        "--out",
        str(page),
    )
    assert result.exit_code == 0, result.output
    html = page.read_text(encoding="utf-8")
    assert "failed: stage runtime proof" in html
    assert "stages that ran: toolchain, source, check, contract" in html


def test_a_missing_runtime_is_found_before_any_stage_works(
    project: Project, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EDGEREG_RUNTIMES_DIR", str(tmp_path / "empty"))
    project.edit("arm = []", 'arm = []\nmin_mnn_runtime = "3.0.0"')
    error = assert_fails(
        project,
        IMAGE_MODEL,
        "w8",
        RuntimeProofError,
        "toolchain",
        "the MNN 3.0.0 runtime is not installed",
        "edgereg toolchain runtimes install",
    )
    assert error.reason == "missing"
    record = read_json(project.out_dir(IMAGE_MODEL, "w8") / METRICS)
    assert record["stages"] == ["toolchain"]
