"""The read-only status page at ``/``: plain server-rendered HTML, nothing to load.

Every model with its stable and candidate versions, rollout percent (and
whether it is paused), what each tier gets with sizes, and the last changes
from the signed history: when and what, never who (actor names such as
``user@host`` stay in the signed history, for the release tools; the page is
often public). Everything shown comes from documents verified
against the registry's own keys (``keys/``); a model whose documents do not
verify is listed with the reason instead. Every value is HTML-escaped.
"""

from __future__ import annotations

from collections.abc import Callable
from html import escape

from edgereg import __version__
from edgereg.errors import EdgeregError
from edgereg.registry import ModelStatus, Registry, model_status
from edgereg.signing import TrustedKeys
from edgereg.storage import Storage
from edgereg.wire import HistoryEvent, RolloutSnapshot, format_time

#: History events shown per model, newest first.
HISTORY_SHOWN = 10

_STYLE = """
body { font: 15px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
       margin: 2rem auto; max-width: 64rem; padding: 0 1rem; color: #1d2433; }
h1 { font-size: 1.4rem; margin-bottom: .2rem; }
h2 { font-size: 1.15rem; margin: 2rem 0 .4rem; border-bottom: 1px solid #d8dce5; }
h3 { font-size: .95rem; margin: 1rem 0 .3rem; color: #4a5468; }
table { border-collapse: collapse; width: 100%; font-size: .9rem; }
th, td { text-align: left; padding: .25rem .6rem .25rem 0; border-bottom: 1px solid #eef0f4; }
th { font-weight: 600; color: #4a5468; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.muted { color: #6b7588; }
.summary span { display: inline-block; margin-right: 1.4rem; }
.badge { padding: .05rem .4rem; border-radius: .3rem; background: #e7f0ff; }
.paused { background: #fff1d6; }
.error { color: #a3222f; }
code { font-size: .85rem; }
"""


def render_status_page(
    storage: Storage, *, trusted: Callable[[], TrustedKeys] | None = None
) -> str:
    """The whole page for the registry in ``storage``.

    With ``trusted`` (the publisher keys pinned in the project) every document
    shown is verified against them. Without, the registry's own keys/ are all
    there is, and anyone who can write to the storage can plant one: the page
    says so at the top.
    """
    registry = Registry(storage, trusted=trusted)
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
        sections.append(f'<p class="error">Cannot list models: {escape(exc.message)}</p>')
    if not models and not problems:
        sections.append(
            '<p class="muted">No model is published yet. Publish one with '
            "<code>edgereg publish MODEL --canary 5%</code>.</p>"
        )
    for model in models:
        sections.append(_model_section(registry, model))
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


def _model_section(registry: Registry, model: str) -> str:
    head = f'<section id="model-{escape(model, quote=True)}"><h2>{escape(model)}</h2>'
    try:
        status = model_status(registry, model)
        state, _ = registry.read_state(model)
    except (EdgeregError, KeyError) as exc:
        reason = exc.message if isinstance(exc, EdgeregError) else "no rollout state"
        problem = f"Cannot show {escape(model)}: {escape(reason)}"
        return f'{head}<p class="error">{problem}</p></section>'
    history = list(reversed(state.history))[:HISTORY_SHOWN] if state is not None else []
    return head + _summary(status) + _tiers(status) + _history(history) + "</section>"


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
        f'<span class="muted">expires {escape(status.expires)}</span>'
        "</p>"
    )


def _size(size: int | None) -> str:
    if size is None:
        return "—"
    if size >= 1_000_000:
        return f"{size / 1e6:.2f} MB"
    return f"{size / 1e3:.1f} KB"


def _tiers(status: ModelStatus) -> str:
    rows = "".join(
        "<tr>"
        f"<td>{escape(t.tier)}</td>"
        f"<td>{escape(t.stable_variant or '—')}</td>"
        f'<td class="num">{_size(t.stable_size)}</td>'
        f"<td>{escape(t.candidate_variant or '—')}</td>"
        f'<td class="num">{_size(t.candidate_size)}</td>'
        "</tr>"
        for t in status.tiers
    )
    return (
        "<h3>Tiers</h3><table><thead><tr><th>tier</th><th>stable variant</th>"
        '<th class="num">size</th><th>candidate variant</th><th class="num">size</th>'
        f"</tr></thead><tbody>{rows}</tbody></table>"
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
        "<h3>Last changes</h3><table><thead><tr><th>seq</th><th>when (UTC)</th>"
        "<th>action</th><th>after</th><th>note</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
    )
