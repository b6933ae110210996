"""`edgereg publish`, `rollout`, `promote`, `rollback`, `status`, `history`, `verify`...

Also `pause`, `resume` and `resign`: the signed registry and its rollouts.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from edgereg import config as config_module
from edgereg._files import atomic_write
from edgereg.cli._common import (
    UNIT_NAME,
    RegistryConfig,
    actor_name,
    build_dir,
    build_dir_option,
    config_option,
    endpoint_option,
    errors,
    expiry_days,
    handle_errors,
    json_option,
    no_such_model,
    open_registry,
    optional_config,
    optional_registry_config,
    print_note,
    print_result,
    printable,
    registry_option,
    registry_read_options,
    registry_write_options,
    signer_from_options,
    stage_reporter,
    trusted_key_option,
    warn_if_dvc_yaml_stale,
)
from edgereg.errors import EdgeregError, ExitCode, UsageError


@click.command()
@click.argument("model", type=UNIT_NAME)
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
    from edgereg.registry import (
        check_publishable_unit,
        prepare_bundle_release,
        prepare_release,
        release_version,
        report_url_of,
        utcnow,
    )
    from edgereg.rollout import parse_percent

    if (canary is None) == (not full):
        raise UsageError(
            "choose how to release: --canary PERCENT (for example --canary 5%) or --full"
            + (", not both" if full else "")
        )
    percent = parse_percent(canary, option="--canary") if canary is not None else None
    config = config_module.load(config_path)
    stale = warn_if_dvc_yaml_stale(config)
    is_bundle = model in config.bundles
    if not is_bundle:
        if model not in config.models:
            raise no_such_model(config, model)
        check_publishable_unit(config, model)
    version = release_version(config, model, version)
    report_url = report_url_of(config)
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
    """Run one rollout transition of ``edgereg.registry`` and report the state.

    Args:
        model: The model whose rollout changes.
        options: The registry write options (see ``registry_write_options``).
        transition: Called as ``transition(state, model, now=, expires=, actor=, **extra)``.
        arguments: Returns the transition's extra keyword arguments, given the
            configuration (None without a models.toml) and the registry.
    """
    from edgereg.registry import check_publishable_unit, report_url_of

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
        check_publishable_unit(config, model)
    extra = arguments(config, registry) if arguments is not None else {}
    actor = actor_name(options["actor"])
    state = registry.change(
        model,
        lambda current, now, expires: transition(
            current, model, now=now, expires=expires, actor=actor, **extra
        ),
        signer=signer_from_options(options["key_paths"], config),
        expires_days=expiry_days(config),
        report_url=report_url_of(config),
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


@click.command()
@click.argument("model", type=UNIT_NAME)
@click.option("--to", "to_percent", default=None, help="Move the candidate to this share.")
@click.option("--next", "next_step", is_flag=True, help="Move to the policy's next step.")
@click.option("--force", is_flag=True, help="Ignore the soak time (recorded in the history).")
@click.option(
    "--auto",
    is_flag=True,
    help="Let the canary analysis decide: next step or promote when every guardrail passes "
    "and the soak time is over (or, after max_soak_hours, when none shows harm on enough "
    "devices), halt when a critical one fails, else wait. Safe to repeat.",
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
    from edgereg.registry import set_percent
    from edgereg.rollout import parse_percent

    if auto or reports_url is not None:
        from edgereg.cli.analyze import auto_rollout

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


@click.command()
@click.argument("model", type=UNIT_NAME)
@click.option("--force", is_flag=True, help="Promote a canary never rolled out (recorded).")
@registry_write_options
@handle_errors
def promote(model: str, force: bool, **options: Any) -> None:
    """Make MODEL's candidate the stable release for every device."""
    from edgereg.registry import promote as promote_state

    _apply_transition(model, options, promote_state, lambda _config, _registry: {"force": force})


@click.command()
@click.argument("model", type=UNIT_NAME)
@click.option("--to-version", default=None, help="Restore this earlier release as stable.")
@registry_write_options
@handle_errors
def rollback(model: str, to_version: str | None, **options: Any) -> None:
    """Drop MODEL's candidate, or restore an earlier stable with --to-version."""
    from edgereg.registry import rollback as rollback_state

    _apply_transition(
        model,
        options,
        rollback_state,
        lambda _config, registry: {
            "to_version": to_version,
            "published": set(registry.versions(model)),
        },
    )


def _simple_transition(name: str, doc: str) -> click.Command:
    @click.command(name=name, help=doc)
    @click.argument("model", type=UNIT_NAME)
    @registry_write_options
    @handle_errors
    def command(model: str, **options: Any) -> None:
        import edgereg.registry

        _apply_transition(model, options, getattr(edgereg.registry, name))

    return command


pause = _simple_transition("pause", "Stop handing out MODEL's candidate; every device gets stable.")
resume = _simple_transition("resume", "Hand out MODEL's candidate again at its percent.")
resign = _simple_transition(
    "resign", "Renew the expiry and signatures of MODEL's state and manifests."
)


@click.command("rebuild-state")
@click.argument("model", type=UNIT_NAME)
@click.option(
    "--reset",
    is_flag=True,
    help="Write an empty state (no stable, no candidate) instead, above every manifest's "
    "sequence; recorded in its history.",
)
@click.option(
    "--sequence",
    type=click.IntRange(1, 2**53 - 1),
    default=None,
    help="With --reset: the new state's sequence, above any a device has seen (required "
    "when no manifest is left).",
)
@registry_write_options
@handle_errors
def rebuild_state(model: str, reset: bool, sequence: int | None, **options: Any) -> None:
    """Write MODEL's lost or stale state.json again from its signed manifests (docs/release.md).

    A stale state is one behind the newest signed manifest (restored from an old
    backup): every other write command refuses it.
    """
    config = optional_config(options["config_path"])
    registry = open_registry(
        config, options["registry_url"], options["endpoint_url"], options["trusted_key_paths"]
    )
    state = registry.rebuild_state(
        model,
        signer=signer_from_options(options["key_paths"], config),
        actor=actor_name(options["actor"]),
        expires_days=expiry_days(config),
        reset=reset,
        sequence=sequence,
    )
    _report_state(state, options["as_json"])


@click.command()
@click.argument("model", required=False, type=UNIT_NAME)
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
    # The page shows the rollout policy, so --html reads (and checks) the whole
    # models.toml first; the table and --json read only [registry].
    page_config = optional_config(config_path) if html_path is not None else None
    config: RegistryConfig | None = (
        page_config if html_path is not None else optional_registry_config(config_path)
    )
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
        _write_status_page(
            html_path,
            registry,
            page_config,
            pinned=bool(config or trusted_key_paths),
        )
    for st in statuses:
        for warning in st.warnings:
            errors.print(f"[bold red]WARNING:[/] {_markup_escape(printable(warning))}", markup=True)
    if as_json:
        click.echo(json.dumps([s.as_dict() for s in statuses], indent=2))
        return
    if not statuses:
        print_result(f"no models in {registry.storage.url} yet")
        print_note("publish one with `edgereg publish MODEL --canary 5%`")
        return
    # rich for the table only: `status --json` never imports it (benchmarks/startup.py).
    from rich.console import Console
    from rich.table import Table

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
    # No emoji codes: no cell can hold one (names, versions, tiers and variants have no
    # ':'), and rich then never loads its table of 3,600 emoji (~2 % of status's imports).
    Console(width=max(Console().width, 100), emoji=False).print(table)


def _markup_escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


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
    from edgereg.serve import render_status_page

    if pinned:
        registry.trusted_keys()  # a bad pinned key file is an error, not an unverified page
    page = render_status_page(
        registry.storage,
        trusted=registry.trusted_keys if pinned else None,
        policy=config.rollout_policy if config is not None else None,
    )
    atomic_write(path, page)
    print_note(f"wrote the status page to {path}")


@click.command()
@click.argument("model", type=UNIT_NAME)
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
        optional_registry_config(config_path), registry_url, endpoint_url, trusted_key_paths
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
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

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
            escape(printable(event.actor)),
            event.action,
            after.stable or "-",
            candidate,
            escape(printable(note)),
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


@click.command()
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
        optional_registry_config(config_path), registry_url, endpoint_url, trusted_key_paths
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
        sys.exit(ExitCode.VERIFY_FAILED)
