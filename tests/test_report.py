"""`edgereg report`: one self-contained HTML page that shows what the builds did.

The report of a tiny project built for real is checked as text, and rendered
in a real headless chromium: the charts are in the DOM and a screenshot is
saved to test-artifacts/.
"""

from __future__ import annotations

import html
import json
import math
import re
import shutil
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import browser
import buildkit
import click
import pytest
from buildkit import IMAGE_MODEL, TENSOR_MODEL, Project
from click.testing import CliRunner

from edgereg.build.outputs import CLASS_RECALL_PLOT, HOST_BENCHMARK
from edgereg.buildreport import (
    ModelData,
    ReportData,
    VariantData,
    collect,
    render_html,
    write_report,
)
from edgereg.cli.buildreport import report_command
from edgereg.errors import GateError

GENERATED = "2025-01-02 03:04 UTC"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The tiny two-model project with every variant built (shared: copy before changing)."""
    return buildkit.write_built_project(tmp_path_factory.mktemp("report"))


@pytest.fixture
def project(built: Project, tmp_path: Path) -> Project:
    """A private copy of the built project."""
    copy = Project(tmp_path / "project")
    shutil.copytree(built.root, copy.root)
    return copy


def report_of(project: Project) -> str:
    return render_html(collect(project.load(), project.out_root, generated=GENERATED))


class Tags(HTMLParser):
    """Collects start tags with their attributes, and checks that elements close."""

    VOID = frozenset({"meta", "br", "line", "circle", "rect", "path", "input", "img"})

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.open: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag in self.VOID:
            return
        assert self.open, f"</{tag}> closes nothing"
        assert self.open[-1] == tag, f"</{tag}> closes <{self.open[-1]}>"
        self.open.pop()

    def ids(self) -> set[str]:
        return {attrs["id"] or "" for _, attrs in self.tags if "id" in attrs}

    def with_class(self, tag: str, css: str) -> list[dict[str, str | None]]:
        return [
            attrs
            for name, attrs in self.tags
            if name == tag and css in (attrs.get("class") or "").split()
        ]


def parse(page: str) -> Tags:
    tags = Tags()
    tags.feed(page)
    tags.close()
    assert tags.open == [], f"unclosed elements: {tags.open}"
    return tags


def cells(page: str, row_id: str) -> list[str]:
    """The text of each cell of the table row with id ``row_id``, tags removed."""
    row = re.search(rf'<tr class="[^"]*" id="{re.escape(row_id)}">(.*?)</tr>', page, re.S)
    assert row, f"no row {row_id}"
    return [
        " ".join(html.unescape(re.sub(r"<[^>]+>", " ", cell)).split())
        for cell in re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    ]


def markers(page: str, chart_id: str) -> list[tuple[float, float, float]]:
    """Centre and radius of every variant circle and of the baseline diamond in a chart."""
    chart = page[page.index(f'id="{chart_id}"') :]
    chart = chart[: chart.index("</svg>")]
    found = [
        (float(x), float(y), float(r))
        for x, y, r in re.findall(
            r'<circle class="point[^"]*" data-variant="[^"]*" cx="([\d.]+)" cy="([\d.]+)" '
            r'r="([\d.]+)"',
            chart,
        )
    ]
    diamond = re.search(r'class="baseline-point" d="M([\d.]+) ([\d.]+) ', chart)
    if diamond:
        found.append((float(diamond[1]), float(diamond[2]) + 7, 7.0))
    return found


def assert_no_overlap(page: str, chart_id: str) -> None:
    shown = markers(page, chart_id)
    for i, (x1, y1, r1) in enumerate(shown):
        for x2, y2, r2 in shown[i + 1 :]:
            assert math.hypot(x1 - x2, y1 - y2) >= r1 + r2 - 0.2, f"markers overlap in {chart_id}"


def test_report_shows_every_variant_chart_and_provenance(built: Project) -> None:
    page = report_of(built)
    tags = parse(page)
    ids = tags.ids()
    for model, variants in buildkit.VARIANTS.items():
        assert {f"model-{model}", f"variants-{model}", f"tradeoff-{model}"} <= ids
        assert f"provenance-{model}" in ids
        assert_no_overlap(page, f"tradeoff-{model}")
        for variant in variants:
            assert {f"row-{model}-{variant}", f"gates-{model}-{variant}"} <= ids
            assert f"recall-{model}-{variant}" in ids
            provenance = json.loads(
                built.out_dir(model, variant).joinpath("provenance.json").read_text()
            )
            # Every artifact's digest, its inputs' digests and the recipe digest.
            assert provenance["artifact"]["sha256"] in page
            assert provenance["recipe_sha256"] in page
            assert provenance["source"]["sha256"] in page
            # Every measured number is shown: size, accuracy, its change, cosine,
            # SNR, worst class, latency at the variant's own thread count.
            row = cells(page, f"row-{model}-{variant}")
            assert "-" not in row[3:9], row
            assert any(cell.endswith(" *") and cell[0].isdigit() for cell in row), row
            metrics = json.loads(built.out_dir(model, variant).joinpath("metrics.json").read_text())
            assert row[4] == f"{metrics['metrics']['accuracy']:.2%}"
            snr = min(a["snr_db"] for a in metrics["agreement"].values())
            assert row[7] == f"{snr:.1f}"
    # One marker per built variant in each size/accuracy chart, plus the ONNX baseline.
    assert len(tags.with_class("circle", "point")) == 6
    assert len(tags.with_class("path", "baseline-point")) == 2
    # One bar per class in each recall chart.
    bars = tags.with_class("rect", "bar")
    classes = len(buildkit.IMAGE_CLASSES) * 3 + len(buildkit.TENSOR_CLASSES) * 3
    assert len(bars) == classes
    assert "6 of 6 variants built" in page
    assert page.count('class="badge status-built"') == 6
    # Latency at each benchmarked thread count; accuracy is the quality axis.
    assert "p50 ms @1 thr" in page
    assert 'aria-label="vision: size against accuracy"' in page
    # Gates against the budgets they were checked on: models.toml's, and the
    # defaults for each precision where models.toml sets none.
    gates = page[page.index('id="gates-vision-int8"') :]
    gates = gates[: gates.index("</tr>")]
    assert re.search(
        r'class="gate pass" title="max_size_mb">size <span class="muted">7\.\d KB', gates
    )
    assert "≤ 1.00 MB" in gates
    assert re.search(r"cosine\[logits\] <span[^>]*>0\.\d{5} ≥ 0\.98000<", gates)
    assert re.search(r"SNR\[logits\] <span[^>]*>[\d.]+ dB ≥ 13\.0 dB<", gates)
    assert 'accuracy drop <span class="muted">0.00 pp ≤ 25.00 pp' in gates
    assert 'top-1 agreement <span class="muted">100.00% ≥ 95.00%' in gates
    fp32_gates = page[page.index('id="gates-vision-fp32"') :]
    assert "≥ 0.99990" in fp32_gates[: fp32_gates.index("</tr>")]


def test_report_is_self_contained(built: Project) -> None:
    page = report_of(built)
    lowered = page.lower()
    for needle in ("http://", "https://", "<script", "<link", "@import", "url(", " src="):
        assert needle not in lowered, f"the report references something outside it: {needle}"
    assert "default-src 'none'" in page


def test_a_damaged_class_stands_out(project: Project) -> None:
    recall_path = project.out_dir(IMAGE_MODEL, "int8") / CLASS_RECALL_PLOT
    rows = json.loads(recall_path.read_text())
    damaged = buildkit.IMAGE_CLASSES[-1]
    for row in rows:
        if row["class"] == damaged:
            row["variant"] = row["onnx"] - 0.375
            row["change"] = -0.375
    recall_path.write_text(json.dumps(rows))

    page = report_of(project)
    parse(page)
    chart = page[page.index(f'id="recall-{IMAGE_MODEL}-int8"') :]
    chart = chart[: chart.index("</svg>")]
    # Exactly the damaged class is drawn as a loss, and its value is printed.
    losses = re.findall(r'data-class="([^"]+)"><text[^>]*>[^<]*</text><rect class="bar neg"', chart)
    assert losses == [damaged]
    assert "-37.50 pp" in chart
    assert chart.count('class="bar neg"') == 1
    # The other charts show no loss.
    assert page.count('class="bar neg"') == 1


def test_missing_and_stale_builds_are_shown_as_such(project: Project) -> None:
    shutil.rmtree(project.out_dir(TENSOR_MODEL, "w8"))
    project.edit_table(f"models.{IMAGE_MODEL}.variants.w8", "threads = 1", "threads = 2")
    page = report_of(project)
    row = re.search(rf'<tr class="not-built" id="row-{TENSOR_MODEL}-w8">(.*?)</tr>', page, re.S)
    assert row, "no not-built row"
    assert "not built" in row.group(1)
    assert f"edgereg build {TENSOR_MODEL} w8" in row.group(1)
    assert re.search(rf'<tr class="stale has-gates" id="row-{IMAGE_MODEL}-w8">', page)
    assert "5 of 6 variants built" in page
    assert f'id="recall-{TENSOR_MODEL}-w8"' not in page


def test_everything_from_files_is_escaped(project: Project) -> None:
    project.edit(
        'task = "classification"\nsource = { path = "data/vision.onnx"',
        'task = "classification"\ndescription = "<script>alert(\'x\')</script> & \\"quotes\\""\n'
        'source = { path = "data/vision.onnx"',
    )
    recall_path = project.out_dir(TENSOR_MODEL, "int8") / CLASS_RECALL_PLOT
    rows = json.loads(recall_path.read_text())
    rows[0]["class"] = '<img src=x onerror="alert(1)">'
    recall_path.write_text(json.dumps(rows))
    page = report_of(project)
    assert "<script>" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;quotes&quot;" in page
    assert "<img" not in page
    assert 'data-class="&lt;img src=x onerror=&quot;alert(1)&quot;&gt;"' in page
    parse(page)


def test_no_models_and_no_builds_say_what_to_run(project: Project, tmp_path: Path) -> None:
    nothing = render_html(collect(project.load(), tmp_path / "no-build", generated=GENERATED))
    assert "Nothing is built yet" in nothing
    assert "dvc repro" in nothing
    assert "tradeoff-" not in nothing
    parse(nothing)

    text = project.toml()
    project.config_path.write_text(text[: text.index("[models.vision]")], encoding="utf-8")
    empty = report_of(project)
    assert "No models in models.toml yet" in empty
    assert "edgereg add" in empty
    parse(empty)


@pytest.fixture(scope="module")
def with_failure(built: Project, tmp_path_factory: pytest.TempPathFactory) -> Project:
    """The built project with vision/int8 rebuilt against an SNR budget it cannot reach."""
    copy = Project(tmp_path_factory.mktemp("failed") / "project")
    shutil.copytree(built.root, copy.root)
    copy.edit_table(
        f"models.{IMAGE_MODEL}.variants.int8",
        "runtime = { threads = 2 }",
        "runtime = { threads = 2 }\nbudgets = { min_snr_db = 60.0 }",
    )
    home = copy.root / ".home"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        patch.setenv("XDG_CACHE_HOME", str(home / ".cache"))
        with pytest.raises(GateError, match=r"min_snr_db\[logits\] [\d.]+ < 60"):
            copy.build(IMAGE_MODEL, "int8")
    shutil.rmtree(home, ignore_errors=True)
    return copy


def test_a_failed_variant_keeps_its_numbers(with_failure: Project) -> None:
    metrics = json.loads(
        with_failure.out_dir(IMAGE_MODEL, "int8").joinpath("metrics.json").read_text()
    )
    assert metrics["status"] == "failed"
    page = report_of(with_failure)
    tags = parse(page)
    assert "5 of 6 variants built, 1 failed a gate" in page
    row = cells(page, f"row-{IMAGE_MODEL}-int8")
    assert row[2].startswith(f"failed failed: {metrics['failed'][0]}")
    assert "not built" not in row[2]
    # And what the build said to try next.
    assert metrics["hint"].splitlines()[0] in row[2]
    # All its numbers, as a built variant shows them.
    snr = metrics["agreement"]["logits"]["snr_db"]
    assert row[3] == f"{metrics['size_mb'] * 1000:.1f} KB"
    assert row[4] == f"{metrics['metrics']['accuracy']:.2%}"
    assert row[7] == f"{snr:.1f}"
    assert "-" not in row[3:9], row
    host = json.loads(
        with_failure.out_dir(IMAGE_MODEL, "int8").joinpath(HOST_BENCHMARK).read_text()
    )
    p50 = host["threads_2"]["p50_ms"]
    assert (f"{p50:.3f} *" if p50 < 10 else f"{p50:.1f} *") in row  # the report's rounding
    gates = page[page.index(f'id="gates-{IMAGE_MODEL}-int8"') :]
    gates = gates[: gates.index("</tr>")]
    assert re.search(
        rf'class="gate fail" title="min_snr_db\[logits\]">SNR\[logits\] '
        rf'<span class="muted">{snr:.1f} dB &lt; 60.0 dB<',
        gates,
    )
    assert gates.count('class="gate fail"') == 1
    # In the chart, marked as failed; no provenance, as nothing was kept.
    failed = [a for a in tags.with_class("circle", "failed") if a.get("data-variant") == "int8"]
    assert len(failed) == 1
    assert "int8 (failed)" in page
    provenance = page[page.index(f'id="provenance-{IMAGE_MODEL}"') :]
    assert "int8 (mid)" not in provenance[: provenance.index("</table>")]
    recall = page[page.index(f'id="recall-{IMAGE_MODEL}-int8"') :]
    assert (
        "failed: per-class recall not kept; worst class +0.00 pp"
        in recall[: recall.index("</svg>")]
    )
    assert_no_overlap(page, f"tradeoff-{IMAGE_MODEL}")


def _metrics(
    task: str,
    precision: str,
    *,
    cosine: float,
    snr: float,
    metrics: dict[str, float],
    baseline: dict[str, float] | None = None,
    gates: dict[str, bool],
    failed: list[str] | None = None,
) -> dict[str, Any]:
    """A metrics.json as edgereg.build.variant writes it."""
    return {
        "status": "failed" if failed else "passed",
        "task": task,
        "precision": precision,
        "size_mb": 0.8 if precision == "int8" else 2.9,
        "agreement": {
            "out": {"cosine": cosine, "snr_db": snr, "max_abs_error": 0.3, "min_sample_cosine": 0.5}
        },
        "metrics": metrics,
        "baseline": baseline or {},
        "gates": gates,
        "failed": failed or [],
    }


def _task_model(task: str, passed: dict[str, Any], failed: dict[str, Any]) -> ModelData:
    from edgereg.build.quality import effective_budgets
    from edgereg.config import Budgets

    def variant(name: str, precision: str, metrics: dict[str, Any]) -> VariantData:
        budgets = effective_budgets(task, precision, Budgets(max_size_mb=3.0))  # type: ignore[arg-type]
        return VariantData(
            model=task,
            variant=name,
            tier="high" if precision == "fp16" else "mid",
            status="failed" if metrics["status"] == "failed" else "built",
            threads=2,
            budgets=budgets.model_dump(),
            precision=precision if precision == "fp16" else "fp32",
            quantization={"mode": "int8", "method": "KL"}
            if precision == "int8"
            else {"mode": "none"},
            out_dir=f"build/{task}/{name}",
            task=task,
            precision_class=precision,
            metrics=metrics,
            provenance=None,
            latency=[{"threads": 2, "p50_ms": 0.9 if precision == "int8" else 3.5}],
        )

    return ModelData(
        name=task,
        version="1.0.0",
        task=task,
        description="",
        source_path=f"{task}.onnx",
        source_sha256="0" * 64,
        source_size=3_000_000,
        variants=[variant("fp16", "fp16", passed), variant("int8", "int8", failed)],
    )


#: Per task: a healthy fp16 and a broken int8 variant, the headline column's
#: title, the cells each row shows for it (value, change) and the baseline row's.
TASK_CASES = {
    "dense_map": (
        _metrics(
            "dense_map",
            "fp16",
            cosine=0.9991,
            snr=31.2,
            metrics={"iou": 0.97, "label_iou": 0.81},
            baseline={"label_iou": 0.83},
            gates={
                "max_size_mb": True,
                "min_cosine[out]": True,
                "min_snr_db[out]": True,
                "iou.min": True,
                "label_iou.max_drop": True,
            },
        ),
        _metrics(
            "dense_map",
            "int8",
            cosine=0.09,
            snr=0.4,
            metrics={"iou": 0.2, "label_iou": 0.15},
            baseline={"label_iou": 0.83},
            gates={
                "max_size_mb": True,
                "min_cosine[out]": False,
                "min_snr_db[out]": False,
                "iou.min": False,
                "label_iou.max_drop": False,
            },
            failed=[
                "min_cosine[out] 0.09 < 0.98",
                "min_snr_db[out] 0.4 < 13",
                "iou.min 0.2 < 0.85",
                "label_iou.max_drop 0.68 > 0.05 (label_iou 0.8300 (ONNX) -> 0.1500)",
            ],
        ),
        "IoU (labels)",
        [("81.00%", "-2.00 pp"), ("15.00%", "-68.00 pp")],
        "83.00%",
        [
            "IoU 20.00% < 85.00%",
            "IoU (labels) drop 68.00 pp > 5.00 pp",
            "cosine[out] 0.09000 < 0.98000",
        ],
    ),
    "ctc": (
        _metrics(
            "ctc",
            "fp16",
            cosine=0.9995,
            snr=33.0,
            metrics={
                "line_match": 0.98,
                "cer": 0.004,
                "label_line_accuracy": 0.95,
                "label_cer": 0.01,
            },
            baseline={"label_line_accuracy": 0.96, "label_cer": 0.009},
            gates={"line_match.min": True, "label_line_accuracy.max_drop": True},
        ),
        _metrics(
            "ctc",
            "int8",
            cosine=0.7,
            snr=4.0,
            metrics={"line_match": 0.0, "cer": 0.9, "label_line_accuracy": 0.0, "label_cer": 0.92},
            baseline={"label_line_accuracy": 0.96, "label_cer": 0.009},
            gates={"line_match.min": False, "label_line_accuracy.max_drop": False},
            failed=["line_match.min 0 < 0.85", "label_line_accuracy.max_drop 0.96 > 0.05"],
        ),
        "line accuracy",
        [("95.00%", "-1.00 pp"), ("0.00%", "-96.00 pp")],
        "96.00%",
        ["line match 0.00% < 85.00%", "line accuracy drop 96.00 pp > 5.00 pp"],
    ),
    "embedding": (
        _metrics(
            "embedding",
            "fp16",
            cosine=0.99999,
            snr=50.0,
            metrics={
                "embedding_cosine": 0.9999,
                "neighbour_agreement": 1.0,
                "neighbour_recall": 1.0,
            },
            gates={"neighbour_agreement.min": True},
        ),
        _metrics(
            "embedding",
            "int8",
            cosine=0.97,
            snr=12.0,
            metrics={"embedding_cosine": 0.9, "neighbour_agreement": 0.9, "neighbour_recall": 0.97},
            gates={"neighbour_agreement.min": False},
            failed=["neighbour_agreement.min 0.9 < 0.95"],
        ),
        "neighbour agreement",
        [("100.00%", "vs reference"), ("90.00%", "vs reference")],
        "100.00%",
        ["neighbour agreement 90.00% < 95.00%"],
    ),
    "frame_decision": (
        _metrics(
            "frame_decision",
            "fp16",
            cosine=0.9998,
            snr=35.0,
            metrics={"frame_agreement": 0.995, "f1": 0.88},
            baseline={"f1": 0.9},
            gates={"frame_agreement.min": True, "f1.max_drop": True},
        ),
        _metrics(
            "frame_decision",
            "int8",
            cosine=0.9,
            snr=8.0,
            metrics={"frame_agreement": 0.386, "f1": 0.04},
            baseline={"f1": 0.9},
            gates={"frame_agreement.min": False, "f1.max_drop": False},
            failed=["frame_agreement.min 0.386 < 0.95", "f1.max_drop 0.86 > 0.05"],
        ),
        "F1",
        [("88.00%", "-2.00 pp"), ("4.00%", "-86.00 pp")],
        "90.00%",
        ["frame agreement 38.60% < 95.00%", "F1 drop 86.00 pp > 5.00 pp"],
    ),
    "generic": (
        _metrics(
            "generic",
            "fp16",
            cosine=0.99999997,
            snr=62.0,
            metrics={},
            gates={"min_cosine[out]": True},
        ),
        _metrics(
            "generic",
            "int8",
            cosine=0.5,
            snr=2.0,
            metrics={},
            gates={"min_cosine[out]": False},
            failed=["min_cosine[out] 0.5 < 0.98"],
        ),
        "cosine",
        [("1 − 3e-08", "vs reference"), ("0.50000", "vs reference")],
        "1.00000",
        ["cosine[out] 0.50000 < 0.98000"],
    ),
    "custom": (
        _metrics(
            "custom",
            "fp16",
            cosine=0.9999,
            snr=40.0,
            metrics={"wer": 0.12},
            gates={"wer.max": True},
        ),
        _metrics(
            "custom",
            "int8",
            cosine=0.95,
            snr=11.0,
            metrics={"wer": 0.4},
            gates={"wer.max": False},
            failed=["wer.max 0.4 > 0.2"],
        ),
        "wer",
        [("0.12", "vs reference"), ("0.4", "vs reference")],
        "",
        # A custom evaluator's budget is known from the failure text only.
        ["wer 0.4 > 0.2"],
    ),
}


@pytest.mark.parametrize("task", list(TASK_CASES))
def test_every_task_shows_its_headline_metric_and_failures(task: str) -> None:
    passed, failed, column, values, baseline, failed_gates = TASK_CASES[task]
    model = _task_model(task, passed, failed)
    page = render_html(ReportData("models.toml", "build", GENERATED, {}, ["high", "mid"], [model]))
    tags = parse(page)
    header = page[page.index(f'id="variants-{task}"') :]
    assert f'<th class="num">{html.escape(column)}</th>' in header[: header.index("</thead>")]
    for name, (value, change) in zip(("fp16", "int8"), values, strict=True):
        row = cells(page, f"row-{task}-{name}")
        assert row[4:6] == [value, change], row
        assert "-" not in row[3:8], row
    assert cells(page, f"row-{task}-int8")[
        2
    ] == f"failed failed: {failed['failed'][0]} (and {len(failed['failed']) - 1} more)".replace(
        " (and 0 more)", ""
    )
    base = re.search(r'<tr class="baseline">(.*?)</tr>', page, re.S)
    assert base
    base_cells = [
        " ".join(re.sub(r"<[^>]+>", " ", c).split())
        for c in re.findall(r"<td[^>]*>(.*?)</td>", base[1], re.S)
    ]
    assert base_cells[4] == baseline
    gates = page[page.index(f'id="gates-{task}-int8"') :]
    gates = " ".join(html.unescape(re.sub(r"<[^>]+>", " ", gates[: gates.index("</tr>")])).split())
    for text in failed_gates:
        assert text in gates, gates
    # The headline metric is the quality axis; per-class recall is for classifiers.
    assert f'aria-label="{task}: size against ' in page
    assert len(tags.with_class("circle", "point")) == 2
    assert len(tags.with_class("circle", "failed")) == 1
    assert 'id="recall-' not in page
    assert "1 failed a gate" in page
    assert_no_overlap(page, f"tradeoff-{task}")


def test_many_classes_show_the_worst() -> None:
    model = _task_model(
        "classification",
        *[
            _metrics(
                "classification",
                p,
                cosine=0.999,
                snr=30.0,
                metrics={"accuracy": 0.9},
                baseline={"accuracy": 0.9},
                gates={},
            )
            for p in ("fp16", "int8")
        ],
    )
    rows = [{"class": f"c{i}", "onnx": 0.9, "variant": 0.9, "change": -i / 1000} for i in range(30)]
    many = replace(model.variants[1], class_recall=rows)
    classified = replace(model, variants=[many])
    page = render_html(ReportData("m", "build", GENERATED, {}, ["high"], [classified]))
    chart = page[page.index('id="recall-classification-int8"') :]
    chart = chart[: chart.index("</svg>")]
    assert "the 20 worst of 30 classes" in chart
    assert chart.count('class="recall-row"') == 20
    assert 'data-class="c29"' in chart
    assert 'data-class="c0"' not in chart
    assert "worst class Δ recall" in page
    assert cells(page, "row-classification-int8")[8] == "-2.90 pp (class c29)"


def cli() -> click.Group:
    @click.group()
    @click.option("--verbose", is_flag=True)
    def main(verbose: bool) -> None:
        """The edgereg group, as edgereg.cli wires report_command into it."""

    main.add_command(report_command)
    return main


def test_report_command(project: Project, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(project.root)
    result = CliRunner().invoke(cli(), ["report", "--out", "out/report.html"])
    assert result.exit_code == 0, result.output
    assert "wrote out/report.html: 2 model(s), 6 of 6 variant(s) built" in result.output
    assert 'id="tradeoff-vision"' in (project.root / "out" / "report.html").read_text()

    result = CliRunner().invoke(cli(), ["report", "--config", "missing.toml"])
    assert result.exit_code == 2
    assert "missing.toml: file not found" in result.output


def test_report_command_names_failed_variants(
    with_failure: Project, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(with_failure.root)
    result = CliRunner().invoke(cli(), ["report", "--out", "out/failed.html"])
    assert result.exit_code == 0, result.output
    assert "5 of 6 variant(s) built, 1 failed a gate" in result.output
    assert re.search(r"vision/int8 failed: min_snr_db\[logits\] [\d.]+ < 60", result.output)
    assert "not built" not in result.output

    result = CliRunner().invoke(cli(), ["report", "--out", "out/failed.html", "--json"])
    assert result.exit_code == 0, result.output
    rows = {(r["model"], r["variant"]): r for r in json.loads(result.output)["variants"]}
    failed = rows[(IMAGE_MODEL, "int8")]
    assert failed["status"] == "failed"
    assert failed["metric"] == "accuracy"
    assert failed["value"] == 1.0
    assert failed["min_snr_db"] < 60
    assert failed["failed"][0].startswith("min_snr_db[logits]")
    assert rows[(TENSOR_MODEL, "w8")]["failed"] == []


def test_report_renders_in_a_real_browser(with_failure: Project, tmp_path: Path) -> None:
    project = Project(tmp_path / "project")
    shutil.copytree(with_failure.root, project.root)
    # A damaged tail class, so the screenshot shows what the chart is for.
    recall_path = project.out_dir(IMAGE_MODEL, "w8") / CLASS_RECALL_PLOT
    rows = json.loads(recall_path.read_text())
    rows[-1]["change"], rows[-1]["variant"] = -0.25, rows[-1]["onnx"] - 0.25
    recall_path.write_text(json.dumps(rows))
    page = browser.artifact_path("report.html")
    write_report(project.load(), project.out_root, page, generated=GENERATED)

    dom = browser.dump_dom(page.as_uri())
    tags = parse(dom)
    ids = tags.ids()
    for model, variants in buildkit.VARIANTS.items():
        assert f"tradeoff-{model}" in ids
        assert all(f"recall-{model}-{variant}" in ids for variant in variants)
        assert all(f"row-{model}-{variant}" in ids for variant in variants)
        assert all(f"gates-{model}-{variant}" in ids for variant in variants)
    assert len(tags.with_class("circle", "point")) == 6
    assert len(tags.with_class("circle", "failed")) == 1
    assert len(tags.with_class("rect", "neg")) == 1
    # Two variant tables, each with a baseline row and three variant rows; one failed.
    assert len(tags.with_class("tr", "baseline")) == 2
    assert len(tags.with_class("tr", "has-gates")) == 6
    assert len(tags.with_class("tr", "failed")) == 2  # its numbers and its gates
    assert len(tags.with_class("div", "scroll")) == 4  # tables scroll on a phone, not clip

    png = browser.screenshot(page.as_uri(), browser.artifact_path("report.png"))
    assert browser.is_png(png)
    assert png.stat().st_size > 20_000  # a blank page is a few KB
    phone = browser.screenshot(
        page.as_uri(), browser.artifact_path("report-phone.png"), width=390, height=1600
    )
    assert browser.is_png(phone)

    # Every other task, from hand-written metrics: its headline metric and a failure.
    tasks = [_task_model(task, *TASK_CASES[task][:2]) for task in TASK_CASES]
    other = browser.artifact_path("report-tasks.html")
    other.write_text(
        render_html(ReportData("models.toml", "build", GENERATED, {}, ["high", "mid"], tasks)),
        encoding="utf-8",
    )
    tags = parse(browser.dump_dom(other.as_uri()))
    assert {f"tradeoff-{task}" for task in TASK_CASES} <= tags.ids()
    assert len(tags.with_class("circle", "failed")) == len(TASK_CASES)
    png = browser.screenshot(other.as_uri(), browser.artifact_path("report-tasks.png"))
    assert browser.is_png(png)


def test_a_missing_chromium_fails_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        browser.chromium()
