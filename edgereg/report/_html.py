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

from edgereg.build.outputs import BUILT, NOT_BUILT, STALE
from edgereg.report._data import ModelData, ReportData, VariantData

#: Tier colours, in tier order (best first).
PALETTE = ("#2563eb", "#059669", "#d97706", "#7c3aed", "#0891b2", "#db2777", "#65a30d")
#: A recall chart with more classes shows the worst ones only.
MAX_RECALL_BARS = 20

GATE_LABELS = {
    "max_size_mb": "size",
    "max_abs_error": "abs error",
    "max_accuracy_drop": "acc. drop",
    "max_class_recall_drop": "recall drop",
    "max_latency_p50_ms": "p50",
}

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
table { border-collapse: collapse; margin: 8px 0; }
th, td { padding: 5px 10px; border-bottom: 1px solid var(--line); text-align: left;
  vertical-align: top; }
th { font-weight: 600; background: var(--bg-alt); }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.num { white-space: nowrap; }
tr.baseline td { color: var(--muted); font-style: italic; }
tr.not-built td, tr.unreadable td { color: var(--muted); }
.neg { color: var(--bad); }
.pos { color: var(--good); }
.badge { display: inline-block; padding: 1px 7px; border-radius: 9px; font-size: 12px;
  white-space: nowrap; }
.status-built { background: #d1fae5; color: #065f46; }
.status-stale { background: #fef3c7; color: #92400e; }
.status-not-built, .status-unreadable { background: #f3f4f6; color: #4b5563; }
.gate { display: inline-block; margin: 0 6px 2px 0; font-size: 12px; white-space: nowrap; }
.gate.pass::before { content: "\\2713 "; color: var(--good); font-weight: 700; }
.gate.fail::before { content: "\\2717 "; color: var(--bad); font-weight: 700; }
.tier-dot { display: inline-block; width: 10px; height: 10px; border-radius: 50%;
  margin-right: 6px; vertical-align: baseline; }
.charts { display: flex; flex-wrap: wrap; gap: 16px 28px; align-items: flex-start; }
figure { margin: 0; }
figcaption { color: var(--muted); font-size: 12px; max-width: 560px; }
svg text { font: 11px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; fill: #374151; }
svg .axis line, svg .axis path { stroke: #9ca3af; }
svg .grid line { stroke: #f0f0f0; }
svg .bar.neg { fill: var(--bad); }
svg .bar.pos { fill: var(--good); }
svg .bar.zero { fill: #9ca3af; }
svg .budget { stroke: var(--warn); stroke-dasharray: 4 3; }
svg .point { fill-opacity: 0.75; stroke: #fff; stroke-width: 1.5; }
svg .baseline-point { fill: none; stroke: #111827; stroke-width: 1.5; }
.recall-grid { display: flex; flex-wrap: wrap; gap: 12px 24px; }
.notice { padding: 10px 14px; background: #fffbeb; border-left: 4px solid #f59e0b; margin: 12px 0; }
table.provenance td { max-width: 340px; }
table.variants td:first-child { min-width: 150px; }
table.provenance code { word-break: break-all; }
"""


def render_html(report: ReportData) -> str:
    """The whole report page for ``report``."""
    built = sum(v.built for m in report.models for v in m.variants)
    total = sum(len(m.variants) for m in report.models)
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
        f"<span>{built} of {total} variants built</span>",
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
    elif built == 0:
        parts.append(
            '<p class="notice">Nothing is built yet: run <code>dvc repro</code> '
            "(or <code>edgereg build MODEL VARIANT</code>), then <code>edgereg report</code> "
            "again.</p>"
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
        '<footer class="muted"><p>Δ: change against the fp32 ONNX Runtime baseline on the '
        "evaluation set (percentage points). Latency: host p50 in ms, not a device measurement; "
        "* marks the variant's own thread count."
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
    built = [v for v in model.variants if v.built]
    meta = [f"version {_e(model.version)}", _e(model.task)]
    if model.description:
        meta.append(_e(model.description))
    parts = [
        f'<section class="model" id="model-{_e(model.name)}">',
        f"<h2>{_e(model.name)}</h2>",
        '<p class="meta">' + "".join(f"<span>{m}</span>" for m in meta) + "</p>",
        "<h3>Variants</h3>",
        _variant_table(model, tiers),
    ]
    if built:
        parts += [
            '<div class="charts">',
            _tradeoff_chart(model, tiers),
            "</div>",
        ]
        if model.task == "classification":
            parts += [
                "<h3>Per-class recall change against the ONNX baseline</h3>",
                '<div class="recall-grid">',
                *(_recall_chart(model, v) for v in built),
                "</div>",
            ]
        parts += ["<h3>Provenance</h3>", _provenance_table(model, built)]
    parts.append("</section>")
    return "\n".join(parts)


def _variant_table(model: ModelData, tiers: Sequence[str]) -> str:
    threads = sorted({n for v in model.variants for n in v.thread_counts}) or [1, 2, 4]
    classification = model.task == "classification"
    head = ["variant", "tier", "status", "size"]
    head += ["accuracy", "Δ accuracy", "worst class Δ recall"] if classification else []
    head += ["mean cosine"] if not classification else []
    head += [f"p50 ms @{n} thr" for n in threads]
    head += ["gates"]
    numeric = {"size", "accuracy", "Δ accuracy", "worst class Δ recall", "mean cosine"}
    numeric |= {f"p50 ms @{n} thr" for n in threads}
    rows = [
        f'<table class="variants" id="variants-{_e(model.name)}">',
        "<thead><tr>"
        + "".join(
            f'<th class="num">{_e(h)}</th>' if h in numeric else f"<th>{_e(h)}</th>" for h in head
        )
        + "</tr></thead>",
        "<tbody>",
    ]
    baseline = _baseline_accuracy(model)
    cells = [
        "<td>ONNX baseline</td>",
        "<td></td>",
        "<td>source</td>",
        f'<td class="num">{_size(model.source_size / 1e6) if model.source_size else "-"}</td>',
    ]
    if classification:
        cells += [f'<td class="num">{_percent(baseline)}</td>', "<td></td>", "<td></td>"]
    else:
        cells += ['<td class="num">1</td>']
    cells += ["<td></td>" for _ in threads] + [f"<td><code>{_e(model.source_path)}</code></td>"]
    rows.append('<tr class="baseline">' + "".join(cells) + "</tr>")
    for variant in model.variants:
        rows.append(_variant_row(variant, tiers, threads, classification))
    rows += ["</tbody>", "</table>"]
    return "\n".join(rows)


def _variant_row(
    variant: VariantData, tiers: Sequence[str], threads: Sequence[int], classification: bool
) -> str:
    status_class = variant.status.replace(" ", "-")
    dot = f'<span class="tier-dot" style="background:{_tier_color(tiers, variant.tier)}"></span>'
    title = {
        BUILT: "built from the recipe models.toml declares",
        STALE: "models.toml changed since this build: run dvc repro",
        NOT_BUILT: f"no outputs in {variant.out_dir}: run dvc repro",
    }.get(variant.status, variant.problem or "")
    cells = [
        f"<td><b>{_e(variant.variant)}</b><br>"
        f'<span class="muted">{_e(_recipe_text(variant))}</span></td>',
        f"<td>{dot}{_e(variant.tier)}</td>",
        f'<td><span class="badge status-{status_class}" title="{_e(title)}">'
        f"{_e(variant.status)}</span></td>",
    ]
    metrics = variant.metrics
    if metrics is None:
        span = (3 if classification else 1) + len(threads) + 2
        hint = (
            f"run <code>dvc repro</code> or <code>edgereg build {_e(variant.model)} "
            f"{_e(variant.variant)}</code>"
            if variant.status == NOT_BUILT
            else _e(variant.problem or "")
        )
        cells.append(f'<td colspan="{span}">{hint}</td>')
        return (
            f'<tr class="{status_class}" id="row-{_e(variant.model)}-{_e(variant.variant)}">'
            + "".join(cells)
            + "</tr>"
        )
    cells.append(f'<td class="num">{_size(_float(metrics.get("size_mb")))}</td>')
    if classification:
        accuracy = metrics.get("accuracy", {})
        recall = metrics.get("class_recall", {})
        worst = _float(recall.get("worst_change"))
        worst_text = _points(worst)
        if worst is not None and worst < 0 and recall.get("worst_class") is not None:
            worst_text += f' <span class="muted">(class {_e(recall["worst_class"])})</span>'
        cells += [
            f'<td class="num">{_percent(_float(accuracy.get("variant")))}</td>',
            f'<td class="num{_sign_class(_float(accuracy.get("change")))}">'
            f"{_points(_float(accuracy.get('change')))}</td>",
            f'<td class="num{_sign_class(worst)}">{worst_text}</td>',
        ]
    else:
        cosine = _float(metrics.get("verify", {}).get("mean_cosine"))
        cells.append(f'<td class="num">{"-" if cosine is None else f"{cosine:.5f}"}</td>')
    for n in threads:
        value = variant.latency_ms(n)
        mark = " *" if n == variant.threads else ""
        cells.append(f'<td class="num">{_ms(value)}{mark}</td>')
    cells.append(f"<td>{_gates(variant)}</td>")
    return (
        f'<tr class="{status_class}" id="row-{_e(variant.model)}-{_e(variant.variant)}">'
        + "".join(cells)
        + "</tr>"
    )


def _recipe_text(variant: VariantData) -> str:
    quant = variant.quantization
    mode = quant.get("mode", "none")
    if mode == "int8":
        text = f"int8 {quant.get('method', '')}"
    elif mode == "weight":
        text = f"weight-only {quant.get('bits', '')}-bit"
    else:
        text = variant.precision
    return f"{text}, {variant.threads} thr"


def _gates(variant: VariantData) -> str:
    metrics = variant.metrics or {}
    results: dict[str, Any] = metrics.get("gates", {})
    budgets = variant.budgets
    measured = {
        "max_size_mb": _float(metrics.get("size_mb")),
        "max_abs_error": _float(metrics.get("verify", {}).get("max_abs_error")),
        "max_accuracy_drop": _negate(_float(metrics.get("accuracy", {}).get("change"))),
        "max_class_recall_drop": _negate(
            _float(metrics.get("class_recall", {}).get("worst_change"))
        ),
        "max_latency_p50_ms": variant.latency_ms(variant.threads),
    }
    if not results:
        return '<span class="muted">none</span>'
    spans = []
    for name, passed in results.items():
        label = GATE_LABELS.get(name, name)
        value, budget = measured.get(name), _float(budgets.get(name))
        detail = ""
        if value is not None and budget is not None:
            detail = f"{_gate_value(name, value)} ≤ {_gate_value(name, budget)}"
        css = "pass" if passed else "fail"
        spans.append(
            f'<span class="gate {css}" title="{_e(name)}">{_e(label)} '
            f'<span class="muted">{_e(detail)}</span></span>'
        )
    return "<br>".join(spans)


def _gate_value(name: str, value: float) -> str:
    if name == "max_size_mb":
        return _size(value)
    if name in ("max_accuracy_drop", "max_class_recall_drop"):
        return f"{value * 100:.2f} pp"
    if name == "max_latency_p50_ms":
        return f"{_ms(value)} ms"
    return f"{value:.3g}"


def _baseline_accuracy(model: ModelData) -> float | None:
    for variant in model.variants:
        value = _float((variant.metrics or {}).get("accuracy", {}).get("onnx"))
        if value is not None:
            return value
    return None


# --- charts --------------------------------------------------------------------------


def _tradeoff_chart(model: ModelData, tiers: Sequence[str]) -> str:
    """Size (x) against accuracy (y); marker area grows with p50 latency."""
    classification = model.task == "classification"
    points = []
    for variant in model.variants:
        metrics = variant.metrics
        if metrics is None:
            continue
        size = _float(metrics.get("size_mb"))
        if classification:
            quality = _float(metrics.get("accuracy", {}).get("variant"))
        else:
            quality = _float(metrics.get("verify", {}).get("mean_cosine"))
        if size is None or quality is None:
            continue
        points.append((variant, size, quality, variant.latency_ms(variant.threads)))
    baseline_quality = _baseline_accuracy(model) if classification else 1.0
    baseline_size = model.source_size / 1e6 if model.source_size else None
    width, height = 560, 330
    left, right, top, bottom = 64, 24, 30, 48
    plot_w, plot_h = width - left - right, height - top - bottom
    sizes = [p[1] for p in points] + ([baseline_size] if baseline_size else [])
    qualities = [p[2] for p in points] + (
        [baseline_quality] if baseline_quality is not None and baseline_size else []
    )
    chart_id = f"tradeoff-{_e(model.name)}"
    y_label = "accuracy" if classification else "mean cosine vs ONNX Runtime"
    out = [
        "<figure>",
        f'<svg id="{chart_id}" class="chart tradeoff" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="{_e(model.name)}: size against {_e(y_label)}">',
    ]
    if not sizes:
        out += [f'<text x="{left}" y="{top + 20}">no measurements</text>', "</svg>", "</figure>"]
        return "\n".join(out)
    x_hi = max(sizes) * 1.12
    x_ticks = _nice_ticks(0.0, x_hi)
    x_hi = max(x_hi, x_ticks[-1])
    q_lo, q_hi = min(qualities), max(qualities)
    pad = max((q_hi - q_lo) * 0.2, 0.01)
    y_lo, y_hi = max(q_lo - pad, 0.0), min(q_hi + pad, 1.0)
    if y_hi - y_lo < 0.02:
        y_lo = max(y_hi - 0.02, 0.0)
    y_ticks = [t for t in _nice_ticks(y_lo, y_hi) if y_lo - 1e-12 <= t <= y_hi + 1e-12]

    def sx(value: float) -> float:
        return left + plot_w * value / x_hi

    def sy(value: float) -> float:
        return top + plot_h * (1 - (value - y_lo) / (y_hi - y_lo))

    out.append('<g class="grid">')
    out += [
        f'<line x1="{left}" x2="{left + plot_w}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
        for t in y_ticks
    ]
    out.append("</g>")
    out.append('<g class="axis x-axis">')
    out.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{top + plot_h}" y2="{top + plot_h}"/>')
    for t in x_ticks:
        out.append(
            f'<line x1="{sx(t):.1f}" x2="{sx(t):.1f}" y1="{top + plot_h}" y2="{top + plot_h + 4}"/>'
            f'<text x="{sx(t):.1f}" y="{top + plot_h + 17}" text-anchor="middle">'
            f"{_e(_tick(t, x_ticks))}</text>"
        )
    out.append(
        f'<text x="{left + plot_w / 2:.1f}" y="{height - 8}" text-anchor="middle">size (MB)</text>'
    )
    out.append("</g>")
    out.append('<g class="axis y-axis">')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{top + plot_h}"/>')
    for t in y_ticks:
        label = f"{t * 100:.1f}%" if classification else f"{t:.3f}"
        out.append(
            f'<line x1="{left - 4}" x2="{left}" y1="{sy(t):.1f}" y2="{sy(t):.1f}"/>'
            f'<text x="{left - 7}" y="{sy(t) + 4:.1f}" text-anchor="end">{_e(label)}</text>'
        )
    out.append(
        f'<text transform="translate(14 {top + plot_h / 2:.1f}) rotate(-90)" '
        f'text-anchor="middle">{_e(y_label)}</text>'
    )
    out.append("</g>")
    latencies = [p[3] for p in points if p[3] is not None]
    slowest = max(latencies) if latencies else None
    markers = []
    for variant, size, quality, latency in points:
        radius = 5.0
        if latency is not None and slowest:
            radius = 5.0 + 13.0 * math.sqrt(latency / slowest)
        markers.append((variant, size, quality, latency, sx(size), sy(quality), radius))
    # Circles first, the baseline diamond over them, then the labels, each
    # placed where it hides no marker and no other label.
    taken: list[Box] = [(cx - r, cy - r, cx + r, cy + r) for *_, cx, cy, r in markers]
    labels: list[str] = []
    for variant, size, quality, latency, cx, cy, radius in markers:
        quality_text = f"{quality:.2%}" if classification else f"{quality:.5f}"
        tooltip = (
            f"{variant.variant} ({variant.tier}): {_size(size)}, {quality_text}, "
            f"p50 {_ms(latency)} ms at {variant.threads} threads"
        )
        out.append(
            f'<circle class="point" data-variant="{_e(variant.variant)}" cx="{cx:.1f}" '
            f'cy="{cy:.1f}" r="{radius:.1f}" fill="{_tier_color(tiers, variant.tier)}">'
            f"<title>{_e(tooltip)}</title></circle>"
        )
    markers_and_baseline: list[tuple[str | None, float, float, float]] = []
    if baseline_size and baseline_quality is not None:
        bx, by = sx(baseline_size), sy(baseline_quality)
        out.append(
            f'<path class="baseline-point" '
            f'd="M{bx:.1f} {by - 7:.1f} L{bx + 7:.1f} {by:.1f} L{bx:.1f} {by + 7:.1f} '
            f'L{bx - 7:.1f} {by:.1f} Z"><title>ONNX baseline: {_size(baseline_size)}'
            f"</title></path>"
        )
        taken.append((bx - 7, by - 7, bx + 7, by + 7))
        markers_and_baseline.append((None, bx, by, 7.0))
    for variant, *_, cx, cy, radius in markers:
        markers_and_baseline.append((variant.variant, cx, cy, radius))
    for text, cx, cy, radius in reversed(markers_and_baseline):
        label = text or "ONNX"
        own = (cx - radius, cy - radius, cx + radius, cy + radius)
        x, y, anchor = _place_label(label, cx, cy, radius, [b for b in taken if b != own])
        width_px = _text_width(label)
        left_edge = {"start": x, "end": x - width_px, "middle": x - width_px / 2}[anchor]
        taken.append((left_edge, y - 10, left_edge + width_px, y + 2))
        css = "label" if text else "label baseline-label"
        labels.append(
            f'<text class="{css}" x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}">{_e(label)}</text>'
        )
    out += reversed(labels)
    out += [
        "</svg>",
        f"<figcaption>{_e(model.name)}: size against {_e(y_label)}. Marker area grows with "
        "the host p50 latency at the variant's own thread count; colour is the tier; the "
        "hollow diamond is the ONNX source.</figcaption>",
        "</figure>",
    ]
    return "\n".join(out)


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
        return (
            f'<figure><svg id="{chart_id}" class="chart recall" width="260" height="40">'
            '<text x="4" y="24">no per-class recall</text></svg>'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    shown = rows
    if len(rows) > MAX_RECALL_BARS:
        shown = sorted(rows, key=lambda r: float(r["change"]))[:MAX_RECALL_BARS]
        caption += f": the {MAX_RECALL_BARS} worst of {len(rows)} classes"
    budget = _float(variant.budgets.get("max_class_recall_drop"))
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


def _negate(value: float | None) -> float | None:
    return None if value is None else -value + 0.0


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
