"""The models.toml schema: what a team declares, validated before anything runs.

Every table forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Errors name the file, the dotted key path and what is allowed
(see :func:`load`).

One module per concern, all private; this package is the public surface:
tables (``_toolchain``, ``_inputs``, ``_budgets``, ``_models``, ``_guardrails``,
``_rollout``, ``_registry``, ``_bundles``), the whole file and its
cross-table rules (``_config``), a variant resolved against its model
(``_recipe``), loading (``_load``) and error rendering (``_errors``). The task
kinds live in :mod:`edgereg.tasks`, one module each; their tables are re-exported here.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from edgereg.config._arm import ARM_CLASSES, ArmClass, arm_classes
    from edgereg.config._budgets import Budgets, MetricBudget
    from edgereg.config._bundles import Bundle
    from edgereg.config._config import Config
    from edgereg.config._errors import MOVED_KEYS
    from edgereg.config._guardrails import (
        BUILTIN_GUARDRAILS,
        BuiltinGuardrail,
        LatencyGuardrail,
        RateGuardrail,
        UnconfirmedGuardrail,
        builtin_guardrail,
    )
    from edgereg.config._inputs import (
        NO_BATCH_AXIS,
        CalibrationSet,
        InputDtype,
        InputSpec,
        OutputSpec,
        PinnedFile,
        StatePair,
    )
    from edgereg.config._load import json_schema, load, parse
    from edgereg.config._metrics import AppMetric, MetricGuardrail
    from edgereg.config._models import (
        ConverterOptions,
        Int8Quantization,
        Model,
        NoQuantization,
        Quantization,
        TrySet,
        Variant,
        VariantRuntime,
        WeightOnlyQuantization,
    )
    from edgereg.config._names import DEFAULT_CONFIG_FILE, DEFAULT_TRUSTED_KEYS, NO_MODELS_NOTE
    from edgereg.config._recipe import ResolvedVariant
    from edgereg.config._registry import Registry, RegistrySettings, Reports, load_registry
    from edgereg.config._rollout import Guardrails, RolloutPolicy
    from edgereg.config._tiers import Tier
    from edgereg.config._toml import MAX_CONFIG_BYTES, read_config_text
    from edgereg.config._toolchain import Toolchain
    from edgereg.errors import ConfigError

    # One definition of each wire-visible type, in the protocol; re-exported here.
    from edgereg.protocol.fields import (
        NAME_RULE,
        Backend,
        Name,
        Requirements,
        RuntimeHints,
        SemVer,
        Sha256,
        TierRules,
        VersionPin,
    )
    from edgereg.tasks import (
        TASK_KINDS,
        ClassificationTask,
        CtcTask,
        CustomTask,
        DenseMapTask,
        EmbeddingTask,
        FrameDecisionTask,
        GenericTask,
        SegmentationTask,
        Task,
        TaskMetric,
    )

# The names below load with their module on first use (PEP 562): a command that
# reads one table (the rollout policy, [registry]) or only needs the file's name
# does not build the whole schema; `edgereg pull` and `status` start faster
# (benchmarks/startup.py). `load` and `Config` still bring every table.
_WHERE = {
    "ARM_CLASSES": "edgereg.config._arm",
    "BUILTIN_GUARDRAILS": "edgereg.config._guardrails",
    "AppMetric": "edgereg.config._metrics",
    "arm_classes": "edgereg.config._arm",
    "ArmClass": "edgereg.config._arm",
    "BuiltinGuardrail": "edgereg.config._guardrails",
    "builtin_guardrail": "edgereg.config._guardrails",
    "Backend": "edgereg.protocol.fields",
    "Budgets": "edgereg.config._budgets",
    "Bundle": "edgereg.config._bundles",
    "CalibrationSet": "edgereg.config._inputs",
    "ClassificationTask": "edgereg.tasks",
    "Config": "edgereg.config._config",
    "ConfigError": "edgereg.errors",
    "ConverterOptions": "edgereg.config._models",
    "CtcTask": "edgereg.tasks",
    "CustomTask": "edgereg.tasks",
    "DEFAULT_CONFIG_FILE": "edgereg.config._names",
    "DEFAULT_TRUSTED_KEYS": "edgereg.config._names",
    "DenseMapTask": "edgereg.tasks",
    "EmbeddingTask": "edgereg.tasks",
    "FrameDecisionTask": "edgereg.tasks",
    "GenericTask": "edgereg.tasks",
    "Guardrails": "edgereg.config._rollout",
    "InputDtype": "edgereg.config._inputs",
    "InputSpec": "edgereg.config._inputs",
    "Int8Quantization": "edgereg.config._models",
    "json_schema": "edgereg.config._load",
    "LatencyGuardrail": "edgereg.config._guardrails",
    "load": "edgereg.config._load",
    "load_registry": "edgereg.config._registry",
    "MAX_CONFIG_BYTES": "edgereg.config._toml",
    "MetricBudget": "edgereg.config._budgets",
    "MetricGuardrail": "edgereg.config._metrics",
    "Model": "edgereg.config._models",
    "MOVED_KEYS": "edgereg.config._errors",
    "Name": "edgereg.protocol.fields",
    "NAME_RULE": "edgereg.protocol.fields",
    "NO_BATCH_AXIS": "edgereg.config._inputs",
    "NO_MODELS_NOTE": "edgereg.config._names",
    "NoQuantization": "edgereg.config._models",
    "OutputSpec": "edgereg.config._inputs",
    "parse": "edgereg.config._load",
    "PinnedFile": "edgereg.config._inputs",
    "Quantization": "edgereg.config._models",
    "RateGuardrail": "edgereg.config._guardrails",
    "read_config_text": "edgereg.config._toml",
    "Registry": "edgereg.config._registry",
    "RegistrySettings": "edgereg.config._registry",
    "Reports": "edgereg.config._registry",
    "Requirements": "edgereg.protocol.fields",
    "ResolvedVariant": "edgereg.config._recipe",
    "RolloutPolicy": "edgereg.config._rollout",
    "SegmentationTask": "edgereg.tasks",
    "RuntimeHints": "edgereg.protocol.fields",
    "SemVer": "edgereg.protocol.fields",
    "Sha256": "edgereg.protocol.fields",
    "StatePair": "edgereg.config._inputs",
    "Task": "edgereg.tasks",
    "TASK_KINDS": "edgereg.tasks",
    "TaskMetric": "edgereg.tasks",
    "Tier": "edgereg.config._tiers",
    "TierRules": "edgereg.protocol.fields",
    "Toolchain": "edgereg.config._toolchain",
    "UnconfirmedGuardrail": "edgereg.config._guardrails",
    "TrySet": "edgereg.config._models",
    "Variant": "edgereg.config._models",
    "VariantRuntime": "edgereg.config._models",
    "VersionPin": "edgereg.protocol.fields",
    "WeightOnlyQuantization": "edgereg.config._models",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


__all__ = [
    "ARM_CLASSES",
    "BUILTIN_GUARDRAILS",
    "DEFAULT_CONFIG_FILE",
    "DEFAULT_TRUSTED_KEYS",
    "MAX_CONFIG_BYTES",
    "MOVED_KEYS",
    "NAME_RULE",
    "NO_BATCH_AXIS",
    "NO_MODELS_NOTE",
    "TASK_KINDS",
    "AppMetric",
    "ArmClass",
    "Backend",
    "Budgets",
    "BuiltinGuardrail",
    "Bundle",
    "CalibrationSet",
    "ClassificationTask",
    "Config",
    "ConfigError",
    "ConverterOptions",
    "CtcTask",
    "CustomTask",
    "DenseMapTask",
    "EmbeddingTask",
    "FrameDecisionTask",
    "GenericTask",
    "Guardrails",
    "InputDtype",
    "InputSpec",
    "Int8Quantization",
    "LatencyGuardrail",
    "MetricBudget",
    "MetricGuardrail",
    "Model",
    "Name",
    "NoQuantization",
    "OutputSpec",
    "PinnedFile",
    "Quantization",
    "RateGuardrail",
    "Registry",
    "RegistrySettings",
    "Reports",
    "Requirements",
    "ResolvedVariant",
    "RolloutPolicy",
    "RuntimeHints",
    "SegmentationTask",
    "SemVer",
    "Sha256",
    "StatePair",
    "Task",
    "TaskMetric",
    "Tier",
    "TierRules",
    "Toolchain",
    "TrySet",
    "UnconfirmedGuardrail",
    "Variant",
    "VariantRuntime",
    "VersionPin",
    "WeightOnlyQuantization",
    "arm_classes",
    "builtin_guardrail",
    "json_schema",
    "load",
    "load_registry",
    "parse",
    "read_config_text",
]
