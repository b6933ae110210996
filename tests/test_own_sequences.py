"""A team's recogniser added with `task = "generic"`: the defaults still read its text.

Issue 19: an int8 text-line recogniser passed every default gate at output
cosine 0.981 while reading 10 of 64 lines differently from ONNX Runtime. The
generic task now reads an output that holds a class distribution per step as
a sequence (best class per step, repeats merged) and gates the share of
samples read as the reference reads them. Real MNN and ONNX Runtime on a
small CTC recogniser (tests/tiny_models.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tiny_models
from buildkit import FAST_BENCH
from click.testing import CliRunner

from edgereg import config as config_module
from edgereg import toolchain
from edgereg.build.variant import build_variant
from edgereg.cli import main
from edgereg.config import GenericTask
from edgereg.errors import BuildError, GateError
from edgereg.tasks.generic_eval import generic_scores, step_distributions

CHARSET = [chr(ord("a") + i) for i in range(26)] + [str(i) for i in range(10)] + list(".,-'")
assert len(CHARSET) == tiny_models.REC_CLASSES - 1

MODEL = """[toolchain]
mnn = "{mnn}"
onnx = "{onnx}"
onnxruntime = "{onnxruntime}"

[tiers.low]

[models.rec]
version = "1.0.0"
task = {task}
source = {{ path = "rec.onnx", sha256 = "{source}" }}
evaluation = {{ path = "evaluation.npz", sha256 = "{evaluation}" }}
calibration = {{ path = "calibration.npz", sha256 = "{calibration}" }}

[[models.rec.inputs]]
name = "features"
shape = [1, {steps}, {features}]

[[models.rec.outputs]]
name = "{output}"

[models.rec.variants.int8]
tier = "low"
quantization = {{ mode = "int8", method = "KL" }}
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _project(
    root: Path,
    *,
    noise: float,
    task: str = '"generic"',
    budgets: str = "",
    logits: bool = False,
) -> config_module.Config:
    """The recogniser (or, ``logits``, a CTC model without its softmax) in a project."""
    root.mkdir()
    if logits:
        source = tiny_models.ctc_model(root / "rec.onnx")
        steps, features, output = tiny_models.CTC_STEPS, tiny_models.CTC_FEATURES, "logits"
        rows = np.random.default_rng(4).normal(0, 1, (96, steps, features)).astype(np.float32)
    else:
        source = tiny_models.ctc_recogniser_model(root / "rec.onnx")
        steps, features, output = tiny_models.REC_STEPS, tiny_models.REC_FEATURES, "probs"
        rows = tiny_models.ctc_lines(96, noise=noise)
    np.savez(root / "evaluation.npz", features=rows[:64])
    np.savez(root / "calibration.npz", features=rows[64:])
    (root / "charset.txt").write_text("\n".join(CHARSET) + "\n", encoding="utf-8")
    text = MODEL.format(
        **toolchain.installed_versions(),
        task=task.replace("SHA", _sha(root / "charset.txt")),
        source=_sha(source),
        evaluation=_sha(root / "evaluation.npz"),
        calibration=_sha(root / "calibration.npz"),
        steps=steps,
        features=features,
        output=output,
    )
    (root / "models.toml").write_text(text + budgets, encoding="utf-8")
    return config_module.load(root / "models.toml")


def _build(config: config_module.Config, out: Path) -> dict[str, Any]:
    with contextlib.suppress(GateError):
        build_variant(config, "rec", "int8", out, bench=FAST_BENCH)
    metrics: dict[str, Any] = json.loads((out / "rec" / "int8" / "metrics.json").read_text())
    return metrics


def test_generic_defaults_fail_an_int8_recogniser_that_reads_other_text(tmp_path: Path) -> None:
    # Hard lines: many steps are close calls, and int8 flips some of them.
    hard = _build(_project(tmp_path / "hard", noise=0.3), tmp_path / "hard" / "build")
    agree = hard["agreement"]["probs"]
    # Every output-agreement default passes: cosine and SNR alone would ship it.
    assert agree["cosine"] >= 0.98, agree
    assert agree["snr_db"] >= 13, agree
    assert hard["status"] == "failed"
    assert hard["gates"] == {
        "min_cosine[probs]": True,
        "min_snr_db[probs]": True,
        "sequence_agreement.min": False,
    }
    read = hard["metrics"]["sequence_agreement"]
    assert read < 0.85
    (failure,) = hard["failed"]
    assert failure.startswith(f"sequence_agreement.min {read:.4g} < 0.85 (")
    assert "samples read differently (best class per step of 24, repeats merged)" in failure

    # What the app reads: the same variant as a CTC task decodes other text too,
    # and the generic metric is never more lenient than the decoded lines.
    as_ctc = '{ kind = "ctc", charset = { path = "charset.txt", sha256 = "SHA" } }'
    ctc = _build(_project(tmp_path / "ctc", noise=0.3, task=as_ctc), tmp_path / "ctc" / "build")
    assert ctc["status"] == "failed"
    assert read <= ctc["metrics"]["line_match"] < 0.85
    assert ctc["metrics"]["cer"] > 0


def test_generic_defaults_pass_an_int8_recogniser_on_clean_lines(tmp_path: Path) -> None:
    clean = _build(_project(tmp_path / "clean", noise=0.1), tmp_path / "clean" / "build")
    assert clean["status"] == "passed", clean["failed"]
    assert clean["metrics"]["sequence_agreement"] >= 0.95
    # The summary's headline for the variant is the sequence it reads, vs the reference.
    root = tmp_path / "clean"
    args = ["summary", "--config", str(root / "models.toml"), "--build-dir", str(root / "build")]
    shown = CliRunner().invoke(main, [*args, "--json"])
    assert shown.exit_code == 0, shown.output
    (row,) = json.loads(shown.output)
    assert (row["variant"], row["metric"], row["value"]) == ("int8", "sequence_agreement", 1.0)
    table = CliRunner().invoke(main, args)
    assert "sequence_agreement │ 1.0000 │ vs ref" in table.output, table.output


def test_only_a_distribution_per_step_is_read_as_a_sequence() -> None:
    rng = np.random.default_rng(3)
    logits = rng.normal(0, 1, (5, 1, 7, 9))
    probs = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    assert step_distributions(probs[:, 0])
    # Logits, hidden states, one step, a single class: not a sequence of classes.
    assert not step_distributions(logits[:, 0])
    assert not step_distributions(probs[:, 0, :1])
    assert not step_distributions(np.ones((5, 7, 1)))
    assert not step_distributions(probs[:, 0] * 0.9)
    task = GenericTask(kind="generic")
    assert generic_scores(task, logits, logits).metrics == {}
    same = generic_scores(task, probs, probs)
    assert same.metrics == {"sequence_agreement": 1.0}
    # One sample's best class changes on one step: one of five reads differently.
    changed = probs.copy()
    changed[2, 0, 3] = np.roll(changed[2, 0, 3], 1)
    if np.argmax(changed[2, 0, 3]) == np.argmax(probs[2, 0, 3]):  # pragma: no cover
        changed[2, 0, 3] = np.roll(changed[2, 0, 3], 1)
    scored = generic_scores(task, probs, changed)
    assert scored.metrics == {"sequence_agreement": pytest.approx(0.8)}
    assert scored.details["sequence_agreement"].startswith("1 of 5 samples read differently")
    # Repeats merged: a longer run of the same class reads the same.
    path = np.array([[[0.9, 0.1], [0.9, 0.1], [0.1, 0.9]]])
    longer = np.array([[[0.9, 0.1], [0.1, 0.9], [0.1, 0.9]]])
    assert generic_scores(task, path, longer).metrics == {"sequence_agreement": 1.0}


def test_a_sequence_budget_on_an_output_that_is_not_one_is_an_error(tmp_path: Path) -> None:
    # Logits are not read as a sequence, so the default lapses; a declared
    # budget the output cannot be measured on is an error, never ignored.
    config = _project(tmp_path / "p", noise=0.1, logits=True)
    assert build_variant(config, "rec", "int8", tmp_path / "b", bench=FAST_BENCH)
    metrics = json.loads((tmp_path / "b" / "rec" / "int8" / "metrics.json").read_text())
    assert metrics["metrics"] == {}
    assert "sequence_agreement.min" not in metrics["gates"]
    declared = "\n[models.rec.budgets]\nmetrics.sequence_agreement = { min = 0.9 }\n"
    config = _project(tmp_path / "q", noise=0.1, logits=True, budgets=declared)
    with pytest.raises(BuildError) as caught:
        build_variant(config, "rec", "int8", tmp_path / "c", bench=FAST_BENCH)
    assert "budgets.metrics.sequence_agreement names a metric that was not measured" in (
        caught.value.message
    )
