"""Read what builds wrote, for the summary table and later reports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgereg.build.variant import ARTIFACT, METRICS, PROVENANCE, variant_dir
from edgereg.config import Config


def summary_rows(config: Config, out_root: Path) -> list[dict[str, Any]]:
    """One row per declared variant, with its measured numbers when built."""
    rows = []
    for model_name, model in config.models.items():
        for variant_name, variant in model.variants.items():
            out_dir = variant_dir(out_root, model_name, variant_name)
            row: dict[str, Any] = {
                "model": model_name,
                "variant": variant_name,
                "tier": variant.tier,
                "status": "not built",
            }
            metrics_path = out_dir / METRICS
            if (out_dir / ARTIFACT).is_file() and metrics_path.is_file():
                metrics = json.loads(metrics_path.read_text(encoding="utf-8"))
                provenance = json.loads((out_dir / PROVENANCE).read_text(encoding="utf-8"))
                current = provenance.get("recipe_sha256") == config.recipe_digest(
                    model_name, variant_name
                )
                accuracy = metrics.get("accuracy", {})
                threads = variant.runtime.threads
                latency = metrics["benchmark"].get(f"threads_{threads}", {})
                row.update(
                    status="built" if current else "stale",
                    size_mb=metrics["size_mb"],
                    accuracy=accuracy.get("variant"),
                    accuracy_change=accuracy.get("change"),
                    worst_recall_change=metrics.get("class_recall", {}).get("worst_change"),
                    p50_ms=latency.get("p50_ms"),
                    threads=threads,
                )
            rows.append(row)
    return rows
