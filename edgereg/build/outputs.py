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
#: Built, measured and rejected by a gate: metrics.json holds the numbers, no artifact.
FAILED = "failed"

#: Per task, the metric a table shows first: the label metric when the set
#: has labels, else the agreement with the reference.
HEADLINE_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "top1_agreement"),
    "dense_map": ("label_iou", "iou"),
    "ctc": ("label_line_accuracy", "line_match"),
    "embedding": ("neighbour_agreement",),
    "frame_decision": ("f1", "frame_agreement"),
}


@dataclass(frozen=True)
class Headline:
    """The one number a table shows for a variant, next to its fp32 baseline."""

    name: str
    value: float
    baseline: float | None

    @property
    def change(self) -> float | None:
        """Variant minus baseline, when there is a baseline."""
        return None if self.baseline is None else self.value - self.baseline


def headline(metrics: dict[str, Any]) -> Headline | None:
    """The task's headline metric from a metrics.json, or the worst output cosine."""
    measured = metrics.get("metrics") or {}
    baseline = metrics.get("baseline") or {}
    names = HEADLINE_METRICS.get(str(metrics.get("task")), tuple(measured)[:1])
    for name in names:
        value = measured.get(name)
        if isinstance(value, (int, float)):
            base = baseline.get(name)
            return Headline(
                name, float(value), float(base) if isinstance(base, (int, float)) else None
            )
    cosines = [
        float(entry["cosine"])
        for entry in (metrics.get("agreement") or {}).values()
        if isinstance(entry, dict) and isinstance(entry.get("cosine"), (int, float))
    ]
    return Headline("cosine", float(min(cosines)), None) if cosines else None


def variant_dir(out_root: Path, model_name: str, variant_name: str) -> Path:
    """Where a variant's outputs live."""
    return out_root / model_name / variant_name


@dataclass(frozen=True)
class BuildOutputs:
    """A variant's build outputs as found on disk.

    Attributes:
        out_dir: The variant's output directory.
        status: ``built`` (current), ``stale`` (models.toml or the source
            changed since), ``failed`` (measured, rejected by a gate: metrics
            only), ``not built`` or ``unreadable``.
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
    if not (out_dir / ARTIFACT).is_file() and (out_dir / METRICS).is_file():
        return _failed(config, model_name, variant_name, out_dir)
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


def _failed(config: Config, model_name: str, variant_name: str, out_dir: Path) -> BuildOutputs:
    """A variant whose gates failed: its numbers, unless models.toml changed since."""
    try:
        metrics = read_json(out_dir / METRICS)
    except (OSError, ValueError) as exc:
        return BuildOutputs(out_dir, UNREADABLE, problem=str(exc))
    if not isinstance(metrics, dict) or metrics.get("status") != FAILED:
        return BuildOutputs(out_dir, NOT_BUILT)
    if metrics.get("recipe_sha256") != config.recipe_digest(model_name, variant_name):
        return BuildOutputs(out_dir, NOT_BUILT)
    return BuildOutputs(out_dir, FAILED, metrics)


def read_json(path: Path) -> Any:
    """One JSON file the build wrote."""
    return json.loads(path.read_text(encoding="utf-8"))
