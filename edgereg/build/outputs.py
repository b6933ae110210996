"""What a variant's build leaves in ``<out>/<model>/<variant>/``, and reading it back.

The summary table, the HTML report and the publisher all need the same
answer to "is this variant built, and for the models.toml as it is now?";
:func:`read_outputs` is that answer. Light on purpose (no numpy, no MNN), so
read-only commands can use it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgereg.config import Config

ARTIFACT = "model.mnn"
METRICS = "metrics.json"
PROVENANCE = "provenance.json"
CLASS_RECALL_PLOT = "class_recall.json"
LATENCY_PLOT = "latency.json"
OUTPUT_FILES = (ARTIFACT, METRICS, PROVENANCE, CLASS_RECALL_PLOT, LATENCY_PLOT)

BUILT = "built"
STALE = "stale"
NOT_BUILT = "not built"
UNREADABLE = "unreadable"


def variant_dir(out_root: Path, model_name: str, variant_name: str) -> Path:
    """Where a variant's outputs live."""
    return out_root / model_name / variant_name


@dataclass(frozen=True)
class BuildOutputs:
    """A variant's build outputs as found on disk.

    Attributes:
        out_dir: The variant's output directory.
        status: ``built`` (current), ``stale`` (models.toml or the source
            changed since), ``not built`` or ``unreadable``.
        metrics: metrics.json (empty unless built or stale).
        provenance: provenance.json (empty unless built or stale).
        problem: Why the outputs are unreadable.
    """

    out_dir: Path
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None

    @property
    def artifact(self) -> Path:
        """The model.mnn file."""
        return self.out_dir / ARTIFACT


def read_outputs(
    config: Config, model_name: str, variant_name: str, out_root: Path
) -> BuildOutputs:
    """Read a variant's metrics and provenance and tell whether they are current."""
    out_dir = variant_dir(out_root, model_name, variant_name)
    if not (out_dir / ARTIFACT).is_file() or not (out_dir / METRICS).is_file():
        return BuildOutputs(out_dir, NOT_BUILT)
    try:
        metrics = read_json(out_dir / METRICS)
        provenance = read_json(out_dir / PROVENANCE)
    except (OSError, ValueError) as exc:
        return BuildOutputs(out_dir, UNREADABLE, problem=str(exc))
    if not isinstance(metrics, dict) or not isinstance(provenance, dict):
        return BuildOutputs(
            out_dir, UNREADABLE, problem="metrics or provenance is not a JSON object"
        )
    current = provenance.get("recipe_sha256") == config.recipe_digest(model_name, variant_name)
    return BuildOutputs(out_dir, BUILT if current else STALE, metrics, provenance)


def read_json(path: Path) -> Any:
    """One JSON file the build wrote."""
    return json.loads(path.read_text(encoding="utf-8"))
