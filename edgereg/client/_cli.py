"""``edgereg pull``: run the client SDK from the command line.

A click command object; :mod:`edgereg.cli` registers it. It handles its own
errors (one message on stderr, the error's exit code) so it needs nothing
from the CLI module and can be tried on its own.
"""

from __future__ import annotations

import contextlib
import json
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TextColumn,
    TransferSpeedColumn,
)

from edgereg import config as config_module
from edgereg._cli_common import INTERRUPTED, Seconds, config_option_for, root_flag
from edgereg.client._updater import (
    Client,
    FetchResult,
    Limits,
    open_fetcher,
    unsafe_registry_keys,
)
from edgereg.errors import EdgeregError
from edgereg.protocol.rules import explain_tier
from edgereg.rollout import DeviceProfile, resolve_tier
from edgereg.signing import TrustedKeys, load_public_key

__all__ = ["pull_command"]

TOFU_WARNING = (
    "WARNING: --unsafe-trust-registry-keys: trusting the public keys the registry itself "
    "publishes (trust on first use). Anyone who can change the registry or the connection "
    "can sign manifests this accepts. Apps must ship the registry's public key; use "
    "--trusted-key FILE."
)


@click.command("pull")
@click.argument("model")
@click.option(
    "--registry",
    "registry_url",
    required=True,
    help="Registry root: http(s)://… or file://… (what `edgereg serve` or a static host serves).",
)
@click.option("--device-id", required=True, help="Sticky device id (decides the cohort).")
@click.option("--ram-mb", type=click.IntRange(min=0), default=None, help="Device RAM in MB.")
@click.option("--cpu-cores", type=click.IntRange(min=1), default=None, help="CPU cores.")
@click.option("--soc", default=None, help="SoC name, like 'Snapdragon 8 Gen 2'.")
@click.option("--os", "os_name", type=click.Choice(["android", "ios"]), default=None)
@click.option("--os-version", default=None, help="OS version.")
@click.option("--abi", default=None, help="CPU ABI, like arm64-v8a.")
@click.option("--mnn-runtime", default=None, help="MNN runtime version in the app, like 3.6.1.")
@click.option("--tier", default=None, help="The device's tier (default: resolved from --config).")
@config_option_for("models.toml whose [tiers] resolve the tier when --tier is not given.")
@click.option(
    "--trusted-key",
    "trusted_key_files",
    multiple=True,
    type=click.Path(path_type=Path, dir_okay=False, exists=True),
    help="Public key (PEM) manifests must be signed by; repeat for several.",
)
@click.option(
    "--unsafe-trust-registry-keys",
    is_flag=True,
    help="Trust the keys the registry publishes under keys/ (trust on first use; unsafe).",
)
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(path_type=Path, file_okay=False),
    help="The client cache directory (blobs/, state/, installed.json).",
)
@click.option(
    "--timeout",
    type=Seconds(),
    default=30.0,
    show_default=True,
    help="Seconds for connecting, for each read, and for a response's headers.",
)
@click.option(
    "--deadline",
    type=Seconds(),
    default=600.0,
    show_default=True,
    help="Seconds the whole pull (manifest and blob) may take.",
)
@click.option(
    "--min-rate",
    type=click.IntRange(min=0),
    default=1024,
    show_default=True,
    help="Bytes/s a download must average over each --timeout window (0: no minimum).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def pull_command(
    model: str,
    registry_url: str,
    device_id: str,
    ram_mb: int | None,
    cpu_cores: int | None,
    soc: str | None,
    os_name: str | None,
    os_version: str | None,
    abi: str | None,
    mnn_runtime: str | None,
    tier: str | None,
    config_path: Path,
    trusted_key_files: tuple[Path, ...],
    unsafe_trust_registry_keys: bool,
    out_dir: Path,
    timeout: float,
    deadline: float,
    min_rate: int,
    as_json: bool,
) -> None:
    """Fetch MODEL for one device as an app would: verify, choose, download, install."""
    if not trusted_key_files and not unsafe_trust_registry_keys:
        raise click.UsageError(
            "give --trusted-key FILE (the registry's public key, from `edgereg keys "
            "generate`), or --unsafe-trust-registry-keys to trust the registry's own keys/"
        )
    if trusted_key_files and unsafe_trust_registry_keys:
        raise click.UsageError("give --trusted-key or --unsafe-trust-registry-keys, not both")
    try:
        device = DeviceProfile(
            device_id=device_id,
            ram_mb=ram_mb if ram_mb is not None else 0,
            cpu_cores=cpu_cores if cpu_cores is not None else 1,
            soc=soc,
            os=os_name,  # click.Choice checked it
            os_version=os_version,
            abi=abi,
            mnn_runtime=mnn_runtime,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    try:
        if tier is None:
            if ram_mb is None or cpu_cores is None:
                raise click.UsageError(
                    "give --tier, or --ram-mb and --cpu-cores (and --soc, --os) to resolve "
                    f"the tier from {config_path}"
                )
            declared = config_module.load(config_path).tiers
            tier = resolve_tier(declared, device)
            for line in explain_tier(declared, device):
                click.echo(line, err=True)
        elif config_path.exists():
            tiers = config_module.load(config_path).tiers
            if tier not in tiers:
                raise click.UsageError(
                    f"--tier {tier!r} is not a tier of {config_path}; tiers: {', '.join(tiers)}"
                )
        if trusted_key_files:
            trusted = TrustedKeys(load_public_key(path.read_bytes()) for path in trusted_key_files)
        else:
            click.echo(TOFU_WARNING, err=True)
            fetcher = open_fetcher(
                registry_url,
                timeout=timeout,
                limits=Limits(timeout=timeout, deadline=deadline, min_rate=min_rate),
            )
            fetcher.start_deadline()
            trusted = unsafe_registry_keys(fetcher, model, tier)
        client = Client(
            registry_url,
            trusted,
            out_dir,
            model=model,
            device=device,
            tier=tier,
            timeout=timeout,
            deadline=deadline,
            min_rate=min_rate,
        )
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    except (EdgeregError, OSError) as exc:
        _fail(exc)
    try:
        with _download_progress(client, enabled=not as_json):
            result = client.fetch()
    except KeyboardInterrupt:
        # Like every edgereg command (exit 130), not click's "Aborted!" with exit 1.
        click.echo("interrupted", err=True)
        sys.exit(INTERRUPTED)
    if as_json:
        click.echo(json.dumps(_as_json(result), indent=2))
    else:
        _print(result)
    if result.exception is not None:
        sys.exit(result.exception.exit_code)


def _fail(exc: EdgeregError | OSError) -> NoReturn:
    if root_flag("verbose"):
        traceback.print_exc()
    if isinstance(exc, EdgeregError):
        click.echo(f"error: {exc.diagnostics()}", err=True)
        sys.exit(exc.exit_code)
    click.echo(f"error: {exc}", err=True)
    sys.exit(1)


def _as_json(result: FetchResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "tier": result.tier,
        "path": None if result.path is None else str(result.path),
        "version": result.version,
        "variant": result.variant,
        "sha256": result.sha256,
        "is_candidate": result.is_candidate,
        "min_mnn_runtime": result.min_mnn_runtime,
        "runtime": None if result.runtime is None else result.runtime.model_dump(mode="json"),
        "updated": result.updated,
        "not_modified": result.not_modified,
        "downloaded_bytes": result.downloaded_bytes,
        "runtime_fallback": result.runtime_fallback,
        "error": result.error,
        "error_code": result.error_code,
    }


def _print(result: FetchResult) -> None:
    if result.error is not None:
        click.echo(f"update failed ({result.error_code}): {result.error}", err=True)
        if result.exception is not None and result.exception.hint:
            click.echo(result.exception.hint, err=True)
    if result.path is None:
        if result.error is None:
            click.echo(
                f"{result.model}: nothing for this device in tier {result.tier} yet (the first "
                "release is a canary and this device is outside its cohort)"
            )
        else:
            click.echo(f"{result.model}: no model installed")
        return
    role = "candidate" if result.is_candidate else "stable"
    if result.runtime_fallback:
        role += ", the candidate needs a newer MNN runtime"
    keeping = "keeping " if result.error is not None else ""
    click.echo(
        f"{keeping}{result.model} {result.version} variant {result.variant} "
        f"for tier {result.tier} ({role})"
    )
    click.echo(f"  path: {result.path}")
    if result.runtime is not None:
        hints = result.runtime
        click.echo(
            f"  runtime: threads={hints.threads} backends={','.join(hints.backends)} "
            f"precision={hints.precision} (needs MNN >= {result.min_mnn_runtime})"
        )
    if result.error is None:
        if result.updated:
            click.echo(f"  installed ({result.downloaded_bytes} bytes downloaded)")
        else:
            click.echo(f"  up to date ({result.downloaded_bytes} bytes downloaded)")


@contextlib.contextmanager
def _download_progress(client: Client, *, enabled: bool) -> Iterator[None]:
    """A progress bar on a terminal while the blob downloads; nothing otherwise."""
    console = Console(stderr=True)
    if not enabled or not console.is_terminal:
        yield
        return
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{client.model} ({client.tier})", total=None)

        def update(received: int, total: int) -> None:
            progress.update(task, completed=received, total=total)

        client.on_progress = update
        try:
            yield
        finally:
            client.on_progress = None
