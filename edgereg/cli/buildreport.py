"""``edgereg report``: a click command that :mod:`edgereg.cli` registers."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from edgereg.cli._common import (
    build_dir,
    build_dir_option,
    config_option,
    handle_errors,
    print_note,
    print_result,
)

if TYPE_CHECKING:
    from edgereg.buildreport import VariantData

__all__ = ["report_command"]


@click.command("report")
@config_option
@click.option(
    "--out",
    "target",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path("report.html"),
    show_default=True,
    help="The HTML file to write.",
)
@build_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print what the report holds as JSON.")
@handle_errors
def report_command(config_path: Path, target: Path, out_root: Path | None, as_json: bool) -> None:
    """Write an HTML report of every variant: task metric, agreement, gates, latency, provenance."""
    from edgereg import config as config_module
    from edgereg.build.outputs import FAILED
    from edgereg.buildreport import write_report
    from edgereg.errors import EdgeregError

    config = config_module.load(config_path)
    try:
        data = write_report(config, build_dir(out_root, config), target, generated=_now())
    except OSError as exc:
        raise EdgeregError(
            f"cannot write {target}: {exc.strerror}", hint="Check that the directory is writable."
        ) from exc
    variants = [v for m in data.models for v in m.variants]
    built = sum(v.built for v in variants)
    failed = [v for v in variants if v.status == FAILED]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "out": str(target),
                    "variants": [_variant_json(v) for v in variants],
                },
                indent=2,
            )
        )
        return
    counts = f"{built} of {len(variants)} variant(s) built"
    if failed:
        counts += f", {len(failed)} failed a gate"
    print_result(f"wrote {target}: {len(data.models)} model(s), {counts}")
    for variant in failed:
        print_result(f"{variant.model}/{variant.variant} failed: {variant.failed[0]}")
    if not data.models:
        print_note("no models yet: run `edgereg add path/to/model.onnx --evaluation data/eval.npz`")
    elif built + len(failed) < len(variants):
        print_note("some variants are not built: run `dvc repro`")


def _variant_json(variant: VariantData) -> dict[str, Any]:
    top = variant.headline
    return {
        "model": variant.model,
        "variant": variant.variant,
        "tier": variant.tier,
        "status": variant.status,
        "metric": None if top is None else top.name,
        "value": None if top is None else top.value,
        "baseline": None if top is None else top.baseline,
        "change": None if top is None else top.change,
        "min_cosine": variant.agreement("cosine"),
        "min_snr_db": variant.agreement("snr_db"),
        "failed": variant.failed,
    }


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
