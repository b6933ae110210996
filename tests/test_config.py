"""models.toml validation: every mistake names the file, the key path and what is allowed."""

from __future__ import annotations

import dataclasses
import hashlib
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edgereg import config
from edgereg.errors import ConfigError
from edgereg.protocol import canonical_json

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

SMALL_TOML = Path(__file__).parent / "data" / "small_models.toml"
FILE = "conf/models.toml"


def edit(text: str, *edits: tuple[str, str]) -> str:
    """Apply (old, new) replacements, each of which must match exactly once.

    An ``old`` starting with ``*`` replaces every occurrence of the rest.
    """
    for old, new in edits:
        if old.startswith("*"):
            assert old[1:] in text, f"{old[1:]!r} not found"
            text = text.replace(old[1:], new)
            continue
        assert text.count(old) == 1, f"{old!r} occurs {text.count(old)} times"
        text = text.replace(old, new)
    return text


@dataclass(frozen=True)
class Bad:
    """One broken models.toml: the edits that break it and what the error must say."""

    id: str
    edits: tuple[tuple[str, str], ...]
    key_path: str
    fragments: tuple[str, ...]


INT8 = "models.digits.variants.int8"
OUTPUTS = "[[models.digits.outputs]]"


def before_outputs(table: str) -> tuple[str, str]:
    """An edit that adds a TOML table just before the first output table."""
    return (OUTPUTS, f"{table}\n\n{OUTPUTS}")


KL = 'quantization = { mode = "int8", method = "KL" }'
W8 = 'quantization = { mode = "weight", bits = 8 }'
CALIBRATION_LINE = next(
    line + "\n"
    for line in SMALL_TOML.read_text(encoding="utf-8").splitlines()
    if line.startswith("calibration = ")
)
W8_TABLE = f'[models.digits.variants.w8]\ntier = "low"\n{W8}\nruntime = {{ threads = 2 }}\n'

RUNTIME_FP32 = "models.digits.variants.fp32.runtime"


def _try(table: str, backends: str = '["opencl", "cpu"]') -> tuple[str, str]:
    """An edit giving the fp32 variant (backends opencl, cpu) a runtime.try table."""
    return ('backends = ["opencl", "cpu"] }', f"backends = {backends}, try = {table} }}")


BAD_CASES = [
    Bad(
        "try-threads-empty",
        (_try('{ threads = [], backends = ["cpu"] }'),),
        f"{RUNTIME_FP32}.try.threads",
        ("an empty list tries nothing", "list at least one thread count, or remove try"),
    ),
    Bad(
        "try-backends-empty",
        (_try("{ threads = [1], backends = [] }"),),
        f"{RUNTIME_FP32}.try.backends",
        ("an empty list tries nothing", "list at least one backend"),
    ),
    Bad(
        "try-threads-twice",
        (_try('{ threads = [2, 1, 2], backends = ["cpu"] }'),),
        f"{RUNTIME_FP32}.try.threads",
        ("2 appears twice: list each once",),
    ),
    Bad(
        "try-backend-twice",
        (_try('{ threads = [1], backends = ["cpu", "cpu"] }'),),
        f"{RUNTIME_FP32}.try.backends",
        ("cpu appears twice: list each once",),
    ),
    Bad(
        "try-more-than-8-settings",
        (
            _try(
                '{ threads = [1, 2, 3], backends = ["opencl", "cpu", "vulkan"] }',
                '["opencl", "vulkan", "cpu"]',
            ),
        ),
        f"{RUNTIME_FP32}.try.threads",
        ("3 thread counts x 3 backends make 9 settings, more than the 8", "drop thread counts"),
    ),
    Bad(
        "try-backend-the-variant-does-not-allow",
        (_try('{ threads = [1], backends = ["vulkan", "cpu"] }'),),
        f"{RUNTIME_FP32}.try.backends",
        ("vulkan is not in backends (opencl, cpu)", "add it to runtime.backends or remove it"),
    ),
    Bad(
        "try-threads-zero",
        (_try('{ threads = [1, 0], backends = ["cpu"] }'),),
        f"{RUNTIME_FP32}.try.threads.1",
        ("0 threads: a thread count is 1 to 16",),
    ),
    Bad(
        "try-threads-17",
        (_try('{ threads = [17], backends = ["cpu"] }'),),
        f"{RUNTIME_FP32}.try.threads.0",
        ("17 threads: a thread count is 1 to 16",),
    ),
    Bad(
        "try-unknown-key",
        (_try('{ threads = [1], backends = ["cpu"], runs = 3 }'),),
        f"{RUNTIME_FP32}.try.runs",
        ("allowed keys here: threads, backends, max_runs_per_setting, max_total_ms",),
    ),
    Bad(
        "try-total-ms-beyond-10-s",
        (_try('{ threads = [1], backends = ["cpu"], max_total_ms = 10001 }'),),
        f"{RUNTIME_FP32}.try.max_total_ms",
        ("less than or equal to 10000",),
    ),
    Bad(
        "unknown-runtime-key-names-try",
        (("runtime = { threads = 4,", "runtime = { tries = 4,"),),
        f"{RUNTIME_FP32}.tries",
        ("allowed keys here: threads, backends, precision, try",),
    ),
    Bad(
        "stalled-starts-below-one",
        (("[toolchain]", "[rollout.guardrails.unconfirmed]\nstalled_starts = 0\n\n[toolchain]"),),
        "rollout.guardrails.unconfirmed.stalled_starts",
        ("greater than or equal to 1",),
    ),
    Bad(
        "unknown-unconfirmed-guardrail-key",
        (("[toolchain]", "[rollout.guardrails.unconfirmed]\nstalled_hours = 24\n\n[toolchain]"),),
        "rollout.guardrails.unconfirmed.stalled_hours",
        ("unknown key", "stalled_starts"),
    ),
    Bad(
        "unknown-top-level-key",
        (("[toolchain]", "telemetry = true\n\n[toolchain]"),),
        "telemetry",
        ("unknown key", "allowed keys here: toolchain, registry, rollout, tiers, models"),
    ),
    Bad(
        "unknown-model-key",
        (('version = "1.0.0"', 'version = "1.0.0"\nsorce = "x.onnx"'),),
        "models.digits.sorce",
        ("unknown key", "source", "variants"),
    ),
    Bad(
        "unknown-variant-key",
        (('tier = "high"', 'tier = "high"\nthreads = 4'),),
        "models.digits.variants.fp32.threads",
        ("unknown key", "tier, precision, quantization, converter, runtime"),
    ),
    Bad(
        "unknown-int8-quantization-key",
        ((KL, 'quantization = { mode = "int8", skip_op = ["conv1"] }'),),
        f"{INT8}.quantization.skip_op",
        ("allowed keys here: mode, method, max_skip_ops, weight_method, skip_ops, samples",),
    ),
    Bad(
        "unknown-weight-quantization-key",
        ((W8, 'quantization = { mode = "weight", method = "KL" }'),),
        "models.digits.variants.w8.quantization.method",
        ("allowed keys here: mode, bits, block, asymmetric",),
    ),
    Bad(
        "unknown-runtime-key",
        (("runtime = { threads = 4,", "runtime = { thread = 4,"),),
        "models.digits.variants.fp32.runtime.thread",
        ("allowed keys here: threads, backends, precision",),
    ),
    Bad(
        "bad-semver",
        (('version = "1.0.0"', 'version = "1.0"'),),
        "models.digits.version",
        ("'1.0' is not a semantic version", "MAJOR.MINOR.PATCH"),
    ),
    Bad(
        "bad-sha256",
        (("1111111111111111111111111111111111111111111111111111111111111111", "ABC123"),),
        "models.digits.source.sha256",
        ("64 lowercase hex characters", "sha256sum"),
    ),
    Bad(
        "remote-https-source",
        (('path = "data/model.onnx"', 'path = "https://example.com/model.onnx"'),),
        "models.digits.source.path",
        ("'https://' sources are not supported", "file:// URI", "dvc import-url"),
    ),
    Bad(
        "wrong-quantization-method",
        ((KL, 'quantization = { mode = "int8", method = "MINMAX" }'),),
        f"{INT8}.quantization.method",
        ("'KL', 'ADMM', 'EMA' or 'auto'",),
    ),
    Bad(
        "unknown-quantization-mode",
        ((KL, 'quantization = { mode = "int4" }'),),
        f"{INT8}.quantization.mode",
        ("unknown mode 'int4'", "'none', 'weight', 'int8'"),
    ),
    Bad(
        "quantization-without-mode",
        ((KL, 'quantization = { method = "KL" }'),),
        f"{INT8}.quantization.mode",
        ("required key is missing", "'none', 'weight', 'int8'"),
    ),
    Bad(
        "fp16-with-quantization",
        ((KL, f'precision = "fp16"\n{KL}'),),
        f"{INT8}.precision",
        ('"fp16" cannot be combined with quantization', 'precision = "fp32"'),
    ),
    Bad(
        "two-variants-on-one-tier",
        (('tier = "mid"', 'tier = "high"'),),
        f"{INT8}.tier",
        ("tier 'high' already has variant 'fp32'", "exactly one variant"),
    ),
    Bad(
        "variant-on-unknown-tier",
        (('tier = "mid"', 'tier = "ultra"'),),
        f"{INT8}.tier",
        ("unknown tier 'ultra'", "declared tiers: high, mid, low"),
    ),
    Bad(
        "last-tier-not-catch-all",
        (('description = "Everything else"', "min_ram_mb = 1024"),),
        "tiers.low",
        ("must be a catch-all with no rules", "[tiers.<name>]"),
    ),
    Bad(
        "catch-all-tier-not-last",
        (("[tiers.mid]\nmin_ram_mb = 3072\n", "[tiers.mid]\n"),),
        "tiers.mid",
        ("catches every device", "give it rules or move it last"),
    ),
    Bad(
        "no-variant-for-catch-all-tier",
        ((W8_TABLE, ""),),
        "models.digits.variants",
        ("no variant for the catch-all tier 'low'", 'tier = "low"'),
    ),
    Bad(
        "int8-without-calibration",
        ((CALIBRATION_LINE, ""),),
        f"{INT8}.quantization",
        ("needs a calibration set", "[models.digits.calibration]"),
    ),
    Bad(
        "image-input-without-layout",
        (('layout = "NCHW"\n', ""),),
        "models.digits.inputs.0.layout",
        ('"NCHW" or "NHWC"',),
    ),
    Bad(
        "image-input-without-color",
        (('color = "RGB"\n', ""),),
        "models.digits.inputs.0.color",
        ('"RGB", "BGR" or "GRAY"',),
    ),
    Bad(
        "image-channels-do-not-match-color",
        (('color = "RGB"', 'color = "GRAY"'),),
        "models.digits.inputs.0.shape",
        ("color GRAY needs 1 channel(s), shape has 3",),
    ),
    Bad(
        "layout-on-tensor-input",
        (('kind = "image"', 'kind = "tensor"'),),
        "models.digits.inputs.0.layout",
        ('only apply to kind = "image" inputs',),
    ),
    Bad(
        "mean-of-wrong-length",
        (("mean = [127.5, 127.5, 127.5]", "mean = [127.5, 127.5]"),),
        "models.digits.inputs.0.mean",
        ("one value per channel (3), got 2",),
    ),
    Bad(
        "backends-not-ending-with-cpu",
        (('backends = ["opencl", "cpu"]', 'backends = ["cpu", "opencl"]'),),
        "models.digits.variants.fp32.runtime.backends",
        ('must end with "cpu"',),
    ),
    Bad(
        "unknown-backend",
        (('backends = ["opencl", "cpu"]', 'backends = ["cuda", "cpu"]'),),
        "models.digits.variants.fp32.runtime.backends.0",
        ("'cpu', 'opencl', 'vulkan', 'metal'",),
    ),
    Bad(
        "weight-bits-too-high",
        ((W8, 'quantization = { mode = "weight", bits = 9 }'),),
        "models.digits.variants.w8.quantization.bits",
        ("less than or equal to 8",),
    ),
    Bad(
        "weight-bits-too-low",
        ((W8, 'quantization = { mode = "weight", bits = 1 }'),),
        "models.digits.variants.w8.quantization.bits",
        ("greater than or equal to 2",),
    ),
    Bad(
        "bad-model-name",
        (("*[models.digits", "[models.Digits"),),
        "models.Digits",
        ("'Digits' is not a valid name", "a lowercase letter"),
    ),
    Bad(
        "bad-variant-name",
        (("[models.digits.variants.w8]", "[models.digits.variants.W8]"),),
        "models.digits.variants.W8",
        ("'W8' is not a valid name", "lowercase letters, digits, '_' or '-'"),
    ),
    Bad(
        "bad-tier-name",
        (("[tiers.mid]", "[tiers.Mid]"),),
        "tiers.Mid",
        ("'Mid' is not a valid name",),
    ),
    Bad(
        "bad-toolchain-pin",
        (('mnn = "3.6.1"', 'mnn = "latest"'),),
        "toolchain.mnn",
        ("'latest' is not a version like 3.6.1",),
    ),
    Bad(
        "missing-required-key",
        (('version = "1.0.0"\n', ""),),
        "models.digits.version",
        ("required key is missing",),
    ),
    Bad(
        "missing-toolchain-pin",
        (('onnx = "1.23.2"\n', ""),),
        "toolchain.onnx",
        ("required key is missing",),
    ),
    Bad(
        "wrong-type",
        (("runtime = { threads = 4,", 'runtime = { threads = "four",'),),
        "models.digits.variants.fp32.runtime.threads",
        ("valid integer",),
    ),
    Bad(
        "variant-inputs-without-source",
        (('tier = "high"', 'tier = "high"\ninputs = [{ name = "image", shape = [1, 8] }]'),),
        "models.digits.variants.fp32.inputs",
        ("only be overridden together with source",),
    ),
    Bad(
        "string-number",
        (("max_size_mb = 0.5", 'max_size_mb = "0.5"'),),
        "models.digits.budgets.max_size_mb",
        ("valid number",),
    ),
    Bad(
        "infinite-budget",
        (("max_size_mb = 0.5", "max_size_mb = inf"),),
        "models.digits.budgets.max_size_mb",
        ("finite number",),
    ),
    Bad(
        "float-thread-count",
        (("runtime = { threads = 4,", "runtime = { threads = 4.0,"),),
        "models.digits.variants.fp32.runtime.threads",
        ("valid integer",),
    ),
    Bad(
        "moved-budget-key",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmax_accuracy_drop = 0.02"),),
        "models.digits.budgets.max_accuracy_drop",
        ("this key moved", "metrics.accuracy = { max_drop = N }"),
    ),
    Bad(
        "metric-the-task-does-not-measure",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmetrics.iou = { min = 0.9 }"),),
        "models.digits.budgets.metrics.iou",
        ("task 'classification' does not measure 'iou'", "top1_agreement, accuracy"),
    ),
    Bad(
        "baseline-limit-on-a-reference-metric",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmetrics.top1_agreement = { max_drop = 0.1 }"),),
        "models.digits.budgets.metrics.top1_agreement.max_drop",
        ("compares the variant with the reference itself", "use min or max"),
    ),
    # Issue #22: a budget outside its metric's range is a gate that never fails.
    Bad(
        "max-drop-as-a-percentage",
        (('tier = "high"', 'tier = "high"\nbudgets = { metrics.accuracy = { max_drop = 5 } }'),),
        "models.digits.variants.fp32.budgets.metrics.accuracy.max_drop",
        ("5 is outside 0..1", "'accuracy'", "can never fail", "0.05, not 5"),
    ),
    Bad(
        "min-above-a-share",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmetrics.top1_agreement = { min = 90 }"),),
        "models.digits.budgets.metrics.top1_agreement.min",
        ("90 is outside 0..1", "can never pass"),
    ),
    Bad(
        "min-below-zero",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmetrics.top1_agreement = { min = -0.5 }"),),
        "models.digits.budgets.metrics.top1_agreement.min",
        ("-0.5 is outside 0..1", "can never fail"),
    ),
    Bad(
        "recall-drop-max-beyond-its-range",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmetrics.class_recall_drop = { max = 3 }"),),
        "models.digits.budgets.metrics.class_recall_drop.max",
        ("3 is outside -1..1", "can never fail"),
    ),
    Bad(
        "variant-baseline-beyond-a-share",
        (
            (
                'tier = "high"',
                'tier = "high"\nbudgets = { metrics.accuracy = { min_baseline = 2 } }',
            ),
        ),
        "models.digits.variants.fp32.budgets.metrics.accuracy.min_baseline",
        ("2 is outside 0..1", "can never pass"),
    ),
    Bad(
        "snr-budget-beyond-float-precision",
        (("max_size_mb = 0.5", "max_size_mb = 0.5\nmin_snr_db = 1000"),),
        "models.digits.budgets.min_snr_db",
        ("less than or equal to 300",),
    ),
    Bad(
        "variant-metric-the-task-does-not-measure",
        (('tier = "high"', 'tier = "high"\nbudgets = { metrics.cer = { max = 0.1 } }'),),
        "models.digits.variants.fp32.budgets.metrics.cer",
        ("does not measure 'cer'",),
    ),
    Bad(
        "unknown-task",
        (('version = "1.0.0"', 'version = "1.0.0"\ntask = "detection"'),),
        "models.digits.task.kind",
        ("unknown kind 'detection'", "'dense_map'", "'ctc'"),
    ),
    Bad(
        "ctc-without-charset",
        (('version = "1.0.0"', 'version = "1.0.0"\ntask = { kind = "ctc" }'),),
        "models.digits.task.charset",
        ("required key is missing",),
    ),
    Bad(
        "custom-evaluator-not-module-function",
        (('version = "1.0.0"', 'version = "1.0.0"\ntask = { kind = "custom", evaluator = "x" }'),),
        "models.digits.task.evaluator",
        ("'x' is not module:function",),
    ),
    Bad(
        "task-output-unknown",
        (
            (
                'version = "1.0.0"',
                'version = "1.0.0"\ntask = { kind = "classification", output = "p" }',
            ),
        ),
        "models.digits.task.output",
        ("'p' is not a declared output", "logits"),
    ),
    Bad(
        "unknown-input-dtype",
        (("shape = [1, 3, 8, 8]", 'shape = [1, 3, 8, 8]\ndtype = "float64"'),),
        "models.digits.inputs.0.dtype",
        ("'float32', 'int32', 'int64' or 'uint8'",),
    ),
    Bad(
        "image-input-of-ints",
        (("shape = [1, 3, 8, 8]", 'shape = [1, 3, 8, 8]\ndtype = "int64"'),),
        "models.digits.inputs.0.dtype",
        ('kind = "image" inputs are float32',),
    ),
    Bad(
        "first-axis-not-a-batch",
        (before_outputs('[[models.digits.inputs]]\nname = "state"\nshape = [2, 1, 16]'),),
        "models.digits.inputs.1.shape",
        (
            "axis 0 of shape [2, 1, 16] is 2, not a batch of 1",
            "batch_axis = 1",
            'batch_axis = "none"',
        ),
    ),
    Bad(
        "scalar-with-a-batch-axis",
        (before_outputs('[[models.digits.inputs]]\nname = "sr"\nshape = []\ndtype = "int64"'),),
        "models.digits.inputs.1.batch_axis",
        ("is a scalar", 'batch_axis = "none"'),
    ),
    Bad(
        "batch-axis-outside-shape",
        (before_outputs('[[models.digits.inputs]]\nname = "x"\nshape = [1, 4]\nbatch_axis = 2'),),
        "models.digits.inputs.1.batch_axis",
        ("outside shape [1, 4]",),
    ),
    Bad(
        "state-pair-names-a-missing-input",
        (before_outputs('[[models.digits.state]]\ninput = "h"\noutput = "logits"'),),
        "models.digits.state.0.input",
        ("'h' is not a declared input", "image"),
    ),
    Bad(
        "state-pair-names-a-missing-output",
        (before_outputs('[[models.digits.state]]\ninput = "image"\noutput = "hn"'),),
        "models.digits.state.0.output",
        ("'hn' is not a declared output", "logits"),
    ),
    Bad(
        "classes-on-a-task-without-classes",
        (('version = "1.0.0"', 'version = "1.0.0"\ntask = "dense_map"'),),
        "models.digits.classes",
        ('classes apply to task = "classification" and "segmentation" only',),
    ),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[case.id for case in BAD_CASES])
def test_bad_config_names_file_key_path_and_what_is_allowed(small_toml: str, case: Bad) -> None:
    text = edit(small_toml, *case.edits)
    with pytest.raises(ConfigError) as caught:
        config.parse(text, file=FILE)
    error = caught.value
    assert error.file == FILE
    assert error.key_path == case.key_path
    assert str(error).startswith(f"{FILE}: {case.key_path}: ")
    for fragment in case.fragments:
        assert fragment in error.detail
    assert error.exit_code == 2


def test_case_ids_are_unique() -> None:
    ids = [case.id for case in BAD_CASES]
    assert len(ids) == len(set(ids))


def test_malformed_toml_names_line_and_column(small_toml: str) -> None:
    text = edit(small_toml, ('version = "1.0.0"', 'version = "1.0.0'))
    line = 1 + next(i for i, row in enumerate(text.splitlines()) if row.startswith("version"))
    with pytest.raises(ConfigError) as caught:
        config.parse(text, file=FILE)
    error = caught.value
    assert error.file == FILE
    assert error.key_path is None
    assert "not valid TOML" in error.detail
    assert re.search(rf"line {line}, column \d+", error.detail), error.detail
    assert error.hint is not None
    assert "line and column" in error.hint


def test_several_problems_are_all_listed(small_toml: str) -> None:
    text = edit(
        small_toml,
        ('version = "1.0.0"', 'version = "one"'),
        (KL, 'quantization = { mode = "int8", method = "MINMAX" }'),
    )
    with pytest.raises(ConfigError) as caught:
        config.parse(text, file=FILE)
    message = str(caught.value)
    assert message.startswith(f"{FILE}: 2 problems")
    assert "  models.digits.version: 'one' is not a semantic version" in message
    assert f"  {INT8}.quantization.method: Input should be 'KL', 'ADMM', 'EMA' or 'auto'" in message


def test_missing_file_says_how_to_fix(tmp_path: Path) -> None:
    missing = tmp_path / "models.toml"
    with pytest.raises(ConfigError) as caught:
        config.load(missing)
    assert caught.value.file == str(missing)
    assert "file not found" in caught.value.detail
    assert caught.value.hint is not None
    assert "--config" in caught.value.hint


def test_undecodable_file_is_a_config_error(tmp_path: Path) -> None:
    path = tmp_path / "models.toml"
    path.write_bytes(b"\xff\xfe[toolchain]\n")
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(path)


# --- valid files --------------------------------------------------------------


def test_repo_models_toml_loads(repo_root: Path) -> None:
    loaded = config.load(repo_root / "models.toml")
    assert loaded.path == repo_root / "models.toml"
    assert loaded.root == repo_root
    assert set(loaded.models) == {
        "digits",
        "sensor",
        "textdet",
        "textrec",
        "vad",
        "embed",
        "segment",
    }
    assert {name: model.task.kind for name, model in loaded.models.items()} == {
        "digits": "classification",
        "sensor": "classification",
        "textdet": "dense_map",
        "textrec": "ctc",
        "vad": "frame_decision",
        "embed": "embedding",
        "segment": "segmentation",
    }
    assert list(loaded.tiers) == ["high", "mid", "low"]
    # int8 fails the streaming VAD's and the embedding's gates (measured), so their
    # mid tier falls back to w8; every other tier has its own variant.
    fallbacks = {
        (name, tier)
        for name in loaded.models
        for tier, (_, fell_back) in loaded.tier_variants(name).items()
        if fell_back
    }
    assert fallbacks == {("vad", "mid"), ("embed", "mid")}
    assert all(note.startswith("models.") for note in loaded.notes())


def test_small_config_loads_with_defaults(small_toml: str) -> None:
    loaded = config.parse(small_toml, file=FILE)
    assert loaded.path == Path(FILE)
    assert loaded.registry.url == "file://registry"
    fp32 = loaded.models["digits"].variants["fp32"]
    assert fp32.quantization.mode == "none"
    assert fp32.precision == "fp32"
    assert loaded.resolve_path(loaded.models["digits"].source) == Path("conf/data/model.onnx")


def test_file_uri_source_is_allowed(small_toml: str) -> None:
    text = edit(small_toml, ('path = "data/model.onnx"', 'path = "file:///srv/model.onnx"'))
    loaded = config.parse(text, file=FILE)
    assert loaded.resolve_path(loaded.models["digits"].source) == Path("/srv/model.onnx")


def test_tier_without_variant_falls_back_to_the_lower_tier(small_toml: str) -> None:
    int8_table = f'[models.digits.variants.int8]\ntier = "mid"\n{KL}\nruntime = {{ threads = 2 }}\n'
    loaded = config.parse(edit(small_toml, (int8_table, "")), file=FILE)
    assert loaded.tier_variants("digits") == {
        "high": ("fp32", False),
        "mid": ("w8", True),
        "low": ("w8", False),
    }
    notes = loaded.notes()
    assert len(notes) == 1
    assert "models.digits" in notes[0]
    assert "tier 'mid'" in notes[0]
    assert "falls back to 'w8'" in notes[0]


def _digests(loaded: config.Config) -> dict[str, str]:
    return {name: loaded.recipe_digest("digits", name) for name in ("fp32", "int8", "w8")}


def test_recipe_digest_follows_only_the_variant_it_describes(small_toml: str) -> None:
    before = _digests(config.parse(small_toml, file=FILE))
    assert len(set(before.values())) == 3

    changed_variant = _digests(
        config.parse(
            edit(small_toml, (KL, 'quantization = { mode = "int8", method = "EMA" }')), file=FILE
        )
    )
    assert changed_variant["int8"] != before["int8"]
    assert changed_variant["fp32"] == before["fp32"]
    assert changed_variant["w8"] == before["w8"]

    new_version = _digests(
        config.parse(edit(small_toml, ('version = "1.0.0"', 'version = "1.1.0"')), file=FILE)
    )
    assert new_version == before

    # Model-level keys every variant builds from change every recipe.
    new_source = _digests(config.parse(edit(small_toml, ("1" * 64, "4" * 64)), file=FILE))
    assert all(new_source[name] != before[name] for name in before)


def test_calibration_only_enters_the_int8_recipe(small_toml: str) -> None:
    before = _digests(config.parse(small_toml, file=FILE))
    after = _digests(config.parse(edit(small_toml, ("samples = 30", "samples = 60")), file=FILE))
    assert after["int8"] != before["int8"]
    assert after["fp32"] == before["fp32"]
    assert after["w8"] == before["w8"]


def test_variant_budgets_override_model_budgets(small_toml: str) -> None:
    text = edit(small_toml, ('tier = "high"', 'tier = "high"\nbudgets = { max_size_mb = 2.0 }'))
    recipe = config.parse(text, file=FILE).recipe("digits", "fp32")
    assert recipe["budgets"]["max_size_mb"] == 2.0
    assert recipe["budgets"]["metrics"]["accuracy"]["max_drop"] == 0.02


def test_variant_metric_budgets_merge_per_metric_and_field(small_toml: str) -> None:
    text = edit(
        small_toml,
        (
            'tier = "high"',
            'tier = "high"\nbudgets = { metrics.accuracy = { min_baseline = 0.5 }, '
            "metrics.top1_agreement = { min = 0.9 } }",
        ),
    )
    recipe = config.parse(text, file=FILE).recipe("digits", "fp32")
    metrics = recipe["budgets"]["metrics"]
    assert metrics["accuracy"]["max_drop"] == 0.02  # kept from the model
    assert metrics["accuracy"]["min_baseline"] == 0.5  # added by the variant
    assert metrics["top1_agreement"]["min"] == 0.9


def test_resolve_fills_a_variant_in_from_its_model(small_toml: str) -> None:
    loaded = config.parse(small_toml, file=FILE)
    model = loaded.models["digits"]
    fp32 = loaded.resolve("digits", "fp32")
    assert (fp32.model, fp32.name, fp32.tier) == ("digits", "fp32", "high")
    assert fp32.source == model.source
    assert fp32.inputs == tuple(model.inputs)
    assert fp32.evaluation == model.evaluation
    assert fp32.calibration is None  # only int8 reads the calibration set
    assert fp32.budgets == model.budgets
    assert fp32.min_mnn_runtime == "3.6.1"
    assert loaded.resolve("digits", "int8").calibration == model.calibration
    assert loaded.resolve("digits", "w8").calibration is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        fp32.tier = "low"  # type: ignore[misc]


def test_resolve_takes_every_override_a_variant_declares(small_toml: str) -> None:
    own = "4" * 64
    text = edit(
        small_toml,
        (
            'tier = "high"',
            'tier = "high"\n'
            f'source = {{ path = "data/pruned.onnx", sha256 = "{own}" }}\n'
            'inputs = [{ name = "image", shape = [1, 3, 4, 4] }]\n'
            f'evaluation = {{ path = "data/pruned.npz", sha256 = "{own}" }}\n'
            f'calibration = {{ path = "data/own.npz", sha256 = "{own}" }}\n'
            'min_mnn_runtime = "3.6.1"\n'
            "budgets = { max_size_mb = 2.0 }",
        ),
    )
    fp32 = config.parse(text, file=FILE).resolve("digits", "fp32")
    assert fp32.source.path == "data/pruned.onnx"
    assert [spec.shape for spec in fp32.inputs] == [[1, 3, 4, 4]]
    assert fp32.evaluation.path == "data/pruned.npz"
    # Declared on a float variant, a calibration set is still not read.
    assert fp32.calibration is None
    assert fp32.budgets.max_size_mb == 2.0
    assert fp32.budgets.metrics["accuracy"].max_drop == 0.02
    assert fp32.min_mnn_runtime == "3.6.1"
    int8 = edit(
        small_toml,
        (KL, f'{KL}\ncalibration = {{ path = "data/own.npz", sha256 = "{own}" }}'),
    )
    calibration = config.parse(int8, file=FILE).resolve("digits", "int8").calibration
    assert calibration is not None
    assert calibration.path == "data/own.npz"


def test_recipe_digest_is_the_protocol_canonical_json(small_toml: str) -> None:
    # docs/decisions/0004: one canonical JSON, UTF-8 and not \\u escapes.
    text = edit(small_toml, ("data/model.onnx", "data/modèle.onnx"))
    loaded = config.parse(text, file=FILE)
    recipe = loaded.recipe("digits", "fp32")
    encoded = canonical_json(recipe)
    assert "modèle".encode() in encoded
    assert loaded.recipe_digest("digits", "fp32") == hashlib.sha256(encoded).hexdigest()


# --- tier resolution, for any tiers and any set of variants --------------------

SMALL_DATA = tomllib.loads(SMALL_TOML.read_text(encoding="utf-8"))


@st.composite
def tiers_with_variants(draw: st.DrawFn) -> tuple[list[str], list[bool]]:
    """Tier names best first, and which tiers have a variant (the catch-all always)."""
    count = draw(st.integers(min_value=1, max_value=7))
    names = [f"t{index}" for index in range(count)]
    has_variant = [*draw(st.lists(st.booleans(), min_size=count - 1, max_size=count - 1)), True]
    return names, has_variant


@given(tiers_with_variants())
def test_every_tier_resolves_to_one_variant(drawn: tuple[list[str], list[bool]]) -> None:
    names, has_variant = drawn
    data: dict[str, Any] = {key: value for key, value in SMALL_DATA.items() if key != "tiers"}
    data["tiers"] = {name: {"min_ram_mb": 1024 * (len(names) - i)} for i, name in enumerate(names)}
    data["tiers"][names[-1]] = {}
    model = dict(data["models"]["digits"])
    model["variants"] = {f"v{i}": {"tier": name} for i, name in enumerate(names) if has_variant[i]}
    data["models"] = {"digits": model}
    loaded = config.Config.model_validate(data)
    variant_tier = {name: v.tier for name, v in loaded.models["digits"].variants.items()}

    resolution = loaded.tier_variants("digits")
    assert list(resolution) == names
    for index, (tier, (variant, fell_back)) in enumerate(resolution.items()):
        assert fell_back is not has_variant[index]
        if not fell_back:
            assert variant_tier[variant] == tier
            continue
        # The variant of the nearest lower tier that has one of its own.
        own_index = names.index(variant_tier[variant])
        assert own_index > index
        assert has_variant[own_index]
        assert not any(has_variant[index + 1 : own_index])
        assert resolution[names[own_index]] == (variant, False)
    assert len(loaded.notes()) == has_variant.count(False)


# --- bundles and requirements ------------------------------------------------------

BUNDLE_CASES = [
    pytest.param(
        '[bundles.ocr]\nversion = "1.0.0"\nmodels = ["digits", "textdet"]\n',
        "bundles.ocr.models.1",
        ("unknown model 'textdet'", "models: digits"),
        id="unknown-member",
    ),
    pytest.param(
        '[bundles.digits]\nversion = "1.0.0"\nmodels = ["digits"]\n',
        "bundles.digits",
        ("'digits' is also a model", "one namespace"),
        id="bundle-named-like-a-model",
    ),
    pytest.param(
        '[bundles.a]\nversion = "1.0.0"\nmodels = ["digits"]\n'
        '[bundles.b]\nversion = "1.0.0"\nmodels = ["digits"]\n',
        "bundles.b.models.0",
        ("already in bundle 'a'", "at most one bundle"),
        id="model-in-two-bundles",
    ),
    pytest.param(
        '[bundles.ocr]\nversion = "1.0.0"\nmodels = ["digits", "digits"]\n',
        "bundles.ocr.models",
        ("repeated: digits",),
        id="member-twice",
    ),
    pytest.param(
        '[bundles.ocr]\nversion = "1.0.0"\nmodels = ["digits"]\nrequires = { app = "2.x" }\n',
        "bundles.ocr.requires.app",
        ("is not a version range", ">=2.3.0, <3"),
        id="bundle-app-range-unparsable",
    ),
    pytest.param(
        '[models.digits.requires]\nandroid = ">= twenty-nine"\n',
        "models.digits.requires.android",
        ("is not a version range",),
        id="model-android-range-unparsable",
    ),
]


@pytest.mark.parametrize(("appended", "key_path", "fragments"), BUNDLE_CASES)
def test_bad_bundles_and_requirements_are_named(
    small_toml: str, appended: str, key_path: str, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as caught:
        config.parse(small_toml + "\n" + appended, file=FILE)
    assert caught.value.key_path == key_path, str(caught.value)
    for fragment in fragments:
        assert fragment in caught.value.detail, str(caught.value)


def test_a_bundle_and_requirements_load(small_toml: str) -> None:
    loaded = config.parse(
        small_toml
        + '\n[models.digits.requires]\napp = ">=2.3.0, <3"\nandroid = ">=29"\n'
        + '[bundles.kit]\nversion = "2.0.0"\nmodels = ["digits"]\nrequires = { ios = ">=16" }\n',
        file=FILE,
    )
    assert loaded.bundle_of("digits") == "kit"
    assert loaded.models["digits"].requires is not None
    assert loaded.models["digits"].requires.unmet(
        app_version="2.2.9", os="android", os_version="30"
    ) == ["needs app >=2.3.0, <3, the app is 2.2.9"]
    assert loaded.rollout_policy("kit") == loaded.rollout


# --- app metrics and the guardrails on them -------------------------------------------

ACCEPTED = '[models.digits.metrics.accepted]\nkind = "rate"\n'
CONFIDENCE = (
    '[models.digits.metrics.confidence]\nkind = "distribution"\nbuckets = [0.5, 0.7, 0.9]\n'
)

METRIC_CASES = [
    pytest.param(
        '[rollout.guardrails.accepted]\nmetric = "accepted"\nmax_worse = 0.01\n',
        "rollout.guardrails.accepted.metric",
        ("names app metric 'accepted'", "no unit it judges declares", "models.digits"),
        id="guardrail-on-an-undeclared-metric",
    ),
    pytest.param(
        "[rollout.guardrails.acceptd]\nmax_worse = 0.01\n",
        "rollout.guardrails.acceptd",
        ("unknown guardrail 'acceptd'", "probe_failure", 'metric = "<metric>"'),
        id="guardrail-typo",
    ),
    pytest.param(
        ACCEPTED + '[rollout.guardrails.accepted]\nmetric = "accepted"\nmax_worse = -0.01\n',
        "rollout.guardrails.accepted.max_worse",
        ("greater than or equal to 0",),
        id="negative-limit",
    ),
    pytest.param(
        ACCEPTED + '[rollout.guardrails.accepted]\nmetric = "accepted"\nmax_worse = 0.01\n'
        'stat = "mean"\n',
        "rollout.guardrails.accepted.stat",
        ("is a rate", "no stat"),
        id="stat-on-a-rate",
    ),
    pytest.param(
        CONFIDENCE + '[rollout.guardrails.unsure]\nmetric = "confidence"\nmax_worse = 0.02\n'
        'stat = "share_below"\nthreshold = 0.6\n',
        "rollout.guardrails.unsure.threshold",
        ("0.6 is not a bucket edge of 'confidence'", "0.5, 0.7, 0.9"),
        id="threshold-off-the-edges",
    ),
    pytest.param(
        CONFIDENCE + '[rollout.guardrails.unsure]\nmetric = "confidence"\nmax_worse = 0.02\n'
        'stat = "share_below"\n',
        "rollout.guardrails.unsure.threshold",
        ("a threshold goes with stat share_below",),
        id="share-without-threshold",
    ),
    pytest.param(
        '[models.digits.metrics.accepted]\nkind = "rate"\nbuckets = [1]\n',
        "models.digits.metrics.accepted.buckets",
        ("a rate has no buckets",),
        id="rate-with-buckets",
    ),
    pytest.param(
        '[models.digits.metrics.confidence]\nkind = "distribution"\n',
        "models.digits.metrics.confidence.buckets",
        ("needs its bucket edges",),
        id="distribution-without-buckets",
    ),
    pytest.param(
        '[models.digits.metrics.confidence]\nkind = "distribution"\nbuckets = [0.9, 0.5]\n',
        "models.digits.metrics.confidence.buckets",
        ("must increase strictly",),
        id="buckets-out-of-order",
    ),
    pytest.param(
        '[models.digits.metrics.confidence]\nkind = "distribution"\nbuckets = '
        + str([float(i) for i in range(32)])
        + "\n",
        "models.digits.metrics.confidence.buckets",
        ("at most 31",),
        id="too-many-buckets",
    ),
    pytest.param(
        "".join(f'[models.digits.metrics.m{i}]\nkind = "rate"\n' for i in range(17)),
        "models.digits.metrics",
        ("at most 16",),
        id="too-many-metrics",
    ),
    pytest.param(
        '[models.digits.metrics.Accepted]\nkind = "rate"\n',
        "models.digits.metrics.Accepted",
        ("lowercase",),
        id="metric-name-not-a-name",
    ),
    pytest.param(
        ACCEPTED + '[bundles.kit]\nversion = "2.0.0"\nmodels = ["digits"]\n',
        "models.digits.metrics",
        ("ships in bundle 'kit'", "[bundles.kit.metrics]"),
        id="metrics-on-a-bundle-member",
    ),
]


@pytest.mark.parametrize(("appended", "key_path", "fragments"), METRIC_CASES)
def test_bad_metrics_and_metric_guardrails_are_named(
    small_toml: str, appended: str, key_path: str, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ConfigError) as caught:
        config.parse(small_toml + "\n" + appended, file=FILE)
    assert caught.value.key_path == key_path, str(caught.value)
    for fragment in fragments:
        assert fragment in caught.value.detail, str(caught.value)


def test_metrics_and_their_guardrails_load(small_toml: str) -> None:
    loaded = config.parse(
        small_toml
        + "\n"
        + ACCEPTED
        + CONFIDENCE
        + '[rollout.guardrails.accepted]\nmetric = "accepted"\nmax_worse = 0.01\n'
        + '[rollout.guardrails.unsure]\nmetric = "confidence"\nmax_worse = 0.02\n'
        + 'stat = "share_below"\nthreshold = 0.5\ncritical = false\n',
        file=FILE,
    )
    declared = loaded.models["digits"].metrics
    assert declared["confidence"].declaration().buckets == [0.5, 0.7, 0.9]
    assert declared["confidence"].bucket_values() == (0.5, 0.6, 0.8, 0.9)
    guardrails = loaded.rollout_policy("digits").guardrails.metric_guardrails()
    assert sorted(guardrails) == ["accepted", "unsure"]
    unsure = guardrails["unsure"]
    # The share at or below 0.5 is the first bucket; more of it is worse (higher is better).
    assert unsure.weights(declared["confidence"]) == (1.0, 0.0, 0.0, 0.0)
    assert unsure.worse_when_higher(declared["confidence"])
    assert not guardrails["accepted"].worse_when_higher(declared["accepted"])
    assert guardrails["accepted"].weights(declared["accepted"]) is None


def test_a_try_set_is_the_entrys_runtime_trials_and_no_part_of_the_recipe(small_toml: str) -> None:
    plain = config.parse(small_toml, file=FILE)
    tried = config.parse(
        edit(small_toml, _try('{ threads = [4, 1], backends = ["cpu", "opencl"] }')), file=FILE
    )
    runtime = tried.models["digits"].variants["fp32"].runtime
    assert runtime.hints == plain.models["digits"].variants["fp32"].runtime.hints
    # The recipe (the build's identity) holds the declared hints only: no rebuild.
    assert tried.recipe("digits", "fp32") == plain.recipe("digits", "fp32")
    trials = runtime.trial_set()
    assert trials is not None
    assert [(s.backend, s.threads) for s in trials.settings] == [
        ("cpu", 1),
        ("cpu", 4),
        ("opencl", 1),
        ("opencl", 4),
    ]
    assert plain.models["digits"].variants["fp32"].runtime.trial_set() is None
    # The same set in another order has the same id; another bound, another id.
    again = config.parse(
        edit(small_toml, _try('{ threads = [1, 4], backends = ["opencl", "cpu"] }')), file=FILE
    )
    bounded = config.parse(
        edit(
            small_toml,
            _try('{ threads = [1, 4], backends = ["opencl", "cpu"], max_runs_per_setting = 3 }'),
        ),
        file=FILE,
    )
    same = again.models["digits"].variants["fp32"].runtime.trial_set()
    other = bounded.models["digits"].variants["fp32"].runtime.trial_set()
    assert same is not None
    assert other is not None
    assert same == trials
    assert other.id != trials.id
