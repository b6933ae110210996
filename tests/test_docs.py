"""The documentation: the site builds with warnings as errors, the generated
references match the code, and the pages name only commands and exit codes
that exist."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import subprocess
import sys
import typing
from pathlib import Path
from types import ModuleType
from typing import Any

import click
import pytest

import edgereg
from edgereg import cli
from edgereg import config as config_module
from edgereg.build.quality import (
    DEFAULT_AGREEMENT,
    DEFAULT_LABEL_DROP,
    DEFAULT_METRICS,
    default_budgets,
)
from edgereg.errors import EdgeregError, ExitCode

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCS = REPO_ROOT / "docs"


def _load_generator() -> ModuleType:
    path = DOCS / "gen" / "reference.py"
    spec = importlib.util.spec_from_file_location("edgereg_docs_reference", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted(p for p in DOCS.rglob("*.md") if "gen" not in p.parts)]


def test_site_builds_with_warnings_as_errors(tmp_path: Path) -> None:
    site = tmp_path / "site"
    run = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"mkdocs build --strict failed:\n{output}"
    warnings = [line for line in output.splitlines() if "WARNING" in line]
    assert not warnings, "mkdocs warned:\n" + "\n".join(warnings)
    assert (site / "index.html").is_file()
    # Readable offline: no script or stylesheet from the network.
    external = re.compile(r"<(?:script|link)\b[^>]*\b(?:src|href)=\"(?:https?:)?//", re.I)
    for page in site.rglob("*.html"):
        match = external.search(page.read_text(encoding="utf-8"))
        assert match is None, f"{page.relative_to(site)} loads {match.group(0)!r}"


@pytest.mark.parametrize(
    "page",
    [
        "reference/models-toml.md",
        "reference/cli.md",
        "reference/exit-codes.md",
        "models-toml.md",
        "build.md",
    ],
)
def test_generated_reference_is_current(page: str) -> None:
    generator = _load_generator()
    committed = (DOCS / page).read_text(encoding="utf-8") if (DOCS / page).exists() else ""
    assert committed == generator.PAGES[page](), (
        f"docs/{page} does not match the code: run python docs/gen/reference.py"
    )


def _exit_codes_in_code() -> set[int]:
    for info in pkgutil.walk_packages(edgereg.__path__, "edgereg."):
        if info.name.rsplit(".", 1)[-1] in ("_worker", "__main__"):  # entry points: they run
            continue
        importlib.import_module(info.name)
    # The codes the CLI exits with itself (not an error's): verify, analyze, 70, 130.
    codes = {
        ExitCode.VERIFY_FAILED,
        ExitCode.ANALYZE_FAILED,
        ExitCode.ANALYZE_INCONCLUSIVE,
        ExitCode.INTERNAL_ERROR,
        ExitCode.INTERRUPTED,
    }
    pending: list[type[EdgeregError]] = [EdgeregError]
    while pending:
        kind = pending.pop()
        codes.add(kind.exit_code)
        pending.extend(kind.__subclasses__())
    return codes


def test_exit_codes_page_lists_every_code() -> None:
    text = (DOCS / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", text, flags=re.M)}
    in_code = _exit_codes_in_code()
    assert in_code - documented == set(), "add these to docs/reference/exit-codes.md"
    assert documented - in_code - {0} == set(), "exit codes documented but not used"


def test_help_lists_every_documented_exit_code() -> None:
    # One table in code (ExitCode): `edgereg --help` prints it, the page is generated from it.
    text = (DOCS / "reference" / "exit-codes.md").read_text(encoding="utf-8")
    documented = {int(code) for code in re.findall(r"^\| (\d+) \|", text, flags=re.M)}
    assert {int(code) for code in ExitCode} == documented
    help_text = subprocess.run(
        [str(Path(sys.executable).parent / "edgereg"), "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    listed = {int(code) for code in re.findall(r"^ +(\d+) +\S", help_text, flags=re.M)}
    assert listed == documented


def _commands() -> dict[str, set[str] | None]:
    """Top-level command names, with their subcommands for groups."""
    ctx = click.Context(cli.main, info_name="edgereg")
    result: dict[str, set[str] | None] = {}
    for name in cli.main.list_commands(ctx):
        command = cli.main.get_command(ctx, name)
        result[name] = set(command.list_commands(ctx)) if isinstance(command, click.Group) else None
    return result


def test_pages_name_only_real_commands() -> None:
    commands = _commands()
    code = re.compile(r"```.*?```|`[^`\n]+`", re.S)
    usage = re.compile(r"(?<![\w./-])edgereg ([a-z][a-z-]*)(?: ([a-z][a-z-]*))?")
    unknown = []
    for page in _pages():
        for span in code.findall(page.read_text(encoding="utf-8")):
            for name, sub in usage.findall(span):
                where = f"{page.relative_to(REPO_ROOT)}: edgereg {name}"
                if name not in commands:
                    unknown.append(where)
                elif commands[name] is not None and sub and sub not in commands[name]:
                    unknown.append(f"{where} {sub}")
    assert not unknown, "the docs name commands edgereg does not have:\n" + "\n".join(
        sorted(set(unknown))
    )


def _table_after(text: str, heading: str, first_column: str) -> list[list[str]]:
    """The first Markdown table after ``heading`` whose header starts with
    ``first_column``: its header and body rows, cells stripped of code marks."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"| {first_column} |"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip().replace("`", "") for cell in line.strip().strip("|").split("|")])
    return [rows[0], *rows[2:]]


def test_default_budgets_table_matches_the_code() -> None:
    text = (DOCS / "models-toml.md").read_text(encoding="utf-8")
    header, *rows = _table_after(text, "## Default budgets", "precision")
    # After precision, min_cosine and min_snr_db: a "<task> <metric>.min" column per default
    # minimum, the tasks in the code's order.
    columns = [cell.split() for cell in header[3:]]
    tasks = list(dict.fromkeys(task for task, _ in columns))
    assert tasks == list(DEFAULT_METRICS), "the columns' tasks"
    for task, metrics in DEFAULT_METRICS.items():
        minimums = {
            f"{name}.min" for name, limit in metrics["int8"].items() if limit.min is not None
        }
        assert {metric for t, metric in columns if t == task} == minimums, task
    assert [row[0] for row in rows] == list(DEFAULT_AGREEMENT), "one row per precision"
    for precision, cosine, snr, *limits in rows:
        assert (float(cosine), float(snr)) == DEFAULT_AGREEMENT[precision], precision  # type: ignore[index]
        for (task, metric), value in zip(columns, limits, strict=True):
            budget = DEFAULT_METRICS[task][precision][metric.removesuffix(".min")]  # type: ignore[index]
            assert budget.min == float(value), f"docs/models-toml.md: {precision} {task} {metric}"
    _, *drops = _table_after(text, "## Default budgets", "task")
    documented = {task: limit for task, limit in drops}
    for task in DEFAULT_METRICS:
        for precision in DEFAULT_AGREEMENT:
            budgets = default_budgets(task, precision)
            # Drops on label metrics, then limits on label metrics (a tail class's IoU loss).
            expected = ", ".join(
                [
                    f"{name}.max_drop = {limits.max_drop:g}"
                    for name, limits in budgets.metrics.items()
                    if limits.max_drop is not None
                ]
                + [
                    f"{name}.max = {limits.max:g}"
                    for name, limits in budgets.metrics.items()
                    if limits.max is not None
                ]
            )
            assert documented.get(task, "") == expected, f"docs/models-toml.md: {task} {precision}"
    assert all(
        limit.split(",")[0].endswith(f"= {DEFAULT_LABEL_DROP:g}") for limit in documented.values()
    )


def test_task_metrics_table_matches_the_code() -> None:
    text = (DOCS / "models-toml.md").read_text(encoding="utf-8")
    _, *rows = _table_after(text, "## Tasks and their metrics", "task | metric")
    documented = {(task, metric, against, better) for task, metric, against, better, _ in rows}
    union = typing.get_args(config_module.Task)[0]
    expected = set()
    for task_class in typing.get_args(union):
        (kind,) = typing.get_args(task_class.model_fields["kind"].annotation)
        for metric in task_class.METRICS:
            better = "higher" if metric.higher_is_better else "lower"
            expected.add((kind, metric.name, metric.against, better))
    assert documented == expected, "the metric table in docs/models-toml.md is out of date"


def test_toml_examples_are_valid() -> None:
    """Every TOML example in the docs parses, and the tables it shows validate."""
    from pydantic import BaseModel, create_model

    # Each checked as a field of a model, as models.toml has it: the task's string
    # shorthand is a validator on the field.
    fields: dict[str, Any] = {
        "budgets": config_module.Budgets,
        "inputs": list[config_module.InputSpec],
        "state": list[config_module.StatePair],
        "task": config_module.Task,
        "quantization": config_module.Quantization,
    }
    checks: dict[str, type[BaseModel]] = {
        key: create_model(f"Example_{key}", value=(annotation, ...))
        for key, annotation in fields.items()
    }
    examples = 0
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        for block in re.findall(r"^```toml\n(.*?)^```", text, flags=re.S | re.M):
            examples += 1
            where = f"{page.relative_to(REPO_ROOT)}, example {block.splitlines()[0]!r}"
            data = tomllib.loads(block)
            if "toolchain" in data:
                config_module.Toolchain.model_validate(data["toolchain"])
            for model in data.get("models", {}).values():
                for table in [model, *model.get("variants", {}).values()]:
                    for key, adapter in checks.items():
                        if key in table:
                            try:
                                adapter.model_validate({"value": table[key]})
                            except ValueError as exc:
                                raise AssertionError(f"{where}: {key}: {exc}") from None
    assert examples > 10


# --- docs/protocol.md says what the protocol package says -------------------------------


def _protocol_rows() -> dict[str, str]:
    """Every row of the field tables in docs/protocol.md §3: field -> its type and meaning."""
    text = (DOCS / "protocol.md").read_text(encoding="utf-8")
    section = text[text.index("## 3. The manifest") : text.index("## 4. Trust")]
    rows: dict[str, str] = {}
    for line in section.splitlines():
        match = re.match(r"^\| `([a-z0-9_.]+)` \| (.*) \|$", line)
        if match:
            assert match.group(1) not in rows, f"{match.group(1)} is documented twice"
            rows[match.group(1)] = match.group(2)
    return rows


def _protocol_fields() -> dict[str, dict[str, object]]:
    from edgereg.protocol.wire import Manifest

    schema = Manifest.model_json_schema()
    fields: dict[str, dict[str, object]] = {}
    for name, prop in schema["properties"].items():
        fields[name] = prop
    for name, prop in schema["$defs"]["ManifestEntry"]["properties"].items():
        if name != "runtime":
            fields[name] = prop
    for name, prop in schema["$defs"]["RuntimeHints"]["properties"].items():
        fields[f"runtime.{name}"] = prop
    # The try-set's keys and a hint rule's (decision 0008), in their own tables.
    for name, prop in schema["$defs"]["RuntimeTrials"]["properties"].items():
        fields[f"runtime_trials.{name}"] = prop
    for name, prop in schema["$defs"]["HintRule"]["properties"].items():
        fields[f"runtime_hints.{name}"] = prop
    return fields


def _facts(prop: dict[str, object]) -> list[str]:
    """What a row must say for a schema property: the same rule, in the page's words."""
    from edgereg.protocol.fields import MAX_SAFE_INTEGER, SEMVER_PATTERN, TIME_PATTERN

    node = prop
    for option in prop.get("anyOf", []):  # type: ignore[attr-defined]
        if option.get("type") != "null":
            node = option
    facts = []
    if node.get("maximum") == MAX_SAFE_INTEGER:
        facts.append(f"integer, {node['minimum']} to 2^53 − 1")
    elif node.get("type") == "integer" and "minimum" in node:
        facts.append(f"integer, {node['minimum']} to {node['maximum']}")
    if node.get("pattern") == TIME_PATTERN:
        facts.append("exactly `YYYY-MM-DDTHH:MM:SSZ`")
    if node.get("pattern") == SEMVER_PATTERN:
        facts.append("semantic version")
    if node.get("pattern") == r"^[0-9a-f]{64}$":
        facts.append("64 lowercase hex")
    if node.get("pattern") == r"^[0-9a-f]{8,64}$":
        facts.append("8–64 lowercase hex")
    if node.get("pattern") == r"^blobs/sha256/[0-9a-f]{64}$":
        facts.append("Always `blobs/sha256/` + `sha256`")
    if "exclusiveMinimum" in node and "$comment" in node:  # percent: its decimals rule
        facts.append(
            f"{node['exclusiveMinimum']} < percent ≤ {node['maximum']}, at most 2 decimals"
        )
    elif "exclusiveMinimum" in node:
        facts.append(f"number, > {node['exclusiveMinimum']} and ≤ {node['maximum']}")
    items = node.get("items")
    items = items if isinstance(items, dict) else {}
    if node.get("type") == "array" and node.get("uniqueItems") and "enum" in items:
        facts.append("each once, ending with `cpu`")
        facts.extend(f"`{value}`" for value in items["enum"])
    elif node.get("type") == "array" and node.get("uniqueItems"):
        facts.append(f"{node['minItems']} to {node['maxItems']} distinct")
        facts.append(f"`{items['pattern']}`")
    elif "enum" in node:
        facts.extend(f"`{value}`" for value in node["enum"])  # type: ignore[union-attr]
    return facts


def test_protocol_page_documents_every_manifest_field_once_with_its_rule() -> None:
    rows, fields = _protocol_rows(), _protocol_fields()
    assert set(rows) == set(fields)
    for name, prop in fields.items():
        for fact in _facts(prop):
            assert fact in rows[name], f"docs/protocol.md, `{name}`: should say {fact!r}"


def test_protocol_page_states_the_limits_the_protocol_enforces() -> None:
    from edgereg.protocol import MAX_JSON_DEPTH, MAX_MANIFEST_BYTES
    from edgereg.protocol.fields import NAME_PATTERN

    text = (DOCS / "protocol.md").read_text(encoding="utf-8")
    assert f"`{NAME_PATTERN}`" in text
    assert f"nested at most {MAX_JSON_DEPTH} deep" in text
    assert f"At most {MAX_MANIFEST_BYTES // 1024} KiB" in text
