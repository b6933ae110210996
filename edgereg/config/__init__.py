"""The models.toml schema: what a team declares, validated before anything runs.

Every table forbids unknown keys, so a typo is an error rather than a silently
ignored setting. Errors name the file, the dotted key path and what is allowed
(see :func:`load`).

One module per concern, all private; this package is the public surface:
tables (``_toolchain``, ``_inputs``, ``_budgets``, ``_tasks``, ``_models``,
``_rollout``, ``_registry``, ``_bundles``), the whole file and its
cross-table rules (``_config``), a variant resolved against its model
(``_recipe``), loading (``_load``) and error rendering (``_errors``).
"""

from edgereg.config._arm import ARM_CLASSES, ArmClass, arm_classes
from edgereg.config._base import DEFAULT_CONFIG_FILE, DEFAULT_TRUSTED_KEYS, NO_MODELS_NOTE
from edgereg.config._budgets import Budgets, MetricBudget
from edgereg.config._bundles import Bundle
from edgereg.config._config import Config
from edgereg.config._errors import MOVED_KEYS
from edgereg.config._inputs import (
    NO_BATCH_AXIS,
    CalibrationSet,
    InputDtype,
    InputSpec,
    OutputSpec,
    PinnedFile,
    StatePair,
)
from edgereg.config._load import MAX_CONFIG_BYTES, json_schema, load, parse, read_config_text
from edgereg.config._metrics import AppMetric, MetricGuardrail
from edgereg.config._models import (
    ConverterOptions,
    Int8Quantization,
    Model,
    NoQuantization,
    Quantization,
    Variant,
    WeightOnlyQuantization,
)
from edgereg.config._recipe import ResolvedVariant
from edgereg.config._registry import Registry, Reports
from edgereg.config._rollout import (
    Guardrails,
    LatencyGuardrail,
    RateGuardrail,
    RolloutPolicy,
    UnconfirmedGuardrail,
)
from edgereg.config._tasks import (
    TASK_KINDS,
    ClassificationTask,
    CtcTask,
    CustomTask,
    DenseMapTask,
    EmbeddingTask,
    FrameDecisionTask,
    GenericTask,
    Task,
    TaskMetric,
)
from edgereg.config._tiers import Tier
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

__all__ = [
    "ARM_CLASSES",
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
    "Reports",
    "Requirements",
    "ResolvedVariant",
    "RolloutPolicy",
    "RuntimeHints",
    "SemVer",
    "Sha256",
    "StatePair",
    "Task",
    "TaskMetric",
    "Tier",
    "TierRules",
    "Toolchain",
    "UnconfirmedGuardrail",
    "Variant",
    "VersionPin",
    "WeightOnlyQuantization",
    "arm_classes",
    "json_schema",
    "load",
    "parse",
    "read_config_text",
]
