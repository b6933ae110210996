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
from pathlib import Path
from types import ModuleType

import click
import pytest

import edgereg
from edgereg import _cli_common, cli
from edgereg.errors import EdgeregError

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


@pytest.mark.parametrize("page", ["reference/models-toml.md", "reference/cli.md"])
def test_generated_reference_is_current(page: str) -> None:
    generator = _load_generator()
    committed = (DOCS / page).read_text(encoding="utf-8") if (DOCS / page).exists() else ""
    assert committed == generator.PAGES[page](), (
        f"docs/{page} does not match the code: run python docs/gen/reference.py"
    )


def _exit_codes_in_code() -> set[int]:
    for info in pkgutil.walk_packages(edgereg.__path__, "edgereg."):
        if info.name.rsplit(".", 1)[-1] == "_worker":  # the MNN child process's entry point
            continue
        importlib.import_module(info.name)
    codes = {_cli_common.INTERNAL_ERROR, cli.VERIFY_FAILED, 130}
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
