"""`edgereg build` for models that are not classifiers: detectors, CTC recognisers,
embeddings with token ids, streaming models with state, and custom evaluators.

Real MNN and ONNX Runtime on tiny real models (tests/tiny_models.py). Each test
writes a one-model project whose labels come from the fp32 ONNX model itself,
so a healthy variant scores the baseline and a damaged one visibly less.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models
from buildkit import FAST_BENCH
from click.testing import CliRunner
from probekit import entry_for, probe_blob

from edgereg import config as config_module
from edgereg import toolchain
from edgereg.build.outputs import (
    ARTIFACT,
    CONTRACT,
    FAILED,
    HOST_BENCHMARK,
    LABELS,
    METRICS,
    PROBE,
    read_outputs,
)
from edgereg.build.probe import check_on_host, probe_outputs_on_host
from edgereg.build.variant import build_variant
from edgereg.cli import main
from edgereg.client._selftest import SelfTest
from edgereg.errors import BuildError, ConfigError, GateError
from edgereg.protocol.contract import IOContract
from edgereg.protocol.probe import GoldenProbe, check_probe
from edgereg.protocol.wire import from_bytes
from edgereg.registry._release import ReleaseError, prepare_release
from edgereg.tasks.ctc_eval import ctc_greedy
from edgereg.toolchain import InputFeed
from edgereg.toolchain._streaming import run_rows

HEADER = """[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"
# x86 only: tests/test_build_arm.py verifies builds on the emulated ARM classes.
arm = []

[tiers.high]
min_ram_mb = 6144

[tiers.mid]
min_ram_mb = 3072

[tiers.low]
"""

VARIANTS = """
[models.m.variants.fp32]
tier = "high"

[models.m.variants.int8]
tier = "mid"
quantization = {{ mode = "int8", method = "{method}" }}

[models.m.variants.w8]
tier = "low"
quantization = {{ mode = "weight", bits = 8 }}
"""


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def save(path: Path, arrays: Mapping[str, np.ndarray]) -> str:
    np.savez_compressed(path, **arrays)  # type: ignore[arg-type]
    return sha(path)


class TaskProject:
    """A one-model project in ``root``: ``m`` with fp32, int8 and w8 variants."""

    def __init__(self, root: Path, model_toml: str, *, method: str = "KL") -> None:
        self.root = root
        text = HEADER.format(**toolchain.installed_versions()) + model_toml
        text += VARIANTS.format(method=method)
        (root / "models.toml").write_text(text, encoding="utf-8")

    @property
    def out(self) -> Path:
        return self.root / "build"

    def load(self) -> config_module.Config:
        return config_module.load(self.root / "models.toml")

    def edit(self, old: str, new: str) -> None:
        path = self.root / "models.toml"
        text = path.read_text(encoding="utf-8")
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
        path.write_text(text.replace(old, new), encoding="utf-8")

    def build(self, variant: str) -> Any:
        return build_variant(self.load(), "m", variant, self.out, bench=FAST_BENCH)

    def metrics(self, variant: str) -> dict[str, Any]:
        return json.loads((self.out / "m" / variant / METRICS).read_text(encoding="utf-8"))


# --- streaming: a recurrent model with its own state fed back -----------------------


def test_streams_feed_back_their_own_state_and_start_each_sequence_at_zero() -> None:
    fed: list[float] = []

    def forward(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        fed.append(float(tensors["h"].reshape(-1)[0]))
        new_state = tensors["h"] + tensors["x"].reshape(1, 1)
        return {"y": new_state * 10, "h_out": new_state}

    feeds = [InputFeed("x", "float32", (1, 1), 0), InputFeed("h", "float32", (1, 1), None)]
    rows = {"x": np.array([[1.0], [2.0], [3.0], [4.0], [5.0]], np.float32)}
    result = run_rows(
        forward,
        feeds,
        ["y", "h_out"],
        rows,
        state=[("h", "h_out")],
        sequences=np.array([7, 7, 7, 9, 9]),
    )
    # Sequence 7: 0 -> 1 -> 3 -> 6; sequence 9 starts from zero again: 0 -> 4 -> 9.
    assert fed == [0.0, 1.0, 3.0, 0.0, 4.0]
    assert result.outputs["y"].reshape(-1).tolist() == [10.0, 30.0, 60.0, 40.0, 90.0]
    assert result.states["h"].reshape(-1).tolist() == fed


def _streaming_project(
    root: Path, *, sequences: int = 12, steps: int = 10, dynamic: bool = False
) -> TaskProject:
    source = tiny_models.streaming_model(root / "vad.onnx", dynamic=dynamic)
    rng = np.random.default_rng(11)

    def stream_set(path: Path, count: int) -> tuple[str, dict[str, np.ndarray]]:
        total = count * steps
        chunk = rng.normal(0, 1, (total, tiny_models.STREAM_CHUNK)).astype(np.float32)
        arrays = {
            "chunk": chunk,
            "sr": np.full(total, 16000, np.int64),
            "sequences": np.repeat(np.arange(count), steps).astype(np.int64),
        }
        return save(path, arrays), arrays

    _, arrays = stream_set(root / "calibration.npz", 6)
    calibration_sha = sha(root / "calibration.npz")
    _, arrays = stream_set(root / "evaluation.npz", sequences)
    # Labels: the fp32 model's own streamed decisions.
    feeds = [
        InputFeed("chunk", "float32", (1, tiny_models.STREAM_CHUNK), 0),
        InputFeed("sr", "int64", (), None),
        InputFeed("state", "float32", tiny_models.STREAM_STATE_SHAPE, None),
    ]
    streamed = toolchain.run_onnx(
        source,
        {"chunk": arrays["chunk"], "sr": arrays["sr"]},
        feeds=feeds,
        output_names=["prob", "state_out"],
        state=[("state", "state_out")],
        sequences=arrays["sequences"],
    )
    labels = (streamed.outputs["prob"][:, 0] > 0.5).astype(np.int64)
    evaluation_sha = save(root / "evaluation.npz", {**arrays, "labels": labels})
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = {{ kind = "frame_decision", output = "prob", threshold = 0.5 }}
source = {{ path = "vad.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation_sha}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration_sha}" }}

[[models.m.inputs]]
name = "chunk"
shape = [1, {tiny_models.STREAM_CHUNK}]

[[models.m.inputs]]
name = "sr"
shape = []
dtype = "int64"
batch_axis = "none"

[[models.m.inputs]]
name = "state"
shape = [2, 1, 4]
batch_axis = "none"

[[models.m.outputs]]
name = "prob"

[[models.m.outputs]]
name = "state_out"

[[models.m.state]]
input = "state"
output = "state_out"
""",
    )


def test_a_streaming_model_is_verified_as_a_stream(tmp_path: Path) -> None:
    project = _streaming_project(tmp_path)
    for variant in ("fp32", "w8", "int8"):
        result = project.build(variant)
        metrics = result.metrics
        assert metrics["status"] == "passed"
        assert metrics["task"] == "frame_decision"
        assert set(metrics["metrics"]) == {"frame_agreement", "f1"}
        assert metrics["baseline"]["f1"] == 1.0  # the labels are the fp32 stream's own
        # Only the app-facing output is gated; the state is checked through it.
        assert set(metrics["agreement"]) == {"prob"}
        assert result.provenance["evaluation"]["sequences"] == 12
    fp32 = project.metrics("fp32")
    assert fp32["metrics"]["frame_agreement"] == 1.0
    assert fp32["gates"]["frame_agreement.min"]
    assert "f1.max_drop" in fp32["gates"]
    int8 = project.build("int8")
    assert int8.provenance["calibration"]["samples"] == 60  # whole sequences


def test_a_stateful_model_has_a_contract_with_its_state_and_a_streamed_probe(
    tmp_path: Path,
) -> None:
    project = _streaming_project(tmp_path, sequences=6, steps=10)
    project.build("fp32")
    out = project.out / "m" / "fp32"
    contract = IOContract.model_validate(json.loads((out / CONTRACT).read_text()))
    inputs = {spec.name: spec for spec in contract.inputs}
    # The scalar sample rate: int64, shape [], no batch axis.
    assert (inputs["sr"].dtype, inputs["sr"].shape, inputs["sr"].batch_axis) == ("int64", [], None)
    assert (inputs["state"].shape, inputs["state"].batch_axis) == ([2, 1, 4], None)
    assert (inputs["chunk"].shape, inputs["chunk"].batch_axis) == ([1, tiny_models.STREAM_CHUNK], 0)
    assert [(link.input, link.output) for link in contract.state] == [("state", "state_out")]
    assert (contract.task.kind, contract.task.output, contract.task.threshold) == (
        "frame_decision",
        "prob",
        0.5,
    )
    assert contract.labels is None
    assert not (out / LABELS).exists()

    probe = from_bytes(GoldenProbe, (out / PROBE).read_bytes())
    assert probe.state == [("state", "state_out")]
    assert 1 <= len(probe.cases) <= 2
    for case in probe.cases:
        assert 2 <= len(case.steps) <= 4
        for step in case.steps:
            # State is fed back, never stored: inputs and outputs are the app's.
            assert [t.name for t in step.inputs] == ["chunk", "sr"]
            assert [t.name for t in step.expected] == ["prob"]
            assert step.inputs[1].values() == [16000.0]
    result = check_on_host(out / ARTIFACT, probe, contract)
    assert result.passed, result.failure
    # A backend that flips the sign of the score fails, even on a one-value output.
    computed = probe_outputs_on_host(out / ARTIFACT, probe, contract)
    flipped = [
        [{name: [-v for v in values] for name, values in step.items()} for step in case]
        for case in computed
    ]
    assert not check_probe(probe, flipped).passed


def test_a_model_with_a_dynamic_state_axis_and_a_minus_one_output_runs_the_whole_path(
    tmp_path: Path,
) -> None:
    # Silero VAD's state is [2, -1, 128] in the ONNX; Paddle writes a dynamic axis
    # as -1; an unset dim is a third way. The contract names every one, and the
    # probe stage runs the client's own self-test (state zeros of the contract's
    # [2, 1, 4]), so a variant the build passes is one a device accepts.
    project = _streaming_project(tmp_path, sequences=6, steps=10, dynamic=True)
    for variant in ("fp32", "int8"):
        result = project.build(variant)
        assert result.metrics["status"] == "passed"
        out = project.out / "m" / variant
        contract = IOContract.model_validate(json.loads((out / CONTRACT).read_text()))
        outputs = {spec.name: spec.shape for spec in contract.outputs}
        assert outputs == {"prob": ["dim0", 1], "state_out": [2, "dim1", 4]}
        assert contract.input("state").shape == [2, 1, 4]
        probe = from_bytes(GoldenProbe, (out / PROBE).read_bytes())
        assert check_on_host(out / ARTIFACT, probe, contract).passed
        # The reference client, real MNN, the entry's contract as a device gets it.
        entry = entry_for(out / ARTIFACT, probe=probe_blob(probe)[1]).model_copy(
            update={"contract": contract}
        )
        chosen = SelfTest(tmp_path / f"cache-{variant}").run("m", out / ARTIFACT, entry, probe)
        assert (chosen.backend, chosen.probe) == ("cpu", "passed")


def test_streamed_outputs_differ_from_steps_run_with_zero_state(tmp_path: Path) -> None:
    # What the build measures is what an app sees: stepping with the state fed
    # back gives other outputs than resetting it every chunk.
    project = _streaming_project(tmp_path, sequences=4)
    config = project.load()
    with np.load(tmp_path / "evaluation.npz") as data:
        rows = {"chunk": data["chunk"], "sr": data["sr"]}
        sequences = data["sequences"]
    feeds = [InputFeed(s.name, s.dtype, tuple(s.shape), s.batch) for s in config.models["m"].inputs]
    kwargs: dict[str, Any] = {
        "feeds": feeds,
        "output_names": ["prob", "state_out"],
        "state": [("state", "state_out")],
    }
    streamed = toolchain.run_onnx(tmp_path / "vad.onnx", rows, sequences=sequences, **kwargs)
    reset = toolchain.run_onnx(tmp_path / "vad.onnx", rows, **kwargs)
    first_steps = np.flatnonzero(np.r_[True, sequences[1:] != sequences[:-1]])
    np.testing.assert_allclose(
        streamed.outputs["prob"][first_steps], reset.outputs["prob"][first_steps]
    )
    later = np.setdiff1d(np.arange(len(sequences)), first_steps)
    assert np.max(np.abs(streamed.outputs["prob"][later] - reset.outputs["prob"][later])) > 1e-3
    # MNN runs the stream the same way.
    mnn = tmp_path / "vad.mnn"
    toolchain.convert(tmp_path / "vad.onnx", mnn)
    got = toolchain.run_inference(mnn, rows, sequences=sequences, **kwargs)
    np.testing.assert_allclose(got["prob"], streamed.outputs["prob"], atol=1e-5)


def test_a_stateful_model_without_sequence_ids_is_refused(tmp_path: Path) -> None:
    project = _streaming_project(tmp_path, sequences=2)
    with np.load(tmp_path / "evaluation.npz") as data:
        arrays = {k: data[k] for k in data.files if k != "sequences"}
    old = sha(tmp_path / "evaluation.npz")
    project.edit(old, save(tmp_path / "evaluation.npz", arrays))
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert "no 'sequences' array" in caught.value.message
    assert "stateful model is evaluated as streams" in caught.value.message
    assert not (project.out / "m" / "fp32" / ARTIFACT).exists()


# --- token ids and embeddings -------------------------------------------------------


def _token_project(root: Path, *, method: str = "KL") -> TaskProject:
    source = tiny_models.token_embedding_model(root / "embed.onnx")
    rng = np.random.default_rng(12)

    def token_set(path: Path, pairs: int) -> str:
        # Paraphrase pairs: each sentence's nearest neighbour is its twin (one
        # token changed), so the neighbour structure is clear, as in a real set.
        lengths = np.repeat(rng.integers(4, tiny_models.TOKEN_LENGTH + 1, pairs), 2)
        mask = (np.arange(tiny_models.TOKEN_LENGTH)[None] < lengths[:, None]).astype(np.int64)
        ids = np.repeat(
            rng.integers(1, tiny_models.TOKEN_VOCAB, (pairs, tiny_models.TOKEN_LENGTH)), 2, axis=0
        )
        ids[1::2, 0] = rng.integers(1, tiny_models.TOKEN_VOCAB, pairs)
        return save(path, {"input_ids": (ids * mask).astype(np.int64), "attention_mask": mask})

    calibration = token_set(root / "calibration.npz", 16)
    evaluation = token_set(root / "evaluation.npz", 24)
    inputs = "".join(
        f'\n[[models.m.inputs]]\nname = "{name}"\nshape = [1, {tiny_models.TOKEN_LENGTH}]\n'
        'dtype = "int64"\n'
        for name in ("input_ids", "attention_mask")
    )
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = {{ kind = "embedding", k = 3 }}
source = {{ path = "embed.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}
{inputs}
[[models.m.outputs]]
name = "embedding"
""",
        method=method,
    )


def test_a_token_id_embedding_model_builds_and_is_gated_on_neighbours(tmp_path: Path) -> None:
    # KL divides by zero on this graph (SIGFPE, as on MiniLM); auto moves on to EMA.
    project = _token_project(tmp_path, method="auto")
    # Int8 of an 8-wide random projection moves some neighbours: this test is about
    # the token inputs and the search, so its neighbour budget is the measured floor.
    project.edit(
        'quantization = { mode = "int8", method = "auto" }',
        'quantization = { mode = "int8", method = "auto" }\n'
        "budgets = { metrics.neighbour_agreement = { min = 0.7 } }",
    )
    for variant in ("fp32", "w8", "int8"):
        metrics = project.build(variant).metrics
        assert metrics["status"] == "passed", metrics["failed"]
        assert {"embedding_cosine", "neighbour_agreement", "neighbour_recall"} <= set(
            metrics["metrics"]
        )
        assert metrics["gates"]["neighbour_agreement.min"]
    assert project.metrics("fp32")["metrics"]["neighbour_agreement"] == 1.0
    int8 = project.load()
    record = json.loads(
        (project.out / "m" / "int8" / "provenance.json").read_text(encoding="utf-8")
    )["quantization"]
    assert record["method"] == "EMA"
    assert record["attempts"][0]["method"] == "KL"
    assert "SIGFPE" in record["attempts"][0]["error"]
    del int8


def test_a_quantizer_crash_names_method_and_signal_and_a_measured_way_out(
    tmp_path: Path,
) -> None:
    project = _token_project(tmp_path, method="KL")
    with pytest.raises(BuildError) as caught:
        project.build("int8")
    error = caught.value
    assert error.stage == "quantize"
    assert "failed with method KL: KL: mnnquant crashed (killed by signal SIGFPE)" in (
        error.message
    )
    assert error.hint is not None
    assert 'method = "EMA" quantizes (measured: neighbour_agreement.min' in error.hint
    assert not (project.out / "m" / "int8" / ARTIFACT).exists()
    # A crash is a failed variant like any other: its metrics say what was tried.
    metrics = project.metrics("int8")
    assert (metrics["status"], metrics["failure"]) == ("failed", "quantizer crashed")
    quant = metrics["quantization"]
    assert quant["signals"] == ["SIGFPE"]
    assert quant["methods_tried"][0] == "KL"
    assert set(quant["methods_tried"]) == {"KL", "EMA", "ADMM"}
    assert quant["control_flow_ops"] == {}
    assert metrics["hint"] == error.hint
    summary = CliRunner().invoke(
        main,
        ["summary", "--config", str(tmp_path / "models.toml"), "--build-dir", str(project.out)],
    )
    assert "m/int8 failed: quantizer crashed: the int8 quantizer failed" in summary.output
    assert "SIGFPE" in summary.output
    out = str(project.out)
    as_json = CliRunner().invoke(
        main,
        ("summary", "--json", "--config", str(tmp_path / "models.toml"), "--build-dir", out),
    )
    rows = {row["variant"]: row for row in json.loads(as_json.stdout)}
    assert rows["int8"]["status"] == "failed"
    assert rows["int8"]["failed"][0].startswith("quantizer crashed: ")
    with pytest.raises(ReleaseError) as refused:
        prepare_release(
            project.load(), "m", project.out, version="1.0.0", now=datetime.now(timezone.utc)
        )
    assert "m/int8: quantizer crashed (" in refused.value.message
    html = tmp_path / "report.html"
    reported = CliRunner().invoke(
        main,
        (
            "report",
            "--config",
            str(tmp_path / "models.toml"),
            "--build-dir",
            out,
            "--out",
            str(html),
        ),
    )
    assert reported.exit_code == 0, reported.output
    assert "quantizer crashed: the int8 quantizer failed with method KL" in html.read_text()


def test_a_quantizer_failure_on_a_graph_with_control_flow_names_the_suspects(
    tmp_path: Path,
) -> None:
    # The hint names the ops MNN's quantizer is known to fail on and two ways out.
    from edgereg.build.quantsearch import QuantAttempt
    from edgereg.build.variant import _quantizer_failure

    class Search:
        def __init__(self) -> None:
            crashed = "mnnquant crashed (killed by signal SIGSEGV)"
            self.attempts = [QuantAttempt("KL", (), tmp_path / "a.mnn", None, error=crashed)]
            self.hints: list[QuantAttempt] = []

        def record_requested(self) -> str:
            return "KL"

    graph = toolchain.OnnxReport(
        path=tmp_path / "m.onnx",
        ir_version=8,
        opset=17,
        opsets={"": 17},
        op_counts={"Conv": 3, "If": 2, "Loop": 1},
        inputs=(),
        outputs=(),
    )
    error = BuildError("the int8 quantizer failed with method KL", stage="quantize")
    failure = _quantizer_failure(
        error,
        Search(),  # type: ignore[arg-type]
        "generic",
        "int8",
        "0" * 64,
        graph,
        tmp_path / "missing.mnn",
    )
    assert (failure["status"], failure["failure"]) == ("failed", "quantizer crashed")
    assert failure["quantization"]["signals"] == ["SIGSEGV"]
    assert failure["quantization"]["control_flow_ops"] == {"If": 2, "Loop": 1}
    assert "control-flow ops (If x2, Loop x1)" in failure["hint"]
    assert 'mode = "weight"' in failure["hint"]
    assert "skip_ops" in failure["hint"]


def test_an_input_declared_with_the_wrong_dtype_is_named(tmp_path: Path) -> None:
    project = _token_project(tmp_path)
    project.edit(
        'name = "attention_mask"\nshape = [1, 6]\ndtype = "int64"',
        'name = "attention_mask"\nshape = [1, 6]',
    )
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert caught.value.stage == "check"
    assert "input 'attention_mask' is int64, models.toml declares dtype = \"float32\"" in (
        caught.value.message
    )
    assert caught.value.hint == 'Set dtype = "int64" for this input.'


def test_float_token_ids_in_a_dataset_are_refused(tmp_path: Path) -> None:
    project = _token_project(tmp_path)
    with np.load(tmp_path / "evaluation.npz") as data:
        arrays = {k: data[k] for k in data.files}
    arrays["input_ids"] = arrays["input_ids"].astype(np.float32)
    old = sha(tmp_path / "evaluation.npz")
    project.edit(old, save(tmp_path / "evaluation.npz", arrays))
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert "holds float32, but input 'input_ids' is int64" in caught.value.message


# --- dense maps: IoU, and a damaged variant that fails with its numbers kept ---------


def _dense_project(root: Path) -> TaskProject:
    source = tiny_models.dense_map_model(root / "det.onnx")
    rng = np.random.default_rng(13)
    size = tiny_models.MAP_SIZE
    images = rng.normal(0, 1, (64, 1, size, size)).astype(np.float32)
    reference = toolchain.run_onnx(source, {"image": images}).outputs["prob"]
    masks = (reference[:, 0] > 0.5).astype(np.uint8)
    evaluation = save(root / "evaluation.npz", {"image": images, "labels": masks})
    calibration = save(root / "calibration.npz", {"image": images[:32]})
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = {{ kind = "dense_map", threshold = 0.5 }}
source = {{ path = "det.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}

[[models.m.inputs]]
name = "image"
shape = [1, 1, {size}, {size}]

[[models.m.outputs]]
name = "prob"
""",
    )


def test_a_dense_map_model_is_gated_on_iou(tmp_path: Path) -> None:
    project = _dense_project(tmp_path)
    for variant in ("fp32", "int8", "w8"):
        metrics = project.build(variant).metrics
        assert metrics["status"] == "passed", metrics["failed"]
        assert metrics["metrics"]["iou"] > 0.8
        assert metrics["baseline"]["label_iou"] == 1.0
    assert project.metrics("fp32")["metrics"]["iou"] == 1.0


def test_two_bit_weights_fail_the_gate_and_keep_their_numbers(tmp_path: Path) -> None:
    project = _dense_project(tmp_path)
    project.edit(
        'quantization = { mode = "weight", bits = 8 }',
        'quantization = { mode = "weight", bits = 2 }',
    )
    with pytest.raises(GateError) as caught:
        project.build("w8")
    message = caught.value.message
    assert "m/w8 failed its gates:" in message
    assert "min_snr_db[prob]" in message
    out = project.out / "m" / "w8"
    assert sorted(p.name for p in out.iterdir()) == [HOST_BENCHMARK, METRICS]  # no artifact
    metrics = project.metrics("w8")
    assert metrics["status"] == "failed"
    assert metrics["metrics"]["iou"] < 1.0
    assert any(line.startswith("min_snr_db[prob]") for line in metrics["failed"])
    # Summary, report and publish read it as failed with its numbers, not "not built".
    outputs = read_outputs(project.load(), "m", "w8", project.out)
    assert outputs.status == FAILED
    assert outputs.metrics["metrics"]["iou"] == metrics["metrics"]["iou"]
    result = CliRunner().invoke(
        main,
        ["summary", "--config", str(tmp_path / "models.toml"), "--build-dir", str(project.out)],
    )
    assert result.exit_code == 0, result.output
    failed_line = next(line for line in result.stdout.splitlines() if "m/w8 failed:" in line)
    assert "min_snr_db[prob]" in failed_line
    # ... with the build's hint under it, as metrics.json keeps it.
    assert metrics["hint"] == caught.value.hint
    assert f"  {metrics['hint'].splitlines()[0]}" in result.stdout.splitlines()


def test_label_masks_of_the_wrong_shape_are_named(tmp_path: Path) -> None:
    project = _dense_project(tmp_path)
    with np.load(tmp_path / "evaluation.npz") as data:
        arrays = {"image": data["image"], "labels": data["labels"][:, :, :4]}
    old = sha(tmp_path / "evaluation.npz")
    project.edit(old, save(tmp_path / "evaluation.npz", arrays))
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert "label masks have rows of shape (1, 4, 8)" in caught.value.message
    # No artifact: only the failure record, naming the stage.
    assert [path.name for path in (project.out / "m" / "fp32").iterdir()] == [METRICS]
    assert project.metrics("fp32")["error"]["stage"] == "evaluate"


# --- CTC sequence recognition -------------------------------------------------------


def _ctc_project(root: Path, charset: tuple[str, ...] = tiny_models.CTC_CHARSET) -> TaskProject:
    source = tiny_models.ctc_model(root / "rec.onnx")
    rng = np.random.default_rng(14)
    features = rng.normal(0, 1.5, (48, tiny_models.CTC_STEPS, tiny_models.CTC_FEATURES)).astype(
        np.float32
    )
    reference = toolchain.run_onnx(source, {"features": features}).outputs["logits"]
    lines = ctc_greedy(reference[:, 0], tiny_models.CTC_CHARSET, 0)
    evaluation = save(root / "evaluation.npz", {"features": features, "labels": np.array(lines)})
    calibration = save(root / "calibration.npz", {"features": features[:24]})
    (root / "charset.txt").write_text("\n".join(charset) + "\n", encoding="utf-8")
    charset_sha = sha(root / "charset.txt")
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = {{ kind = "ctc", charset = {{ path = "charset.txt", sha256 = "{charset_sha}" }} }}
source = {{ path = "rec.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}

[[models.m.inputs]]
name = "features"
shape = [1, {tiny_models.CTC_STEPS}, {tiny_models.CTC_FEATURES}]

[[models.m.outputs]]
name = "logits"
""",
    )


def test_a_ctc_recogniser_is_gated_on_decoded_lines(tmp_path: Path) -> None:
    project = _ctc_project(tmp_path)
    for variant in ("fp32", "w8"):
        metrics = project.build(variant).metrics
        assert metrics["status"] == "passed", metrics["failed"]
        assert {"line_match", "cer", "label_line_accuracy", "label_cer"} == set(metrics["metrics"])
        assert metrics["baseline"]["label_line_accuracy"] == 1.0
        assert metrics["baseline"]["label_cer"] == 0.0
    assert project.metrics("fp32")["metrics"]["line_match"] == 1.0
    # Apps read the characters from the contract (the blank class is not listed).
    contract = IOContract.model_validate(
        json.loads((project.out / "m" / "w8" / CONTRACT).read_text())
    )
    assert contract.labels == list(tiny_models.CTC_CHARSET)
    assert (contract.task.kind, contract.task.blank) == ("ctc", 0)
    probe = from_bytes(GoldenProbe, (project.out / "m" / "w8" / PROBE).read_bytes())
    assert check_on_host(project.out / "m" / "w8" / ARTIFACT, probe, contract).passed


def test_a_charset_that_does_not_match_the_output_width_is_named(tmp_path: Path) -> None:
    project = _ctc_project(tmp_path, charset=("a", "b"))
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    message = caught.value.message
    assert "the charset lists 2 characters, so the output needs 3 classes" in message
    assert "but it has 4" in message


def test_ctc_decoding_merges_repeats_and_drops_blanks() -> None:
    # Steps: a a _ a b b _ -> "aab"; blank index 0, charset a=1, b=2.
    steps = [1, 1, 0, 1, 2, 2, 0]
    logits = np.eye(3, dtype=np.float32)[steps][None]
    assert ctc_greedy(logits, ["a", "b"], 0) == ["aab"]


# --- custom evaluators ----------------------------------------------------------


EVALUATOR = """
import numpy as np


def score(*, inputs, reference, outputs, labels):
    diff = float(np.mean(np.abs(outputs["prob"] - reference["prob"])))
    return {"metrics": {"mean_abs_diff": diff}, "gates": {"mean_abs_diff": {"max": 0.05}}}


def broken(*, inputs, reference, outputs, labels):
    raise KeyError("no such output")


def not_a_number(*, inputs, reference, outputs, labels):
    return {"metrics": {"x": float("nan")}}
"""


def test_a_custom_evaluator_is_gated_like_the_built_in_ones(tmp_path: Path) -> None:
    project = _dense_project(tmp_path)
    (tmp_path / "team_evals.py").write_text(EVALUATOR, encoding="utf-8")
    project.edit(
        'task = { kind = "dense_map", threshold = 0.5 }',
        'task = { kind = "custom", evaluator = "team_evals:score" }',
    )
    metrics = project.build("fp32").metrics
    assert metrics["task"] == "custom"
    assert metrics["metrics"]["mean_abs_diff"] < 1e-5
    assert metrics["gates"]["mean_abs_diff.max"] is True
    # models.toml can tighten the evaluator's own gate; then a variant fails on it.
    project.edit(
        "[models.m.variants.w8]",
        "[models.m.variants.w8]\nbudgets = { metrics.mean_abs_diff = { max = 0.0 } }",
    )
    with pytest.raises(GateError) as caught:
        project.build("w8")
    assert "mean_abs_diff.max" in caught.value.message


@pytest.mark.parametrize(
    ("function", "fragments"),
    [
        ("broken", ("evaluator team_evals:broken raised KeyError", "no such output")),
        ("not_a_number", ("returned metric 'x' = nan",)),
        ("missing", ("has no function 'missing'",)),
    ],
)
def test_a_custom_evaluator_that_fails_is_a_clear_build_error(
    tmp_path: Path, function: str, fragments: tuple[str, ...]
) -> None:
    project = _dense_project(tmp_path)
    (tmp_path / "team_evals.py").write_text(EVALUATOR, encoding="utf-8")
    project.edit(
        'task = { kind = "dense_map", threshold = 0.5 }',
        f'task = {{ kind = "custom", evaluator = "team_evals:{function}" }}',
    )
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert caught.value.stage == "evaluate"
    for fragment in fragments:
        assert fragment in caught.value.message
    assert not (project.out / "m" / "fp32" / ARTIFACT).exists()


# --- preprocessing that is broken is loud --------------------------------------------


def test_an_image_input_without_mean_and_std_is_warned_about(tmp_path: Path) -> None:
    text = (
        HEADER.format(**toolchain.installed_versions())
        + """
[models.m]
version = "1.0.0"
source = {{ path = "m.onnx", sha256 = "{}" }}
evaluation = {{ path = "e.npz", sha256 = "{}" }}

[[models.m.inputs]]
name = "image"
shape = [1, 3, 8, 8]
kind = "image"
layout = "NCHW"
color = "RGB"

[[models.m.outputs]]
name = "logits"

[models.m.variants.fp32]
tier = "low"
""".format("1" * 64, "2" * 64)
    )
    notes = config_module.parse(text).notes()
    warning = next(note for note in notes if note.startswith("warning:"))
    assert "models.m.inputs.0 ('image'): image input without mean and std" in warning


def test_a_detector_whose_reference_never_fires_fails_its_build_by_default(
    tmp_path: Path,
) -> None:
    # Labels from the model's own decisions at 0.5, a threshold the reference never
    # reaches (as a VAD fed chunks without their context): F1 near 0, and frame
    # agreement that cannot disagree. Both fail, naming the positive rates.
    project = _streaming_project(tmp_path, sequences=6, steps=10)
    project.edit("threshold = 0.5", "threshold = 0.99999")
    with pytest.raises(GateError) as caught:
        project.build("fp32")
    message = caught.value.message
    assert "f1.min_baseline" in message
    assert "frame_agreement.informative" in message
    metrics = project.metrics("fp32")
    failed = "\n".join(metrics["failed"])
    assert "positive on 0.0% of frames, the labels on" in failed
    assert "never crosses the threshold 0.99999" in failed
    # models.toml can lower the bar for the baseline (an opt-out, declared).
    project.edit(
        "[[models.m.state]]",
        "[models.m.budgets.metrics.f1]\nmin_baseline = 0\n\n[[models.m.state]]",
    )
    with pytest.raises(GateError) as again:
        project.build("fp32")
    assert "f1.min_baseline" not in again.value.message
    assert "frame_agreement.informative" in again.value.message


def test_a_detector_scored_on_labels_it_predicts_passes_the_baseline_check(
    tmp_path: Path,
) -> None:
    project = _streaming_project(tmp_path, sequences=6, steps=10)
    result = project.build("fp32")
    assert result.metrics["gates"]["f1.min_baseline"]
    assert "frame_agreement.informative" not in result.metrics["gates"]


def test_a_classifier_at_chance_fails_naming_preprocessing(tmp_path: Path) -> None:
    source = tiny_models.conv_classifier(tmp_path / "c.onnx")
    rng = np.random.default_rng(15)
    pictures = rng.integers(0, 256, (80, 8, 8, 3), dtype=np.uint8)
    # Labels the model cannot predict: a baseline at chance.
    labels = np.arange(80) % tiny_models.CONV_CLASSES
    evaluation = save(tmp_path / "e.npz", {"image": pictures, "labels": labels})
    text = (
        HEADER.format(**toolchain.installed_versions())
        + f"""
[models.m]
version = "1.0.0"
source = {{ path = "c.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "e.npz", sha256 = "{evaluation}" }}

[[models.m.inputs]]
name = "image"
shape = [1, 3, 8, 8]
kind = "image"
layout = "NCHW"
color = "RGB"
mean = [127.5, 127.5, 127.5]
std = [127.5, 127.5, 127.5]

[[models.m.outputs]]
name = "logits"

[models.m.variants.fp32]
tier = "low"
"""
    )
    (tmp_path / "models.toml").write_text(text, encoding="utf-8")
    config = config_module.load(tmp_path / "models.toml")
    with pytest.raises(GateError) as caught:
        build_variant(config, "m", "fp32", tmp_path / "build", bench=FAST_BENCH)
    assert "accuracy.min_baseline" in caught.value.message
    assert caught.value.hint is not None
    assert "preprocessing" in caught.value.hint
    assert "mean/std" in caught.value.hint


def test_a_budget_on_a_label_metric_without_labels_is_an_error_not_ignored(
    tmp_path: Path,
) -> None:
    project = _dense_project(tmp_path)
    with np.load(tmp_path / "evaluation.npz") as data:
        arrays = {"image": data["image"]}
    old = sha(tmp_path / "evaluation.npz")
    project.edit(old, save(tmp_path / "evaluation.npz", arrays))
    # Without labels only the reference metrics are gated, unless a label budget is set.
    assert project.build("fp32").metrics["status"] == "passed"
    project.edit(
        "[models.m.variants.fp32]",
        "[models.m.variants.fp32]\nbudgets = { metrics.label_iou = { max_drop = 0.01 } }",
    )
    with pytest.raises(BuildError) as caught:
        project.build("fp32")
    assert "'label_iou' is scored on labels and the evaluation set has none" in (
        caught.value.message
    )


def test_a_state_pair_naming_a_missing_tensor_is_a_config_error(tmp_path: Path) -> None:
    project = _streaming_project(tmp_path, sequences=2)
    project.edit('output = "state_out"\n', 'output = "hn"\n')
    with pytest.raises(ConfigError) as caught:
        project.load()
    assert caught.value.key_path == "models.m.state.0.output"
    assert "'hn' is not a declared output" in caught.value.message


# --- segmentation: a class per pixel, every class gated ------------------------------

SEG_CLASSES = ["ground", "wall", "sign"]


def _segmentation_project(
    root: Path, *, images: np.ndarray | None = None, masks: np.ndarray | None = None
) -> TaskProject:
    source = tiny_models.segmentation_model(root / "seg.onnx")
    size = tiny_models.SEG_SIZE
    if images is None:
        images = np.random.default_rng(13).normal(0, 1, (48, 3, size, size)).astype(np.float32)
    if masks is None:
        reference = toolchain.run_onnx(source, {"image": images}).outputs["scores"]
        masks = np.argmax(reference[:, 0], axis=1).astype(np.uint8)
    evaluation = save(root / "evaluation.npz", {"image": images, "labels": masks})
    calibration = save(root / "calibration.npz", {"image": images[:24]})
    return TaskProject(
        root,
        f"""
[models.m]
version = "1.0.0"
task = "segmentation"
classes = {json.dumps(SEG_CLASSES)}
source = {{ path = "seg.onnx", sha256 = "{sha(source)}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}

[[models.m.inputs]]
name = "image"
shape = [1, 3, {size}, {size}]

[[models.m.outputs]]
name = "scores"
""",
    )


def test_a_segmentation_model_is_gated_on_every_class_iou(tmp_path: Path) -> None:
    project = _segmentation_project(tmp_path)
    for variant in ("fp32", "int8", "w8"):
        metrics = project.build(variant).metrics
        assert metrics["status"] == "passed", metrics["failed"]
        assert metrics["task"] == "segmentation"
        assert metrics["baseline"]["label_mean_iou"] == 1.0
        for gate in ("mean_iou.min", "min_class_iou.min", "class_iou_drop.max"):
            assert metrics["gates"][gate] is True
        # IoU per class, by name, against the reference and the labels.
        assert sorted(metrics["per_class"]["iou"]) == sorted(SEG_CLASSES)
        worst = min(metrics["per_class"]["iou"].values())
        assert worst == pytest.approx(metrics["metrics"]["min_class_iou"], abs=1e-6)
    fp32 = project.metrics("fp32")["metrics"]
    assert fp32["mean_iou"] == fp32["min_class_iou"] == fp32["label_mean_iou"] == 1.0
    # The class names travel in the contract, like a classifier's.
    contract = json.loads((project.out / "m" / "fp32" / CONTRACT).read_text(encoding="utf-8"))
    assert contract["labels"] == SEG_CLASSES
    assert contract["task"]["kind"] == "segmentation"
    assert (project.out / "m" / "fp32" / LABELS).is_file()


def test_a_tail_class_the_mean_hides_fails_its_own_gate() -> None:
    from edgereg.build.quality import check_gates, default_budgets
    from edgereg.config import SegmentationTask
    from edgereg.tasks.segmentation_eval import segmentation_scores

    rng = np.random.default_rng(3)
    reference = rng.normal(0, 1, (8, 1, 10, 32, 32)).astype(np.float32)
    reference[:, :, 9] -= 1.0  # class 9 is rare
    variant = reference.copy()
    tail = np.argmax(reference[:, 0], axis=1) == 9
    assert 0 < tail.mean() < 0.02
    # Every pixel of the tail class becomes class 0, as a damaged int8 head would do.
    variant[:, 0, 0][tail] = reference[:, 0, 9][tail] + 1.0
    labels = np.argmax(reference[:, 0], axis=1).astype(np.uint8)
    task = SegmentationTask(kind="segmentation")
    names = [f"c{index}" for index in range(9)] + ["sign"]
    scores = segmentation_scores(task, reference, variant, labels, names)
    assert scores.metrics["min_class_iou"] == 0.0
    assert scores.metrics["mean_iou"] > 0.85  # the mean over ten classes passes its gate
    assert scores.metrics["class_iou_drop"] == 1.0
    assert scores.per_class["iou"]["sign"] == 0.0
    gates = check_gates(
        default_budgets("segmentation", "int8"),
        size_bytes=0,
        agreement={},
        scores=scores,
        latency_p50_ms=None,
    )
    failed = {gate.name: gate.describe() for gate in gates.failures}
    assert set(failed) == {"min_class_iou.min", "class_iou_drop.max", "label_mean_iou.max_drop"}
    assert "sign 0.000" in failed["min_class_iou.min"]
    assert "sign 1.000 -> 0.000" in failed["class_iou_drop.max"]
    # Channels last, and a void label that no metric counts.
    last = SegmentationTask(kind="segmentation", class_axis=-1, ignore_index=255)
    void = labels.copy()
    void[:, :4] = 255
    moved = segmentation_scores(
        last, np.moveaxis(reference, 2, -1), np.moveaxis(variant, 2, -1), void, names
    )
    assert moved.metrics["min_class_iou"] == 0.0
    assert moved.baseline["label_mean_iou"] == 1.0


def test_a_reference_that_gives_every_pixel_one_class_fails_the_build(tmp_path: Path) -> None:
    # Blank pictures: every pixel scores the same, so the fp32 model says one class.
    size = tiny_models.SEG_SIZE
    project = _segmentation_project(tmp_path, images=np.zeros((16, 3, size, size), np.float32))
    with pytest.raises(GateError) as caught:
        project.build("fp32")
    assert "mean_iou.informative" in caught.value.message
    assert "gives every pixel of the evaluation set class 'ground'" in caught.value.message
    assert project.metrics("fp32")["status"] == "failed"


def test_masks_shaped_unlike_the_output_are_a_config_error_naming_both_shapes(
    tmp_path: Path,
) -> None:
    size = tiny_models.SEG_SIZE
    images = np.random.default_rng(13).normal(0, 1, (8, 3, size, size)).astype(np.float32)
    masks = np.zeros((8, size // 2, size // 2), np.uint8)  # masks of a half-size model
    project = _segmentation_project(tmp_path, images=images, masks=masks)
    with pytest.raises(ConfigError) as caught:
        project.build("fp32")
    message = str(caught.value)
    assert "models.toml: models.m.evaluation: evaluation set evaluation.npz" in message
    assert f"label masks have shape [{size // 2}, {size // 2}] per sample" in message
    assert f"the output's class map is [{size}, {size}]" in message
    assert caught.value.exit_code == 2
    assert project.metrics("fp32")["error"]["stage"] == "reference"
