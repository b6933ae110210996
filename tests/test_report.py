"""`edgereg report`: one self-contained HTML page that shows what the builds did.

The report of a tiny project built for real is checked as text, and rendered
in a real headless chromium: the charts are in the DOM and a screenshot is
saved to test-artifacts/.
"""

from __future__ import annotations

import json
import re
import shutil
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import browser
import buildkit
import click
import pytest
from buildkit import IMAGE_MODEL, TENSOR_MODEL, Project
from click.testing import CliRunner

from edgereg.build.outputs import CLASS_RECALL_PLOT
from edgereg.report import ModelData, ReportData, VariantData, collect, render_html, write_report
from edgereg.report._cli import report_command

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


def test_report_shows_every_variant_chart_and_provenance(built: Project) -> None:
    page = report_of(built)
    tags = parse(page)
    ids = tags.ids()
    for model, variants in buildkit.VARIANTS.items():
        assert {f"model-{model}", f"variants-{model}", f"tradeoff-{model}"} <= ids
        assert f"provenance-{model}" in ids
        for variant in variants:
            assert f"row-{model}-{variant}" in ids
            assert f"recall-{model}-{variant}" in ids
            provenance = json.loads(
                built.out_dir(model, variant).joinpath("provenance.json").read_text()
            )
            # Every artifact's digest, its inputs' digests and the recipe digest.
            assert provenance["artifact"]["sha256"] in page
            assert provenance["recipe_sha256"] in page
            assert provenance["source"]["sha256"] in page
    # One marker per built variant in each size/accuracy chart, plus the ONNX baseline.
    assert len(tags.with_class("circle", "point")) == 6
    assert len(tags.with_class("path", "baseline-point")) == 2
    # One bar per class in each recall chart.
    bars = tags.with_class("rect", "bar")
    classes = len(buildkit.IMAGE_CLASSES) * 3 + len(buildkit.TENSOR_CLASSES) * 3
    assert len(bars) == classes
    assert "6 of 6 variants built" in page
    assert page.count('class="badge status-built"') == 6
    # Latency at each benchmarked thread count, gates with their budgets.
    assert "p50 ms @1 thr" in page
    assert re.search(r'class="gate pass" title="max_size_mb">size', page)


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
    assert re.search(rf'<tr class="stale" id="row-{IMAGE_MODEL}-w8">', page)
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


def _variant(name: str, tier: str, **metrics: Any) -> VariantData:
    return VariantData(
        model="net",
        variant=name,
        tier=tier,
        status="built",
        threads=2,
        budgets={"max_size_mb": 2.0, "max_class_recall_drop": 0.05},
        precision="fp32",
        quantization={"mode": "none"},
        out_dir=f"build/net/{name}",
        metrics=metrics,
        provenance={},
        latency=[{"threads": 2, "p50_ms": 3.5}],
    )


def test_generic_models_chart_cosine_and_many_classes_show_the_worst() -> None:
    generic = ModelData(
        name="net",
        version="1.0.0",
        task="generic",
        description="",
        source_path="net.onnx",
        source_sha256="0" * 64,
        source_size=1_500_000,
        variants=[
            _variant(
                "fp32",
                "high",
                size_mb=1.4,
                verify={"mean_cosine": 0.99999},
                gates={"max_size_mb": True},
            )
        ],
    )
    data = ReportData("models.toml", "build", GENERATED, {"mnn": "3"}, ["high"], [generic])
    page = render_html(data)
    assert "mean cosine" in page
    assert "0.99999" in page
    assert 'id="tradeoff-net"' in page
    assert "recall-net" not in page
    parse(page)

    many = _variant("int8", "high", size_mb=0.4, accuracy={"onnx": 0.9, "variant": 0.9})
    rows = [{"class": f"c{i}", "onnx": 0.9, "variant": 0.9, "change": -i / 1000} for i in range(30)]
    many = VariantData(**{**many.__dict__, "class_recall": rows})
    classified = ModelData(**{**generic.__dict__, "task": "classification", "variants": [many]})
    page = render_html(ReportData("m", "build", GENERATED, {}, ["high"], [classified]))
    chart = page[page.index('id="recall-net-int8"') :]
    chart = chart[: chart.index("</svg>")]
    assert "the 20 worst of 30 classes" in chart
    assert chart.count('class="recall-row"') == 20
    assert 'data-class="c29"' in chart
    assert 'data-class="c0"' not in chart


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


def test_report_renders_in_a_real_browser(project: Project) -> None:
    # A damaged tail class, so the screenshot shows what the chart is for.
    recall_path = project.out_dir(IMAGE_MODEL, "int8") / CLASS_RECALL_PLOT
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
    assert len(tags.with_class("circle", "point")) == 6
    assert len(tags.with_class("rect", "neg")) == 1
    # Two variant tables, each with a baseline row and three variant rows.
    assert len(re.findall(r"<tr class=\"(built|baseline)\"", dom)) == 8

    png = browser.screenshot(page.as_uri(), browser.artifact_path("report.png"))
    assert browser.is_png(png)
    assert png.stat().st_size > 20_000  # a blank page is a few KB


def test_a_missing_chromium_fails_with_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(browser, "CHROMIUM", tmp_path / "no-chromium")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(pytest.fail.Exception, match="apt-get install -y chromium"):
        browser.chromium()
