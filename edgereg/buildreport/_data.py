"""What the build report shows, read from the build outputs (the I/O half).

A variant's numbers come from its metrics.json whether it passed its gates
(``built``) or failed one (``failed``: metrics.json only, no artifact), so a
failed variant shows everything it measured. Each gate is shown against the
budget it was checked on: the task's defaults for the variant's precision
with models.toml on top (:func:`edgereg.build.quality.effective_budgets`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from edgereg.build.arm import summary_of
from edgereg.build.outputs import (
    BUILT,
    CLASS_RECALL_PLOT,
    FAILED,
    NOT_BUILT,
    STALE,
    UNREADABLE,
    Headline,
    headline,
    read_json,
    read_outputs,
)
from edgereg.config import Config
from edgereg.tasks import task_metrics

#: What a gate's number is, so the page can format it: a size in MB, a
#: latency in ms, a ratio in dB, a task metric (a fraction) or a plain number.
GateKind = Literal["size", "latency", "memory", "snr", "cosine", "abs_error", "metric", "drop"]


@dataclass(frozen=True)
class Gate:
    """One gate of a variant: what was measured against which budget.

    Attributes:
        name: The gate as metrics.json names it (``iou.min``,
            ``min_cosine[logits]``).
        passed: Whether the measured number kept to the budget.
        measured: The number the gate checked, when it can be read back.
        budget: The limit it was checked against, when known (a custom
            evaluator's own gates are known only from a failure's text).
        bound: ``min`` (at least the budget) or ``max`` (at most).
        kind: How the numbers read (see :data:`GateKind`).
        metric: The task metric or output the gate is about.
    """

    name: str
    passed: bool
    measured: float | None
    budget: float | None
    bound: Literal["min", "max"]
    kind: GateKind
    metric: str


#: Agreement gate -> (key in metrics.json's agreement, kind, bound).
#: Gates on a figure of the fresh-process measurement: figure, kind, label.
_HOST_GATES: dict[str, tuple[str, GateKind, str]] = {
    "max_memory_mb": ("memory_peak_mb", "memory", "peak memory"),
    "max_first_inference_ms": ("first_inference_ms", "latency", "first"),
}

_AGREEMENT_GATES: dict[str, tuple[str, GateKind, Literal["min", "max"]]] = {
    "min_cosine": ("cosine", "cosine", "min"),
    "min_snr_db": ("snr_db", "snr", "min"),
    "max_abs_error": ("max_abs_error", "abs_error", "max"),
}

_FAILURE_TEXT = re.compile(r"^(?P<name>\S+) (?P<measured>\S+) (?:<=|>=|<|>) (?P<budget>\S+)")


@dataclass(frozen=True)
class VariantData:
    """One declared variant and, when measured, what its build wrote.

    Attributes:
        status: ``built``, ``stale`` (built from another recipe than
            models.toml now declares), ``failed`` (measured and rejected by a
            gate: metrics only, no artifact), ``not built`` or ``unreadable``.
        problem: Why the outputs could not be read (``unreadable`` only).
        threads: The thread count the variant's runtime hints ask for.
        budgets: The budgets the variant is gated on (task and precision
            defaults with models.toml on top), as ``Budgets.model_dump()``.
        precision: ``fp32`` or ``fp16``, as models.toml declares it.
        precision_class: Which defaults apply: fp32, fp16, weight or int8.
        task: The model's task kind.
        metrics, provenance, class_recall, latency: The JSON files of the build.
    """

    model: str
    variant: str
    tier: str
    status: str
    threads: int
    budgets: dict[str, Any]
    precision: str
    quantization: dict[str, Any]
    out_dir: str
    task: str = "classification"
    precision_class: str = "fp32"
    problem: str | None = None
    metrics: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    class_recall: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)
    #: Host figures of the fresh-process measurement (memory, first and steady latency).
    session: dict[str, float] = field(default_factory=dict)
    #: The host thread sweep (``edgereg.build.threads.record``): the build host's, not a phone's.
    host_threads: dict[str, Any] | None = None

    def host_figure(self, name: str) -> float | None:
        """A host figure of host-benchmark.json (``memory_peak_mb``, ``first_inference_ms``)."""
        return _number(self.session.get(name))

    @property
    def built(self) -> bool:
        """Whether there is an artifact (current or stale)."""
        return self.status in (BUILT, STALE) and self.metrics is not None

    @property
    def measured(self) -> bool:
        """Whether there are numbers to show: built, stale or failed."""
        return self.metrics is not None

    @property
    def hint(self) -> str | None:
        """What the build said to try next, for a variant that failed its gates."""
        hint = (self.metrics or {}).get("hint")
        return hint if isinstance(hint, str) and hint else None

    @property
    def failed(self) -> list[str]:
        """Each failed gate as the build described it (``iou.min 0.2 < 0.9``)."""
        if self.status != FAILED:
            return []
        texts = (self.metrics or {}).get("failed") or []
        return [str(text) for text in texts] or ["a gate failed"]

    @property
    def stages_run(self) -> list[str]:
        """The stages a failed build ran, in order (empty unless failed)."""
        stages = (self.metrics or {}).get("stages") if self.status == FAILED else None
        return [str(name) for name in stages] if isinstance(stages, list) else []

    @property
    def headline(self) -> Headline | None:
        """The task's headline metric and its fp32 baseline."""
        return None if self.metrics is None else headline(self.metrics)

    def agreement(self, key: str) -> float | None:
        """The worst output's ``cosine`` or ``snr_db`` against the reference."""
        values = [
            _number(entry.get(key))
            for entry in ((self.metrics or {}).get("agreement") or {}).values()
            if isinstance(entry, dict)
        ]
        found = [v for v in values if v is not None]
        return min(found) if found else None

    def metric(self, name: str) -> float | None:
        """A task metric's measured value."""
        return _number(((self.metrics or {}).get("metrics") or {}).get(name))

    def baseline(self, name: str) -> float | None:
        """A label metric's fp32 ONNX baseline value."""
        return _number(((self.metrics or {}).get("baseline") or {}).get(name))

    def latency_ms(self, threads: int) -> float | None:
        """Host p50 latency at ``threads`` threads, if measured."""
        for row in self.latency:
            if row.get("threads") == threads:
                value = _number(row.get("p50_ms"))
                if value is not None:
                    return value
        return None

    @property
    def thread_counts(self) -> list[int]:
        """Thread counts the host benchmark measured."""
        return sorted({int(row["threads"]) for row in self.latency if "threads" in row})

    @property
    def gates(self) -> list[Gate]:
        """Every gate the build checked, with its measured number and budget."""
        metrics = self.metrics or {}
        results = metrics.get("gates") or {}
        from_text = _failure_numbers(metrics.get("failed") or [])
        gates = []
        for name, passed in results.items():
            gate = self._gate(str(name), bool(passed))
            measured, budget = from_text.get(gate.name, (None, None))
            if gate.measured is None or gate.budget is None:
                gate = replace(
                    gate,
                    measured=gate.measured if gate.measured is not None else measured,
                    budget=gate.budget if gate.budget is not None else budget,
                )
            gates.append(gate)
        return gates

    def _gate(self, name: str, passed: bool) -> Gate:
        budgets = self.budgets
        agreement = (self.metrics or {}).get("agreement") or {}
        if name == "max_size_mb":
            return Gate(
                name,
                passed,
                _number((self.metrics or {}).get("size_mb")),
                _number(budgets.get("max_size_mb")),
                "max",
                "size",
                "size",
            )
        if name in _HOST_GATES:
            figure, kind, label = _HOST_GATES[name]
            return Gate(
                name,
                passed,
                self.host_figure(figure),
                _number(budgets.get(name)),
                "max",
                kind,
                label,
            )
        if name == "max_latency_p50_ms":
            return Gate(
                name,
                passed,
                self.latency_ms(self.threads),
                _number(budgets.get("max_latency_p50_ms")),
                "max",
                "latency",
                "p50",
            )
        on_arm = re.fullmatch(r"arm\[(.*)\]", name)
        if on_arm:
            # One gate per emulated ARM class (docs/operations/arm-verification.md),
            # read as its worst output cosine; an avoided class is shown as passed.
            row = summary_of(self.metrics or {}).get(on_arm.group(1), {})
            return Gate(
                name,
                passed,
                _number(row.get("min_cosine")),
                # Avoided: devices of the class install `instead`; no budget applied.
                None if row.get("status") == "avoided" else _number(budgets.get("min_cosine")),
                "min",
                "cosine",
                f"{on_arm.group(1)} ({row.get('status', 'not run')})",
            )
        agreed = re.fullmatch(r"(min_cosine|min_snr_db|max_abs_error)\[(.*)\]", name)
        if agreed:
            budget_key, output = agreed.groups()
            entry = agreement.get(output) or {}
            key, kind, side = _AGREEMENT_GATES[budget_key]
            return Gate(
                name,
                passed,
                _number(entry.get(key)) if isinstance(entry, dict) else None,
                _number(budgets.get(budget_key)),
                side,
                kind,
                output,
            )
        metric, _, limit = name.rpartition(".")
        bound: Literal["min", "max"]
        limits = (budgets.get("metrics") or {}).get(metric) or {}
        budget = _number(limits.get(limit)) if isinstance(limits, dict) else None
        value, base = self.metric(metric), self.baseline(metric)
        if limit == "max_drop":
            higher = self._higher_is_better(metric)
            drop = (
                None
                if value is None or base is None
                else (base - value if higher else value - base)
            )
            return Gate(name, passed, drop, budget, "max", "drop", metric)
        if limit in ("min_baseline", "max_baseline"):
            bound = "min" if limit == "min_baseline" else "max"
            return Gate(name, passed, base, budget, bound, "metric", metric)
        bound = "min" if limit == "min" else "max"
        return Gate(name, passed, value, budget, bound, "metric", metric or name)

    def _higher_is_better(self, metric: str) -> bool:
        for info in task_metrics(self.task):
            if info.name == metric:
                return info.higher_is_better
        return True


def _failure_numbers(texts: list[Any]) -> dict[str, tuple[float | None, float | None]]:
    """Measured number and budget from each failed gate's text, by gate name."""
    found = {}
    for text in texts:
        match = _FAILURE_TEXT.match(str(text))
        if match:
            found[match["name"]] = (_parse(match["measured"]), _parse(match["budget"]))
    return found


def _parse(text: str) -> float | None:
    try:
        return _number(float(text))
    except ValueError:
        return None


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if number == number and abs(number) != float("inf") else None


def reference_metric(task: str, name: str) -> bool:
    """Whether ``name`` compares the variant with the reference (the reference scores 1)."""
    if name == "cosine":
        return True
    return any(m.name == name and m.against == "reference" for m in task_metrics(task))


@dataclass(frozen=True)
class ModelData:
    """One model of models.toml with its variants."""

    name: str
    version: str
    task: str
    description: str
    source_path: str
    source_sha256: str
    source_size: int | None
    variants: list[VariantData]

    @property
    def headline_names(self) -> list[str]:
        """The headline metrics the measured variants show, in variant order."""
        names: list[str] = []
        for variant in self.variants:
            top = variant.headline
            if top is not None and top.name not in names:
                names.append(top.name)
        return names

    def baseline_headline(self) -> float | None:
        """The fp32 ONNX model's value of the headline metric.

        A label metric's baseline as measured; a metric that compares with
        the reference (agreement, cosine) is 1 for the reference itself.
        """
        names = self.headline_names
        if len(names) != 1:
            return None
        for variant in self.variants:
            top = variant.headline
            if top is not None and top.baseline is not None:
                return top.baseline
        return 1.0 if reference_metric(self.task, names[0]) else None


@dataclass(frozen=True)
class ReportData:
    """Everything the report shows."""

    config_path: str
    out_root: str
    generated: str
    toolchain: dict[str, str]
    tiers: list[str]
    models: list[ModelData]


def collect(config: Config, out_root: Path, *, generated: str) -> ReportData:
    """Read every declared variant's build outputs under ``out_root``.

    Args:
        config: The loaded models.toml.
        out_root: Where builds write (``build`` by default).
        generated: When the report is made, as text for its header.
    """
    models = []
    for name, model in config.models.items():
        source = config.resolve_path(model.source)
        variants = [
            _variant(config, out_root, name, variant_name) for variant_name in model.variants
        ]
        models.append(
            ModelData(
                name=name,
                version=model.version,
                task=model.task.kind,
                description=model.description,
                source_path=model.source.path,
                source_sha256=model.source.sha256,
                source_size=source.stat().st_size if source.is_file() else None,
                variants=variants,
            )
        )
    return ReportData(
        config_path=str(config.path),
        out_root=str(out_root),
        generated=generated,
        toolchain=config.toolchain.as_dict(),
        tiers=list(config.tiers),
        models=models,
    )


def _variant(config: Config, out_root: Path, model_name: str, variant_name: str) -> VariantData:
    # The build stage's own modules: the budgets shown are the ones it gated on.
    from edgereg.build.quality import effective_budgets
    from edgereg.build.variant import precision_class

    model = config.models[model_name]
    variant = model.variants[variant_name]
    outputs = read_outputs(config, model_name, variant_name, out_root)
    precision = precision_class(variant)
    budgets = effective_budgets(model.task.kind, precision, model.budgets.merged(variant.budgets))
    base = VariantData(
        model=model_name,
        variant=variant_name,
        tier=variant.tier,
        status=NOT_BUILT,
        threads=variant.runtime.threads,
        budgets=budgets.model_dump(),
        precision=variant.precision,
        quantization=variant.quantization.model_dump(),
        out_dir=str(outputs.out_dir),
        task=model.task.kind,
        precision_class=precision,
    )
    if outputs.status == NOT_BUILT:
        return base
    if outputs.status == UNREADABLE:
        return replace(base, status=UNREADABLE, problem=outputs.problem)
    try:
        recall = _read_optional(outputs.out_dir / CLASS_RECALL_PLOT)
    except (OSError, ValueError) as exc:
        return replace(base, status=UNREADABLE, problem=str(exc))
    if outputs.status == FAILED:
        # A plot file left from an earlier passing build belongs to other numbers.
        recall = []
    # Host figures come from their one reader, which drops a file measured on other bytes.
    host = outputs.host_benchmark
    latency = (
        []
        if host is None
        else [
            {"threads": row.threads, "p50_ms": row.p50_ms, "p90_ms": row.p90_ms}
            for row in host.latency
        ]
    )
    return replace(
        base,
        status=outputs.status,
        metrics=outputs.metrics,
        provenance=outputs.provenance or None,
        class_recall=_rows(recall),
        latency=_rows(latency),
        session={} if host is None else dict(host.session),
        host_threads=None if host is None else host.threads,
    )


def _rows(value: Any) -> list[dict[str, Any]]:
    return [row for row in value if isinstance(row, dict)] if isinstance(value, list) else []


def _read_optional(path: Path) -> Any:
    return read_json(path) if path.is_file() else []


__all__ = ["Gate", "ModelData", "ReportData", "VariantData", "collect"]
