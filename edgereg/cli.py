"""The edgereg command line: parse, call the library, print.

Results go to stdout, diagnostics to stderr; the exit codes are
``edgereg._cli_common.EXIT_CODES`` (docs/reference/exit-codes.md).
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from edgereg import __version__
from edgereg import config as config_module
from edgereg._cli_common import (
    DEFAULT_KEY_FILE,
    actor_name,
    add_global_options,
    build_dir,
    build_dir_option,
    config_option,
    default_key_file,
    endpoint_option,
    errors,
    exit_codes_help,
    expiry_days,
    handle_errors,
    json_option,
    open_registry,
    optional_config,
    print_note,
    print_result,
    registry_option,
    registry_read_options,
    registry_write_options,
    signer_from_options,
    stage_reporter,
    stderr,
    trusted_key_option,
)
from edgereg._files import atomic_write
from edgereg.errors import ConfigError, EdgeregError, UsageError


class _LazyGroup(click.Group):
    """Commands that live with their layer, imported only when asked for.

    `edgereg build` (run once per DVC stage) should not pay for importing the
    client SDK, the server or the report renderer.
    """

    LAZY: ClassVar[dict[str, str]] = {
        "add": "edgereg._onboard_cli:add_command",
        "analyze": "edgereg._analyze_cli:analyze_command",
        "init": "edgereg._onboard_cli:init_command",
        "pull": "edgereg.client._cli:pull_command",
        "report": "edgereg.report._cli:report_command",
        "serve": "edgereg.serve._cli:serve_command",
        "toolchain": "edgereg.toolchain._cli:toolchain_group",
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.LAZY})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY and cmd_name not in self.commands:
            module, attribute = self.LAZY[cmd_name].split(":")
            lazy: click.Command = getattr(importlib.import_module(module), attribute)
            self.add_command(lazy, cmd_name)
        command = super().get_command(ctx, cmd_name)
        return None if command is None else add_global_options(command)


MAIN_HELP = f"""Build MNN model variants per device tier and ship them to apps.

Results go to stdout, progress, notes and warnings to stderr. -v, -q and --json
work before or after the command (`edgereg status -q`). Commands find models.toml
in the working directory or the nearest parent, up to the repository root.

{exit_codes_help()}

Shell completion: eval "$(_EDGEREG_COMPLETE=bash_source edgereg)" (or
zsh_source, fish_source).
"""


@click.group(
    cls=_LazyGroup, help=MAIN_HELP, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(__version__, prog_name="edgereg")
@click.option("--verbose", "-v", is_flag=True, help="Show tracebacks on errors.")
@click.option("--quiet", "-q", is_flag=True, help="Print only results and errors.")
@click.option(
    "--json", "as_json", is_flag=True, help="Print JSON for scripts (commands that have --json)."
)
def main(verbose: bool, quiet: bool, as_json: bool) -> None:
    """The edgereg command group (its help is MAIN_HELP, which holds the exit codes)."""
    stderr.quiet = quiet


@main.command()
@config_option
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def validate(config_path: Path, as_json: bool) -> None:
    """Check models.toml and show which variant each tier gets."""
    config = config_module.load(config_path)
    _warn_if_dvc_yaml_stale(config)
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
                    "bundles": {
                        name: {"version": bundle.version, "models": list(bundle.models)}
                        for name, bundle in config.bundles.items()
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
    for name, bundle in config.bundles.items():
        print_result(f"bundle {name} {bundle.version}: {', '.join(bundle.models)} (one rollout)")
    for text in config.notes():
        print_note(f"note: {text}")


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
            ) from exc


@main.command()
@click.argument("model")
@click.argument("variant")
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
    _warn_if_dvc_yaml_stale(config)
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
    print_result(f"{model}/{variant}: built {result.out_dir / 'model.mnn'}")


@main.command()
@config_option
@build_dir_option
@click.option("--json", "as_json", is_flag=True, help="Print the rows as JSON.")
@handle_errors
def summary(config_path: Path, out_root: Path | None, as_json: bool) -> None:
    """Table of every built variant: tier, size, accuracy, recall, latency."""
    from edgereg.build.report import summary_rows

    config = config_module.load(config_path)
    stale = _warn_if_dvc_yaml_stale(config)
    rows = summary_rows(config, build_dir(out_root, config))
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    table = Table(title="edgereg build summary")
    for title in ("model", "variant", "tier"):
        table.add_column(title)
    for title in ("size MB", "metric", "value", "Δ", "cosine", "SNR dB", "host p50 ms"):
        table.add_column(title, justify="right")
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
            status,
        )
    Console(width=max(Console().width, 120)).print(table)
    stderr.print(
        "metric: the task's headline metric; Δ: change against the fp32 ONNX Runtime baseline "
        "on the labels, in percentage points (vs ref: the metric compares with the reference "
        "itself); cosine, SNR: worst output against the reference."
    )
    for row in rows:
        if row.get("failed"):
            # Plain text: gate names hold brackets ("min_cosine[logits]") rich would eat.
            click.echo(f"{row['model']}/{row['variant']} failed: " + "; ".join(row["failed"]))
            if row.get("hint"):
                click.echo("  " + row["hint"].replace("\n", "\n  "))
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


def _warn_if_dvc_yaml_stale(config: config_module.Config) -> str | None:
    from edgereg.build.dvc import stale_dvc_yaml

    stale = stale_dvc_yaml(config)
    if stale is not None:
        stderr.print(f"warning: {stale}", markup=False, soft_wrap=True)
    return stale


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
        print_result(f"{target} is up to date")
        return
    if current == text:
        print_result(f"{target} is up to date")
        return
    atomic_write(target, text)
    print_result(f"wrote {target}")


# --- registry: keys, publish, rollout ------------------------------------------


@main.group()
def keys() -> None:
    """Signing keys."""


@keys.command("generate")
@click.option(
    "--out",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Private key file to write (mode 0600); the public key goes next to it. "
    f"Default: {DEFAULT_KEY_FILE} beside models.toml.",
)
@click.option(
    "--add",
    is_flag=True,
    help="Add a key next to the pinned ones (rotation, a recovery key: docs/operations/keys.md).",
)
@click.option("--force", is_flag=True, help="Overwrite an existing private key file at --out.")
@click.option("--no-publish", is_flag=True, help="Do not put the public key into the registry.")
@registry_read_options
@handle_errors
def keys_generate(
    out: Path | None,
    add: bool,
    force: bool,
    no_publish: bool,
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Create an Ed25519 key pair, pin its public key in the project and publish it."""
    from edgereg.protocol.envelope import Signer, generate_key

    config = optional_config(config_path)
    out = out if out is not None else default_key_file(config)
    registry = None
    if not no_publish and (config is not None or registry_url is not None):
        registry = open_registry(config, registry_url, endpoint_url, trusted_key_paths, create=True)
    pin_dir = _pin_directory(config)
    _refuse_key_inside(out, registry, pin_dir)
    if out.exists() and not force:
        raise EdgeregError(
            f"{out} already exists; refusing to overwrite a private key",
            hint="Use it as it is, choose another --out, or pass --force.",
        )
    if not add:
        _refuse_second_key(config, trusted_key_paths, registry)
    private_pem, public_pem = generate_key()
    signer = Signer.from_pem(private_pem)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, private_pem, mode=0o600)
    public_path = out.with_name(out.stem + ".pub.pem")
    atomic_write(public_path, public_pem)
    if not as_json:
        print_result(f"wrote private key {out} (mode 0600) and public key {public_path}")
        print_result(f"key id {signer.key_id}")
    pinned_at = None
    if pin_dir is not None:
        pinned_at = pin_dir / f"{signer.key_id}.pem"
        pin_dir.mkdir(parents=True, exist_ok=True)
        atomic_write(pinned_at, public_pem)
        print_note(
            f"pinned the public key in {pinned_at}: commit it; registry commands verify "
            "against the keys pinned there"
        )
    elif config is None:
        stderr.print(
            f"no models.toml here, so the key is not pinned: pass --trusted-key {public_path} "
            "to registry commands",
            markup=False,
        )
    else:
        stderr.print(
            f"warning: [registry] trusted_keys of {config.path} names no directory to pin "
            f"the key in; add {public_path} to it",
            markup=False,
        )
    published_to = None
    if registry is not None:
        registry.add_public_key(signer)
        published_to = registry.storage.url
        print_note(f"published the public key to {published_to}")
    if as_json:
        click.echo(
            json.dumps(
                {
                    "key_id": signer.key_id,
                    "private_key": str(out),
                    "public_key": str(public_path),
                    "pinned": None if pinned_at is None else str(pinned_at),
                    "published_to": published_to,
                }
            )
        )


def _pin_directory(config: config_module.Config | None) -> Path | None:
    """The first directory of [registry] trusted_keys: where a new key is pinned."""
    if config is None:
        return None
    for path in config.trusted_key_paths():
        if path.is_dir() or (not path.exists() and path.suffix != ".pem"):
            return path
    return None


def _refuse_key_inside(out: Path, registry: Any, pin_dir: Path | None) -> None:
    """A private key never goes into the registry (it is served) or the pinned keys (committed)."""
    target = out.resolve()
    places = [("the pinned publisher keys", pin_dir)]
    root = getattr(registry.storage, "root", None) if registry is not None else None
    if isinstance(root, Path):
        places.append((f"the registry {registry.storage.url}", root))
    for what, place in places:
        if place is not None and target.is_relative_to(place.resolve()):
            raise EdgeregError(
                f"--out {out} is inside {what} ({place}); a private key there would be "
                "published or committed",
                hint=f"Keep the private key outside it, e.g. the default {DEFAULT_KEY_FILE}.",
            )


def _refuse_second_key(
    config: config_module.Config | None, trusted_key_paths: tuple[Path, ...], registry: Any
) -> None:
    """A second key needs --add: apps that trust the first would reject what it signs."""
    from edgereg._cli_common import pinned_keys
    from edgereg.protocol.envelope import TrustedKeys

    existing = dict(pinned_keys(config, trusted_key_paths))
    where = "pinned in the project"
    if not existing and registry is not None:
        existing = dict(registry.published_keys())
        where = f"published in {registry.storage.url}"
    if existing:
        known = ", ".join(keyid[:12] for keyid in TrustedKeys(existing.values()))
        raise EdgeregError(
            f"a publisher key already exists ({known}, {where}); a new key would sign "
            "documents that every app trusting the existing key rejects (unknown-key)",
            hint="Sign with the existing key (--key PATH). To rotate, or to make a recovery "
            "key, follow docs/operations/keys.md: `edgereg keys generate --add --out NEW.pem`.",
        )


@main.command()
@click.argument("model")
@click.option("--canary", default=None, help="Start with this share of devices, like 5%.")
@click.option("--full", is_flag=True, help="Release to every device at once.")
@click.option("--version", "version", default=None, help="Override models.toml's version.")
@build_dir_option
@registry_write_options
@handle_errors
def publish(
    model: str,
    canary: str | None,
    full: bool,
    version: str | None,
    out_root: Path | None,
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    key_paths: tuple[Path, ...],
    actor: str | None,
    as_json: bool,
) -> None:
    """Upload MODEL's built variants as a signed release and start its rollout.

    MODEL may name a bundle ([bundles.NAME] of models.toml): every member is
    released together under the bundle's version, with one rollout.
    """
    import semver

    from edgereg.registry import prepare_bundle_release, prepare_release, utcnow
    from edgereg.rollout import parse_percent

    if (canary is None) == (not full):
        raise UsageError(
            "choose how to release: --canary PERCENT (for example --canary 5%) or --full"
            + (", not both" if full else "")
        )
    percent = parse_percent(canary, option="--canary") if canary is not None else None
    config = config_module.load(config_path)
    stale = _warn_if_dvc_yaml_stale(config)
    is_bundle = model in config.bundles
    if not is_bundle:
        if model not in config.models:
            raise _no_such_model(config, model)
        _refuse_bundle_member(config, model)
    version = version or (config.bundles[model] if is_bundle else config.models[model]).version
    if not semver.Version.is_valid(version):
        raise UsageError(f"--version {version!r} is not a semantic version like 1.2.0")
    report_url = _report_url(config)
    signer = signer_from_options(key_paths, config)
    registry = open_registry(config, registry_url, endpoint_url, trusted_key_paths, create=True)
    try:
        prepare = prepare_bundle_release if is_bundle else prepare_release
        prepared = prepare(
            config, model, build_dir(out_root, config), version=version, now=utcnow()
        )
    except EdgeregError as exc:
        if stale is not None:
            exc.hint = f"{stale}."  # `dvc repro` alone fails on a stale dvc.yaml
        raise
    with stage_reporter(f"publish {model} {version}") as on_step:
        result = registry.publish(
            prepared,
            signer=signer,
            percent=percent,
            full=full,
            actor=actor_name(actor),
            expires_days=expiry_days(config),
            on_step=on_step,
            report_url=report_url,
        )
    members = _member_versions(prepared.record)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": result.model,
                    "version": result.version,
                    "already_published": result.already_published,
                    "uploaded_blobs": result.uploaded_blobs,
                    "uploaded_bytes": result.uploaded_bytes,
                    "sequence": result.state.sequence,
                    "percent": result.state.percent,
                    **({"bundle": True, "members": members} if is_bundle else {}),
                }
            )
        )
        return
    if members:
        listed = ", ".join(f"{name} {member}" for name, member in members.items())
        print_result(f"bundle {model} {version}: {listed}")
    if result.already_published:
        hint = ""
        if result.state.candidate == version:
            hint = f"; change its share with `edgereg rollout {model} --to PERCENT`"
        print_result(
            f"{model} {version} was already published; manifests are up to date. "
            f"{_describe_state(result.state)}{hint}."
        )
        return
    if result.state.stable == version:
        what = "the first release, now the stable release for every device"
    else:
        what = "rolling out to " + ("every device" if full else f"{percent:g}% of devices")
    print_result(
        f"published {model} {version} to {registry.storage.url}: "
        f"{result.uploaded_blobs} new blob(s), {result.uploaded_bytes} bytes; "
        f"{what} (sequence {result.state.sequence})"
    )


def _refuse_bundle_member(config: config_module.Config, model: str) -> None:
    """A bundle's member ships only with the bundle: one rollout decides what devices run."""
    bundle = config.bundle_of(model)
    if bundle is not None:
        raise UsageError(
            f"model '{model}' ships in bundle '{bundle}' ([bundles.{bundle}] of "
            f"{config.path}), so it is published only with the bundle; published alone, "
            "devices could run it beside members of another version",
            hint=f"Publish the bundle: edgereg publish {bundle} --canary 5%",
        )


def _report_url(config: config_module.Config | None) -> Any:
    """[reports] url, checked against the wire format; KEEP (the state's) without models.toml."""
    from pydantic import TypeAdapter, ValidationError

    from edgereg.protocol.wire import ReportUrl
    from edgereg.registry import KEEP

    if config is None:
        return KEEP
    url = config.reports.url
    if url is None:
        return None
    try:
        return TypeAdapter(ReportUrl).validate_python(url)
    except ValidationError as exc:
        raise ConfigError(
            f"{url!r} is not a report URL: expected an http(s) URL without spaces, or a "
            "path relative to the registry root such as v1/reports",
            file=str(config.path),
            key_path="reports.url",
        ) from exc


def _member_versions(record: Any) -> dict[str, str]:
    """A bundle release's members and their versions (empty for a model's release)."""
    from edgereg.protocol.wire import BundleRecord

    if not isinstance(record, BundleRecord):
        return {}
    # By name, as the signed record (canonical JSON) keeps them.
    return {name: record.members[name].version for name in sorted(record.members)}


def _apply_transition(
    model: str,
    options: dict[str, Any],
    transition: Callable[..., Any],
    arguments: Callable[[config_module.Config | None, Any], dict[str, Any]] | None = None,
) -> None:
    """Run one rollout transition of ``edgereg.registry._transitions`` and report the state.

    Args:
        model: The model whose rollout changes.
        options: The registry write options (see ``registry_write_options``).
        transition: Called as ``transition(state, model, now=, expires=, actor=, **extra)``.
        arguments: Returns the transition's extra keyword arguments, given the
            configuration (None without a models.toml) and the registry.
    """
    config = optional_config(options["config_path"])
    in_bundle = config is not None and config.bundle_of(model) is not None
    try:
        registry = open_registry(
            config, options["registry_url"], options["endpoint_url"], options["trusted_key_paths"]
        )
        # A model published alone before it joined a bundle keeps its own
        # rollout (it can still be rolled back or re-signed); a new one has none.
        unpublished_member = in_bundle and registry.read_state(model)[0] is None
    except EdgeregError:
        if not in_bundle:
            raise
        unpublished_member = True
    if unpublished_member:
        assert config is not None
        _refuse_bundle_member(config, model)
    extra = arguments(config, registry) if arguments is not None else {}
    actor = actor_name(options["actor"])
    state = registry.change(
        model,
        lambda current, now, expires: transition(
            current, model, now=now, expires=expires, actor=actor, **extra
        ),
        signer=signer_from_options(options["key_paths"], config),
        expires_days=expiry_days(config),
        report_url=_report_url(config),
    )
    _report_state(state, options["as_json"])


def _report_state(state: Any, as_json: bool) -> None:
    """The new rollout state: JSON for scripts or one line for people, on stdout."""
    if as_json:
        click.echo(
            json.dumps(
                {
                    "model": state.model,
                    "sequence": state.sequence,
                    **state.snapshot().model_dump(mode="json"),
                }
            )
        )
    else:
        print_result(_describe_state(state))


def _describe_state(state: Any) -> str:
    if state.candidate is None and state.stable is None:
        return (
            f"{state.model}: withdrawn, no release for any device; every tier's manifest "
            f"now offers none (sequence {state.sequence})"
        )
    if state.candidate is None:
        return f"{state.model}: stable {state.stable} for every device (sequence {state.sequence})"
    paused = ", paused" if state.paused else ""
    return (
        f"{state.model}: candidate {state.candidate} at {state.percent:g}%{paused}, "
        f"stable {state.stable or 'none'} (sequence {state.sequence})"
    )


@main.command()
@click.argument("model")
@click.option("--to", "to_percent", default=None, help="Move the candidate to this share.")
@click.option("--next", "next_step", is_flag=True, help="Move to the policy's next step.")
@click.option("--force", is_flag=True, help="Ignore the soak time (recorded in the history).")
@click.option(
    "--auto",
    is_flag=True,
    help="Let the canary analysis decide: next step or promote when every guardrail passes "
    "and the soak time is over, halt when a critical one fails, else wait. Safe to repeat.",
)
@click.option("--reports", "reports_url", default=None, help="With --auto: the report store.")
@registry_write_options
@handle_errors
def rollout(
    model: str,
    to_percent: str | None,
    next_step: bool,
    force: bool,
    auto: bool,
    reports_url: str | None,
    **options: Any,
) -> None:
    """Raise (or lower) the share of devices that get MODEL's candidate."""
    from edgereg.registry._transitions import set_percent
    from edgereg.rollout import parse_percent

    if auto or reports_url is not None:
        from edgereg._analyze_cli import auto_rollout

        if not auto:
            raise UsageError("--reports is for --auto: the report store the analysis reads")
        if to_percent is not None or next_step or force:
            raise UsageError("--auto decides the percent itself: drop --to, --next and --force")
        auto_rollout(model, {**options, "reports_url": reports_url})
        return
    if (to_percent is None) == (not next_step):
        raise UsageError(
            "choose --to PERCENT (for example --to 25%), --next or --auto"
            + (", not both" if next_step else "")
        )
    percent = parse_percent(to_percent, option="--to") if to_percent is not None else None
    _apply_transition(
        model,
        options,
        set_percent,
        lambda config, _registry: {
            "percent": percent,
            "force": force,
            "policy": config.rollout_policy(model) if config else config_module.RolloutPolicy(),
        },
    )


@main.command()
@click.argument("model")
@click.option("--force", is_flag=True, help="Promote a canary never rolled out (recorded).")
@registry_write_options
@handle_errors
def promote(model: str, force: bool, **options: Any) -> None:
    """Make MODEL's candidate the stable release for every device."""
    from edgereg.registry._transitions import promote as promote_state

    _apply_transition(model, options, promote_state, lambda _config, _registry: {"force": force})


@main.command()
@click.argument("model")
@click.option("--to-version", default=None, help="Restore this earlier release as stable.")
@registry_write_options
@handle_errors
def rollback(model: str, to_version: str | None, **options: Any) -> None:
    """Drop MODEL's candidate, or restore an earlier stable with --to-version."""
    from edgereg.registry._transitions import rollback as rollback_state

    _apply_transition(
        model,
        options,
        rollback_state,
        lambda _config, registry: {
            "to_version": to_version,
            "published": set(registry.versions(model)),
        },
    )


def _simple_transition(name: str, doc: str) -> None:
    @main.command(name=name, help=doc)
    @click.argument("model")
    @registry_write_options
    @handle_errors
    def command(model: str, **options: Any) -> None:
        from edgereg.registry import _transitions

        _apply_transition(model, options, getattr(_transitions, name))


_simple_transition("pause", "Stop handing out MODEL's candidate; every device gets stable.")
_simple_transition("resume", "Hand out MODEL's candidate again at its percent.")
_simple_transition("resign", "Renew the expiry and signatures of MODEL's state and manifests.")


@main.command()
@click.argument("model", required=False)
@click.option(
    "--html",
    "html_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    default=None,
    help="Also write the operator page of `edgereg serve` (gates, next steps, warnings) "
    "to this self-contained HTML file, for a registry without a server.",
)
@registry_read_options
@handle_errors
def status(
    model: str | None,
    html_path: Path | None,
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Every model's stable and candidate versions, rollout percent and tiers."""
    from edgereg.registry import model_status

    if html_path is not None and not html_path.parent.is_dir():
        raise UsageError(
            f"--html {html_path}: the directory {html_path.parent} does not exist",
            hint="Create it first, or pick a file in an existing directory.",
        )
    config = optional_config(config_path)
    registry = open_registry(config, registry_url, endpoint_url, trusted_key_paths)
    names = [model] if model else registry.models()
    statuses = []
    for name in names:
        try:
            statuses.append(model_status(registry, name))
        except KeyError:
            raise EdgeregError(
                f"model '{name}' has no release in {registry.storage.url}",
                hint=f"Publish one: edgereg publish {name} --canary 5%",
            ) from None
    if html_path is not None:  # after the checks above, so a failing status writes no page
        _write_status_page(html_path, registry, config, pinned=bool(config or trusted_key_paths))
    for st in statuses:
        for warning in st.warnings:
            errors.print(f"[bold red]WARNING:[/] {escape(warning)}", markup=True)
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in statuses], indent=2))
        return
    if not statuses:
        print_result(f"no models in {registry.storage.url} yet")
        print_note("publish one with `edgereg publish MODEL --canary 5%`")
        return
    table = Table(title=f"registry {registry.storage.url}")
    any_bundle = any(st.bundle for st in statuses)
    titles = ["model", "stable", "candidate", "rollout", "tier"]
    titles += ["member", "variant", "size KB"] if any_bundle else ["variant", "size KB"]
    for title in titles:
        table.add_column(title)
    for st in statuses:
        rollout_text = "-"
        if st.candidate is not None:
            rollout_text = f"{st.percent:g}%" + (" paused" if st.paused else "")
        for index, tier in enumerate(st.tiers):
            variants = " -> ".join(
                v for v in (tier.stable_variant, tier.candidate_variant) if v is not None
            )
            sizes = " -> ".join(
                f"{size / 1e3:.1f}"
                for size in (tier.stable_size, tier.candidate_size)
                if size is not None
            )
            first = index == 0
            new_tier = first or st.tiers[index - 1].tier != tier.tier
            member_cell = (_member_cell(st, tier.member),) if any_bundle else ()
            table.add_row(
                (f"{st.model} (bundle)" if st.bundle else st.model) if first else "",
                (st.stable or "-") if first else "",
                (st.candidate or "-") if first else "",
                rollout_text if first else "",
                tier.tier if new_tier else "",
                *member_cell,
                variants,
                sizes,
            )
    Console(width=max(Console().width, 100)).print(table)


def _member_cell(status: Any, member: str | None) -> str:
    """A bundle member and its versions, stable -> candidate ("-" for a model's row)."""
    if member is None:
        return "-"
    for found in status.members:
        if found.name == member:
            versions = dict.fromkeys(v for v in (found.stable, found.candidate) if v is not None)
            return f"{member} {' -> '.join(versions)}"
    return member


def _write_status_page(
    path: Path, registry: Any, config: config_module.Config | None, *, pinned: bool
) -> None:
    """The page `edgereg serve` shows at /, as one file (every model, like the server)."""
    from edgereg.serve._status_page import render_status_page

    if pinned:
        registry.trusted_keys()  # a bad pinned key file is an error, not an unverified page
    page = render_status_page(
        registry.storage,
        trusted=registry.trusted_keys if pinned else None,
        policy=config.rollout_policy if config is not None else None,
    )
    atomic_write(path, page)
    print_note(f"wrote the status page to {path}")


@main.command()
@click.argument("model")
@registry_read_options
@handle_errors
def history(
    model: str,
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    trusted_key_paths: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Who changed MODEL's rollout, what and when, from the signed state."""
    from edgereg.protocol.wire import format_time

    registry = open_registry(
        optional_config(config_path), registry_url, endpoint_url, trusted_key_paths
    )
    state, _ = registry.read_state(model)
    if state is None:
        raise EdgeregError(
            f"model '{model}' has no release in {registry.storage.url}",
            hint=f"Publish one: edgereg publish {model} --canary 5%",
        )
    if as_json:
        click.echo(json.dumps([event.model_dump(mode="json") for event in state.history], indent=2))
        return
    table = Table(title=f"{model} history")
    for title in ("seq", "when (UTC)", "who", "action", "stable", "candidate", "note"):
        table.add_column(title)
    for event in state.history:
        after = event.after
        candidate = "-"
        if after.candidate:
            candidate = f"{after.candidate} @ {after.percent:g}%" + (
                " paused" if after.paused else ""
            )
        note = " ".join(part for part in (event.note, "FORCED" if event.forced else None) if part)
        table.add_row(
            str(event.sequence),
            format_time(event.at),
            event.actor,
            event.action,
            after.stable or "-",
            candidate,
            note,
        )
    Console(width=max(Console().width, 110)).print(table)
    _print_bundle_versions(registry, state)


def _print_bundle_versions(registry: Any, state: Any) -> None:
    """Under a bundle's history: which member versions each bundle version holds."""
    from edgereg.protocol.wire import BundleRecord

    versions: dict[str, None] = {}
    for event in state.history:
        for version in (event.after.stable, event.after.candidate):
            if version is not None:
                versions[version] = None
    lines = []
    for version in versions:
        try:
            record = registry.read_release(state.model, version)
        except EdgeregError as exc:
            lines.append(f"{state.model} {version}: cannot read its release ({exc.message})")
            continue
        if not isinstance(record, BundleRecord):
            return  # a model: its history says it all
        members = ", ".join(f"{name} {m.version}" for name, m in record.members.items())
        lines.append(f"bundle {state.model} {version}: {members}")
    for line in lines:
        print_result(line)


@main.command()
@config_option
@registry_option
@endpoint_option
@click.option("--shallow", is_flag=True, help="Check blob sizes only, not their sha256.")
@trusted_key_option
@json_option
@handle_errors
def verify(
    config_path: Path,
    registry_url: str | None,
    endpoint_url: str | None,
    shallow: bool,
    trusted_key_paths: tuple[Path, ...],
    as_json: bool,
) -> None:
    """Check every signature, digest and reference in the registry, against the pinned keys.

    Also reports what does not belong in keys/: keys not pinned in the project
    (planted?), private keys, files that are not keys.
    """
    # keys/ is only as trustworthy as write access to the registry; apps pin
    # their keys, and this checks the registry the way they see it.
    registry = open_registry(
        optional_config(config_path), registry_url, endpoint_url, trusted_key_paths
    )
    registry.trusted_keys()  # a bad pinned key file is an error of its own, not a finding
    report = registry.verify(deep=not shallow)
    if as_json:
        click.echo(
            json.dumps(
                {
                    "ok": report.ok,
                    "checked": report.checked,
                    "errors": report.errors,
                    "warnings": report.warnings,
                },
                indent=2,
            )
        )
    else:
        # The findings are verify's result: stdout, like the table of `status`.
        for warning in report.warnings:
            print_result(f"warning: {warning}")
        for error in report.errors:
            print_result(f"error: {error}")
        verdict = "ok" if report.ok else f"{len(report.errors)} problem(s)"
        print_result(f"{registry.storage.url}: {report.checked} objects checked, {verdict}")
    if not report.ok:
        sys.exit(VERIFY_FAILED)


VERIFY_FAILED = 9


def _no_such_model(config: config_module.Config, model: str) -> ConfigError:
    if not config.models:
        return ConfigError(
            f"no model '{model}': the file declares no models yet",
            file=str(config.path),
            hint="Add one with `edgereg add path/to/model.onnx --evaluation data.npz`.",
        )
    bundles = f"; bundles: {', '.join(config.bundles)}" if config.bundles else ""
    return ConfigError(
        f"no model '{model}'; models: {', '.join(config.models)}{bundles}", file=str(config.path)
    )


def _require_variant(config: config_module.Config, model: str, variant: str) -> None:
    if model not in config.models:
        raise _no_such_model(config, model)
    if variant not in config.models[model].variants:
        raise ConfigError(
            f"model '{model}' has no variant '{variant}'; variants: "
            f"{', '.join(config.models[model].variants)}",
            file=str(config.path),
        )


if __name__ == "__main__":  # pragma: no cover
    main()
