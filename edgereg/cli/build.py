"""`edgereg validate`, `schema`, `tiers`, `build`, `summary`, `dvc sync`: models.toml, the build."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click
from rich.console import Console
from rich.table import Table

from edgereg import config as config_module
from edgereg._files import atomic_write
from edgereg.cli._common import (
    UnitName,
    build_dir,
    build_dir_option,
    config_option,
    handle_errors,
    no_such_model,
    print_note,
    print_result,
    stage_reporter,
    stderr,
    warn_if_dvc_yaml_stale,
)
from edgereg.errors import ConfigError, EdgeregError, ExitCode


def _check_memory_ceilings(config: config_module.Config) -> None:
    """A tier's max_model_memory_mb against the peaks already measured under build/."""
    from edgereg.build.fit import ceiling_problems, every_unit

    out_root = build_dir(None, config)
    over = [
        line
        for unit in every_unit(config)
        for line in ceiling_problems(config, unit, out_root, require_measured=False)
    ]
    if over:
        raise ConfigError(
            "what a tier serves is over its memory ceiling (measured by the last build):\n"
            + "\n".join(f"  {line}" for line in over),
            file=str(config.path),
            key_path="tiers",
            hint="Give the tier a variant that fits (a smaller input shape or model), or raise "
            "its max_model_memory_mb if its devices can hold it.",
        )


@click.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def validate(config_path: Path, as_json: bool) -> None:
    """Check models.toml and show which variant each tier gets."""
    from edgereg.pins import check_pins

    config = config_module.load(config_path)
    warn_if_dvc_yaml_stale(config)
    _check_memory_ceilings(config)
    resolution = {name: config.tier_variants(name) for name in config.models}
    # A file changed since it was pinned: every build of it would stop at its first stage.
    stale = [pin for pin in check_pins(config) if pin.stale]
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
                    "bundles": {
                        name: {"version": bundle.version, "models": list(bundle.models)}
                        for name, bundle in config.bundles.items()
                    },
                    "stale_pins": [
                        {"key": p.key, "path": p.path, "pinned": p.pinned, "actual": p.actual}
                        for p in stale
                    ],
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
    for name, bundle in config.bundles.items():
        print_result(f"bundle {name} {bundle.version}: {', '.join(bundle.models)} (one rollout)")
    for text in config.notes():
        print_note(f"note: {text}")
    for pin in stale:
        owner = pin.key.split(".")[1]
        print_note(f"warning: stale pin: {pin.describe()}; run `edgereg pin {owner}`")


@click.command()
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
            ) from exc


@click.command()
@config_option
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write to this file instead of standard output.",
)
@handle_errors
def tiers(config_path: Path, out: Path | None) -> None:
    """Export models.toml's [tiers] as the tier file apps ship (docs/protocol.md section 5).

    An ordered array, best tier first, in canonical JSON: the SDKs' `Tiers.fromJson`
    (Android), `Tiers.parse` (Swift) and `parse_tier_file` (Python) read it. The
    limits of a tier (max_model_memory_mb) stay in models.toml.
    """
    from edgereg.protocol.rules import tier_file

    config = config_module.load(config_path)
    data = tier_file(config.tiers)
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    try:
        atomic_write(out, data)
    except OSError as exc:
        raise EdgeregError(
            f"cannot write {out}: {exc.strerror}", hint="Check that the directory exists."
        ) from exc


@click.command()
@click.argument("model", type=UnitName("model"))
@click.argument("variant", type=UnitName("variant"))
@config_option
@click.option(
    "--out",
    "out_root",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Outputs go to OUT/MODEL/VARIANT/. Default: build/ next to models.toml.",
)
@click.option(
    "--iterations",
    type=click.IntRange(min=1),
    default=50,
    show_default=True,
    help="Benchmark iterations.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the metrics as JSON.")
@handle_errors
def build(
    model: str,
    variant: str,
    config_path: Path,
    out_root: Path | None,
    iterations: int,
    as_json: bool,
) -> None:
    """Build, verify, evaluate, gate and benchmark one variant."""
    from edgereg.build.variant import BenchSettings, build_variant

    config = config_module.load(config_path)
    _require_variant(config, model, variant)
    warn_if_dvc_yaml_stale(config)
    with stage_reporter(f"{model}/{variant}") as on_stage:
        result = build_variant(
            config,
            model,
            variant,
            build_dir(out_root, config),
            bench=BenchSettings(iterations=iterations),
            on_stage=on_stage,
        )
    if as_json:
        click.echo(json.dumps({"out_dir": str(result.out_dir), "metrics": result.metrics}))
        return
    note = (result.metrics.get("size") or {}).get("note")
    if note:
        stderr.print(f"size: {note}", markup=False, highlight=False)
    print_result(f"{model}/{variant}: built {result.out_dir / 'model.mnn'}")


@click.command()
@config_option
@build_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def summary(config_path: Path, out_root: Path | None, as_json: bool) -> None:
    """Table of every built variant: tier, size, accuracy, recall, latency."""
    from edgereg.build.arm import summary_cell
    from edgereg.build.fit import ceiling_lines
    from edgereg.build.summary_rows import summary_rows
    from edgereg.build.threads import describe as describe_sweep

    config = config_module.load(config_path)
    stale = warn_if_dvc_yaml_stale(config)
    rows = summary_rows(config, build_dir(out_root, config))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="edgereg build summary")
    for title in ("model", "variant", "tier"):
        table.add_column(title)
    for title in (
        "size MB",
        "metric",
        "value",
        "Δ",
        "cosine",
        "SNR dB",
        "host p50 ms",
        "host peak MB",
    ):
        table.add_column(title, justify="right")
    table.add_column("ARM cosine")
    table.add_column("status")
    for row in rows:
        status = row["status"]
        table.add_row(
            row["model"],
            row["variant"],
            row["tier"],
            _number(row.get("size_mb"), "{:.3f}"),
            row.get("metric") or "-",
            _number(row.get("value"), "{:.4f}"),
            _points(row.get("change")) if row.get("baseline") is not None else "vs ref",
            _number(row.get("min_cosine"), "{:.5f}"),
            _number(row.get("min_snr_db"), "{:.1f}"),
            _number(row.get("p50_ms"), "{:.3f}"),
            _number(row.get("memory_peak_mb"), "{:.1f}"),
            summary_cell(row.get("arm") or {}),
            status,
        )
    # Thirteen columns (host memory and the ARM classes joined them): narrower, rich cuts cells.
    Console(width=max(Console().width, 160)).print(table)
    stderr.print(
        "metric: the task's headline metric; Δ: change against the fp32 ONNX Runtime baseline "
        "on the labels, in percentage points (vs ref: the metric compares with the reference "
        "itself); cosine, SNR: worst output against the reference; host peak MB: peak "
        "memory loading and running the variant at its declared shape adds on this host; "
        "ARM cosine: the worst output on each emulated CPU class "
        "(docs/operations/arm-verification.md)."
    )
    for row in rows:
        if row.get("failed"):
            # Plain text: gate names hold brackets ("min_cosine[logits]") rich would eat.
            click.echo(f"{row['model']}/{row['variant']} failed: " + "; ".join(row["failed"]))
            if row.get("hint"):
                click.echo("  " + row["hint"].replace("\n", "\n  "))
    for row in rows:
        if row.get("size_note") and not row.get("failed"):
            click.echo(f"{row['model']}/{row['variant']} size: {row['size_note']}")
    # Each tier's memory ceiling at work: what it serves, which measured variants it refuses.
    for line in ceiling_lines(config, build_dir(out_root, config)):
        click.echo(line)
    for row in rows:
        name = f"{row['model']}/{row['variant']}"
        if row.get("mnn_api") == "module":
            click.echo(
                f"{name} needs MNN's Module API (control-flow subgraphs "
                f"{', '.join(row.get('subgraphs') or [])}): an app whose runner calls the "
                "session API refuses it (api-unsupported; docs/guides)"
            )
        if row.get("memory_problem") and not row.get("failed"):
            click.echo(f"{name} memory {row['memory_problem']}")
        if row.get("host_threads"):
            click.echo(
                f"{name} {describe_sweep(row['host_threads'])}; the app is told "
                f"{row['threads']} threads (runtime.threads)"
            )
    if any(row["status"] == "failed" for row in rows):
        stderr.print(
            "Failed variants keep their numbers: fix what the gate names (see `edgereg build "
            "MODEL VARIANT` for the hint), then `dvc repro`."
        )
    if any(row["status"] not in ("built", "failed") for row in rows):
        fix = "`edgereg dvc sync`, then `dvc repro`" if stale else "`dvc repro`"
        stderr.print(f"Some variants are not built or stale: run {fix}.")


def _number(value: float | None, template: str) -> str:
    return "-" if value is None else template.format(value)


def _points(value: float | None) -> str:
    """A fraction as signed percentage points (0.0123 -> +1.23 pp)."""
    if value is None:
        return "-"
    points = round(value * 100, 2) + 0.0  # + 0.0 turns -0.0 into 0.0
    return f"{points:+.2f} pp"


@click.group()
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
            sys.exit(ExitCode.ERROR)
        print_result(f"{target} is up to date")
        return
    if current == text:
        print_result(f"{target} is up to date")
        return
    atomic_write(target, text)
    print_result(f"wrote {target}")


def _require_variant(config: config_module.Config, model: str, variant: str) -> None:
    if model not in config.models:
        raise no_such_model(config, model)
    if variant not in config.models[model].variants:
        raise ConfigError(
            f"model '{model}' has no variant '{variant}'; variants: "
            f"{', '.join(config.models[model].variants)}",
            file=str(config.path),
        )
