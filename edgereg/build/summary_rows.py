"""Read what builds wrote, for the summary table."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgereg.build.arm import summary_of
from edgereg.build.outputs import BUILT, FAILED, STALE, headline, read_outputs
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
            if outputs.status in (BUILT, STALE, FAILED):
                metrics = outputs.metrics
                threads = variant.runtime.threads
                host = outputs.host_benchmark
                top = headline(metrics)
                agreement = metrics.get("agreement") or {}
                cosines = [a.get("cosine") for a in agreement.values() if isinstance(a, dict)]
                snrs = [a.get("snr_db") for a in agreement.values() if isinstance(a, dict)]
                row.update(
                    size_mb=metrics.get("size_mb"),
                    metric=None if top is None else top.name,
                    value=None if top is None else top.value,
                    baseline=None if top is None else top.baseline,
                    change=None if top is None else top.change,
                    min_cosine=min((c for c in cosines if c is not None), default=None),
                    min_snr_db=min((v for v in snrs if v is not None), default=None),
                    # Beside x86: each emulated ARM class's status and worst cosine.
                    arm=summary_of(metrics),
                    # Host figures, when this checkout measured them.
                    p50_ms=None if host is None else host.p50_ms(threads),
                    memory_peak_mb=None if host is None else host.figure("memory_peak_mb"),
                    memory_steady_mb=None if host is None else host.figure("memory_steady_mb"),
                    memory_runtime_mb=(metrics.get("memory") or {}).get("runtime_mb"),
                    size_note=(metrics.get("size") or {}).get("note"),
                    # Why a stage measured nothing, and the MNN API the app must call.
                    memory_problem=(metrics.get("memory") or {}).get("problem"),
                    mnn_api=(metrics.get("mnn_api") or {}).get("api"),
                    subgraphs=list((metrics.get("mnn_api") or {}).get("subgraphs") or []),
                    first_inference_ms=None if host is None else host.figure("first_inference_ms"),
                    # The thread sweep on this host (edgereg.build.threads.record):
                    # a host figure, never the phone's best, never shipped.
                    host_threads=None if host is None else host.threads,
                    threads=threads,
                    failed=list(metrics.get("failed") or []),
                    # A failed build's stages and the one that failed (stage, message).
                    stages=list(metrics.get("stages") or []),
                    error=metrics.get("error"),
                    hint=metrics.get("hint"),
                )
            rows.append(row)
    return rows
