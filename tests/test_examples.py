"""The example models of every kind, built from the repository's own models.toml.

A text detector (dense map), a CTC line recogniser, a streaming voice-activity
detector with recurrent state, and a token-id embedding transformer
(pipelines/): their healthy variants pass, and a damaged variant of each fails
its gate with the numbers and a message that says what to do. Real MNN and
ONNX Runtime, real trained models.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from buildkit import FAST_BENCH

from edgereg import config as config_module
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
