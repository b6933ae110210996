"""Proving min_mnn_runtime: the example artifacts under the real MNN 3.0.0 runtime.

Nothing is mocked and nothing is downloaded: the 3.0.0 runtime is the one
`make venv` installs (`edgereg toolchain runtimes install --version 3.0.0`)
into .edgereg/runtimes/ (or $EDGEREG_RUNTIMES_DIR). The example models are
converted with the real converter (fp32, fp16, weight-only 8-bit, int8) and
run under both runtimes. Only crashes and hangs use a stand-in runtime
directory, because a real runtime cannot be made to crash on demand.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from edgereg import config as config_module
from edgereg.build.datasets import load_dataset
from edgereg.cli import main
from edgereg.errors import ConfigError
from edgereg.toolchain import (
    InputFeed,
    QuantInput,
    convert,
    installed_version,
    quantize,
    run_inference,
)
from edgereg.toolchain.arm import ARM_DIR_ENV, arm_dir
from edgereg.toolchain.runtimes import (
    FLOAT_TOLERANCE,
    INSTALL_COMMAND,
    INT8_TOLERANCE,
    MARKER,
    RUNTIMES_DIR_ENV,
    Tolerance,
    compare_outputs,
    default_tolerance,
    find_runtime,
    install_runtime,
    prove_min_runtime,
    run_under_runtime,
    runtime_dir,
    runtimes_dir,
)
from edgereg.toolchain.runtimes import RuntimeProofError as ProofError

REPO = Path(__file__).resolve().parent.parent
OLD = "3.0.0"
SAMPLES = 16
VARIANTS = ("fp32", "fp16", "w8", "int8")


def _feeds(inputs: dict[str, np.ndarray], names: list[str]) -> list[InputFeed]:
    """Batch-first feeds of the arrays, in the model's input order."""
    return [InputFeed.batched(name, inputs[name]) for name in names]


@pytest.fixture(scope="session")
def runtimes_root() -> Path:
    """The runtime cache `make venv` filled; the 3.0.0 runtime must be in it."""
    root = runtimes_dir()
    try:
        find_runtime(OLD, root=root)
    except ProofError as exc:
        pytest.fail(f"{exc.diagnostics()}\n(run `make venv` once: it installs it)")
    return root


@pytest.fixture(scope="module")
def example() -> config_module.Config:
    return config_module.load(REPO / "models.toml")


def _evaluation(example: config_module.Config, model: str) -> dict[str, np.ndarray]:
    spec = example.models[model]
    data = load_dataset(
        example.resolve_path(spec.evaluation), list(spec.inputs), stage="test", need_labels=False
    )
    return {name: array[:SAMPLES] for name, array in data.inputs.items()}


@pytest.fixture(scope="module")
def artifacts(
    tmp_path_factory: pytest.TempPathFactory, example: config_module.Config
) -> dict[tuple[str, str], Path]:
    """The example models converted (fp32, fp16, w8) and quantized (int8) by MNN 3.6.1."""
    root = tmp_path_factory.mktemp("artifacts")
    built: dict[tuple[str, str], Path] = {}
    for model, method in (("digits", "KL"), ("sensor", "EMA")):
        source = REPO / "pipelines" / model / "model.onnx"
        spec = example.models[model]
        for variant, options in (
            ("fp32", {}),
            ("fp16", {"fp16": True}),
            ("w8", {"weight_quant_bits": 8}),
        ):
            path = root / f"{model}-{variant}.mnn"
            convert(source, path, **options)  # type: ignore[arg-type]
            built[model, variant] = path
        calibration = load_dataset(
            example.resolve_path(spec.calibration),  # type: ignore[arg-type]
            list(spec.inputs),
            stage="test",
            need_labels=False,
        )
        rows = [
            {name: array[i : i + 1] for name, array in calibration.inputs.items()}
            for i in range(20)
        ]
        built[model, "int8"] = root / f"{model}-int8.mnn"
        quantize(
            built[model, "fp32"],
            built[model, "int8"],
            inputs=[QuantInput(i.name, i.shape) for i in spec.inputs],
            samples=rows,
            method=method,
            debug=False,
        )
    return built


def _io(example: config_module.Config, model: str) -> tuple[list[str], list[str]]:
    spec = example.models[model]
    return [i.name for i in spec.inputs], [o.name for o in spec.outputs]


@pytest.mark.slow  # converts the example models (the artifacts fixture)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("model", ["digits", "sensor"])
def test_example_artifacts_are_proven_on_mnn_3_0_0(
    runtimes_root: Path,
    artifacts: dict[tuple[str, str], Path],
    example: config_module.Config,
    model: str,
    variant: str,
) -> None:
    artifact = artifacts[model, variant]
    inputs = _evaluation(example, model)
    names, outputs = _io(example, model)
    expected = run_inference(
        artifact, inputs, feeds=_feeds(inputs, names), output_names=outputs, batch_size=1
    )

    mode = "int8" if variant == "int8" else "weight"
    proof = prove_min_runtime(
        artifact,
        OLD,
        inputs,
        expected,
        input_names=names,
        output_names=outputs,
        tolerance=default_tolerance(mode),
        root=runtimes_root,
    )

    assert proof.version == OLD
    assert proof.proven_by == "runtime"
    assert proof.samples == SAMPLES
    # Float kernels round differently; int8 ones by whole steps of the output scale.
    assert 0.0 <= proof.max_abs_diff < (0.5 if variant == "int8" else 1e-3)
    assert [o.name for o in proof.outputs] == outputs
    assert all(o.within for o in proof.outputs)
    (logits,) = proof.outputs
    assert logits.argmax_agreement is not None
    assert logits.argmax_agreement >= 0.9
    record = proof.as_dict()
    assert record["version"] == OLD
    assert record["tolerance"] == default_tolerance(mode).as_dict()
    assert set(record["outputs"]) == {"logits"}
    json.dumps(record)  # provenance-ready


@pytest.mark.slow  # converts the example models (the artifacts fixture)
def test_old_runtime_returns_what_run_inference_returns(
    runtimes_root: Path, artifacts: dict[tuple[str, str], Path], example: config_module.Config
) -> None:
    inputs = _evaluation(example, "sensor")
    names, outputs = _io(example, "sensor")
    build = run_inference(
        artifacts["sensor", "fp32"], inputs, feeds=_feeds(inputs, names), batch_size=1
    )

    run = run_under_runtime(
        artifacts["sensor", "fp32"], OLD, inputs, input_names=names, root=runtimes_root
    )

    assert run.mnn_version == OLD
    assert list(run.outputs) == list(build) == outputs
    assert run.outputs["logits"].shape == build["logits"].shape == (SAMPLES, 1, 6)
    assert run.outputs["logits"].dtype == np.float32
    # Same labels from both runtimes.
    assert (run.outputs["logits"].argmax(-1) == build["logits"].argmax(-1)).all()


@pytest.mark.slow  # converts the example models (the artifacts fixture)
def test_the_build_runtime_itself_needs_no_old_runtime(
    tmp_path: Path, artifacts: dict[tuple[str, str], Path], example: config_module.Config
) -> None:
    inputs = _evaluation(example, "digits")
    names, outputs = _io(example, "digits")
    expected = run_inference(
        artifacts["digits", "w8"], inputs, feeds=_feeds(inputs, names), batch_size=1
    )
    build_mnn = installed_version("mnn")
    assert build_mnn is not None

    proof = prove_min_runtime(
        artifacts["digits", "w8"],
        build_mnn,
        inputs,
        expected,
        input_names=names,
        output_names=outputs,
        root=tmp_path / "empty",
    )

    assert proof.proven_by == "build"
    assert proof.version == build_mnn
    assert not (tmp_path / "empty").exists()


# --- an artifact MNN 3.0.0 cannot load ----------------------------------------------------


def _stft_model(path: Path) -> Path:
    """ONNX STFT: MNN 3.6.1 converts it to an `Stft` operator that MNN 3.0.0 does not know."""
    nodes = [
        helper.make_node("STFT", ["signal", "step", "window"], ["spec"], name="stft", onesided=1),
        helper.make_node("ReduceSum", ["spec"], ["y"], name="sum", keepdims=0),
    ]
    graph = helper.make_graph(
        nodes,
        "stft",
        [helper.make_tensor_value_info("signal", TensorProto.FLOAT, [1, 64, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [])],
        initializer=[
            numpy_helper.from_array(np.array(4, np.int64), "step"),
            numpy_helper.from_array(np.hanning(16).astype(np.float32), "window"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


@pytest.mark.parametrize("target_version", [None, "3.0"])
def test_an_operator_newer_than_the_minimum_fails_to_load(
    runtimes_root: Path, tmp_path: Path, target_version: str | None
) -> None:
    source = _stft_model(tmp_path / "stft.onnx")
    artifact = tmp_path / "stft.mnn"
    convert(source, artifact, target_version=target_version)
    signal = {"signal": np.random.default_rng(0).normal(size=(3, 64, 1)).astype(np.float32)}
    expected = run_inference(artifact, signal, batch_size=1)  # MNN 3.6.1 runs it

    with pytest.raises(ProofError) as caught:
        prove_min_runtime(
            artifact,
            OLD,
            signal,
            expected,
            input_names=["signal"],
            output_names=["y"],
            root=runtimes_root,
        )

    error = caught.value
    assert error.reason == "load"
    assert error.stage == "runtime proof"
    assert error.tool == f"MNN {OLD}"
    assert f"MNN {OLD} cannot load stft.mnn" in error.message
    # MNN's own reason, not a Python stack.
    assert "Invalidate buffer" in (error.output_tail or "")
    assert "Traceback" not in (error.output_tail or "")
    # --targetVersion cannot help at 3.0; a higher minimum does.
    assert "min_mnn_runtime" in (error.hint or "")
    assert "mnn_target_version cannot help" in (error.hint or "")


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[:5000], id="truncated"),
        pytest.param(lambda data: bytes(len(data)), id="zeros"),
        pytest.param(lambda data: b"not a model", id="text"),
    ],
)
def test_a_corrupt_artifact_fails_to_load(
    runtimes_root: Path,
    tmp_path: Path,
    artifacts: dict[tuple[str, str], Path],
    example: config_module.Config,
    damage: object,
) -> None:
    corrupt = tmp_path / "corrupt.mnn"
    corrupt.write_bytes(damage(artifacts["digits", "fp32"].read_bytes()))  # type: ignore[operator]
    inputs = _evaluation(example, "digits")

    with pytest.raises(ProofError) as caught:
        run_under_runtime(corrupt, OLD, inputs, input_names=["image"], root=runtimes_root)

    assert caught.value.reason == "load"
    assert f"MNN {OLD} cannot load corrupt.mnn" in caught.value.message


@pytest.mark.slow  # converts the example models (the artifacts fixture)
def test_outputs_beyond_the_tolerance_fail_the_proof(
    runtimes_root: Path, artifacts: dict[tuple[str, str], Path], example: config_module.Config
) -> None:
    inputs = _evaluation(example, "digits")
    names, outputs = _io(example, "digits")
    expected = run_inference(
        artifacts["digits", "fp32"], inputs, feeds=_feeds(inputs, names), batch_size=1
    )
    expected["logits"][3, 0, 2] += 0.5  # what another arithmetic would look like

    with pytest.raises(ProofError) as caught:
        prove_min_runtime(
            artifacts["digits", "fp32"],
            OLD,
            inputs,
            expected,
            input_names=names,
            output_names=outputs,
            root=runtimes_root,
        )

    error = caught.value
    assert error.reason == "mismatch"
    assert error.comparison is not None
    assert not error.comparison.within
    assert 0.49 < error.comparison.max_abs_diff < 0.51
    assert "output 'logits': max abs difference 0.5" in error.message
    assert f"on {SAMPLES} samples" in error.message


@pytest.mark.slow  # converts the example models (the artifacts fixture)
def test_an_exact_tolerance_is_stricter_than_two_runtimes_agree(
    runtimes_root: Path, artifacts: dict[tuple[str, str], Path], example: config_module.Config
) -> None:
    # MNN 3.0.0 and 3.6.1 order float sums differently: close, not identical.
    inputs = _evaluation(example, "sensor")
    names, outputs = _io(example, "sensor")
    expected = run_inference(
        artifacts["sensor", "fp32"], inputs, feeds=_feeds(inputs, names), batch_size=1
    )

    with pytest.raises(ProofError) as caught:
        prove_min_runtime(
            artifacts["sensor", "fp32"],
            OLD,
            inputs,
            expected,
            input_names=names,
            output_names=outputs,
            tolerance=Tolerance(0.0, 0.0, 0.0),
            root=runtimes_root,
        )
    assert caught.value.reason == "mismatch"


# --- integer inputs -------------------------------------------------------------------------


def _embedding_model(path: Path) -> Path:
    """int64 token ids -> Gather from a float table -> (N, 4, 3)."""
    table = np.arange(30, dtype=np.float32).reshape(10, 3) / 7.0
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="embed", axis=0)],
        "embedding",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, 3])],
        initializer=[numpy_helper.from_array(table, "table")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def test_int64_model_inputs_are_fed_as_int32(runtimes_root: Path, tmp_path: Path) -> None:
    artifact = tmp_path / "embed.mnn"
    convert(_embedding_model(tmp_path / "embed.onnx"), artifact)
    ids = {"ids": np.random.default_rng(3).integers(0, 10, size=(5, 4), dtype=np.int64)}
    expected = run_inference(artifact, ids, batch_size=1)

    proof = prove_min_runtime(
        artifact, OLD, ids, expected, input_names=["ids"], output_names=["y"], root=runtimes_root
    )

    assert proof.identical  # a table lookup has no rounding to differ in
    table = np.arange(30, dtype=np.float32).reshape(10, 3) / 7.0
    np.testing.assert_array_equal(expected["y"][:, 0], table[ids["ids"]])


@pytest.mark.parametrize(
    ("inputs", "message"),
    [
        ({"ids": np.array([[2**40, 0, 0, 0]])}, "outside int32"),
        ({"ids": np.array([["a", "b", "c", "d"]])}, "dtype <U1"),
        ({"other": np.zeros((1, 4), np.int32)}, "no data for input 'ids'"),
        ({"ids": np.int32(3)}, "needs samples on axis 0"),
    ],
)
def test_inputs_that_mnn_cannot_take_are_refused(
    runtimes_root: Path, tmp_path: Path, inputs: dict[str, np.ndarray], message: str
) -> None:
    artifact = tmp_path / "embed.mnn"
    artifact.write_bytes(b"never loaded")
    with pytest.raises(ValueError, match=message):
        run_under_runtime(artifact, OLD, inputs, input_names=["ids"], root=runtimes_root)


def test_the_build_environment_cannot_leak_into_the_old_runtime(
    runtimes_root: Path,
    artifacts: dict[tuple[str, str], Path],
    example: config_module.Config,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PYTHONPATH naming the build's site-packages (where MNN 3.6.1 lives) is ignored.
    import MNN

    monkeypatch.setenv("PYTHONPATH", str(Path(MNN.__file__).parent.parent))
    inputs = _evaluation(example, "digits")
    run = run_under_runtime(
        artifacts["digits", "fp32"], OLD, inputs, input_names=["image"], root=runtimes_root
    )
    assert run.mnn_version == OLD


# --- a runtime that is missing, half-installed, crashes or hangs ----------------------------


def test_a_missing_runtime_names_the_install_command(tmp_path: Path) -> None:
    with pytest.raises(ProofError) as caught:
        find_runtime("2.9.0", root=tmp_path)
    error = caught.value
    assert error.reason == "missing"
    assert "MNN 2.9.0 runtime is not installed" in error.message
    assert "no such directory" in error.message
    assert INSTALL_COMMAND in (error.hint or "")
    assert "--version 2.9.0" in (error.hint or "")


def test_an_install_that_never_finished_is_missing(tmp_path: Path) -> None:
    (tmp_path / "mnn-3.0.0" / "bin").mkdir(parents=True)
    with pytest.raises(ProofError, match="never finished") as caught:
        find_runtime(OLD, root=tmp_path)
    assert caught.value.reason == "missing"


def test_a_runtime_directory_for_another_version_is_missing(tmp_path: Path) -> None:
    stand_in = _stand_in_runtime(tmp_path, "exec true")
    (stand_in / MARKER).write_text(json.dumps({"mnn": "3.1.0"}), encoding="utf-8")
    with pytest.raises(ProofError, match="describes another runtime"):
        find_runtime(OLD, root=tmp_path)


def _stand_in_runtime(root: Path, script: str) -> Path:
    """A runtime directory whose `python` is a shell script: for faults MNN cannot be made to."""
    path = root / f"mnn-{OLD}"
    (path / "bin").mkdir(parents=True)
    python = path / "bin" / "python"
    python.write_text(f"#!/bin/sh\n{script}\n", encoding="utf-8")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    (path / MARKER).write_text(json.dumps({"mnn": OLD, "numpy": "2"}), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("script", "reason", "message"),
    [
        pytest.param(
            "echo 'MNN: about to fall over'; kill -SEGV $$",
            "crash",
            "crashed (killed by signal SIGSEGV)",
            id="segfault",
        ),
        pytest.param("exec sleep 30", "timeout", "within 1 s and was killed", id="hang"),
        pytest.param("exit 7", "broken", "stopped (exit status 7)", id="exits"),
        pytest.param(
            f"exec {sys.executable} -c 'import sys, json; r = json.load(open(sys.argv[-1]))"
            '["result"]; open(r, "w").write(json.dumps({"ok": False, "phase": '
            '"import", "error": "ModuleNotFoundError: No module named MNN"}))\' "$@"',
            "broken",
            "does not start: ModuleNotFoundError",
            id="no-mnn",
        ),
    ],
)
def test_a_runtime_that_crashes_hangs_or_is_broken(
    tmp_path: Path, script: str, reason: str, message: str
) -> None:
    _stand_in_runtime(tmp_path, script)
    artifact = tmp_path / "model.mnn"
    artifact.write_bytes(b"never read")

    with pytest.raises(ProofError) as caught:
        run_under_runtime(
            artifact,
            OLD,
            {"x": np.zeros((2, 3), np.float32)},
            input_names=["x"],
            root=tmp_path,
            timeout=1.0,
        )

    assert caught.value.reason == reason
    assert message in caught.value.message
    assert f"MNN {OLD}" in caught.value.diagnostics()
    if reason == "crash":
        assert "about to fall over" in (caught.value.output_tail or "")


def test_installing_an_installed_runtime_downloads_nothing(runtimes_root: Path) -> None:
    result = install_runtime(OLD, root=runtimes_root)
    assert not result.installed
    assert result.runtime.path == runtime_dir(OLD, runtimes_root)
    assert result.seconds < 1.0


def test_the_runtime_cache_follows_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # conftest points both at the machine's caches.
    monkeypatch.delenv(RUNTIMES_DIR_ENV)
    monkeypatch.delenv(ARM_DIR_ENV)
    # One per-user cache that every repository shares, which the environment moves.
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert runtimes_dir() == tmp_path / "xdg" / "edgereg" / "runtimes"
    assert arm_dir() == tmp_path / "xdg" / "edgereg" / "arm"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert runtimes_dir() == tmp_path / "home" / ".cache" / "edgereg" / "runtimes"
    monkeypatch.setenv("EDGEREG_CACHE_DIR", str(tmp_path / "shared"))
    assert runtimes_dir() == tmp_path / "shared" / "runtimes"
    monkeypatch.setenv(RUNTIMES_DIR_ENV, str(tmp_path / "cache"))
    assert runtimes_dir() == tmp_path / "cache"
    assert runtime_dir(OLD) == (tmp_path / "cache" / "mnn-3.0.0").absolute()
    with pytest.raises(ValueError, match="not an MNN version"):
        runtime_dir("../../etc")


# --- the comparison, pure -------------------------------------------------------------------

F = np.float32
COMPARISONS = {
    "identical": ([1.0, 2.0], [1.0, 2.0], True, True, 0.0),
    "rounding": ([1.0, 2.0], [1.0, 2.0005], False, True, 0.0005),
    "beyond": ([1.0, 2.0], [1.0, 2.1], False, False, 0.1),
    "relative to a large value": ([1000.0], [1000.5], False, True, 0.5),
    "nan meets nan": ([np.nan, 1.0], [np.nan, 1.0], True, True, 0.0),
    "nan on one side": ([np.nan, 1.0], [0.0, 1.0], False, False, float("inf")),
    "equal infinities": ([np.inf, 1.0], [np.inf, 1.0], True, True, 0.0),
    # int8: a step of the output scale near zero is beyond float's tolerance...
    "an int8 step": ([0.0, 10.0], [0.23, 10.0], False, False, 0.23),
}
# ... and within int8's, which is relative to the output's range.
INT8_COMPARISONS = {
    "an int8 step": ([0.0, 10.0], [0.23, 10.0], False, True, 0.23),
    "beyond an int8 step": ([0.0, 10.0], [0.6, 10.0], False, False, 0.6),
}


@pytest.mark.parametrize(
    ("case", "tolerance"),
    [(case, FLOAT_TOLERANCE) for case in COMPARISONS]
    + [(case, INT8_TOLERANCE) for case in INT8_COMPARISONS],
)
def test_compare_outputs(case: str, tolerance: Tolerance) -> None:
    table = COMPARISONS if tolerance is FLOAT_TOLERANCE else INT8_COMPARISONS
    want, got, identical, within, diff = table[case]
    result = compare_outputs(
        {"y": np.array([want], F)}, {"y": np.array([got], F)}, tolerance=tolerance
    )
    (output,) = result.outputs
    assert (output.identical, output.within) == (identical, within)
    assert output.max_abs_diff == pytest.approx(diff, rel=1e-3)
    assert result.within == within


def test_default_tolerance_per_quantization() -> None:
    assert default_tolerance("int8") is INT8_TOLERANCE
    assert default_tolerance("weight") is FLOAT_TOLERANCE
    assert default_tolerance("none") is FLOAT_TOLERANCE


def test_compare_outputs_shape_missing_and_dtype() -> None:
    result = compare_outputs(
        {"a": np.zeros((2, 3), F), "b": np.zeros(2, F), "c": np.arange(3)},
        {"a": np.zeros((2, 4), F), "c": np.arange(3).astype(np.int32), "extra": np.zeros(1)},
    )
    a, b, c = result.outputs
    assert not a.within
    assert a.actual_shape == (2, 4)
    assert a.max_abs_diff == float("inf")
    assert not b.within
    assert b.actual_shape is None
    # Same values in another integer width: within, but not bit-identical.
    assert c.within
    assert not c.identical
    assert result.describe() == "output 'a': shape [2, 4], expected [2, 3]; output 'b': missing"


# --- models.toml and the command ------------------------------------------------------------


def _toml(tmp_path: Path, small_toml: str, extra: str) -> Path:
    text = small_toml.replace("[toolchain]\n", f"[toolchain]\n{extra}\n", 1)
    assert text != small_toml
    path = tmp_path / "models.toml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_minimum_defaults_to_the_converter(tmp_path: Path, small_toml: str) -> None:
    toolchain = config_module.load(_toml(tmp_path, small_toml, "")).toolchain
    assert toolchain.minimum_runtime == toolchain.mnn
    assert not toolchain.needs_runtime_proof
    declared = config_module.load(_toml(tmp_path, small_toml, 'min_mnn_runtime = "3.0.0"'))
    assert declared.toolchain.minimum_runtime == "3.0.0"
    assert declared.toolchain.needs_runtime_proof
    assert "min_mnn_runtime" not in declared.toolchain.as_dict()  # not a package pin


@pytest.mark.parametrize(
    ("extra", "key", "message"),
    [
        ('min_mnn_runtime = "9.0.0"', "toolchain.min_mnn_runtime", "is newer than the converter"),
        ('min_mnn_runtime = "3.0"', "toolchain.min_mnn_runtime", "not a version like 3.6.1"),
        (
            'min_mnn_runtime = "3.0.0"\nmnn_target_version = "3.6"',
            "toolchain.mnn_target_version",
            "newer than the minimum runtime 3.0.0",
        ),
        ('mnn_target_version = "3.10"', "toolchain.mnn_target_version", "3.10 would mean 3.1"),
    ],
)
def test_a_minimum_that_cannot_hold_is_refused(
    tmp_path: Path, small_toml: str, extra: str, key: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        config_module.load(_toml(tmp_path, small_toml, extra))
    assert caught.value.key_path == key
    assert message in caught.value.message


def test_install_command(
    tmp_path: Path, small_toml: str, runtimes_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runner = CliRunner()
    monkeypatch.chdir(tmp_path)
    _toml(tmp_path, small_toml, "")
    result = runner.invoke(main, ["toolchain", "runtimes", "install"])
    assert result.exit_code == 0, result.output
    assert "no other MNN runtime is needed" in result.output

    result = runner.invoke(main, ["toolchain", "runtimes", "install", "--version", "3.0"])
    assert result.exit_code == 2
    assert "'3.0' is not an MNN version like 3.0.0" in result.output

    # Declared, and already in the cache: nothing to download.
    _toml(tmp_path, small_toml, 'min_mnn_runtime = "3.0.0"')
    monkeypatch.setenv(RUNTIMES_DIR_ENV, str(runtimes_root))
    result = runner.invoke(main, ["toolchain", "runtimes", "install", "--json"])
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.output)
    assert row["version"] == OLD
    assert row["installed"] is False

    result = runner.invoke(main, ["toolchain", "runtimes", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {r["version"]: r for r in json.loads(result.output)}
    assert rows[OLD]["needed"] is True
    assert rows[OLD]["path"] == str(runtime_dir(OLD, runtimes_root))


def test_make_clean_keeps_the_runtimes(tmp_path: Path) -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    recipe = makefile.split("\nclean:\n", 1)[1].split("\n\n", 1)[0]
    for path in (".edgereg/runtimes/mnn-3.0.0/bin", ".edgereg/demo-devices", "build"):
        (tmp_path / path).mkdir(parents=True)
    for line in textwrap.dedent(recipe).splitlines():
        subprocess.run(line.strip(), shell=True, cwd=tmp_path, check=True)
    assert (tmp_path / ".edgereg/runtimes/mnn-3.0.0/bin").is_dir()
    assert not (tmp_path / ".edgereg/demo-devices").exists()
    assert not (tmp_path / "build").exists()


def test_a_runtime_whose_python_cannot_start_is_broken(tmp_path: Path) -> None:
    path = _stand_in_runtime(tmp_path, "")
    # An interpreter whose own interpreter is gone: exec fails before any output.
    (path / "bin" / "python").write_text("#!/nonexistent/sh\n", encoding="utf-8")
    artifact = tmp_path / "model.mnn"
    artifact.write_bytes(b"never read")

    with pytest.raises(ProofError) as caught:
        run_under_runtime(
            artifact, OLD, {"x": np.zeros((2, 3), np.float32)}, input_names=["x"], root=tmp_path
        )

    assert caught.value.reason == "broken"
    assert f"cannot start the MNN {OLD} runtime" in caught.value.message
    assert "reinstall it" in (caught.value.hint or "")
