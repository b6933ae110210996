"""``edgereg init``, ``add`` and ``pin``: click commands that :mod:`edgereg.cli` registers.

Errors go through the CLI's one error handler
(:func:`edgereg.cli._common.handle_errors`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import click

from edgereg.cli._common import config_option, handle_errors, print_note, print_result
from edgereg.config import DEFAULT_CONFIG_FILE
from edgereg.errors import ExitCode
from edgereg.tasks import SHORTHAND_KINDS

__all__ = ["add_command", "init_command", "pin_command"]

# What was done is the result (stdout); notes, warnings and next steps are
# diagnostics (stderr, dropped by --quiet).
_done = print_result
_say = print_note


@click.command("init")
# Not searched upward: init makes a project here, even inside another one.
@click.option(
    "--config",
    "config_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=Path(DEFAULT_CONFIG_FILE),
    show_default=True,
    help="The models.toml to write.",
)
@click.option(
    "--force",
    is_flag=True,
    help="Replace an existing models.toml, and a dvc.yaml edgereg did not write.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def init_command(config_path: Path, force: bool, as_json: bool) -> None:
    """Make this git repository an edgereg project (models.toml, DVC, .gitignore)."""
    from edgereg.onboard import init_project

    result = init_project(config_path, force=force)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "root": str(result.root),
                    "written": result.written,
                    "dvc_initialised": result.dvc_initialised,
                    "gitignore_added": result.gitignore_added,
                    "notes": result.notes,
                    "next": result.next_steps,
                },
                indent=2,
            )
        )
        return
    if result.dvc_initialised:
        _done(f"initialised DVC in {result.root} (analytics off)")
    for name in result.written:
        detail = ""
        if name == ".gitignore":
            detail = f" (added {', '.join(result.gitignore_added)})"
        _done(f"wrote {name}{detail}")
    for note in result.notes:
        _say(f"note: {note}")
    _say("next:")
    for step in result.next_steps:
        _say(f"  {step}")


@click.command("add")
@click.argument("source", type=click.Path(path_type=Path, dir_okay=False))
@click.option("--name", default=None, help="Model name (default: from the file name).")
@click.option(
    "--evaluation",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Labelled .npz every variant is verified and evaluated on (required).",
)
@click.option(
    "--calibration",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help=".npz for int8 calibration; without it the model gets no int8 variant.",
)
@click.option(
    "--task",
    # Not the kinds that need settings of their own (a CTC charset, an evaluator).
    type=click.Choice(SHORTHAND_KINDS),
    default=None,
    help="Default: classification when the evaluation set has 'labels'.",
)
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def add_command(
    source: Path,
    name: str | None,
    evaluation: Path | None,
    calibration: Path | None,
    task: str | None,
    config_path: Path,
    as_json: bool,
) -> None:
    """Add the ONNX model SOURCE to models.toml with a variant per tier; sync dvc.yaml."""
    from edgereg.errors import UsageError
    from edgereg.onboard import add_model

    if evaluation is None:
        raise UsageError(
            "--evaluation is required: every variant is checked against ONNX Runtime and "
            "evaluated on it, so no build can run without one",
            hint="Save an .npz with one array per model input (samples first, named like "
            "the input) and, for scoring on labels, a 'labels' array, for example "
            "numpy.savez('data/eval.npz', input=x, labels=y), then: "
            f"edgereg add {source} --evaluation data/eval.npz",
        )
    argv = ["edgereg add", str(source)]
    if name:
        argv += ["--name", name]
    result = add_model(
        config_path,
        source,
        evaluation=evaluation,
        calibration=calibration,
        name=name,
        task=cast(Any, task),
        command=" ".join(argv),
    )
    proposal = result.proposal
    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": proposal.name,
                    "task": proposal.task,
                    "variants": proposal.variants,
                    "inputs": [
                        {"name": spec.name, "shape": spec.shape, "kind": spec.kind}
                        for spec in proposal.inputs
                    ],
                    "notes": proposal.notes,
                    "unsupported_ops": result.unsupported_ops,
                    "dvc_yaml": result.dvc_yaml,
                    "untracked": result.untracked,
                    "next": result.commit_steps(),
                },
                indent=2,
            )
        )
        return
    variants = ", ".join(f"{variant} ({tier})" for variant, tier in proposal.variants.items())
    _done(f"added [models.{proposal.name}] to {config_path}: {proposal.task}, variants {variants}")
    if result.unsupported_ops:
        _say(
            "warning: the installed MNN converter cannot convert these operators: "
            f"{', '.join(result.unsupported_ops)}; builds will fail until the model is "
            "exported without them"
        )
    for note in proposal.notes:
        _say(f"note: {note}")
    dvc_yaml = config_path.parent / "dvc.yaml"
    if result.dvc_yaml == "kept":
        _say(
            f"note: {dvc_yaml} was not written by edgereg, so it was left alone; "
            "`edgereg dvc sync` replaces it with the generated one"
        )
    else:
        _done(f"{dvc_yaml}: {result.dvc_yaml}")
    _say("next:")
    if not result.dvc_repo:
        _say("  dvc init            # no DVC repository here yet")
    _say(f"  dvc repro           # builds {', '.join(proposal.variants)}")
    _say("  edgereg report      # writes report.html")
    if result.untracked:
        # A clone without them cannot build. Small files may go to git instead.
        _say(
            f"  # not in git or DVC yet: {', '.join(result.untracked)}; `dvc add` keeps them "
            "out of git, `dvc push` needs a DVC remote (docs/own-repository.md)"
        )
    for step in result.commit_steps():
        _say(f"  {step}")


@click.command("pin")
@click.argument("models", nargs=-1)
@click.option("--check", is_flag=True, help="Only say which pins are stale; exit 1 when any is.")
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def pin_command(models: tuple[str, ...], check: bool, config_path: Path, as_json: bool) -> None:
    """Refresh the sha256 pins of MODELS (all when none) to the files as they are now."""
    from edgereg import config as config_module
    from edgereg.cli._common import warn_if_dvc_yaml_stale
    from edgereg.pins import check_pins, update_pins

    config = config_module.load(config_path)
    if check:
        pins = check_pins(config, list(models) or None)
        changed = [pin for pin in pins if pin.stale or pin.missing]
    else:
        changed = update_pins(config, list(models) or None)
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"key": p.key, "path": p.path, "pinned": p.pinned, "actual": p.actual}
                    for p in changed
                ],
                indent=2,
            )
        )
    else:
        for pin in changed:
            if check:
                _done(pin.describe())
            else:
                assert pin.actual is not None
                _done(f"{pin.key}: {pin.path}: sha256 {pin.pinned[:12]}… -> {pin.actual[:12]}…")
        if not changed:
            _done("every pin matches its file")
    if check and changed:
        raise SystemExit(ExitCode.ERROR)
    if changed and not check:
        warn_if_dvc_yaml_stale(config_module.load(config_path))
        _say("Rebuild what the new files change: dvc repro")
