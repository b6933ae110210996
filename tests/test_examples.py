"""The example models of every kind, built from the repository's own models.toml.

A text detector (dense map), a CTC line recogniser, a streaming voice-activity
detector with recurrent state, and a token-id embedding transformer
(pipelines/): their healthy variants pass, and a damaged variant of each fails
its gate with the numbers and a message that says what to do. Real MNN and
ONNX Runtime, real trained models.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from buildkit import FAST_BENCH

from edgereg import config as config_module
from edgereg import toolchain
from edgereg.build.outputs import ARTIFACT, HOST_BENCHMARK, METRICS
from edgereg.build.variant import build_variant
from edgereg.errors import GateError

REPO = Path(__file__).resolve().parent.parent

# Every test here builds the full example models: `make test-fast` leaves them out.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def example() -> config_module.Config:
    return config_module.load(REPO / "models.toml")


def with_variant(config: config_module.Config, model: str, table: str) -> config_module.Config:
    """The example config with ``table`` (a [models.M.variants.V] block) as its mid variant.

    The model's own mid-tier variant, if any, is dropped: a tier takes one variant.
    """
    text = config.path.read_text(encoding="utf-8")
    own = re.search(
        rf"\[models\.{model}\.variants\.\w+\]\ntier = \"mid\"\n(?:[^\[\n][^\n]*\n|#[^\n]*\n)*",
        text,
    )
    if own is not None:
        text = text[: own.start()] + text[own.end() :]
    return config_module.parse(text + "\n" + table, file=str(config.path))


def build(config: config_module.Config, model: str, variant: str, out: Path) -> Any:
    return build_variant(config, model, variant, out, bench=FAST_BENCH)


@pytest.mark.parametrize(
    ("model", "variant", "metric", "floor"),
    [
        ("textdet", "fp16", "iou", 0.99),
        ("textdet", "int8", "iou", 0.9),
        ("textrec", "w8", "line_match", 0.98),
        ("vad", "fp32", "frame_agreement", 1.0),
        ("vad", "w8", "frame_agreement", 0.98),
        ("embed", "fp16", "neighbour_agreement", 0.99),
        ("segment", "small", "min_class_iou", 0.9),
    ],
)
def test_healthy_example_variants_pass_on_their_task_metric(
    example: config_module.Config,
    tmp_path: Path,
    model: str,
    variant: str,
    metric: str,
    floor: float,
) -> None:
    result = build(example, model, variant, tmp_path)
    assert result.metrics["status"] == "passed"
    assert result.metrics["metrics"][metric] >= floor
    assert (tmp_path / model / variant / ARTIFACT).is_file()


def test_streamed_vad_scores_its_labels_like_the_training_script(
    example: config_module.Config, tmp_path: Path
) -> None:
    # pipelines/README.md: streamed fp32 F1 0.9516 on the held-out set.
    metrics = build(example, "vad", "fp32", tmp_path).metrics
    assert metrics["baseline"]["f1"] == pytest.approx(0.9516, abs=1e-4)
    assert metrics["metrics"]["f1"] == pytest.approx(metrics["baseline"]["f1"])


DAMAGED = [
    pytest.param(
        "textdet",
        '[models.textdet.variants.kl]\ntier = "mid"\n'
        'quantization = { mode = "int8", method = "KL" }\nmin_mnn_runtime = "3.6.1"\n',
        ("iou.min",),
        'Measured: method = "EMA" passes every gate',
        id="detector-int8-KL",
    ),
    pytest.param(
        "textrec",
        '[models.textrec.variants.w2]\ntier = "mid"\n'
        'quantization = { mode = "weight", bits = 2 }\n',
        ("line_match.min", "min_snr_db[logits]"),
        None,
        id="recogniser-2-bit-weights",
    ),
    pytest.param(
        "vad",
        '[models.vad.variants.int8]\ntier = "mid"\n'
        'quantization = { mode = "int8", method = "KL" }\n',
        ("frame_agreement.min", "f1.max_drop"),
        "No other feature method passed either (measured)",
        id="streaming-vad-int8",
    ),
    pytest.param(
        "embed",
        '[models.embed.variants.int8]\ntier = "mid"\n'
        'quantization = { mode = "int8", method = "EMA" }\n',
        ("neighbour_agreement.min",),
        "No other feature method passed either (measured)",
        id="embedding-int8",
    ),
]


@pytest.mark.parametrize(("model", "table", "gates", "hint"), DAMAGED)
def test_a_damaged_example_variant_fails_its_gate_and_keeps_its_numbers(
    example: config_module.Config,
    tmp_path: Path,
    model: str,
    table: str,
    gates: tuple[str, ...],
    hint: str | None,
) -> None:
    config = with_variant(example, model, table)
    variant = re.search(r"variants\.(\w+)\]", table)
    assert variant is not None
    name = variant.group(1)
    with pytest.raises(GateError) as caught:
        build(config, model, name, tmp_path)
    error = caught.value
    for gate in gates:
        assert gate in error.message, error.diagnostics()
    if hint is not None:
        assert error.hint is not None
        assert hint in error.hint, error.hint
    out = tmp_path / model / name
    assert sorted(p.name for p in out.iterdir()) == [HOST_BENCHMARK, METRICS]
    metrics = json.loads((out / METRICS).read_text(encoding="utf-8"))
    assert metrics["status"] == "failed"
    assert any(line.startswith(gates[0]) for line in metrics["failed"])


# --- the segmentation example: every class gated, and a tier's memory ceiling at work --


def _no_arm(text: str) -> str:
    """models.toml verified on no ARM class: these tests are about the host."""
    return text.replace('min_mnn_runtime = "3.0.0"\n', 'min_mnn_runtime = "3.0.0"\narm = []\n', 1)


def _without_arm(config: config_module.Config, text: str | None = None) -> config_module.Config:
    """The example (or ``text``) verified on no ARM class."""
    text = text if text is not None else config.path.read_text(encoding="utf-8")
    return config_module.parse(_no_arm(text), file=str(config.path))


def _sabotage(source: Path, target: Path) -> int:
    """The same function in float, with the tail class riding on a channel 1000x smaller.

    The cross class's strongest input channel to the head is copied into a new
    channel at a thousandth of its scale (the ReLU before the head commutes
    with the scale) and the head reads the cross class from it at a thousand
    times the weight. fp32 computes the same logits; int8 quantizes that
    channel against the scale of the others (to nothing) and the cross row of
    the head against its one huge weight (its other weights to nothing): the
    tail class flips to its neighbours, a channel-range imbalance that
    cross-layer equalization exists to undo.
    """
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(source))
    graph = model.graph
    inits = {tensor.name: tensor for tensor in graph.initializer}
    producer = {output: node for node in graph.node for output in node.output}
    head = [node for node in graph.node if node.op_type == "Conv"][-1]
    relu = producer[head.input[0]]
    fuse = producer[relu.input[0]]
    assert (relu.op_type, fuse.op_type) == ("Relu", "Conv")
    weight = numpy_helper.to_array(inits[head.input[1]]).copy()
    fuse_w = numpy_helper.to_array(inits[fuse.input[1]])
    fuse_b = numpy_helper.to_array(inits[fuse.input[2]])
    cross = weight.shape[0] - 1
    channel = int(np.argmax(weight[cross, :, 0, 0] - weight[:cross, :, 0, 0].mean(axis=0)))
    scale = np.float32(1e-3)
    head_w = np.concatenate([weight, np.zeros((weight.shape[0], 1, 1, 1), np.float32)], axis=1)
    head_w[cross, -1] = weight[cross, channel] / scale
    head_w[cross, channel] = 0.0
    for name, array in (
        (head.input[1], head_w),
        (fuse.input[1], np.concatenate([fuse_w, fuse_w[channel : channel + 1] * scale])),
        (fuse.input[2], np.concatenate([fuse_b, fuse_b[channel : channel + 1] * scale])),
    ):
        inits[name].CopyFrom(numpy_helper.from_array(array.astype(np.float32), name))
    onnx.save(model, str(target))
    return channel


def test_a_sabotaged_int8_that_flips_the_tail_class_fails_its_iou_gate(
    example: config_module.Config, tmp_path: Path
) -> None:
    source = example.resolve_path(example.models["segment"].source)
    sabotaged = tmp_path / "sabotaged.onnx"
    _sabotage(source, sabotaged)
    # The same function in float: the fp32 reference cannot tell.
    images = np.random.default_rng(0).normal(0, 1, (1, 3, 512, 512)).astype(np.float32)
    original = toolchain.run_onnx(source, {"image": images}).outputs["logits"]
    assert (
        np.abs(toolchain.run_onnx(sabotaged, {"image": images}).outputs["logits"] - original).max()
        < 1e-4
    )
    text = example.path.read_text(encoding="utf-8")
    pin = example.models["segment"].source
    text = text.replace(
        f'path = "{pin.path}", sha256 = "{pin.sha256}"',
        f'path = "{sabotaged}", sha256 = "{hashlib.sha256(sabotaged.read_bytes()).hexdigest()}"',
        1,
    )
    config = _without_arm(example, text)
    with pytest.raises(GateError) as caught:
        build(config, "segment", "int8", tmp_path / "build")
    message = caught.value.message
    assert "min_class_iou.min" in message
    assert re.search(r"worst classes against the fp32 reference: cross 0\.[0-3]", message), message
    metrics = json.loads((tmp_path / "build" / "segment" / "int8" / METRICS).read_text())
    assert metrics["status"] == "failed"
    iou = metrics["per_class"]["iou"]
    # The other classes keep their IoU with the reference; the tail class is gone.
    assert min(iou["background"], iou["disc"], iou["box"]) > 0.9
    assert iou["cross"] < 0.4


def test_the_low_tiers_memory_ceiling_refuses_the_512_variant_with_its_numbers(
    example: config_module.Config, tmp_path: Path
) -> None:
    from click.testing import CliRunner

    from edgereg.build.fit import ceiling_problems
    from edgereg.cli import main

    # What models.toml would say if the low tier ran the 512x512 network, weight-only.
    text = example.path.read_text(encoding="utf-8")
    low = text.index("[models.segment.variants.small]")
    end = text.index("# ---", low)
    w8 = "\n".join(
        ("[models.segment.variants.w8]", 'tier = "low"', 'quantization = { mode = "weight" }', "")
    )
    low_text = _no_arm(text[:low] + w8 + "\n" + text[end:])
    config = config_module.parse(low_text, file=str(example.path))
    out = tmp_path / "build"
    build(config, "segment", "w8", out)
    ceiling = config.tiers["low"].max_model_memory_mb
    assert ceiling is not None
    host = json.loads((out / "segment" / "w8" / HOST_BENCHMARK).read_text())
    (problem,) = ceiling_problems(config, "segment", out, require_measured=True)
    assert problem.startswith(
        f"tier low: segment/w8 peak memory {host['memory_peak_mb']:.1f} MB (host peak) > the "
        f"tier's max_model_memory_mb {ceiling:g} MB"
    )
    # The example's own low variant, the network at 256x256, fits.
    example_config = _without_arm(example)
    build(example_config, "segment", "small", out)
    small = json.loads((out / "segment" / "small" / HOST_BENCHMARK).read_text())
    assert small["memory_peak_mb"] < ceiling < host["memory_peak_mb"]
    # edgereg validate refuses the 512x512 low variant, naming both numbers.
    config_path = tmp_path / "models.toml"
    config_path.write_text(low_text, encoding="utf-8")
    (tmp_path / "pipelines").symlink_to(REPO / "pipelines")
    result = CliRunner().invoke(main, ["validate", "--config", str(config_path)])
    assert result.exit_code == 2, result.output
    assert f"segment/w8 peak memory {host['memory_peak_mb']:.1f} MB" in result.output
