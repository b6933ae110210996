"""The package's shape: what users import keeps working, and the package uses the protocol."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from edgereg import config
from edgereg.protocol import fields, layout, patterns

# Every public name edgereg.config exported when it was one module.
CONFIG_NAMES = [
    "DEFAULT_CONFIG_FILE", "DEFAULT_TRUSTED_KEYS", "MOVED_KEYS", "NAME_RULE", "NO_BATCH_AXIS",
    "NO_MODELS_NOTE", "TASK_KINDS", "Backend", "Budgets", "Bundle", "CalibrationSet",
    "ClassificationTask", "Config", "ConfigError", "ConverterOptions", "CtcTask", "CustomTask",
    "DenseMapTask", "EmbeddingTask", "FrameDecisionTask", "GenericTask", "Guardrails",
    "InputDtype", "InputSpec", "Int8Quantization", "LatencyGuardrail", "MetricBudget", "Model",
    "Name", "NoQuantization", "OutputSpec", "PinnedFile", "Quantization", "RateGuardrail",
    "Registry", "Reports", "Requirements", "RolloutPolicy", "RuntimeHints", "SemVer", "Sha256",
    "StatePair", "Task", "TaskMetric", "TierRules", "Toolchain", "Variant", "VersionPin",
    "WeightOnlyQuantization", "json_schema", "load", "parse",
]  # fmt: skip


@pytest.mark.parametrize("name", CONFIG_NAMES)
def test_edgereg_config_still_exports(name: str) -> None:
    assert hasattr(config, name)
    assert name in config.__all__


def test_the_package_never_loads_the_compatibility_shims() -> None:
    # Import every module of the package in a fresh interpreter: none may pull
    # in edgereg.wire (ruff's banned-api rule keeps imports out; this catches
    # a dynamic one).
    code = textwrap.dedent(
        """
        import importlib, pkgutil, sys
        import edgereg
        for module in pkgutil.walk_packages(edgereg.__path__, "edgereg."):
            if module.name != "edgereg.wire" and not module.name.endswith(".__main__"):
                importlib.import_module(module.name)
        print(",".join(sorted(m for m in sys.modules if m.startswith("edgereg."))))
        """
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()
    modules = loaded.split(",")
    assert "edgereg.config._recipe" in modules  # the walk did import the package
    assert "edgereg.wire" not in modules


def test_names_and_digests_have_one_pattern() -> None:
    assert fields.NAME_PATTERN is patterns.NAME_PATTERN
    assert patterns.NAME_RE.match("digits-v2_a")
    assert not patterns.NAME_RE.match("Digits")
    assert not patterns.NAME_RE.match("a" * 64)
    assert patterns.SHA256_RE.match("0" * 64)
    assert not patterns.SHA256_RE.match("0" * 63 + "A")
    assert layout.parse_manifest_path(layout.manifest_path("digits", "high")) == (
        "digits",
        "high",
    )
    assert layout.parse_manifest_path("manifests/Digits/high.json") is None
    assert layout.parse_state_path(layout.state_path("digits")) == "digits"
    assert layout.parse_state_path(layout.release_path("digits", "1.0.0")) is None
    assert layout.is_public_key_path(layout.public_key_path("0" * 64))
    assert not layout.is_public_key_path("keys/readme.txt")
