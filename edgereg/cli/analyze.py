"""`edgereg analyze` and `edgereg rollout --auto`: the canary analysis on the command line.

Both read the verified rollout state (pinned keys, as every registry command)
and the report store's per-arm summaries since the period started, run the
pure analysis (:mod:`edgereg.analysis`) and print it; `rollout --auto` then
runs :func:`edgereg.registry.run_auto` (the workflow beside the rollout rules)
and prints its result.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import click

from edgereg.cli._common import (
    UNIT_NAME,
    actor_name,
    expiry_days,
    handle_errors,
    open_registry,
    optional_config,
    print_note,
    print_result,
    registry_read_options,
    signer_from_options,
)
from edgereg.errors import ConfigError, ExitCode, UsageError

if TYPE_CHECKING:  # the command stays cheap to import: edgereg --help lists it
    from edgereg import config as config_module
    from edgereg.analysis import Analysis
    from edgereg.protocol.wire import RolloutState


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(m|h|d)\s*$")
_UNITS = {"m": "minutes", "h": "hours", "d": "days"}

reports_option = click.option(
    "--reports",
    "reports_url",
    default=None,
    help="The report store (sqlite:///PATH or postgresql://...); default: models.toml "
    "[reports] store.",
)
since_option = click.option(
    "--since",
    default=None,
    help="Count reports from this time (ISO 8601, UTC if no offset) or this long ago "
    "(90m, 12h, 2d), for both arms; default: since the candidate's last percent change "
    "(at 100%, the stable arm's since the last step below).",
)


def parse_since(text: str, now: datetime) -> datetime:
    """--since as typed: an ISO 8601 time, or a duration back from ``now``.

    Raises:
        UsageError: neither.
    """
    match = _DURATION.fullmatch(text)
    if match is not None:
        return now - timedelta(**{_UNITS[match.group(2)]: float(match.group(1))})
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"--since must be an ISO 8601 time (2026-12-01T08:00Z) or a duration (90m, 12h, "
            f"2d); got {text!r}"
        ) from None
    return moment if moment.tzinfo else moment.replace(tzinfo=timezone.utc)


def open_report_store(config: config_module.Config | None, reports_url: str | None) -> Any:
    """--reports (a relative SQLite path: from here), else models.toml's [reports] store."""
    from edgereg import config as config_module
    from edgereg.reports import open_store

    if reports_url is not None:
        return open_store(reports_url)
    if config is None:
        raise ConfigError(
            "no report store given and no models.toml here",
            file=config_module.DEFAULT_CONFIG_FILE,
            hint="Pass --reports sqlite:///PATH (or postgresql://...), or run inside the project.",
        )
    return open_store(config.reports.store, base_dir=config.root)


def _analysis(
    unit: str,
    config: config_module.Config | None,
    registry: Any,
    state: RolloutState,
    options: dict[str, Any],
    now: datetime,
) -> tuple[Analysis, dict[str, Analysis]]:
    """The analysis, and with --by-cpu-class one per CPU class the reports name."""
    from edgereg import config as config_module
    from edgereg.reports.canary import rollout_analysis

    policy = config.rollout_policy(unit) if config else config_module.RolloutPolicy()
    since = parse_since(options["since"], now) if options.get("since") else None
    tiers = registry.manifest_tiers(unit)
    if config is not None:
        # models.toml's order (best first) reads better than the alphabet.
        order = list(config.tiers)
        tiers.sort(key=lambda tier: order.index(tier) if tier in order else len(order))
    bundle = _is_bundle(registry, state)
    with open_report_store(config, options.get("reports_url")) as store:
        metrics = config.unit_metrics(unit) if config is not None else {}
        analysis = rollout_analysis(
            store,
            state,
            guardrails=policy.guardrails,
            tiers=tiers,
            now=now,
            since=since,
            metrics=metrics,
            bundle=bundle,
        )
        if not options.get("by_cpu_class"):
            return analysis, {}
        split = {
            cpu_class: rollout_analysis(
                store,
                state,
                guardrails=policy.guardrails,
                tiers=tiers,
                now=now,
                since=since,
                cpu_class=cpu_class,
                metrics=metrics,
                bundle=bundle,
            )
            for cpu_class in store.cpu_classes(unit)
        }
        return analysis, split


def _is_bundle(registry: Any, state: RolloutState) -> bool | None:
    """Whether the unit is a bundle, as its candidate's verified release record says.

    The analysis then asks the store for the members of a bundle only; a plain
    model's summaries never look through its rows for other models. None (the
    store finds out) for a registry without the record (written by hand).
    """
    from edgereg.protocol.wire import BundleRecord
    from edgereg.storage import NotFound

    if state.candidate is None:
        return None
    try:
        return isinstance(registry.read_release(state.model, state.candidate), BundleRecord)
    except NotFound:
        return None


def print_analysis(analysis: Analysis) -> None:
    """The analysis for people: each tier, each guardrail with its numbers, the verdict."""
    stable_since = ""
    if analysis.stable_since is not None:
        stable_since = f" (stable arm since {_iso(analysis.stable_since)})"
    stable = analysis.stable or "none (a first release: absolute limits only)"
    print_result(
        f"{analysis.unit}: candidate {analysis.candidate} vs stable {stable}, "
        f"reports since {_iso(analysis.since)}{stable_since}"
    )
    for tier in (*analysis.tiers, *((analysis.pool,) if analysis.pool is not None else ())):
        pooled = (
            "; too few networks to be judged alone: its passes are the pool's"
            if tier.pooled
            else ""
        )
        print_result(
            f"{'tier ' if tier.label == tier.tier else ''}{tier.label}: {tier.verdict} "
            f"(candidate {_arm(tier.candidate_devices, tier.candidate_networks)}, "
            f"stable {_arm(tier.stable_devices, tier.stable_networks)}{pooled})"
        )
        for result in tier.guardrails:
            critical = ", critical" if result.critical else ""
            print_result(f"  {result.verdict:<12} {result.name}{critical}: {result.reason}")
    for alarm in analysis.alarms:
        print_result(f"alarm: {alarm}")
    for note in analysis.notes:
        print_result(f"note: {note}")
    print_result(f"verdict: {analysis.verdict}")


def _arm(devices: int, networks: int) -> str:
    if devices == networks:
        return f"{devices} devices"
    return f"{devices} devices in {networks} networks"


@click.command("analyze")
@click.argument("unit", type=UNIT_NAME)
@since_option
@reports_option
@click.option(
    "--by-cpu-class",
    is_flag=True,
    help="Also analyse the reports of each CPU class apart (report schema 2's cpu_class: "
    "armv8, armv8.2, armv9, ...); the exit status stays the whole fleet's.",
)
@registry_read_options
@handle_errors
def analyze_command(unit: str, **options: Any) -> None:
    """Compare UNIT's candidate with the concurrent stable arm, per tier and guardrail.

    Exits 0 when every guardrail passes, 12 when a critical one fails, 13 when
    the evidence is not there yet (docs/operations/canary-analysis.md).
    """
    from edgereg.registry import RolloutError

    config = optional_config(options["config_path"])
    registry = open_registry(
        config, options["registry_url"], options["endpoint_url"], options["trusted_key_paths"]
    )
    state, _ = registry.read_state(unit)
    if state is None or state.candidate is None:
        what = "has no release in this registry" if state is None else "has no rollout in progress"
        raise RolloutError(
            f"{unit} {what}: there is no candidate to analyse",
            hint=f"Analysis needs a canary over a stable release: edgereg publish {unit} "
            "--canary 5%",
        )
    analysis, split = _analysis(unit, config, registry, state, options, registry.clock())
    if options["as_json"]:
        found = analysis.to_json()
        if options.get("by_cpu_class"):
            found["by_cpu_class"] = {name: part.to_json() for name, part in split.items()}
        click.echo(json.dumps(found))
    else:
        print_analysis(analysis)
        for name, part in split.items():
            print_result(f"\ncpu_class {name}:")
            print_analysis(part)
        if options.get("by_cpu_class") and not split:
            print_result("no report names a CPU class (clients of report schema 1)")
    if analysis.verdict == "fail":
        raise SystemExit(ExitCode.ANALYZE_FAILED)
    if analysis.verdict == "inconclusive":
        raise SystemExit(ExitCode.ANALYZE_INCONCLUSIVE)


def auto_rollout(model: str, options: dict[str, Any]) -> None:
    """`edgereg rollout MODEL --auto`: :func:`edgereg.registry.run_auto`, printed.

    Exits 0 (moved, waiting or nothing to do) or 12 (halted: a critical guardrail failed).
    """
    from edgereg import config as config_module
    from edgereg.registry import run_auto

    config = optional_config(options["config_path"])
    registry = open_registry(
        config, options["registry_url"], options["endpoint_url"], options["trusted_key_paths"]
    )
    policy = config.rollout_policy(model) if config else config_module.RolloutPolicy()
    result = run_auto(
        registry,
        model,
        policy=policy,
        analyse=lambda state, now: _analysis(model, config, registry, state, options, now)[0],
        now=registry.clock(),
        signers=lambda: signer_from_options(options["key_paths"], config),
        actor=actor_name(options["actor"]),
        expires_days=expiry_days(config),
    )
    decision, new_state, analysis = result.decision, result.state, result.analysis
    if options["as_json"]:
        click.echo(
            json.dumps(
                {
                    "model": model,
                    "action": decision.action,
                    "changed": decision.changes_state,
                    "reason": decision.reason,
                    "sequence": new_state.sequence,
                    **new_state.snapshot().model_dump(mode="json"),
                    "analysis": analysis.to_json() if analysis is not None else None,
                }
            )
        )
    else:
        if analysis is not None:
            for line in _short(analysis):
                print_note(line)
        verb = {
            "nothing": "nothing to do",
            "wait": "waiting",
            "step": "rolled out",
            "promote": "promoted",
            "pause": "paused",
            "rollback": "rolled back",
        }[decision.action]
        sequence = f" (sequence {new_state.sequence})" if decision.changes_state else ""
        print_result(f"{model}: {verb}: {decision.reason}{sequence}")
    if result.halted:
        raise SystemExit(ExitCode.ANALYZE_FAILED)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds").replace("+00:00", "Z")


def _short(analysis: Analysis) -> list[str]:
    lines = []
    for tier in (*analysis.tiers, *((analysis.pool,) if analysis.pool is not None else ())):
        verdicts = ", ".join(f"{result.name} {result.verdict}" for result in tier.guardrails)
        pooled = ", judged within the pool" if tier.pooled else ""
        lines.append(f"{tier.label}: {tier.verdict} ({verdicts}{pooled})")
    lines += [f"alarm: {alarm}" for alarm in analysis.alarms]
    return lines
