"""What the build report shows, read from the build outputs (the I/O half)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgereg.build.outputs import (
    CLASS_RECALL_PLOT,
    LATENCY_PLOT,
    NOT_BUILT,
    UNREADABLE,
    read_json,
    read_outputs,
)
from edgereg.config import Config


@dataclass(frozen=True)
class VariantData:
    """One declared variant and, when built, what its build wrote.

    Attributes:
        status: ``built``, ``stale`` (built from another recipe than
            models.toml now declares), ``not built`` or ``unreadable``.
        problem: Why the outputs could not be read (``unreadable`` only).
        threads: The thread count the variant's runtime hints ask for.
        budgets: The merged budgets models.toml declares for the variant.
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
    problem: str | None = None
    metrics: dict[str, Any] | None = None
    provenance: dict[str, Any] | None = None
    class_recall: list[dict[str, Any]] = field(default_factory=list)
    latency: list[dict[str, Any]] = field(default_factory=list)

    @property
    def built(self) -> bool:
        """Whether the build outputs are there (current or stale)."""
        return self.metrics is not None

    def latency_ms(self, threads: int) -> float | None:
        """Host p50 latency at ``threads`` threads, if measured."""
        for row in self.latency:
            if row.get("threads") == threads:
                value = row.get("p50_ms")
                return float(value) if isinstance(value, (int, float)) else None
        bench = (self.metrics or {}).get("benchmark", {}).get(f"threads_{threads}", {})
        value = bench.get("p50_ms")
        return float(value) if isinstance(value, (int, float)) else None

    @property
    def thread_counts(self) -> list[int]:
        """Thread counts the host benchmark measured."""
        counts = {int(row["threads"]) for row in self.latency if "threads" in row}
        bench = (self.metrics or {}).get("benchmark", {})
        counts |= {int(key.split("_", 1)[1]) for key in bench if key.startswith("threads_")}
        return sorted(counts)


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
    model = config.models[model_name]
    variant = model.variants[variant_name]
    outputs = read_outputs(config, model_name, variant_name, out_root)
    base = VariantData(
        model=model_name,
        variant=variant_name,
        tier=variant.tier,
        status=NOT_BUILT,
        threads=variant.runtime.threads,
        budgets=model.budgets.merged(variant.budgets).model_dump(),
        precision=variant.precision,
        quantization=variant.quantization.model_dump(),
        out_dir=str(outputs.out_dir),
    )
    if outputs.status == NOT_BUILT:
        return base
    if outputs.status == UNREADABLE:
        return replace(base, status=UNREADABLE, problem=outputs.problem)
    try:
        recall = _read_optional(outputs.out_dir / CLASS_RECALL_PLOT)
        latency = _read_optional(outputs.out_dir / LATENCY_PLOT)
    except (OSError, ValueError) as exc:
        return replace(base, status=UNREADABLE, problem=str(exc))
    return replace(
        base,
        status=outputs.status,
        metrics=outputs.metrics,
        provenance=outputs.provenance,
        class_recall=_rows(recall),
        latency=_rows(latency),
    )


def _rows(value: Any) -> list[dict[str, Any]]:
    return [row for row in value if isinstance(row, dict)] if isinstance(value, list) else []


def _read_optional(path: Path) -> Any:
    return read_json(path) if path.is_file() else []
