"""A failing int8 `auto` search stops early and says how long it will take.

Issue 19: three third-party models' `dvc repro --keep-going` took 38 minutes,
most of it `auto` attempts that all failed. The layer search now stops when
keeping the worst layer in float shows that no number of further layers can
reach the gate, records why, and every run reports the time left. Real MNN
and ONNX Runtime on small real models (tests/tiny_models.py).
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models
from buildkit import FAST_BENCH

from edgereg import config as config_module
from edgereg import toolchain
from edgereg.build.quality import GateReport, GateResult, Scored
from edgereg.build.quantsearch import out_of_reach
from edgereg.build.variant import build_variant
from edgereg.errors import GateError

MODEL = """[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"

[tiers.low]

[models.deep]
version = "1.0.0"
task = "generic"
source = {{ path = "deep.onnx", sha256 = "{source}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}

[[models.deep.inputs]]
name = "x"
shape = [1, {width}, {size}, {size}]

[[models.deep.outputs]]
name = "y"

[models.deep.variants.int8]
tier = "low"
quantization = {{ mode = "int8", method = "auto", max_skip_ops = 8 }}
budgets = {{ min_snr_db = {snr} }}
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _config(root: Path, snr: float) -> config_module.Config:
    source = tiny_models.deep_conv_model(root / "deep.onnx")
    size = (tiny_models.DEEP_WIDTH, tiny_models.DEEP_SIZE, tiny_models.DEEP_SIZE)
    rows = np.abs(np.random.default_rng(5).normal(0, 1, (48, *size)))
    np.savez(root / "evaluation.npz", x=rows.astype(np.float32))
    text = MODEL.format(
        **toolchain.installed_versions(),
        source=_sha(source),
        evaluation=_sha(root / "evaluation.npz"),
        width=tiny_models.DEEP_WIDTH,
        size=tiny_models.DEEP_SIZE,
        snr=snr,
    )
    (root / "models.toml").write_text(text, encoding="utf-8")
    return config_module.load(root / "models.toml")


def test_a_search_that_cannot_reach_the_gate_stops_early_and_says_why(tmp_path: Path) -> None:
    said: list[str] = []
    with pytest.raises(GateError) as caught:
        build_variant(
            _config(tmp_path, snr=90),
            "deep",
            "int8",
            tmp_path / "build",
            bench=FAST_BENCH,
            on_stage=said.append,
        )
    metrics: dict[str, Any] = json.loads(
        (tmp_path / "build" / "deep" / "int8" / "metrics.json").read_text()
    )
    runs = metrics["quantization"]["quantizer_runs"]
    attempts = metrics["quantization"]["attempts"]
    # Three methods, then one layer in float; not the 1, 2, 4 and 8 the search allows.
    assert runs == len(attempts) == 4, attempts
    assert [len(a["skip_ops"]) for a in attempts] == [0, 0, 0, 1]
    hint = caught.value.hint
    assert hint is not None
    assert "No int8 recipe passed after 4 quantizer runs" in hint
    assert "layer search stopped at 1 of up to 8 layers kept in float" in hint
    assert "1 layer with weights in float moved min_snr_db[y] from" in hint
    assert "would not reach 90" in hint

    # Every run said how far the search was and how long the rest may take.
    progress = [line for line in said if line.startswith("int8 auto: run ")]
    assert len(progress) == 4, said
    assert re.fullmatch(
        r"int8 auto: run 1 of at most 7 \(KL\) took \d+ s; at most 6 more, about \d+ s left",
        progress[0],
    ), progress[0]
    assert progress[3].startswith("int8 auto: run 4 of at most 7 (KL, 1 layer in float) took")
    stopped = said.index(progress[3]) + 1
    assert said[stopped].startswith("int8 auto: stopped after 4 runs: 1 layer with weights")


def test_a_search_within_reach_keeps_going_and_finds_its_recipe(tmp_path: Path) -> None:
    # The same model against a budget a few layers in float reach: no early stop.
    base = _snr_of_int8(tmp_path)
    said: list[str] = []
    (tmp_path / "p").mkdir()
    config = _config(tmp_path / "p", snr=round(base + 0.5, 1))
    result = build_variant(
        config, "deep", "int8", tmp_path / "b", bench=FAST_BENCH, on_stage=said.append
    )
    assert not any(line.startswith("int8 auto: stopped") for line in said), said
    assert result.metrics["status"] == "passed"
    chosen = result.provenance["quantization"]
    # Past the first layer kept in float, where the early stop looked and let it go on.
    assert len(chosen["skip_ops"]) >= 2
    assert chosen["quantizer_runs"] >= 5


def _snr_of_int8(tmp_path: Path) -> float:
    root = tmp_path / "probe"
    root.mkdir()
    config = _config(root, snr=0)
    result = build_variant(config, "deep", "int8", root / "build", bench=FAST_BENCH)
    snr: float = result.metrics["agreement"]["y"]["snr_db"]
    return snr


def _scored(snr: float) -> Scored:
    gate = GateResult("min_snr_db[y]", 30.0, snr, snr >= 30.0, bound="min")
    return Scored({}, None, GateReport([gate]), 0)


def test_the_bound_is_optimistic_about_the_layers_left() -> None:
    # 20 dB -> 21 dB: the worst layer took ~21 % of the error; 2 more taking
    # twice that could not bring the other 79 % down to 30 dB's 1 %; 3 more could.
    why = out_of_reach(_scored(20.0), _scored(21.0), 1, 1)
    assert why is not None
    assert "1 layer with weights in float moved min_snr_db[y] from 20 to 21" in why
    assert "would not reach 30" in why
    assert out_of_reach(_scored(20.0), _scored(21.0), 1, 2) is None
    # The same gain from two layers is half the rate per layer.
    assert out_of_reach(_scored(20.0), _scored(21.0), 2, 3) is not None
    # No better, or worse: nothing to extrapolate, the search is over.
    worse = out_of_reach(_scored(20.0), _scored(19.0), 1, 30)
    assert worse is not None
    assert "did not improve" in worse
    # Task metrics have no error model: never a reason to stop.
    task_gate = GateResult("sequence_agreement.min", 0.85, 0.5, False, bound="min")
    task = Scored({}, None, GateReport([task_gate]), 0)
    assert out_of_reach(task, task, 1, 1) is None
