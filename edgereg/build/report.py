"""Read what builds wrote, for the summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgereg.build.outputs import BUILT, STALE, read_outputs
from edgereg.config import Config


def summary_rows(config: Config, out_root: Path) -> list[dict[str, Any]]:
    """One row per declared variant, with its measured numbers when built."""
    rows = []
    for model_name, model in config.models.items():
        for variant_name, variant in model.variants.items():
            outputs = read_outputs(config, model_name, variant_name, out_root)
            row: dict[str, Any] = {
                "model": model_name,
                "variant": variant_name,
                "tier": variant.tier,
                "status": outputs.status,
            }
            if outputs.status in (BUILT, STALE):
                metrics = outputs.metrics
                accuracy = metrics.get("accuracy", {})
                threads = variant.runtime.threads
                latency = metrics.get("benchmark", {}).get(f"threads_{threads}", {})
                row.update(
                    size_mb=metrics.get("size_mb"),
                    accuracy=accuracy.get("variant"),
                    accuracy_change=accuracy.get("change"),
                    worst_recall_change=metrics.get("class_recall", {}).get("worst_change"),
                    p50_ms=latency.get("p50_ms"),
                    threads=threads,
                )
            rows.append(row)
    return rows
