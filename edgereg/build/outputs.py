"""What a variant's build leaves in ``<out>/<model>/<variant>/``, and reading it back.

The summary table, the HTML report and the publisher all need the same
answer to "is this variant built, and for the models.toml as it is now?";
:func:`read_outputs` is that answer. Light on purpose (no numpy, no MNN), so
read-only commands can use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgereg.build.threads import checked_record
from edgereg.config import Config, InputSpec, Model
from edgereg.tasks import task_class

ARTIFACT = "model.mnn"
METRICS = "metrics.json"
PROVENANCE = "provenance.json"
CLASS_RECALL_PLOT = "class_recall.json"
#: How an app calls the variant (edgereg.protocol.contract.IOContract), copied into releases.
CONTRACT = "contract.json"
#: The golden probe blob (canonical JSON of edgereg.protocol.probe.GoldenProbe).
PROBE = "probe.json"
#: The golden probe's tensors when one sample's inputs are too large to inline in
#: probe.json (:func:`probe_data_inputs`): their raw little-endian bytes, one
#: after another, named by the probe's offsets and data_sha256.
PROBE_DATA = "probe-data.bin"
#: The labels (canonical JSON array) of a model that has them: the contract
#: references it as a blob when the labels are too large to inline.
LABELS = "labels.json"
#: Host load time, memory, latency and the thread sweep. Not a DVC stage output:
#: timings differ on every run, and dvc.lock records only what a rebuild of the
#: same inputs reproduces byte for byte. dvc.yaml lists it as a top-level metric
#: and plot, so `dvc metrics show` and `dvc plots show` still read it.
HOST_BENCHMARK = "host-benchmark.json"
#: What the DVC stage declares as its outputs (all reproducible). The recall
#: plot is declared for classifiers only, the labels for models with labels
#: (:func:`writes_labels`).
STAGE_OUTPUTS = (
    ARTIFACT,
    METRICS,
    PROVENANCE,
    CLASS_RECALL_PLOT,
    CONTRACT,
    PROBE,
    PROBE_DATA,
    LABELS,
)
#: Every file a build writes into its output directory.
OUTPUT_FILES = (*STAGE_OUTPUTS, HOST_BENCHMARK)
#: The label a host figure carries wherever it is copied (releases, reports):
#: latency on the build machine says little about a phone.
HOST_FIGURES = "host"
#: host-benchmark.json's key for the thread sweep (edgereg.build.threads.record).
HOST_THREADS = "host_threads"

BUILT = "built"
STALE = "stale"
NOT_BUILT = "not built"
UNREADABLE = "unreadable"
#: Built, measured and rejected by a gate: metrics.json holds the numbers, no artifact.
FAILED = "failed"


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
    # The task kind's headline (the label metric when the set has labels, else the
    # agreement with the reference); a kind without one shows what it measured first.
    spec = task_class(str(metrics.get("task")))
    names = spec.HEADLINE if spec is not None and spec.HEADLINE else tuple(measured)[:1]
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


def writes_labels(model: Model) -> bool:
    """Whether a build of this model writes :data:`LABELS` (class names, or a CTC charset)."""
    return model.task.contract_labels(model.classes, []) is not None


#: A probe whose one sample of inputs (state inputs excluded) holds more bytes than
#: this keeps every tensor in :data:`PROBE_DATA` instead of inline base64: decided
#: from models.toml alone, so `edgereg dvc sync` knows the stage's outputs.
PROBE_INLINE_INPUT_BYTES = 1024 * 1024
_INPUT_ITEM_BYTES = {"float32": 4, "int32": 4, "int64": 8, "uint8": 1}


def probe_input_bytes(model: Model, inputs: Sequence[InputSpec]) -> int:
    """The bytes of one sample's inputs as a probe carries them (state inputs are not fed)."""
    state = {pair.input for pair in model.state}
    return sum(
        math.prod(spec.shape) * _INPUT_ITEM_BYTES[spec.dtype]
        for spec in inputs
        if spec.name not in state
    )


def writes_probe_data(model: Model, inputs: Sequence[InputSpec]) -> bool:
    """Whether a variant's build writes :data:`PROBE_DATA` (its inputs as resolved)."""
    return probe_input_bytes(model, inputs) > PROBE_INLINE_INPUT_BYTES


def variant_dir(out_root: Path, model_name: str, variant_name: str) -> Path:
    """Where a variant's outputs live."""
    return out_root / model_name / variant_name


@dataclass(frozen=True)
class ThreadLatency:
    """Host latency of one inference at one thread count, milliseconds."""

    threads: int
    p50_ms: float
    p90_ms: float


#: Figures of the fresh-process session measurement (edgereg.build.memory) that
#: host-benchmark.json may carry: memory at the declared shape (MiB), the first
#: and the steady latency (the thread sweep has its own record, ``host_threads``).
SESSION_FIGURES = (
    "memory_peak_mb",
    "memory_steady_mb",
    "memory_runtime_mb",
    "memory_threads",
    "session_load_ms",
    "first_inference_ms",
    "steady_p50_ms",
    "steady_p90_ms",
    "steady_warmup",
    "memory_seconds",
    # Several fresh loads, when a latency budget is set (edgereg.build.memory.LatencyLoads).
    "latency_loads",
    "first_inference_judged_ms",
    "first_inference_busy_min_ms",
    "first_inference_busy_max_ms",
    "first_inference_wall_min_ms",
    "first_inference_wall_max_ms",
    "steady_judged_p50_ms",
    "steady_busy_min_ms",
    "steady_busy_max_ms",
)


@dataclass(frozen=True)
class HostBenchmark:
    """What the host benchmark measured for one artifact (host figures, not a device's).

    Attributes:
        load_ms: Fastest model load, milliseconds.
        peak_rss_mb: Peak resident memory of the benchmark process, MiB.
        latency: Per thread count, in increasing order of threads.
        artifact_sha256: The artifact that was measured (a failed variant's
            rejected candidate included).
        recipe_sha256: The recipe it was built from.
    """

    load_ms: float
    peak_rss_mb: float
    latency: tuple[ThreadLatency, ...]
    artifact_sha256: str
    recipe_sha256: str
    #: The fresh-process session measurement (:data:`SESSION_FIGURES`), when made.
    session: dict[str, float] = field(default_factory=dict)
    #: The host thread sweep (``edgereg.build.threads.record``), written as
    #: ``host_threads``: which count was fastest on the build host, never shipped.
    threads: dict[str, Any] | None = None

    def figure(self, name: str) -> float | None:
        """One of :data:`SESSION_FIGURES`, if measured."""
        return self.session.get(name)

    def p50_ms(self, threads: int) -> float | None:
        """Median latency at ``threads`` threads, if measured."""
        return next((row.p50_ms for row in self.latency if row.threads == threads), None)

    def to_json(self) -> dict[str, Any]:
        """The host-benchmark.json document: a DVC metric (numbers) and plot (``latency``)."""
        return {
            "figures": HOST_FIGURES,
            "load_ms": self.load_ms,
            "peak_rss_mb": self.peak_rss_mb,
            # Flat keys for `dvc metrics show` (it skips lists) ...
            **{
                f"threads_{row.threads}": {"p50_ms": row.p50_ms, "p90_ms": row.p90_ms}
                for row in self.latency
            },
            # ... and rows for `dvc plots show` (it plots the first list of records).
            "latency": [
                {"threads": row.threads, "p50_ms": row.p50_ms, "p90_ms": row.p90_ms}
                for row in self.latency
            ],
            "artifact_sha256": self.artifact_sha256,
            "recipe_sha256": self.recipe_sha256,
            **self.session,
            **({} if self.threads is None else {HOST_THREADS: self.threads}),
        }

    def release_metrics(self) -> dict[str, Any]:
        """The host figures a release record carries, labelled as such."""
        document = self.to_json()
        del document["latency"], document["artifact_sha256"], document["recipe_sha256"]
        return document

    @classmethod
    def from_json(cls, data: Any) -> HostBenchmark:
        """Parse a host-benchmark.json document.

        Raises:
            ValueError: the document is not one the build writes.
        """
        if not isinstance(data, dict) or data.get("figures") != HOST_FIGURES:
            raise ValueError('not a host benchmark (no "figures": "host")')
        try:
            rows = tuple(
                ThreadLatency(int(row["threads"]), float(row["p50_ms"]), float(row["p90_ms"]))
                for row in data["latency"]
            )
            return cls(
                load_ms=float(data["load_ms"]),
                peak_rss_mb=float(data["peak_rss_mb"]),
                latency=tuple(sorted(rows, key=lambda row: row.threads)),
                artifact_sha256=str(data["artifact_sha256"]),
                recipe_sha256=str(data["recipe_sha256"]),
                session={
                    name: float(data[name])
                    for name in SESSION_FIGURES
                    if isinstance(data.get(name), (int, float))
                },
                # Of another shape (an edit, an older build): no sweep, never a traceback.
                threads=checked_record(data.get(HOST_THREADS)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"host benchmark is missing or mistypes {exc}") from exc


def read_host_benchmark(
    out_dir: Path, *, recipe_sha256: str, artifact_sha256: str | None = None
) -> HostBenchmark | None:
    """The host benchmark of the build whose recipe (and artifact) are given.

    None when there is none, it is unreadable, or it measured another build:
    DVC may restore outputs from its run-cache or a remote without running the
    stage, leaving a host-benchmark.json that belongs to different bytes.
    """
    try:
        found = HostBenchmark.from_json(read_json(out_dir / HOST_BENCHMARK))
    except (OSError, ValueError):
        return None
    if found.recipe_sha256 != recipe_sha256:
        return None
    if artifact_sha256 is not None and found.artifact_sha256 != artifact_sha256:
        return None
    return found


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
        host_benchmark: The host figures measured for these outputs, when
            this checkout measured them (not part of what DVC reproduces).
    """

    out_dir: Path
    status: str
    metrics: dict[str, Any] = field(default_factory=dict)
    provenance: dict[str, Any] = field(default_factory=dict)
    problem: str | None = None
    host_benchmark: HostBenchmark | None = None

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
    artifact = provenance.get("artifact")
    host = read_host_benchmark(
        out_dir,
        recipe_sha256=str(provenance.get("recipe_sha256")),
        artifact_sha256=str(artifact.get("sha256")) if isinstance(artifact, dict) else "",
    )
    return BuildOutputs(
        out_dir, BUILT if current else STALE, metrics, provenance, host_benchmark=host
    )


def _failed(config: Config, model_name: str, variant_name: str, out_dir: Path) -> BuildOutputs:
    """A variant whose gates failed: its numbers, unless models.toml changed since."""
    try:
        metrics = read_json(out_dir / METRICS)
    except (OSError, ValueError) as exc:
        return BuildOutputs(out_dir, UNREADABLE, problem=str(exc))
    if not isinstance(metrics, dict) or metrics.get("status") != FAILED:
        return BuildOutputs(out_dir, NOT_BUILT)
    recipe_digest = config.recipe_digest(model_name, variant_name)
    if metrics.get("recipe_sha256") != recipe_digest:
        return BuildOutputs(out_dir, NOT_BUILT)
    host = read_host_benchmark(out_dir, recipe_sha256=recipe_digest)
    return BuildOutputs(out_dir, FAILED, metrics, host_benchmark=host)


def read_json(path: Path) -> Any:
    """One JSON file the build wrote."""
    return json.loads(path.read_text(encoding="utf-8"))
