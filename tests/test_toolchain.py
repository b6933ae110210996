"""The toolchain against real MNN, ONNX and ONNX Runtime, on tiny models.

Nothing is mocked: every MNN call runs the installed converter, quantizer and
runtime in a child process. Converted models are shared per module to keep
the file fast.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
import tiny_models

from edgereg.errors import BuildError, ToolchainError
from edgereg.toolchain import (
    BIZ_CODE,
    QuantInput,
    _mnnfile,
    benchmark,
    check_versions,
    convert,
    inspect_onnx,
    installed_versions,
    make_deterministic,
    mnn_runtime_version,
    model_info,
    parse_layer_errors,
    parse_op_listing,
    quantize,
    run_inference,
    run_onnx,
    supported_onnx_ops,
    unsupported_ops,
)
from edgereg.toolchain._process import describe_status, tail

RNG_SEED = 1234


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Directory with the tiny ONNX models and their fp32 MNN conversions."""
    root = tmp_path_factory.mktemp("models")
    tiny_models.conv_classifier(root / "conv.onnx")
    tiny_models.conv_classifier(root / "conv_fixed.onnx", batch_dynamic=False)
    tiny_models.two_input_model(root / "two.onnx")
    tiny_models.unsupported_op_model(root / "unsupported.onnx")
    tiny_models.corrupt_file(root / "corrupt.onnx")
    for name in ("conv", "two"):
        convert(root / f"{name}.onnx", root / f"{name}.mnn")
    return root


@pytest.fixture(scope="module")
def images() -> np.ndarray:
    """Twelve random images for the conv classifier."""
    rng = np.random.default_rng(RNG_SEED)
    return rng.normal(0, 1, (12, *tiny_models.CONV_SHAPE)).astype(np.float32)


@pytest.fixture(scope="module")
def pairs() -> dict[str, np.ndarray]:
    """Twelve random samples for the two-input model."""
    rng = np.random.default_rng(RNG_SEED + 1)
    return {
        name: rng.normal(0, 1, (12, width)).astype(np.float32)
        for name, width in zip(
            tiny_models.TWO_INPUT_NAMES, tiny_models.TWO_INPUT_WIDTHS, strict=True
        )
    }


def _rows(data: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
    count = next(iter(data.values())).shape[0]
    for i in range(count):
        yield {name: array[i : i + 1] for name, array in data.items()}


# --- versions -------------------------------------------------------------


def test_installed_versions_come_from_package_metadata() -> None:
    versions = installed_versions()
    assert versions["mnn"] == metadata.version("mnn")
    assert set(versions) == {"mnn", "onnx", "onnxruntime"}


def test_check_versions_accepts_the_installed_toolchain() -> None:
    check_versions(installed_versions())


def test_version_mismatch_names_package_and_both_versions() -> None:
    installed = metadata.version("mnn")
    with pytest.raises(ToolchainError) as caught:
        check_versions({"mnn": "0.0.1", "onnx": metadata.version("onnx")})
    error = caught.value
    assert "mnn 0.0.1 is pinned" in error.message
    assert f"but {installed} is installed" in error.message
    assert "onnx" not in error.message
    assert error.hint == "pip install mnn==0.0.1"
    assert error.stage == "pin check"


def test_version_check_lists_every_mismatch_and_missing_packages() -> None:
    with pytest.raises(ToolchainError) as caught:
        check_versions({"mnn": "0.0.1", "onnxruntime": "0.0.2", "no-such-package-edgereg": "1.0"})
    lines = caught.value.message.splitlines()
    assert len(lines) == 3
    assert any(
        "no-such-package-edgereg 1.0 is pinned" in line and "not installed" in line
        for line in lines
    )
    assert any(line.startswith("onnxruntime 0.0.2 is pinned") for line in lines)


# --- ONNX checks ----------------------------------------------------------


def test_inspect_onnx_reports_signature_and_ops(models: Path) -> None:
    report = inspect_onnx(models / "conv.onnx")
    assert report.opset == tiny_models.OPSET
    assert report.op_counts == {
        "BatchNormalization": 1,
        "Conv": 2,
        "Flatten": 1,
        "Gemm": 1,
        "GlobalAveragePool": 1,
        "Relu": 2,
    }
    (image,) = report.inputs
    assert (image.name, image.shape, image.dtype) == ("image", ("N", 3, 8, 8), "float32")
    assert report.output_names == ["logits"]
    assert report.batch_dynamic
    assert not inspect_onnx(models / "conv_fixed.onnx").batch_dynamic
    assert inspect_onnx(models / "two.onnx").input_names == ["a", "b"]


def test_corrupt_onnx_is_a_check_error(models: Path) -> None:
    with pytest.raises(BuildError) as caught:
        inspect_onnx(models / "corrupt.onnx")
    assert caught.value.stage == "check"
    assert "is not a valid ONNX model" in caught.value.message


def test_supported_ops_come_from_the_converter() -> None:
    ops = supported_onnx_ops()
    assert len(ops) == 169  # mnn 3.6.1
    assert {"Conv", "Gemm", "BatchNormalization", "Concat"} <= ops
    assert tiny_models.UNSUPPORTED_OP not in ops


def test_parse_op_listing_ignores_chatter_and_checks_the_total() -> None:
    listing = "The device supports: i8sdot:0\nDump ONNX support Ops\nAbs\nConv\nTotal: 2\n"
    assert parse_op_listing(listing) == {"Abs", "Conv"}
    with pytest.raises(ValueError, match="Total: 3"):
        parse_op_listing(listing.replace("Total: 2", "Total: 3"))
    with pytest.raises(ValueError, match="header"):
        parse_op_listing("Converted Failed!\n")


def test_unsupported_op_is_found_before_conversion(models: Path) -> None:
    assert unsupported_ops(inspect_onnx(models / "unsupported.onnx")) == [
        tiny_models.UNSUPPORTED_OP
    ]
    assert unsupported_ops(inspect_onnx(models / "conv.onnx")) == []


def test_converting_an_unsupported_op_fails_and_removes_the_stale_output(
    models: Path, tmp_path: Path
) -> None:
    out = tmp_path / "unsupported.mnn"
    out.write_bytes(b"stale model from an earlier run")
    with pytest.raises(BuildError) as caught:
        convert(models / "unsupported.onnx", out)
    error = caught.value
    assert error.stage == "convert"
    assert error.tool == "mnnconvert"
    assert tiny_models.UNSUPPORTED_OP in error.message
    assert error.output_tail is not None
    assert "Converted Failed!" in error.output_tail
    assert error.exit_status == 0  # the converter "succeeds" on failure
    assert not out.exists()
    assert list(tmp_path.iterdir()) == []  # no scratch left behind


# --- conversion -----------------------------------------------------------


def test_convert_writes_a_loadable_model(models: Path, tmp_path: Path) -> None:
    run = convert(models / "conv.onnx", tmp_path / "sub" / "conv.mnn")
    assert run.model.input_names == ("image",)
    assert run.model.output_names == ("logits",)
    assert run.model.version == metadata.version("mnn")
    assert run.model.biz_code == BIZ_CODE
    assert "Converted Success!" in run.output
    assert run.argv[:3] == ("mnnconvert", "-f", "ONNX")
    assert str(tmp_path / "sub" / "conv.mnn") in run.argv
    assert run.duration > 0
    assert sorted(p.name for p in (tmp_path / "sub").iterdir()) == ["conv.mnn"]
    assert mnn_runtime_version(tmp_path / "sub" / "conv.mnn") == metadata.version("mnn")


@pytest.mark.parametrize(
    ("onnx_name", "batch_size"), [("conv", 5), ("conv_fixed", 4), ("two", 5), ("two", 1)]
)
def test_fp32_mnn_matches_onnx_runtime(
    models: Path,
    images: np.ndarray,
    pairs: dict[str, np.ndarray],
    tmp_path: Path,
    onnx_name: str,
    batch_size: int,
) -> None:
    mnn_path = models / f"{onnx_name}.mnn"
    if not mnn_path.exists():
        mnn_path = tmp_path / f"{onnx_name}.mnn"
        convert(models / f"{onnx_name}.onnx", mnn_path)
    data = pairs if onnx_name == "two" else {"image": images}
    expected = run_onnx(models / f"{onnx_name}.onnx", data, batch_size=batch_size).outputs
    got = run_inference(mnn_path, data, batch_size=batch_size)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        assert got[name].shape == value.shape
        np.testing.assert_allclose(got[name], value, atol=1e-4)


def test_weight_quantization_and_fp16_shrink_the_file(models: Path, tmp_path: Path) -> None:
    fp32 = (models / "conv.mnn").stat().st_size
    int8 = convert(models / "conv.onnx", tmp_path / "w8.mnn", weight_quant_bits=8)
    fp16 = convert(models / "conv.onnx", tmp_path / "fp16.mnn", fp16=True)
    assert "--weightQuantAsymmetric=1" in int8.argv
    assert (tmp_path / "w8.mnn").stat().st_size < 0.6 * fp32
    assert (tmp_path / "fp16.mnn").stat().st_size < 0.8 * fp32
    assert "--fp16" in fp16.argv


def test_invalid_converter_options_are_rejected(models: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="2 to 8"):
        convert(models / "conv.onnx", tmp_path / "x.mnn", weight_quant_bits=9)
    with pytest.raises(ValueError, match="needs weight_quant_bits"):
        convert(models / "conv.onnx", tmp_path / "x.mnn", weight_quant_block=32)


# --- deterministic id -------------------------------------------------------


def test_make_deterministic_gives_identical_files_for_the_same_seed(
    models: Path, tmp_path: Path
) -> None:
    first, second, other = (tmp_path / f"{n}.mnn" for n in ("first", "second", "other"))
    for path in (first, second, other):
        convert(models / "conv.onnx", path)
    assert first.read_bytes() != second.read_bytes()  # random mnn_uuid

    uuid_a = make_deterministic(first, b"inputs-digest")
    uuid_b = make_deterministic(second, b"inputs-digest")
    uuid_c = make_deterministic(other, b"another-digest")

    assert uuid_a == uuid_b == _mnnfile.derive_uuid(b"inputs-digest")
    assert first.read_bytes() == second.read_bytes()
    assert other.read_bytes() != first.read_bytes()
    assert uuid_c != uuid_a
    assert model_info(first).uuid == uuid_a
    assert make_deterministic(first, b"inputs-digest") == uuid_a  # idempotent
    assert sorted(p.name for p in tmp_path.iterdir()) == ["first.mnn", "other.mnn", "second.mnn"]


def test_derived_uuid_has_the_converters_format() -> None:
    value = _mnnfile.derive_uuid(b"seed")
    assert len(value) == _mnnfile.UUID_LENGTH
    assert value == value.lower()
    assert [len(part) for part in value.split("-")] == [8, 4, 4, 4, 12]
    assert value[14] == "8"  # UUID version 8


def test_make_deterministic_refuses_a_non_mnn_file(tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.mnn"
    bogus.write_bytes(b"\x00" * 64)
    with pytest.raises(BuildError) as caught:
        make_deterministic(bogus, b"seed")
    assert caught.value.stage == "deterministic id"
    assert bogus.read_bytes() == b"\x00" * 64


# --- full int8 quantization -------------------------------------------------


def _assert_close_to_fp32(quantized: np.ndarray, reference: np.ndarray) -> None:
    scale = float(np.abs(reference).max())
    assert float(np.abs(quantized - reference).max()) < 0.15 * scale


def test_int8_quantization_of_an_image_model(
    models: Path, images: np.ndarray, tmp_path: Path
) -> None:
    out = tmp_path / "conv_int8.mnn"
    out.write_bytes(b"stale")
    run = quantize(
        models / "conv.mnn",
        out,
        inputs=[QuantInput("image", [1, *tiny_models.CONV_SHAPE])],
        samples=[{"image": image} for image in images],
        method="KL",
    )
    assert run.model.input_names == ("image",)
    assert run.config["input_type"] == "sequence"
    assert run.layer_errors, "debug mode reports per-layer error"
    assert all(
        e.op and (math.isnan(e.cosine) or -1.0 <= e.cosine <= 1.0001) for e in run.layer_errors
    )
    reference = run_inference(models / "conv.mnn", {"image": images}, batch_size=4)["logits"]
    quantized = run_inference(out, {"image": images}, batch_size=4)["logits"]
    _assert_close_to_fp32(quantized, reference)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["conv_int8.mnn"]


def test_int8_quantization_of_a_two_input_model_is_deterministic(
    models: Path, pairs: dict[str, np.ndarray], tmp_path: Path
) -> None:
    inputs = [
        QuantInput(name, (1, width))
        for name, width in zip(
            tiny_models.TWO_INPUT_NAMES, tiny_models.TWO_INPUT_WIDTHS, strict=True
        )
    ]
    samples = list(_rows(pairs))
    first = quantize(
        models / "two.mnn", tmp_path / "a.mnn", inputs=inputs, samples=samples, debug=False
    )
    quantize(models / "two.mnn", tmp_path / "b.mnn", inputs=inputs, samples=samples, debug=False)
    assert first.layer_errors == ()
    assert (tmp_path / "a.mnn").read_bytes() == (tmp_path / "b.mnn").read_bytes()
    reference = run_onnx(models / "two.onnx", pairs, batch_size=6).outputs["y"]
    quantized = run_inference(tmp_path / "a.mnn", pairs, batch_size=6)["y"]
    _assert_close_to_fp32(quantized, reference)


def test_skip_quant_op_names_keeps_a_layer_in_float(
    models: Path, images: np.ndarray, tmp_path: Path
) -> None:
    inputs = [QuantInput("image", (1, *tiny_models.CONV_SHAPE))]
    samples = [{"image": image} for image in images[:4]]
    full = quantize(models / "conv.mnn", tmp_path / "full.mnn", inputs=inputs, samples=samples)
    skipped_op = full.layer_errors[0].op
    partial = quantize(
        models / "conv.mnn",
        tmp_path / "partial.mnn",
        inputs=inputs,
        samples=samples,
        skip_ops=[skipped_op],
    )
    assert skipped_op not in {e.op for e in partial.layer_errors}
    assert partial.config["skip_quant_op_names"] == [skipped_op]


def test_quantization_that_computes_nan_is_refused(tmp_path: Path) -> None:
    # mnn 3.6.1's EMA path turns a layer whose output is always zero into NaN.
    model = tmp_path / "dead.mnn"
    convert(tiny_models.dead_layer_model(tmp_path / "dead.onnx"), model)
    rng = np.random.default_rng(RNG_SEED)
    samples = [{"x": row} for row in rng.normal(0, 1, (4, 8)).astype(np.float32)]
    out = tmp_path / "ema.mnn"
    out.write_bytes(b"stale")
    with pytest.raises(BuildError) as caught:
        quantize(model, out, inputs=[QuantInput("x", (1, 8))], samples=samples, method="EMA")
    assert caught.value.stage == "quantize"
    assert "NaN or infinity on 4 of 4 calibration samples tried" in caught.value.message
    assert caught.value.hint is not None
    assert "KL" in caught.value.hint
    assert not out.exists()
    quantize(model, out, inputs=[QuantInput("x", (1, 8))], samples=samples, method="KL")
    assert out.exists()


def test_calibration_data_must_fit_the_inputs(models: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs 192"):
        quantize(
            models / "conv.mnn",
            tmp_path / "q.mnn",
            inputs=[QuantInput("image", (1, 3, 8, 8))],
            samples=[{"image": np.zeros(10, np.float32)}],
        )
    with pytest.raises(ValueError, match="NaN or infinity"):
        quantize(
            models / "conv.mnn",
            tmp_path / "q.mnn",
            inputs=[QuantInput("image", (1, 3, 8, 8))],
            samples=[{"image": np.full(192, np.nan, np.float32)}],
        )
    with pytest.raises(ValueError, match="not one of"):
        quantize(models / "conv.mnn", tmp_path / "q.mnn", inputs=[], samples=[], method="MSE")


def test_quantizer_timeout_is_a_build_error(
    models: Path, images: np.ndarray, tmp_path: Path
) -> None:
    out = tmp_path / "slow.mnn"
    with pytest.raises(BuildError) as caught:
        quantize(
            models / "conv.mnn",
            out,
            inputs=[QuantInput("image", (1, *tiny_models.CONV_SHAPE))],
            samples=[{"image": images[0]}],
            timeout=0.001,
        )
    assert caught.value.stage == "quantize"
    assert "did not finish" in caught.value.message
    assert not out.exists()


def test_parse_layer_errors_sorts_worst_first_and_keeps_nan() -> None:
    output = (
        "computeDistance: 50.00 %\rcomputeDistance: 100.00 %\n\nDebug info:\n\n"
        "conv1 output_tensor_0:  cos distance: 0.999000, overflow ratio: 0.000100\n"
        "fc output_tensor_0:  cos distance: -nan, overflow ratio: 0.010000\n"
        "conv2 input_tensor_1:  cos distance: 0.950000, overflow ratio: 0.200000\n"
    )
    errors = parse_layer_errors(output)
    assert [e.op for e in errors] == ["conv2", "conv1", "fc"]
    assert errors[0].tensor == "conv2 input_tensor_1"
    assert errors[0].overflow_ratio == pytest.approx(0.2)
    assert math.isnan(errors[-1].cosine)


# --- benchmark and process plumbing ----------------------------------------


def test_benchmark_returns_sane_numbers(models: Path, images: np.ndarray) -> None:
    result = benchmark(
        models / "conv.mnn", {"image": images[:1]}, threads=(1, 2), warmup=2, iterations=10
    )
    assert set(result.latency_ms) == {1, 2}
    for stats in result.latency_ms.values():
        assert 0 < stats.p50 <= stats.p90 < 1000
    assert 0 < result.load_ms < 10_000
    assert 10 < result.peak_rss_mb < 4096


def test_missing_model_is_a_build_error(tmp_path: Path) -> None:
    with pytest.raises(BuildError) as caught:
        run_inference(tmp_path / "absent.mnn", {"x": np.zeros((1, 2), np.float32)})
    assert caught.value.stage == "inference"
    assert "does not exist" in caught.value.message


def test_unloadable_model_is_a_build_error_with_the_tools_output(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.mnn"
    garbage.write_bytes(b"not a flatbuffer" * 8)
    with pytest.raises(BuildError) as caught:
        run_inference(garbage, {"x": np.zeros((1, 2), np.float32)})
    error = caught.value
    assert (error.stage, error.tool) == ("inference", "MNN")
    assert error.exit_status == 3  # the worker caught MNN's error and reported it
    assert error.output_tail


def test_status_and_tail_formatting() -> None:
    assert describe_status(-11) == "killed by signal SIGSEGV"
    assert describe_status(2) == "exit status 2"
    lines = "\n".join(f"line {i}" for i in range(30)) + "\rprogress 50%\rprogress 100%\n"
    shown = tail(lines).splitlines()
    assert len(shown) == 20
    assert shown[-1] == "progress 100%"


def test_no_child_leaves_files_in_the_working_directory(models: Path, tmp_path: Path) -> None:
    before = set(os.listdir("."))
    convert(models / "conv.onnx", tmp_path / "again.mnn")
    assert set(os.listdir(".")) == before
