"""The operator page at ``/``: plain server-rendered HTML, nothing to load.

Per model (or bundle: one row per tier and member, each member's version in
the summary): what each tier's devices get now (stable, or the candidate for
its cohort), the candidate's gates and headline metric next to the stable's
(from the signed release records), the rollout step and when the next one is
allowed, warnings (devices with no model, signatures about to expire) and the
next command to run. The last changes come from the signed history: when and
what, never who (actor names such as ``user@host`` stay in the signed
history, for the release tools; the page is often public). Everything shown
comes from documents verified against the pinned publisher keys, or the
registry's own ``keys/`` (the page then says it is unverified); a model whose
documents do not verify is listed with the reason instead. With a report
store (``edgereg serve`` keeps one), a rollout's canary health: per tier,
each guardrail's candidate and stable figures and its verdict, the same
analysis `edgereg analyze` prints. Every value is HTML-escaped.
``edgereg status --html FILE`` writes the same page as a file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from html import escape
from typing import Any

from edgereg import __version__
from edgereg.analysis import Analysis
from edgereg.build.outputs import headline
from edgereg.config import AppMetric, RolloutPolicy, builtin_guardrail
from edgereg.errors import EdgeregError, StorageError
from edgereg.protocol.envelope import TrustedKeys
from edgereg.protocol.wire import (
    AnyRelease,
    BundleRecord,
    HistoryEvent,
    ReleaseVariant,
    RolloutSnapshot,
    RolloutState,
    format_time,
)
from edgereg.registry import ModelStatus, Registry, TierStatus, model_status, utcnow
from edgereg.reports.canary import rollout_analysis
from edgereg.reports.summary import SummarySource
from edgereg.rollout import check_soak, next_step
from edgereg.storage import NotFound, Storage

log = logging.getLogger("edgereg.serve")

#: History events shown per model, newest first.
HISTORY_SHOWN = 10
#: Signatures (state and manifests) expiring within this are warned about.
EXPIRY_WARNING = timedelta(days=7)

#: Tables sit in .scroll boxes: on a phone a wide table scrolls on its own,
#: the page never gets wider than the screen.
_STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 2rem auto; max-width: 72rem; padding: 0 1rem; color: #1d2433; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin: 2rem 0 .4rem; border-bottom: 1px solid #d8dce5; }
h3 { font-size: .95rem; margin: 1rem 0 .3rem; color: #4a5468; }
.scroll { overflow-x: auto; max-width: 100%; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .25rem .6rem .25rem 0; border-bottom: 1px solid #eef0f4;
         vertical-align: top; }
th { font-weight: 600; color: #4a5468; white-space: nowrap; }
th.group { border-bottom: 2px solid #d8dce5; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.name { white-space: nowrap; }
.muted { color: #6b7588; }
.summary span { display: inline-block; margin-right: 1.4rem; }
.badge { padding: .05rem .4rem; border-radius: .3rem; background: #e7f0ff; }
.paused { background: #fff1d6; }
.pass { color: #1f6f3a; }
.fail { color: #a3222f; font-weight: 600; }
.error { color: #a3222f; overflow-wrap: anywhere; }
.next { background: #f3f6fb; border-left: 3px solid #3b6fd8; padding: .4rem .8rem;
        margin: .6rem 0; }
.next p { margin: .2rem 0; }
.warnings { border-left: 3px solid #a3222f; background: #fdf0f1; padding: .3rem .8rem .3rem 1.8rem;
            margin: .6rem 0; }
code { font-size: .85rem; overflow-wrap: anywhere; }
@media (max-width: 40rem) { body { margin: 1rem auto; padding: 0 .6rem; } }
"""


def render_status_page(
    storage: Storage,
    *,
    trusted: Callable[[], TrustedKeys] | None = None,
    policy: Callable[[str], RolloutPolicy] | None = None,
    now: datetime | None = None,
    reports: SummarySource | None = None,
    declared_metrics: Callable[[str], Mapping[str, AppMetric]] | None = None,
) -> str:
    """The whole page for the registry in ``storage``.

    Args:
        storage: The registry.
        trusted: The publisher keys pinned in the project; every document shown
            is verified against them. Without, the registry's own keys/ are all
            there is, and anyone who can write to the storage can plant one:
            the page says so at the top.
        policy: The rollout policy of a model (models.toml); without it the
            page says the next step and its soak time are unknown.
        now: The current time (UTC), for soak times and expiry warnings.
        reports: The report store; with one, each rollout shows its canary health.
        declared_metrics: A unit's app metrics (models.toml): the guardrails on
            them are judged with the others.
    """
    registry = Registry(storage, trusted=trusted)
    when = now or utcnow()
    sections: list[str] = []
    problems = 0
    if trusted is None:
        sections.append(
            '<p class="error">Unverified: no pinned publisher keys, so this page checks '
            "signatures against the registry's own <code>keys/</code>, where anyone with "
            "write access to the storage can plant a key. Start <code>edgereg serve</code> "
            "beside the project's models.toml, or pass <code>--trusted-key</code>.</p>"
        )
    try:
        models = registry.models()
    except EdgeregError as exc:
        models = []
        problems += 1
        reason = public_reason(exc, storage)
        sections.append(f'<p class="error">Cannot list models: {escape(reason)}</p>')
    if not models and not problems:
        sections.append(
            '<p class="muted">No model is published yet. Publish one with '
            "<code>edgereg publish MODEL --canary 5%</code>.</p>"
        )
    for model in models:
        sections.append(_model_section(registry, model, policy, when, reports, declared_metrics))
    return (
        "<!doctype html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        "<title>edgereg registry</title>"
        f"<style>{_STYLE}</style></head><body>"
        "<h1>edgereg registry</h1>"
        f'<p class="muted">{len(models)} model{"" if len(models) == 1 else "s"} · '
        f"read-only · edgereg {escape(__version__)}</p>" + "".join(sections) + "</body></html>\n"
    )


def public_reason(exc: EdgeregError, storage: Storage) -> str:
    """What a public page may say about an error: nothing of the server's disk.

    A storage failure's message carries the registry's URL and the operating
    system's error (with the file's path); the page names the object only,
    and the server log keeps the whole message for the operator.
    """
    if isinstance(exc, NotFound):
        return f"'{exc.key}' does not exist in the registry"
    log.warning("status page: %s", exc.message)
    if isinstance(exc, StorageError):
        return "the registry storage could not be read; the server log says why"
    message = exc.message
    root = getattr(storage, "root", None)
    places = [storage.url]
    if root is not None:
        places += [str(root), os.path.realpath(root)]
    for place in sorted(set(places), key=len, reverse=True):
        message = message.replace(place, "the registry")
    return message


@dataclass(frozen=True)
class _Model:
    """What one model's section is drawn from, all verified."""

    status: ModelStatus
    state: RolloutState
    stable: AnyRelease | None
    candidate: AnyRelease | None
    policy: RolloutPolicy | None
    now: datetime
    metrics: Mapping[str, AppMetric] = field(default_factory=dict)


def _model_section(
    registry: Registry,
    model: str,
    policy: Callable[[str], RolloutPolicy] | None,
    now: datetime,
    reports: SummarySource | None = None,
    declared_metrics: Callable[[str], Mapping[str, AppMetric]] | None = None,
) -> str:
    head = f'<section id="model-{escape(model, quote=True)}"><h2>{escape(model)}</h2>'
    try:
        status = model_status(registry, model)
        state, _ = registry.read_state(model)
        if state is None:
            raise KeyError(model)
        data = _Model(
            status=status,
            state=state,
            stable=registry.read_release(model, state.stable) if state.stable else None,
            candidate=registry.read_release(model, state.candidate) if state.candidate else None,
            policy=policy(model) if policy is not None else None,
            now=now,
            metrics=declared_metrics(model) if declared_metrics is not None else {},
        )
    except (EdgeregError, KeyError) as exc:
        reason = (
            public_reason(exc, registry.storage)
            if isinstance(exc, EdgeregError)
            else "no rollout state"
        )
        problem = f"Cannot show {escape(model)}: {escape(reason)}"
        return f'{head}<p class="error">{problem}</p></section>'
    history = list(reversed(state.history))[:HISTORY_SHOWN]
    return (
        head
        + _summary(status)
        + _members(status)
        + _warnings(data)
        + _next(data)
        + _tiers(data)
        + _health(data, reports)
        + _history(history)
        + "</section>"
    )


def _summary(status: ModelStatus) -> str:
    if status.candidate is None:
        rollout = '<span class="muted">no rollout in progress</span>'
    else:
        paused = ' <span class="badge paused">paused</span>' if status.paused else ""
        rollout = (
            f"candidate <b>{escape(status.candidate)}</b> to "
            f'<span class="badge">{status.percent:g}%</span>{paused}'
        )
    return (
        '<p class="summary">'
        f"<span>stable <b>{escape(status.stable or '—')}</b></span>"
        f"<span>{rollout}</span>"
        f'<span class="muted">sequence {status.sequence}</span>'
        f'<span class="muted">signatures expire {escape(status.expires)}</span>'
        "</p>"
    )


def _members(status: ModelStatus) -> str:
    """A bundle's members and the version of each in the stable and candidate bundle."""
    if not status.bundle:
        return ""
    items = []
    for member in status.members:
        versions = " → ".join(
            f"{role} {escape(version)}"
            for role, version in (("stable", member.stable), ("candidate", member.candidate))
            if version is not None
        )
        items.append(f"<span><b>{escape(member.name)}</b> {versions}</span>")
    return f'<p class="summary members">bundle of {len(items)}: {"".join(items)}</p>'


def expiry_warning(model: str, expires: datetime, now: datetime) -> str | None:
    """A warning when the signed state and manifests of ``model`` expire within 7 days."""
    left = expires - now
    if left > EXPIRY_WARNING:
        return None
    when = format_time(expires)
    if left <= timedelta(0):
        return (
            f"{model}: the signatures of its state and manifests expired at {when}; apps "
            f"refuse them (renew them: edgereg resign {model})"
        )
    return (
        f"{model}: the signatures of its state and manifests expire at {when}, in "
        f"{_duration(left)}; apps refuse them after that (renew them: edgereg resign {model})"
    )


def _warnings(data: _Model) -> str:
    # The no-model warnings are edgereg status's own, so the page and the CLI agree.
    warnings = list(data.status.warnings)
    expiring = expiry_warning(data.status.model, data.state.expires, data.now)
    if expiring is not None:
        warnings.append(expiring)
    if not warnings:
        return ""
    items = "".join(f"<li>{escape(warning)}</li>" for warning in warnings)
    return f'<ul class="warnings" aria-label="warnings">{items}</ul>'


def _duration(delta: timedelta) -> str:
    minutes = max(1, round(delta.total_seconds() / 60))
    if minutes < 60:
        return f"{minutes} min"
    hours = minutes / 60
    if hours < 48:
        return f"{hours:.1f} h"
    return f"{hours / 24:.1f} days"


def _cmd(text: str) -> str:
    return f"<code>{escape(text)}</code>"


def _variants(record: AnyRelease | None, member: str | None = None) -> dict[str, ReleaseVariant]:
    """The variants of a model's release, or of one member of a bundle's."""
    if record is None:
        return {}
    if isinstance(record, BundleRecord):
        found = record.members.get(member) if member is not None else None
        return dict(found.variants) if found is not None else {}
    return dict(record.variants)


def _candidate_failed(record: AnyRelease | None) -> bool:
    members = list(record.members) if isinstance(record, BundleRecord) else [None]
    return any(
        variant.metrics.get("failed")
        for member in members
        for variant in _variants(record, member).values()
    )


def _rollout_step(data: _Model) -> tuple[str, float | None, timedelta | None]:
    """The step line, the policy's next percent (None: last step or unknown), soak left."""
    state = data.state
    assert state.percent is not None
    if data.policy is None:
        since = state.last_change_at()
        changed = f"; the last change was at {format_time(since)}" if since else ""
        return (
            f"At {state.percent:g}%. The next step and its soak time are unknown here: "
            f"the rollout policy is in the project's models.toml (start "
            f"<code>edgereg serve</code> beside it){escape(changed)}.",
            None,
            None,
        )
    steps = data.policy.steps
    shown = " → ".join(
        f"<b>{step:g}%</b>" if step == state.percent else f"{step:g}%" for step in steps
    )
    following = next_step(steps, state.percent)
    if following is None:
        return f"At {state.percent:g}% (steps {shown}): the last step.", None, None
    since = state.last_change_at()
    soak = timedelta(hours=data.policy.min_soak_hours)
    left = check_soak(since, data.now, soak) if since is not None else None
    if left is None:
        allowed = "allowed now"
    else:
        assert since is not None
        allowed = (
            f"allowed from {escape(format_time(since + soak))} (minimum soak "
            f"{data.policy.min_soak_hours:g} h; {_duration(left)} left)"
        )
    return (
        f"At {state.percent:g}% (steps {shown}). Next step {following:g}%: {allowed}.",
        following,
        left,
    )


def next_commands(data: _Model) -> list[str]:
    """HTML lines: what to run next, as the state allows, first the likely one."""
    model = data.status.model
    state = data.state
    if state.candidate is None:
        if state.stable is None:
            return [f"Publish a release: {_cmd(f'edgereg publish {model} --canary 5%')}"]
        return [
            "Nothing to do: every device gets the stable release. To roll out a new "
            f"version: {_cmd(f'edgereg publish {model} --canary 5%')}"
        ]
    rollback = f"If the candidate misbehaves: {_cmd(f'edgereg rollback {model}')}"
    if _candidate_failed(data.candidate):
        return [
            f"The candidate failed gates: {_cmd(f'edgereg rollback {model}')}",
        ]
    if state.paused:
        return [
            f"Resume the rollout: {_cmd(f'edgereg resume {model}')}",
            f"or drop the candidate: {_cmd(f'edgereg rollback {model}')}",
        ]
    assert state.percent is not None
    promote = f"Make it stable for every device: {_cmd(f'edgereg promote {model}')}"
    if state.full or state.percent >= 100:
        return [promote, rollback]
    _, following, left = _rollout_step(data)
    rollout = _cmd(f"edgereg rollout {model} --next")
    if data.policy is not None and following is None:
        return [promote, rollback]
    if left is not None:
        return [f"Wait for the soak time, then: {rollout}", rollback]
    return [f"Next step: {rollout}", rollback]


def _next(data: _Model) -> str:
    lines = []
    if data.state.candidate is not None and not data.state.paused and not data.state.full:
        lines.append(_rollout_step(data)[0])
    lines += next_commands(data)
    body = "".join(f"<p>{line}</p>" for line in lines)
    return f'<div class="next" aria-label="next step">{body}</div>'


def _size(size: int | None) -> str:
    if size is None:
        return "—"
    if size >= 1_000_000:
        return f"{size / 1e6:.2f} MB"
    return f"{size / 1e3:.1f} KB"


def _metrics(
    record: AnyRelease | None, variant: str | None, member: str | None = None
) -> dict[str, Any]:
    variants = _variants(record, member)
    if variant is None or variant not in variants:
        return {}
    return dict(variants[variant].metrics)


def _headline_cell(metrics: dict[str, Any], other: dict[str, Any] | None = None) -> str:
    found = headline(metrics) if metrics else None
    if found is None:
        return '<td class="muted">—</td>'
    text = f"{escape(found.name)} {found.value:.4g}"
    if found.baseline is not None:
        text += f' <span class="muted">(fp32 {found.baseline:.4g})</span>'
    compared = headline(other) if other else None
    if compared is not None and compared.name == found.name:
        text += f' <span class="muted">{found.value - compared.value:+.4g} vs stable</span>'
    return f"<td>{text}</td>"


def _gates_cell(metrics: dict[str, Any]) -> str:
    gates = metrics.get("gates")
    failed = [str(line) for line in metrics.get("failed") or []]
    if not isinstance(gates, dict) or not gates:
        if failed:
            return f'<td class="fail">failed: {escape("; ".join(failed))}</td>'
        return '<td class="muted">not recorded</td>'
    passed = sum(1 for ok in gates.values() if ok is True)
    if failed or passed < len(gates):
        detail = escape("; ".join(failed)) if failed else "see the build's metrics"
        return f'<td class="fail">{passed}/{len(gates)} passed; failed: {detail}</td>'
    return f'<td class="pass">{passed}/{len(gates)} passed</td>'


def _gets_now(tier: TierStatus, status: ModelStatus) -> str:
    stable = f"stable {tier.stable_variant}" if tier.stable_variant else "no model"
    if status.candidate is None or tier.candidate_variant is None:
        return escape(stable)
    if status.paused:
        return escape(f"{stable} (rollout paused)")
    assert status.percent is not None
    candidate = f"candidate {tier.candidate_variant}"
    if status.percent >= 100:
        return escape(f"{candidate} (100%)")
    return escape(f"{status.percent:g}%: {candidate}; {100 - status.percent:g}%: {stable}")


def _tiers(data: _Model) -> str:
    rows = []
    bundle = data.status.bundle
    for tier in data.status.tiers:
        stable = _metrics(data.stable, tier.stable_variant, tier.member)
        candidate = _metrics(data.candidate, tier.candidate_variant, tier.member)
        member = f'<td class="name">{escape(tier.member or "—")}</td>' if bundle else ""
        rows.append(
            "<tr>"
            f'<td class="name">{escape(tier.tier)}</td>'
            + member
            + f"<td>{_gets_now(tier, data.status)}</td>"
            f'<td class="name">{escape(tier.stable_variant or "—")}</td>'
            f'<td class="num">{_size(tier.stable_size)}</td>'
            + _headline_cell(stable)
            + (_gates_cell(stable) if tier.stable_variant else '<td class="muted">—</td>')
            + f'<td class="name">{escape(tier.candidate_variant or "—")}</td>'
            f'<td class="num">{_size(tier.candidate_size)}</td>'
            + _headline_cell(candidate, stable)
            + (_gates_cell(candidate) if tier.candidate_variant else '<td class="muted">—</td>')
            + "</tr>"
        )
    member_head = ("<th></th>", "<th>member</th>") if bundle else ("", "")
    return (
        '<h3>Tiers</h3><div class="scroll"><table><thead>'
        f'<tr><th></th>{member_head[0]}<th></th><th class="group" colspan="4">stable</th>'
        '<th class="group" colspan="4">candidate</th></tr>'
        f"<tr><th>tier</th>{member_head[1]}<th>devices get now</th>"
        '<th>variant</th><th class="num">size</th><th>headline</th><th>gates</th>'
        '<th>variant</th><th class="num">size</th><th>headline</th><th>gates</th>'
        f"</tr></thead><tbody>{''.join(rows)}</tbody></table></div>"
    )


def _health(data: _Model, reports: SummarySource | None) -> str:
    """The canary health of a rollout in progress: each arm per tier, each guardrail's verdict."""
    state = data.state
    if reports is None or state.candidate is None:
        return ""
    guardrails = (data.policy or RolloutPolicy()).guardrails
    tiers = [tier.tier for tier in data.status.tiers]
    try:
        analysis = rollout_analysis(
            reports,
            state,
            guardrails=guardrails,
            tiers=list(dict.fromkeys(tiers)),
            now=data.now,
            metrics=data.metrics,
            bundle=data.status.bundle,
        )
    except EdgeregError as exc:
        # Its message may name a database URL (with a password) or a path.
        log.warning("status page: the report store cannot be read: %s", exc.message)
        return (
            '<h3>Canary health</h3><p class="error">The report store cannot be read; '
            "the server log says why.</p>"
        )
    return _health_table(analysis)


_VERDICT_CLASS = {"pass": "pass", "fail": "fail", "inconclusive": "muted"}


def _arm_figure(name: str, numbers: dict[str, Any], arm: str) -> str:
    # A bundle member's result (load_ms/det) is its guardrail's; its spec says its unit.
    spec = builtin_guardrail(name)
    if spec is not None and spec.test == "rate":
        rate, networks = numbers.get(f"{arm}_rate"), numbers.get(f"{arm}_networks")
        if rate is None:
            return "—"
        return f"{100 * float(rate):.1f}% of {networks} networks"
    median = numbers.get(f"{arm}_median_ms")
    unit = spec.unit if spec is not None else "ms"
    return "—" if median is None else f"median {float(median):.1f} {unit}"


def _health_table(analysis: Analysis) -> str:
    rows = []
    for tier in (*analysis.tiers, *((analysis.pool,) if analysis.pool is not None else ())):
        for index, result in enumerate(tier.guardrails):
            first = index == 0
            verdict_class = _VERDICT_CLASS.get(result.verdict, "")
            pooled = " (judged within the pool)" if tier.pooled else ""
            tier_cell = (
                f'<td class="name">{escape(tier.label + pooled)}</td>'
                f'<td class="{_VERDICT_CLASS.get(tier.verdict, "")}">{escape(tier.verdict)}</td>'
                f'<td class="num">{tier.candidate_devices}</td>'
                f'<td class="num">{tier.stable_devices}</td>'
                if first
                else "<td></td><td></td><td></td><td></td>"
            )
            critical = " (critical)" if result.critical else ""
            rows.append(
                "<tr>" + tier_cell + f'<td class="name">{escape(result.name + critical)}</td>'
                f"<td>{escape(_arm_figure(result.name, result.numbers, 'candidate'))}</td>"
                f"<td>{escape(_arm_figure(result.name, result.numbers, 'stable'))}</td>"
                f'<td class="{verdict_class}" title="{escape(result.reason, quote=True)}">'
                f"{escape(result.verdict)}</td>"
                "</tr>"
            )
    since = format_time(analysis.since)
    return (
        f'<h3>Canary health</h3><p class="muted">candidate {escape(analysis.candidate)} vs '
        f"stable {escape(analysis.stable or 'none (first release)')}, "
        f"reports since {escape(since)}: "
        f'<span class="{_VERDICT_CLASS.get(analysis.verdict, "")}">'
        f"{escape(analysis.verdict)}</span> (<code>edgereg analyze "
        f"{escape(analysis.unit)}</code> gives every number)</p>"
        '<div class="scroll"><table><thead><tr><th>tier</th><th>verdict</th>'
        '<th class="num">candidate devices</th><th class="num">stable devices</th>'
        "<th>guardrail</th><th>candidate</th><th>stable</th><th>result</th></tr></thead>"
        f"<tbody>{''.join(rows)}</tbody></table></div>"
        + "".join(
            f'<p class="{_VERDICT_CLASS["fail"]}">alarm: {escape(alarm)}</p>'
            for alarm in analysis.alarms
        )
    )


def _snapshot(snapshot: RolloutSnapshot) -> str:
    text = f"stable {snapshot.stable or '—'}"
    if snapshot.candidate is not None:
        text += f", candidate {snapshot.candidate} at {snapshot.percent:g}%"
        if snapshot.paused:
            text += " (paused)"
    return text


def _history(events: list[HistoryEvent]) -> str:
    if not events:
        return ""
    rows = "".join(
        "<tr>"
        f'<td class="num">{event.sequence}</td>'
        f"<td>{escape(format_time(event.at))}</td>"
        f"<td>{escape(event.action)}{' (forced)' if event.forced else ''}</td>"
        f"<td>{escape(_snapshot(event.after))}</td>"
        f"<td>{escape(event.note or '')}</td>"
        "</tr>"
        for event in events
    )
    return (
        '<h3>Last changes</h3><div class="scroll"><table><thead><tr><th>seq</th>'
        "<th>when (UTC)</th><th>action</th><th>after</th><th>note</th></tr></thead>"
        f"<tbody>{rows}</tbody></table></div>"
    )
