"""The shape the restructuring left: commands in edgereg/cli/, a library without click or rich.

ruff's banned-api (pyproject.toml, edgereg/ruff.toml) holds the same at lint time;
these tests hold it for anyone who runs only pytest.
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path

import click
import pytest

from edgereg.cli import main

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised only on Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "edgereg"
CLI = PACKAGE / "cli"

# Where each moved module went; the old path must not come back.
MOVED = {
    "edgereg._cli_common": "edgereg.cli._common",
    "edgereg._analyze_cli": "edgereg.cli.analyze",
    "edgereg._onboard_cli": "edgereg.cli.onboard",
    "edgereg.client._cli": "edgereg.cli.pull",
    "edgereg.serve._cli": "edgereg.cli.serve",
    "edgereg.toolchain._cli": "edgereg.cli.toolchain",
    "edgereg.report": "edgereg.buildreport",
    "edgereg.build.report": "edgereg.build.summary_rows",
}


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_no_library_module_imports_click_or_rich() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if CLI in path.parents:
            continue
        for module in _imported_modules(path):
            if module.split(".")[0] in ("click", "rich"):
                offenders.append(f"{path.relative_to(ROOT)} imports {module}")
    assert offenders == []


def test_the_cli_package_does_import_them() -> None:
    # The scan above would pass on a tree it cannot read: it must see the CLI's own imports.
    seen = set().union(*(_imported_modules(path) for path in CLI.glob("*.py")))
    assert {"click", "rich.console"} <= seen


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_moved_modules_are_gone(old: str, new: str) -> None:
    assert importlib.util.find_spec(new) is not None
    # By file, not find_spec: an editable install of another checkout would answer for it.
    where = ROOT.joinpath(*old.split("."))
    assert not where.with_suffix(".py").exists(), f"{old} is back; it lives in {new}"
    assert not (where / "__init__.py").exists(), f"{old} is back; it lives in {new}"


def test_every_command_lives_in_edgereg_cli() -> None:
    ctx = click.Context(main, info_name="edgereg")
    names = main.list_commands(ctx)
    assert len(names) >= 20
    for name in names:
        command = main.get_command(ctx, name)
        assert command is not None
        callback = command.callback
        # A group's callback (dvc, keys, toolchain) is in the same module as its commands.
        assert callback is not None, name
        module = sys.modules[callback.__module__]
        assert module.__name__.startswith("edgereg.cli."), (name, module.__name__)


def test_entry_point_is_edgereg_cli_main() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert project["project"]["scripts"]["edgereg"] == "edgereg.cli:main"
