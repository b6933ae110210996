"""``edgereg pull``: run the client SDK from the command line.

A click command object; :mod:`edgereg.cli` registers it. Its errors go through
the one handler of every command (:func:`~edgereg.cli._common.handle_errors`):
one message on stderr and the error's exit code, exit 70 with the one line
for an unexpected exception.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

import click

from edgereg.cli._common import (
    Seconds,
    UnitName,
    config_option_for,
    echo,
    exit_with,
    handle_errors,
    root_flag,
)
from edgereg.client import (
    BundledRelease,
    Client,
    Conditions,
    DownloadPolicy,
    FetchResult,
    InstalledModel,
    Limits,
    Status,
    UnitKind,
    open_fetcher,
    unit_status,
    unsafe_registry_keys,
)
from edgereg.errors import EdgeregError, ExitCode
from edgereg.protocol.envelope import TrustedKeys, load_public_key
from edgereg.protocol.rules import DeviceProfile, explain_tier, resolve_tier

if TYPE_CHECKING:
    # Imported where used: a pull does what curl would, and its start-up is most of its
    # time (benchmarks/startup.py). models.toml's schema only when it resolves or checks
    # the tier; rich only for a progress bar on a terminal; the self-test only with it.
    from edgereg.client import SelfTest

__all__ = ["pull_command"]

TOFU_WARNING = (
    "WARNING: --unsafe-trust-registry-keys: trusting the public keys the registry itself "
    "publishes (trust on first use). Anyone who can change the registry or the connection "
    "can sign manifests this accepts. Apps must ship the registry's public key; use "
    "--trusted-key FILE."
)


@click.command("pull")
@click.argument("model", required=False, type=UnitName("model"))
@click.option(
    "--bundle",
    type=UnitName("bundle"),
    default=None,
    help="Pull a bundle (models that ship together) instead.",
)
@click.option(
    "--registry",
    "registry_url",
    default=None,
    help="Registry root: http(s)://… or file://… (what `edgereg serve` or a static host serves).",
)
@click.option("--device-id", default=None, help="Sticky device id (decides the cohort).")
@click.option("--ram-mb", type=click.IntRange(min=0), default=None, help="Device RAM in MB.")
@click.option("--cpu-cores", type=click.IntRange(min=1), default=None, help="CPU cores.")
@click.option("--soc", default=None, help="SoC name, like 'Snapdragon 8 Gen 2'.")
@click.option("--os", "os_name", type=click.Choice(["android", "ios"]), default=None)
@click.option("--os-version", default=None, help="OS version: Android API level or iOS version.")
@click.option("--abi", default=None, help="CPU ABI, like arm64-v8a.")
@click.option("--mnn-runtime", default=None, help="MNN runtime version in the app, like 3.6.1.")
@click.option("--app-version", default=None, help="The app's version, for requires.app.")
@click.option(
    "--cpu-features",
    default=None,
    metavar="NAMES",
    help="The device's CPU features, comma-separated (like dotprod,fp16,i8mm; 'none' for "
    "none), for entries that avoid some (docs/protocol.md §7, rule e). Default: read from "
    "this machine.",
)
@click.option(
    "--memory-budget-mb",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="How much memory the model (a bundle: its members together) may take, MiB; "
    "an entry whose measured peak is above it does not fit.",
)
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
    "--status",
    "show_status",
    is_flag=True,
    help="Print what is installed, pending and failing in --out, and exit (no network).",
)
@click.option(
    "--offline-release",
    type=click.Path(path_type=Path, file_okay=False, exists=True),
    default=None,
    help="A release shipped with the app: a registry copy, or a manifest.json beside its "
    "blobs (named by sha256). Installed first when nothing newer is.",
)
@click.option("--metered", is_flag=True, help="Pretend the network is metered.")
@click.option("--charging", is_flag=True, help="Pretend the device is charging.")
@click.option(
    "--allow-metered/--no-allow-metered",
    default=True,
    show_default=True,
    help="Download blobs over a metered network.",
)
@click.option("--require-charging", is_flag=True, help="Download blobs only while charging.")
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
    help="Seconds the whole pull (manifest and blobs) may take.",
)
@click.option(
    "--min-rate",
    type=click.IntRange(min=0),
    default=1024,
    show_default=True,
    help="Bytes/s a download must average over each --timeout window (0: no minimum).",
)
@click.option(
    "--self-test",
    is_flag=True,
    help="Run each model's golden probe on its hinted backends before installing it "
    "(docs/protocol.md §11); print the backend chosen and the ones skipped.",
)
@click.option(
    "--report/--no-report",
    default=True,
    show_default=True,
    help="Send the anonymous report the manifest asks for (no device id).",
)
@click.option(
    "--explain",
    is_flag=True,
    help="Also print why this device got what it got: its cohort bucket against the "
    "rollout percentage.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@handle_errors
def pull_command(
    model: str | None,
    bundle: str | None,
    registry_url: str | None,
    device_id: str | None,
    ram_mb: int | None,
    cpu_cores: int | None,
    soc: str | None,
    os_name: str | None,
    os_version: str | None,
    abi: str | None,
    mnn_runtime: str | None,
    app_version: str | None,
    cpu_features: str | None,
    memory_budget_mb: float | None,
    tier: str | None,
    config_path: Path,
    trusted_key_files: tuple[Path, ...],
    unsafe_trust_registry_keys: bool,
    out_dir: Path,
    show_status: bool,
    offline_release: Path | None,
    metered: bool,
    charging: bool,
    allow_metered: bool,
    require_charging: bool,
    timeout: float,
    deadline: float,
    min_rate: int,
    self_test: bool,
    report: bool,
    explain: bool,
    as_json: bool,
) -> None:
    """Fetch MODEL (or --bundle NAME) for one device as an app would, and install it."""
    if (model is None) == (bundle is None):
        raise click.UsageError("give MODEL or --bundle NAME (exactly one)")
    unit = model if model is not None else bundle
    assert unit is not None
    kind: UnitKind = "bundle" if bundle is not None else "model"
    if show_status:
        status = unit_status(out_dir, unit, kind, tier)
        if as_json:
            click.echo(json.dumps(_status_json(status), indent=2))
        else:
            echo(_status_text(status))
        return
    if registry_url is None or device_id is None:
        raise click.UsageError("give --registry URL and --device-id ID (or --status)")
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
        if tier is None or config_path.exists():
            from edgereg import config as config_module
        if tier is None:
            if ram_mb is None or cpu_cores is None:
                raise click.UsageError(
                    "give --tier, or --ram-mb and --cpu-cores (and --soc, --os) to resolve "
                    f"the tier from {config_path}"
                )
            declared = config_module.load(config_path).tiers
            tier = resolve_tier(declared, device)
            for line in explain_tier(declared, device):
                echo(line, err=True)
        elif config_path.exists():
            tiers = config_module.load(config_path).tiers
            if tier not in tiers:
                raise click.UsageError(
                    f"--tier {tier!r} is not a tier of {config_path}; tiers: {', '.join(tiers)}"
                )
        shipped = None
        if offline_release is not None:
            shipped = BundledRelease.from_dir(offline_release, unit, tier)
        if trusted_key_files:
            trusted = TrustedKeys(load_public_key(path.read_bytes()) for path in trusted_key_files)
        else:
            echo(TOFU_WARNING, err=True)
            fetcher = open_fetcher(
                registry_url,
                timeout=timeout,
                limits=Limits(timeout=timeout, deadline=deadline, min_rate=min_rate),
            )
            fetcher.start_deadline()
            trusted = unsafe_registry_keys(fetcher, unit, tier)
        client = Client(
            registry_url,
            trusted,
            out_dir,
            model=model,
            bundle=bundle,
            device=device,
            tier=tier,
            app_version=app_version,
            cpu_features=_features(cpu_features),
            memory_budget_mb=memory_budget_mb,
            policy=DownloadPolicy(allow_metered=allow_metered, require_charging=require_charging),
            bundled=shipped,
            self_test=self_test,
            reporting=report,
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
            result = client.fetch(Conditions(metered=metered, charging=charging))
    except KeyboardInterrupt:
        # Like every edgereg command (exit 130), not click's "Aborted!" with exit 1.
        echo("interrupted", err=True)
        sys.exit(ExitCode.INTERRUPTED)
    finally:
        client.close()
    if as_json:
        data = _as_json(result)
        if client.self_test is not None:
            data["self_test"] = _self_test_json(client.self_test)
        click.echo(json.dumps(data, indent=2))
    else:
        _print(result)
        if client.self_test is not None:
            _print_self_test(client.self_test)
        if explain:
            click.echo(_explain_cohort(result), err=True)
    if result.exception is not None:
        sys.exit(result.exception.exit_code)


def _explain_cohort(result: FetchResult) -> str:
    """``--explain``'s cohort line: where the device stands in the rollout it was told of."""
    if result.cohort is not None:
        return result.cohort.describe()
    if result.error is not None:
        return "cohort: not known (no manifest was accepted this time)"
    return "cohort: no rollout in progress (no candidate): every device gets stable"


def _features(text: str | None) -> list[str] | Literal["detect"]:
    """``--cpu-features``: None reads this machine's; 'none' says there are none."""
    if text is None:
        return "detect"
    if text.strip().lower() == "none":
        return []
    return [name.strip() for name in text.split(",") if name.strip()]


def _self_test_json(check: SelfTest) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, result in sorted(check.results.items()):
        found[name] = {
            "passed": True,
            "probe": result.probe,
            "backend": result.backend,
            "skipped": list(result.skipped),
            "unavailable": list(result.unavailable),
            "load_ms": round(result.load_ms, 3),
            "probe_ms": round(result.probe_ms, 3),
        }
    for name, trials in sorted(check.failed.items()):
        found[name] = {
            "passed": False,
            "probe": "failed",
            "backend": None,
            "skipped": [t.backend for t in trials if t.outcome in ("failed", "remembered")],
            "unavailable": [t.backend for t in trials if t.outcome == "unavailable"],
            "why": {t.backend: t.detail for t in trials if t.detail},
        }
    return found


def _print_self_test(check: SelfTest) -> None:
    for name, result in sorted(check.results.items()):
        line = f"self-test {name}: runs on {result.backend}"
        if result.probe == "none":
            line += " (no probe: the first backend that loads)"
        if result.skipped:
            line += f"; skipped {', '.join(result.skipped)} (outputs missed the probe)"
        if result.unavailable:
            line += f"; not on this device: {', '.join(result.unavailable)}"
        echo(f"{line}; load {result.load_ms:.1f} ms, probe {result.probe_ms:.1f} ms")
        for trial in result.trials:
            if trial.outcome in ("failed", "remembered"):
                echo(f"  {trial.backend}: {trial.detail}")
    for name, trials in sorted(check.failed.items()):
        echo(f"self-test {name}: failed on every backend; not installed", err=True)
        for trial in trials:
            echo(f"  {trial.backend}: {trial.detail}", err=True)


def _fail(exc: EdgeregError | OSError) -> NoReturn:
    # An unreadable --trusted-key or cache path is the user's to fix (exit 1), not internal.
    error = exc if isinstance(exc, EdgeregError) else EdgeregError(str(exc))
    exit_with(error, verbose=root_flag("verbose"))


def _member_json(member: InstalledModel) -> dict[str, Any]:
    return {
        "path": str(member.path),
        "version": member.version,
        "variant": member.variant,
        "sha256": member.sha256,
        "min_mnn_runtime": member.min_mnn_runtime,
        "runtime": member.runtime.model_dump(mode="json"),
        "backend": member.backend,
        "contract": None
        if member.contract is None
        else member.contract.model_dump(mode="json", exclude_none=True),
        "labels": member.labels,
        "probe_path": None if member.probe_path is None else str(member.probe_path),
    }


def _as_json(result: FetchResult) -> dict[str, Any]:
    return {
        "model": result.model,
        "bundle": result.bundle,
        "tier": result.tier,
        "cohort": None if result.cohort is None else dataclasses.asdict(result.cohort),
        "path": None if result.path is None else str(result.path),
        "version": result.version,
        "variant": result.variant,
        "sha256": result.sha256,
        "is_candidate": result.is_candidate,
        "min_mnn_runtime": result.min_mnn_runtime,
        "runtime": None if result.runtime is None else result.runtime.model_dump(mode="json"),
        "members": {name: _member_json(m) for name, m in result.members.items()},
        "updated": result.updated,
        "not_modified": result.not_modified,
        "downloaded_bytes": result.downloaded_bytes,
        "runtime_fallback": result.runtime_fallback,
        "fallback": result.fallback,
        "substitute": result.substitute,
        "deferred": result.deferred,
        "bundled": result.bundled,
        "error": result.error,
        "error_code": result.error_code,
    }


def _print(result: FetchResult) -> None:
    if result.error is not None:
        echo(f"update failed ({result.error_code}): {result.error}", err=True)
        if result.exception is not None and result.exception.hint:
            echo(result.exception.hint, err=True)
    if result.deferred is not None:
        echo(f"{result.model}: download deferred ({result.deferred}); nothing new downloaded")
    if not result.installed:
        if result.error is None and result.deferred is None:
            echo(
                f"{result.model}: nothing for this device in tier {result.tier} yet (the first "
                "release is a canary and this device is outside its cohort)"
            )
        elif result.deferred is None:
            echo(f"{result.model}: no model installed")
        return
    role = "candidate" if result.is_candidate else "stable"
    if result.fallback is not None:
        role += f", the candidate does not fit ({result.fallback})"
    if result.substitute is not None:
        role += (
            f", the variant named for this CPU in place of one that avoids it ({result.substitute})"
        )
    if result.bundled:
        role += ", shipped with the app"
    keeping = "keeping " if result.error is not None else ""
    if result.bundle:
        echo(f"{keeping}{result.model} {result.version} for tier {result.tier} ({role})")
    else:
        echo(
            f"{keeping}{result.model} {result.version} variant {result.variant} "
            f"for tier {result.tier} ({role})"
        )
    for name, member in result.members.items():
        indent = "  "
        if result.bundle:
            echo(f"  {name} {member.version} variant {member.variant}")
            indent = "    "
        _print_member(member, indent)
    if result.error is None and result.deferred is None:
        if result.updated:
            echo(f"  installed ({result.downloaded_bytes} bytes downloaded)")
        else:
            echo(f"  up to date ({result.downloaded_bytes} bytes downloaded)")


def _shape(dims: list[int | str]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _print_member(member: InstalledModel, indent: str) -> None:
    echo(f"{indent}path: {member.path}")
    hints = member.runtime
    backend = f" chosen={member.backend}" if member.backend else ""
    echo(
        f"{indent}runtime: threads={hints.threads} backends={','.join(hints.backends)}{backend} "
        f"precision={hints.precision} (needs MNN >= {member.min_mnn_runtime})"
    )
    contract = member.contract
    if contract is None:
        echo(f"{indent}contract: none in this release")
        return
    for spec in contract.inputs:
        extra = " ".join(str(x) for x in (spec.layout, spec.color) if x is not None)
        norm = f" mean={spec.mean} std={spec.std}" if spec.mean is not None else ""
        echo(
            f"{indent}input {spec.name} {spec.dtype} {_shape(spec.shape)}"
            + (f" {extra}" if extra else "")
            + norm
        )
    for out in contract.outputs:
        echo(f"{indent}output {out.name} {out.dtype} {_shape(out.shape)}")
    for link in contract.state:
        echo(f"{indent}state {link.output} -> {link.input}")
    echo(f"{indent}task: {contract.task.kind}")
    if member.labels is not None:
        shown = ", ".join(member.labels[:3]) + (", …" if len(member.labels) > 3 else "")
        echo(f"{indent}labels: {len(member.labels)} labels ({shown})")


def _status_json(status: Status) -> dict[str, Any]:
    return {
        "unit": status.unit,
        "kind": status.kind,
        "tier": status.tier,
        "version": status.version,
        "is_candidate": status.is_candidate,
        "bundled": status.bundled,
        "ready": status.ready,
        "members": {name: _member_json(m) for name, m in status.members.items()},
        "previous": status.previous,
        "pending": None if status.pending is None else dataclasses.asdict(status.pending),
        "last_error": None if status.last_error is None else dataclasses.asdict(status.last_error),
        "bad_releases": dict(status.bad_releases),
    }


def _status_text(status: Status) -> str:
    lines = []
    if status.version is None:
        lines.append(f"{status.unit}: nothing installed")
    else:
        ready = "ready" if status.ready else "NOT READY (a blob is missing or damaged)"
        role = "candidate" if status.is_candidate else "stable"
        shipped = ", shipped with the app" if status.bundled else ""
        lines.append(
            f"{status.unit} {status.version} for tier {status.tier} ({role}{shipped}): {ready}"
        )
        for name, member in status.members.items():
            lines.append(f"  {name} {member.version} variant {member.variant}: {member.path}")
        if status.previous is not None:
            lines.append(f"  last good: {status.previous}")
    if status.pending is not None:
        pending = status.pending
        why = f"deferred ({pending.deferred})" if pending.deferred else "downloading"
        lines.append(
            f"pending: {pending.version} {why}, {pending.remaining_bytes} of "
            f"{pending.total_bytes} bytes to go (since {pending.since})"
        )
    if status.last_error is not None:
        err = status.last_error
        lines.append(f"last error ({err.code}) at {err.at}: {err.message}")
    for version, why in status.bad_releases.items():
        lines.append(f"refused on this device: {version} ({why})")
    return "\n".join(lines)


def _maybe_terminal() -> bool:
    """Whether rich could take stderr for a terminal (a tty, or told so by its variables)."""
    return sys.stderr.isatty() or any(
        name in os.environ for name in ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")
    )


@contextlib.contextmanager
def _download_progress(client: Client, *, enabled: bool) -> Iterator[None]:
    """A progress bar on a terminal while the blob downloads; nothing otherwise."""
    if not enabled or not _maybe_terminal():  # rich is not even imported then
        yield
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TransferSpeedColumn,
    )

    console = Console(stderr=True)
    if not console.is_terminal:
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
