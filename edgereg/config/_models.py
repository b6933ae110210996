"""[models.NAME] and its variants."""

from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import ConfigDict, Field, Strict, StringConstraints, model_validator

from edgereg.config._arm import ARM_DESCRIPTION, ArmClasses, CpuFeature, check_instead
from edgereg.config._base import _rule_error, _Strict
from edgereg.config._budgets import Budgets, MetricBudget
from edgereg.config._inputs import CalibrationSet, InputSpec, OutputSpec, PinnedFile, StatePair
from edgereg.config._metrics import MAX_METRICS, AppMetric
from edgereg.config._rollout import RolloutPolicy
from edgereg.protocol.fields import Backend, Name, Requirements, RuntimeHints, SemVer
from edgereg.protocol.hints import (
    DEFAULT_MAX_RUNS_PER_SETTING,
    DEFAULT_MAX_TOTAL_MS,
    MAX_RUNS_PER_SETTING,
    MAX_TOTAL_MS,
    MAX_TRIAL_SETTINGS,
    RuntimeTrials,
)
from edgereg.tasks import NAMED_CLASS_KINDS, SHORTHAND_KINDS, ClassificationTask, Task, TaskMetric


class NoQuantization(_Strict):
    """Keep weights and activations in float."""

    mode: Literal["none"] = "none"


class WeightOnlyQuantization(_Strict):
    """Weight-only quantization through the converter; activations stay float."""

    mode: Literal["weight"]
    bits: int = Field(default=8, ge=2, le=8)
    block: int | None = Field(default=None, ge=0, description="Block size; per channel when unset.")
    asymmetric: bool = True


class Int8Quantization(_Strict):
    """Full int8 post-training quantization calibrated on the calibration set."""

    mode: Literal["int8"]
    method: Literal["KL", "ADMM", "EMA", "auto"] = Field(
        default="KL",
        description='Feature method; "auto" tries KL, EMA and ADMM, keeps the best that passes '
        "the gates and, when none does, keeps the worst layers in float until one does "
        "(recorded in provenance).",
    )
    max_skip_ops: int = Field(
        default=4,
        ge=0,
        le=32,
        description='"auto" only: at most this many layers kept in float by the search.',
    )
    weight_method: Literal["MAX_ABS", "ADMM"] = "MAX_ABS"
    skip_ops: list[str] = Field(
        default_factory=list, description="Layer names kept in float (skip_quant_op_names)."
    )
    samples: int | None = Field(
        default=None, ge=1, description="Calibration samples; overrides the set's own count."
    )


Quantization = Annotated[
    Union[NoQuantization, WeightOnlyQuantization, Int8Quantization],  # noqa: UP007
    Field(discriminator="mode"),
]


class ConverterOptions(_Strict):
    """MNN converter settings beyond precision and quantization."""

    transformer_fuse: bool = False
    optimize_prefer: Literal[0, 1, 2] | None = None


class TrySet(_Strict):
    """The settings devices time the golden probe under after an install (decision 0008)."""

    threads: list[Annotated[int, Strict()]] = Field(
        description="Thread counts to try, each 1 to 16, each once."
    )
    backends: list[Backend] = Field(
        description="Backends to try, each once, each one the variant's runtime.backends lists.",
    )
    max_runs_per_setting: int = Field(
        default=DEFAULT_MAX_RUNS_PER_SETTING,
        ge=1,
        le=MAX_RUNS_PER_SETTING,
        description="Warm runs of the golden probe per setting and install.",
    )
    max_total_ms: int = Field(
        default=DEFAULT_MAX_TOTAL_MS,
        ge=1,
        le=MAX_TOTAL_MS,
        description="Milliseconds one install's trial may take at most.",
    )

    @model_validator(mode="after")
    def _bounded(self) -> TrySet:
        for key, what in (("threads", "thread count"), ("backends", "backend")):
            values: list[object] = list(getattr(self, key))
            if not values:
                raise _rule_error(
                    key, f"an empty list tries nothing: list at least one {what}, or remove try"
                )
            twice = sorted({str(v) for v in values if values.count(v) > 1})
            if twice:
                raise _rule_error(key, f"{', '.join(twice)} appears twice: list each once")
        for index, threads in enumerate(self.threads):
            if not 1 <= threads <= 16:
                raise _rule_error(
                    f"threads.{index}",
                    f"{threads} threads: a thread count is 1 to 16 (as runtime.threads)",
                )
        count = len(self.threads) * len(self.backends)
        if count > MAX_TRIAL_SETTINGS:
            raise _rule_error(
                "threads",
                f"{len(self.threads)} thread counts x {len(self.backends)} backends make "
                f"{count} settings, more than the {MAX_TRIAL_SETTINGS} a device tries: "
                "drop thread counts or backends",
            )
        return self


def _no_trials(value: object) -> bool:
    return value is None


class VariantRuntime(RuntimeHints):
    """Settings that travel with the variant to the app, and the settings devices try."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, defer_build=True)

    trials: TrySet | None = Field(
        default=None,
        alias="try",
        exclude_if=_no_trials,
        description="Settings devices time the golden probe under after an install "
        '({ threads = [1, 2, 4], backends = ["opencl", "cpu"] }): the manifest '
        "entry's runtime_trials. The declared threads and backends stay what devices use.",
    )

    @model_validator(mode="after")
    def _tries_allowed_backends(self) -> VariantRuntime:
        if self.trials is not None:
            extra = [b for b in self.trials.backends if b not in self.backends]
            if extra:
                raise _rule_error(
                    "try.backends",
                    f"{', '.join(extra)} is not in backends ({', '.join(self.backends)}): "
                    "a device tries only a backend the variant allows; add it to "
                    "runtime.backends or remove it from runtime.try.backends",
                )
        return self

    @property
    def hints(self) -> RuntimeHints:
        """The declared hints alone (what the recipe and the entry's ``runtime`` hold)."""
        given = self.model_fields_set & set(RuntimeHints.model_fields)
        return RuntimeHints(**{key: getattr(self, key) for key in given})

    def trial_set(self) -> RuntimeTrials | None:
        """The manifest entry's ``runtime_trials`` for ``runtime.try`` (None without one)."""
        if self.trials is None:
            return None
        return RuntimeTrials.of(
            self.trials.threads,
            self.trials.backends,
            max_runs_per_setting=self.trials.max_runs_per_setting,
            max_total_ms=self.trials.max_total_ms,
        )


class Variant(_Strict):
    """One build of a model for one device tier."""

    tier: Name
    precision: Literal["fp32", "fp16"] = "fp32"
    quantization: Quantization = Field(default_factory=NoQuantization)
    converter: ConverterOptions = Field(default_factory=ConverterOptions)
    runtime: VariantRuntime = Field(default_factory=VariantRuntime)
    budgets: Budgets | None = None
    source: PinnedFile | None = Field(
        default=None, description="A different ONNX for this tier (pruned, distilled)."
    )
    inputs: list[InputSpec] | None = Field(
        default=None, description="Input shapes of this variant's own source."
    )
    calibration: CalibrationSet | None = None
    evaluation: PinnedFile | None = None
    min_mnn_runtime: (
        Annotated[str, StringConstraints(pattern=r"^[0-9]+\.[0-9]+\.[0-9]+$")] | None
    ) = Field(
        default=None,
        description="This variant's own minimum MNN runtime, when the proof of "
        "[toolchain] min_mnn_runtime fails for it (an int8 kernel that an older runtime "
        "computes differently); between that and `mnn`.",
    )
    arm: ArmClasses | None = Field(default=None, description=ARM_DESCRIPTION)
    avoid_cpu: list[CpuFeature] | None = Field(
        default=None,
        min_length=1,
        max_length=8,
        description='CPU features this variant must not run on (such as ["i8mm"]: MNN\'s i8mm '
        "int8 kernel computes output channels past the last multiple of 8 wrong). ARM "
        "verification reports classes with them as avoided instead of failing; the manifest "
        "entry carries the list, and devices with such a feature install `instead`.",
    )
    instead: Name | None = Field(
        default=None,
        description="The variant (of this model) that devices with an avoided CPU feature "
        "install in this one's place; it must have no instead of its own.",
    )

    @model_validator(mode="after")
    def _precision_and_quantization(self) -> Variant:
        if self.precision == "fp16" and self.quantization.mode != "none":
            raise _rule_error(
                "precision",
                'precision = "fp16" cannot be combined with quantization; '
                'use precision = "fp32" with a quantization mode',
            )
        if self.inputs is not None and self.source is None:
            raise _rule_error("inputs", "inputs may only be overridden together with source")
        return self

    @property
    def reads_calibration(self) -> bool:
        """True for int8, the one quantization calibrated on a calibration set."""
        return self.quantization.mode == "int8"


class Model(_Strict):
    """One model: its source, data, budgets and variants."""

    version: SemVer
    task: Task = Field(
        default_factory=lambda: ClassificationTask(kind="classification"),
        description="What the model computes and how it is scored: "
        + ", ".join(f'"{kind}"' for kind in SHORTHAND_KINDS)
        + ", or a table { kind = ..., ... } with the task's settings.",
    )
    description: str = ""
    source: PinnedFile
    inputs: list[InputSpec] = Field(min_length=1)
    outputs: list[OutputSpec] = Field(min_length=1)
    state: list[StatePair] = Field(
        default_factory=list,
        description="Recurrent state pairs: the model is verified and evaluated as a stream, "
        "each sequence feeding back the variant's own state.",
    )
    classes: list[str] | None = Field(
        default=None,
        description=f"Class names, index order ({', '.join(NAMED_CLASS_KINDS)}).",
    )
    calibration: CalibrationSet | None = None
    evaluation: PinnedFile
    budgets: Budgets = Field(default_factory=Budgets)
    rollout: RolloutPolicy | None = Field(
        default=None, description="This model's rollout policy; the global one when unset."
    )
    requires: Requirements | None = Field(
        default=None,
        description="App and OS versions every release of this model needs; devices outside "
        "them keep what they have (or stable).",
    )
    variants: dict[Name, Variant] = Field(min_length=1)
    arm: ArmClasses | None = Field(default=None, description=ARM_DESCRIPTION)
    metrics: dict[Name, AppMetric] = Field(
        default_factory=dict,
        max_length=MAX_METRICS,
        description="App metrics the app records for this model (at most 16): how well it "
        "does its job on users' real inputs, counts only. A guardrail can judge any of them.",
    )

    @model_validator(mode="after")
    def _instead(self) -> Model:
        check_instead(self)
        return self

    @model_validator(mode="after")
    def _unique_names(self) -> Model:
        for kind, specs in (("input", self.inputs), ("output", self.outputs)):
            names = [spec.name for spec in specs]
            if len(set(names)) != len(names):
                raise _rule_error(f"{kind}s", f"{kind} names must be unique, got {names}")
        input_names = [spec.name for spec in self.inputs]
        output_names = [spec.name for spec in self.outputs]
        for index, pair in enumerate(self.state):
            if pair.input not in input_names:
                raise _rule_error(
                    f"state.{index}.input",
                    f"'{pair.input}' is not a declared input (inputs: {', '.join(input_names)})",
                )
            if pair.output not in output_names:
                raise _rule_error(
                    f"state.{index}.output",
                    f"'{pair.output}' is not a declared output "
                    f"(outputs: {', '.join(output_names)})",
                )
        fed = [pair.input for pair in self.state]
        if len(set(fed)) != len(fed) or len({p.output for p in self.state}) != len(fed):
            raise _rule_error("state", "each state input and output may appear in one pair")
        task_output = self.task.output
        if task_output is not None and task_output not in output_names:
            raise _rule_error(
                "task.output",
                f"'{task_output}' is not a declared output (outputs: {', '.join(output_names)})",
            )
        if task_output is not None and task_output in {p.output for p in self.state}:
            raise _rule_error("task.output", f"'{task_output}' is a state output")
        if self.classes is not None and not type(self.task).NAMED_CLASSES:
            kinds = " and ".join(f'"{kind}"' for kind in NAMED_CLASS_KINDS)
            raise _rule_error("classes", f"classes apply to task = {kinds} only")
        self._check_budgets(self.budgets, "budgets")
        for name, variant in self.variants.items():
            if variant.budgets is not None:
                self._check_budgets(variant.budgets, f"variants.{name}.budgets")
        return self

    def _check_budgets(self, budgets: Budgets, where: str) -> None:
        for metric_name, limits in budgets.metrics.items():
            metric = self.task.metric(metric_name)
            if metric is None:
                known = ", ".join(m.name for m in self.task.METRICS) or "none"
                raise _rule_error(
                    f"{where}.metrics.{metric_name}",
                    f"task '{self.task.kind}' does not measure '{metric_name}'; "
                    f"its metrics: {known}",
                )
            label_only = ("max_drop", "min_baseline", "max_baseline")
            used = [key for key in label_only if getattr(limits, key) is not None]
            if metric.against == "reference" and used:
                raise _rule_error(
                    f"{where}.metrics.{metric_name}.{used[0]}",
                    f"'{metric_name}' compares the variant with the reference itself, so it has "
                    f"no baseline; use min or max",
                )
            _check_bounds(metric, limits, f"{where}.metrics.{metric_name}")
            wrong_way = "min_baseline" if not metric.higher_is_better else "max_baseline"
            if getattr(limits, wrong_way) is not None and not type(self.task).OWN_METRICS:
                right = "max_baseline" if wrong_way == "min_baseline" else "min_baseline"
                raise _rule_error(
                    f"{where}.metrics.{metric_name}.{wrong_way}",
                    f"'{metric_name}' is {'higher' if metric.higher_is_better else 'lower'}"
                    f" is better; use {right}",
                )

    @property
    def task_output(self) -> str:
        """The output the task's metric reads."""
        return self.task.output or next(
            spec.name for spec in self.outputs if spec.name not in {p.output for p in self.state}
        )


def _check_bounds(metric: TaskMetric, limits: MetricBudget, where: str) -> None:
    """Each limit within what the metric can be: outside, its gate never fails (or never passes).

    ``max_drop`` is a difference of two values of the metric, so it runs from
    0 to the width of the metric's range.
    """
    if metric.bounds is None:
        return
    low, high = metric.bounds
    for key in ("min", "max", "min_baseline", "max_baseline", "max_drop"):
        value = getattr(limits, key)
        if value is None:
            continue
        lo, hi = (0.0, high - low) if key == "max_drop" else (low, high)
        if not lo <= value <= hi:
            raise _rule_error(
                f"{where}.{key}",
                f"{value:g} is outside {lo:g}..{hi:g}, the range of {key} for "
                f"'{metric.name}' ({metric.description}); a budget there "
                + ("can never fail" if _never_fails(key, value, lo, hi) else "can never pass")
                + (" (a share is written 0.05, not 5)" if value > hi and hi <= 2 else ""),
            )


def _never_fails(key: str, value: float, lo: float, hi: float) -> bool:
    """True for a limit so loose that every value passes it."""
    if key in ("min", "min_baseline"):
        return value < lo
    return value > hi
