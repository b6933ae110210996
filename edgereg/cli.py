"""The edgereg command line: parse, call the library, print.

Exit codes: 0 success, 1 other edgereg error, 2 bad configuration or usage,
3 a build stage failed, 4 a variant failed a gate, 70 an unexpected internal error.
"""

from __future__ import annotations

import functools
import json
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgereg import __version__
from edgereg import config as config_module
from edgereg.errors import ConfigError, EdgeregError

F = TypeVar("F", bound=Callable[..., Any])

INTERNAL_ERROR = 70

stderr = Console(stderr=True, highlight=False)


def handle_errors(command: F) -> F:
    """Turn every edgereg error into one message on stderr and its exit code."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        verbose = bool(click.get_current_context().find_root().params.get("verbose"))
        try:
            return command(*args, **kwargs)
        except EdgeregError as exc:
            if verbose:
                traceback.print_exc()
            # Messages quote TOML tables ("[models.x.calibration]"): not markup.
            stderr.print(
                f"[bold red]error:[/] {escape(exc.diagnostics())}", markup=True, soft_wrap=True
            )
            sys.exit(exc.exit_code)
        except KeyboardInterrupt:
            stderr.print("interrupted")
            sys.exit(130)
        except Exception:  # the last line of defence
            traceback.print_exc()
            stderr.print(
                "edgereg hit an internal error (above); please report it with the traceback."
            )
            sys.exit(INTERNAL_ERROR)

    return cast(F, wrapper)


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path(config_module.DEFAULT_CONFIG_FILE),
    show_default=True,
    help="The models.toml to read.",
)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="edgereg")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")
def main(verbose: bool) -> None:
    """Build MNN model variants per device tier and ship them to apps."""


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def validate(config_path: Path, as_json: bool) -> None:
    """Check models.toml and show which variant each tier gets."""
    config = config_module.load(config_path)
    resolution = {name: config.tier_variants(name) for name in config.models}
    if as_json:
        click.echo(
            json.dumps(
                {
                    "valid": True,
                    "notes": config.notes(),
                    "tiers": {
                        model: {
                            tier: {"variant": variant, "fallback": fell_back}
                            for tier, (variant, fell_back) in tiers.items()
                        }
                        for model, tiers in resolution.items()
                    },
                },
                indent=2,
            )
        )
        return
    table = Table(title=f"{config_path}: valid")
    table.add_column("model")
    table.add_column("version")
    for tier in config.tiers:
        table.add_column(f"tier {tier}")
    for name, model in config.models.items():
        cells = [
            f"{variant} (fallback)" if fell_back else variant
            for variant, fell_back in resolution[name].values()
        ]
        table.add_row(name, model.version, *cells)
    Console().print(table)
    for note in config.notes():
        click.echo(f"note: {note}")


@main.command()
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write to this file instead of standard output.",
)
@handle_errors
def schema(out: Path | None) -> None:
    """Print the JSON Schema of models.toml."""
    text = json.dumps(config_module.json_schema(), indent=2) + "\n"
    if out is None:
        click.echo(text, nl=False)
    else:
        try:
            out.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise EdgeregError(
                f"cannot write {out}: {exc.strerror}", hint="Check that the directory exists."
            ) from None


@main.command()
@click.argument("model")
@click.argument("variant")
@config_option
@click.option(
    "--out",
    "out_root",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("build"),
    show_default=True,
    help="Outputs go to OUT/MODEL/VARIANT/.",
)
@click.option("--iterations", default=50, show_default=True, help="Benchmark iterations.")
@handle_errors
def build(model: str, variant: str, config_path: Path, out_root: Path, iterations: int) -> None:
    """Build, verify, evaluate, gate and benchmark one variant."""
    from edgereg.build.variant import BenchSettings, build_variant

    config = config_module.load(config_path)
    _require_variant(config, model, variant)
    result = build_variant(
        config,
        model,
        variant,
        out_root,
        bench=BenchSettings(iterations=iterations),
        on_stage=lambda stage: stderr.print(f"{model}/{variant}: {stage}"),
    )
    stderr.print(f"{model}/{variant}: built {result.out_dir / 'model.mnn'}")


@main.command()
@config_option
@click.option(
    "--out",
    "out_root",
    type=click.Path(path_type=Path, file_okay=False),
    default=Path("build"),
    show_default=True,
)
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def summary(config_path: Path, out_root: Path, as_json: bool) -> None:
    """Table of every built variant: tier, size, accuracy, recall, latency."""
    from edgereg.build.report import summary_rows

    config = config_module.load(config_path)
    rows = summary_rows(config, out_root)
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="edgereg build summary")
    for title in ("model", "variant", "tier"):
        table.add_column(title)
    for title in ("size MB", "accuracy", "Δ acc", "worst Δ recall", "p50 ms", "status"):
        table.add_column(title, justify="right")
    for row in rows:
        table.add_row(
            row["model"],
            row["variant"],
            row["tier"],
            _number(row.get("size_mb"), "{:.3f}"),
            _number(row.get("accuracy"), "{:.2%}"),
            _points(row.get("accuracy_change")),
            _points(row.get("worst_recall_change")),
            _number(row.get("p50_ms"), "{:.3f}"),
            row["status"],
        )
    Console(width=max(Console().width, 100)).print(table)
    stderr.print("Δ: change against the fp32 ONNX Runtime baseline, in percentage points.")


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)


def _points(value: float | None) -> str:
    """A fraction as signed percentage points (0.0123 -> +1.23 pp)."""
    if value is None:
        return "-"
    points = round(value * 100, 2) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{points:+.2f} pp"


@main.group()
def dvc() -> None:
    """Keep dvc.yaml in step with models.toml."""


@dvc.command("sync")
@config_option
@click.option("--check", is_flag=True, help="Exit 1 when dvc.yaml is stale; write nothing.")
@click.option(
    "--out",
    "dvc_yaml",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="dvc.yaml to write (default: next to models.toml).",
)
@handle_errors
def dvc_sync(config_path: Path, check: bool, dvc_yaml: Path | None) -> None:
    """Write dvc.yaml: one stage per (model, variant)."""
    from edgereg.build.dvc import render_dvc_yaml

    config = config_module.load(config_path)
    target = dvc_yaml or config.root / "dvc.yaml"
    text = render_dvc_yaml(config)
    current = target.read_text(encoding="utf-8") if target.exists() else None
    if check:
        if current != text:
            stderr.print(
                f"{target} is stale against {config_path}; run `edgereg dvc sync` and commit it.",
                markup=False,
                soft_wrap=True,
            )
            sys.exit(1)
        stderr.print(f"{target} is up to date", markup=False, soft_wrap=True)
        return
    if current == text:
        stderr.print(f"{target} is up to date", markup=False, soft_wrap=True)
        return
    tmp = target.with_name(f".{target.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(target)
    stderr.print(f"wrote {target}", markup=False, soft_wrap=True)


def _require_variant(config: config_module.Config, model: str, variant: str) -> None:
    if model not in config.models:
        raise ConfigError(
            f"no model '{model}'; models: {', '.join(config.models)}",
            file=str(config.path),
        )
    if variant not in config.models[model].variants:
        raise ConfigError(
            f"model '{model}' has no variant '{variant}'; variants: "
            f"{', '.join(config.models[model].variants)}",
            file=str(config.path),
        )


if __name__ == "__main__":  # pragma: no cover
    main()
