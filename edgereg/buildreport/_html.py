"""Render the build report as one self-contained HTML page (pure).

No script, font, stylesheet or image comes from anywhere: the CSS is inline and
the charts are SVG written here. Every text that comes from models.toml or a
build output goes through :func:`_e` (HTML escaping).
"""

from __future__ import annotations

import html
import math
from collections.abc import Iterable, Sequence
from typing import Any

from edgereg.build.outputs import BUILT, FAILED, NOT_BUILT, STALE
from edgereg.build.threads import describe as describe_sweep
from edgereg.buildreport._data import Gate, ModelData, ReportData, VariantData
from edgereg.tasks import TASK_CLASSES, task_class

#: Tier colours, in tier order (best first).
PALETTE = ("#2563eb", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
#: A recall chart with more classes shows the worst ones only.
MAX_RECALL_BARS = 20

#: How a table names each task metric (the task specs' labels; any other by its name).
METRIC_LABELS = {
    **{
        metric.name: metric.label
        for task in TASK_CLASSES.values()
        for metric in task.METRICS
        if metric.label is not None
    },
    "cosine": "cosine",
}
#: Task metrics that are shares of samples, lines or frames: shown in
#: percent, their changes in percentage points.
FRACTION_METRICS = frozenset(
    metric.name for task in TASK_CLASSES.values() for metric in task.METRICS if metric.percent
)

CSS = """
:root { --fg: #1f2937; --muted: #6b7280; --line: #e5e7eb; --bad: #dc2626; --good: #059669;
  --warn: #b45309; --bg-alt: #f9fafb; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg);
  margin: 0 auto; padding: 24px 32px 48px; max-width: 1240px; }
h1 { font-size: 24px; margin: 0 0 4px; }
h2 { font-size: 20px; margin: 40px 0 4px; padding-top: 16px; border-top: 2px solid var(--line); }
h3 { font-size: 15px; margin: 24px 0 8px; }
.meta, .muted { color: var(--muted); }
.meta span + span::before { content: " · "; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace;
  font-size: 12px; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
th { font-weight: 600; background: var(--bg-alt); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num, .nowrap { white-space: nowrap; }
tr.baseline td { color: var(--muted); font-style: italic; }
tr.not-built td, tr.unreadable td { color: var(--muted); }
tr.failed td { background: #fef2f2; }
tr.has-gates td { border-bottom: none; padding-bottom: 2px; }
tr.gates-row td { padding-top: 0; font-size: 12px; }
.neg { color: var(--bad); }
.pos { color: var(--good); }
.badge { display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 12px;
  white-space: nowrap; }
.status-built { background: #d1fae5; color: #065f46; }
.status-stale { background: #fef3c7; color: #92400e; }
.status-failed { background: #fee2e2; color: #991b1b; }
.status-not-built, .status-unreadable { background: #f3f4f6; color: #4b5563; }
.failure { color: var(--bad); font-size: 12px; margin-top: 3px; max-width: 260px; }
.gate { display: inline-block; margin: 0 6px 2px 0; font-size: 12px; white-space: nowrap; }
.gate.pass::before { content: "\\2713 "; color: var(--good); font-weight: 700; }
.gate.fail::before { content: "\\2717 "; color: var(--bad); font-weight: 700; }
.gate.fail { color: var(--bad); }
.tier-dot { display: inline-block; width: 10px; height: 10px; border-radius: 50%;
  margin-right: 6px; vertical-align: baseline; }
.charts { display: flex; flex-wrap: wrap; gap: 16px 28px; align-items: flex-start; }
figure { margin: 0; max-width: 100%; }
figcaption { color: var(--muted); font-size: 12px; max-width: 560px; }
svg.chart { max-width: 100%; height: auto; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; fill: #374151; }
svg .axis line, svg .axis path { stroke: #9ca3af; }
svg .grid line { stroke: #f0f0f0; }
svg .bar.neg { fill: var(--bad); }
svg .bar.pos { fill: var(--good); }
svg .bar.zero { fill: #9ca3af; }
svg .budget { stroke: var(--warn); stroke-dasharray: 4 3; }
svg .point { fill-opacity: 0.75; stroke: #fff; stroke-width: 1.5; }
svg .point.failed { fill-opacity: 0.2; stroke: var(--bad); stroke-width: 2;
  stroke-dasharray: 3 2; }
svg .label.failed { fill: var(--bad); }
svg .leader { stroke: #9ca3af; stroke-width: 1; }
svg .true-position { fill: #374151; }
svg .baseline-point { fill: none; stroke: #111827; stroke-width: 1.5; }
.recall-grid { display: flex; flex-wrap: wrap; gap: 12px 24px; }
.notice { padding: 10px 14px; background: #fffbeb; border-left: 4px solid #f59e0b; margin: 12px 0; }
table.provenance td { max-width: 340px; }
table.variants td:first-child { min-width: 150px; }
table.provenance code { word-break: break-all; }
@media (max-width: 640px) {
  body { padding: 12px 12px 32px; }
  th, td { padding: 4px 6px; }
  table.variants td:first-child { min-width: 110px; }
}
"""


def render_html(report: ReportData) -> str:
    """The whole report page for ``report``."""
    variants = [v for m in report.models for v in m.variants]
    built = sum(v.built for v in variants)
    failed = sum(v.status == FAILED for v in variants)
    total = len(variants)
    counts = f"{built} of {total} variants built"
    if failed:
        counts += f", {failed} failed a gate"
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        # Nothing on this page loads from elsewhere; say so to the browser too.
        '<meta http-equiv="Content-Security-Policy" '
        "content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        f"<title>edgereg build report: {_e(report.config_path)}</title>",
        f"<style>{CSS}</style>",
        "</head>",
        "<body>",
        '<header id="report-header">',
        "<h1>edgereg build report</h1>",
        '<p class="meta">',
        f"<span>{_e(report.config_path)}</span>",
        f"<span>builds in {_e(report.out_root)}/</span>",
        f"<span>{counts}</span>",
        f"<span>generated {_e(report.generated)}</span>",
        "</p>",
        '<p class="meta">toolchain: '
        + ", ".join(f"{_e(k)} {_e(v)}" for k, v in report.toolchain.items())
        + "</p>",
        _tier_legend(report.tiers),
        "</header>",
    ]
    if not report.models:
        parts.append(
            '<p class="notice">No models in models.toml yet: run '
            "<code>edgereg add path/to/model.onnx --evaluation data/eval.npz</code>, "
            "then <code>dvc repro</code>.</p>"
        )
    elif built == 0 and failed == 0:
        parts.append(
            '<p class="notice">Nothing is built yet: run <code>dvc repro</code> '
            "(or <code>edgereg build MODEL VARIANT</code>), then <code>edgereg report</code> "
            "again.</p>"
        )
    if failed:
        parts.append(
            f'<p class="notice">{failed} variant(s) failed a gate; their measured numbers are '
            "shown. Fix what the gate names (<code>edgereg build MODEL VARIANT</code> prints "
            "the hint), then <code>dvc repro</code>.</p>"
        )
    if len(report.models) > 1:
        parts.append(
            "<nav><p>Models: "
            + ", ".join(f'<a href="#model-{_e(m.name)}">{_e(m.name)}</a>' for m in report.models)
            + "</p></nav>"
        )
    for model in report.models:
        parts.append(_model_section(model, report.tiers))
    parts += [
        '<footer class="muted"><p>Each variant is compared with the fp32 ONNX Runtime '
        "reference on the evaluation set. Δ: the headline metric's change against the fp32 "
        "ONNX baseline on the labels (percentage points). Cosine and SNR: the worst output. "
        "Gates: the measured number against the budget it was checked on (the task's "
        "defaults for the variant's precision, models.toml on top). Latency: host p50 in ms, "
        "not a device measurement, at the variant's own thread count (*: what the app is "
        "told). The host thread sweep under each variant's gates compares thread counts on "
        "the build host in interleaved rounds: a host figure, never shipped. Peak MB: host peak "
        "resident memory that loading the variant and running it at its declared input shape "
        "adds to a process (hover for MNN's own accounting); first ms: the first inference "
        "after load, on the host."
        "</p></footer>",
        "</body>",
        "</html>",
    ]
    return "\n".join(parts) + "\n"


def _e(value: Any) -> str:
    """HTML-escape any value's text (quotes included, for attributes)."""
    return html.escape(str(value), quote=True)


def _tier_color(tiers: Sequence[str], tier: str) -> str:
    index = list(tiers).index(tier) if tier in tiers else len(tiers)
    return PALETTE[index % len(PALETTE)]


def _tier_legend(tiers: Sequence[str]) -> str:
    items = "".join(
        f'<span class="gate"><span class="tier-dot" style="background:{_tier_color(tiers, t)}">'
        f"</span>{_e(t)}</span>"
        for t in tiers
    )
    return f'<p class="meta">tiers, best first: {items}</p>'


# --- one model ---------------------------------------------------------------------


def _model_section(model: ModelData, tiers: Sequence[str]) -> str:
    measured = [v for v in model.variants if v.measured]
    with_provenance = [v for v in measured if v.provenance]
    meta = [f"version {_e(model.version)}", f"task {_e(model.task)}"]
    if model.description:
        meta.append(_e(model.description))
    parts = [
        f'<section class="model" id="model-{_e(model.name)}">',
        f"<h2>{_e(model.name)}</h2>",
        '<p class="meta">' + "".join(f"<span>{m}</span>" for m in meta) + "</p>",
        "<h3>Variants</h3>",
        '<div class="scroll">',
        _variant_table(model, tiers),
        "</div>",
    ]
    if measured:
        parts += [
            '<div class="charts">',
            _tradeoff_chart(model, tiers),
            "</div>",
        ]
        if _class_recall(model):
            parts += [
                "<h3>Per-class recall change against the ONNX baseline</h3>",
                '<div class="recall-grid">',
                *(_recall_chart(model, v) for v in measured),
                "</div>",
            ]
    if with_provenance:
        parts += [
            "<h3>Provenance</h3>",
            '<div class="scroll">',
            _provenance_table(model, with_provenance),
            "</div>",
        ]
    parts.append("</section>")
    return "\n".join(parts)


def _class_recall(model: ModelData) -> bool:
    """Whether the model's task measures recall per class (a column and a chart per variant)."""
    spec = task_class(model.task)
    return spec is not None and spec.CLASS_RECALL


def _metric_label(name: str) -> str:
    return METRIC_LABELS.get(name, name)


def _metric_value(name: str, value: float | None) -> str:
    """A task metric as the table shows it: a share in percent, else the number."""
    if value is None:
        return "-"
    if name in FRACTION_METRICS:
        return _percent(value)
    if name in ("cosine", "embedding_cosine"):
        return _cosine(value)
    return f"{value:.4g}"


def _metric_change(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name in FRACTION_METRICS:
        return _points(value)
    return f"{round(value, 6) + 0.0:+.4g}"


def _variant_table(model: ModelData, tiers: Sequence[str]) -> str:
    threads = sorted({n for v in model.variants for n in v.thread_counts}) or [1, 2, 4]
    classification = _class_recall(model)
    names = model.headline_names
    # One metric for the whole table names its column; otherwise each cell says.
    metric_head = _metric_label(names[0]) if len(names) == 1 else "metric"
    head: list[tuple[str, bool]] = [
        ("variant", False),
        ("tier", False),
        ("status", False),
        ("size", True),
        (metric_head, True),
        ("Δ vs ONNX", True),
        ("cosine", True),
        ("SNR dB", True),
    ]
    if classification:
        head.append(("worst class Δ recall", True))
    head += [(f"p50 ms @{n} thr", True) for n in threads]
    head += [("peak MB", True), ("first ms", True)]
    rows = [
        f'<table class="variants" id="variants-{_e(model.name)}">',
        "<thead><tr>"
        + "".join(
            f'<th class="num">{_e(h)}</th>' if numeric else f"<th>{_e(h)}</th>"
            for h, numeric in head
        )
        + "</tr></thead>",
        "<tbody>",
    ]
    baseline = model.baseline_headline()
    reference = '<td class="num muted">reference</td>'
    cells = [
        f'<td>ONNX baseline<br><code class="muted">{_e(model.source_path)}</code></td>',
        "<td></td>",
        "<td>source</td>",
        f'<td class="num">{_size(model.source_size / 1e6) if model.source_size else "-"}</td>',
        f'<td class="num">{_metric_value(names[0], baseline)}</td>'
        if len(names) == 1 and baseline is not None
        else "<td></td>",
        "<td></td>",
        reference,
        reference,
    ]
    if classification:
        cells.append("<td></td>")
    cells += ["<td></td>" for _ in threads]
    cells += ["<td></td>", "<td></td>"]
    rows.append('<tr class="baseline">' + "".join(cells) + "</tr>")
    for variant in model.variants:
        rows.append(
            _variant_row(variant, tiers, threads, classification, len(names) > 1, len(head))
        )
    rows += ["</tbody>", "</table>"]
    return "\n".join(rows)


def _variant_row(
    variant: VariantData,
    tiers: Sequence[str],
    threads: Sequence[int],
    classification: bool,
    name_metric: bool,
    columns: int,
) -> str:
    """The variant's row of numbers and, when it was measured, a row of its gates.

    The gates go in a row of their own, spanning the table: a column of them
    made the table too wide for a laptop, let alone a phone.
    """
    status_class = variant.status.replace(" ", "-")
    dot = f'<span class="tier-dot" style="background:{_tier_color(tiers, variant.tier)}"></span>'
    title = {
        BUILT: "built from the recipe models.toml declares",
        STALE: "models.toml changed since this build: run dvc repro",
        NOT_BUILT: f"no outputs in {variant.out_dir}: run dvc repro",
        FAILED: "; ".join(variant.failed),
    }.get(variant.status, variant.problem or "")
    status = (
        f'<span class="badge status-{status_class}" title="{_e(title)}">{_e(variant.status)}</span>'
    )
    if variant.status == FAILED:
        failures = variant.failed
        more = f" (and {len(failures) - 1} more)" if len(failures) > 1 else ""
        status += f'<div class="failure">failed: {_e(failures[0])}{_e(more)}</div>'
        if variant.stages_run:
            ran = ", ".join(variant.stages_run)
            status += f'<div class="muted stages">stages that ran: {_e(ran)}</div>'
        if variant.hint:
            status += f'<div class="muted hint">{_e(variant.hint)}</div>'
    cells = [
        f"<td><b>{_e(variant.variant)}</b><br>"
        f'<span class="muted">{_e(_recipe_text(variant))}</span></td>',
        f'<td class="nowrap">{dot}{_e(variant.tier)}</td>',
        f"<td>{status}</td>",
    ]
    row_id = f'id="row-{_e(variant.model)}-{_e(variant.variant)}"'
    row_open = f'<tr class="{status_class}" {row_id}>'
    metrics = variant.metrics
    if metrics is None:
        span = columns - 3
        hint = (
            f"run <code>dvc repro</code> or <code>edgereg build {_e(variant.model)} "
            f"{_e(variant.variant)}</code>"
            if variant.status == NOT_BUILT
            else _e(variant.problem or "")
        )
        cells.append(f'<td colspan="{span}">{hint}</td>')
        return row_open + "".join(cells) + "</tr>"
    cells.append(f'<td class="num">{_size(_float(metrics.get("size_mb")))}</td>')
    top = variant.headline
    if top is None:
        cells += ['<td class="num muted">no metric</td>', "<td></td>"]
    else:
        shown = _metric_value(top.name, top.value)
        if name_metric:
            shown = f'<span class="muted">{_e(_metric_label(top.name))}</span> {shown}'
        cells += [
            f'<td class="num" title="{_e(top.name)}">{shown}</td>',
            f'<td class="num{_sign_class(top.change)}">'
            + (
                _metric_change(top.name, top.change)
                if top.change is not None
                else '<span class="muted">vs reference</span>'
            )
            + "</td>",
        ]
    cosine, snr = variant.agreement("cosine"), variant.agreement("snr_db")
    cells += [
        f'<td class="num">{_cosine(cosine)}</td>',
        f'<td class="num">{_db(snr)}</td>',
    ]
    if classification:
        cells.append(_worst_class_cell(variant))
    for n in threads:
        value = variant.latency_ms(n)
        mark = " *" if n == variant.threads else ""
        cells.append(f'<td class="num">{_ms(value)}{mark}</td>')
    peak = variant.host_figure("memory_peak_mb")
    runtime = _float((metrics.get("memory") or {}).get("runtime_mb"))
    cells += [
        f'<td class="num" title="host peak resident memory at the declared input shape; '
        f'MNN accounts {_e("-" if runtime is None else f"{runtime:.1f}")} MB">'
        f"{'-' if peak is None else f'{peak:.1f}'}</td>",
        f'<td class="num" title="host: first inference after load">'
        f"{_ms(variant.host_figure('first_inference_ms'))}</td>",
    ]
    gates_row = (
        f'<tr class="gates-row {status_class}" id="gates-{_e(variant.model)}-'
        f'{_e(variant.variant)}"><td class="muted">gates</td>'
        f'<td colspan="{columns - 1}">{_gates(variant)}{_size_explained(metrics)}'
        f"{_host_sweep(variant)}</td></tr>"
    )
    return (
        f'<tr class="{status_class} has-gates" {row_id}>' + "".join(cells) + "</tr>\n" + gates_row
    )


def _worst_class_cell(variant: VariantData) -> str:
    rows = [r for r in variant.class_recall if _float(r.get("change")) is not None]
    if rows:
        worst_row = min(rows, key=lambda r: float(r["change"]))
        worst: float | None = float(worst_row["change"])
        name = worst_row.get("class")
    else:
        drop = variant.metric("class_recall_drop")
        worst, name = (None if drop is None else -drop + 0.0), None
    text = _points(worst)
    if worst is not None and worst < 0 and name is not None:
        text += f' <span class="muted">(class {_e(name)})</span>'
    return f'<td class="num{_sign_class(worst)}">{text}</td>'


def _recipe_text(variant: VariantData) -> str:
    quant = variant.quantization
    mode = quant.get("mode", "none")
    if mode == "int8":
        text = f"int8 {quant.get('method', '')}"
        chosen = (variant.metrics or {}).get("quantization") or {}
        if isinstance(chosen, dict) and chosen.get("method"):
            if chosen["method"] != quant.get("method"):
                text += f" → {chosen['method']}"
            skipped = chosen.get("skip_ops") or []
            if skipped:
                text += f", {len(skipped)} op(s) in float"
            runs = chosen.get("quantizer_runs")
            if isinstance(runs, int) and runs > 1:
                text += f", {runs} quantizer runs"
    elif mode == "weight":
        text = f"weight-only {quant.get('bits', '')}-bit"
    else:
        text = variant.precision
    return f"{text}, {variant.threads} thr"


def _host_sweep(variant: VariantData) -> str:
    """The host thread sweep under the gates, said to be the build host's (never shipped)."""
    if not variant.host_threads:
        return ""
    return f'<div class="muted host-sweep">{_e(describe_sweep(variant.host_threads))}</div>'


def _size_explained(metrics: dict[str, Any]) -> str:
    """The artifact's largest ops by bytes, and the build's note when one dominates."""
    size = metrics.get("size")
    if not isinstance(size, dict) or not isinstance(size.get("largest"), list):
        return ""
    parts = []
    for row in size["largest"][:3]:
        if not isinstance(row, dict):
            continue
        kind = f", {row['kind']}" if row.get("kind") else ""
        share = _float(row.get("share")) or 0.0
        parts.append(f"{row.get('op')} ({row.get('type')}{kind}) {share * 100:.0f} %")
    weights, total = _float(size.get("weights_bytes")), _float(size.get("artifact_bytes"))
    split = f"weights {weights / total * 100:.0f} % of the file; " if weights and total else ""
    note = size.get("note")
    shown = (
        f'<div class="size-explained muted">bytes: {_e(split)}largest: {_e("; ".join(parts))}</div>'
    )
    if isinstance(note, str) and note:
        shown += f'<div class="size-note hint">{_e(note)}</div>'
    return shown


def _gates(variant: VariantData) -> str:
    gates = variant.gates
    if not gates:
        return '<span class="muted">none</span>'
    order = ("size", "cosine", "snr", "abs_error", "metric", "drop", "latency", "memory")
    return " ".join(_gate(gate) for gate in sorted(gates, key=lambda g: order.index(g.kind)))


def _gate(gate: Gate) -> str:
    css = "pass" if gate.passed else "fail"
    label = _gate_label(gate)
    detail = ""
    if gate.measured is not None:
        detail = _gate_number(gate, gate.measured)
        if gate.budget is not None:
            if gate.bound == "min":
                relation = "≥" if gate.passed else "<"
            else:
                relation = "≤" if gate.passed else ">"
            detail += f" {relation} {_gate_number(gate, gate.budget)}"
    return (
        f'<span class="gate {css}" title="{_e(gate.name)}">{_e(label)} '
        f'<span class="muted">{_e(detail)}</span></span>'
    )


def _gate_label(gate: Gate) -> str:
    if gate.kind == "size":
        return "size"
    if gate.kind == "memory":
        return "peak memory"
    if gate.kind == "latency":
        return "first call" if gate.name == "max_first_inference_ms" else "p50"
    if gate.kind in ("cosine", "snr", "abs_error"):
        what = {"cosine": "cosine", "snr": "SNR", "abs_error": "abs error"}[gate.kind]
        return f"{what}[{gate.metric}]"
    label = _metric_label(gate.metric)
    if gate.kind == "drop":
        return f"{label} drop"
    if gate.name.endswith("_baseline"):
        return f"{label} of the ONNX baseline"
    return label


def _gate_number(gate: Gate, value: float) -> str:
    if gate.kind == "size":
        return _size(value)
    if gate.kind == "latency":
        return f"{_ms(value)} ms"
    if gate.kind == "memory":
        return f"{value:.1f} MB"
    if gate.kind == "snr":
        return f"{_db(value)} dB"
    if gate.kind == "cosine":
        return _cosine(value)
    if (gate.kind == "drop" or gate.metric == "class_recall_drop") and (
        gate.metric in FRACTION_METRICS
    ):
        return f"{value * 100 + 0.0:.2f} pp"
    if gate.kind in ("metric", "drop"):
        return _metric_value(gate.metric, value)
    return f"{value:.3g}"


# --- charts --------------------------------------------------------------------------


def _tradeoff_chart(model: ModelData, tiers: Sequence[str]) -> str:
    """Size (x) against the headline metric (y); marker area grows with p50 latency."""
    names = model.headline_names
    metric = names[0] if names else "cosine"
    points = []
    for variant in model.variants:
        metrics = variant.metrics
        top = variant.headline
        if metrics is None or top is None or top.name != metric:
            continue
        size = _float(metrics.get("size_mb"))
        if size is None:
            continue
        points.append((variant, size, top.value, variant.latency_ms(variant.threads)))
    baseline_quality = model.baseline_headline()
    baseline_size = model.source_size / 1e6 if model.source_size else None
    width, height = 560, 330
    left, right, top_pad, bottom = 64, 24, 30, 48
    plot_w, plot_h = width - left - right, height - top_pad - bottom
    sizes = [p[1] for p in points] + ([baseline_size] if baseline_size else [])
    qualities = [p[2] for p in points] + (
        [baseline_quality] if baseline_quality is not None and baseline_size else []
    )
    chart_id = f"tradeoff-{_e(model.name)}"
    y_label = _metric_label(metric)
    if metric == "cosine":
        y_label = "worst output cosine vs ONNX Runtime"
    bounded = metric in FRACTION_METRICS or metric == "cosine"
    out = [
        "<figure>",
        f'<svg id="{chart_id}" class="chart tradeoff" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(model.name)}: size against {_e(y_label)}">',
    ]
    if not points:
        out += [
            f'<text x="{left}" y="{top_pad + 20}">no measurements</text>',
            "</svg>",
            "</figure>",
        ]
        return "\n".join(out)
    x_hi = max(sizes) * 1.12
    x_ticks = _nice_ticks(0.0, x_hi)
    x_hi = max(x_hi, x_ticks[-1])
    q_lo, q_hi = min(qualities), max(qualities)
    span = 0.02 if bounded else max(abs(q_hi) * 0.02, 1e-6)
    pad = max((q_hi - q_lo) * 0.2, span / 2)
    y_lo, y_hi = q_lo - pad, q_hi + pad
    if bounded:
        y_lo, y_hi = max(y_lo, 0.0), min(y_hi, 1.0)
        if y_hi - y_lo < span:
            y_lo = max(y_hi - span, 0.0)
    y_ticks = [t for t in _nice_ticks(y_lo, y_hi) if y_lo - 1e-12 <= t <= y_hi + 1e-12]

    def sx(value: float) -> float:
        return left + plot_w * value / x_hi

    def sy(value: float) -> float:
        return top_pad + plot_h * (1 - (value - y_lo) / (y_hi - y_lo))

    out.append('<g class="grid">')
    out += [
        f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
        for t in y_ticks
    ]
    out.append("</g>")
    out.append('<g class="axis x-axis">')
    axis_y = top_pad + plot_h
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{axis_y}" y2="{axis_y}"/>')
    for t in x_ticks:
        out.append(
            f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{axis_y}" y2="{axis_y + 4}"/>'
            f'<text x="{sx(t):.1f}" y="{axis_y + 17}" text-anchor="middle">'
            f"{_e(_tick(t, x_ticks))}</text>"
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 8}" text-anchor="middle">size (MB)</text>'
    )
    out.append("</g>")
    out.append('<g class="axis y-axis">')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top_pad}" y2="{axis_y}"/>')
    step = y_ticks[1] - y_ticks[0] if len(y_ticks) > 1 else 0.01
    for t in y_ticks:
        if metric in FRACTION_METRICS:
            decimals = max(0, min(4, -math.floor(math.log10(step * 100)))) if step else 1
            label = f"{t * 100:.{decimals}f}%"
        else:
            label = _tick(t, y_ticks)
        out.append(
            f'<line x1="{left - 4}" x2="{left}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
            f'<text x="{left - 7}" y="{sy(t) + 4:.1f}" text-anchor="end">{_e(label)}</text>'
        )
    out.append(
        f'<text transform="translate(14 {top_pad + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )
    out.append("</g>")
    latencies = [p[3] for p in points if p[3] is not None]
    slowest = max(latencies) if latencies else None
    bounds = (left, top_pad, left + plot_w, axis_y)
    # Markers never hide each other: one that would overlap an earlier one (or
    # the baseline diamond) moves to the nearest free spot, with a leader line
    # from the true position.
    placed: list[tuple[float, float, float]] = []
    baseline_at: tuple[float, float] | None = None
    if baseline_size and baseline_quality is not None:
        baseline_at = (sx(baseline_size), sy(baseline_quality))
        placed.append((*baseline_at, 7.0))
    markers = []
    for variant, size, quality, latency in points:
        radius = 5.0
        if latency is not None and slowest:
            radius = 5.0 + 13.0 * math.sqrt(latency / slowest)
        true_x, true_y = sx(size), sy(quality)
        cx, cy = _free_spot(true_x, true_y, radius, placed, bounds)
        placed.append((cx, cy, radius))
        markers.append((variant, size, quality, latency, true_x, true_y, cx, cy, radius))
    taken: list[Box] = [(x - r, y - r, x + r, y + r) for x, y, r in placed]
    labels: list[str] = []
    for variant, size, quality, latency, true_x, true_y, cx, cy, radius in markers:
        tooltip = (
            f"{variant.variant} ({variant.tier}): {_size(size)}, {y_label} "
            f"{_metric_value(metric, quality)}, p50 {_ms(latency)} ms at {variant.threads} threads"
        )
        failed = variant.status == FAILED
        if failed:
            tooltip += f"; failed: {variant.failed[0]}"
        if (cx, cy) != (true_x, true_y):
            out.append(
                f'<line class="leader" x1="{true_x:.1f}" y1="{true_y:.1f}" x2="{cx:.1f}" '
                f'y2="{cy:.1f}"/><circle class="true-position" cx="{true_x:.1f}" '
                f'cy="{true_y:.1f}" r="1.8"/>'
            )
            taken.append((true_x - 2, true_y - 2, true_x + 2, true_y + 2))
        css = "point failed" if failed else "point"
        out.append(
            f'<circle class="{css}" data-variant="{_e(variant.variant)}" cx="{cx:.1f}" '
            f'cy="{cy:.1f}" r="{radius:.1f}" fill="{_tier_color(tiers, variant.tier)}">'
            f"<title>{_e(tooltip)}</title></circle>"
        )
    labelled: list[tuple[str | None, bool, float, float, float]] = []
    if baseline_at is not None:
        bx, by = baseline_at
        out.append(
            f'<path class="baseline-point" '
            f'd="M{bx:.1f} {by - 7:.1f} L{bx + 7:.1f} {by:.1f} L{bx:.1f} {by + 7:.1f} '
            f'L{bx - 7:.1f} {by:.1f} Z"><title>ONNX baseline: {_size(baseline_size)}'
            f"</title></path>"
        )
        labelled.append((None, False, bx, by, 7.0))
    for variant, *_, cx, cy, radius in markers:
        labelled.append((variant.variant, variant.status == FAILED, cx, cy, radius))
    for text, failed, cx, cy, radius in reversed(labelled):
        label = (text or "ONNX") + (" (failed)" if failed else "")
        own = (cx - radius, cy - radius, cx + radius, cy + radius)
        x, y, anchor = _place_label(label, cx, cy, radius, [b for b in taken if b != own])
        width_px = _text_width(label)
        left_edge = {"start": x, "end": x - width_px, "middle": x - width_px / 2}[anchor]
        taken.append((left_edge, y - 10, left_edge + width_px, y + 2))
        css = "label" if text else "label baseline-label"
        if failed:
            css += " failed"
        labels.append(
            f'<text class="{css}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{_e(label)}</text>'
        )
    out += reversed(labels)
    out += [
        "</svg>",
        f"<figcaption>{_e(model.name)}: size against {_e(y_label)}. Marker area grows with "
        "the host p50 latency at the variant's own thread count; colour is the tier; a dashed "
        "red ring failed a gate; the hollow diamond is the ONNX source. A marker that would "
        "hide another is moved aside, a line pointing at its true position.</figcaption>",
        "</figure>",
    ]
    return "\n".join(out)


def _free_spot(
    x: float,
    y: float,
    radius: float,
    placed: Sequence[tuple[float, float, float]],
    bounds: tuple[float, float, float, float],
) -> tuple[float, float]:
    """``(x, y)`` if a circle there overlaps none placed, else the nearest free centre."""

    def free(cx: float, cy: float) -> bool:
        return all(math.hypot(cx - px, cy - py) >= radius + pr + 1.0 for px, py, pr in placed)

    if free(x, y):
        return x, y
    left, top, right, bottom = bounds
    for ring in range(1, 40):
        distance = ring * 3.0
        for step in range(24):
            # Straight down first: a lower marker reads as "worse", not "better".
            angle = math.pi / 2 + step * math.pi / 12
            cx, cy = x + distance * math.cos(angle), y + distance * math.sin(angle)
            inside = left + radius <= cx <= right - radius and top + radius <= cy <= bottom - radius
            if inside and free(cx, cy):
                return cx, cy
    return x, y


Box = tuple[float, float, float, float]


def _text_width(text: str) -> float:
    """Rough width in pixels of 11 px sans-serif text."""
    return 6.5 * len(text) + 2


def _place_label(
    text: str, cx: float, cy: float, radius: float, taken: list[Box]
) -> tuple[float, float, str]:
    """Where a marker's label goes: the first free spot around it, else the least crowded."""
    width = _text_width(text)
    r = radius
    d = radius * 0.75  # diagonal offset
    spots: list[tuple[float, float, str]] = [
        (cx + r + 4, cy + 4, "start"),
        (cx - r - 4, cy + 4, "end"),
        (cx, cy - r - 5, "middle"),
        (cx, cy + r + 13, "middle"),
        (cx + d + 3, cy - d - 3, "start"),
        (cx + d + 3, cy + d + 11, "start"),
        (cx - d - 3, cy - d - 3, "end"),
        (cx - d - 3, cy + d + 11, "end"),
    ]

    def box(spot: tuple[float, float, str]) -> Box:
        x, y, anchor = spot
        left = {"start": x, "end": x - width, "middle": x - width / 2}[anchor]
        return (left, y - 10, left + width, y + 2)

    def crowding(spot: tuple[float, float, str]) -> float:
        mine = box(spot)
        return sum(
            max(0.0, min(mine[2], o[2]) - max(mine[0], o[0]))
            * max(0.0, min(mine[3], o[3]) - max(mine[1], o[1]))
            for o in taken
        )

    for spot in spots:
        if not any(_overlap(box(spot), other) for other in taken):
            return spot
    return min(spots, key=crowding)


def _overlap(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _recall_chart(model: ModelData, variant: VariantData) -> str:
    """Horizontal bars of per-class recall change; losses in red."""
    rows = [r for r in variant.class_recall if _float(r.get("change")) is not None]
    chart_id = f"recall-{_e(model.name)}-{_e(variant.variant)}"
    caption = f"{_e(variant.variant)} ({_e(variant.tier)})"
    if not rows:
        note = "no per-class recall"
        drop = variant.metric("class_recall_drop")
        if variant.status == FAILED:
            # A failed build keeps metrics.json only, which has the worst drop.
            note = "failed: per-class recall not kept"
            if drop is not None:
                note += f"; worst class {_points(-drop + 0.0)}"
        return (
            f'<figure><svg id="{chart_id}" class="chart recall" width="300" height="40" '
            'viewBox="0 0 300 40">'
            f'<text x="4" y="24">{_e(note)}</text></svg>'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    shown = rows
    if len(rows) > MAX_RECALL_BARS:
        shown = sorted(rows, key=lambda r: float(r["change"]))[:MAX_RECALL_BARS]
        caption += f": the {MAX_RECALL_BARS} worst of {len(rows)} classes"
    limits = (variant.budgets.get("metrics") or {}).get("class_recall_drop") or {}
    budget = _float(limits.get("max")) if isinstance(limits, dict) else None
    changes = [float(r["change"]) for r in shown]
    span = max([abs(c) for c in changes] + ([budget] if budget else []) + [0.01]) * 1.1
    label_w, bar_w, value_w, row_h, top = 72, 150, 64, 18, 22
    width = label_w + bar_w + value_w
    height = top + row_h * len(shown) + 22
    zero = label_w + bar_w / 2

    def sx(change: float) -> float:
        return zero + (bar_w / 2) * change / span

    out = [
        "<figure>",
        f'<svg id="{chart_id}" class="chart recall" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(variant.variant)}: recall change per class">',
        f'<text x="{label_w}" y="13" font-weight="600">{caption}</text>',
    ]
    for index, row in enumerate(shown):
        change = float(row["change"])
        y = top + index * row_h
        kind = "neg" if change < -1e-12 else "pos" if change > 1e-12 else "zero"
        x0, x1 = sorted((zero, sx(change)))
        bar_width = max(x1 - x0, 1.5)
        if kind == "zero":
            x0 = zero - 0.75
        title = (
            f"class {row.get('class')}: recall {_percent(_float(row.get('onnx')))} -> "
            f"{_percent(_float(row.get('variant')))} ({_points(change)})"
        )
        out.append(
            f'<g class="recall-row" data-class="{_e(row.get("class"))}">'
            f'<text x="{label_w - 6}" y="{y + 12}" text-anchor="end">'
            f"{_e(_clip(str(row.get('class')), 11))}</text>"
            f'<rect class="bar {kind}" x="{x0:.1f}" y="{y + 3}" width="{bar_width:.1f}" '
            f'height="{row_h - 6}"><title>{_e(title)}</title></rect>'
            f'<text x="{label_w + bar_w + 6}" y="{y + 12}" class="{kind}">'
            f"{_e(_points(change))}</text></g>"
        )
    bottom = top + row_h * len(shown)
    out.append(
        f'<line class="zero-line" x1="{zero}" x2="{zero}" y1="{top}" y2="{bottom}" '
        'stroke="#6b7280"/>'
    )
    if budget:
        bx = sx(-budget)
        out.append(
            f'<line class="budget" x1="{bx:.1f}" x2="{bx:.1f}" y1="{top - 2}" y2="{bottom + 2}">'
            f"<title>budget: at most {budget * 100:.2f} pp lost on any class</title></line>"
            f'<text x="{bx:.1f}" y="{bottom + 14}" text-anchor="middle" class="muted">'
            f"-{budget * 100:g} pp budget</text>"
        )
    out += ["</svg>", "</figure>"]
    return "\n".join(out)


# --- provenance ----------------------------------------------------------------------


def _provenance_table(model: ModelData, variants: Sequence[VariantData]) -> str:
    def prov(v: VariantData, *keys: str) -> Any:
        node: Any = v.provenance or {}
        for key in keys:
            node = node.get(key) if isinstance(node, dict) else None
        return node

    def code(value: Any) -> str:
        return "-" if value in (None, "") else f"<code>{_e(value)}</code>"

    def dataset(v: VariantData, key: str) -> str:
        info = prov(v, key)
        if not isinstance(info, dict):
            return "-"
        parts = [code(info.get("path")), code(info.get("sha256"))]
        extra = []
        if info.get("samples") is not None:
            extra.append(f"{_e(info['samples'])} samples")
        if info.get("balanced"):
            extra.append("class-balanced")
        if info.get("selected_sha256"):
            extra.append(f"selected {code(info['selected_sha256'])}")
        if extra:
            parts.append(", ".join(extra))
        return "<br>".join(parts)

    def toolchain(v: VariantData) -> str:
        tools = prov(v, "toolchain") or {}
        text = ", ".join(f"{k} {val}" for k, val in sorted(tools.items()))
        return _e(f"{text}; edgereg {prov(v, 'edgereg')}")

    def recipe(v: VariantData) -> str:
        recipe_data = prov(v, "recipe") or {}
        quant = recipe_data.get("quantization", {})
        runtime = prov(v, "runtime") or {}
        lines = [
            code(prov(v, "recipe_sha256")),
            _e(
                f"precision {recipe_data.get('precision', '-')}, quantization "
                + ", ".join(
                    f"{k}={val}"
                    for k, val in sorted(quant.items(), key=lambda kv: kv[0] != "mode")
                    if val not in (None, [], "")
                )
            ),
            _e(
                f"runtime: {runtime.get('threads', '-')} threads, backends "
                f"{' > '.join(runtime.get('backends', []))}, precision "
                f"{runtime.get('precision', '-')}"
            ),
        ]
        return "<br>".join(lines)

    rows: list[tuple[str, Iterable[str]]] = [
        ("artifact sha256", (code(prov(v, "artifact", "sha256")) for v in variants)),
        ("artifact bytes", (_e(prov(v, "artifact", "size") or "-") for v in variants)),
        (
            "source",
            (
                "<br>".join([code(prov(v, "source", "path")), code(prov(v, "source", "sha256"))])
                for v in variants
            ),
        ),
        ("calibration", (dataset(v, "calibration") for v in variants)),
        ("evaluation", (dataset(v, "evaluation") for v in variants)),
        ("toolchain", (toolchain(v) for v in variants)),
        ("min MNN runtime", (_e(prov(v, "min_mnn_runtime") or "-") for v in variants)),
        ("recipe", (recipe(v) for v in variants)),
        ("MNN uuid", (code(prov(v, "mnn_uuid")) for v in variants)),
        (
            "converter",
            (code(" ".join(map(str, prov(v, "converter_argv") or []))) for v in variants),
        ),
    ]
    out = [
        f'<table class="provenance" id="provenance-{_e(model.name)}">',
        "<thead><tr><th></th>"
        + "".join(f"<th>{_e(v.variant)} ({_e(v.tier)})</th>" for v in variants)
        + "</tr></thead>",
        "<tbody>",
    ]
    for label, cells in rows:
        out.append(f"<tr><th>{_e(label)}</th>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
    out += ["</tbody>", "</table>"]
    return "\n".join(out)


# --- numbers -------------------------------------------------------------------------


def _float(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _cosine(value: float | None) -> str:
    """A cosine that never rounds to 1 unless it is 1: 0.99839, 1 − 3e-08."""
    if value is None:
        return "-"
    if 0 < 1 - value < 1e-5:
        return f"1 − {1 - value:.0e}"
    return f"{value:.5f}"


def _db(value: float | None) -> str:
    if value is None:
        return "-"
    # metrics.json writes a perfect match (infinite SNR) as 999 dB.
    return "exact" if value >= 999 else f"{value:.1f}"


def _size(mb: float | None) -> str:
    if mb is None:
        return "-"
    if mb < 1:
        return f"{mb * 1000:.1f} KB"
    return f"{mb:.2f} MB"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.2%}"


def _points(value: float | None) -> str:
    if value is None:
        return "-"
    points = round(value * 100, 2) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{points:+.2f} pp"


def _sign_class(value: float | None) -> str:
    if value is None or abs(value) < 5e-5:
        return ""
    return " neg" if value < 0 else " pos"


def _ms(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if value < 10 else f"{value:.1f}"


def _clip(text: str, length: int) -> str:
    return text if len(text) <= length else text[: length - 1] + "…"


def _nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / count
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    start = math.floor(lo / step) * step
    ticks = []
    value = start
    while value <= hi + step * 0.5:
        ticks.append(round(value, 12))
        value += step
    return ticks


def _tick(value: float, ticks: Sequence[float]) -> str:
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step)) + (0 if step >= 1 else 1)) if step else 0
    return f"{value:.{min(decimals, 6)}f}"
